"""Many-rank emulation (`--set compute=emulated`): the real distributed runtime with each
rank's encoder compute replaced by waiting.

Every rank is a real process in a real gloo world; the trainer, its input split, its
embedding lookups and exchanges, its gradient collectives (of the real sizes: the dense
part's parameters and the tables are the real ones) and its optimizer all run for real.
Only the encoder's forward and backward (`DenseArch.forward`) become a sleep for the time
the calibrated cost model (`fsbench calibrate`: cost(L) = a L^2 + b L + c per sample,
plus the batch's fixed and per-bucket terms) gives this rank's samples: a third in
forward, the rest in backward, where DDP's all-reduce hooks fire as usual. Sleeping takes no CPU, so 8-32 ranks fit on 2 cores and
the straggler and communication structure of a large job is measured, not modelled.

Busy time in this mode is the emulated compute time: compute spans record the emulated
nanoseconds that elapsed inside them as their `cpu_ns`, and the real CPU the rank spent
there (lookups, optimizer, Python) as `overhead_ns`, which counts as neither busy nor
communication wait. Every summary of such a run says `emulated: true`.

The gradients that flow back are zeros of the right shapes: the parameters do not train,
which changes no size and no timing.
"""
from __future__ import annotations

import torch

from fsbench.measurement.clock import emulate

FORWARD_SHARE = 1 / 3


class _Emulated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cost_ns: float, *inputs: torch.Tensor) -> torch.Tensor:
        emulate(cost_ns * FORWARD_SHARE)
        ctx.cost_ns = cost_ns
        ctx.shapes = [(t.shape, t.dtype, t.device) for t in inputs]
        return inputs[0].new_zeros(())

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        emulate(ctx.cost_ns * (1 - FORWARD_SHARE))
        return (None, *(torch.zeros(s, dtype=d, device=dev) for s, d, dev in ctx.shapes))


class EmulatedCompute:
    """The encoder's cost per sample, from a calibrated fit (fsbench.costmodel.fit.CostFit)."""

    def __init__(self, fit) -> None:
        self.fit = fit

    def cost_ns(self, lengths: torch.Tensor) -> float:
        """The samples' cost(L), plus what the batch costs beyond them (its attention
        buckets: fsbench.costmodel.fit.CostFit.batch_extra_ms)."""
        if lengths.numel() == 0:
            return 0.0
        L = lengths.cpu().numpy()
        return self.fit.encoder_ms(L) * 1e6

    def loss(self, dense: torch.nn.Module, lookups, batch) -> torch.Tensor:
        """A loss of the encoder's inputs and parameters whose forward and backward wait
        for the modelled time and whose gradients have the real shapes."""
        return waiting_loss(self.cost_ns(batch.lengths), dense, lookups)


def waiting_loss(cost_ns: float, dense: torch.nn.Module, lookups) -> torch.Tensor:
    """A loss of the encoder's inputs and parameters that waits `cost_ns` (a third in
    forward, the rest in backward) and hands back zero gradients of the real shapes, all
    at once: the order in which the parameters' gradients become ready (DDP's buckets)
    is this function's, not the real encoder's (fsbench.scaling.ddp_buckets.dense_grad_bytes)."""
    inputs = [lookups.items, lookups.targets, lookups.negatives, lookups.users,
              lookups.contexts, *dense.parameters()]
    inputs = [t for t in inputs if t.requires_grad]
    if not inputs:  # nothing to differentiate (evaluation): wait for the forward only
        emulate(cost_ns * FORWARD_SHARE)
        return lookups.items.new_zeros(())
    return _Emulated.apply(cost_ns, *inputs)


# Set by the rank's worker before the trainer builds its model (one process is one rank).
ACTIVE: EmulatedCompute | None = None


def activate(fit) -> None:
    global ACTIVE
    ACTIVE = EmulatedCompute(fit)
