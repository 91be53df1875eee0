"""How the TorchRec baseline's tables are sharded, updated and initialized: the sharding
plan (built by hand on CPU, by TorchRec's planner on CUDA), the fused (in-backward) table
optimizer for each table optimizer fsbench names, and the initial weights every trainer
starts from (the dense part and each rank's shards). The trainer (`torchrec_trainer`)
builds DMP and its pipeline on these."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.sharding_plan import (
    construct_module_sharding_plan,
    row_wise,
    table_wise,
)
from torchrec.distributed.types import ShardingPlan, ShardingType

from baselines.torchrec_model import TorchRecModel
from fsbench.config import ConfigError, WorkloadConfig
from fsbench.models import DenseArch
from fsbench.models.init import materialize
from fsbench.models.sparse import ITEM, initial_table_weight

SHARDINGS = {"table_wise": ShardingType.TABLE_WISE, "row_wise": ShardingType.ROW_WISE}

# The fused (in-backward) optimizer for each table optimizer it runs, with the constants of the
# torch optimizer `fsbench.training.optim` builds for the dense part (and for the
# DDP trainer's tables), so that both compute the same update. Exact* variants: duplicate
# ids in a batch are summed before one update, as autograd does for nn.Embedding.
FUSED_OPTIMIZERS: dict[str, tuple[EmbOptimType, dict[str, float]]] = {
    "sgd": (EmbOptimType.EXACT_SGD, {}),
    "adagrad": (EmbOptimType.EXACT_ADAGRAD, {"eps": 1e-10}),
    "rowwise_adagrad": (EmbOptimType.EXACT_ROWWISE_ADAGRAD, {"eps": 1e-10}),
    "sparse_adam": (EmbOptimType.ADAM, {"eps": 1e-8, "beta1": 0.9, "beta2": 0.999,
                                        "weight_decay": 0.0}),
}
# What fbgemm 1.8's CPU kernels lack (its TBE asserts at construction).
NO_FUSED_CPU = {"sparse_adam"}
FUSED = EmbeddingComputeKernel.FUSED.value



def fused_params(optimizer: str, lr: float, device: torch.device) -> dict[str, Any]:
    """The sharders' fused_params: fbgemm's optimizer for the tables (`optimizer`: the
    workload's table optimizer), or a ConfigError naming the ones this device runs."""
    runs = [o for o in FUSED_OPTIMIZERS if device.type != "cpu" or o not in NO_FUSED_CPU]
    if optimizer not in runs:
        why = ("fbgemm 1.8 has no CPU fused Adam, and TorchRec's dense kernel cannot serve "
               "sequence features on CPU" if device.type == "cpu" and "adam" in optimizer else
               "its fused tables update only the rows a batch reads" if optimizer == "adam"
               else "not mapped to a fused optimizer")
        raise ConfigError(f"optimizer.tables={optimizer}: the torchrec trainer runs "
                          f"{', '.join(runs)} on {device.type} ({why}); "
                          f"--set optimizer.tables={runs[0]} or another of those")
    opt_type, constants = FUSED_OPTIMIZERS[optimizer]
    return {"optimizer": opt_type, "learning_rate": lr, **constants}


def table_wise_ranks(sizes: dict[str, int], world_size: int) -> dict[str, int]:
    """Table -> rank, largest table first onto the least-loaded rank (ties: lowest rank)."""
    load = [0] * world_size
    out = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        out[name] = rank
        load[rank] += sizes[name]
    return out


def collections_of(model: TorchRecModel) -> dict[str, nn.Module]:
    """Module path -> sharded collection (the keys of the ShardingPlan)."""
    return {"sequence": model.sequence, "pooled": model.pooled}


def _table_shapes(module: nn.Module) -> dict[str, tuple[int, int]]:
    configs = (module.embedding_configs() if hasattr(module, "embedding_configs")
               else module.embedding_bag_configs())
    return {c.name: (c.num_embeddings, c.embedding_dim) for c in configs}


def manual_plan(model: TorchRecModel, sharders: dict[str, Any], sharding: str,
                world_size: int, local_size: int, device_type: str) -> ShardingPlan:
    """The plan built by hand (CPU: TorchRec's planner proposes row-wise only for CUDA).
    table_wise: each table whole on one rank, largest first onto the least-loaded rank;
    row_wise: every table split into N blocks of consecutive rows, block r on rank r."""
    parts = collections_of(model)
    if sharding == "table_wise":
        sizes = {name: rows * dim for module in parts.values()
                 for name, (rows, dim) in _table_shapes(module).items()}
        ranks = table_wise_ranks(sizes, world_size)
        make = lambda name: table_wise(rank=ranks[name], compute_kernel=FUSED)
    else:
        make = lambda name: row_wise(compute_kernel=FUSED)
    return ShardingPlan(plan={
        path: construct_module_sharding_plan(
            module, {name: make(name) for name in _table_shapes(module)},
            sharder=sharders[path], local_size=local_size, world_size=world_size,
            device_type=device_type)
        for path, module in parts.items()})


def planner_plan(model: TorchRecModel, sharders: dict[str, Any], sharding: str,
                 world_size: int, local_size: int,
                 process_group: dist.ProcessGroup | None = None) -> ShardingPlan:
    """The plan from TorchRec's planner for CUDA, every table constrained to the chosen
    sharding type and the fused kernel; the planner places the shards. With a process
    group, rank 0 plans and broadcasts (collective_plan). Only planning is exercised
    without a GPU (tests); training with such a plan is NOT YET RUN ON A GPU."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import (
        HardwareConfig,
        KernelConfig,
        ParameterConstraints,
        TopologyFactory,
        TrainerConfig,
    )

    constraints = {
        name: ParameterConstraints(sharding_types=[SHARDINGS[sharding].value],
                                   compute_kernels=[FUSED])
        for module in collections_of(model).values() for name in _table_shapes(module)
    }
    hardware = None
    if torch.cuda.is_available():  # else TorchRec's default device capacities (planning only)
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        hardware = HardwareConfig(hbm_cap_bytes=props.total_memory)
    topology = TopologyFactory.create_topology(
        trainer_config=TrainerConfig(world_size=world_size, local_world_size=local_size),
        hardware_config=hardware, kernel_config=KernelConfig(compute_device="cuda"))
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    if process_group is None:
        return planner.plan(model, list(sharders.values()))
    return planner.collective_plan(model, list(sharders.values()), process_group)


def initial_dense(workload: WorkloadConfig, seed: int) -> DenseArch:
    """The dense part exactly as `build_model(workload, seed).dense` (same class, same
    per-parameter seeded init: RecModel.init_weights calls dense.init_weights(seed)),
    without allocating the replicated tables build_model would also build."""
    with torch.device("meta"):
        dense = DenseArch(workload.model, len(workload.context_vocabs), workload.max_seq_len)
    materialize(dense)
    dense.init_weights(seed)
    return dense


def recmodel_key(key: str) -> str:
    """`fsbench.models.RecModel`'s state-dict key for a key of TorchRecModel's: the
    collections' tables are RecModel's `sparse.tables.<name>.weight`; `dense.*` is shared."""
    for prefix in ("sequence.embeddings.", "pooled.embedding_bags."):
        if key.startswith(prefix):
            return "sparse.tables." + key[len(prefix):]
    return key


@torch.no_grad()
def load_initial_tables(model: nn.Module, specs, seed: int) -> int:
    """Copy `initial_table_weight(spec, seed)` into this rank's shards of every table.
    Returns the number of local shards written."""
    state = model.state_dict()
    written = 0
    for spec in specs:
        key = (f"sequence.embeddings.{spec.name}.weight" if spec.name == ITEM
               else f"pooled.embedding_bags.{spec.name}.weight")
        shards = state[key].local_shards()
        if not shards:
            continue
        full = initial_table_weight(spec, seed)
        for shard in shards:
            (r0, c0), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            shard.tensor.copy_(full[r0:r0 + nr, c0:c0 + nc])
            written += 1
    return written
