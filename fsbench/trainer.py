"""The Trainer protocol every trainer implements, and trainers resolved by name.

fsbench never imports a trainer's module (or its framework: torchrec, deepspeed) until a
run asks for it by name, so `import fsbench` stays light and the dependency direction
stays one way: `baselines` and `freescale_impl` import `fsbench`, never the reverse.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fsbench.config import ConfigError

if TYPE_CHECKING:
    from fsbench.config import RunConfig
    from fsbench.dist import RankContext
    from fsbench.workloads.batch import JaggedBatch


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


class Trainer(Protocol):
    # Defaults of the trainer's `--set <name>.<key>=value` switches (all strings).
    options: dict[str, str]

    def setup(self, ctx: "RankContext", run: "RunConfig") -> None: ...

    def step(self, batch: "JaggedBatch") -> StepStats: ...

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
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        hint = f"; install it with: pip install -e '.[{extra}]'" if extra else ""
        raise ConfigError(f"trainer={name!r} needs a package that is missing ({e.name}){hint}") from e
    if not hasattr(module, cls_name):
        raise ConfigError(f"trainer={name!r}: module {module_name} has no class {cls_name}")
    return getattr(module, cls_name)


def trainer_options(name: str, given: dict[str, str]) -> dict[str, str]:
    """Validate `--set <name>.<key>=value` switches against the trainer's declared options."""
    declared = dict(getattr(resolve_trainer_class(name), "options", {}))
    for key in given:
        if key not in declared:
            allowed = ", ".join(f"{name}.{k}" for k in declared) or "none"
            raise ConfigError(f"--set {name}.{key}: unknown option of trainer {name!r}; "
                              f"allowed: {allowed}")
    merged = {**declared, **given}
    cls = resolve_trainer_class(name)
    if hasattr(cls, "validate_options"):
        cls.validate_options(merged)
    return merged
