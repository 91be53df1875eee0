"""`fsbench gate --base REV [--new REV]`: the same small sweep of two versions, run in
randomized interleaved pairs on this machine, then `fsbench compare`.

Each version runs from its own git worktree (NEW defaults to this checkout, uncommitted
changes included) with that tree's own fsbench on PYTHONPATH. Pair i runs A then B or B
then A (a seeded coin), every trainer of the sweep per side: the RMIT design, so that drift
on a shared machine (a neighbour starting, thermal state) hits both versions alike instead
of biasing whichever ran second. Runs are kept under --out (base/, new/); a stopped gate
keeps what finished.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from fsbench.errors import ConfigError


@dataclass
class Side:
    """One version under test: where its tree is, and its extra environment."""
    name: str
    tree: Path
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Sweep:
    """The default gate: `small` at 2 ranks, 34 steps (30 measured). Not `tiny`: its 7 ms
    steps are half bubble and its run medians vary +-14% on the 2-core VM. On that VM the
    CPU's speed itself wanders by +-15% within seconds (a fixed matmul's thread CPU time),
    so a run must span several seconds for its median to settle: 12 steps of `small` left
    +-12% run-level noise (results/gate_calibration_cpu.md)."""
    workload: str = "small"
    trainers: tuple[str, ...] = ("ddp", "freescale")
    world_size: int = 2
    steps: int = 34
    warmup: int = 4
    pairs: int = 4
    seed: int = 0


def repo_root() -> Path:
    out = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if out.returncode:
        raise ConfigError("fsbench gate must run inside the git checkout of fsbench")
    return Path(out.stdout.strip())


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


def plan(sweep: Sweep, sides: tuple[str, str]) -> list[tuple[int, str, str]]:
    """(pair, side, trainer) in run order: each pair in a seeded random side order."""
    rng = random.Random(sweep.seed)
    order = []
    for pair in range(sweep.pairs):
        first, second = sides if rng.random() < 0.5 else sides[::-1]
        order += [(pair, s, t) for s in (first, second) for t in sweep.trainers]
    return order


def run_one(side: Side, sweep: Sweep, trainer: str, out: Path, seed: int) -> None:
    """One run of `side`'s code, as its own process (its tree's fsbench on PYTHONPATH)."""
    env = {**os.environ, **side.env,
           "PYTHONPATH": os.pathsep.join(p for p in [str(side.tree), side.env.get("PYTHONPATH", ""),
                                                     os.environ.get("PYTHONPATH", "")] if p)}
    cmd = [sys.executable, "-m", "fsbench.cli", "run", "--workload", sweep.workload,
           "--trainer", trainer, "--world-size", str(sweep.world_size), "--steps", str(sweep.steps),
           "--warmup", str(sweep.warmup), "--seed", str(seed), "--out", str(out / side.name)]
    done = subprocess.run(cmd, cwd=side.tree, env=env, capture_output=True, text=True)
    if done.returncode == 130:
        raise KeyboardInterrupt
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"{side.name} {trainer}: exit {done.returncode}: {tail[0]}")


def run_pairs(sides: tuple[Side, Side], sweep: Sweep, out: Path,
              progress: Callable[[Iterable], Iterable] = lambda it: it) -> None:
    by_name = {s.name: s for s in sides}
    for pair, name, trainer in progress(plan(sweep, (sides[0].name, sides[1].name))):
        # Same seed on both sides of a pair (same batches), another per pair.
        run_one(by_name[name], sweep, trainer, out, seed=sweep.seed + pair)
