"""Per-sample cost models for the load balancer: calibrated when a fit exists, else FLOPs.

The balancer needs each sample's cost as a function of its history length L. Attention
grows as L^2, projections, FFN and the loss as L; `fsbench calibrate` measures the real
curve on the device (a L^2 + b L + c, in ms). When no calibration matches this model and
device, an analytical FLOP count of the same shape stands in (relative costs are all a
partitioner needs), and the trainer says which one it used.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fsbench.costmodel.fit import fit_path, load_fit
from fsbench.costmodel.cost_curve import quadratic_cost
from fsbench.config import WorkloadConfig


@dataclass(frozen=True, slots=True)
class CostModel:
    a: float
    b: float
    c: float
    unit: str
    """`ms` for a calibrated fit (comparable with measured busy time), `flop` otherwise."""
    source: str
    """Human-readable: which model, from where."""
    padded: bool = False
    """The square term is of the padded length (a calibrated fit's, quadratic_cost)."""

    def __call__(self, lengths) -> np.ndarray:
        return quadratic_cost(self.a, self.b, self.c, lengths, self.padded)


def analytical_cost(workload: WorkloadConfig) -> CostModel:
    """Forward+backward FLOPs of one sample of length L (backward ~ 2x forward).

    Per layer and token: HSTU projects to U,V,Q,K (4 D^2) and back (D^2); SASRec has
    Q,K,V,O (4 D^2) and a 4x FFN (8 D^2). Causal attention costs ~ L^2 D per layer for
    Q K^T and as much for A V (2 flops per multiply-add, half the square). The sampled
    softmax costs (1 + negatives) D per token.
    """
    m = workload.model
    if workload.compute == "synthetic":  # ground-truth mode: cost is exactly per token
        return CostModel(0.0, workload.synthetic.us_per_token / 1e3, 0.0, "ms",
                         "synthetic compute (exact per-token cost)")
    proj = 5 if m.family == "hstu" else 12
    fwd_a = m.num_layers * 2 * m.dim                       # 2 matmuls x (L^2/2) x D x 2
    fwd_b = m.num_layers * 2 * proj * m.dim ** 2 + 2 * (1 + workload.negatives_per_step) * m.dim
    return CostModel(3 * fwd_a, 3 * fwd_b, 0.0, "flop",
                     f"analytical FLOPs ({m.family}, dim {m.dim}, {m.num_layers} layers)")


def cost_model(workload: WorkloadConfig, store_dir: str | Path | None, device: str,
               choice: str = "auto", fit=None) -> CostModel:
    """`calibrated`, `analytical`, or `auto` (calibrated when a matching fit is stored,
    or `fit` is given)."""
    if fit is None and store_dir is not None:
        fit = load_fit(store_dir, workload, device)
    if choice == "calibrated" and fit is None:
        where = fit_path(store_dir or ".", workload, device)
        raise FileNotFoundError(f"freescale.cost=calibrated but no fit at {where}; "
                                f"run: fsbench calibrate --workload {workload.name}")
    if fit is not None and choice in ("auto", "calibrated") and workload.compute != "synthetic":
        return CostModel(fit.a, fit.b, fit.c, "ms",
                         f"calibrated on {fit.device} (R^2 {fit.r2:.3f}, {fit.created[:10]})",
                         padded=bool(fit.padded))
    return analytical_cost(workload)
