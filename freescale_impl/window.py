"""The look-ahead window: K consecutive global batches re-packed with one of
`freescale_impl.partition`'s partitioners, so that whales run side by side in one step.
Split out of partition.py: it builds on the partitioners and their plans, never the
reverse. Pure numpy/python: importing this module must not import torch.
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np

from freescale_impl import plan_kernels, window_kernels
from freescale_impl.partition import Plan, _check, _descending, _from_owner, karmarkar_karp

__all__ = ["MIN_GAIN", "WindowStep", "lookahead_window"]

MIN_GAIN = 0.005
"""A window re-packs only when its per-batch plans' summed step maxima exceed the
group's total load / N (which no packing beats) by more than this fraction."""

# ---------------------------------------------------------------------------
# Look-ahead window: whales.
#
# A whale (one sample bigger than total/N) sets its step's time alone, however well the
# rest is balanced: max(total/N, largest) is the bound. With one whale per batch, K steps
# cost K whales. Pooling K batches and packing them into K*N bins (the same partitioner,
# K*N "virtual ranks") puts each whale in its own bin; the N heaviest bins then form step
# 0, the next N step 1, and so on: for fixed bins, grouping them in load order minimizes
# the sum of per-step maxima (the i-th step's max can be no smaller than the
# ((i-1)N+1)-th largest bin). So the whales run side by side in one step. The other bins
# are not evened out to one level: the whales' step is filled up to its whale and the
# other steps balanced below it (_fillers), which takes the window to sum_j L_j, the
# bound of any packing (yelp, 4 x 32,768 onto 256 ranks: 1.5% below the per-batch plans,
# where one level was 0.06% above them).
#
# Deviation from the data order: samples move between the K steps of their window (never
# out of it), so every sample is still trained exactly once per window, but a step's
# samples are no longer one original batch. Step sizes are kept (step i of the window has
# the size of the window's i-th batch) by moving the cheapest samples from over-full steps
# to under-full ones, where they go to the least-loaded ranks; they are small, so this
# barely moves any step's max.

class _Pairs(Sequence):
    """Samples of a window (positions in its batches laid end to end, starting at
    `cuts`; an int: all of that batch) as (batch offset, index) pairs, a list of tuples
    built when first read: the 131,072 tuples of 4 x 32,768 took longer than planning."""
    __slots__ = ("cuts", "at", "_list")
    __hash__ = None

    def __init__(self, cuts: np.ndarray, at):
        self.cuts, self.at, self._list = cuts, at, None

    def _pairs(self) -> list[tuple[int, int]]:
        if self._list is None and isinstance(self.at, int):
            self._list = [(self.at, i) for i in range(len(self))]
        elif self._list is None:
            offset = np.searchsorted(self.cuts, self.at, side="right") - 1
            self._list = list(zip(offset.tolist(), (self.at - self.cuts[offset]).tolist()))
        return self._list

    def positions(self) -> np.ndarray:
        """The samples' positions in the window's batches laid end to end."""
        if isinstance(self.at, int):
            return np.arange(self.cuts[self.at], self.cuts[self.at + 1], dtype=np.int64)
        return np.asarray(self.at, dtype=np.int64)

    def __len__(self) -> int:
        if isinstance(self.at, int):
            return int(self.cuts[self.at + 1] - self.cuts[self.at])
        return len(self.at)

    def __getitem__(self, i):
        return self._pairs()[i]

    def __iter__(self):
        return iter(self._pairs())

    def __eq__(self, other) -> bool:
        return self._pairs() == (other._pairs() if isinstance(other, _Pairs) else other)

    def __repr__(self) -> str:
        return repr(self._pairs())


@dataclass(frozen=True, eq=False)
class WindowStep:
    window_start: int
    """Index, in `costs_per_batch`, of the first batch of this step's window."""
    samples: Sequence[tuple[int, int]]
    """(batch_offset_in_window, sample_index) of each sample of the step, sorted; a
    list-like sequence of tuples, built when first read."""
    plan: Plan
    """The step's plan; its assignment indexes into `samples`."""

    def positions(self) -> np.ndarray:
        """Each sample's position in the window's batches laid end to end (what
        `samples` lists as pairs), as one array."""
        return self.samples.positions()


