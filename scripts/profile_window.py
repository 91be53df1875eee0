"""Where FreeScale's look-ahead window spends its time: cProfile over repeated windows of
`medium` (its analytical cost model) on one length preset, and how many samples keeping
the step sizes moves (each step's surplus after re-packing; none when the window keeps
its per-batch plans). Backs the breakdown in results/planner_scale_cpu.md.

    python scripts/profile_window.py [--lengths yelp] [--samples 32768] [--ranks 256] [--window 4]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats

import numpy as np

import freescale_impl.window as window_mod
from freescale_impl import plan_kernels
from freescale_impl.partition import karmarkar_karp
from freescale_impl.trainer import analytical_cost
from freescale_impl.trainer import FreeScaleTrainer
from fsbench.config_io import override_all
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

    # The compiled window keeps step sizes inside window_kernels: the Python path (the
    # same plans) shows the surpluses.
    window_mod._keep_step_sizes = spy
    os.environ[plan_kernels.ENV] = "python"
    plan(lengths, args.ranks)
    del os.environ[plan_kernels.ENV]
    window_mod._keep_step_sizes = keep
    print("steps' surplus before keeping step sizes:", surpluses or "none (the pool was not planned)")
    # What the window chooses between (summed per-step max loads, the cost model's units).
    costs = [analytical_cost(w)(b) for b in lengths]
    cuts = np.cumsum([0] + [c.size for c in costs])
    floor = sum(float(c.sum()) for c in costs) / args.ranks
    bound = sum(max(float(c.sum()) / args.ranks, float(c.max())) for c in costs)
    plain = sum(karmarkar_karp(c, args.ranks).max_load for c in costs)
    pooled = sum(s.plan.max_load for s in window_mod._pack_window(costs, cuts, args.ranks, karmarkar_karp, 0))
    print(f"total / N {floor:.5g}; per-batch bound {bound:.5g}; per-batch plans {plain:.5g}; "
          f"pooled {pooled:.5g} ({'pooled' if pooled < plain * (1 - 1e-9) else 'per-batch'} wins)")


if __name__ == "__main__":
    main()
