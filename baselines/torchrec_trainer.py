"""TorchRec baseline: DistributedModelParallel + TrainPipelineSparseDist.

What a team gets from TorchRec's standard recipe. The embedding tables are sharded across
ranks (table-wise or row-wise) in TorchRec collections (see `torchrec_model`) and updated
by fbgemm's fused optimizer inside backward; the dense part is replicated and wrapped in
DDP by DMP; training runs through a TorchRec train pipeline that pulls this rank's
contiguous share of each global batch from an iterator and, with the sparse pipeline,
overlaps the next batch's input distribution (id all-to-all) with this batch's work.

Switches (`--set torchrec.<key>=<value>`):
  sharding   table_wise (default) | row_wise
  pipeline   sparse (TrainPipelineSparseDist, default) | base (TrainPipelineBase: no overlap)

Optimizers: the table optimizer (`optimizer.tables`) sgd | adagrad | rowwise_adagrad |
sparse_adam maps to fbgemm's EXACT_SGD | EXACT_ADAGRAD | EXACT_ROWWISE_ADAGRAD | ADAM,
with the constants of the torch optimizer the replicated trainers use
(fsbench.training.optim); the dense part gets its own torch optimizer (`optimizer.dense`).
fbgemm 1.8 has no CPU kernel for fused Adam ("Optimizer adam is not supported in CPU
mode"; its CPU kernels are exact_sgd, exact_adagrad, exact_row_wise_adagrad), and
TorchRec's non-fused DENSE kernel cannot serve an EmbeddingCollection on CPU (fbgemm's CPU
dense TBE ignores PoolingMode.NONE and returns pooled rows, which corrupts the sequence
all-to-all), so on CPU the tables take sgd, adagrad or rowwise_adagrad. Fused Adam (CUDA)
is row-sparse: rows absent from a batch keep their weights and
moments, as torch.optim.SparseAdam's (`sparse_adam`), not torch.optim.Adam's, which moves
every row that ever had a gradient (`adam`: refused, as every unsupported table optimizer
is, before any rank starts: `check_run`). Not yet run on a GPU.

Same function as every trainer (ARCHITECTURE.md, seam 2), and how the gradients get there:
  The loss on each rank is its samples' summed token losses / the GLOBAL target count, so
  the single-process gradient of the global batch is the SUM over ranks of the per-rank
  gradients. DMP, by default, AVERAGES both kinds of gradients over the N ranks:
  * dense part: wrapped in DDP, whose all-reduce divides by N;
  * sharded tables: the output-embedding gradients travel back to the rows' owner through
    the backward all-to-all (or reduce-scatter's backward), and TorchRec's comm ops divide
    them by N on the way (torchrec.distributed.comm_ops GRADIENT_DIVISION, default True),
    so that the fused update sees the same averaged gradient DDP would give.
  So, as in the DDP trainer, the backpropagated loss is scaled by N (TorchRecModel's
  grad_scale): both kinds then equal exactly the single-process gradient. The trainer pins
  GRADIENT_DIVISION to True so the scaling cannot silently become wrong. Checked in
  tests/test_torchrec_trainer.py: loss trajectories under SGD (scale-sensitive, unlike
  Adam/Adagrad whose first updates ignore the gradient's scale) equal DDP's, and an
  explicit probe compares every updated table row and dense weight after one step with
  the single-process SGD step.
"""
from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.nn.parallel import DistributedDataParallel
from torchrec.distributed.comm_ops import set_gradient_division
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel
from torchrec.distributed.train_pipeline import (
    TrainPipelineBase,
    TrainPipelineSparseDist,
)
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

from baselines.torchrec_model import TorchRecBatch, TorchRecModel
from baselines.torchrec_sharding import (collections_of, fused_params, initial_dense, load_initial_tables,
                                         manual_plan, planner_plan, recmodel_key)
from fsbench.config import ConfigError, RunConfig
from fsbench.training.dist import RankContext
from fsbench.measurement.flights import FrameworkFlights, allreduce_in_python
from fsbench.models import model_from_state, table_specs
from fsbench.training.optim import make_dense_optimizer
from fsbench.measurement.timeline import span
from fsbench.training.inputs import ContiguousShare
from fsbench.training.table_memory import TableMemory, sharded
from fsbench.options import TrainerOptions
from fsbench.training.trainer import Preparer, StepInput, StepStats


@dataclass(frozen=True, kw_only=True)
class TorchRecOptions(TrainerOptions):
    sharding: Literal["table_wise", "row_wise"] = "table_wise"
    pipeline: Literal["sparse", "base"] = "sparse"
    """sparse: TrainPipelineSparseDist (next batch's input dist overlapped); base: none."""

