"""Cost model of one rank's step, calibrated by measurement on this device.

`fsbench calibrate --workload W` measures, with the workload's real model:
  encoder    forward + backward of the dense part (`model.dense`: what `compute=emulated`
             replaces) per sample, on batches of identical length L over a grid of lengths:
             cost(L) = a L^2 + b L + c by least squares (R^2 reported). The balancer
             (FreeScale) and the emulation read it.
  per batch  the same on jagged batches of the workload's own lengths at per-rank batch
             sizes (the global batch over 1, 2, 4, 8, 16 ranks), less the per-sample sum:
             what a batch costs beyond its samples, fitted as `batch_ms + bucket_ms x
             buckets` (each attention bucket is one kernel sequence per layer,
             fsbench.models.jagged), so a rank with few samples of many lengths is not
             modelled as nearly free.
  tables     the optimizer's step per table element (slope over two table sizes, for rows
             a sharded trainer updates), and a replica's whole table work per step per
             element at the workload's real table sizes (the lookups' dense gradients, then
             the step over every row).
  co-run     the encoder's slowdown when every core of this host runs it at once, and
             the replica's table work's (memory-bound: it slows differently).
The fit (fsbench.costmodel.fit) is stored in the results store under
`<out>/calibrations/`, keyed by model shape and device, where a load balancer
(FreeScale), the emulation and the simulator find it; without a matching fit the
balancer uses an analytical model. The measurements themselves: fsbench.costmodel.timing.
"""
from __future__ import annotations

import dataclasses
import datetime
import statistics
from pathlib import Path

import numpy as np

from fsbench.config import WorkloadConfig
from fsbench.costmodel.batch_terms import TOKENS_PER_POINT, BatchTerms, fit_batch_terms
from fsbench.costmodel.corun import measure_corun_slowdown
from fsbench.costmodel.cost_curve import default_lengths, fit_quadratic
from fsbench.costmodel.fit import CostFit, device_key, fit_path, model_key
from fsbench.costmodel.timing import (CALIBRATION_SEED, measure_per_sample_ms,
                                      measure_replicated_ns_per_element,
                                      measure_table_ns_per_element, time_encoder_ms)
from fsbench.files import write_json_atomic
from fsbench.models import build_model
from fsbench.workloads.generator import SyntheticBatches


def calibrate(workload: WorkloadConfig, out_dir: str | Path, device: str = "cpu",
              lengths: list[int] | None = None, repeats: int = 5, progress=lambda it: it,
              passes: int = 1) -> CostFit:
    """Measure, fit, store; returns the fit. With `passes` > 1 the whole measurement runs
    that many times, one after another, and the fit keeps the median pass of each
    quantity (median_of_passes): on a shared host two calibrations in a row moved a
    2-rank prediction by 14% (results/sim_hist_check_cpu.md)."""
    fits = [measure_fit(workload, device, lengths, repeats, progress) for _ in range(passes)]
    fit = fits[0] if passes == 1 else median_of_passes(fits, workload)
    path = fit_path(out_dir, workload, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, dataclasses.asdict(fit))
    return fit


def measure_fit(workload: WorkloadConfig, device: str = "cpu", lengths: list[int] | None = None,
                repeats: int = 5, progress=lambda it: it) -> CostFit:
    """One pass of every measurement behind a fit (nothing stored)."""
    lengths = lengths or default_lengths(workload.max_seq_len)
    per_sample = [measure_per_sample_ms(workload, L, repeats, device=device) for L in progress(lengths)]
    a, b, c, r2 = fit_quadratic(lengths, per_sample)
    fit = CostFit(a=a, b=b, c=c, r2=r2, model=model_key(workload), device=device_key(device),
                  lengths=list(lengths), per_sample_ms=per_sample, padded=True,
                  created=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                  table_ns_per_element=measure_table_ns_per_element(workload, device),
                  table_optimizer=workload.table_optimizer,
                  replicated_ns_per_element=measure_replicated_ns_per_element(workload, device))
    fit = dataclasses.replace(fit, **dataclasses.asdict(measure_batch_terms(workload, fit.cost_ms, device)))
    if device == "cpu":
        slowdown, processes = measure_corun_slowdown(workload)
        tables, _ = measure_corun_slowdown(workload, processes, repeats=3, work="tables")
        fit = dataclasses.replace(fit, corun_slowdown=slowdown, corun_processes=processes,
                                  table_corun_slowdown=tables)
    return fit


