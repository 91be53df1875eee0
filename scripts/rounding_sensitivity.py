"""How fast does training part from a rounding-sized perturbation of itself?

Per setting, the single-process reference of `fsbench quality`'s protocol on a data file is
trained twice over the first `--steps` steps, once with every weight scaled by
(1 + 1e-7 N(0, 1)) (fsbench.quality.rounding_probe), and the relative loss difference of
each step is printed. Backs the HSTU paragraph of results/quality_ml100k_cpu.md.

    python scripts/rounding_sensitivity.py --data recbole:ml-100k.inter [--steps 6]
"""
from __future__ import annotations

import argparse

import numpy as np

from fsbench.config import EvalConfig, RunConfig
from fsbench.quality.convergence import quality_workload
from fsbench.quality.rounding_probe import loss_pair

SETTINGS = [("hstu", []), ("hstu", [("model.user_features", "true")]),
            ("hstu", [("global_batch_size", "32")]), ("sasrec", [])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    for family, sets in SETTINGS:
        w, _ = quality_workload("small", args.data, family, 1, sets)
        run = RunConfig(workload=w, trainer="ddp", world_size=1, seed=0,
                        eval=EvalConfig(on=True, split="valid_test"))
        a, b = loss_pair(run, args.steps)
        rel = np.abs(a - b) / np.abs(a)
        said = " ".join(f"{k}={v}" for k, v in sets) or "(the protocol)"
        print(f"{family} {said}: " + ", ".join(f"{x:.1e}" for x in rel), flush=True)


if __name__ == "__main__":
    main()