class _PipelineBatches:
    """The pipeline's data iterator over the harness's prepared inputs: each pull takes
    the next StepInput (an `input` span, in the harness's iterator) and hands TorchRec its
    `TorchRecBatch`, built here (~0.13 ms on `small`; KJTs sent from the loader worker
    would cost ~3 ms of this thread's CPU to receive: torch's shared-memory transport). The pipeline pulls up to two batches ahead of the step it trains;
    `issued` remembers what was handed out, in order, so the trainer can report the step
    it trained."""

    def __init__(self, inputs) -> None:
        self.inputs = inputs
        self.issued: collections.deque[StepInput] = collections.deque()

    def __iter__(self) -> _PipelineBatches:
        return self

    def __next__(self) -> TorchRecBatch:
        prepared = next(self.inputs)
        self.issued.append(prepared)
        with span("to_kjt", kind="input"):
            return TorchRecBatch.from_jagged(prepared.batches[0])


class _SpannedOptimizer:
    """What the pipeline steps: the combined (fused + dense) optimizer, timed. The table
    updates already happened inside backward; `step` updates the dense part."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def zero_grad(self, set_to_none: bool = True) -> None:
        with span("optimizer"):
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> None:
        with span("optimizer"):
            self.optimizer.step()


class _SpannedForward(nn.Module):
    """TrainPipelineBase calls its model directly (it has no forward hook of its own)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: TorchRecBatch) -> tuple[torch.Tensor, torch.Tensor]:
        with span("forward"):
            return self.model(batch)


class _SpannedSparseDistPipeline(TrainPipelineSparseDist):
    """TrainPipelineSparseDist with the phases it lets a subclass see marked as spans."""

    def _backward(self, losses: torch.Tensor) -> None:
        with span("backward"):
            super()._backward(losses)

    def start_sparse_data_dist(self, batch, context) -> None:  # type: ignore[override]
        with span("input_dist", kind="comm"):
            super().start_sparse_data_dist(batch, context)

    def wait_sparse_data_dist(self, context) -> None:  # type: ignore[override]
        with span("input_dist", kind="comm"):
            super().wait_sparse_data_dist(context)


class _SpannedBasePipeline(TrainPipelineBase):
    def _backward(self, losses: torch.Tensor) -> None:
        with span("backward"):
            super()._backward(losses)