PASS_SCALARS = ("table_ns_per_element", "replicated_ns_per_element", "corun_slowdown",
                "table_corun_slowdown")
"""The fit's figures measured on their own, each kept as its median over passes."""


def encoder_batch_ms(fit: CostFit, workload: WorkloadConfig) -> float:
    """The fit's encoder time for the workload's own global batch at CALIBRATION_SEED: how
    passes' encoder models (cost(L) and batch terms, fitted together) are ranked."""
    lengths = SyntheticBatches(workload, seed=CALIBRATION_SEED).global_batch(0).lengths.numpy()
    return fit.encoder_ms(lengths)


def median_of_passes(fits: list[CostFit], workload: WorkloadConfig) -> CostFit:
    """One fit from several passes: the encoder model (cost(L) with its batch terms, which
    are residuals against it and so belong together) of the pass whose time for the
    workload's batch is the median, and each of PASS_SCALARS' median over the passes
    (None where a pass lacks it). Every pass's figures are kept in `passes`."""
    times = [encoder_batch_ms(f, workload) for f in fits]
    chosen = fits[sorted(range(len(fits)), key=times.__getitem__)[(len(fits) - 1) // 2]]
    scalars = {name: (None if any(getattr(f, name) is None for f in fits)
                      else float(statistics.median(getattr(f, name) for f in fits)))
               for name in PASS_SCALARS}
    record = [{"encoder_batch_ms": t, **{name: getattr(f, name) for name in PASS_SCALARS}}
              for f, t in zip(fits, times)]
    return dataclasses.replace(chosen, **scalars, passes=record)


def measure_batch_terms(workload, cost_ms, device: str = "cpu", batches: int = 3, repeats: int = 3,
                        max_split: int = 16) -> BatchTerms:
    """fit_batch_terms over timed batches (see the module docstring) less the sum of
    cost_ms(L)."""
    timed = []

    def time_batch(model, batch) -> None:
        lengths = batch.lengths.cpu().numpy()
        took = time_encoder_ms(model, batch.to(device), repeats, warmup=1, device=device)
        timed.append((lengths, took - float(np.sum(cost_ms(lengths)))))

    def time_fixed(length: int, n: int) -> None:
        w = dataclasses.replace(workload, lengths=f"fixed:{length}", global_batch_size=n)
        time_batch(build_model(w, seed=0).to(device), SyntheticBatches(w, seed=0).global_batch(0))

    model = build_model(workload, seed=0).to(device)
    for size in sorted({max(1, workload.global_batch_size // k) for k in (1, 2, 4, 8, 16) if k <= max_split}):
        source = SyntheticBatches(dataclasses.replace(workload, global_batch_size=size), seed=CALIBRATION_SEED)
        for k in range(batches):
            time_batch(model, source.global_batch(k))
    for length in sorted({workload.max_seq_len, max(8, workload.max_seq_len // 2)}):
        n = max(1, TOKENS_PER_POINT // length)
        while True:
            time_fixed(length, n)
            if n >= workload.global_batch_size:
                break
            n = min(2 * n, workload.global_batch_size)
    # Many samples, few tokens: a sample's own cost apart from its tokens'.
    short = min(8, workload.max_seq_len)
    for n in sorted({max(1, workload.global_batch_size // 8), workload.global_batch_size}):
        time_fixed(short, n)
    terms = fit_batch_terms(timed, cost_ms)
    # A negative per-sample term corrects cost(L)'s constant; it never makes a sample free.
    floor = -float(np.asarray(cost_ms(np.array([1])))[0])
    return dataclasses.replace(terms, batch_sample_ms=max(terms.batch_sample_ms, floor))
