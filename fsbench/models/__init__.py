"""Reference sequence-recommendation models: HSTU and SASRec over jagged batches.

    model = build_model(workload, seed)     # same weights on every process
    loss = model(batch)                     # = model.dense(model.sparse.lookup(batch), batch)

`model.sparse` (embedding tables) is kept apart from `model.dense` (everything else)
because trainers replicate or shard the tables while sharing the dense part. `emulation`
stands in for the dense compute with a calibrated wait (compute=emulated).

May import: the top-level leaves, measurement (clocks, spans), workloads.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from fsbench.config import WorkloadConfig
from fsbench.models.dense import DenseArch
from fsbench.models.init import materialize
from fsbench.models.jagged import Bucketing, JaggedLayout
from fsbench.models.sparse import (EmbeddingLookups, SparseArch, TableSpec, assemble_lookups,
                                   initial_table_weight, table_ids, table_specs)
from fsbench.workloads.batch import JaggedBatch

__all__ = ["Bucketing", "DenseArch", "EmbeddingLookups", "JaggedLayout", "RecModel",
           "SparseArch", "TableSpec", "assemble_lookups", "build_model", "initial_table_weight",
           "model_from_state", "table_ids", "table_specs"]


class RecModel(nn.Module):
    def __init__(self, workload: WorkloadConfig):
        super().__init__()
        self.sparse = SparseArch(table_specs(workload.model.row_dim, workload.item_vocab,
                                             workload.user_vocab, workload.context_vocabs))
        self.dense = DenseArch(workload.model, len(workload.context_vocabs), workload.max_seq_len)

    def init_weights(self, seed: int) -> None:
        self.sparse.init_weights(seed)
        self.dense.init_weights(seed)

    def forward(self, batch: JaggedBatch) -> torch.Tensor:
        return self.dense(self.sparse.lookup(batch), batch)


def build_model(workload: WorkloadConfig, seed: int) -> nn.Module:
    """A float32 CPU model whose weights depend only on (workload, seed): the reference
    model, or with `compute=synthetic` the ground-truth SpinModel.

    Built on the meta device and then initialized explicitly from per-parameter
    generators, so the global RNG is neither read nor advanced.
    """
    if workload.compute == "synthetic":
        from fsbench.models.synthetic import SpinModel

        return SpinModel(workload)
    with torch.device("meta"):
        model = RecModel(workload)
    materialize(model)
    model.init_weights(seed)
    return model


def model_from_state(workload: WorkloadConfig, state: Mapping[str, torch.Tensor]) -> RecModel:
    """A float32 CPU `RecModel` holding `state` (RecModel's state-dict keys, tensors on any
    device): how a trainer hands over its trained weights, however it held them (replicas,
    shards, a framework's modules). Strict: every parameter must be given, none unknown."""
    with torch.device("meta"):
        model = RecModel(workload)
    materialize(model)
    model.load_state_dict(state, strict=True)
    return model
