"""The dense forward sub-batch by sub-batch (FreeScale 2: the forward starts on the first
chunk). A step's samples are cut into sub-batches, and chunk c of the embedding exchange
holds the rows sub-batch c is the first to read (freescale_impl.exchange_plan): sub-batch
c waits only for chunks <= c, so the first one computes while later chunks are in flight.

Exact: samples are independent in the encoder (attention within a sample, dropout keyed
by the token: fsbench.models.dropout), and each sub-batch's loss is normalized by the
global target count, so the sub-batches' losses sum to the batch's loss and their
gradients to its gradient.

DDP takes one forward before each backward: the loop lives inside the module it wraps
(`SubBatched`), so DDP sees one call and one loss."""
from __future__ import annotations

import torch

from fsbench.measurement.timeline import span
from fsbench.workloads.batch import JaggedBatch
from freescale_impl.exchange_plan import Request


def sub_batches(req: Request, batch: JaggedBatch) -> list[JaggedBatch | None]:
    """The step's sub-batches (before the forward: slices by host bounds), None for an
    empty one beyond the first (nothing to compute; the first always runs, so that a rank
    with no samples still gives DDP a loss of every parameter)."""
    bounds = req.sub_samples
    return [req.sub_batch(batch, c) if c == 0 or bounds[c + 1] > bounds[c] else None
            for c in range(req.sub_batches)]


class SubBatched(torch.nn.Module):
    """`dense` (the model's dense part) run on each sub-batch in turn, losses summed. Each
    sub-batch first reads its rows (`lookups.sub_batch(c)`: the waits for its chunks, comm
    spans), then computes in a `forward` span of its own: the timeline shows where each
    sub-batch's wait falls (fsbench.measurement.recorded_step)."""

    def __init__(self, dense: torch.nn.Module) -> None:
        super().__init__()
        self.dense = dense

    def forward(self, lookups, batches: list[JaggedBatch | None]) -> torch.Tensor:
        loss = None
        for c, batch in enumerate(batches):
            if batch is None:
                continue
            rows = lookups.sub_batch(c)
            with span("forward"):
                part = self.dense(rows, batch)
            loss = part if loss is None else loss + part
        return loss
