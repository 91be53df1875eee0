"""Typed, validated configuration: what a workload is and how a run is set up.

Every check lives in `__post_init__` and raises `ConfigError` naming the field, the bad
value and what is allowed; the CLI turns that into one line and exit code 2.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass, field

from fsbench import specs
from fsbench.errors import ConfigError  # re-exported: `from fsbench.config import ConfigError`


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _one_of(name: str, value: object, allowed: typing.Iterable[object]) -> None:
    allowed = list(allowed)
    _require(value in allowed, f"{name}={value!r} is not allowed; choose one of: "
             + ", ".join(str(a) for a in allowed))


def _positive(name: str, value: int | float, minimum: int | float = 1) -> None:
    _require(value >= minimum, f"{name}={value!r} must be >= {minimum}")


# The largest global batch a run may ask for: every rank materializes the whole global
# batch each step (the generator is a pure function of the step), and the memory estimate
# draws batches of it, so a batch beyond this fails on memory before it measures anything.
# 2**24 = 16.8M samples is 64 times the largest weak-scaling batch the simulator uses
# (1024 ranks x 256).
MAX_GLOBAL_BATCH = 2**24
# Seeds go to numpy's SeedSequence and torch.manual_seed; this is the range both take and
# the one people know (numpy's legacy seed range).
MAX_SEED = 2**32 - 1

# Bounds far beyond any model this harness trains, below the sizes at which building the
# model (the memory estimate counts its parameters on the meta device) overflows int64.
MAX_DIM = 2**16
MAX_SEQ_LEN = 2**20
MAX_LAYERS = 1024

MODEL_FAMILIES = ("hstu", "sasrec")
LOSSES = ("sampled", "full")
DATA_ORDERS = ("recent", "epochs")
EVAL_SPLITS = ("last", "valid_test")
OPTIMIZERS = ("adam", "sgd", "adagrad")  # `optimizer=`: both parts at once
# Adam on tables comes in two forms: `adam` steps every row every step (torch.optim.Adam on
# a replicated table: moments decay, rows move, whether or not a step read them);
# `sparse_adam` steps only the rows a step reads (torch.optim.SparseAdam).
TABLE_OPTIMIZERS = ("adagrad", "rowwise_adagrad", "adam", "sparse_adam", "sgd")
DENSE_OPTIMIZERS = ("adam", "adagrad", "sgd")
COMPUTE_MODES = ("model", "synthetic", "emulated")


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelConfig:
    family: str = "hstu"
    """Encoder family: `hstu` (pointwise SiLU attention) or `sasrec` (softmax transformer)."""
    dim: int = 64
    """Hidden width; the tables' too unless `table_dim` says otherwise."""
    table_dim: int = 0
    """Table row width (0: `dim`). A narrower row is projected up to `dim` on the way in
    and the encoder's output down to it for the loss (NVIDIA's HSTU benchmark: rows of
    128 under a model of 1024)."""
    num_layers: int = 2
    """Encoder blocks."""
    num_heads: int = 2
    """Attention heads; must divide dim."""
    loss: str = "sampled"
    """`sampled`: softmax over the target and the batch's shared negatives (real data draws
    them uniformly, so the logit learns log p(item | history) up to a constant); `full`:
    softmax over every item (the negatives are all item ids; for small catalogues)."""
    user_features: bool = True
    """Real data: whether a sample shows who its user is (user id, and the context ids
    hashed from it). Off, every sample shows one anonymous user, so the user and context
    tables serve one shared row each (a learned bias) and the model sees only the history,
    as SASRec and RecBole's SASRec do. `fsbench quality` turns it off: a user's own
    embedding memorizes the items of their training history, which in data where nobody
    interacts with an item twice (MovieLens) are exactly the items the held-out one is not."""
    dropout: float = 0.0
    """Hidden dropout probability in [0, 1) on the input embeddings and each block's
    residual branches, drawn by token, not by rank (fsbench.models.dropout), so every
    trainer still computes the same function of the global batch."""

    def __post_init__(self) -> None:
        _one_of("model.family", self.family, MODEL_FAMILIES)
        _require(0.0 <= self.dropout < 1.0, f"model.dropout={self.dropout} must be in [0, 1)")
        _one_of("model.loss", self.loss, LOSSES)
        _positive("model.dim", self.dim)
        _require(self.dim <= MAX_DIM, f"model.dim={self.dim} must be <= {MAX_DIM} (2**16)")
        _require(0 <= self.table_dim <= MAX_DIM,
                 f"model.table_dim={self.table_dim} must be in [0, {MAX_DIM}] (0: model.dim)")
        _positive("model.num_layers", self.num_layers)
        _require(self.num_layers <= MAX_LAYERS,
                 f"model.num_layers={self.num_layers} must be <= {MAX_LAYERS}")
        _positive("model.num_heads", self.num_heads)
        _require(self.dim % self.num_heads == 0,
                 f"model.dim={self.dim} must be divisible by model.num_heads={self.num_heads}")

    @property
    def row_dim(self) -> int:
        """Each table row's width."""
        return self.table_dim or self.dim


