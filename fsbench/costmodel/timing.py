"""The measurements a cost fit is made of, on this device: the encoder's forward +
backward on a batch (`time_encoder_ms`), per sample at one length, the optimizer's step
per table element, and a replica's whole table work per step (fsbench.costmodel.calibrate
runs them; the co-run slowdown (corun) and the step overhead (fsbench.scaling) time with
them too)."""
from __future__ import annotations

import dataclasses
import statistics
import time

import torch

from fsbench.config import WorkloadConfig
from fsbench.costmodel.batch_terms import TOKENS_PER_POINT
from fsbench.models import EmbeddingLookups, build_model
from fsbench.workloads.generator import SyntheticBatches

# Batches no run draws by default (runs use small seeds), so a validation against runs
# never times its own batches.
CALIBRATION_SEED = 7919
LOOKUP_FIELDS = tuple(f.name for f in dataclasses.fields(EmbeddingLookups))


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
        table = torch.nn.Parameter(torch.zeros(n_rows, workload.model.row_dim, device=device))
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
    elements = [n * workload.model.row_dim for n in rows]
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
    and its all-reduce at one rank, and the optimizer's step over every row; divided by
    all tables' elements. What DDP-style trainers pay per step whatever the batch.

    DDP runs on a world of one made here when none exists (fsbench.training.dist.
    one_rank_group), on CUDA as on CPU: NCCL there, gloo here. Its bucket copies touch
    every row, as they do in every replicated trainer; a CUDA calibration without them
    under-books DDP-style trainers in `simulate --cluster-fit`."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from fsbench.training.dist import one_rank_group
    from fsbench.training.optim import SPARSE_GRADIENTS, make_table_optimizer

    w = dataclasses.replace(workload, global_batch_size=samples)
    sparse = build_model(w, seed=0).sparse.to(device)
    sparse.sparse_gradients(w.table_optimizer in SPARSE_GRADIENTS)
    batch = SyntheticBatches(w, seed=CALIBRATION_SEED).global_batch(0).to(device)
    cuda = torch.device(device).type == "cuda"
    with one_rank_group(device) as group:
        # At one rank only: inside a rank of a larger world an all-reduce would wait for
        # ranks that are not calibrating.
        work = _TableWork(sparse)
        if dist.get_world_size(group) == 1:
            index = torch.device(device).index if cuda else None
            work = DistributedDataParallel(
                work, process_group=group,
                device_ids=[torch.cuda.current_device() if index is None else index] if cuda else None)
        opt = make_table_optimizer(sparse.parameters(), w)
        times = []
        for i in range(1 + repeats):
            if i == 1 and start is not None:  # co-running processes line up after the warm-up
                start.wait()
            if cuda:
                torch.cuda.synchronize()  # note: CPU-GPU sync point, so the timer sees the work
            t0 = time.perf_counter()
            work(batch).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()  # note: CPU-GPU sync point
            if i >= 1:
                times.append(time.perf_counter() - t0)
        # DDP goes before its group: a DDP module alive when the group is destroyed drops
        # the group's last reference itself, and ~ProcessGroupGloo then joins gloo's work
        # threads while holding the GIL, which a thread still freeing the last
        # all-reduce's work waits for: a deadlock, in 2 of 3 loops of 500 calibrations
        # (2026-12-07; it hung a CI run's co-run calibration, tests/test_one_rank_world.py).
        del work, opt
    elements = sum(p.numel() for p in sparse.parameters())
    return statistics.median(times) * 1e9 / elements
