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
The fit is stored in the results store under `<out>/calibrations/`, keyed by model shape
and device, where a load balancer (FreeScale), the emulation and the simulator find it;
without a matching fit the balancer uses an analytical model.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import re
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fsbench.config import WorkloadConfig
from fsbench.models import Bucketing, EmbeddingLookups, build_model
from fsbench.running.store import read_json, write_json_atomic
from fsbench.running.cost_curve import default_lengths, fit_quadratic, quadratic_cost
from fsbench.running.batch_terms import TOKENS_PER_POINT, footprint_excess, measure_batch_terms, wide_excess
from fsbench.workloads.generator import SyntheticBatches

# Batches no run draws by default (runs use small seeds), so a validation against runs
# never times its own batches.
CALIBRATION_SEED = 7919
LOOKUP_FIELDS = tuple(f.name for f in dataclasses.fields(EmbeddingLookups))


@dataclass(frozen=True, slots=True)
class CostFit:
    a: float
    b: float
    c: float
    r2: float
    model: str
    device: str
    lengths: list[int]
    per_sample_ms: list[float]
    created: str = ""
    table_ns_per_element: float | None = None
    """The workload's table optimizer's step over an embedding table, per element (rows x dim)
    and step (slope between two table sizes): what a sharded trainer pays per updated
    row's element. None in fits made before it existed."""
    table_optimizer: str | None = None
    corun_slowdown: float | None = None
    """How much slower the encoder runs when every core of this host runs it at once
    (`corun_processes` processes) than alone: ranks that share a host's cores (and their
    caches, memory bandwidth, hyperthread siblings) pay it. None in older fits."""
    corun_processes: int | None = None
    batch_ms: float | None = None
    """A batch's encoder cost beyond its samples' cost(L): fixed, and per attention bucket
    (`bucket_ms`). None in fits made before they existed (then 0)."""
    bucket_ms: float | None = None
    replicated_ns_per_element: float | None = None
    """A replica's table work per step (dense gradients of every table, then the optimizer
    over every row), per element, at the workload's table sizes. None in older fits."""
    step_overhead: dict[str, dict[str, float]] | None = None
    """Per "trainer/compute" (compute: model or emulated): what a real 1-rank step costs
    beyond the simulator's model of it (framework and input work, a sharded trainer's row
    gathering and exchange calls), from a run at CALIBRATION_SEED
    (fsbench.scaling.step_overhead.measure_step_overhead; with compute=model, less the real
    encoder's drift from the fit at that moment, `encoder_drift`): `wall_ms` of it, of which `cpu_ms` the
    rank's own thread CPU (it time-shares), `busy_ms` counted busy by the metrics, and
    `input_ms` waiting for input. None: 0."""
    table_corun_slowdown: float | None = None
    """A replica's table work (memory-bound, unlike the encoder) in `corun_processes`
    processes at once against alone. None in older fits (then the encoder's)."""
    timeshare: dict | None = None
    """Ranks beyond the host's cores (`corun_processes`): how much of full time-sharing
    (every rank's CPU work waiting for all the others') their steps meet, measured at
    four times as many emulated ranks as cores (fsbench.scaling.timeshare): `efficiency` in
    [0, 1], `ranks`, and each trainer's own. None: 1 (full time-sharing)."""

    wide_ms_per_melem: float | None = None
    """A batch's wide attention buckets (samples x padded length^2 beyond
    `wide_threshold_melem` million elements) cost this much more per million elements
    (fsbench.running.batch_terms). None in older fits (then 0)."""
    wide_threshold_melem: float | None = None
    batch_sample_ms: float | None = None
    """A jagged batch's cost per sample beyond cost(L) (either sign: cost(L)'s constant
    was measured at one batch size; fsbench.running.batch_terms). None in older fits."""
    footprint_per_ktoken: float | None = None
    """A batch of more tokens than cost(L) was timed on runs slower per token: this
    fraction of its cost(L) per thousand tokens beyond TOKENS_PER_POINT
    (fsbench.running.batch_terms). None in older fits (then 0)."""
    padded: bool | None = None
    """cost(L)'s square term is of the sample's padded length P(L) (the attention bucket's,
    `Bucketing`), as the model computes it: a P(L)^2 + b L + c. None in older fits, whose
    square term is of L (see quadratic_cost)."""
    passes: list[dict] | None = None
    """A fit calibrated in several passes (calibrate's `passes`): each pass's encoder time
    for the workload's batch and PASS_SCALARS, in the order measured. None: one pass."""

    def batch_extra_ms(self, lengths: np.ndarray) -> float:
        """What a batch of these lengths costs beyond the sum of cost(L) (0 when empty)."""
        if len(lengths) == 0:
            return 0.0
        wide = (self.wide_ms_per_melem * wide_excess(lengths, self.wide_threshold_melem or 0.0)
                if self.wide_ms_per_melem else 0.0)
        footprint = (self.footprint_per_ktoken * footprint_excess(lengths, self.cost_ms)
                     if self.footprint_per_ktoken else 0.0)
        return ((self.batch_ms or 0.0) + (self.batch_sample_ms or 0.0) * len(lengths) + footprint
                + (self.bucket_ms or 0.0) * bucket_count(lengths) + wide)

    def encoder_ms(self, lengths: np.ndarray) -> float:
        """A batch's encoder time: its samples' cost(L) and the batch terms."""
        return float(np.sum(self.cost_ms(lengths))) + self.batch_extra_ms(lengths)

    def batch_terms_text(self) -> str:
        """The batch terms in words (calibrate's output, the validation's header)."""
        return (f"{self.batch_ms or 0.0:.2f} ms + {self.batch_sample_ms or 0.0:.3f} ms per sample + "
                f"{self.bucket_ms or 0.0:.2f} ms per attention bucket + "
                f"{self.wide_ms_per_melem or 0.0:.1f} ms per million attention elements beyond "
                f"{self.wide_threshold_melem or 0.0:.2f} million in a bucket + "
                f"{100 * (self.footprint_per_ktoken or 0.0):.2f}% of cost(L) per thousand tokens beyond "
                f"{TOKENS_PER_POINT:,}")

    def cost_ms(self, lengths: np.ndarray) -> np.ndarray:
        return quadratic_cost(self.a, self.b, self.c, lengths, bool(self.padded))


