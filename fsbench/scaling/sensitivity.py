"""How far a simulated headline rests on the cluster's assumed figures: each ASSUMED
figure (fsbench.scaling.sim_inputs) taken at half and at twice its value, everything
else held, and the headline recomputed: NEW's bubble reduction against BASE,
1 - bubble(NEW) / bubble(BASE), at each world size. A headline that moves a lot with one
figure is only as good as that figure's guess. SIMULATED, like every input to it.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Iterable

from fsbench.config import RunConfig, WorkloadConfig
from fsbench.scaling.sim_inputs import FIGURES, WHOLE_FIGURES, Cluster
from fsbench.scaling.simulate import scaled_workload, simulate_run

FACTORS = (0.5, 1.0, 2.0)


def varied(cluster: Cluster, figure: str, factor: float) -> Cluster:
    """`cluster` with one figure scaled (counts stay whole; MFU stays at most 1)."""
    value = getattr(cluster, figure) * factor
    if figure in WHOLE_FIGURES:
        value = max(1, round(value))
    if figure == "mfu":
        value = min(value, 1.0)
    return dataclasses.replace(cluster, **{figure: value})


def reduction(base: dict, new: dict) -> float:
    """1 - NEW's bubble over BASE's (NaN when BASE has no bubble)."""
    return 1 - new["bubble_ratio"] / base["bubble_ratio"] if base["bubble_ratio"] > 0 else float("nan")


def sensitivity(cluster: Cluster, workload: WorkloadConfig,
                runs: list[tuple[str, dict[str, str]]], world_sizes: list[int],
                batch_per_rank: int, store: str | Path, seed: int = 0,
                progress: Callable[[Iterable], Iterable] = lambda it: it,
                planner_time: bool = True) -> list[dict]:
    """One row per (assumed figure, world size): the figure's value and the reduction of
    the second of `runs` (trainer, its options) against the first at x0.5, x1, x2 (the
    same trainer may come twice: e.g. FreeScale against its sharded baseline). A planner's
    time is timed once per run, at x1, and charged alike at every variant: no figure
    changes it, so the swing is the figures', not this CPU's noise. Its routing likewise."""
    (base, base_opts), (new, new_opts) = runs[:2]
    figures = [f for f in FIGURES if f in cluster.assumed]
    points = [(f, n, k) for f in figures for n in world_sizes for k in FACTORS]
    memo: dict[tuple, float] = {}
    timed: dict[tuple, dict] = {}  # (trainer index, n) -> planning, routing, prep ms per step at x1

    def reduction_at(c: Cluster, n: int) -> float:
        w = scaled_workload(workload, n, "weak", batch_per_rank)
        summaries = []
        for i, (t, o) in enumerate(((base, base_opts), (new, new_opts))):
            summary = simulate_run(RunConfig(workload=w, trainer=t, world_size=n, seed=seed,
                                             trainer_options=o), c, store, planner_time=planner_time,
                                   **timed.get((i, n), {}))[0]
            timed.setdefault((i, n), {"planner_ms": summary["plan_ms_per_step"],
                                      "route_ms": summary["route_ms_per_step"],
                                      "prep_ms": summary["exchange_prep_ms_per_step"]})
            summaries.append(summary)
        return reduction(*summaries)

    for n in world_sizes:  # x1 first: it times the planners
        memo[(dataclasses.astuple(cluster), n)] = reduction_at(cluster, n)
    for figure, n, factor in progress(points):
        c = varied(cluster, figure, factor)
        key = (dataclasses.astuple(c), n)
        if key not in memo:  # x1 is the same cluster for every figure
            memo[key] = reduction_at(c, n)
        memo[(figure, n, factor)] = memo[key]
    return [{"figure": f, "value": getattr(cluster, f), "unit": FIGURES[f][0], "world_size": n,
             **{f"reduction_x{k:g}": memo[(f, n, k)] for k in FACTORS},
             "swing": max(memo[(f, n, k)] for k in FACTORS) - min(memo[(f, n, k)] for k in FACTORS)}
            for f in figures for n in world_sizes]
