"""Does training amplify float rounding? `fsbench quality`'s trajectory check asks.

The trajectory check holds a trainer's per-step losses to DDP's within `LOSS_RTOL`: every
trainer computes the same function, so only rounding (another summation order) parts them.
That holds while training damps rounding, not where it amplifies it. Some settings do:
Adagrad's first update of a weight is lr x sign(gradient) whatever the gradient's size, so
a weight whose gradient is nearly zero (HSTU's LayerNorm after A V leaves some nearly
zero) moves by +-lr on the sign of its rounding, and the trajectories part within a few
steps; a correct trainer would then be called NOT equivalent.

The probe trains the single-process reference model twice on the same batches, once with
every weight scaled by (1 + PERTURBATION x N(0, 1)), a rounding-sized difference, and
returns the step at which the two losses first part by more than the tolerance. A
trainer's departure at or after that step is no evidence of another function.
"""
from __future__ import annotations

import numpy as np

PERTURBATION = 1e-7
"""Relative size of the probe's perturbation: float32 rounding's (2^-24 = 6e-8)."""


def _losses(workload, seed: int, steps: int, perturb: float, held_out: int) -> np.ndarray:
    import torch

    from fsbench.models import build_model
    from fsbench.training.optim import make_optimizer
    from fsbench.workloads import make_batch_source

    model = build_model(workload, seed)
    if perturb:
        noise = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + perturb * torch.randn(p.shape, generator=noise))
    optimizer = make_optimizer(model.parameters(), workload)
    source = make_batch_source(workload, seed, held_out=held_out)
    out = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = model(source.global_batch(step))
        loss.backward()
        optimizer.step()
        out.append(float(loss.detach()))
    return np.asarray(out)


def baseline_departure(workload, seed: int, steps: int, rtol: float,
                       held_out: int = 2) -> int | None:
    """The first step (of `steps`) at which the reference and its perturbed copy part by
    more than `rtol` relative; None if they do not."""
    a = _losses(workload, seed, steps, 0.0, held_out)
    b = _losses(workload, seed, steps, PERTURBATION, held_out)
    off = np.flatnonzero(~(np.abs(a - b) <= rtol * np.maximum(np.abs(a), 1e-12)))
    return int(off[0]) if off.size else None
