"""Calibrate `fsbench compare`/`fsbench gate` against this machine's noise, on real runs.

Runs rounds of the default gate's sweep (`small`, 2 ranks, 64 steps, the versions taking
turns every step), each round one seed and four paced duels as the gate runs them (two
runs taking turns block by block, fsbench.running.pacing), in a shuffled order:

  A/A ddp, A/A freescale   identical code on both sides: any verdict but unchanged is a false alarm
  A/S   a test-only DDP with +10% step time on every rank (tests/support/trainers_for_tests.py:
        InjectedDDP): step_time_ms must say regressed
  A/I   the same DDP with an intermittent stall: every 8th step twice as slow (+12.5% in
        total, the median step unchanged): step_time_ms must say regressed
  A/B   the same DDP with a straggler on rank 0 (about +5 bubble points): bubble_ratio must
        say regressed

A gate of the default size is three rounds (three seeds), and disjoint triples of rounds
give independent gates; disjoint pairs of rounds give the CI's two-seed gates. A duel in which a run was
contended is rerun as the gate reruns it (fsbench.gates.gate.run_pair), and one that stays
contended is kept: its gates count as what compare calls them (inconclusive). Then the
all-contended case: A/A duels run beside busy neighbour processes, which the gate must
call inconclusive (exit 3), never unchanged. Reports every verdict (regressed, unchanged,
improved, inconclusive), the injected changes as measured, and the smallest change the
default gate detects per metric. Writes results/gate_calibration_cpu.md.

    python scripts/gate_calibration.py [--rounds 20] [--kinds "A/A ddp:30,A/S:60"] [--store runs/gate_calibration]
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import platform
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fsbench.gates import compare
from fsbench.gates import compare_sides
from fsbench.gates import gate
from fsbench.cli.args import rename
from fsbench.running.store import load_runs
from fsbench.table import progress

HERE = Path(__file__).resolve().parent.parent
SUPPORT = str(HERE / "tests" / "support")
TEST_DDP = "trainers_for_tests:InjectedDDP"
# Rank 0 spins this share of its step's wall time: with a bubble b near 13% (small at 2
# ranks) adding x = s T to one rank of two moves the bubble to (2bT + x) / (2T + 2x): 0.16
# measured +4.1 points (results/gate_calibration_cpu.md at 94a3e1c); 0.20 aims at +5.
SLOWDOWN, STRAGGLE, STALL_EVERY = 0.10, 0.20, 8


DUELS = ("A/A ddp", "A/A freescale", "A/S", "A/I", "A/B")
# What a gate must say for each duel (metric, verdict); A/A: every metric unchanged.
EXPECTED = {"A/S": "step_time_ms", "A/I": "step_time_ms", "A/B": "bubble_ratio"}


def duel_sides(kind: str) -> tuple[tuple[gate.Side, gate.Side], str]:
    test = {"PYTHONPATH": SUPPORT}
    tag = kind.replace("/", "").replace(" ", "_").lower()
    base = gate.Side(f"{tag}_base", HERE, test if kind != "A/A freescale" else {})
    new_env = {"A/A ddp": test, "A/A freescale": {},
               "A/S": {**test, "FSBENCH_TEST_SLOWDOWN": str(SLOWDOWN)},
               "A/I": {**test, "FSBENCH_TEST_STALL_EVERY": str(STALL_EVERY)},
               "A/B": {**test, "FSBENCH_TEST_STRAGGLE": str(STRAGGLE)}}[kind]
    trainer = "freescale" if kind == "A/A freescale" else TEST_DDP
    return (base, gate.Side(f"{tag}_new", HERE, new_env)), trainer


def rounds_run(rounds: dict[str, int], sweep: gate.Sweep, out: Path) -> None:
    """Round r runs every kind with more than r rounds, in a shuffled order."""
    rng = random.Random(sweep.seed)
    order = []
    for r in range(max(rounds.values())):
        shuffled = [k for k in rounds if r < rounds[k]]
        rng.shuffle(shuffled)
        order += [(r, k) for k in shuffled]
    done = out / "done.txt"  # resumable: a stopped calibration keeps its finished duels
    finished = {" ".join(line.split()[:3]) for line in done.read_text().splitlines()} if done.exists() else set()
    turns = random.Random(sweep.seed + 1)
    for r, kind in progress(order, "calibration duels", "duel"):
        if f"{r} {kind}" in finished:
            continue
        sides, trainer = duel_sides(kind)
        busy = gate.run_pair(sides, sweep, trainer, out, seed=sweep.seed + r, rng=turns)
        with open(done, "a") as f:
            f.write(f"{r} {kind}" + (f" contended:{'/'.join(busy)}" if busy else "") + "\n")


def contended_case(trials: int, sweep: gate.Sweep, out: Path) -> list[dict]:
    """A/A ddp duels beside two busy neighbour processes (one per core), rerun once as the
    gate would: compare must call them inconclusive. One dict per trial."""
    results = []
    for trial in range(trials):
        where = out / "all_contended" / f"trial{trial}"
        sides, trainer = duel_sides("A/A ddp")
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        try:
            busy = gate.run_pair(sides, sweep, trainer, where, seed=1000 + trial,
                                 rng=random.Random(trial), retries=1)
        finally:
            for proc in spinners:
                proc.kill()
        rows, notes = compare.compare(*(compare_sides.load_side(where / s.name) for s in sides))
        results.append({"trial": trial, "still_contended": "/".join(busy) or "none",
                        "outcome": compare.outcome(rows), "exit": compare.exit_code(rows),
                        "reason": next((r.reason for r in rows if r.verdict == "inconclusive"), "")})
    return results


def gate_sizes(pairs: int) -> dict[str, int]:
    """Gate sizes to count, each over disjoint rounds (independent gates): the default and
    the CI's short gate (`.ci/run`: `--pairs 2`)."""
    return {"default": pairs, **({"two seeds": 2} if pairs != 2 else {})}


