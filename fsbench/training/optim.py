"""The optimizers a workload names, built the same way for every trainer.

A model has two parts that may step differently (`optimizer.tables`, `optimizer.dense`;
`optimizer` sets both): the embedding tables, replicated here (sharded trainers step
their shards with the same arithmetic, freescale_impl.sharded_tables), and everything
else. Each torch optimizer is built with foreach=False: the same per-tensor arithmetic
whichever trainer owns which parameters, so trainers stay bit-comparable where reduction
order allows.
"""
from __future__ import annotations

import time
from typing import Iterable

import torch

from fsbench.config import WorkloadConfig
from fsbench.training.rowwise_adagrad import RowwiseAdagrad

# Table optimizers that read the tables' gradients as sparse tensors (only the rows a step
# read): torch.optim.SparseAdam refuses a dense gradient.
SPARSE_GRADIENTS = ("sparse_adam",)


def make_dense_optimizer(params: Iterable[torch.nn.Parameter],
                         workload: WorkloadConfig) -> torch.optim.Optimizer:
    """The dense part's optimizer (with the ground truth's optimizer stall, if any)."""
    return _with_stall(_build(params, workload.dense_optimizer, workload.dense_lr), workload)


def make_table_optimizer(params: Iterable[torch.nn.Parameter],
                         workload: WorkloadConfig) -> torch.optim.Optimizer:
    """Replicated tables' optimizer: `sparse_adam` needs the tables' gradients sparse
    (`SparseArch.sparse_gradients`), every other one steps their dense gradients."""
    return _build(params, workload.table_optimizer, workload.table_lr)


class ModelOptimizer:
    """A replicated model's optimizers, the tables' and the dense part's, as one: what a
    data-parallel trainer steps."""

    def __init__(self, parts: list[torch.optim.Optimizer]) -> None:
        self.parts = parts

    def step(self) -> None:
        for opt in self.parts:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.parts:
            opt.zero_grad(set_to_none=set_to_none)


def model_parts(model: torch.nn.Module) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """A replicated model's parameters as (tables, dense part); the ground truth's model
    has no tables."""
    sparse = getattr(model, "sparse", None)
    tables = list(sparse.parameters()) if sparse is not None else []
    ids = {id(p) for p in tables}
    return tables, [p for p in model.parameters() if id(p) not in ids]


def make_model_optimizer(model: torch.nn.Module, workload: WorkloadConfig) -> ModelOptimizer:
    """Both parts' optimizers over a replicated `RecModel` (or the ground truth's model,
    which has no tables). Switches the tables to sparse gradients where their optimizer
    reads them so: call it before DDP wraps the model (DDP reads that at construction)."""
    tables, dense = model_parts(model)
    if tables:
        model.sparse.sparse_gradients(workload.table_optimizer in SPARSE_GRADIENTS)
    parts = [make_dense_optimizer(dense, workload)]
    if tables:
        parts.append(make_table_optimizer(tables, workload))
    return ModelOptimizer(parts)


def _build(params: Iterable[torch.nn.Parameter], name: str, lr: float) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, foreach=False)
    if name == "sparse_adam":
        return torch.optim.SparseAdam(list(params), lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, foreach=False)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, foreach=False)
    if name == "rowwise_adagrad":
        return RowwiseAdagrad(params, lr=lr)
    raise AssertionError(f"optimizer {name!r} passed validation but is not built")


def _with_stall(optimizer: torch.optim.Optimizer, workload: WorkloadConfig) -> torch.optim.Optimizer:
    stall_s = workload.synthetic.optimizer_sleep_ms / 1e3 if workload.compute == "synthetic" else 0
    if stall_s > 0:  # the ground truth's host stall inside the optimizer step (fsbench.models.synthetic)
        optimizer.register_step_pre_hook(lambda *_: time.sleep(stall_s))
    return optimizer
