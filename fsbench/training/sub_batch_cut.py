"""How a rank's samples are cut into sub-batches: one function, which FreeScale's trainer
cuts its steps with (freescale_impl.exchange_plan) and the simulator books each
sub-batch's encoder pass by (fsbench.scaling.simulate), so both cut alike."""
from __future__ import annotations

import numpy as np


def growth_shares(chunks: int, growth: float = 1.0) -> np.ndarray:
    """Each sub-batch's share of the weight: `growth` times the one before (1: equal)."""
    shares = float(growth) ** np.arange(chunks, dtype=np.float64)
    return shares / shares.sum()


def sub_batch_bounds(weights: np.ndarray, chunks: int, growth: float = 1.0) -> np.ndarray:
    """(chunks + 1) sample bounds cutting a rank's samples into `chunks` contiguous
    sub-batches (sub-batch c: samples bounds[c]..bounds[c+1]) of about equal weight, or
    each `growth` times the one before, none empty; with fewer samples than chunks, one
    sample each and the empty ones last. `weights[i]`: sample i's tokens (what the
    trainer cuts by).

    Why growth: sub-batch 0 is the one the forward waits for before it starts, and its
    chunk (the shared negatives, the popular items) leaves last in backward; a smaller
    first sub-batch shortens both, where the later ones' compute hides the rest. The
    chunk rule chooses it (fsbench.scaling.chunk_replay).

    Why tokens: chunk c holds the rows sub-batch c is the first to read, so chunk 0 (the
    shared negatives, the popular items) is the largest, and it is on the step's critical
    path at both ends. A cut at equal rows would shrink it, but it starves sub-batch 0,
    whose backward makes every dense gradient and hides the dense all-reduce: on short
    histories, where the negatives are much of the rows, that cost more than it saved
    (docs/simulation.md, "How sub-batches are cut")."""
    weights = np.asarray(weights, dtype=np.float64)
    b, arange = weights.size, np.arange(chunks + 1)
    if b <= chunks:
        return np.minimum(arange, b)
    # Each bound at the sample boundary nearest its target (unbiased: the sample that
    # straddles a target goes to the side it mostly lies on).
    ends = np.concatenate([[0], np.cumsum(weights)])  # weight before sample i, i = 0..b
    targets = ends[-1] * np.concatenate([[0.0], np.cumsum(growth_shares(chunks, growth))])
    targets[-1] = ends[-1]
    above = np.clip(np.searchsorted(ends, targets, side="left"), 1, b)
    bounds = np.where(ends[above] - targets < targets - ends[above - 1], above, above - 1)
    bounds[0], bounds[-1] = 0, b
    # At least one sample each: strictly increasing bounds.
    bounds = np.clip(bounds, arange, b - chunks + arange)
    return np.maximum.accumulate(bounds - arange) + arange
