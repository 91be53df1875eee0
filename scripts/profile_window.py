"""Where FreeScale's look-ahead window spends its time: cProfile over repeated windows of
`medium` (its analytical cost model) on one length preset, and how many samples keeping
the step sizes moves (each step's surplus after re-packing; none when the window keeps
its per-batch plans). Backs the breakdown in results/planner_scale_cpu.md.

    python scripts/profile_window.py [--lengths yelp] [--samples 32768] [--ranks 256] [--window 4]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats

import numpy as np

import freescale_impl.window as window_mod
from freescale_impl.trainer import FreeScaleTrainer
from fsbench.config import override_all
from fsbench.scaling import planner_micro as pm
from fsbench.workloads.presets import get_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="yelp")
    ap.add_argument("--samples", type=int, default=32768)
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    w = override_all(get_workload("medium"), [("lengths", args.lengths)])
    lengths = pm.draw_lengths(w, args.samples, args.window, 0)
    _, plan = FreeScaleTrainer.planners(w, args.window)[f"kk window={args.window}"]
    for _ in range(3):  # warm: the compiled planner loads once per process
        plan(lengths, args.ranks)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.repeats):
        plan(lengths, args.ranks)
    profile.disable()
    print(f"kk window={args.window}, {args.lengths}, {args.samples} samples onto {args.ranks} ranks, "
          f"{args.repeats} windows under the profiler:")
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)
    surpluses = []
    keep = window_mod._keep_step_sizes

    def spy(costs, step, rank, sizes, n):
        surpluses.append((np.bincount(step, minlength=len(sizes)) - sizes).tolist())
        return keep(costs, step, rank, sizes, n)

    window_mod._keep_step_sizes = spy
    plan(lengths, args.ranks)
    window_mod._keep_step_sizes = keep
    print("steps' surplus before keeping step sizes:", surpluses or "none (per-batch plans kept)")


if __name__ == "__main__":
    main()