def lookahead_window(costs_per_batch, num_ranks: int, window: int,
                     partitioner: Callable[..., Plan] = karmarkar_karp) -> list[WindowStep]:
    """One WindowStep per input batch: consecutive groups of `window` batches (the last
    may be shorter) are re-packed so that each step is balanced. A group keeps its
    per-batch plans (and its data order) unless re-packing lowers the group's summed
    per-step max load, so a window is never worse in aggregate; window=1 gives exactly
    the per-batch plans of `partitioner`."""
    if not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window={window!r} must be an integer >= 1")
    batches = [_check(b, num_ranks) for b in costs_per_batch]
    steps: list[WindowStep] = []
    for start in range(0, len(batches), window):
        group = batches[start:start + window]
        cuts = np.cumsum([0] + [c.size for c in group])

        def plain() -> list[WindowStep]:
            return [WindowStep(start, _Pairs(cuts, j), partitioner(c, num_ranks))
                    for j, c in enumerate(group)]

        # No plan takes a step's max below max(its mean load, its largest sample), so none
        # takes the group's summed max below `floor` (its total / N), nor the per-batch
        # plans' below `bound` (both up to float rounding: the slack of 1e-9 covers it).
        floor = sum(float(c.sum()) for c in group) / num_ranks
        bound = sum(max(float(c.sum()) / num_ranks, float(c.max(initial=0))) for c in group)
        if len(group) == 1 or bound <= floor * (1 + MIN_GAIN) * (1 + 1e-9):
            # No whales, or hardly: per-batch plans within MIN_GAIN of `floor` leave less
            # to win than the pooled plan costs to compute (at 32,768 samples onto 256
            # ranks, more than the four plans themselves), and less than the cost model's
            # own error per rank (several %: a run's cost_prediction_error): kept as they are.
            kept = plain()
            if len(group) == 1 or sum(s.plan.max_load for s in kept) <= floor * (1 + MIN_GAIN):
                steps.extend(kept)
                continue
            packed = _pack_window(group, cuts, num_ranks, partitioner, start)
        else:
            # Whales: the per-batch plans are above MIN_GAIN, and re-packing nearly always
            # beats `bound`; then they need not be made (the same choice, at half the cost).
            packed = _pack_window(group, cuts, num_ranks, partitioner, start)
            if sum(s.plan.max_load for s in packed) < bound * (1 - 2e-9):
                steps.extend(packed)
                continue
            kept = plain()
        # Never worse than no window: keep the data order unless re-packing saves time,
        # more than float rounding (a different summation order can shave an ulp).
        if sum(s.plan.max_load for s in packed) < sum(s.plan.max_load for s in kept) * (1 - 1e-9):
            steps.extend(packed)
        else:
            steps.extend(kept)
    return steps


def _pack_window(batches: list[np.ndarray], cuts: np.ndarray, n: int, partitioner,
                 start: int) -> list[WindowStep]:
    k = len(batches)
    sizes = np.diff(cuts)
    pooled = np.concatenate(batches)
    fillers = _fillers(pooled, k, n)
    packed = partitioner(np.concatenate((pooled, fillers)) if fillers.size else pooled, k * n)
    method = f"{packed.method}+window{k}"
    bins, lens = np.concatenate(packed.assignment), [len(a) for a in packed.assignment]
    ends, loads = np.cumsum(lens), packed.loads
    if fillers.size:  # bins' loads without their fillers, which settling skips
        at = np.flatnonzero(bins >= pooled.size)
        loads = loads - np.bincount(np.searchsorted(ends, at, side="right"),
                                    weights=fillers[bins[at] - pooled.size], minlength=k * n)
    by_load = np.argsort(-loads, kind="stable")
    # The narrowest types: per-sample arrays of 131,072 int64s cost ~0.3 ms each to fill.
    step_of_bin = np.empty(k * n, dtype=np.min_scalar_type(k))
    rank_of_bin = np.empty(k * n, dtype=np.min_scalar_type(n))
    for j in range(k):
        group = np.sort(by_load[j * n:(j + 1) * n])  # ranks keep the bins' own order
        step_of_bin[group] = j
        rank_of_bin[group] = np.arange(n)
    if plan_kernels.use(pooled.size):  # the same steps and plans, compiled
        return [WindowStep(start, _Pairs(cuts, at), Plan(assignment, loads, method, largest))
                for at, assignment, loads, largest in window_kernels.settle(
                    pooled, bins, ends, step_of_bin, rank_of_bin, sizes, n)]
    bin_of = np.repeat(np.arange(k * n), lens)
    real = bins < pooled.size
    step, rank = np.empty(pooled.size, step_of_bin.dtype), np.empty(pooled.size, rank_of_bin.dtype)
    step[bins[real]], rank[bins[real]] = step_of_bin[bin_of[real]], rank_of_bin[bin_of[real]]
    _keep_step_sizes(pooled, step, rank, sizes, n)
    steps = [np.flatnonzero(step == j) for j in range(k)]
    # Each step's samples in pooled order, which is (offset, index) order.
    return [WindowStep(start, _Pairs(cuts, c), _from_owner(pooled[c], rank[c], n, method))
            for c in steps]


