"""DeepSpeed ZeRO baseline: the shared reference model under `deepspeed.initialize`.

What a team gets by handing the model to DeepSpeed: each rank takes a contiguous slice of
the global batch (like the DDP baseline), and DeepSpeed's engine owns gradient reduction
and the optimizer, with ZeRO stage 0 (plain data parallel), 1 (optimizer state
partitioned), 2 (+ gradients partitioned) or 3 (+ parameters partitioned):
`--set deepspeed.zero_stage=N`, default 2.

The DeepSpeed config is built in code (`ds_config`), never read from a file, so a run's
manifest (its frozen RunConfig) fully determines it:
- fp32 throughout (no fp16/bf16, so no loss scaling), no gradient clipping,
  gradient_accumulation_steps 1;
- the workload's optimizer through DeepSpeed's own config: Adam as
  `{"type": "Adam", "params": {"torch_adam": true, "adam_w_mode": false}}`, which makes
  DeepSpeed build `torch.optim.Adam` (its default for "Adam" is AdamW, and its own
  fused/CPU Adam is a ~100 s compile on CPU); SGD and Adagrad map to `torch.optim.SGD` and
  `torch.optim.Adagrad`. Always `foreach=False`, as `fsbench.training.optim` does. One
  optimizer for the whole model; parts (tables, dense) with their own lr are two param
  groups (not with Adagrad); other per-part choices are refused before any rank starts;
- `train_micro_batch_size_per_gpu` is ceil(global batch / world size), the largest
  contiguous slice. It is nominal: DeepSpeed uses it for its own data loader and
  throughput logging, neither of which runs here; our data is the global batch of
  `fsbench.workloads`, sliced by `JaggedBatch.contiguous_slice`.

Running on CPU: DeepSpeed picks its accelerator once, on first use during `import
deepspeed`, so `DS_ACCELERATOR=cpu` is set below before that import when torch has no
CUDA. Its CPU accelerator communicates over gloo (oneCCL is not installed), and
`deepspeed.init_distributed` reuses the process group fsbench already created (DeepSpeed
wraps an initialized torch.distributed instead of initializing a new one; `setup` checks
that). That first `init_distributed` also JIT-compiles DeepSpeed's shared-memory comm op
(`deepspeed_shm_comm`, g++, 40-60 s on 2 cores); training never calls it (it serves
DeepSpeed's inference all-reduce, and its /dev/shm workspace is only created when
LOCAL_SIZE equals the world size, which fsbench does not set), but DeepSpeed loads it
unconditionally, so it is cached in a persistent TORCH_EXTENSIONS_DIR (see below).
"""
from __future__ import annotations

import contextlib
import math
import os
import warnings
from pathlib import Path

import torch

# DeepSpeed reads DS_ACCELERATOR exactly once, when `import deepspeed` first asks for the
# accelerator; after that the choice is fixed for the process. Without the variable it
# auto-detects (probing for XPU/NPU/MPS/HPU/... packages, then CUDA) and falls back to
# CPU with a warning; setting it makes the CPU choice explicit and quiet. setdefault: a
# user's own DS_ACCELERATOR wins (and `setup` then checks it matches the run's device).
if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _default_extensions_dir() -> Path | None:
    """`<repo>/.torch_extensions` (git-ignored) when this file sits in a source checkout;
    None elsewhere (an installed wheel), leaving torch's own default
    (~/.cache/torch_extensions), which persists too."""
    repo = Path(__file__).resolve().parents[1]
    return repo / ".torch_extensions" if (repo / "pyproject.toml").is_file() else None


# Where torch.utils.cpp_extension builds and caches DeepSpeed's JIT ops. Persistent, so
# the shm comm op is compiled once per checkout and only loaded (well under a second) by
# later runs; concurrent ranks share one build through torch's lock file in that folder.
# An existing TORCH_EXTENSIONS_DIR is respected.
if "TORCH_EXTENSIONS_DIR" not in os.environ and _default_extensions_dir() is not None:
    os.environ["TORCH_EXTENSIONS_DIR"] = str(_default_extensions_dir())

try:
    import deepspeed
    import deepspeed.comm as ds_comm
    from deepspeed.accelerator import get_accelerator
except ImportError as e:  # fsbench.training.trainer turns this into a one-line ConfigError
    raise ImportError(
        f"the deepspeed trainer needs DeepSpeed ({e}); install it with: "
        "DS_BUILD_OPS=0 pip install -e '.[deepspeed]'", name=e.name or "deepspeed") from e

