"""The co-run slowdown: how much slower a rank's CPU work runs when every core of the host
runs it at once (shared caches, memory bandwidth, hyperthread siblings), measured in real
processes for `fsbench calibrate` (fsbench.costmodel.calibrate stores it in the fit; the
simulator applies it from 2 ranks on)."""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch

from fsbench.config import WorkloadConfig
from fsbench.training.warm_start import warm_context
from fsbench.costmodel.timing import (fixed_length_batch, measure_replicated_ns_per_element,
                                     time_encoder_ms)


def _time_encoder(workload: WorkloadConfig, length: int, repeats: int, start=None) -> float:
    """Median encoder forward+backward seconds of one fixed batch, on one thread; `start`
    (a barrier) lines up co-running processes before timing."""
    torch.set_num_threads(1)
    model, batch, _ = fixed_length_batch(workload, length)
    return time_encoder_ms(model, batch, repeats, warmup=2, start=start) / 1e3


def _time_table_work(workload: WorkloadConfig, length: int, repeats: int, start=None) -> float:
    """A replica's table work per element (ns), on one thread (`length` unused)."""
    torch.set_num_threads(1)
    return measure_replicated_ns_per_element(workload, repeats=repeats, start=start)


CORUN_TIMEOUT_S = 600.0
"""How long a co-run measurement may take before it is called frozen: its processes are
then killed and the calibration fails, saying so."""

CORUN_WORK = {"encoder": _time_encoder, "tables": _time_table_work}


def _corun_child(work, workload, length, repeats, start, results, index) -> None:
    results[index] = CORUN_WORK[work](workload, length, repeats, start)


def measure_corun_slowdown(workload: WorkloadConfig, processes: int | None = None,
                           length: int = 64, repeats: int = 10, work: str = "encoder",
                           rounds: int = 2) -> tuple[float, int]:
    """(median co-run time / median solo time, processes): `work` (the encoder's fixed
    batch, or a replica's table work: CORUN_WORK) timed in one fresh process alone, then
    in `processes` (default: this host's cores) fresh processes at once, `rounds` times
    in turn, so that solo and co-run run under the same conditions (a fresh process
    each, `_time_in_processes`; solo used to be timed in the calling process). On the shared 2-core VM this is
    still noisy: the encoder's factor read 0.94-1.03 and the tables' 0.88-1.05 in the
    calibrations of 2026-12-05 (below 1: two busy cores "faster" than one), which the
    simulator's `local` step times inherit
    (results/sim_validation_heldback_set5_cpu.md); `fsbench calibrate --passes` keeps
    the median of several readings."""
    processes = processes or os.cpu_count() or 1
    if processes < 2:
        return 1.0, 1
    solo, corun = [], []
    for _ in range(rounds):
        solo += _time_in_processes(work, workload, length, repeats, 1)
        corun += _time_in_processes(work, workload, length, repeats, processes)
    return float(statistics.median(corun) / statistics.median(solo)), processes


def _time_in_processes(work: str, workload: WorkloadConfig, length: int, repeats: int,
                       processes: int) -> list[float]:
    """`work`'s time in each of `processes` fresh processes started together."""
    import multiprocessing as mp

    # Fresh processes, never forked from one that ran torch (its thread pools would come
    # along): on Linux forked from the warm server, which imported torch and ran nothing,
    # as ranks are (fsbench.training.warm_start); elsewhere spawned. On the 2-core VM a
    # `tiny` calibration's two measurements took 28 s spawned, 4 s forked warm.
    ctx = warm_context() if sys.platform == "linux" else mp.get_context("spawn")
    # Bounded waits: a process that dies or freezes before the barrier must not leave the
    # others (and this caller) waiting for ever, and none may outlive this call, also
    # when it is interrupted (Ctrl-C, a test's timeout): a CI run once froze on one. This
    # caller kills them at CORUN_TIMEOUT_S; the barrier's own, later, bound covers a caller
    # killed outright (SIGKILL), so that its processes do not wait at it for ever.
    start = ctx.Barrier(processes, timeout=2 * CORUN_TIMEOUT_S)
    results = ctx.Array("d", processes)
    procs = [ctx.Process(target=_corun_child, args=(work, workload, length, repeats, start, results, i))
             for i in range(processes)]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + CORUN_TIMEOUT_S
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        if any(p.is_alive() for p in procs):
            raise RuntimeError(f"co-run calibration: a process still ran after {CORUN_TIMEOUT_S:.0f} s; "
                               "all were killed")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    if any(p.exitcode for p in procs):
        raise RuntimeError("co-run calibration: a process failed "
                           f"(exit codes {[p.exitcode for p in procs]})")
    return list(results[:])
