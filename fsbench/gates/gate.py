"""`fsbench gate --base REV [--new REV]`: the same small sweep of two versions on this
machine, then `fsbench compare`.

Each version runs from its own git worktree (NEW defaults to this checkout, uncommitted
changes included) with that tree's own fsbench on PYTHONPATH. For each trainer and seed
the two versions' runs start together and take turns a block of steps at a time
(fsbench.running.pacing), which of the two goes first in each block decided by a seeded coin:
the RMIT design at the scale of a second, so the machine's drift hits both versions alike
and compare can pair block k of one with block k of the other. A version that predates
pacing (no pacing module in its tree) makes the gate fall back to whole runs, A then
B or B then A, paired run by run: far less sensitive, and said so. Runs are kept under
--store (base/, new/, logs/); a stopped gate keeps what finished.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable

from fsbench.running import pacing
from fsbench.errors import ConfigError
from fsbench.table import note


@dataclass
class Side:
    """One version under test: where its tree is, and its extra environment."""
    name: str
    tree: Path
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Sweep:
    """The default gate: `small` at 2 ranks, 64 steps (60 measured), the versions taking
    turns every step (~0.2 s each: 60 paired steps per run pair), 3 seeds. One step per turn,
    not 4: the paired change of one step, its partner 0.2 s away, varied less (sd 0.112 in
    log step time) than a 4-step turn's mean, its partner a second away (0.141), so a seed
    resolves 2.5x finer (scripts/gate_calibration.py, "Noise of the pairing"). Three seeds,
    not two: a stall on one step in eight gives two seeds only 15 stalled steps, which a
    sign-flip test could tell from noise in 18 of 20 gates; three seeds give 22. Not `tiny`:
    its 7 ms steps are half bubble. Calibration: results/gate_calibration_cpu.md."""
    workload: str = "small"
    trainers: tuple[str, ...] = ("ddp", "freescale")
    world_size: int = 2
    steps: int = 64
    warmup: int = 4
    pairs: int = 3
    seed: int = 0
    block_steps: int = 1


# Reruns of a pair in which a run was contended, before its key is called inconclusive.
DEFAULT_RETRIES = 2


def repo_root(command: str = "gate") -> Path:
    """The fsbench checkout the current folder is in: both sides of a gate are versions
    of it (any other repository would run this installed fsbench on both sides)."""
    where = "inside the git checkout of fsbench (its folder or one below)"
    out = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if out.returncode:
        raise ConfigError(f"fsbench {command} must run {where}; {Path.cwd()} is in no git repository")
    root = Path(out.stdout.strip())
    if not (root / "fsbench" / "cli" / "__init__.py").is_file():
        raise ConfigError(f"fsbench {command} must run {where}; {root} is another repository "
                          "(no fsbench/cli/ in it)")
    return root


def resolve_rev(root: Path, rev: str, flag: str) -> str:
    out = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                         cwd=root, capture_output=True, text=True)
    if out.returncode:
        raise ConfigError(f"{flag} {rev!r}: not a commit of this repository")
    return out.stdout.strip()


class Worktrees:
    """Temporary detached worktrees, removed on exit (also after Ctrl-C)."""

    def __init__(self, root: Path) -> None:
        self.root, self.paths = root, []

    def add(self, sha: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix="fsbench-gate-")) / sha[:12]
        subprocess.run(["git", "worktree", "add", "--quiet", "--detach", str(path), sha],
                       cwd=self.root, check=True, capture_output=True)
        self.paths.append(path)
        return path

    def __enter__(self) -> "Worktrees":
        return self

    def __exit__(self, *exc) -> None:
        for path in self.paths:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=self.root,
                           capture_output=True)
            shutil.rmtree(path.parent, ignore_errors=True)


def _has_module(side: Side, *paths: str) -> bool:
    """Whether the side's tree holds one of `paths` (a module's place before and after
    fsbench/ was cut into groups: BASE may be either)."""
    return any((side.tree / "fsbench" / p).exists() for p in paths)


def supports_pacing(side: Side) -> bool:
    return _has_module(side, "running/pacing.py", "pacing.py")


def store_flag(side: Side) -> str:
    """How the side's `fsbench run` names its store: `--store`, or `--out` in a version
    older than the common flag vocabulary (fsbench/cli/args.py)."""
    return "--store" if _has_module(side, "cli/args.py", "cli_args.py") else "--out"


def plan(sweep: Sweep, sides: tuple[str, str]) -> list[tuple[int, str, tuple[str, str]]]:
    """(pair, trainer, side order) in run order. The order says which side goes first:
    in every block of a paced pair (the gate redraws it per block), or for the whole run
    when the gate falls back to unpaced runs."""
    rng = random.Random(sweep.seed)
    return [(pair, trainer, sides if rng.random() < 0.5 else sides[::-1])
            for pair in range(sweep.pairs) for trainer in sweep.trainers]


def run_command(side: Side, sweep: Sweep, trainer: str, out: Path, seed: int,
                pace: pacing.Pace | None = None) -> tuple[list[str], dict[str, str]]:
    """`fsbench run` of `side`'s code, as its own process (its tree's fsbench on PYTHONPATH)."""
    env = {**os.environ, **side.env,
           "PYTHONPATH": os.pathsep.join(p for p in [str(side.tree), side.env.get("PYTHONPATH", ""),
                                                     os.environ.get("PYTHONPATH", "")] if p)}
    env.pop(pacing.ENV, None)
    if pace is not None:
        env[pacing.ENV] = pace.env_value()
    cmd = [sys.executable, "-m", "fsbench.cli", "run", "--workload", sweep.workload,
           "--trainer", trainer, "--world-size", str(sweep.world_size), "--steps", str(sweep.steps),
           "--warmup", str(sweep.warmup), "--seed", str(seed), store_flag(side), str(out / side.name)]
    return cmd, env


def _fail(name: str, trainer: str, code: int, log: Path) -> RuntimeError:
    if code == 130:
        raise KeyboardInterrupt
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return RuntimeError(f"{name} {trainer}: exit {code}: {lines[-1] if lines else ''} (log: {log})")


def run_one(side: Side, sweep: Sweep, trainer: str, out: Path, seed: int) -> None:
    """One unpaced run (the fallback, and calibration's pools)."""
    cmd, env = run_command(side, sweep, trainer, out, seed)
    log = out / "logs" / f"{side.name}-{trainer.replace(':', '_')}-seed{seed}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        code = subprocess.run(cmd, cwd=side.tree, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if code:
        raise _fail(side.name, trainer, code, log)


def run_paced(sides: tuple[Side, Side], sweep: Sweep, trainer: str, out: Path, seed: int,
              rng: random.Random) -> None:
    """Both sides' runs of one trainer and seed, taking turns block by block: start both,
    wait until both are parked at block 0, then per block release one side, wait until it
    parks again, release the other (the order a coin per block); at the end release both
    for their teardown. Either run failing stops the other."""
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="fsbench-pace-") as turns:
        paces = {s.name: pacing.Pace(Path(turns), s.name, sweep.block_steps) for s in sides}
        try:
            for side in sides:
                cmd, env = run_command(side, sweep, trainer, out, seed, paces[side.name])
                logs[side.name] = out / "logs" / f"{side.name}-{trainer.replace(':', '_')}-seed{seed}.log"
                logs[side.name].parent.mkdir(parents=True, exist_ok=True)
                with open(logs[side.name], "w") as f:
                    procs[side.name] = subprocess.Popen(cmd, cwd=side.tree, env=env, stdout=f,
                                                        stderr=subprocess.STDOUT)

            def wait_parked(name: str, block: int) -> None:
                while not paces[name].parked(block).exists():
                    code = procs[name].poll()
                    if code is not None:
                        raise _fail(name, trainer, code, logs[name])
                    time.sleep(pacing.POLL_S)

            names = [s.name for s in sides]
            last = pacing.blocks(sweep.steps, sweep.block_steps) - 1
            for name in names:
                wait_parked(name, 0)
            for block in range(last):
                for name in rng.sample(names, 2):
                    paces[name].go(block).touch()
                    wait_parked(name, block + 1)
            for name in names:
                paces[name].go(last).touch()
            for name in names:
                code = procs[name].wait()
                if code:
                    raise _fail(name, trainer, code, logs[name])
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        proc.kill()


