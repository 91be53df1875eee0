"""Calibrate `fsbench compare`/`fsbench gate` against this machine's noise, on real runs.

Runs rounds of the default gate's sweep (`small`, 2 ranks, 64 steps, the versions taking
turns every step), each round one seed and four paced duels as the gate runs them (two
runs taking turns block by block, fsbench.pacing), in a shuffled order:

  A/A ddp, A/A freescale   identical code on both sides: any verdict but unchanged is a false alarm
  A/S   a test-only DDP with +10% step time on every rank (tests/support/trainers_for_tests.py:
        InjectedDDP): step_time_ms must say regressed
  A/B   the same DDP with a straggler on rank 0 (about +5 bubble points): bubble_ratio must
        say regressed

A gate of the default size is two rounds (two seeds); disjoint pairs of rounds give
independent gates, and every round alone is a one-seed gate. Reports the counts, the
injected changes as measured, and the smallest change the default gate detects per metric.
Writes results/gate_calibration_cpu.md.

    python scripts/gate_calibration.py [--rounds 12] [--out runs/gate_calibration]
"""
from __future__ import annotations

import argparse
import functools
import itertools
import os
import platform
import random
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from fsbench import compare, gate
from fsbench.store import load_runs

HERE = Path(__file__).resolve().parent.parent
SUPPORT = str(HERE / "tests" / "support")
TEST_DDP = "trainers_for_tests:InjectedDDP"
# Rank 0 spins this share of its step's wall time: with a bubble b near 13% (small at 2
# ranks) adding x = s T to one rank of two moves the bubble to (2bT + x) / (2T + 2x): 0.16
# measured +4.1 points (results/gate_calibration_cpu.md at 94a3e1c); 0.20 aims at +5.
SLOWDOWN, STRAGGLE = 0.10, 0.20


DUELS = ("A/A ddp", "A/A freescale", "A/S", "A/B")


def duel_sides(kind: str) -> tuple[tuple[gate.Side, gate.Side], str]:
    test = {"PYTHONPATH": SUPPORT}
    tag = kind.replace("/", "").replace(" ", "_").lower()
    base = gate.Side(f"{tag}_base", HERE, test if kind != "A/A freescale" else {})
    new_env = {"A/A ddp": test, "A/A freescale": {},
               "A/S": {**test, "FSBENCH_TEST_SLOWDOWN": str(SLOWDOWN)},
               "A/B": {**test, "FSBENCH_TEST_STRAGGLE": str(STRAGGLE)}}[kind]
    trainer = "freescale" if kind == "A/A freescale" else TEST_DDP
    return (base, gate.Side(f"{tag}_new", HERE, new_env)), trainer


def rounds_run(rounds: int, sweep: gate.Sweep, out: Path) -> None:
    rng = random.Random(sweep.seed)
    order = []
    for r in range(rounds):
        kinds = list(DUELS)
        rng.shuffle(kinds)
        order += [(r, k) for k in kinds]
    done = out / "done.txt"  # resumable: a stopped calibration keeps its finished duels
    finished = set(done.read_text().splitlines()) if done.exists() else set()
    turns = random.Random(sweep.seed + 1)
    for r, kind in tqdm(order, desc="calibration duels"):
        if f"{r} {kind}" in finished:
            continue
        sides, trainer = duel_sides(kind)
        gate.run_paced(sides, sweep, trainer, out, seed=sweep.seed + r, rng=turns)
        with open(done, "a") as f:
            f.write(f"{r} {kind}\n")


def draws(out: Path, pairs: int, overlapping: bool = True) -> pd.DataFrame:
    """Every gate of `pairs` rounds from disjoint rounds (independent), every round alone
    (a one-seed gate), and every combination of `pairs` rounds."""
    # Every run enters many comparisons here: read its steps once (finished runs never change).
    compare.step_samples = functools.lru_cache(maxsize=None)(compare.step_samples)
    rows = []
    for kind in DUELS:
        (base_side, new_side), _ = duel_sides(kind)
        base, new = load_runs(out / base_side.name), load_runs(out / new_side.name)
        seeds = sorted(set(base["seed"]) & set(new["seed"]))
        groups = [("gate", seeds[i:i + pairs]) for i in range(0, len(seeds) - pairs + 1, pairs)]
        groups += [("one seed", [s]) for s in seeds]
        # Every two rounds: more gates than the disjoint ones, but they share rounds.
        if overlapping:
            groups += [("any two", list(c)) for c in itertools.combinations(seeds, pairs)]
        for size, group in groups:
            pick = lambda runs: runs[runs["seed"].isin(group)].reset_index(drop=True)  # noqa: E731
            result, notes = compare.compare(pick(base), pick(new))
            for r in result:
                rows.append({"gate": f"{size} {'+'.join(map(str, group))}", "size": size, "kind": kind,
                             "metric": r.metric, "verdict": r.verdict, "effect": r.effect,
                             "ci_low": r.ci_low, "ci_high": r.ci_high, "p_adjusted": r.p_adjusted,
                             "units": r.units, "left_out": len(notes)})
    return pd.DataFrame(rows)