def draws(out: Path, kinds: list[str], pairs: int) -> pd.DataFrame:
    """Every gate of each size in gate_sizes from disjoint rounds: one row per gate and
    metric, with the gate's outcome (what its exit code says)."""
    # Every run enters several comparisons here: read its steps once (finished runs never change).
    compare_sides.step_samples = functools.lru_cache(maxsize=None)(compare_sides.step_samples)
    # Duels still contended after their reruns: `fsbench gate` adds an inconclusive row
    # for their trainer (gate.contended_rows), so their gates count as it would.
    done = out / "done.txt"
    still = {(int(line.split()[0]), " ".join(line.split()[1:-1])) for line in
             (done.read_text().splitlines() if done.exists() else []) if "contended:" in line}
    rows = []
    for kind in kinds:
        (base_side, new_side), _ = duel_sides(kind)
        base, new = load_runs(out / base_side.name), load_runs(out / new_side.name)
        seeds = sorted(set(base["seed"]) | set(new["seed"]))
        groups = [(size, seeds[i:i + n]) for size, n in gate_sizes(pairs).items()
                  for i in range(0, len(seeds) - n + 1, n)]
        for size, group in groups:
            pick = lambda runs: runs[runs["seed"].isin(group)].reset_index(drop=True)  # noqa: E731
            result, notes = compare.compare(pick(base), pick(new))
            stuck = [seed for seed in group if (seed - gate.Sweep.seed, kind) in still]
            if stuck:
                sweep = dataclasses.replace(gate.Sweep(), trainers=(duel_sides(kind)[1],))
                result += gate.contended_rows(sweep, [(sweep.trainers[0], seed, ["both sides"])
                                                      for seed in stuck], gate.DEFAULT_RETRIES)
            for r in result:
                rows.append({"gate": f"{size} {'+'.join(map(str, group))}", "size": size, "kind": kind,
                             "metric": r.metric, "verdict": r.verdict, "outcome": compare.outcome(result),
                             "effect": r.effect, "ci_low": r.ci_low, "ci_high": r.ci_high,
                             "p_adjusted": r.p_adjusted, "units": r.units, "reason": r.reason,
                             "left_out": sum("left out" in n for n in notes)})
    return pd.DataFrame(rows)


def paired_spread(out: Path) -> tuple[float, int]:
    """(sd of one paired step's log step-time ratio, duels): the median over A/A duels."""
    spreads = []
    for kind in ("A/A ddp", "A/A freescale"):
        (base_side, new_side), _ = duel_sides(kind)
        if not (out / base_side.name).is_dir():
            continue
        base, new = load_runs(out / base_side.name), load_runs(out / new_side.name)
        base, new = compare_sides.usable(base), compare_sides.usable(new)
        for seed in sorted(set(base["seed"]) & set(new["seed"])):
            b = compare_sides.step_samples(base[base["seed"] == seed]["run_dir"].iloc[0])
            n = compare_sides.step_samples(new[new["seed"] == seed]["run_dir"].iloc[0])
            j = b.merge(n, on="step", suffixes=("_b", "_n"))
            spreads.append(float(np.log(j["step_time_ms_n"] / j["step_time_ms_b"]).std(ddof=1)))
    return (float(np.median(spreads)) if spreads else float("nan")), len(spreads)


