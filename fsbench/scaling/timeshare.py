"""How much of full time-sharing ranks beyond a host's cores meet, measured for the `local`
simulator and stored in the cost fit (`fsbench calibrate --overhead`).

With more ranks than cores, a rank's CPU work would take ranks / cores as long if every
rank's CPU work fell at once; it does not (ranks wait in collectives and on emulated
compute at different times, their loader workers fill those gaps), so steps meet only
part of that wait. That part is not derived: it is measured here, once per fit, at
four times as many emulated ranks as cores, as the efficiency in [0, 1] at which the
simulator's step (fsbench.scaling.simulate: CPU work stretched by 1 + efficiency x
(ranks / cores - 1), the loader workers' preemption beyond the cores by the efficiency)
equals the measured one. Measured on the preset at four and at eight times the cores:
the more ranks share a core, the more often their CPU work meets (the efficiency rises
towards 1). Up to 4x the cores the first holds, between the two the line through them,
beyond 8x the second (validated at 4-16 ranks: scripts/sim_validation.py; measured at 4x
alone, FreeScale on comm-heavy came out 12-28% short at 16 ranks, 8x the cores, in
held-back sets 3-6).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from fsbench.config import WorkloadConfig
from fsbench.errors import ConfigError
from fsbench.scaling.sim_inputs import CLUSTERS
from fsbench.scaling.simulate import simulate_run
from fsbench.scaling.step_overhead import calibration_run


def solve_efficiency(simulated_ms: Callable[[float], float], measured_ms: float,
                     tolerance: float = 1e-3) -> float:
    """The efficiency in [0, 1] at which simulated_ms(efficiency), non-decreasing in it,
    meets measured_ms (bisection); 0 or 1 where the measured step lies outside the range."""
    lo, hi = 0.0, 1.0
    if simulated_ms(lo) >= measured_ms:
        return lo
    if simulated_ms(hi) <= measured_ms:
        return hi
    while hi - lo > tolerance:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if simulated_ms(mid) < measured_ms else (lo, mid)
    return (lo + hi) / 2


SHARING = (4, 8)
"""Ranks per core the efficiency is measured at (fsbench.scaling.sim_costs interpolates)."""


def measure_timeshare(workload: WorkloadConfig, trainers: list[str], store: str | Path,
                      steps: int = 20, repeats: int = 3) -> dict:
    """Each trainer's efficiency from emulated runs at 4 x cores ranks, the median run of
    `repeats` (the fit's overheads must be stored: they are part of the step it
    simulates), and their mean; the same at 8 x cores under "wider". At 4 x cores an
    efficiency moves the step three times as much as at 2 x cores (ranks / cores - 1), so
    a run's noise moves it a third as much (at 2 x cores two calibrations of the same fit
    disagreed by several tenths)."""
    from fsbench.costmodel.fit import load_fit

    fit = load_fit(store, workload, "cpu")
    if fit is None or not fit.corun_processes:
        raise ConfigError(f"no cost fit with a co-run count for {workload.name} in {store}: "
                          f"run fsbench calibrate first")
    first, wider = (_efficiencies(workload, trainers, store, k * fit.corun_processes, steps, repeats)
                    for k in SHARING)
    return {**first, "wider": wider}


def _efficiencies(workload: WorkloadConfig, trainers: list[str], store: str | Path, ranks: int,
                  steps: int, repeats: int) -> dict:
    per_trainer = {}
    for trainer in trainers:
        runs = sorted((calibration_run(workload, trainer, store, "emulated", steps, ranks)[:2]
                       for _ in range(repeats)), key=lambda rm: rm[1]["step_time_ms_median"])
        run, measured = runs[len(runs) // 2]
        per_trainer[trainer] = solve_efficiency(
            lambda e: simulate_run(run, CLUSTERS["local"], store, timeshare_efficiency=e)[0]["step_time_ms_median"],
            measured["step_time_ms_median"])
    return {"efficiency": sum(per_trainer.values()) / len(per_trainer), "ranks": ranks,
            "per_trainer": per_trainer}


def store_timeshare(workload: WorkloadConfig, trainers: list[str], store: str | Path) -> dict | None:
    """The fit's time-sharing efficiency, measured (measure_timeshare) and stored where
    the fit lacks one; None without collective fits (`fsbench calibrate --comm`), which
    simulating the emulated ranks needs."""
    from fsbench.costmodel.fit import fit_path, load_fit
    from fsbench.running.store import write_json_atomic
    from fsbench.scaling.commcal import load_comm_fits

    fit = load_fit(store, workload, "cpu")
    if fit is not None and fit.timeshare:
        return fit.timeshare
    if load_comm_fits(store) is None:
        return None
    found = measure_timeshare(workload, trainers, store)
    fit = load_fit(store, workload, "cpu")
    write_json_atomic(fit_path(store, workload, "cpu"),
                      dataclasses.asdict(dataclasses.replace(fit, timeshare=found)))
    return found