@dataclass(kw_only=True, slots=True, frozen=True)
class OptimizerParts:
    """`--set optimizer.<field>=...`: a part's own optimizer and learning rate (unset: the
    workload's `optimizer` and `lr`, which set both parts)."""
    tables: str | None = None
    """The tables' (TABLE_OPTIMIZERS; rowwise_adagrad: one accumulator per row, as fbgemm's)."""
    tables_lr: float | None = None
    dense: str | None = None
    """Every other parameter's (DENSE_OPTIMIZERS)."""
    dense_lr: float | None = None

    def __post_init__(self) -> None:
        if self.tables is not None:
            _one_of("optimizer.tables", self.tables, TABLE_OPTIMIZERS)
        if self.dense is not None:
            _one_of("optimizer.dense", self.dense, DENSE_OPTIMIZERS)
        for name, lr in (("tables_lr", self.tables_lr), ("dense_lr", self.dense_lr)):
            _require(lr is None or lr > 0, f"optimizer.{name}={lr} must be > 0")


@dataclass(kw_only=True, slots=True, frozen=True)
class SyntheticComputeConfig:
    """Ground-truth compute (`compute=synthetic`): each target token costs a known amount
    of thread CPU time, so every metric has a closed-form expected value."""
    us_per_token: float = 1000.0
    """CPU time per target token, forward + backward (a third in forward)."""
    slow_rank: int = -1
    """Rank that computes more than its share (-1: none)."""
    slow_factor: float = 0.0
    """The slow rank's cost is (1 + slow_factor) times its tokens' cost."""
    comm_delay_ms: float = 0.0
    """Every rank waits this long (sleeping, no CPU) before its gradient collective, with a
    collective in flight: a slow network (exposed communication)."""
    input_delay_ms: float = 0.0
    """Producing each global batch takes this long (sleeping): a slow data source."""
    optimizer_sleep_ms: float = 0.0
    """Every rank sleeps this long in its optimizer step, no collective in flight (a host
    sync, a file read): blocked time that is other idle, not communication."""

    def __post_init__(self) -> None:
        _require(self.us_per_token > 0, f"synthetic.us_per_token={self.us_per_token} must be > 0")
        _require(self.slow_rank >= -1, f"synthetic.slow_rank={self.slow_rank} must be >= -1")
        _require(self.slow_factor >= 0, f"synthetic.slow_factor={self.slow_factor} must be >= 0")
        _require(self.comm_delay_ms >= 0,
                 f"synthetic.comm_delay_ms={self.comm_delay_ms} must be >= 0")
        _require(self.input_delay_ms >= 0,
                 f"synthetic.input_delay_ms={self.input_delay_ms} must be >= 0")
        _require(self.optimizer_sleep_ms >= 0,
                 f"synthetic.optimizer_sleep_ms={self.optimizer_sleep_ms} must be >= 0")