def paired_spread(out: Path, block_steps: int) -> tuple[float, float, int]:
    """(sd of one paired step's log step-time ratio, sd of a block's mean of them, duels):
    medians over the A/A duels. What a turn's length does to the gate's noise: blocks of
    independent steps would give sd(step) / sqrt(block_steps)."""
    per_step, per_block = [], []
    for kind in ("A/A ddp", "A/A freescale"):
        (base_side, new_side), _ = duel_sides(kind)
        base, new = load_runs(out / base_side.name), load_runs(out / new_side.name)
        base, new = compare.usable(base), compare.usable(new)
        for seed in sorted(set(base["seed"]) & set(new["seed"])):
            pair = [(compare.step_samples(base[base["seed"] == seed]["run_dir"].iloc[0]),
                     compare.step_samples(new[new["seed"] == seed]["run_dir"].iloc[0]))]
            per_step.append(compare.paired_units("time", "step_time_ms", [(*pair[0], 1)]).std(ddof=1))
            per_block.append(compare.paired_units("time", "step_time_ms", [(*pair[0], block_steps)]).std(ddof=1))
    return float(np.median(per_step)), float(np.median(per_block)), len(per_step)


def detected(df: pd.DataFrame, kind: str, metric: str | None = None) -> pd.Series:
    """Per gate: did it fail (any regression, or a regression of `metric`)?"""
    g = df[df["kind"] == kind]
    if metric:
        g = g[g["metric"] == metric]
    return g.groupby("gate")["verdict"].apply(lambda v: bool((v == "regressed").any()))


def counts(df: pd.DataFrame, size: str) -> list[str]:
    d = df[df["size"] == size]
    if not len(d):
        return ["- none: too few rounds"]
    aa = d[d["kind"].str.startswith("A/A")]
    alarms = aa[aa["verdict"] != "unchanged"]
    n_aa = aa.groupby(["gate", "kind"]).ngroups
    fails = alarms[alarms["verdict"] == "regressed"].groupby(["gate", "kind"]).ngroups
    slow, strag, strag_any = detected(d, "A/S"), detected(d, "A/B", "bubble_ratio"), detected(d, "A/B")
    eff = lambda kind, metric: d[(d["kind"] == kind) & (d["metric"] == metric)]["effect"].median()  # noqa: E731
    return [
        f"- **A/A: {fails} failed gates of {n_aa}** (any verdict but unchanged: "
        f"{alarms.groupby(['gate', 'kind']).ngroups}; {len(alarms)} metric verdicts of {len(aa)}).",
        f"- **A/S (+{SLOWDOWN:.0%} step time) detected: {int(slow.sum())} of {len(slow)}**; measured "
        f"change (median): {eff('A/S', 'step_time_ms'):.3f}x; gates with a contended run left out "
        f"(fewer blocks): {int((d[d['kind'] == 'A/S'].groupby('gate')['left_out'].max() > 0).sum())}.",
        f"- **A/B (straggler) detected as a bubble regression: {int(strag.sum())} of {len(strag)}** "
        f"(gate failed on any metric: {int(strag_any.sum())}); measured change (median): "
        f"{100 * eff('A/B', 'bubble_ratio'):+.1f} points, step time {eff('A/B', 'step_time_ms'):.3f}x.",
    ]


