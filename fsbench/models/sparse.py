"""The sparse part of a model: embedding tables and the lookups a batch needs.

Kept apart from the dense part because trainers treat them differently: DDP replicates
the tables, TorchRec and FreeScale shard them across ranks. To let a sharded
implementation reproduce these lookups exactly, the id -> row mapping is the identity
(row = id) and the work is split into three public steps:

    ids = table_ids(batch)                      # which rows each table must return
    rows = {name: table[ids[name]] for ...}     # the only step a sharded version changes
    lookups = assemble_lookups(batch, rows)     # split the rows back into features

Initial weights come from `initial_table_weight(spec, seed)`, so a sharded table can be
built with exactly the rows a replicated one would hold.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fsbench.models.init import normal_values, uninitialized_embedding
from fsbench.workloads.batch import JaggedBatch

ITEM, USER = "item", "user"


def context_table(i: int) -> str:
    """Name of the i-th categorical context table."""
    return f"context_{i}"


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One embedding table: what a trainer needs to build a sharded equivalent."""
    name: str
    num_rows: int
    dim: int
    padding_idx: int | None = None


@dataclass(frozen=True, slots=True)
class EmbeddingLookups:
    """Embeddings of one (possibly partial) batch; T tokens, B samples, K negatives."""
    items: torch.Tensor      # (T, D) inputs
    targets: torch.Tensor    # (T, D) next items (same item table: tied)
    negatives: torch.Tensor  # (K, D) shared sampled negatives
    users: torch.Tensor      # (B, D)
    contexts: torch.Tensor   # (B, C, D)


def table_specs(dim: int, item_vocab: int, user_vocab: int,
                context_vocabs: Sequence[int]) -> list[TableSpec]:
    # Id 0 is padding in every table but never occurs in a batch. Only the item table
    # declares it (row 0 stays zero and gets no gradient); the others need not.
    return ([TableSpec(ITEM, item_vocab, dim, padding_idx=0), TableSpec(USER, user_vocab, dim)]
            + [TableSpec(context_table(i), n, dim) for i, n in enumerate(context_vocabs)])


def table_ids(batch: JaggedBatch) -> dict[str, torch.Tensor]:
    """The ids each table is asked for, one flat tensor per table (order matters:
    `assemble_lookups` splits the returned rows in this order)."""
    ids = {ITEM: torch.cat([batch.item_ids, batch.targets, batch.negative_ids]),
           USER: batch.user_ids}
    for i in range(batch.context_ids.shape[1]):
        ids[context_table(i)] = batch.context_ids[:, i]
    return ids


def assemble_lookups(batch: JaggedBatch, rows: Mapping[str, torch.Tensor]) -> EmbeddingLookups:
    """Turn the rows for `table_ids(batch)` back into per-feature embeddings."""
    t, k = batch.num_targets, batch.negative_ids.shape[0]
    items, targets, negatives = rows[ITEM].split([t, t, k])
    num_contexts = batch.context_ids.shape[1]
    if num_contexts:
        contexts = torch.stack([rows[context_table(i)] for i in range(num_contexts)], dim=1)
    else:
        contexts = rows[USER].new_zeros(batch.batch_size, 0, rows[USER].shape[1])
    return EmbeddingLookups(items=items, targets=targets, negatives=negatives,
                            users=rows[USER], contexts=contexts)


@torch.no_grad()
def initial_table_weight(spec: TableSpec, seed: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The (num_rows, dim) float32 weights `build_model(seed)` gives this table:
    rows ~ N(0, 1/dim), the padding row 0; with `rows`, only those rows (a shard's: the
    full table is never materialized in float32)."""
    values = normal_values((spec.num_rows, spec.dim), spec.dim ** -0.5, seed, f"table/{spec.name}")
    if spec.padding_idx is not None:
        values[spec.padding_idx] = 0.0
    return (values if rows is None else values[rows]).float()


class SparseArch(nn.Module):
    """Replicated embedding tables: `item` (inputs, targets and negatives), `user`, and
    one `context_<i>` table per categorical context feature."""

    def __init__(self, specs: Sequence[TableSpec]):
        super().__init__()
        self.specs = list(specs)
        self.tables = nn.ModuleDict({
            s.name: uninitialized_embedding(s.num_rows, s.dim, s.padding_idx) for s in self.specs
        })

    def init_weights(self, seed: int) -> None:
        with torch.no_grad():
            for spec in self.specs:
                self.tables[spec.name].weight.copy_(initial_table_weight(spec, seed))

    def sparse_gradients(self, on: bool) -> None:
        """Whether backward gives each table a sparse gradient (only the rows read:
        torch.optim.SparseAdam needs it) or a dense one."""
        for table in self.tables.values():
            table.sparse = on

    def lookup(self, batch: JaggedBatch) -> EmbeddingLookups:
        # One embedding call per table (not per feature): one gather and one scatter-add
        # in backward per table, as a sharded all-to-all would also do.
        rows = {name: self.tables[name](ids) for name, ids in table_ids(batch).items()}
        return assemble_lookups(batch, rows)
