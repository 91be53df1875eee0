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
import functools
import statistics
from pathlib import Path

import numpy as np

from fsbench.config import WorkloadConfig
from fsbench.costmodel.batch_terms import TOKENS_PER_POINT, BatchTerms, fit_batch_terms
from fsbench.costmodel.corun import measure_corun_slowdown
from fsbench.costmodel.cost_curve import default_lengths, fit_quadratic, quadratic_cost
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
    that many times, one after another, and one fit is made of the passes' medians
    (median_of_passes): on a shared host two calibrations in a row moved a 2-rank
    prediction by 14% (results/sim_hist_check_cpu.md)."""
    runs = [measure_pass(workload, device, lengths, repeats, progress) for _ in range(passes)]
    fit = runs[0][0] if passes == 1 else median_of_passes(runs, workload)
    path = fit_path(out_dir, workload, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, dataclasses.asdict(fit))
    return fit


@dataclasses.dataclass
class EncoderTimes:
    """One pass's encoder timings: per-sample ms at each calibration length, and each batch
    of the batch terms' design (the same batches every pass) with its measured ms."""
    lengths: list[int]
    per_sample_ms: list[float]
    batches: list[tuple[np.ndarray, float]]


def encoder_model(times: EncoderTimes) -> dict:
    """cost(L) (a, b, c, r2) and the batch terms fitted to `times`, as CostFit's fields."""
    a, b, c, r2 = fit_quadratic(times.lengths, times.per_sample_ms)
    model = dict(a=a, b=b, c=c, r2=r2, lengths=list(times.lengths), per_sample_ms=list(times.per_sample_ms))
    cost_ms = functools.partial(quadratic_cost, a, b, c, padded=True)  # CostFit.cost_ms, padded
    return {**model, **dataclasses.asdict(batch_terms_of(times.batches, cost_ms))}


def measure_pass(workload: WorkloadConfig, device: str = "cpu", lengths: list[int] | None = None,
                 repeats: int = 5, progress=lambda it: it) -> tuple[CostFit, EncoderTimes]:
    """One pass of every measurement behind a fit (nothing stored): the fit, and the
    encoder timings it was fitted to."""
    lengths = lengths or default_lengths(workload.max_seq_len)
    per_sample = [measure_per_sample_ms(workload, L, repeats, device=device) for L in progress(lengths)]
    times = EncoderTimes(list(lengths), per_sample, time_batch_design(workload, device))
    fit = CostFit(model=model_key(workload), device=device_key(device), padded=True,
                  created=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                  table_ns_per_element=measure_table_ns_per_element(workload, device),
                  table_optimizer=workload.table_optimizer,
                  replicated_ns_per_element=measure_replicated_ns_per_element(workload, device),
                  **encoder_model(times))
    if device == "cpu":
        slowdown, processes = measure_corun_slowdown(workload)
        tables, _ = measure_corun_slowdown(workload, processes, repeats=3, work="tables")
        fit = dataclasses.replace(fit, corun_slowdown=slowdown, corun_processes=processes,
                                  table_corun_slowdown=tables)
    return fit, times


PASS_SCALARS = ("table_ns_per_element", "replicated_ns_per_element", "corun_slowdown",
                "table_corun_slowdown")
"""The fit's figures measured on their own, each kept as its median over passes."""


def encoder_batch_ms(fit: CostFit, workload: WorkloadConfig) -> float:
    """The fit's encoder time for the workload's own global batch at CALIBRATION_SEED: how
    passes' encoder models (cost(L) and batch terms, fitted together) are ranked."""
    lengths = SyntheticBatches(workload, seed=CALIBRATION_SEED).global_batch(0).lengths.numpy()
    return fit.encoder_ms(lengths)


def median_of_passes(runs: list[tuple[CostFit, EncoderTimes]], workload: WorkloadConfig) -> CostFit:
    """One fit from several passes (each a fit and its encoder timings): the encoder model
    (cost(L) with its batch terms) fitted once to the passes' median timings, each length's
    and each batch's median (the passes time the same batches), and each of PASS_SCALARS'
    median over the passes (None where a pass lacks it). Every pass's figures are kept in
    `passes`.

    Before, the model of the pass whose time for the workload's own batch was the median
    was kept whole. Its batch terms fit six collinear columns to one pass's noise, so two
    calibrations could agree on that batch and not elsewhere: the per-sample term was
    +0.112 ms in one and -0.024 ms in the next, a 2-rank step on other lengths 15% under
    its measurement (results/sim_validation_heldback_set13_cpu.md; set 12's file has the +0.112). Medians first, then
    one fit, leave the fit less of each pass's noise."""
    fits = [f for f, _ in runs]
    timings = [t for _, t in runs]
    pooled = EncoderTimes(
        timings[0].lengths,
        [float(statistics.median(ms)) for ms in zip(*(t.per_sample_ms for t in timings))],
        [(batch[0][0], float(statistics.median(b[1] for b in batch))) for batch in zip(*(t.batches for t in timings))])
    scalars = {name: (None if any(getattr(f, name) is None for f in fits)
                      else float(statistics.median(getattr(f, name) for f in fits)))
               for name in PASS_SCALARS}
    record = [{"encoder_batch_ms": encoder_batch_ms(f, workload), **{name: getattr(f, name) for name in PASS_SCALARS}}
              for f in fits]
    return dataclasses.replace(fits[0], **encoder_model(pooled), **scalars, passes=record)


def time_batch_design(workload, device: str = "cpu", batches: int = 3, repeats: int = 3,
                      max_split: int = 16) -> list[tuple[np.ndarray, float]]:
    """The batch terms' design (see fsbench.costmodel.batch_terms), each batch timed:
    (its lengths, its encoder ms)."""
    timed = []

    def time_batch(model, batch) -> None:
        took = time_encoder_ms(model, batch.to(device), repeats, warmup=1, device=device)
        timed.append((batch.lengths.cpu().numpy(), took))

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
    return timed


def batch_terms_of(timed: list[tuple[np.ndarray, float]], cost_ms) -> BatchTerms:
    """fit_batch_terms over timed batches less the sum of cost_ms(L)."""
    terms = fit_batch_terms([(L, took - float(np.sum(cost_ms(L)))) for L, took in timed], cost_ms)
    # A negative per-sample term corrects cost(L)'s constant; it never makes a sample free.
    floor = -float(np.asarray(cost_ms(np.array([1])))[0])
    return dataclasses.replace(terms, batch_sample_ms=max(terms.batch_sample_ms, floor))


def measure_batch_terms(workload, cost_ms, device: str = "cpu", batches: int = 3, repeats: int = 3,
                        max_split: int = 16) -> BatchTerms:
    """The batch terms measured and fitted against cost_ms(L)."""
    return batch_terms_of(time_batch_design(workload, device, batches, repeats, max_split), cost_ms)