def _new_runs(out: Path, sides: tuple[Side, Side], before: dict[str, set[str]]) -> dict[str, Path]:
    """The run directory each side added since `before` (names per side)."""
    found = {}
    for side in sides:
        root = out / side.name
        added = [d for d in root.iterdir() if d.is_dir() and d.name not in before[side.name]] \
            if root.is_dir() else []
        if added:
            found[side.name] = max(added, key=lambda d: d.stat().st_mtime)
    return found


def _listing(out: Path, sides: tuple[Side, Side]) -> dict[str, set[str]]:
    return {s.name: {d.name for d in (out / s.name).iterdir()} if (out / s.name).is_dir() else set()
            for s in sides}


def contended(run_dir: Path) -> bool | None:
    """The run's `contended` flag from its summary (None: unknown or unreadable)."""
    from fsbench.running.store import read_object

    try:
        return read_object(run_dir / "summary.json").get("contended")
    except ConfigError:
        return None


def run_pair(sides: tuple[Side, Side], sweep: Sweep, trainer: str, out: Path, seed: int,
             rng: random.Random, retries: int = DEFAULT_RETRIES, paced: bool = True,
             order: tuple[str, str] | None = None) -> list[str]:
    """One pair of runs (same seed on both sides), rerun while a run in it was contended
    (a neighbour took the CPU): the contended pair moves to `out/contended/` (kept, not
    compared). Dropping it would leave fewer units; rerunning until quiet would never end
    on a busy machine, so after `retries` reruns it stays, and the sides still contended
    are returned (compare then calls its key inconclusive)."""
    by_name = {s.name: s for s in sides}
    for attempt in range(retries + 1):
        before = _listing(out, sides)
        if paced:
            run_paced(sides, sweep, trainer, out, seed, rng)
        else:
            for name in order or [s.name for s in sides]:
                run_one(by_name[name], sweep, trainer, out, seed=seed)
        runs = _new_runs(out, sides, before)
        busy = [name for name, d in runs.items() if contended(d)]
        if not busy or attempt == retries:
            return busy
        note(f"gate: {trainer} seed {seed}: {', '.join(busy)} contended (a neighbour took the "
             f"CPU); moved to {out / 'contended'}, running the pair again "
             f"({attempt + 1} of {retries})")
        for name, d in runs.items():
            target = out / "contended" / name / d.name
            target.parent.mkdir(parents=True, exist_ok=True)
            d.rename(target)
    return busy