def render(df: pd.DataFrame, args, sweep: gate.Sweep, elapsed_s: float) -> str:
    from scipy import stats

    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=HERE).stdout.strip()
    gates = df[df["size"] == "gate"]  # the smallest detectable change: independent gates
    aa = gates[gates["kind"].str.startswith("A/A")]
    units = int(aa[aa["metric"] == "step_time_ms"]["units"].median()) if len(aa) else 0
    # A change is flagged when |t| clears the Holm-adjusted alpha; with one metric moving,
    # about alpha / (number of metrics): half-width x t(1 - alpha/2m) / t(0.975).
    widen = (stats.t.ppf(1 - compare.DEFAULT_ALPHA / (2 * len(compare.METRICS)), units - 1)
             / stats.t.ppf(0.975, units - 1)) if units > 1 else float("nan")
    lines = [
        "# Regression gate calibration (A/A, A/S, A/B)\n",
        f"Machine: {os.cpu_count()} cores ({platform.machine()}), no GPU, torch {torch.__version__}, "
        f"gloo. Commit `{sha}`. Default gate sweep: `{sweep.workload}`, {sweep.world_size} ranks, "
        f"{sweep.steps} steps ({sweep.warmup} warm-up), the two versions taking turns every "
        f"{sweep.block_steps} steps (fsbench.pacing), {sweep.pairs} seeds per gate. {args.rounds} "
        f"rounds (one seed each) of four paced duels in shuffled order: identical ddp, identical "
        f"freescale, +{SLOWDOWN:.0%} step time (A/S), rank-0 straggler +{STRAGGLE:.0%} compute (A/B). "
        f"Default thresholds {compare.DEFAULT_THRESHOLDS}, alpha {compare.DEFAULT_ALPHA} (Holm over "
        f"{len(compare.METRICS)} metrics). "
        + (f"{elapsed_s / 60:.0f} min of runs. " if elapsed_s else "Runs reused (about 1 min per duel on this VM). ")
        + f"Command: "
        f"`python scripts/gate_calibration.py --rounds {args.rounds}"
        + (f" --block-steps {sweep.block_steps}" if sweep.block_steps != gate.Sweep.block_steps else "")
        + "`.\n",
        f"## Default gates ({sweep.pairs} seeds; disjoint rounds, so independent)\n",
        *counts(df, "gate"),
        "\n## One-seed gates (every round alone; half the default's units)\n",
        *counts(df, "one seed"),
        *([f"\n## Every {sweep.pairs} rounds as a gate (rounds shared between gates: not independent)\n",
           *counts(df, "any two")] if (df["size"] == "any two").any() else []),
        "\n## Noise of the pairing (A/A duels)\n",
        "Median over {2} A/A duels: one paired step's log step-time ratio varies with sd "
        "{0:.3f}, a turn's ({3} step(s)) mean with sd {1:.3f}.".format(
            *paired_spread(Path(args.out).resolve(), sweep.block_steps), sweep.block_steps),
        "\n## Smallest change the default gate detects, per metric\n",
        f"The larger of the metric's threshold and the change that clears the Holm-adjusted alpha "
        f"with one metric moving: the median A/A 95% half-width x {widen:.2f} "
        f"(t quantiles at {units - 1} degrees of freedom; {units} paired blocks of "
        f"{sweep.block_steps} step(s) per gate).\n",
        "| metric | threshold | A/A 95% half-width (median) | smallest detectable change |",
        "|---|---:|---:|---:|",
    ]
    for metric, (kind, _) in compare.METRICS.items():
        g = aa[aa["metric"] == metric]
        if not len(g):
            continue
        half = float(((g["ci_high"] - g["ci_low"]) / 2).median())
        if kind != "ratio":  # ratios: as a relative change
            half = float((((g["ci_high"] - g["ci_low"]) / 2) / g["effect"]).median())
        thr = compare.DEFAULT_THRESHOLDS[kind]
        fmt = (lambda v: f"{100 * v:.1f} pp") if kind == "ratio" else (lambda v: f"{100 * v:.1f}%")
        lines.append(f"| {metric} | {fmt(thr)} | {fmt(half)} | {fmt(max(thr, half * widen))} |")
    alarms = df[df["kind"].str.startswith("A/A") & (df["verdict"] != "unchanged")]
    if len(alarms):
        lines += ["\n## A/A verdicts other than unchanged\n", "```", alarms.to_string(index=False), "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    import time

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--out", default="runs/gate_calibration")
    ap.add_argument("--skip-runs", action="store_true", help="only re-analyse the stored duels")
    ap.add_argument("--no-overlapping", action="store_true",
                    help="skip the overlapping gates (every combination of rounds: slow to analyse)")
    ap.add_argument("--from-draws", action="store_true",
                    help="only re-render the table from the stored draws.csv")
    ap.add_argument("--table", default="results/gate_calibration_cpu.md")
    ap.add_argument("--block-steps", type=int, default=gate.Sweep.block_steps,
                    help="steps per turn (default: the gate's, %(default)s)")
    args = ap.parse_args()
    sweep = gate.Sweep(trainers=(), block_steps=args.block_steps)
    out = Path(args.out).resolve()
    start = time.time()
    ran = not (args.skip_runs or args.from_draws)
    if ran:
        rounds_run(args.rounds, sweep, out)
    if args.from_draws:
        df = pd.read_csv(out / "draws.csv")
    else:
        df = draws(out, sweep.pairs, not args.no_overlapping)
        df.to_csv(out / "draws.csv", index=False)
    Path(args.table).write_text(render(df, args, sweep, time.time() - start if ran else None))
    print(Path(args.table).read_text())


if __name__ == "__main__":
    main()
