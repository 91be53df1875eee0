"""Will a run fit? A per-rank memory estimate made before any rank starts.

Without it, `fsbench run --workload large` on a 24 GiB machine starts, then a rank dies
allocating the item table and the kernel kills it. The estimate adds, per rank:

  tables       embedding rows held (full tables, or 1/N of them where a trainer shards)
  table grads  their gradients (a replicated table's dense gradient, plus DDP's bucket copy)
  optimizer    optimizer state: Adam 2, Adagrad 1, SGD 0 values per parameter held
  dense        the encoder's parameters, gradients (x2 under DDP) and optimizer state
  activations  a bound for the largest batch a rank sees: per token and layer, saved
               encoder tensors; per sample and layer, its bucket's attention scores; the
               sampled-softmax logits; gathered embeddings
  runtime      the process itself: Python, torch, gloo, the monitor (measured, below)

Initialization draws each table's values in float64 for a moment (the same values on every
rank, whatever it holds), before any gradient or optimizer state exists, so the peak is the
larger of the two phases. A trainer declares how it holds tables with a static `table_memory(options, world_size)`
returning a `TableMemory` (fsbench.training.table_memory); trainers that do not are taken
to replicate them as DDP does.

A run's estimate is made once (`run_estimate`): the CLI checks it before any rank starts
(`check`), the runner records that same estimate in the manifest.

The available memory is per rank: on CPU the machine's available memory shared by the
local ranks, on CUDA the free memory of one device (NVML). Checked against measured
peaks in tests/test_memory_estimate.py.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math

import numpy as np

from fsbench.config import ModelConfig, RunConfig
from fsbench.config_io import to_dict
from fsbench.errors import ConfigError
from fsbench.training.table_memory import REPLICATED, TableMemory

MIB = 2**20
FLOAT = 4  # float32 bytes
OPTIMIZER_STATES = {"adam": 2, "sparse_adam": 2, "adagrad": 1, "sgd": 0}
# Peak RSS of a rank whose tables and activations are negligible (`tiny`, 2 ranks, ddp
# and freescale) on the 2-core VM with torch 2.13.0+cpu: 340-360 MiB; taken with margin.
RUNTIME_CPU_MB = 400.0
# A CUDA context and the caching allocator's slack (allocated-tensor peaks are what the
# CUDA runs record, so only the allocator's rounding counts). NOT YET RUN ON A GPU.
RUNTIME_CUDA_MB = 300.0
# Saved float32 values per token and encoder layer (q, k, v, u, attention output, norms,
# projections and their inputs, residuals), and per attention score (scores, activated
# scores, their gradient).
PER_TOKEN_LAYER = 16
PER_SCORE = 3
# Lengths the estimate draws at most (64 draws of a batch up to 2**16 samples each).
DRAWN_SAMPLES = 2**22


@dataclasses.dataclass(frozen=True)
class Estimate:
    per_rank_mb: float
    parts_mb: dict[str, float]
    """What sets the peak: the training phase's parts, or initialization's."""
    training_mb: dict[str, float]
    """The training phase's parts, whichever phase peaks."""
    available_mb: float | None
    """Memory one rank may use (None: unknown, nothing is refused)."""
    available_source: str

    @property
    def fits(self) -> bool:
        return self.available_mb is None or self.per_rank_mb <= self.available_mb

    def to_dict(self) -> dict:
        return {"per_rank_mb": round(self.per_rank_mb, 1),
                "parts_mb": {k: round(v, 1) for k, v in self.parts_mb.items()},
                "available_mb": None if self.available_mb is None else round(self.available_mb, 1),
                "available_source": self.available_source}


def table_memory_of(trainer: str, options: dict[str, str], world_size: int) -> TableMemory:
    from fsbench.training.trainer import resolve_trainer_class

    from fsbench.training.trainer import option_defaults

    cls = resolve_trainer_class(trainer)
    declare = getattr(cls, "table_memory", None)
    return declare({**option_defaults(cls), **options}, world_size) if declare else REPLICATED


@functools.lru_cache(maxsize=64)
def dense_parameters(model: ModelConfig, num_contexts: int, max_seq_len: int) -> int:
    """Parameters of the encoder (everything but the tables), counted on the meta device."""
    import torch

    from fsbench.models.dense import DenseArch

    with torch.device("meta"):
        dense = DenseArch(model, num_contexts, max_seq_len)
    return sum(p.numel() for p in dense.parameters())