def counts(df: pd.DataFrame, size: str) -> list[str]:
    d = df[df["size"] == size]
    if not len(d):
        return ["- none: too few rounds"]
    lines = []
    per_gate = d.groupby(["kind", "gate"])
    outcome = per_gate["outcome"].first()
    for kind in dict.fromkeys(d["kind"]):
        o = outcome[kind]
        tally = ", ".join(f"{v} {int((o == v).sum())}" for v in ("regressed", "inconclusive", "unchanged")
                          if (o == v).any())
        if kind.startswith("A/A"):
            wrong = d[(d["kind"] == kind) & (d["verdict"] != "unchanged")]
            lines.append(f"- **{kind}: {int((o == 'regressed').sum())} false alarms (regressed) of "
                         f"{len(o)} gates**; outcomes: {tally}; metric verdicts other than unchanged: "
                         f"{len(wrong)} of {int((d['kind'] == kind).sum())}.")
            continue
        metric = EXPECTED[kind]
        k = d[d["kind"] == kind]
        # The expected metric's verdict per gate; a gate that compared nothing for this key
        # (metric "*": every run contended, ...) is inconclusive.
        g = k[k["metric"] == metric].set_index("gate")["verdict"].reindex(k["gate"].unique()).fillna("inconclusive")
        g = pd.DataFrame({"verdict": g})
        caught = int((g["verdict"] == "regressed").sum())
        eff = k[k["metric"] == metric]["effect"].median()
        change = f"{100 * eff:+.1f} points" if compare.METRICS[metric][0] == "ratio" else f"{eff:.3f}x"
        lines.append(f"- **{kind}: {metric} regressed in {caught} of {len(g)} gates** "
                     f"(inconclusive {int((g['verdict'] == 'inconclusive').sum())}, missed "
                     f"{int(g['verdict'].isin(['unchanged', 'improved']).sum())}); gate outcomes: "
                     f"{tally}; measured change (median): {change}.")
    return lines


