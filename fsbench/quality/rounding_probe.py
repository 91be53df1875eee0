"""Does training amplify float rounding? `fsbench quality`'s trajectory check asks.

The trajectory check holds a trainer's per-step losses to DDP's within `LOSS_RTOL`: every
trainer computes the same function, so only rounding (another summation order) parts them.
That holds while training damps rounding, not where it amplifies it. Some settings do:
Adagrad's first update of a weight is lr x sign(gradient) whatever the gradient's size, so
a weight whose gradient is nearly zero moves by +-lr on the sign of its rounding (the
likely mechanism, not isolated), and the trajectories part within a few steps; a correct
trainer would then be called NOT equivalent (HSTU on MovieLens-100K at 16 windows a step:
`python scripts/rounding_sensitivity.py`).

The probe trains the single-process reference model twice on the same batches, once with
every weight scaled by (1 + PERTURBATION x N(0, 1)), a rounding-sized difference, and
returns the step at which the two losses first part by more than the tolerance. A
trainer's departure at or after that step is no evidence of another function.
"""
from __future__ import annotations

import numpy as np

PERTURBATION = 1e-7
"""Relative size of the probe's perturbation: float32 rounding's (2^-24 = 6e-8)."""


def loss_pair(run, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The single-process reference's losses over `steps` of `run` (a RunConfig: its
    workload, seed and held-out items), and its copy's with every weight scaled by
    (1 + PERTURBATION x N(0, 1))."""
    return tuple(_losses(run.workload, run.seed, steps, eps, run.held_out_items)
                 for eps in (0.0, PERTURBATION))


def _losses(workload, seed: int, steps: int, perturb: float, held_out: int) -> np.ndarray:
    import torch

    from fsbench.models import build_model
    from fsbench.training.optim import make_model_optimizer
    from fsbench.workloads import make_batch_source

    model = build_model(workload, seed)
    if perturb:
        noise = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + perturb * torch.randn(p.shape, generator=noise))
    optimizer = make_model_optimizer(model, workload)
    source = make_batch_source(workload, seed, held_out=held_out)
    out = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = model(source.global_batch(step))
        loss.backward()
        optimizer.step()
        out.append(float(loss.detach()))
    return np.asarray(out)


def baseline_departure(run, steps: int, rtol: float) -> int | None:
    """The first step (of `steps`) at which `run`'s reference and its perturbed copy part
    by more than `rtol` relative; None if they do not."""
    a, b = loss_pair(run, steps)
    off = np.flatnonzero(~(np.abs(a - b) <= rtol * np.maximum(np.abs(a), 1e-12)))
    return int(off[0]) if off.size else None
