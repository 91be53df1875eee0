"""Compile the numba planner's kernels now (freescale_impl/plan_kernels.py, window_kernels.py)
into numba's cache beside their sources, as their first large plan would.

A fresh checkout compiles them on first use: about 30 s on 2 cores, which CI's fast tier
paid inside tests/test_plan_kernels.py. .ci/run runs this in the background as the fast
tier starts (whose first half plans nothing compiled), so those tests load the kernels
instead. A kernel this leaves out is compiled where it is first called, as before.
Nothing to do without numba (exit 0, said so).

    python scripts/compile_planner.py
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from freescale_impl import plan_kernels
from freescale_impl.partition import best_of, karmarkar_karp, lpt
from freescale_impl.window import lookahead_window


def main() -> int:
    if not plan_kernels._load():
        print("compile_planner: numba is not installed; the python planner plans")
        return 0
    os.environ[plan_kernels.ENV] = "compiled"
    start = time.monotonic()
    rng = np.random.default_rng(0)
    lengths = np.minimum(np.rint(4 + np.exp(0.94 + 1.29 * rng.standard_normal(4096))), 1024)
    costs = 3.0 * lengths ** 2 + 5.0 * lengths
    costs[:2] = 2 * costs.sum() / 64  # whales: the window moves samples between its steps
    plan_kernels.descending(costs)
    for partitioner in (lpt, karmarkar_karp, best_of):  # best_of runs the other two
        partitioner(costs, 64)
        lookahead_window([costs, costs[::-1].copy(), np.floor(costs)], 64, 3, partitioner=partitioner)
    print(f"compile_planner: the planner's kernels compiled in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