def bucket_count(lengths, bucketing: Bucketing = Bucketing()) -> int:
    """Distinct attention buckets of a batch of these lengths (DenseArch's default)."""
    return len({bucketing.padded_length(int(L)) for L in np.asarray(lengths).ravel()})


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def device_key(device: str = "cpu") -> str:
    """What the fit depends on: the GPU model, or the CPU model and thread count."""
    if device == "cuda":
        return _slug(torch.cuda.get_device_name())
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1] for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"cpu-{_slug(cpu)}-t{torch.get_num_threads()}"


def model_key(workload: WorkloadConfig) -> str:
    m = workload.model
    if workload.compute == "synthetic":
        return f"synthetic-{workload.synthetic.us_per_token:g}us"
    return f"{m.family}-d{m.dim}-l{m.num_layers}-h{m.num_heads}-neg{workload.negatives_per_step}"


def fit_path(out_dir: str | Path, workload: WorkloadConfig, device: str) -> Path:
    return Path(out_dir) / "calibrations" / f"{model_key(workload)}__{device_key(device)}.json"


def encoder_inputs(model, batch) -> EmbeddingLookups:
    """The encoder's inputs as leaves that take gradients: the lookups, detached from the
    tables (their gather and dense scatter are the table side's cost, timed apart)."""
    with torch.no_grad():
        found = model.sparse.lookup(batch)
    return EmbeddingLookups(**{f: getattr(found, f).detach().requires_grad_(True) for f in LOOKUP_FIELDS})


def time_encoder_ms(model, batch, repeats: int = 5, warmup: int = 2, device: str = "cpu",
                    start=None) -> float:
    """Median forward + backward milliseconds of the dense part on one batch; `start` (a
    barrier) lines up co-running processes after the warm-up."""
    lookups = encoder_inputs(model, batch)
    times = []
    for i in range(warmup + repeats):
        if i == warmup and start is not None:
            start.wait()
        if device == "cuda":
            torch.cuda.synchronize()  # note: CPU-GPU sync point, so the timer sees the work
        t0 = time.perf_counter()
        model.dense(lookups, batch).backward()
        if device == "cuda":
            torch.cuda.synchronize()  # note: CPU-GPU sync point
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    return statistics.median(times) * 1e3