def render(df: pd.DataFrame, args, rounds: dict[str, int], sweep: gate.Sweep,
           elapsed_s: float | None, contended: list[dict]) -> str:
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=HERE).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=HERE).stdout.strip()
    spread, duels = paired_spread(Path(args.store).resolve())
    lines = [
        "# Regression gate calibration\n",
        f"Machine: {os.cpu_count()} cores ({platform.machine()}), no GPU, torch {torch.__version__}, "
        f"gloo. Commit `{sha}`{' (with uncommitted changes)' if dirty else ''}. Default gate sweep: "
        f"`{sweep.workload}`, {sweep.world_size} ranks, {sweep.steps} steps ({sweep.warmup} warm-up), "
        f"the two versions taking turns every {sweep.block_steps} step(s) (fsbench.running.pacing), "
        f"{sweep.pairs} seeds per gate. Rounds (one seed each) of the duels "
        f"{', '.join(f'{k} x{n}' for k, n in rounds.items())}, kinds in shuffled order within a round: identical code (A/A), +{SLOWDOWN:.0%} step "
        f"time on every step (A/S), every {STALL_EVERY}th step twice as slow (A/I), rank-0 "
        f"straggler +{STRAGGLE:.0%} compute (A/B). Default thresholds {compare.DEFAULT_THRESHOLDS}, "
        f"alpha {compare.DEFAULT_ALPHA} (Holm over {len(compare.METRICS)} metrics); effects are "
        f"totals, tested by sign-flip randomization over paired steps (fsbench.stats). "
        + (f"{elapsed_s / 60:.0f} min of runs. " if elapsed_s else "Runs reused. ")
        + f"Command: `python scripts/gate_calibration.py --kinds "
        f"\"{','.join(f'{k}:{n}' for k, n in rounds.items())}\" --contended-trials {args.contended_trials}`.\n",
        "A gate's outcome is its exit code: regressed (1), inconclusive (3), unchanged (0). "
        "Inconclusive gates are counted as such: they are neither a catch nor a pass.\n",
        f"## Default gates ({sweep.pairs} seeds; disjoint rounds, so independent)\n",
        *counts(df, "default"),
        *(["\n## Two-seed gates (`.ci/run`'s short gate, `--pairs 2`; disjoint rounds)\n",
           *counts(df, "two seeds")] if "two seeds" in gate_sizes(sweep.pairs) else []),
        f"\nDuels rerun because a run in them was contended (as the gate reruns them; the "
        f"contended runs are kept under {Path(args.store).name}/contended/): "
        f"{sum(1 for _ in (Path(args.store) / 'contended').glob('*_base/*'))}; still contended after "
        f"the reruns: {int(df[df['reason'].fillna('').str.contains('contended')]['gate'].nunique())} gates.",
        "\n## All contended (A/A beside two busy processes, one rerun)\n",
        *([f"- trial {c['trial']}: outcome **{c['outcome']}** (exit {c['exit']}); still contended: "
           f"{c['still_contended']}; {c['reason']}" for c in contended] or ["- not run"]),
        "\n## Noise of the pairing (A/A duels)\n",
        f"Median over {duels} A/A duels: one paired step's log step-time ratio varies with sd "
        f"{spread:.3f}.",
        "\n## Interval half-widths of the default gate (A/A, median)\n",
        "A change is called only beyond the threshold and with the interval clear of no change; "
        "unchanged needs the whole interval within the threshold, so a half-width near the "
        "threshold makes A/A gates inconclusive.\n",
        "| metric | threshold | A/A 95% half-width (median) |",
        "|---|---:|---:|",
    ]
    gates = df[(df["size"] == "default") & df["kind"].str.startswith("A/A")]
    for metric, (kind, _) in compare.METRICS.items():
        g = gates[gates["metric"] == metric].dropna(subset=["ci_low", "ci_high"])
        if not len(g):
            continue
        half = (g["ci_high"] - g["ci_low"]) / 2
        if kind != "ratio":  # as a relative change
            half = half / g["effect"]
        fmt = (lambda v: f"{100 * v:.1f} pp") if kind == "ratio" else (lambda v: f"{100 * v:.1f}%")
        lines.append(f"| {metric} | {fmt(compare.DEFAULT_THRESHOLDS[kind])} | {fmt(float(half.median()))} |")
    odd = df[df["kind"].str.startswith("A/A") & (df["verdict"] != "unchanged")]
    if len(odd):
        lines += ["\n## A/A verdicts other than unchanged (every gate above)\n", "```",
                  odd[["gate", "kind", "metric", "verdict", "effect", "ci_low", "ci_high", "p_adjusted",
                       "reason"]].to_string(index=False, max_colwidth=90), "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    import json
    import time

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20, help="rounds of every kind without its own")
    ap.add_argument("--kinds", type=lambda t: [k.strip() for k in t.split(",") if k.strip()],
                    default=list(DUELS), help=f"duels to run, each KIND or KIND:ROUNDS "
                    f"(default: {','.join(DUELS)})")
    ap.add_argument("--contended-trials", type=int, default=2,
                    help="all-contended duels (beside busy processes); default: %(default)s")
    ap.add_argument("--store", default="runs/gate_calibration", help="where the duels' runs go")
    rename(ap, "--out", "--store", "store")  # its name before fsbench's one vocabulary
    ap.add_argument("--skip-runs", action="store_true", help="only re-analyse the stored duels")
    ap.add_argument("--table", default="results/gate_calibration_cpu.md")
    ap.add_argument("--block-steps", type=int, default=gate.Sweep.block_steps,
                    help="steps per turn (default: the gate's, %(default)s)")
    args = ap.parse_args()
    rounds = {}
    for item in args.kinds:
        kind, _, n = item.partition(":")
        if kind not in DUELS or (n and not n.isdigit()):
            ap.error(f"--kinds: {item!r}: expected KIND or KIND:ROUNDS with KIND one of: {', '.join(DUELS)}")
        rounds[kind] = int(n) if n else args.rounds
    args.kinds = list(rounds)
    sweep = gate.Sweep(trainers=(), block_steps=args.block_steps)
    out = Path(args.store).resolve()
    start = time.time()
    stored = out / "all_contended.json"
    if not args.skip_runs:
        if args.contended_trials and not stored.exists():  # first: a few minutes, then the rounds
            stored.write_text(json.dumps(contended_case(args.contended_trials, sweep, out)))
        rounds_run(rounds, sweep, out)
    contended = json.loads(stored.read_text()) if stored.exists() else []
    df = draws(out, args.kinds, sweep.pairs)
    df.to_csv(out / "draws.csv", index=False)
    Path(args.table).write_text(render(df, args, rounds, sweep,
                                       None if args.skip_runs else time.time() - start, contended))
    print(Path(args.table).read_text())


if __name__ == "__main__":
    main()