def _fillers(pooled: np.ndarray, k: int, n: int) -> np.ndarray:
    """Placeholders that let the pooled plan fill whales' steps up to their whales.

    No packing of K steps of N ranks beats sum_j L_j, where step j's level L_j is at least
    c_j, the (jN+1)-th largest cost (the j-th step holds one of the jN+1 largest samples),
    and N * sum_j L_j covers the total: L_j = max(c_j, lam) at the water level lam where
    that sum is the total. Balancing the pool to one level wastes the whale's step: its
    other ranks idle up to the whale while the other steps carry their load. Giving each
    rank of step j a placeholder of L_0 - L_j (one per rank; the partitioner places the
    big ones apart) leaves every bin at about L_0, the bins of step j at about L_j of real
    samples. Empty without whales (every L_j = lam): the pool is balanced to one level."""
    m, total = pooled.size, float(pooled.sum()) / n
    top = float(pooled.max(initial=0))
    if k == 1 or top <= total / k:
        return np.empty(0)
    lam = max((total - top) / (k - 1), 0.0)  # the level c_0 alone leaves (0: c_0 > total)
    if np.count_nonzero(pooled > lam) <= n:
        # The common case, one pass: only c_0 is above lam (the (N+1)-th largest is not),
        # so the sort below is not needed.
        levels = np.concatenate(([top], np.full(k - 1, lam)))
    else:
        kth = [m - 1 - j * n for j in range(k) if j * n < m]
        tops = np.sort(np.partition(pooled, kth)[kth])[::-1]  # c_0 >= c_1 >= ...
        levels = tops = np.concatenate((tops, np.zeros(k - tops.size)))  # 0: no such sample
        for p in range(len(tops)):  # p steps are set by their own c_j, the rest by lam
            lam = max((total - float(tops[:p].sum())) / (k - p), 0.0)
            if tops[p] <= lam:
                levels = np.concatenate((tops[:p], np.full(k - p, lam)))
                break
    if levels[0] <= levels[-1]:
        return np.empty(0)
    gap = levels[0] - levels
    return np.repeat(gap[gap > 0], n)


def _keep_step_sizes(costs: np.ndarray, step: np.ndarray, rank: np.ndarray,
                     sizes: np.ndarray, n: int) -> None:
    """Move the cheapest samples of over-full steps to under-full ones (in place), each to
    the least-loaded rank of its new step, biggest first (LPT)."""
    surplus = np.bincount(step, minlength=len(sizes)) - sizes
    if not surplus.any():
        return
    moved = []
    for j in np.flatnonzero(surplus > 0):
        mine = np.flatnonzero(step == j)
        moved.append(mine[_cheapest(costs[mine], surplus[j])])
    pool = np.concatenate(moved)
    pool = pool[_descending(costs[pool])].tolist()
    for j in np.flatnonzero(surplus < 0):
        mine = step == j
        loads = np.bincount(rank[mine], weights=costs[mine], minlength=n).tolist()
        heap = [(loads[r], r) for r in range(n)]
        heapq.heapify(heap)
        need = int(-surplus[j])
        take, pool = pool[:need], pool[need:]
        for i in take:
            load, r = heap[0]
            heapq.heapreplace(heap, (load + costs[i], r))
            step[i], rank[i] = j, r


def _cheapest(c: np.ndarray, s: int) -> np.ndarray:
    """np.argsort(c, kind="stable")[:s] without sorting all of c (2 ms for 32,768): those
    below the s-th smallest cost, then the first of those equal to it, sorted."""
    if s >= c.size:
        return np.argsort(c, kind="stable")
    cut = np.partition(c, s - 1)[s - 1]
    pick = np.flatnonzero(c < cut)
    pick = np.concatenate((pick, np.flatnonzero(c == cut)[:s - pick.size]))
    return pick[np.argsort(c[pick], kind="stable")]