def fixed_length_batch(workload: WorkloadConfig, length: int, device: str = "cpu"):
    """About TOKENS_PER_POINT tokens of samples of length `length` (at least one), and a
    model for them."""
    n = max(1, TOKENS_PER_POINT // length)
    w = dataclasses.replace(workload, lengths=f"fixed:{length}", global_batch_size=n)
    return build_model(w, seed=0).to(device), SyntheticBatches(w, seed=0).global_batch(0).to(device), n


def measure_per_sample_ms(workload: WorkloadConfig, length: int, repeats: int = 5,
                          warmup: int = 2, device: str = "cpu") -> float:
    """Median encoder forward+backward time per sample for a batch of identical length."""
    model, batch, n = fixed_length_batch(workload, length, device)
    return time_encoder_ms(model, batch, repeats, warmup, device) / n


def measure_table_ns_per_element(workload: WorkloadConfig, device: str = "cpu",
                                 rows: tuple[int, int] = (20_000, 200_000), repeats: int = 5) -> float:
    """Slope of the optimizer step's time over table size: a dense table of `rows[i]` x
    dim with a dense gradient, stepped by the workload's table optimizer; (t1 - t0) / (elements1
    - elements0), so fixed per-step costs cancel. The two sizes are stepped in turn and
    each keeps its fastest step: a neighbour's burst only ever adds time, and one that
    lands on the small table alone would otherwise flip the slope's sign."""
    from fsbench.training.optim import SPARSE_GRADIENTS, make_table_optimizer

    steppers = []
    for n_rows in rows:
        table = torch.nn.Parameter(torch.zeros(n_rows, workload.model.dim, device=device))
        table.grad = torch.full_like(table, 1e-3)
        if workload.table_optimizer in SPARSE_GRADIENTS:  # every row, as a sparse gradient
            table.grad = table.grad.to_sparse()
        steppers.append(make_table_optimizer([table], workload))
    best = [float("inf")] * len(rows)
    for i in range(2 + repeats):
        for k, opt in enumerate(steppers):
            if device == "cuda":
                torch.cuda.synchronize()  # note: CPU-GPU sync point, so the timer sees the work
            t0 = time.perf_counter()
            opt.step()
            if device == "cuda":
                torch.cuda.synchronize()  # note: CPU-GPU sync point
            if i >= 2:
                best[k] = min(best[k], time.perf_counter() - t0)
    elements = [n * workload.model.dim for n in rows]
    return max(0.0, (best[1] - best[0]) / (elements[1] - elements[0]) * 1e9)


class _TableWork(torch.nn.Module):
    """A batch's lookups in every table, summed: a loss whose backward is the tables'."""

    def __init__(self, sparse) -> None:
        super().__init__()
        self.sparse = sparse

    def forward(self, batch):
        found = self.sparse.lookup(batch)
        return sum(getattr(found, f).sum() for f in LOOKUP_FIELDS)


def measure_replicated_ns_per_element(workload: WorkloadConfig, device: str = "cpu",
                                      repeats: int = 3, samples: int = 8, start=None) -> float:
    """A replica's table work per step at the workload's real table sizes, per element:
    a small batch's lookups, their backward into dense gradients (every row zeroed, then
    scattered into), PyTorch DDP's copies of those gradients into and out of its buckets
    and its all-reduce at one rank (a gloo group of one, made here when none exists: the
    copies touch every row, as they do in every replicated trainer), and the optimizer's
    step over every row; divided by all tables' elements. What DDP-style trainers pay per
    step whatever the batch."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from fsbench.training.optim import SPARSE_GRADIENTS, make_table_optimizer

    w = dataclasses.replace(workload, global_batch_size=samples)
    sparse = build_model(w, seed=0).sparse.to(device)
    sparse.sparse_gradients(w.table_optimizer in SPARSE_GRADIENTS)
    batch = SyntheticBatches(w, seed=CALIBRATION_SEED).global_batch(0).to(device)
    own_group = device == "cpu" and not dist.is_initialized()
    tmp = tempfile.mkdtemp(prefix="fsbench-calibrate-") if own_group else None
    if own_group:
        dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), 1),
                                rank=0, world_size=1)
    try:
        work = _TableWork(sparse)
        if own_group:
            work = DistributedDataParallel(work)
        opt = make_table_optimizer(sparse.parameters(), w)
        times = []
        for i in range(1 + repeats):
            if i == 1 and start is not None:  # co-running processes line up after the warm-up
                start.wait()
            if device == "cuda":
                torch.cuda.synchronize()  # note: CPU-GPU sync point, so the timer sees the work
            t0 = time.perf_counter()
            work(batch).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.synchronize()  # note: CPU-GPU sync point
            if i >= 1:
                times.append(time.perf_counter() - t0)
    finally:
        if own_group:
            dist.destroy_process_group()
            shutil.rmtree(tmp, ignore_errors=True)
    elements = sum(p.numel() for p in sparse.parameters())
    return statistics.median(times) * 1e9 / elements


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
        from fsbench.running.corun import measure_corun_slowdown

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


def load_fit(out_dir: str | Path, workload: WorkloadConfig, device: str = "cpu") -> CostFit | None:
    """The stored fit for this model on this device, if one exists."""
    path = fit_path(out_dir, workload, device)
    return fit_from_dict(read_json(path)) if path.exists() else None


def fit_from_dict(raw: dict) -> CostFit:
    """A CostFit from its stored fields. Fields an older version stored and this one
    replaced are left out (their quantity is then missing: measured again where it is
    needed)."""
    known = {f.name for f in dataclasses.fields(CostFit)}
    return CostFit(**{k: v for k, v in raw.items() if k in known})


REQUIRED_FIT_FIELDS = tuple(f.name for f in dataclasses.fields(CostFit)
                            if f.default is dataclasses.MISSING)
"""What every stored fit holds (the fields without a default)."""
