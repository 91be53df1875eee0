"""A batch's encoder cost beyond its samples' cost(L) (the formulas; `fsbench calibrate`
measures it: fsbench.costmodel.calibrate.measure_batch_terms):

    extra = batch_ms + batch_sample_ms x samples + bucket_ms x buckets
            + wide_ms_per_melem x wide excess + footprint_per_ktoken x sum cost(L) x ktokens beyond

cost(L) is measured on batches of about 2,048 tokens of one length. A jagged batch pays a
fixed cost, one per sample (cost(L)'s constant was measured at one batch size) and one
per attention bucket (an attention call per layer each); and a bucket
of many long samples makes (samples, heads, P, P) attention tensors of tens of
megabytes, which on this kind of host cost more per element (measured on the 2-core VM:
128 samples of length 200 took 1.59x the per-sample time of 10 of them, 64 took 1.23x;
tensors that large come from the allocator as fresh pages, ~0.4 ms a megabyte:
`python scripts/host_memory_probe.py`). The wide excess
is each bucket's samples x padded length^2 beyond `wide_threshold_melem` million,
summed. The footprint term is the same effect at the batch's scale: every token's
activations grow with the batch, and a batch of more tokens than cost(L) was timed on
runs slower per token at every length (measured on the 2-core VM, fixed lengths 8, 32,
100 and 200: 0.94-1.06x cost(L) at 4,096 tokens, 1.17-1.29x at 16,384; `python
scripts/encoder_model_check.py --store S --footprint`). It is a fraction
of the batch's cost(L) per thousand tokens beyond TOKENS_PER_POINT. Without it the growth
was booked per sample (calibration batches of one length distribution grow in samples
and tokens together), which over-charged batches of many short samples (by up to 135%
in results/encoder_model_check_cpu.md).
All six are fitted together, all >= 0 but the per-sample term (cost(L)'s constant can be
too large or too small), on jagged batches of the workload's lengths at the per-rank
sizes of its global batch, on fixed-length batches of its longest lengths at sizes
doubling up to the global batch, and on batches of many short samples (many samples,
few tokens: what tells a sample's cost from a token's).
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

import numpy as np

from fsbench.models.jagged import Bucketing

TOKENS_PER_POINT = 2048
"""Each batch timed for cost(L) holds about this many tokens (at least one sample), so
short and long lengths are timed over similar amounts of work."""


@dataclass(frozen=True, slots=True)
class BatchTerms:
    """The fitted terms, named as CostFit's fields."""
    batch_ms: float
    batch_sample_ms: float
    bucket_ms: float
    wide_ms_per_melem: float
    wide_threshold_melem: float
    footprint_per_ktoken: float


def attention_melem(lengths, bucketing: Bucketing = Bucketing()) -> np.ndarray:
    """Each attention bucket's samples x padded length^2, in millions (DenseArch's
    default bucketing)."""
    counts = Counter(bucketing.padded_length(int(L)) for L in np.asarray(lengths).ravel())
    return np.array([n * P * P / 1e6 for P, n in counts.items()], dtype=np.float64)


def wide_excess(lengths, threshold: float) -> float:
    """Million attention elements beyond `threshold`, summed over the batch's buckets."""
    return float(np.clip(attention_melem(lengths) - threshold, 0.0, None).sum())


def footprint_excess(lengths, cost_ms) -> float:
    """The batch's cost(L) sum times its thousands of tokens beyond TOKENS_PER_POINT."""
    lengths = np.asarray(lengths).ravel()
    beyond = max(0.0, float(lengths.sum()) - TOKENS_PER_POINT) / 1e3
    return float(np.sum(cost_ms(lengths))) * beyond if beyond else 0.0


def _nonnegative_lstsq(design: np.ndarray, y: np.ndarray, free: tuple[int, ...] = ()
                       ) -> tuple[np.ndarray, float]:
    """Least squares with every coefficient >= 0 but those of the `free` columns (exact:
    the best of the fits over each subset of columns whose constrained coefficients all
    come out >= 0); (coefficients, SSE)."""
    best = (np.zeros(design.shape[1]), float(y @ y))
    for k in range(1, design.shape[1] + 1):
        for cols in itertools.combinations(range(design.shape[1]), k):
            coef = np.linalg.lstsq(design[:, cols], y, rcond=None)[0]
            if any(c < 0 and col not in free for c, col in zip(coef, cols)):
                continue
            sse = float(np.sum((y - design[:, cols] @ coef) ** 2))
            if sse < best[1]:
                full = np.zeros(design.shape[1])
                full[list(cols)] = coef
                best = (full, sse)
    return best


def bucket_count(lengths, bucketing: Bucketing = Bucketing()) -> int:
    """Distinct attention buckets of a batch of these lengths (DenseArch's default)."""
    return len({bucketing.padded_length(int(L)) for L in np.asarray(lengths).ravel()})


def fit_batch_terms(batches: list[tuple[np.ndarray, float]], cost_ms) -> BatchTerms:
    """The terms from (lengths, residual ms beyond cost(L)) per timed batch, cost_ms
    being that cost(L); the threshold is the best of 0 and each bucket size seen."""
    y = np.array([r for _, r in batches], dtype=np.float64)
    base = np.array([[1.0, len(L), bucket_count(L), footprint_excess(L, cost_ms)] for L, _ in batches],
                    dtype=np.float64)
    seen = sorted({float(x) for L, _ in batches for x in attention_melem(L)})
    best = None
    for threshold in [0.0, *seen]:
        excess = np.array([[wide_excess(L, threshold)] for L, _ in batches])
        coef, sse = _nonnegative_lstsq(np.hstack([base, excess]), y, free=(1,))
        if best is None or sse < best[0] - 1e-12 * max(1.0, best[0]):
            best = (sse, coef, threshold)
    _, coef, threshold = best
    fixed, per_sample, per_bucket, footprint, slope = (0.0 if abs(c) < 1e-9 else float(c) for c in coef)
    return BatchTerms(batch_ms=fixed, batch_sample_ms=per_sample, bucket_ms=per_bucket,
                      wide_ms_per_melem=slope, wide_threshold_melem=float(threshold) if slope else 0.0,
                      footprint_per_ktoken=footprint)
