"""cost(L): one sample's encoder cost by its length, the curve `fsbench calibrate` fits
to batches of one length (fsbench.costmodel.calibrate) and the balancer, the emulation and
the simulator read."""
from __future__ import annotations

import numpy as np

from fsbench.models.jagged import Bucketing


def _squared_length(L: np.ndarray, padded: bool) -> np.ndarray:
    """What the square term squares: the padded length P(L), or L."""
    return Bucketing().padded_lengths(np.maximum(L, 1)).astype(np.float64) if padded else L


def quadratic_cost(a: float, b: float, c: float, lengths, padded: bool) -> np.ndarray:
    """a X^2 + b L + c per sample, X its padded length P(L) or (`padded` false) L.

    Each sample's attention runs at its bucket's padded length (up to 1.25x L, so up to
    1.56x the square), and cost(L) is timed on batches of one length, which pad alike: a
    fit on L^2 bends its curve through those steps, and a jagged batch of other lengths
    then pays what its own padding costs, not the curve's."""
    L = np.asarray(lengths, dtype=np.float64)
    X = _squared_length(L, padded)
    return a * X * X + b * L + c


def default_lengths(max_len: int) -> list[int]:
    grid = sorted({1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 200, 256, 384, 512, 768, 1024,
                   1536, 2048, 3072, 4096, max_len})
    return [L for L in grid if L <= max_len]


def fit_quadratic(lengths, costs, padded: bool = True) -> tuple[float, float, float, float]:
    """a, b, c of a P(L)^2 + b L + c (quadratic_cost) by least squares on *relative*
    error, and R^2.

    Relative, because plain least squares lets the few longest lengths set the fit and
    leaves short lengths (most samples of a heavy-tailed batch) off by 2-3x; a balancer
    sums many short samples, so their error matters as much as the whales'."""
    L = np.asarray(lengths, dtype=np.float64)
    y = np.asarray(costs, dtype=np.float64)
    X = _squared_length(L, padded)
    design = np.stack([X * X, L, np.ones_like(L)], axis=1)
    weight = 1.0 / np.maximum(y, 1e-12)
    (a, b, c), *_ = np.linalg.lstsq(design * weight[:, None], y * weight, rcond=None)
    residual = y - design @ np.array([a, b, c])
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((residual ** 2).sum()) / total if total > 0 else 1.0
    return float(a), float(b), float(c), r2