@functools.lru_cache(maxsize=64)
def largest_batch(lengths_spec: str, max_seq_len: int, batch_per_rank: int, draws: int = 64,
                  seed: int = 0) -> tuple[int, float]:
    """(tokens, sum of squared padded lengths) of the heaviest of `draws` per-rank batches
    drawn from the workload's length distribution: the straggler's batch bounds the peak."""
    from fsbench.models.jagged import Bucketing
    from fsbench.workloads.distributions import parse_length_spec

    dist, pad = parse_length_spec(lengths_spec), Bucketing()
    rng = np.random.default_rng(seed)
    # Fewer draws of very large batches (whose heaviest is close to their mean anyway), so
    # that the draws stay within DRAWN_SAMPLES (a few hundred MB) whatever the batch.
    draws = max(1, min(draws, DRAWN_SAMPLES // batch_per_rank))
    lengths = dist.sample(rng, draws * batch_per_rank, max_seq_len).reshape(draws, -1)
    distinct = np.unique(lengths)
    padded = np.array([pad.padded_length(int(v)) for v in distinct],
                      dtype=np.float64)[np.searchsorted(distinct, lengths)]
    return int(lengths.sum(axis=1).max()), float((padded**2).sum(axis=1).max())


def estimate(run: RunConfig, table_memory: TableMemory | None = None,
             available_mb: float | None = None, available_source: str = "given") -> Estimate:
    w = run.workload
    n = run.world_size
    tm = table_memory or table_memory_of(run.trainer, run.trainer_options, n)
    dim, row = w.model.dim, w.model.row_dim
    # Optimizer-state copies per element: row-wise Adagrad keeps one per row.
    table_states = 1 / row if w.table_optimizer == "rowwise_adagrad" else OPTIMIZER_STATES[w.table_optimizer]
    if w.table_optimizer == "adam" and tm.placement != "replicated":
        # dense Adam steps a shard whole: its gradient and Adam's temporary, every row
        tm = dataclasses.replace(tm, grads=1.0, optimizer_transient=1.0)
    tables = [w.item_vocab, w.user_vocab, *w.context_vocabs]
    held = tm.rows_held(tables, n) * row * FLOAT
    largest = max(tables) * row * FLOAT
    dense = dense_parameters(w.model, len(w.context_vocabs), w.max_seq_len) * FLOAT
    batch_per_rank = math.ceil(w.global_batch_size / n)
    tokens, squares = largest_batch(w.lengths, w.max_seq_len, batch_per_rank)
    layers, heads = w.model.num_layers, w.model.num_heads
    activations = FLOAT * (tokens * dim * PER_TOKEN_LAYER * layers
                           + squares * heads * PER_SCORE * layers
                           + tokens * w.negatives_per_step * 3     # logits, softmax, gradient
                           + (3 * tokens + w.negatives_per_step) * row * 2)  # lookups and grads
    training = {"tables": held, "table_grads": held * tm.grads,
                "optimizer": held * tm.states * table_states + dense * OPTIMIZER_STATES[w.dense_optimizer]
                + (held * tm.optimizer_transient if table_states else 0.0),
                "dense": dense * 3, "activations": activations}
    # Initialization, before any gradient or optimizer state: the weights held plus one
    # table's float64 draws (fsbench.models.init), which a replica also copies as float32;
    # a shard selects its rows from the draws (float64 first).
    if tm.placement == "replicated":
        init_peak = held + 3 * largest
    else:
        init_peak = held + 2 * largest + 2 * min(largest, held)
    runtime = RUNTIME_CUDA_MB if run.device == "cuda" else RUNTIME_CPU_MB
    parts = {k: v / MIB for k, v in training.items()}
    training_mb = {**parts, "runtime": runtime}
    if init_peak > sum(training.values()):
        parts = {"tables (initialization)": init_peak / MIB}
    parts["runtime"] = runtime
    if available_mb is None and available_source != "given":
        available_mb, available_source = available_per_rank(run)
    return Estimate(sum(parts.values()), parts, training_mb, available_mb, available_source)


def available_per_rank(run: RunConfig) -> tuple[float | None, str]:
    """Memory one rank may use, and where the number came from."""
    if run.device == "cuda":
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                free = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).free
            finally:
                pynvml.nvmlShutdown()
            return free / MIB, "NVML free memory of GPU 0"
        except Exception as e:  # no NVML: nothing to check against
            return None, f"unknown ({type(e).__name__}: {e})"
    import os

    import psutil

    avail = psutil.virtual_memory().available / MIB
    # Under torchrun/srun only this node's ranks share its memory.
    local = int(os.environ.get("LOCAL_WORLD_SIZE", run.world_size))
    return avail / local, f"{avail / 1024:.1f} GiB available / {local} local ranks"


def _gib(mb: float) -> str:
    return f"{mb / 1024:.1f} GiB"


def what_fits(run: RunConfig, available_mb: float | None = None) -> list[str]:
    """Knobs that bring the run under the available memory (measured, or `available_mb`
    per rank), each checked by estimating."""
    def fits(r: RunConfig, tm: TableMemory | None = None) -> bool:
        if available_mb is not None:
            return estimate(r, tm, available_mb).fits
        return estimate(r, tm, available_source="measure").fits

    knobs = []
    # The item and user tables dominate every preset's tables; the batch and the longest
    # history the activations. The largest value of each that fits alone...
    lowest = {"item_vocab": 2, "user_vocab": 2, "global_batch_size": run.world_size, "max_seq_len": 1}
    for field, low in lowest.items():
        value = largest_fitting(fits, run, field, low)
        if value is not None and value < getattr(run.workload, field):
            knobs.append(f"--set {field}={value}")
    if not knobs:  # ...else all of them halved together until the run fits
        w = run.workload
        for _ in range(40):
            w = dataclasses.replace(w, **{f: max(low, getattr(w, f) // 2) for f, low in lowest.items()})
            if fits(dataclasses.replace(run, workload=w)):
                knobs.append(" ".join(f"--set {f}={getattr(w, f)}" for f in lowest))
                break
    if table_memory_of(run.trainer, run.trainer_options, run.world_size).placement == "replicated":
        for name in ("freescale", "torchrec"):
            try:
                tm = table_memory_of(name, {}, run.world_size)
            except ConfigError:
                continue  # not installed
            if fits(dataclasses.replace(run, trainer=name, trainer_options={}), tm):
                knobs.append(f"--trainer {name} (sharded tables)")
    if run.device == "cuda":  # every rank has its own device: more ranks shrink shards
        for n in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
            if run.world_size < n <= run.workload.global_batch_size and \
                    fits(dataclasses.replace(run, world_size=n)):
                knobs.append(f"--world-size {n}")
                break
    return knobs


def largest_fitting(fits, run: RunConfig, field: str, lowest: int, margin: float = 1.0) -> int | None:
    """The largest value of workload `field` (at most its current value x `margin`, rounded
    down to two significant digits) with which the run fits; None if even `lowest` does not."""
    def with_value(v: int) -> RunConfig:
        return dataclasses.replace(run, workload=dataclasses.replace(run.workload, **{field: v}))

    lo, hi = lowest, max(lowest, int(getattr(run.workload, field) * margin))
    if not fits(with_value(lo)):
        return None
    while hi - lo > max(1, hi // 100):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(with_value(mid)) else (lo, mid)
    return max(lowest, _round_down(lo))


def _round_down(v: int) -> int:
    """Two significant digits, rounded down: an easy number that still fits."""
    scale = 10 ** max(0, len(str(v)) - 2)
    return max(2, v // scale * scale)


_ESTIMATES: dict[str, Estimate] = {}


def run_estimate(run: RunConfig) -> Estimate:
    """The run's estimate against the memory available now, made once per configuration in
    this process: checking it (`check`) and recording it (the manifest) read the same one,
    and the trainers and models it counts bytes of are built once."""
    key = json.dumps(to_dict(run), sort_keys=True, default=str)
    if key not in _ESTIMATES:
        _ESTIMATES[key] = estimate(run, available_source="measure")
    return _ESTIMATES[key]


def check(run: RunConfig, force: bool = False) -> Estimate:
    """Estimate the run; refuse in one line (ConfigError) when it cannot fit, unless forced."""
    est = run_estimate(run)
    if est.fits or force:
        return est
    parts = ", ".join(f"{k} {_gib(v)}" for k, v in est.parts_mb.items() if v >= 0.05 * est.per_rank_mb)
    knobs = what_fits(run)
    raise ConfigError(
        f"{run.workload.name} with {run.trainer} at {run.world_size} rank(s) needs about "
        f"{_gib(est.per_rank_mb)} per rank ({parts}) but {_gib(est.available_mb)} is available per "
        f"rank ({est.available_source}); fits with: "
        f"{'; '.join(knobs) if knobs else 'no single knob'}; or --force to try anyway")