import torch.distributed as dist

# DeepSpeed 0.19.8 calls these torch 2.13-deprecated collectives from ZeRO's hot path;
# torch repeats the FutureWarning (~2 per step at ZeRO 3), flooding the rank logs.
warnings.filterwarnings(
    "ignore", category=FutureWarning,
    message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated")

from dataclasses import dataclass
from typing import Literal

from fsbench.config import ConfigError, RunConfig
from fsbench.training.dist import RankContext
from fsbench.measurement.flights import FrameworkFlights
from fsbench.training.inputs import ContiguousShare
from fsbench.training.table_memory import TableMemory
from fsbench.models import build_model, model_from_state
from fsbench.options import TrainerOptions
from fsbench.measurement.timeline import span
from fsbench.training.optim import model_parts
from fsbench.training.trainer import Preparer, StepStats


@dataclass(frozen=True, kw_only=True)
class DeepSpeedOptions(TrainerOptions):
    zero_stage: Literal["0", "1", "2", "3"] = "2"
    """ZeRO stage: 0 plain data parallel, 1 optimizer state, 2 + gradients, 3 + parameters."""


# DeepSpeed's config names one optimizer for the whole model, and ZeRO flattens the
# parameters of each param group into partitions: parts with their own learning rates are
# two groups of one elementwise optimizer. (A row-wise or row-sparse table optimizer has no
# rows in a flat partition; and ZeRO 1/2 rebuild torch's Adagrad over their partitions as
# one group, which fails with two: DeepSpeed 0.19.8, stage_1_and_2.py.)
ONE_OPTIMIZER = ("adam", "adagrad", "sgd")


def check_one_optimizer(workload) -> None:
    """Refuse, in one line, per-part optimizers DeepSpeed's config cannot express."""
    tables, dense = workload.table_optimizer, workload.dense_optimizer
    if tables != dense or tables not in ONE_OPTIMIZER:
        raise ConfigError(
            f"the deepspeed trainer steps tables and dense part with one optimizer: "
            f"optimizer.tables={tables} and optimizer.dense={dense} must be the same one of "
            f"{', '.join(ONE_OPTIMIZER)} (adam and sgd: each part may have its own lr)")
    if tables == "adagrad" and workload.table_lr != workload.dense_lr:
        raise ConfigError(
            f"the deepspeed trainer's Adagrad takes one lr (ZeRO rebuilds it as one param "
            f"group): optimizer.tables_lr={workload.table_lr:g} and optimizer.dense_lr="
            f"{workload.dense_lr:g} must be equal (--set lr=X)")


def param_groups(model: torch.nn.Module, workload) -> list[dict]:
    """The model's parameters as one param group where both parts share the lr, else the
    tables and the dense part as two, each with its part's lr."""
    if workload.table_lr == workload.dense_lr:
        return [{"params": list(model.parameters()), "lr": workload.dense_lr}]
    tables, dense = model_parts(model)
    return [{"params": dense, "lr": workload.dense_lr}, {"params": tables, "lr": workload.table_lr}]


def ds_config(run: RunConfig, world_size: int, zero_stage: int) -> dict:
    """The DeepSpeed config for this run (a plain dict, as `deepspeed.initialize` takes)."""
    workload = run.workload
    check_one_optimizer(workload)
    name, lr = workload.dense_optimizer, workload.dense_lr
    if name == "adam":
        # torch_adam: torch.optim.Adam instead of DeepSpeed's compiled FusedAdam/CPUAdam.
        # adam_w_mode=False: DeepSpeed's "Adam" means AdamW (decoupled weight decay) unless
        # told otherwise. foreach is popped by DeepSpeed and passed to torch's Adam.
        optimizer = {"type": "Adam", "params": {"lr": lr, "torch_adam": True,
                                                 "adam_w_mode": False, "foreach": False}}
    elif name == "adagrad":
        # Without CPU offload DeepSpeed builds torch.optim.Adagrad (DeepSpeedCPUAdagrad only
        # with offload_optimizer, which we never configure).
        optimizer = {"type": "Adagrad", "params": {"lr": lr, "foreach": False}}
    else:
        # sgd is not a DeepSpeed optimizer name: DeepSpeed falls through to getattr(torch.optim,
        # "SGD"); ZeRO calls it "untested" (zero_allow_untested_optimizer below). Plain SGD
        # is elementwise, so it is exact on ZeRO's flattened partitions.
        optimizer = {"type": "SGD", "params": {"lr": lr, "foreach": False}}
    return {
        # Nominal (see the module docstring): the largest contiguous slice.
        "train_micro_batch_size_per_gpu": math.ceil(workload.global_batch_size / world_size),
        "gradient_accumulation_steps": 1,
        "optimizer": optimizer,
        # The workload's dense buckets, as every trainer's: ZeRO 1 and 2 reduce in buckets
        # of this many elements inside backward; ZeRO 0 all-reduces after autograd anyway.
        "zero_optimization": {"stage": zero_stage,
                              "reduce_bucket_size": max(1, int(workload.dense_bucket_mb * 2**20 / 4))},
        "zero_allow_untested_optimizer": name == "sgd",
        "fp16": {"enabled": False},
        "bf16": {"enabled": False},
        "gradient_clipping": 0.0,
        # The gradient reduction the loss scaling in `step` relies on, pinned rather than
        # left to defaults (these are the defaults): gradient_allreduce_op "mean", i.e. a
        # SUM-collective and one factor 1/dp_world_size. prescale_gradients=false and
        # gradient_predivide_factor=1.0 mean no other factor: with a predivide factor f
        # the engine would multiply by 1/f before and f/N after (still the mean, rounded
        # twice), and ZeRO 1-3 assert f == 1 and no prescale on their reduce-scatter path.
        # Where the 1/N is applied varies (ZeRO 0 after the all-reduce, ZeRO 1/2 before
        # it, ZeRO 3 before the reduce-scatter); for N a power of two it is exact.
        "gradient_allreduce_op": "mean",
        "prescale_gradients": False,
        "gradient_predivide_factor": 1.0,
        "steps_per_print": 2**31 - 1,  # no per-step log lines in the rank logs
        "wall_clock_breakdown": False,
    }


class DeepSpeedTrainer:
    """DeepSpeed engine over the shared model; ZeRO stage via `--set deepspeed.zero_stage`."""

    Options = DeepSpeedOptions
    options: DeepSpeedOptions

    @staticmethod
    def table_memory(options: dict[str, str], world_size: int) -> TableMemory:
        """ZeRO partitions optimizer state (stage 1), then gradients (2: the full gradient
        is still computed, then reduced into this rank's partition), then parameters (3)."""
        stage = int(options["zero_stage"])
        if stage == 3:
            return TableMemory(placement="row", grads=1.0, states=1.0, optimizer_transient=1.0)
        share = 1.0 if stage == 0 else 1 / world_size  # of the optimizer's state and work
        return TableMemory(placement="replicated", grads=2.0 if stage < 2 else 1.0 + 1 / world_size,
                           states=share, optimizer_transient=share)

    @classmethod
    def check_run(cls, run: RunConfig) -> None:
        """Before any rank starts: one optimizer for the whole model."""
        check_one_optimizer(run.workload)

    # Checked by counting torch.distributed calls per span (2 ranks, gloo, DeepSpeed
    # 0.19.8 defaults; the `small` model is 1.68M parameters in one bucket).
    notes = (
        "Spans: forward = engine(batch), backward = engine.backward(loss x world), "
        "optimizer = engine.step(); no span is kind=comm, every collective blocks inside "
        "one of these compute spans (its wait is wall time without thread CPU time). "
        "ZeRO 0: one all-reduce of the flattened gradient after autograd, inside backward "
        "(not overlapped with compute); optimizer is local. "
        "ZeRO 1 and 2: each gradient bucket is reduced inside backward, as it fills "
        "(reduce_bucket_size: the workload's dense_bucket_mb, 4 MiB by default, so "
        "`small`'s 1.68M parameters (6.7 MB) fill two, the last reduced at the end of autograd; each rank "
        "keeps its partition); the partition update, the all-gather of the updated "
        "parameters and a scalar all-reduce (gradient norm) are inside optimizer. "
        "ZeRO 3: per-module parameter all-gathers inside forward and again inside "
        "backward, the gradient reduce-scatter inside backward (a few small broadcasts in "
        "the first forward only); inside optimizer the partition update, all-gathers of the "
        "small parameters ZeRO keeps whole on every rank (below param_persistence_threshold, "
        "1e5 elements) and a scalar all-reduce."
    )

    def setup(self, ctx: RankContext, run: RunConfig, source) -> None:
        self.ctx, self.run, self.source = ctx, run, source
        accel = get_accelerator().device_name()
        if accel != ctx.device.type:
            raise ConfigError(f"device={ctx.device.type!r} but DeepSpeed's accelerator is "
                              f"{accel!r} (DS_ACCELERATOR={os.environ.get('DS_ACCELERATOR')!r}); "
                              f"set DS_ACCELERATOR={ctx.device.type} or run on {accel}")
        # fsbench created the world group before setup; DeepSpeed wraps it (its
        # TorchBackend skips init_process_group when torch.distributed is initialized).
        world_before = dist.group.WORLD
        # Every collective of the engine runs inside forward, backward or optimizer:
        # recorded as flights (fsbench.measurement.flights), before DeepSpeed keeps references.
        self.flights = FrameworkFlights()
        deepspeed.init_distributed(dist_backend=ctx.backend, verbose=False)
        if dist.group.WORLD is not world_before or ds_comm.get_world_size() != ctx.world_size:
            raise RuntimeError("deepspeed.init_distributed did not reuse fsbench's process group")
        self.zero_stage = int(self.options.zero_stage)
        self.config = ds_config(run, ctx.world_size, self.zero_stage)
        model = build_model(run.workload, seed=run.seed).to(ctx.device)
        # initialize broadcasts rank 0's weights (as DDP does); build_model is seeded, so
        # the ranks already agree. With stage 3 the parameters are partitioned here.
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=param_groups(model, run.workload), config=self.config)
        # Gradient semantics. Every trainer computes the gradient of the GLOBAL loss (each
        # rank's share is normalized by the global target count, so the shares sum to the
        # global mean): the SUM of the ranks' gradients. DeepSpeed's reduction (pinned in
        # ds_config) gives their MEAN: SUM / dp_world_size. So `step` multiplies the loss
        # by the data-parallel world size before engine.backward, exactly as fsbench/training/dp.py
        # does for DDP. (The alternative, "gradient_allreduce_op": "sum", exists in this
        # DeepSpeed but is rejected with ZeRO stage 3; one rule for all stages is simpler.)
        # With a power-of-two world size, x N then / N is exact in floating point.
        # The returned StepStats.loss is the unscaled share.
        self.loss_multiplier = self.grad_scale(ds_comm.get_world_size())

    def grad_scale(self, dp_world_size: int) -> float:
        """Loss multiplier that turns DeepSpeed's mean over ranks into the sum (a seam
        that tests override to prove a wrong scale is caught)."""
        return float(dp_world_size)

    def make_preparer(self) -> Preparer:
        return ContiguousShare(self.source, self.ctx.rank, self.ctx.world_size)

    def step(self, inputs) -> StepStats:
        prepared = next(inputs)
        (local,) = prepared.batches
        with span("forward"):
            loss = self.engine(local)
        with span("backward"):
            self.engine.backward(loss * self.loss_multiplier)
        with span("optimizer"):
            # Updates (this rank's partition of) the parameters and zeroes the gradients.
            self.engine.step()
        return StepStats(loss=loss.item(), num_samples=local.batch_size,
                         num_targets=local.num_targets, step=prepared.step)

    def trained_model(self) -> torch.nn.Module | None:
        """The trained model as a CPU `RecModel` on rank 0 (None elsewhere). ZeRO 0-2 keep
        every parameter whole on every rank (updated partitions are all-gathered inside
        `engine.step`); ZeRO 3 partitions them, so they are gathered first (a collective:
        call on every rank, between steps)."""
        module = self.engine.module
        gather = (deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)
                  if self.zero_stage == 3 else contextlib.nullcontext())
        with gather:
            if not self.ctx.is_main:
                return None
            # Copied inside the context: ZeRO 3 releases the gathered tensors on exit.
            return model_from_state(self.run.workload, module.state_dict())

    def close(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            # Releases the optimizer's hooks and buffers (ZeRO's gradient hooks, stage 3's
            # parameter coordinator) while the process group still exists. The group
            # itself belongs to fsbench: its worker destroys it right after close(),
            # which DEPENDENCIES.md notes DeepSpeed needs for a clean exit.
            engine.destroy()
            self.engine = self.optimizer = None
        if getattr(self, "flights", None) is not None:
            self.flights.close()