def run_pairs(sides: tuple[Side, Side], sweep: Sweep, out: Path,
              progress: Callable[[Iterable], Iterable] = lambda it: it,
              retries: int = DEFAULT_RETRIES) -> tuple[bool, list[tuple[str, int, list[str]]]]:
    """Every (pair, trainer) of the plan (`run_pair`). Returns (paced, pairs still
    contended after their reruns: (trainer, seed, sides)). Same seed on both sides of a
    pair (same batches), another seed per pair."""
    paced = all(supports_pacing(s) for s in sides)
    rng = random.Random(sweep.seed + 1)
    still = []
    for pair, trainer, order in progress(plan(sweep, (sides[0].name, sides[1].name))):
        busy = run_pair(sides, sweep, trainer, out, sweep.seed + pair, rng, retries, paced, order)
        if busy:
            still.append((trainer, sweep.seed + pair, busy))
    return paced, still


def contended_rows(sweep: Sweep, rows: list, still: list[tuple[str, int, list[str]]], retries: int) -> list:
    """`rows` with every verdict of a trainer whose pair stayed contended made inconclusive,
    and a row saying so. Its comparison rests on fewer pairs than asked for, and on a
    machine that was not quiet while its pairs ran: the pairs kept may have been slowed too,
    below the flag's threshold (a CI gate beside a neighbour read such a pair as a 5.9%
    regression), so no verdict of that trainer can stand, "unchanged" included."""
    from fsbench.gates.compare import Row

    busy = {}
    for trainer, seed, sides in still:
        busy.setdefault(trainer, []).append(f"seed {seed} ({'/'.join(sides)})")
    why = {t: f"{', '.join(seeds)} stayed contended in {retries + 1} tries" for t, seeds in busy.items()}
    remedy = "run the gate on a quiet machine, or with more --retries"
    out = [r if r.trainer not in why or r.verdict == "inconclusive" else replace(
        r, verdict="inconclusive", reason=f"{r.verdict} on the pairs kept, but {why[r.trainer]}: "
                                          "the machine was not quiet while they ran", remedy=remedy)
           for r in rows]
    nan = float("nan")
    for trainer in busy:
        out.append(Row(sweep.workload, trainer, sweep.world_size, "*", nan, nan, nan, nan, nan,
                       nan, nan, 0, 0, "inconclusive", reason=why[trainer], remedy=remedy))
    return out


@dataclass
class Verdict:
    """One gate's finding: compare's rows and notes, whether the versions took turns, and
    the folder holding its runs and compare.md, compare.json, compare.junit.xml."""
    rows: list
    notes: list[str]
    paced: bool
    out: Path


def run_gate(root: Path, base_sha: str, new_sha: str | None, sweep: Sweep, out: Path,
             retries: int, alpha: float, thresholds: dict[str, float],
             allow_cross_machine: bool = False,
             progress: Callable[[Iterable], Iterable] = lambda it: it,
             name: str = "fsbench gate") -> Verdict:
    """Both versions' runs (NEW None: the checkout at `root`), taking turns, then compared;
    the comparison written into `out` in every output format."""
    from fsbench.gates import compare, compare_output, compare_sides

    with Worktrees(root) as trees:
        sides = (Side("base", trees.add(base_sha)), Side("new", trees.add(new_sha) if new_sha else root))
        try:
            paced, still = run_pairs(sides, sweep, out, retries=retries, progress=progress)
        except RuntimeError as e:
            raise ConfigError(f"gate: a run failed ({e}); runs so far are in {out}") from None
    rows, notes = compare.compare(compare_sides.load_side(out / "base"), compare_sides.load_side(out / "new"),
                                  alpha, thresholds, allow_cross_machine)
    rows = contended_rows(sweep, rows, still, retries)
    (out / "compare.md").write_text(compare_output.markdown(rows, notes))
    (out / "compare.json").write_text(compare_output.to_json(rows, notes))
    (out / "compare.junit.xml").write_text(compare_output.junit(rows, notes, name))
    return Verdict(rows, notes, paced, out)
