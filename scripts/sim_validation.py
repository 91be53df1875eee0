"""Validate `fsbench simulate --cluster local` against runs on this machine.

For ddp and freescale on two presets with real-shaped lengths (`small`: MovieLens-100K,
`comm-heavy`: Amazon Beauty), at the same global batch:
  1 and 2 ranks   measured with the real model (compute=model)
  4, 8, 16 ranks  emulated (compute=emulated: real ranks and gloo collectives, the encoder
                  waiting for its calibrated cost)
and the simulator's projection of each. The fit comes from `fsbench calibrate` (encoder,
batch terms, tables, co-run) plus each trainer's per-step overhead from a real 1-rank run
at the calibration seed (fsbench.scaling.step_overhead.measure_step_overhead). Reports, per point, the step time's relative
error and each bubble cause's difference (percentage points) and relative error (where the
measured cause is at least 2% of capacity). The errors are reported as measured: nothing
here is tuned to them. Writes results/sim_validation_cpu.md.

    python scripts/sim_validation.py [--steps 20] [--store runs/sim_validation]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import subprocess
from pathlib import Path

import pandas as pd
import torch

from fsbench.costmodel.calibrate import calibrate
from fsbench.costmodel.fit import fit_path, load_fit
from fsbench.costmodel.corun import measure_corun_slowdown
from fsbench.running.store import write_json_atomic
from fsbench.scaling.commcal import calibrate_comm, load_comm_fits
from fsbench.config import RunConfig
from fsbench.config_io import override_all
from fsbench.running.runner import run_once
from fsbench.scaling.sim_inputs import CLUSTERS
from fsbench.scaling.simulate import simulate_run
from fsbench.scaling.step_overhead import store_step_overheads
from fsbench.scaling.timeshare import store_timeshare
from fsbench.training.trainer import trainer_options
from fsbench.workloads.presets import get_workload

HERE = Path(__file__).resolve().parent.parent
CAUSES = ("straggler_bubble_ratio", "exposed_comm_ratio", "input_stall_ratio", "other_idle_ratio")
POINTS = ((1, "model"), (2, "model"), (4, "emulated"), (8, "emulated"), (16, "emulated"))
# The development points: the presets as they are, at every point (the model was revised
# against them and against scripts/sim_hist_check.py's bimodal lengths).
DEVELOPMENT = tuple((preset, (), POINTS) for preset in ("small", "comm-heavy"))
# Held back: never looked at while the model was written or revised. Each is a preset
# changed where calibration does not look (lengths, batch size) or a model calibration
# has to measure anew (sasrec); calibration runs on the preset (with the variant's model
# changes only), as a user calibrates once and then projects variants. A held-back set is
# used once: after the model changes, its points are development points, and a new set
# is drawn; `--held-back N` re-simulates (`--reuse`) or measures an earlier one.
# The fourteenth set, drawn by scripts/draw_held_back.py 2026120714 --number 14 after the
# step engine shares links between communicators and calibration fits the passes'
# medians (fsbench.costmodel.calibrate.median_of_passes), before any of its points ran.
FOURTEENTH_HELD_BACK = (
    ("small", (("lengths", "powerlaw:alpha=2.1,xmin=7"), ("global_batch_size", "96")),
     ((1, "model"), (2, "model"), (8, "emulated"))),
    ("small", (("lengths", "powerlaw:alpha=1.7,xmin=4"),), ((2, "model"), (4, "emulated"))),
    ("comm-heavy", (("lengths", "powerlaw:alpha=2.2,xmin=4"), ("global_batch_size", "256")),
     ((2, "model"), (16, "emulated"))),
    ("small", (("model.family", "sasrec"), ("lengths", "powerlaw:alpha=2.5,xmin=5")),
     ((2, "model"), (8, "emulated"))),
    ("small", (("global_batch_size", "144"),), ((4, "emulated"),)),
)
# The thirteenth set (measured at c5f852e: 13 of 20), drawn by scripts/draw_held_back.py 2026120713 --number 13 after the
# simulator replays each trainer's step program (fsbench.scaling.step_engine), before any
# of its points ran.
THIRTEENTH_HELD_BACK = (
    ("small", (("lengths", "powerlaw:alpha=2.2,xmin=9"), ("global_batch_size", "160")),
     ((1, "model"), (2, "model"), (8, "emulated"))),
    ("small", (("lengths", "uniform:10-141"),), ((2, "model"), (4, "emulated"))),
    ("comm-heavy", (("lengths", "uniform:8-153"), ("global_batch_size", "256")),
     ((2, "model"), (16, "emulated"))),
    ("small", (("model.family", "sasrec"), ("lengths", "lognormal:mu=3.9,sigma=1.3")),
     ((2, "model"), (8, "emulated"))),
    ("small", (("global_batch_size", "288"),), ((4, "emulated"),)),
)
# The twelfth set, drawn by scripts/draw_held_back.py 2026120612 with no model change
# after set 11 (18 of 20): a second sample of the same model, before any of its points ran.
TWELFTH_HELD_BACK = (
    ("small", (("lengths", "uniform:26-161"), ("global_batch_size", "64")),
     ((1, "model"), (2, "model"), (8, "emulated"))),
    ("small", (("lengths", "lognormal:mu=2.8,sigma=0.8"),), ((2, "model"), (4, "emulated"))),
    ("comm-heavy", (("lengths", "lognormal:mu=3.8,sigma=1.0"), ("global_batch_size", "64")),
     ((2, "model"), (16, "emulated"))),
    ("small", (("model.family", "sasrec"), ("lengths", "lognormal:mu=3.9,sigma=1.4")),
     ((2, "model"), (8, "emulated"))),
    ("small", (("global_batch_size", "224"),), ((4, "emulated"),)),
)
# The eleventh set (measured at 59ba6ad: 18 of 20), drawn by scripts/draw_held_back.py 2026120611 after the step overhead
# left out the encoder's drift from the fit (encoder_drift), before any of its points ran.
ELEVENTH_HELD_BACK = (
    ("small", (("lengths", "lognormal:mu=2.1,sigma=1.1"), ("global_batch_size", "48")),
     ((1, "model"), (2, "model"), (8, "emulated"))),
    ("small", (("lengths", "movielens-20m"),), ((2, "model"), (4, "emulated"))),
    ("comm-heavy", (("lengths", "powerlaw:alpha=2.2,xmin=7"), ("global_batch_size", "64")),
     ((2, "model"), (16, "emulated"))),
    ("small", (("model.family", "sasrec"), ("lengths", "lognormal:mu=2.7,sigma=1.4")),
     ((2, "model"), (8, "emulated"))),
    ("small", (("global_batch_size", "64"),), ((4, "emulated"),)),
)
# The tenth set (measured at 5ad0a67: 13 of 20), drawn by scripts/draw_held_back.py 2026120610 after the encoder's cost
# model changed (cost(L) squares the padded length; the batch's footprint term), before
# any of its points was run.
TENTH_HELD_BACK = (
    ("small", (("lengths", "powerlaw:alpha=2.3,xmin=6"), ("global_batch_size", "96")),
     ((1, "model"), (2, "model"), (8, "emulated"))),
    ("small", (("lengths", "powerlaw:alpha=2.1,xmin=4"),), ((2, "model"), (4, "emulated"))),
    ("comm-heavy", (("lengths", "powerlaw:alpha=2.4,xmin=10"), ("global_batch_size", "48")),
     ((2, "model"), (16, "emulated"))),
    ("small", (("model.family", "sasrec"), ("lengths", "lognormal:mu=4.3,sigma=1.2")),
     ((2, "model"), (8, "emulated"))),
    ("small", (("global_batch_size", "192"),), ((4, "emulated"),)),
)
# The ninth set (measured at 4ca2014: 14 of 20), drawn by scripts/draw_held_back.py 202612069 after the simulator booked
# the collectives' CPU (comm_cpu_ms), before any of its points was run.
NINTH_HELD_BACK = (
    ("small", (("lengths", "powerlaw:alpha=1.8,xmin=3"), ("global_batch_size", "64")),
     ((1, "model"), (2, "model"), (8, "emulated"))),
    ("small", (("lengths", "lognormal:mu=2.4,sigma=0.9"),), ((2, "model"), (4, "emulated"))),
    ("comm-heavy", (("lengths", "powerlaw:alpha=2.3,xmin=3"), ("global_batch_size", "256")),
     ((2, "model"), (16, "emulated"))),
    ("small", (("model.family", "sasrec"), ("lengths", "lognormal:mu=3.3,sigma=0.9")),
     ((2, "model"), (8, "emulated"))),
    ("small", (("global_batch_size", "96"),), ((4, "emulated"),)),
)
# The eighth set (measured at 993b6ef: 13 of 20), drawn as the seventh was (default_rng(202612068): each group's lengths
# kind, then its parameters, then its batch size, in the groups' order) after the
# simulator timed FreeScale's routing, before any of its points was run; its fourth group
# came out as set 6's (sasrec on amazon-beauty lengths) and was drawn again (the next
# draw of the same generator).
EIGHTH_HELD_BACK = (
    ("small", (("lengths", "uniform:25-97"), ("global_batch_size", "96")),
     ((1, "model"), (2, "model"), (8, "emulated"))),
    ("small", (("lengths", "uniform:20-195"),), ((2, "model"), (4, "emulated"))),
    ("comm-heavy", (("lengths", "movielens-20m"), ("global_batch_size", "160")),
     ((2, "model"), (16, "emulated"))),
    ("small", (("model.family", "sasrec"), ("lengths", "lognormal:mu=4.0,sigma=1.1")),
     ((2, "model"), (8, "emulated"))),
    ("small", (("global_batch_size", "256"),), ((4, "emulated"),)),
)
# The seventh set (measured at 1c2ff96: 16 of 20; read since, so the next change to the
# model draws an eighth), drawn as the sixth was (default_rng(202612067)) before any of
# its points was run, after the time-sharing efficiency measured at 8 x the cores too; its
# last group came out as set 3's (comm-heavy at 192 a batch) and was drawn again.
SEVENTH_HELD_BACK = (
    ("small", (("lengths", "uniform:2-146"), ("global_batch_size", "192")),
     ((1, "model"), (2, "model"), (8, "emulated"))),
    ("small", (("lengths", "powerlaw:alpha=2.4,xmin=3"),), ((2, "model"), (4, "emulated"))),
    ("comm-heavy", (("lengths", "movielens-1m"), ("global_batch_size", "192")),
     ((2, "model"), (16, "emulated"))),
    ("small", (("model.family", "sasrec"), ("lengths", "uniform:7-185")),
     ((2, "model"), (8, "emulated"))),
    ("small", (("global_batch_size", "48"),), ((4, "emulated"),)),
)
# The sixth set (measured at 8475eaa: 16 of 20; the efficiency at 8 x the cores came
# after it), drawn at random (not picked) before any of its points was run,
# after `fsbench calibrate --passes` (numpy default_rng(20261206); the five groups' shape of the
# sets before; lengths: a lognormal (mu 2-4.5, sigma 0.5-1.5), power-law (alpha 1.5-2.5,
# xmin 2-10), uniform (2-30 to 60-200) or preset, in equal chance; batch sizes from 48,
# 64, 96, 160, 192, 256). kuairand-1k and amazon-beauty lengths were in set 2 (at other
# batch sizes and models).
SIXTH_HELD_BACK = (
    ("small", (("lengths", "kuairand-1k"), ("global_batch_size", "96")),
     ((1, "model"), (2, "model"), (8, "emulated"))),
    ("small", (("lengths", "powerlaw:alpha=2.3,xmin=2"),), ((2, "model"), (4, "emulated"))),
    ("comm-heavy", (("lengths", "lognormal:mu=2.7,sigma=1.2"), ("global_batch_size", "96")),
     ((2, "model"), (16, "emulated"))),
    ("small", (("model.family", "sasrec"), ("lengths", "amazon-beauty")),
     ((2, "model"), (8, "emulated"))),
    ("small", (("global_batch_size", "160"),), ((4, "emulated"),)),
)
# The fifth (measured at c65c5ec: 13 of 20; calibrating in passes came after it):
FIFTH_HELD_BACK = (
    ("small", (("lengths", "lognormal:mu=2.0,sigma=1.0"), ("global_batch_size", "96")),
     ((1, "model"), (2, "model"), (8, "emulated"))),
    ("small", (("lengths", "uniform:20-200"),), ((2, "model"), (4, "emulated"))),
    ("comm-heavy", (("lengths", "lognormal:mu=3.0,sigma=1.2"), ("global_batch_size", "48")),
     ((2, "model"), (16, "emulated"))),
    ("small", (("model.family", "sasrec"), ("lengths", "powerlaw:alpha=2.0,xmin=3")),
     ((2, "model"), (8, "emulated"))),
    ("small", (("global_batch_size", "200"),), ((4, "emulated"),)),
)
# The fourth (measured at c63e3c3: 12 of 20; overheads that follow the global batch's
# tokens came after it):
FOURTH_HELD_BACK = (
    ("small", (("lengths", "lognormal:mu=2.5,sigma=1.3"), ("global_batch_size", "64")),
     ((1, "model"), (2, "model"), (8, "emulated"))),
    ("small", (("lengths", "powerlaw:alpha=2.2,xmin=8"),), ((2, "model"), (4, "emulated"))),
    ("comm-heavy", (("lengths", "lognormal:mu=4.0,sigma=0.6"),), ((2, "model"), (16, "emulated"))),
    ("small", (("model.family", "sasrec"), ("lengths", "uniform:5-180"), ("global_batch_size", "160")),
     ((2, "model"), (8, "emulated"))),
    ("comm-heavy", (("lengths", "powerlaw:alpha=1.5,xmin=2"),), ((4, "emulated"),)),
)
# The third (measured at a3bcb8a: 16 of 20; the per-sample batch term and overheads
# that follow a rank's samples came after it):
THIRD_HELD_BACK = (
    ("small", (("lengths", "lognormal:mu=3.5,sigma=1.0"),),
     ((1, "model"), (2, "model"), (8, "emulated"))),
    ("small", (("lengths", "powerlaw:alpha=1.8,xmin=4"), ("global_batch_size", "96")),
     ((2, "model"), (4, "emulated"))),
    ("comm-heavy", (("lengths", "uniform:10-120"),), ((2, "model"), (16, "emulated"))),
    ("small", (("model.family", "sasrec"), ("lengths", "movielens-1m")),
     ((2, "model"), (8, "emulated"))),
    ("comm-heavy", (("global_batch_size", "192"),), ((4, "emulated"),)),
)
# The second (measured at de9671d: 13 of 20; the wide-bucket term came after it):
SECOND_HELD_BACK = (
    ("small", (("lengths", "kuairand-1k"),), ((1, "model"), (2, "model"), (8, "emulated"))),
    ("small", (("lengths", "amazon-beauty"), ("global_batch_size", "256")),
     ((2, "model"), (4, "emulated"))),
    ("comm-heavy", (("lengths", "movielens-20m"),), ((2, "model"), (16, "emulated"))),
    ("small", (("model.family", "sasrec"), ("lengths", "otto-sessions")),
     ((2, "model"), (8, "emulated"))),
    ("comm-heavy", (("global_batch_size", "64"),), ((4, "emulated"),)),
)
# The first (measured at 2609c72: 10 of 20; time-sharing was measured after it):
FIRST_HELD_BACK = (
    ("small", (("lengths", "yelp"),), ((1, "model"), (2, "model"), (8, "emulated"))),
    ("small", (("lengths", "movielens-1m"), ("global_batch_size", "64")),
     ((2, "model"), (4, "emulated"))),
    ("comm-heavy", (("lengths", "otto-sessions"),), ((2, "model"), (16, "emulated"))),
    ("small", (("model.family", "sasrec"),), ((2, "model"), (8, "emulated"))),
    ("small", (("lengths", "movielens-20m"), ("global_batch_size", "256")), ((4, "emulated"),)),
)


HELD_BACK_SETS = {1: FIRST_HELD_BACK, 2: SECOND_HELD_BACK, 3: THIRD_HELD_BACK,
                  4: FOURTH_HELD_BACK, 5: FIFTH_HELD_BACK, 6: SIXTH_HELD_BACK,
                  7: SEVENTH_HELD_BACK, 8: EIGHTH_HELD_BACK, 9: NINTH_HELD_BACK,
                  10: TENTH_HELD_BACK, 11: ELEVENTH_HELD_BACK,
                  12: TWELFTH_HELD_BACK, 13: THIRTEENTH_HELD_BACK,
                  14: FOURTEENTH_HELD_BACK}
HELD_BACK = HELD_BACK_SETS[max(HELD_BACK_SETS)]  # the current set


def stored_summary(store: Path, workload: str, trainer: str, n: int, steps: int,
                   nth: int = 0) -> dict | None:
    """The nth complete run of this point already in the store, in the order they ran
    (re-simulating after a change to the simulator need not measure again)."""
    import json

    from fsbench.running.store import load_runs

    if not store.exists():
        return None
    runs = load_runs(store)
    if not len(runs):
        return None
    runs = runs.sort_values("run_dir")
    runs = runs[(runs["workload"] == workload) & (runs["trainer"] == trainer) & (runs["world_size"] == n)
                & (runs["steps_measured"] == steps - 4)]
    if len(runs) <= nth:
        return None
    return json.loads((Path(runs.iloc[nth]["run_dir"]) / "summary.json").read_text())


def calibration_base(preset: str, sets) -> tuple[str, object]:
    """(label, workload) a point is calibrated on: its preset with the variant's model
    changes only (lengths and batch sizes stay the preset's)."""
    model = [kv for kv in sets if kv[0].startswith("model.")]
    return preset + "".join(f"+{k}={v}" for k, v in model), override_all(get_workload(preset), model)


def fit_line(preset: str, fit) -> str:
    over = "; ".join(f"{key} {o['wall_ms']:.1f} ms ({o['cpu_ms']:.1f} CPU, {o['busy_ms']:.1f} busy, "
                     f"{o['input_ms']:.1f} input, {o.get('worker_ms', 0.0):.1f} loader worker)"
                     for key, o in sorted((fit.step_overhead or {}).items()))
    return (f"{preset}: {fit.table_ns_per_element:.2f} ns sharded, {fit.replicated_ns_per_element:.2f} ns "
            f"replicated, batch {fit.batch_terms_text()}, "
            f"co-run {fit.corun_slowdown:.2f}x (tables {fit.table_corun_slowdown or 0:.2f}x), "
            f"time-sharing efficiency {(fit.timeshare or {}).get('efficiency', 1.0):.2f}"
            + (f" at {fit.timeshare['ranks']} ranks, {fit.timeshare['wider']['efficiency']:.2f} at "
               f"{fit.timeshare['wider']['ranks']}" if (fit.timeshare or {}).get("wider") else "") + ", "
            f"step overhead {over}")


def cause_summary(df: pd.DataFrame) -> list[str]:
    """Per cause, over points where it is >= 2% of capacity: how many the simulator puts
    within 15%, and the median and worst absolute difference in percentage points."""
    lines = []
    for cause in CAUSES:
        short = cause.replace("_bubble_ratio", "").replace("_ratio", "")
        meas, sim = df[f"{short} meas %"].astype(float), df[f"{short} sim %"].astype(float)
        big = meas >= 2
        within = int(((sim / meas - 1).abs()[big] <= 0.15).sum())
        diff = (sim - meas).abs()
        lines.append(f"- {short}: within 15% at {within} of {int(big.sum())} points; absolute "
                     f"difference median {diff.median():.1f} pp, worst {diff.max():.1f} pp.")
    return lines


def read_table(path: str) -> pd.DataFrame:
    """The per-point table of a validation file this script wrote."""
    import io

    rows = [line for line in Path(path).read_text().splitlines() if line.startswith("|")]
    df = pd.read_csv(io.StringIO("\n".join(rows)), sep="|", skipinitialspace=True).iloc[1:, 1:-1]
    df.columns = [c.strip() for c in df.columns]
    return df


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs per point, in rounds over all points (judged by the median)")
    ap.add_argument("--store", default="runs/sim_validation")
    ap.add_argument("--presets", default="small,comm-heavy")
    ap.add_argument("--trainers", default="ddp,freescale")
    ap.add_argument("--table", help="default: results/sim_validation_cpu.md, or with --held-back "
                                     "results/sim_validation_heldback_cpu.md")
    ap.add_argument("--held-back", nargs="?", type=int, const=max(HELD_BACK_SETS), default=None,
                    choices=sorted(HELD_BACK_SETS), metavar="N",
                    help="the held-back points (the current set, or set N: "
                         "HELD_BACK_SETS), into results/sim_validation_heldback_cpu.md")
    ap.add_argument("--reuse", action="store_true",
                    help="take measured points already in the store (re-simulate only)")
    ap.add_argument("--summarize", metavar="TABLE",
                    help="only print the cause summary of a validation file written before "
                         "(e.g. an older commit's: git show SHA:results/sim_validation_cpu.md)")
    args = ap.parse_args()
    held_back = args.held_back is not None
    args.table = args.table or ("results/sim_validation_heldback_cpu.md" if held_back
                                else "results/sim_validation_cpu.md")
    if args.summarize:
        print("\n".join(cause_summary(read_table(args.summarize))))
        return
    # One store for runs and fits: an emulated rank reads its cost fit beside its run directory.
    store = Path(args.store).resolve() / "runs"
    torch.set_num_threads(1)  # the ranks' setting: part of the cost fit's key
    if load_comm_fits(store) is None:
        calibrate_comm(store, [2, 4, 8, 16])
    points = HELD_BACK_SETS[args.held_back] if held_back else tuple(
        p for p in DEVELOPMENT if p[0] in args.presets.split(","))
    runs = []  # (label, workload, trainer, ranks, compute)
    for preset, sets, where in points:
        base = dataclasses.replace(calibration_base(preset, sets)[1], steps=args.steps, warmup=4)
        fit = load_fit(store, base, "cpu")
        if fit is None:
            calibrate(base, store, passes=3)  # as `fsbench calibrate` does by default
        elif fit.corun_slowdown is None or fit.batch_ms is None or fit.footprint_per_ktoken is None:
            raise SystemExit(f"{fit_path(store, base, 'cpu')}: a fit from before its batch terms "
                             f"(the batch's footprint); its emulated runs waited for another cost and its "
                             f"overheads are against another model. Use a new --store.")
        fit = load_fit(store, base, "cpu")
        if fit.table_corun_slowdown is None:  # a fit from before the tables' co-run slowdown
            tables, _ = measure_corun_slowdown(base, fit.corun_processes, repeats=3, work="tables")
            fit = dataclasses.replace(fit, table_corun_slowdown=tables)
            write_json_atomic(fit_path(store, base, "cpu"), dataclasses.asdict(fit))
        # Each trainer's per-step overhead in each compute mode, from 1-rank runs at the
        # calibration seed, then the time-sharing beyond the cores (4 and 8 x cores emulated ranks).
        store_step_overheads(base, args.trainers.split(","), store)
        store_timeshare(base, args.trainers.split(","), store)
        label = preset + "".join(f"+{k}={v}" for k, v in sets)
        variant = dataclasses.replace(override_all(base, list(sets)), name=label)
        for n, compute in where:
            w = dataclasses.replace(variant, compute=compute)
            if compute != "model":  # an emulated workload is a different workload
                w = dataclasses.replace(w, name=f"{label}+compute=emulated")
            runs += [(label, w, trainer, n, compute) for trainer in args.trainers.split(",")]
    # Every point once per round, rounds one after another: this machine's speed drifts
    # over minutes (a point's runs spread over up to 41% of their median in held-back set
    # 5: its `measured spread`), so a
    # point's repeats are spread over the whole validation, and it is judged by its median.
    measured = {i: [] for i in range(len(runs))}
    for round_ in range(args.repeats):
        for i, (label, w, trainer, n, compute) in enumerate(runs):
            run = RunConfig(workload=w, trainer=trainer, world_size=n,
                            trainer_options=trainer_options(trainer, {}))
            found = stored_summary(store, w.name, trainer, n, args.steps, round_) if args.reuse else None
            measured[i].append(found or run_once(run, store)[1])
            print(f"round {round_ + 1}/{args.repeats}: {label} {trainer} {n} ({compute}): "
                  f"{measured[i][-1]['step_time_ms_median']:.1f} ms", flush=True)
    rows = []
    for i, (label, w, trainer, n, compute) in enumerate(runs):
        run = RunConfig(workload=w, trainer=trainer, world_size=n,
                        trainer_options=trainer_options(trainer, {}))
        # The simulator models the run as it ran: an emulated encoder waits (no core).
        sim, _ = simulate_run(run, CLUSTERS["local"], store)
        steps = sorted(measured[i], key=lambda m: m["step_time_ms_median"])
        median = steps[len(steps) // 2]  # the run whose step is the median: its causes too
        step_ms = [m["step_time_ms_median"] for m in steps]
        row = {"preset": label, "trainer": trainer, "ranks": n, "against": compute,
               "contended": sum(bool(m["contended"]) for m in steps),
               "step_ms measured": median["step_time_ms_median"],
               "measured spread %": 100 * (step_ms[-1] - step_ms[0]) / median["step_time_ms_median"],
               "step_ms simulated": sim["step_time_ms_median"],
               "step error %": 100 * (sim["step_time_ms_median"] / median["step_time_ms_median"] - 1)}
        for c in CAUSES:
            short = c.replace("_bubble_ratio", "").replace("_ratio", "")
            row[f"{short} meas %"] = 100 * median[c]
            row[f"{short} sim %"] = 100 * sim[c]
            row[f"{short} rel err %"] = (100 * (sim[c] / median[c] - 1)
                                        if median[c] >= 0.02 else float("nan"))
        rows.append(row)
    df = pd.DataFrame(rows)
    bases = dict(calibration_base(preset, sets) for preset, sets, _ in points)
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=HERE).stdout.strip()
    within = df["step error %"].abs() <= 15
    lines = [
        "# Simulator validation (SIMULATED vs measured and emulated), this machine\n",
        f"Machine: {os.cpu_count()} cores ({platform.machine()}), no GPU, torch {torch.__version__}, "
        f"gloo. Commit `{sha}`. {args.steps} steps (4 warm-up), seed 0, {args.repeats} runs per "
        "point in rounds over all points, the point judged by its median run (`measured "
        "spread`: the runs' range over their median). "
        "Simulator: `--cluster local` (encoder cost and the optimizer's cost per table element "
        "from `fsbench calibrate`, collectives from `fsbench calibrate --comm` at 2, 4, 8, 16 "
        "ranks). 1-2 ranks: real model; 4-16 ranks: `compute=emulated`. Command: "
        f"`python scripts/sim_validation.py{f' --held-back {args.held_back}' if held_back else ''}`.\n",
        "Per preset, from the fit: the optimizer step per updated table element (sharded), a "
        "replica's table work per element at the real table sizes, a batch's fixed, "
        "per-bucket and wide-bucket encoder cost, the slowdown when both cores run the encoder (the table work) "
        "at once (applied to 2+ ranks; beyond 2 ranks CPU work also time-shares: ranks / 2 as long "
        "at full efficiency, the efficiency measured at 8 and 16 emulated ranks, 4 and 8 times the cores), and "
        "each trainer's per-step overhead per compute mode (median of three 1-rank runs at the "
        "calibration seed: wall, of it the rank's CPU, busy, input wait, the loader worker's CPU): "
        + ", ".join(fit_line(label, load_fit(store, w, "cpu")) for label, w in bases.items())
        + ".\n",
        ("**Held-back points**: none of them was looked at while the simulator was written or "
         "revised; calibration ran on the presets (with a variant's model change), never on a "
         "variant's lengths or batch size. The development points, which the model was revised "
         "against, are in `results/sim_validation_cpu.md` (with the bimodal lengths of "
         "`results/sim_hist_check_cpu.md`, and the earlier held-back sets, "
         f"`results/sim_validation_heldback_set1_cpu.md` to `_set{max(HELD_BACK_SETS) - 1}_cpu.md`).\n"
         if held_back else
         "**Development points**: the simulator was revised against these (and the bimodal "
         "lengths of `results/sim_hist_check_cpu.md`). Points it was never tuned on: "
         "`results/sim_validation_heldback_cpu.md` (`--held-back`).\n"),
        f"- Step time within 15%: **{int(within.sum())} of {len(df)}** points; median absolute "
        f"error {df['step error %'].abs().median():.1f}%, worst {df['step error %'].abs().max():.1f}%.",
        "- Per trainer, median absolute step error (worst): " + ", ".join(
            f"{t} {g['step error %'].abs().median():.1f}% ({g['step error %'].abs().max():.1f}%)"
            for t, g in df.groupby("trainer")) + ".",
        "- Causes: `meas`/`sim` in % of capacity; relative errors only where the measured cause "
        "is >= 2% (below that a ratio of small numbers says nothing).",
        *cause_summary(df), "",
        df.to_markdown(index=False, floatfmt=".1f"),
    ]
    Path(args.table).write_text("\n".join(lines) + "\n")
    print(Path(args.table).read_text())


if __name__ == "__main__":
    main()
