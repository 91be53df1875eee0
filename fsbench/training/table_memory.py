"""How a trainer holds the embedding tables on one rank, as it declares it (a static
`table_memory(options, world_size)` on the trainer class): what the memory estimate
(fsbench.running.memory) counts per rank. Trainers that declare nothing replicate their
tables as DDP does (`REPLICATED`)."""
from __future__ import annotations

import dataclasses
import math


PLACEMENTS = ("replicated", "row", "table")


@dataclasses.dataclass(frozen=True)
class TableMemory:
    """How a trainer holds the embedding tables on one rank. `placement`: every table whole
    on every rank (`replicated`), each table's rows split evenly (`row`), or whole tables
    placed largest first on the least-loaded rank (`table`; the fullest rank counts).
    `grads` and `states`: gradient and optimizer-state copies per row held."""
    placement: str = "replicated"
    grads: float = 2.0   # DDP: the dense gradient and its all-reduce bucket
    states: float = 1.0
    optimizer_transient: float = 1.0
    """A torch optimizer's temporary per step (Adagrad's and Adam's square-root
    denominator), per row held; a sharded trainer's row-wise update needs none."""

    def __post_init__(self) -> None:
        assert self.placement in PLACEMENTS, self.placement

    def rows_held(self, table_rows: list[int], world_size: int) -> float:
        if self.placement == "replicated" or world_size == 1:
            return float(sum(table_rows))
        if self.placement == "row":
            return float(sum(math.ceil(r / world_size) for r in table_rows))
        loads = [0] * world_size
        for rows in sorted(table_rows, reverse=True):
            loads[loads.index(min(loads))] += rows
        return float(max(loads))


REPLICATED = TableMemory()


def sharded(placement: str) -> TableMemory:
    """Tables split over the ranks; gradients only of the rows a step touched (negligible
    beside the tables), sent to their owner."""
    return TableMemory(placement=placement, grads=0.0, states=1.0, optimizer_transient=0.0)
