"""Planner loads on fixed seeds: a deterministic quantity `fsbench reference` keeps exact
(results/reference/planner_loads.json). Lengths from three real-shaped presets, FLOP costs
of `small`, every partitioner at 2, 8 and 64 ranks: any change to a planner, a length
preset or the cost model moves these numbers, and must be intended."""
from __future__ import annotations

import numpy as np

from fsbench.workloads.distributions import parse_length_spec
from fsbench.workloads.presets import small
from freescale_impl import partition
from freescale_impl.balance import analytical_cost

PRESETS = ("amazon-beauty", "movielens-100k", "yelp")
PARTITIONERS = {"contiguous": partition.contiguous, "lpt": partition.lpt,
                "kk": partition.karmarkar_karp, "best": partition.best_of}


def planner_loads() -> dict:
    workload = small()
    cost = analytical_cost(workload)
    out = {}
    for preset in PRESETS:
        for seed in (0, 1):
            lengths = parse_length_spec(preset).sample(np.random.default_rng(seed), 512,
                                                       workload.max_seq_len)
            costs = cost(lengths)
            for n in (2, 8, 64):
                for name, fn in PARTITIONERS.items():
                    plan = fn(costs, n)
                    out[f"{preset}/seed{seed}/n{n}/{name}"] = {
                        "max_load": float(plan.max_load), "loads": [float(x) for x in plan.loads]}
    return out
