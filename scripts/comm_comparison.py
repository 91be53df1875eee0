"""FreeScale's communication techniques side by side with the baselines, in one sweep.

For each workload, every variant runs once per repeat, variants and workloads alternating
(drift on a shared machine hits all alike). Reports medians over repeats with the spread
(min..max) of throughput, the exposed communication, the share of communication hidden
under compute, the bubble and peak memory, and FreeScale's throughput against the best
baseline's.

    python scripts/comm_comparison.py [--repeats 3] [--workloads comm-heavy,small,PRESET+key=value,...]
        [--store runs/comm_comparison] [--table results/freescale_comm_cpu.md]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shlex
import subprocess
import sys

import pandas as pd
import torch

from fsbench.cli.args import rename
from fsbench.config import RunConfig
from fsbench.config_io import override_all
from fsbench.running.runner import run_once
from fsbench.table import progress
from fsbench.workloads.presets import WORKLOADS as PRESETS, get_workload

BASELINES = ("ddp", "torchrec", "deepspeed")
VARIANTS = {  # name -> (trainer, switches)
    "ddp": ("ddp", {}),
    "torchrec": ("torchrec", {}),
    "deepspeed": ("deepspeed", {}),
    "freescale balance only": ("freescale", {"tables": "replicated"}),
    "freescale blocking": ("freescale", {"overlap": "off", "priority": "off"}),
    "freescale overlap": ("freescale", {"priority": "off"}),
    "freescale (all on)": ("freescale", {}),
    "freescale (all on, chunks=4)": ("freescale", {"chunks": "4"}),
}
WORKLOADS = {  # name -> (preset, overrides)
    "comm-heavy": ("comm-heavy", {}),
    "small": ("small", {}),
    "small+amazon-beauty": ("small", {"lengths": "amazon-beauty"}),
}
METRICS = ("samples_per_s", "exposed_comm_ratio", "comm_overlap_ratio", "bubble_ratio",
           "straggler_bubble_ratio", "cpu_wait_ratio", "peak_memory_mb")


def workload_of(name: str):
    """A named workload of WORKLOADS, or `PRESET+key=value+...` (a preset with its fields
    set as `--set` sets them: `small+lengths=lognormal:mu=2.0,sigma=0.7`)."""
    if name in WORKLOADS:
        preset, sets = WORKLOADS[name]
        return dataclasses.replace(get_workload(preset), name=name, **sets)
    preset, *pairs = name.split("+")
    sets = [tuple(pair.split("=", 1)) for pair in pairs]
    if any(len(pair) != 2 for pair in sets):
        raise SystemExit(f"--workloads: {name!r} is neither one of {', '.join(WORKLOADS)} "
                         "nor PRESET+key=value+...")
    return dataclasses.replace(override_all(get_workload(preset), sets), name=name)


def split_items(text: str, starts_item) -> list[str]:
    """`text` split at the commas that start an item (`starts_item(piece)`): variant names
    and workloads' values hold commas of their own ("freescale (all on, chunks=4)",
    "small+lengths=lognormal:mu=2.4,sigma=0.8")."""
    items: list[str] = []
    for piece in text.split(","):
        if items and not starts_item(piece.strip()):
            items[-1] += "," + piece
        else:
            items.append(piece.strip())
    return items


def variant_list(text: str) -> list[str]:
    return split_items(text, lambda p: any(v.startswith(p) for v in VARIANTS))


def workload_list(text: str) -> list[str]:
    return split_items(text, lambda p: p in WORKLOADS or p.split("+")[0] in PRESETS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="a subset of: " + ", ".join(VARIANTS))
    ap.add_argument("--store", default="runs/comm_comparison", help="where the runs go")
    rename(ap, "--out", "--store", "store")  # its name before fsbench's one vocabulary
    ap.add_argument("--table", default="results/freescale_comm_cpu.md")
    args = ap.parse_args()
    variants = variant_list(args.variants)
    if unknown := [v for v in variants if v not in VARIANTS]:
        raise SystemExit(f"--variants: {unknown[0]!r} is not allowed; choose from {', '.join(VARIANTS)}")
    workloads = workload_list(args.workloads)
    plan = [(r, w, v) for r in range(args.repeats) for w in workloads for v in variants]
    rows = []
    for repeat, wname, vname in progress(plan, "runs", "run"):
        workload = workload_of(wname)
        trainer, switches = VARIANTS[vname]
        run = RunConfig(workload=workload, trainer=trainer, world_size=args.world_size,
                        seed=repeat, trainer_options=switches)
        try:
            _, summary = run_once(run, args.store, timeout_s=900)
        except Exception as e:  # noqa: BLE001 - a failed variant is reported, not fatal
            print(f"{wname} {vname} repeat {repeat}: {e}", file=sys.stderr)
            continue
        rows.append({"workload": wname, "variant": vname, "repeat": repeat,
                     "contended": summary["contended"],
                     **{m: summary.get(m) for m in METRICS}})
    df = pd.DataFrame(rows)
    df.to_csv(os.path.join(args.store, "comm_comparison.csv"), index=False)
    with open(args.table, "w") as f:
        f.write(render(df, args))
    print(f"wrote {args.table}")


def render(df: pd.DataFrame, args) -> str:
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    lines = ["# FreeScale's communication (2, 3) beside the baselines\n",
             f"Machine: {os.cpu_count()} cores ({platform.machine()}), no GPU, torch "
             f"{torch.__version__}, gloo, {args.world_size} ranks, one thread each. Commit "
             f"`{sha}`. {args.repeats} repeats, variants alternating; medians, throughput "
             "spread = min..max over repeats. Command: "
             f"`{shlex.join(['python', 'scripts/comm_comparison.py', *sys.argv[1:]])}`.\n"]
    pct = lambda v: "n/a" if pd.isna(v) else f"{100 * v:.1f}"  # noqa: E731
    for wname, g in df.groupby("workload", sort=False):
        med = g.groupby("variant", sort=False)[list(METRICS)].median()
        lo = g.groupby("variant", sort=False)["samples_per_s"].min()
        hi = g.groupby("variant", sort=False)["samples_per_s"].max()
        contended = g.groupby("variant", sort=False)["contended"].sum()
        best = med.loc[[b for b in BASELINES if b in med.index], "samples_per_s"]
        lines += [f"\n## {wname}\n",
                  "| variant | samples/s (min..max) | vs best baseline | exposed comm % | "
                  "comm hidden % | bubble % | straggler % | cpu wait % | peak MiB/rank | contended runs |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for v, r in med.iterrows():
            ratio = r.samples_per_s / best.max() if len(best) else float("nan")
            mem = "n/a" if pd.isna(r.peak_memory_mb) else f"{r.peak_memory_mb:.0f}"
            lines.append(f"| {v} | {r.samples_per_s:.0f} ({lo[v]:.0f}..{hi[v]:.0f}) | "
                         f"{ratio:.2f}x | {pct(r.exposed_comm_ratio)} | {pct(r.comm_overlap_ratio)} | "
                         f"{pct(r.bubble_ratio)} | {pct(r.straggler_bubble_ratio)} | "
                         f"{pct(r.cpu_wait_ratio)} | {mem} | {int(contended[v])} |")
        if len(best):
            lines.append(f"\nBest baseline: {best.idxmax()}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