class TorchRecTrainer:
    Options = TorchRecOptions
    options: TorchRecOptions

    @classmethod
    def check_run(cls, run: RunConfig) -> None:
        """Before any rank starts: a table optimizer fbgemm's fused kernels run here."""
        fused_params(run.workload.table_optimizer, run.workload.table_lr, torch.device(run.device))

    @staticmethod
    def table_memory(options: dict[str, str], world_size: int) -> TableMemory:
        """Sharded tables updated by the fused optimizer inside backward: no gradient kept."""
        return sharded("row" if options["sharding"] == "row_wise" else "table")

    @staticmethod
    def sim_profile(options: dict[str, str], world_size: int):
        """What `fsbench simulate` models of TorchRec: a contiguous split, sharded tables
        whose lookups' all-to-all the forward waits for (blocking), and the input dist:
        ids bucketed on the device, a split all-to-all of lengths and ids in the sparse
        pipeline's previous-step slot (no host routing). pipeline=base issues it inside
        the step; it is modelled as the sparse pipeline."""
        from baselines.torchrec_schedule import torchrec_step_program
        from fsbench.scaling.sim_inputs import SimProfile

        return SimProfile(tables=TorchRecTrainer.table_memory(options, world_size), exchange="blocking",
                          program=lambda buckets, _gpus_per_node, _chunks, _workload=None, _growth=1.0, _gpu=False, _route="": torchrec_step_program(buckets, options.get("pipeline", "sparse")))

    notes = (
        "TorchRec DMP + train pipeline, fused (fbgemm) table updates inside backward. Spans: "
        "forward, backward and optimizer are compute and partition the work of progress() "
        "(no outer train_step span: busy time sums compute spans, so nesting would count it "
        "twice). The contiguous share is built by the harness's input pipeline (a loader "
        "worker), its KJTs at the pull (to_kjt, an input span); the pipeline pulls batch "
        "k+1 (and k+2 at the start) during step k. input_dist (comm) is the sparse pipeline's start/wait of the NEXT "
        "batch's id all-to-all, which it overlaps with this batch. TorchRec hides the rest of "
        "its communication: the embedding lookups and their output all-to-all sit inside "
        "forward; the embedding-gradient all-to-all, DDP's dense all-reduce and the fused "
        "table updates sit inside backward (optimizer is only the dense step and zero_grad). "
        "With pipeline=base the whole input dist also runs inside forward. Pipeline "
        "bookkeeping between these spans is in no span. Fused Adam (CUDA only, "
        "optimizer.tables=sparse_adam) is row-sparse: rows absent from a batch keep weights "
        "and moments, as torch.optim.SparseAdam's."
    )

    def setup(self, ctx: RankContext, run: RunConfig, source) -> None:
        self.ctx, self.run, self.source = ctx, run, source
        opts = self.options
        wl = run.workload
        if wl.compute == "synthetic":
            raise ConfigError("the torchrec trainer trains the reference model; "
                              "compute=synthetic is not supported")
        if wl.global_batch_size % ctx.world_size:
            # TorchRec's pooled (EmbeddingBagCollection) dists assume the same local batch
            # size on every rank unless variable-batch KJTs are used.
            raise ConfigError(f"the torchrec trainer needs global_batch_size "
                              f"({wl.global_batch_size}) divisible by the world size "
                              f"({ctx.world_size})")
        fused = fused_params(wl.table_optimizer, wl.table_lr, ctx.device)

        specs = table_specs(wl.model.row_dim, wl.item_vocab, wl.user_vocab, wl.context_vocabs)
        dense = initial_dense(wl, run.seed)
        # DMP averages dense AND sparse gradients over ranks; scaling the loss by N makes
        # both the single-process gradient (module docstring). Pin the sparse averaging
        # this relies on (it is TorchRec's default).
        set_gradient_division(True)
        model = TorchRecModel(specs, dense, device="meta", grad_scale=ctx.world_size)

        sharders = {"sequence": EmbeddingCollectionSharder(fused_params=fused),
                    "pooled": EmbeddingBagCollectionSharder(fused_params=fused)}
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size))
        # TorchRec's collectives run inside forward and backward: recorded as flights, so
        # that their waits are booked as communication (fsbench.measurement.flights).
        self.flights = FrameworkFlights()
        if ctx.device.type == "cuda":  # NOT YET RUN ON A GPU (this path; see planner_plan)
            self.plan = planner_plan(model, sharders, opts.sharding, ctx.world_size,
                                     local_size, ctx.group)
        else:
            self.plan = manual_plan(model, sharders, opts.sharding, ctx.world_size,
                                    local_size, ctx.device.type)
        # The dense part's DDP buckets: the workload's, as every trainer's.
        wrapper = DefaultDataParallelWrapper(bucket_cap_mb=wl.dense_bucket_mb)
        self.dmp = DistributedModelParallel(module=model, device=ctx.device, plan=self.plan,
                                            sharders=list(sharders.values()), data_parallel_wrapper=wrapper)
        load_initial_tables(self.dmp.module, specs, run.seed)
        if isinstance(self.dmp._dmp_wrapped_module, DistributedDataParallel):  # the dense part
            allreduce_in_python(self.dmp._dmp_wrapped_module)

        # The dense part gets the torch optimizer the DDP trainer uses. The tables are
        # updated inside backward; DMP's fused_optimizer stands for them (step() is a no-op).
        # (The collections also list empty placeholder parameters for tables a rank does
        # not hold; they belong to no optimizer.)
        dense_params = {n: p for n, p in self.dmp.named_parameters()
                        if not n.startswith(tuple(f"{c}." for c in collections_of(model)))}
        keyed = KeyedOptimizerWrapper(dense_params, lambda ps: make_dense_optimizer(ps, wl))
        self.optimizer = CombinedOptimizer([self.dmp.fused_optimizer, keyed])
        self.dmp.train()

        self.batches: _PipelineBatches | None = None
        spanned_opt = _SpannedOptimizer(self.optimizer)
        if opts.pipeline == "sparse":
            dmp = self.dmp

            def timed_forward(batch: TorchRecBatch) -> tuple[torch.Tensor, torch.Tensor]:
                with span("forward"):
                    return dmp(batch)

            self.pipeline = _SpannedSparseDistPipeline(
                model=self.dmp, optimizer=spanned_opt, device=ctx.device,
                custom_model_fwd=timed_forward)
        else:
            self.pipeline = _SpannedBasePipeline(
                model=_SpannedForward(self.dmp), optimizer=spanned_opt, device=ctx.device)

    def make_preparer(self) -> Preparer:
        """The contiguous share; its KJTs are built at the pull (`_PipelineBatches`)."""
        return ContiguousShare(self.source, self.ctx.rank, self.ctx.world_size)

    def step(self, inputs) -> StepStats:
        if self.batches is None or self.batches.inputs is not inputs:
            self.batches = _PipelineBatches(inputs)
        output = self.pipeline.progress(self.batches)
        trained = self.batches.issued.popleft()
        # on CUDA a sync point, after the step's work is queued (as in the DDP trainer)
        return StepStats(loss=float(output.item()), num_samples=trained.num_samples,
                         num_targets=trained.num_targets, step=trained.step)

    def trained_model(self) -> nn.Module | None:
        """The trained model as a CPU `RecModel` on rank 0 (None elsewhere): each sharded
        table gathered whole (ShardedTensor.gather, a collective on every rank), the
        dense replica copied. Between steps the fused updates of step k are applied; the
        pipeline's input dist for later batches reads no weights."""
        full = {}
        for key, value in self.dmp.module.state_dict().items():
            if isinstance(value, ShardedTensor):
                out = (torch.empty(value.size(), dtype=value.dtype)
                       if self.ctx.is_main else None)
                value.gather(dst=0, out=out)
                value = out
            full[recmodel_key(key)] = value
        if not self.ctx.is_main:
            return None
        return model_from_state(self.run.workload, full)

    def close(self) -> None:
        self.pipeline = None
        self.dmp = None
        if getattr(self, "flights", None) is not None:
            self.flights.close()
