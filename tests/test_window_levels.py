"""The look-ahead window's step levels: a whale's step is filled up to its whale, the
other steps balanced below it (window._fillers), instead of every bin at one level."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import freescale_impl.window as window_mod
from freescale_impl.partition import karmarkar_karp, lpt
from freescale_impl.window import lookahead_window


def levels_by_sorting(pooled: np.ndarray, k: int, n: int) -> np.ndarray:
    """The pooled bound's levels the slow way: c_j the (jN+1)-th largest cost (0 past the
    last sample), and the smallest lam with N * sum_j max(c_j, lam) >= total (bisection)."""
    c = np.concatenate((np.sort(pooled)[::-1], np.zeros(k * n)))
    tops, total = c[[j * n for j in range(k)]], pooled.sum() / n
    lo, hi = 0.0, total
    for _ in range(200):
        lam = (lo + hi) / 2
        lo, hi = (lo, lam) if np.maximum(tops, lam).sum() >= total else (lam, hi)
    return np.maximum(tops, hi)


@settings(max_examples=60, deadline=None)
@given(k=st.integers(2, 5), n=st.integers(1, 8), size=st.integers(0, 120),
       whales=st.integers(0, 20), seed=st.integers(0, 2**16))
def test_fillers_are_the_gaps_to_the_top_level(k, n, size, whales, seed):
    """One placeholder per rank of every step below the top level, of the gap to it; the
    one-pass shortcut (only the largest sample above the level) agrees with sorting."""
    rng = np.random.default_rng(seed)
    pooled = rng.lognormal(2, 1, size)
    pooled[rng.choice(size, min(whales, size), replace=False)] *= rng.uniform(5, 200)
    got = window_mod._fillers(pooled, k, n)
    want = levels_by_sorting(pooled, k, n)
    if want[0] <= want[-1] * (1 + 1e-9):
        assert got.size == 0 or got.max() <= 1e-9 * pooled.sum()
        return
    gaps = want[0] - want
    expect = np.repeat(gaps[gaps > 0], n)
    assert got.size == expect.size
    np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-9 * pooled.sum())


@pytest.mark.parametrize("partitioner", [karmarkar_karp, lpt])
def test_the_whales_step_is_filled_up_to_its_whale(monkeypatch, partitioner):
    """One whale in four batches: balancing the pool to one level leaves the whale's step
    idling below the whale; the levels fill it, and the window comes within 1% of the
    pooled bound sum_j L_j, below both the per-batch plans and the one-level pool."""
    rng = np.random.default_rng(11)
    n, size = 16, 2000
    batches = [rng.lognormal(2, 1, size) for _ in range(4)]
    batches[0][7] = 1.3 * batches[0].sum() / n  # a whale 30% above its batch's mean load
    pooled = np.concatenate(batches)
    levels = levels_by_sorting(pooled, 4, n)
    assert levels[0] > levels[1] and np.isclose(levels.sum(), pooled.sum() / n)

    def summed_max(steps):
        return sum(s.plan.max_load for s in steps)

    filled = lookahead_window(batches, n, 4, partitioner)
    assert all("+window4" in s.plan.method for s in filled)
    assert [len(s.samples) for s in filled] == [size] * 4
    monkeypatch.setattr(window_mod, "_fillers", lambda *a: np.empty(0))
    cuts = np.cumsum([0] + [size] * 4)
    one_level = summed_max(window_mod._pack_window(batches, cuts, n, partitioner, 0))
    per_batch = sum(partitioner(c, n).max_load for c in batches)
    assert summed_max(filled) <= levels.sum() * 1.01
    assert summed_max(filled) < min(one_level, per_batch) * 0.99