@dataclass(kw_only=True, slots=True, frozen=True)
class WorkloadConfig:
    name: str
    """Preset name this config came from (after overrides it keeps the name)."""
    version: int = 1
    """Bumped whenever a preset's numbers change, so stored runs stay comparable."""
    model: ModelConfig = field(default_factory=ModelConfig)
    item_vocab: int = 10_000
    """Rows of the item table (id 0 is padding)."""
    user_vocab: int = 1_000
    """Rows of the user table."""
    context_vocabs: tuple[int, ...] = (100, 20, 10)
    """Rows of each categorical context table (one id per sample each)."""
    max_seq_len: int = 50
    """Histories longer than this are clipped (the most recent items are kept)."""
    global_batch_size: int = 32
    """Samples per step summed over all ranks (the same at every world size)."""
    steps: int = 10
    """Steps per run, warm-up included."""
    warmup: int = 2
    """Leading steps that are run but not measured."""
    lengths: str = "amazon-beauty"
    """History-length distribution: a dataset preset, fixed:L, uniform:LO-HI,
    lognormal:mu=..,sigma=..[,shift=..,min=..,max=..,mode=truncate|clip],
    powerlaw:alpha=..,xmin=..[,scale=..][,shift=..], or hist:PATH (a length_bin,count CSV)."""
    popularity: str = "zipf:1.0"
    """Item popularity: zipf:S (rank exponent S over the item vocabulary)."""
    num_negatives: int = 64
    """Sampled negatives per batch for the sampled-softmax loss."""
    optimizer: str = "adam"
    """Both parts' optimizer (OPTIMIZERS; adam on tables is the dense form) and `lr`, theirs."""
    lr: float = 1e-3
    optimizer_parts: OptimizerParts = field(default_factory=OptimizerParts)
    """What `--set optimizer.<part>[_lr]=...` gives a part instead of `optimizer`/`lr`."""
    data: str = "synthetic"
    """Where histories come from: synthetic, sasrec:PATH, recbole:PATH or otto:PATH."""
    data_order: str = "recent"
    """Real data only. `recent`: each step a seeded draw of users, each sample a user's most
    recent max_seq_len + 1 items; `epochs`: every training target once per epoch, in
    windows of max_seq_len + 1 items from each history's end, shuffled per epoch
    (fsbench quality)."""
    window_targets: int = 0
    """data_order=epochs: the targets each window of max_seq_len inputs trains, its last
    ones (0: max_seq_len, windows that do not overlap, whose first targets see few
    items). Each trained target then sees at least max_seq_len - window_targets + 1 items
    of its history (or all of it), closer to the max_seq_len items the evaluation's
    prediction sees, at about max_seq_len / window_targets times the compute per target;
    1 is RecBole's every-prefix training."""
    compute: str = "model"
    """What a sample's compute is: `model` (the reference model), `synthetic` (a CPU
    spin of known cost per token, a device sleep kernel on CUDA: the harness's ground
    truth) or `emulated` (the real
    runtime with the encoder's compute replaced by waiting for its calibrated cost:
    fsbench.models.emulation)."""
    synthetic: SyntheticComputeConfig = field(default_factory=SyntheticComputeConfig)
    """Costs and injected delays of `compute=synthetic`."""
    dense_bucket_mb: float = 4.0
    """The dense gradients' all-reduce buckets, every trainer's (DDP's bucket_cap_mb,
    DeepSpeed's reduce_bucket_size). The last bucket is ready only when the backward ends,
    so what it holds is exposed; each bucket more pays a call's latency. 4, not DDP's 25:
    a dense part up to 25 MiB (`medium`: 7 MiB) in one bucket left the whole all-reduce
    after the backward. Simulated on `medium` at 8..1024 H100s, each bucket an NCCL call
    with its own latency, 4 lowered FreeScale's and the sharded baseline's bubble at 8, 64
    and 256 GPUs against 25 and matched 2 within a point; ddp's moved by 0.2 points
    (docs/simulation.md, "Dense buckets")."""

    def __post_init__(self) -> None:
        _positive("item_vocab", self.item_vocab, 2)
        _positive("user_vocab", self.user_vocab, 2)
        _require(all(v >= 2 for v in self.context_vocabs),
                 f"context_vocabs={self.context_vocabs!r}: every table needs >= 2 rows")
        _positive("max_seq_len", self.max_seq_len)
        _require(self.max_seq_len <= MAX_SEQ_LEN,
                 f"max_seq_len={self.max_seq_len} must be <= {MAX_SEQ_LEN:,} (2**20)")
        _positive("global_batch_size", self.global_batch_size)
        _require(self.global_batch_size <= MAX_GLOBAL_BATCH,
                 f"global_batch_size={self.global_batch_size} must be <= {MAX_GLOBAL_BATCH:,} "
                 "(2**24: every rank holds the whole global batch each step)")
        _positive("steps", self.steps)
        _require(0 <= self.warmup < self.steps,
                 f"warmup={self.warmup} must be >= 0 and < steps={self.steps}")
        _positive("num_negatives", self.num_negatives)
        _require(0 < self.dense_bucket_mb <= 1024, f"dense_bucket_mb={self.dense_bucket_mb} must be in (0, 1024]")
        _one_of("optimizer", self.optimizer, OPTIMIZERS)
        _require(self.lr > 0, f"lr={self.lr} must be > 0")
        _one_of("compute", self.compute, COMPUTE_MODES)
        _one_of("data_order", self.data_order, DATA_ORDERS)
        _require(0 <= self.window_targets <= self.max_seq_len,
                 f"window_targets={self.window_targets} must be in 0..max_seq_len={self.max_seq_len} "
                 "(0: max_seq_len)")
        # Parse the distribution and data specs now, so a typo fails before any rank starts.
        # fsbench.specs is standard library only: no numpy, no torch, no fsbench.workloads.
        specs.parse_lengths(self.lengths)
        specs.parse_popularity(self.popularity)
        data = specs.parse_data(self.data)
        _require(self.data_order == "recent" or data.kind != "synthetic",
                 f"data_order={self.data_order!r} orders real histories: "
                 "--set data=sasrec:PATH|recbole:PATH|otto:PATH")

    # Each part's optimizer and learning rate: its own (optimizer.<part>), else both parts'.
    table_optimizer = property(lambda self: self.optimizer_parts.tables or self.optimizer)
    table_lr = property(lambda self: self.optimizer_parts.tables_lr or self.lr)
    dense_optimizer = property(lambda self: self.optimizer_parts.dense or self.optimizer)
    dense_lr = property(lambda self: self.optimizer_parts.dense_lr or self.lr)

    @property
    def negatives_per_step(self) -> int:
        """The negatives each step's loss scores: `num_negatives`, or with model.loss=full
        every item id (item_vocab - 1; a real data set sizes item_vocab to its items)."""
        return self.item_vocab - 1 if self.model.loss == "full" else self.num_negatives


