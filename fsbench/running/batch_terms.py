"""A batch's encoder cost beyond its samples' cost(L), measured by `fsbench calibrate`:

    extra = batch_ms + sample_ms x samples + bucket_ms x buckets + wide_ms_per_melem x wide excess

cost(L) is measured on batches of about 2,048 tokens of one length. A jagged batch pays a
fixed cost, one per sample (cost(L)'s constant was measured at one batch size) and one
per attention bucket (an attention call per layer each); and a bucket
of many long samples makes (samples, heads, P, P) attention tensors of tens of
megabytes, which on this kind of host cost more per element (measured on the 2-core VM:
128 samples of length 200 took 1.59x the per-sample time of 10 of them, 64 took 1.23x;
tensors that large come from the allocator as fresh pages, ~0.4 ms a megabyte:
`python scripts/host_memory_probe.py`). The wide excess
is each bucket's samples x padded length^2 beyond `wide_threshold_melem` million,
summed. All five are fitted together, all >= 0 but the per-sample term (cost(L)'s
constant can be too large or too small), on jagged batches of the workload's
lengths at the per-rank sizes of its global batch and on fixed-length batches of its
longest lengths at sizes doubling up to the global batch.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

import numpy as np

from fsbench.models.jagged import Bucketing


def attention_melem(lengths, bucketing: Bucketing = Bucketing()) -> np.ndarray:
    """Each attention bucket's samples x padded length^2, in millions (DenseArch's
    default bucketing)."""
    counts = Counter(bucketing.padded_length(int(L)) for L in np.asarray(lengths).ravel())
    return np.array([n * P * P / 1e6 for P, n in counts.items()], dtype=np.float64)


def wide_excess(lengths, threshold: float) -> float:
    """Million attention elements beyond `threshold`, summed over the batch's buckets."""
    return float(np.clip(attention_melem(lengths) - threshold, 0.0, None).sum())


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


def fit_batch_terms(batches: list[tuple[np.ndarray, float]]) -> tuple[float, float, float, float, float]:
    """(batch_ms, sample_ms, bucket_ms, wide_ms_per_melem, wide_threshold_melem) from
    (lengths, residual ms beyond cost(L)) per timed batch; the threshold is the best of 0
    and each bucket size seen."""
    from fsbench.running.calibrate import bucket_count

    y = np.array([r for _, r in batches], dtype=np.float64)
    base = np.array([[1.0, len(L), bucket_count(L)] for L, _ in batches], dtype=np.float64)
    seen = sorted({float(x) for L, _ in batches for x in attention_melem(L)})
    best = None
    for threshold in [0.0, *seen]:
        excess = np.array([[wide_excess(L, threshold)] for L, _ in batches])
        coef, sse = _nonnegative_lstsq(np.hstack([base, excess]), y, free=(1,))
        if best is None or sse < best[0] - 1e-12 * max(1.0, best[0]):
            best = (sse, coef, threshold)
    _, (fixed, per_sample, per_bucket, slope), threshold = best
    clean = [0.0 if abs(c) < 1e-9 else float(c) for c in (fixed, per_sample, per_bucket, slope)]
    if clean[3] == 0.0:  # no wide term
        threshold = 0.0
    return clean[0], clean[1], clean[2], clean[3], float(threshold)


def measure_batch_terms(workload, cost_ms, device: str = "cpu", batches: int = 3, repeats: int = 3,
                        max_split: int = 16) -> tuple[float, float, float, float, float]:
    """fit_batch_terms over timed batches (see the module docstring) less the sum of
    cost_ms(L)."""
    from fsbench.models import build_model
    from fsbench.running.calibrate import CALIBRATION_SEED, TOKENS_PER_POINT, time_encoder_ms
    from fsbench.workloads.generator import SyntheticBatches

    timed = []

    def time_batch(model, batch) -> None:
        lengths = batch.lengths.cpu().numpy()
        took = time_encoder_ms(model, batch.to(device), repeats, warmup=1, device=device)
        timed.append((lengths, took - float(np.sum(cost_ms(lengths)))))

    model = build_model(workload, seed=0).to(device)
    for size in sorted({max(1, workload.global_batch_size // k) for k in (1, 2, 4, 8, 16) if k <= max_split}):
        source = SyntheticBatches(dataclasses.replace(workload, global_batch_size=size), seed=CALIBRATION_SEED)
        for k in range(batches):
            time_batch(model, source.global_batch(k))
    for length in sorted({workload.max_seq_len, max(8, workload.max_seq_len // 2)}):
        n = max(1, TOKENS_PER_POINT // length)
        while True:
            w = dataclasses.replace(workload, lengths=f"fixed:{length}", global_batch_size=n)
            time_batch(build_model(w, seed=0).to(device), SyntheticBatches(w, seed=0).global_batch(0))
            if n >= workload.global_batch_size:
                break
            n = min(2 * n, workload.global_batch_size)
    fixed, per_sample, per_bucket, slope, threshold = fit_batch_terms(timed)
    # A negative per-sample term corrects cost(L)'s constant; it never makes a sample free.
    per_sample = max(per_sample, -float(np.asarray(cost_ms(np.array([1])))[0]))
    return fixed, per_sample, per_bucket, slope, threshold
