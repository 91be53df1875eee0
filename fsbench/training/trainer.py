"""The Trainer protocol every trainer implements, and trainers resolved by name.

fsbench never imports a trainer's module (or its framework: torchrec, deepspeed) until a
run asks for it by name, so `import fsbench` stays light and the dependency direction
stays one way: `baselines` and `freescale_impl` import `fsbench`, never the reverse.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from fsbench.config import ConfigError

if TYPE_CHECKING:
    from fsbench.config import RunConfig
    from fsbench.training.dist import RankContext
    from fsbench.workloads.generator import SyntheticBatches


@dataclass(slots=True)
class StepInput:
    """What one rank trains at one step, built ahead of the step by the input pipeline.

    `batches` are the rank's micro-batches (JaggedBatch) or a framework's own batch type
    (TorchRec's); each has `.to(device)`. `extra` carries per-step numbers the stats keep
    (e.g. a balancer's predicted cost). `aux` is what else the trainer's input stage
    prepared ahead (e.g. FreeScale's all-to-all routing): tensors in dicts, lists and
    dataclasses, moved to the device with the batches."""

    step: int
    batches: list[Any]
    num_samples: int
    num_targets: int
    extra: dict = field(default_factory=dict)
    aux: Any = None

    def to(self, device: Any) -> "StepInput":
        """The same input with every batch on `device` (non-blocking; free on CPU)."""
        if getattr(device, "type", device) == "cpu":
            return self
        return StepInput(self.step, [b.to(device) for b in self.batches], self.num_samples,
                         self.num_targets, self.extra, map_tensors(self.aux, lambda t: t.to(device, non_blocking=True)))


def map_tensors(obj: Any, fn: Callable[[Any], Any], kind: type | tuple = None) -> Any:
    """`obj` with `fn` applied to every torch tensor (or every instance of `kind`) inside
    its dicts, lists, tuples and dataclass fields."""
    import dataclasses

    import torch

    if isinstance(obj, kind or torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn, kind) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn, kind) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: map_tensors(getattr(obj, f.name), fn, kind)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


@dataclass(slots=True)
class StepStats:
    """What one rank reports for one step (its share of the global batch)."""

    loss: float
    """This rank's loss contribution: summed over ranks it is the global mean loss."""
    num_samples: int
    """Samples this rank processed."""
    num_targets: int
    """Target tokens this rank processed."""
    extra: dict | None = None
    """Trainer-specific per-step numbers (e.g. a balancer's predicted cost), stored as is."""
    step: int | None = None
    """The step these stats belong to (the harness checks it is the step it timed)."""


Preparer = Callable[[int], StepInput]
"""A rank's input stage: step -> StepInput. A pure function of the step (it may cache),
picklable, touching no process group: the harness runs it in a data-loader worker process
ahead of the step that trains it."""


class Trainer(Protocol):
    """The contract between the harness and a trainer.

    Same function: every trainer trains the same model on the same global batch of step k
    (`source.global_batch(k)`, a pure function of seed and step) and normalizes each rank's
    loss by the GLOBAL number of target tokens, so that the sum over ranks of the per-rank
    gradients is the single-process gradient of the global batch, whatever the split.

    Input: `make_preparer()` returns the rank's input stage (the split of the global
    batch, a balancer's plan, a framework's batch building; see `Preparer`). The harness
    runs it ahead in a prefetching pipeline, the same way for every trainer, and hands
    `step` an iterator over the prepared inputs on the rank's device. `step` pulls what
    it trains (and may pull further ahead, as TorchRec's pipeline does); every pull is
    timed as an `input` span, so waiting for input is measured, never hidden. No trainer
    generates or splits data inside `step`.

    Spans inside `step` (fsbench.measurement.timeline) partition the step and do not nest:
      compute  forward, backward, optimizer, local lookups: busy time;
      comm     each issue or wait of a collective the trainer drives itself (a collective
               that blocks inside a compute span shows there as wall time without CPU
               time, and is counted as communication wait);
      input    waiting for input, including input preparation that can only run in the
               step (it must be named so, never hidden in compute).

    Across steps: reading inputs ahead, and communication issued in step k for step k+1
    (on the trainer's own groups: the harness's start barrier has its own group, so it
    never waits for it). Training state may not go stale: step k+1 computes with the
    parameters step k produced.

    Evaluation (`--eval`, fsbench.training.evaluate): `trained_model()` is called on every rank
    between steps (outside the step span; a collective where parameters are sharded) and
    returns, on rank 0, the whole trained model as a CPU `fsbench.models.RecModel` (None on
    the other ranks), so that one function scores every trainer. A trainer without it
    cannot run with --eval.
    """

    options: Any
    """The trainer's switches (`--set <name>.<key>=value`), as given to it."""

    def setup(self, ctx: "RankContext", run: "RunConfig", source: "SyntheticBatches") -> None: ...

    def make_preparer(self) -> Preparer: ...

    def step(self, inputs: Iterator[StepInput]) -> StepStats: ...

    def trained_model(self) -> Any: ...

    def close(self) -> None: ...


# name -> ("module:Class", extra to install, one-line description)
TRAINERS: dict[str, tuple[str, str | None, str]] = {
    "ddp": ("baselines.ddp:DDPTrainer", None,
            "naive PyTorch DDP: contiguous split, replicated embeddings, gradient all-reduce"),
    "torchrec": ("baselines.torchrec_trainer:TorchRecTrainer", "torchrec",
                 "TorchRec DistributedModelParallel + TrainPipelineSparseDist, sharded tables"),
    "deepspeed": ("baselines.deepspeed_trainer:DeepSpeedTrainer", "deepspeed",
                  "DeepSpeed ZeRO (stage via --set deepspeed.zero_stage=0..3, default 2)"),
    "freescale": ("freescale_impl.trainer:FreeScaleTrainer", None,
                  "FreeScale: cost-balanced samples per rank (switches: --set freescale.*)"),
}

# Third-party packages whose absence lets a trainer be reported as "not installed";
# an ImportError of any other module (the project's own code) is a bug and propagates.
OPTIONAL_PACKAGES = ("torchrec", "fbgemm_gpu", "deepspeed", "torchmetrics", "tensordict")


def trainer_names() -> list[str]:
    return list(TRAINERS)


def resolve_trainer_class(name: str) -> type:
    """Import and return the trainer class registered under `name`, or given by import
    path as `package.module:Class` (a user's own trainer, or a test's)."""
    if ":" in name:
        target, extra = name, None
    elif name in TRAINERS:
        target, extra, _ = TRAINERS[name]
    else:
        raise ConfigError(f"trainer={name!r} is unknown; choose one of: {', '.join(TRAINERS)} "
                          "(or give module:Class)")
    module_name, _, cls_name = target.partition(":")
    if ":" in name and not (_is_dotted_name(module_name) and cls_name.isidentifier()):
        raise ConfigError(f"trainer={name!r}: give a registered name ({', '.join(TRAINERS)}) "
                          "or package.module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        missing = (e.name or "").split(".")[0]
        if missing not in OPTIONAL_PACKAGES and ":" not in name:
            raise  # our own code failed to import: a bug, not a missing extra
        hint = f"; install it with: pip install -e '.[{extra}]'" if extra else ""
        raise ConfigError(f"trainer={name!r} needs a package that is missing ({e.name}){hint}") from e
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise ConfigError(f"trainer={name!r}: module {module_name} has no class {cls_name}")
    missing = [m for m in TRAINER_METHODS if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing:
        raise ConfigError(f"trainer={name!r}: {module_name}.{cls_name} is not a trainer class "
                          f"(a class with {', '.join(TRAINER_METHODS)}: fsbench.training.trainer)")
    return cls


# What the harness calls on every trainer (the Trainer protocol above); a user's
# module:Class lacking one is refused before any rank starts.
TRAINER_METHODS = ("setup", "step", "close")


def _is_dotted_name(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def check_run(run: "RunConfig") -> None:
    """The trainer's own refusals of a run (its `check_run`: a combination it cannot run,
    such as an optimizer its framework lacks), before any rank starts."""
    check = getattr(resolve_trainer_class(run.trainer), "check_run", None)
    if check is not None:
        check(run)


def trainer_options(name: str, given: dict[str, str]) -> dict[str, str]:
    """Validate `--set <name>.<key>=value` switches against the trainer's declared options
    (a frozen dataclass `Options` on the trainer class, or a dict of defaults)."""
    cls = resolve_trainer_class(name)
    declared = option_defaults(cls)
    for key in given:
        if key not in declared:
            allowed = ", ".join(f"{name}.{k}" for k in declared) or "none"
            raise ConfigError(f"--set {name}.{key}: unknown option of trainer {name!r}; "
                              f"allowed: {allowed}")
    merged = {**declared, **given}
    if hasattr(cls, "Options"):
        cls.Options.parse(merged, prefix=name)  # validates every field, one place
    return merged


def option_defaults(cls: type) -> dict[str, str]:
    """A trainer class's switches and their defaults, as strings."""
    if hasattr(cls, "Options"):
        return cls.Options.defaults()
    return dict(getattr(cls, "options", {}) or {})


def measured_steps(warmup: int, steps: int, align: int = 1) -> range:
    """Steps that are measured: after warm-up, in whole units of `align` steps (a
    look-ahead window re-packs `align` batches, so only whole windows are comparable),
    aligned to multiples of `align` from step 0."""
    start = -(-warmup // align) * align
    end = steps // align * align
    if start >= end:
        raise ConfigError(f"steps={steps} with warmup={warmup} leave no whole window of "
                          f"{align} steps to measure; use at least steps="
                          f"{start + align}")
    return range(start, end)


def profiled_window(measured: range, align: int = 1, cuda: bool = True) -> range:
    """CUDA runs: the measured steps that run under the profiler, the first quarter of the
    measured window in whole units of `align` (at least one unit, when two fit). Their
    kernel record gives busy time and so the bubbles (ARCHITECTURE.md: busy on GPU is the
    union of compute kernels); the profiler's host overhead would slow them, so step time,
    throughput and SM occupancy come from the steps after them. First, not last: the
    profiler then warms up in the harness's last warm-up step (`profiler_start_step`), no
    measured step is lost to it, the timed steps stay whole windows, and the run's final
    step (which has no next step to read ahead for) is never the profiled one. Empty on
    CPU, and where the window is too short to split (busy then falls back to CUDA events,
    and the summary's `busy_source` says so)."""
    n = len(measured)
    if not cuda or n < 2 * align:
        return range(measured.start, measured.start)
    size = max(n // 4 // align, 1) * align
    return range(measured.start, measured.start + size)


def profiler_start_step(profiled: range) -> int | None:
    """The step at which the profiler starts: one step before the profiled window, so
    that its first step (CUPTI's set-up, the first buffers) is not a measured one; that
    step is a warm-up step, whose record the metrics never read (it has no
    `fsbench.step.<k>` annotation). None without a profiled window; the window's first
    step where nothing precedes it (warmup=0: no warm-up for the profiler either)."""
    if not profiled:
        return None
    return max(profiled.start - 1, 0)