@dataclass(kw_only=True, slots=True, frozen=True)
class EvalConfig:
    """Quality beside speed (fsbench.training.evaluate): each user's last item held out of training,
    HR@10 and NDCG@10 over the full item set after training (real data only)."""
    on: bool = False
    """Hold out each user's last item from training; evaluate the trained model on it."""
    every: int = 0
    """Also evaluate after every `every` steps (0: only after the last step)."""
    target_hr10: float | None = None
    """Time to quality: training time until HR@10 first reaches this (None: not asked)."""
    split: str = "last"
    """`last`: each user's last item is held out and tested; `valid_test` (RecBole's
    leave-one-out `valid_and_test`): the second-to-last item is held out too and scored as
    validation, every evaluation scoring both."""
    patience: int = 0
    """Early stopping, as RecBole stops: end the run once this many evaluations in a row
    found no better validation NDCG@10 than the best so far (0: train every step)."""

    def __post_init__(self) -> None:
        _positive("eval.every", self.every, 0)
        _positive("eval.patience", self.patience, 0)
        _one_of("eval.split", self.split, EVAL_SPLITS)
        _require(self.patience == 0 or (self.split == "valid_test" and self.every > 0),
                 f"eval.patience={self.patience} needs validation scores: eval.split=valid_test "
                 f"and eval.every > 0")
        if self.target_hr10 is not None:
            _require(0 < self.target_hr10 <= 1,
                     f"eval.target_hr10={self.target_hr10!r} must be in (0, 1]")
        _require(self.on or (self.every == 0 and self.target_hr10 is None),
                 f"eval.every={self.every} / eval.target_hr10={self.target_hr10} need eval.on")


@dataclass(kw_only=True, slots=True, frozen=True)
class RunConfig:
    workload: WorkloadConfig
    trainer: str
    """Trainer name, resolved at run time (`fsbench list` shows them)."""
    world_size: int = 1
    seed: int = 0
    """Seeds the data generator and the initial weights (same on every rank)."""
    backend: str = "auto"
    """torch.distributed backend: auto (nccl on CUDA, else gloo), gloo or nccl."""
    device: str = "cpu"
    """cpu or cuda."""
    threads_per_rank: int = 1
    """OMP/intra-op threads per rank; 1 keeps thread CPU time an honest busy measure."""
    trainer_options: dict[str, str] = field(default_factory=dict)
    """Trainer-specific switches from `--set <trainer>.<key>=value`."""
    input_workers: int = 1
    """Data-loader worker processes per rank preparing inputs ahead (0: prepare inline,
    at the step's pull, all of it input stall)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation of the trained model (`--eval`): changes the training data (held-out items)."""

    def __post_init__(self) -> None:
        _positive("world_size", self.world_size)
        _require(0 <= self.seed <= MAX_SEED, f"seed={self.seed} must be in 0..{MAX_SEED} (2**32 - 1)")
        _one_of("backend", self.backend, ("auto", "gloo", "nccl"))
        _one_of("device", self.device, ("cpu", "cuda"))
        _positive("threads_per_rank", self.threads_per_rank)
        _positive("input_workers", self.input_workers, 0)
        _require(self.workload.global_batch_size >= self.world_size,
                 f"world_size={self.world_size} exceeds global_batch_size="
                 f"{self.workload.global_batch_size}: every rank needs at least one sample")
        if self.eval.on:
            _require(specs.parse_data(self.workload.data).kind != "synthetic",
                     "--eval needs real interaction data to hold items out of: "
                     "--set data=sasrec:PATH|recbole:PATH|otto:PATH")
            _require(self.workload.compute == "model",
                     f"--eval needs compute=model (compute={self.workload.compute!r} trains "
                     "no reference model to evaluate)")

    @property
    def held_out_items(self) -> int:
        """Items held out of training at the end of each user's history: 0 without
        evaluation, 1 (test), or 2 (validation and test)."""
        return 0 if not self.eval.on else (2 if self.eval.split == "valid_test" else 1)

    @property
    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.device == "cuda" else "gloo"
