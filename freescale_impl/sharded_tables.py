"""Embedding tables sharded across ranks: who owns which row, and the owner's rows with
their row-sparse optimizer.

All tables of a model share one embedding dimension, so they are laid end to end in one
*global row space*: row `i` of table `t` is global row `base[t] + i`. Two layouts:

  row-wise    global row g lives on rank g % N at local index g // N: every table is
              spread over every rank, so a batch's lookups load all ranks alike.
  table-wise  each table lives whole on one rank (largest tables first, each to the
              least-loaded rank): fewer, larger messages; a hot table makes a hot rank.

The owner keeps its rows and their optimizer state in one (rows, dim) tensor each, and
steps them with the arithmetic a replicated table gets from its torch optimizer
(fsbench.training.optim), so that sharded and replicated tables train the same function:
  row-sparse  sgd, adagrad, rowwise_adagrad, sparse_adam: only the rows a step sent
              gradients for move. For SGD and the Adagrads this is exactly what the dense
              update of a replicated table does (a zero gradient adds 0 to the sum and
              steps by 0); sparse_adam is torch.optim.SparseAdam (moments and step count
              per table: every table is read at every step, so its count is the step's).
  dense       adam: torch.optim.Adam over the whole shard at every step, as on a replicated
              table: moments decay and rows move whether or not the step read them. So no
              row is final before a step's update (freescale_impl.embedding_exchange turns
              priority off), and the update costs O(rows held), not O(rows read).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from fsbench.errors import ConfigError
from fsbench.models.sparse import TableSpec, initial_table_weight
from fsbench.training.rowwise_adagrad import rowwise_adagrad_rows

Layout = Literal["row", "table"]
ROW_SPARSE = ("sgd", "adagrad", "rowwise_adagrad", "sparse_adam")
EVERY_ROW = ("adam",)  # steps every row of the shard at every step
ADAGRAD_EPS = 1e-10  # torch.optim.Adagrad's default, which the replicated trainers use


class RowLayout:
    """Maps global rows to (owner rank, local index) for one layout."""

    def __init__(self, specs: Sequence[TableSpec], world_size: int, layout: Layout) -> None:
        if layout not in ("row", "table"):
            raise ConfigError(f"sharding={layout!r} is unknown; choose one of: row, table")
        dims = {s.dim for s in specs}
        if len(dims) != 1:
            raise ValueError(f"sharded tables need one embedding dim, got {sorted(dims)}")
        self.specs, self.world_size, self.layout = list(specs), world_size, layout
        self.dim = dims.pop()
        sizes = np.array([s.num_rows for s in self.specs], dtype=np.int64)
        self.base = np.concatenate([[0], np.cumsum(sizes)])  # table t: [base[t], base[t+1])
        self.num_rows = int(self.base[-1])
        self.table_owner = np.zeros(len(self.specs), dtype=np.int64)
        self.table_local_base = np.zeros(len(self.specs), dtype=np.int64)
        if layout == "table":
            load = np.zeros(world_size, dtype=np.int64)
            for t in np.argsort(-sizes, kind="stable"):  # largest first, to the lightest rank
                r = int(np.argmin(load))
                self.table_owner[t], self.table_local_base[t] = r, load[r]
                load[r] += sizes[t]
            self._local_rows = load
        else:
            n = np.arange(world_size)
            self._local_rows = (self.num_rows - n + world_size - 1) // world_size
        self._base_t = torch.from_numpy(self.base)
        self._owner_t = torch.from_numpy(self.table_owner)
        self._local_base_t = torch.from_numpy(self.table_local_base)

    def table_base(self, name: str) -> int:
        return int(self.base[[s.name for s in self.specs].index(name)])

    def local_rows(self, rank: int) -> int:
        return int(self._local_rows[rank])

    def owner(self, rows: torch.Tensor) -> torch.Tensor:
        if self.layout == "row":
            return rows % self.world_size
        return self._owner_t.to(rows.device)[self._table_of(rows)]

    def local_index(self, rows: torch.Tensor) -> torch.Tensor:
        if self.layout == "row":
            return rows // self.world_size
        t = self._table_of(rows)
        return rows - self._base_t.to(rows.device)[t] + self._local_base_t.to(rows.device)[t]

    def _table_of(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(self._base_t.to(rows.device), rows, right=True) - 1

    def owned_rows(self, rank: int) -> torch.Tensor:
        """The global rows rank `rank` holds, in local-index order."""
        if self.layout == "row":
            return torch.arange(rank, self.num_rows, self.world_size)
        parts = [(int(self.table_local_base[t]), torch.arange(int(self.base[t]), int(self.base[t + 1])))
                 for t in range(len(self.specs)) if self.table_owner[t] == rank]
        return torch.cat([p for _, p in sorted(parts, key=lambda x: x[0])] or
                         [torch.zeros(0, dtype=torch.int64)])


class LocalShard:
    """One rank's rows of every table, and their optimizer."""

    def __init__(self, layout: RowLayout, rank: int, seed: int, optimizer: str, lr: float,
                 device: torch.device) -> None:
        if optimizer not in ROW_SPARSE + EVERY_ROW:
            raise ConfigError(f"optimizer.tables={optimizer!r} has no sharded update; choose "
                              f"one of: {', '.join(ROW_SPARSE + EVERY_ROW)}")
        self.layout, self.rank, self.optimizer, self.lr = layout, rank, optimizer, lr
        self.weight = self._initial_rows(seed).to(device)
        # Adagrad's running sum of squared gradients (row-wise: one per row); SGD keeps none.
        self.sum_sq = (torch.zeros_like(self.weight) if optimizer == "adagrad" else
                       self.weight.new_zeros(self.weight.shape[0]) if optimizer == "rowwise_adagrad"
                       else None)
        # The Adams are torch's own, stepping the shard as they would step a whole table.
        self._torch = (torch.optim.Adam([self.weight], lr=lr, foreach=False) if optimizer == "adam"
                       else torch.optim.SparseAdam([self.weight], lr=lr)
                       if optimizer == "sparse_adam" else None)

    @property
    def steps_every_row(self) -> bool:
        """Whether an update may move rows the step did not read (dense Adam)."""
        return self.optimizer in EVERY_ROW

    @torch.no_grad()
    def _initial_rows(self, seed: int) -> torch.Tensor:
        """Exactly the rows `build_model(seed)` gives the replicated tables (built one
        table at a time: a row-wise shard needs a strided slice of each table)."""
        out = torch.empty(self.layout.local_rows(self.rank), self.layout.dim)
        mine = self.layout.owned_rows(self.rank)
        local = self.layout.local_index(mine)
        for t, spec in enumerate(self.layout.specs):
            lo, hi = int(self.layout.base[t]), int(self.layout.base[t + 1])
            in_table = (mine >= lo) & (mine < hi)
            if in_table.any():
                out[local[in_table]] = initial_table_weight(spec, seed, mine[in_table] - lo)
        return out

    def lookup(self, local_index: torch.Tensor) -> torch.Tensor:
        return self.weight.index_select(0, local_index)

    @torch.no_grad()
    def apply_gradients(self, local_index: torch.Tensor, grads: torch.Tensor) -> None:
        """One optimizer step (called at every step, rows or none): the rows given, their
        contributions summed first, with torch.optim's per-element arithmetic; with dense
        Adam every row of the shard, the others with a zero gradient."""
        if self.optimizer == "adam":
            self._torch_step(torch.zeros_like(self.weight).index_add_(0, local_index, grads))
            return
        if local_index.numel() == 0 and self.optimizer != "sparse_adam":
            return  # SparseAdam counts the step even so: its bias correction is per step
        rows, inverse = torch.unique(local_index, return_inverse=True)
        grad = torch.zeros(rows.numel(), self.layout.dim, dtype=grads.dtype, device=grads.device)
        grad.index_add_(0, inverse, grads)
        if self.optimizer == "sparse_adam":
            self._torch_step(torch.sparse_coo_tensor(rows.unsqueeze(0), grad, self.weight.shape,
                                                     is_coalesced=True, check_invariants=False))
            return
        param = self.weight.index_select(0, rows)
        if self.optimizer == "sgd":
            param.add_(grad, alpha=-self.lr)
        elif self.optimizer == "adagrad":
            state = self.sum_sq.index_select(0, rows).addcmul_(grad, grad, value=1)
            param.addcdiv_(grad, state.sqrt().add_(ADAGRAD_EPS), value=-self.lr)
            self.sum_sq.index_copy_(0, rows, state)
        else:  # rowwise_adagrad
            state = self.sum_sq.index_select(0, rows)
            rowwise_adagrad_rows(param, state, grad, self.lr)
            self.sum_sq.index_copy_(0, rows, state)
        self.weight.index_copy_(0, rows, param)

    def _torch_step(self, grad: torch.Tensor) -> None:
        self.weight.grad = grad
        self._torch.step()
        self.weight.grad = None


@torch.no_grad()
def gather_tables(layout: RowLayout, weight: torch.Tensor, rank: int, group,
                  dst: int = 0) -> dict[str, torch.Tensor] | None:
    """Every table whole, on CPU, at rank `dst` (None elsewhere), from each rank's
    `LocalShard.weight`: what the replicated tables would hold. A collective over
    `group` (one gather of each shard, padded to the largest); the full tables are
    materialized on `dst` only."""
    world = layout.world_size
    width = max(layout.local_rows(r) for r in range(world))
    padded = weight.new_zeros(width, layout.dim)
    padded[:weight.shape[0]] = weight
    parts = [torch.empty_like(padded) for _ in range(world)] if rank == dst else None
    torch.distributed.gather(padded, parts, dst=dst, group=group)
    if rank != dst:
        return None
    full = torch.empty(layout.num_rows, layout.dim, dtype=weight.dtype)
    for r, part in enumerate(parts):
        full[layout.owned_rows(r)] = part[:layout.local_rows(r)].cpu()
    return {s.name: full[int(layout.base[t]):int(layout.base[t + 1])]
            for t, s in enumerate(layout.specs)}
