"""Load-balanced input samples: FreeScale's first technique.

Every rank of a data-parallel group receives the same global batch (or all-gathers its
lengths) and computes the same plan from the same per-sample costs, with no further
communication. So everything here is a pure, deterministic function of its inputs:

* ties are broken by sample index (or rank index), never by dict/set order or hashes;
* float costs are compared exactly: every rank holds bit-identical inputs and runs the
  same operations in the same order, so an exact comparison gives the same answer on each;
* a plan's loads are always recomputed from its assignment with one `np.bincount`, so two
  plans with the same assignment have bit-identical loads whichever algorithm made them.

Partitioners all have the shape `f(costs, num_ranks, **opts) -> Plan`:

    contiguous      what the baselines do: B/N consecutive samples per rank
    random_split    a seeded permutation with equal counts (a reference point only)
    lpt             Longest Processing Time greedy (Graham 1969); optional token cap
    karmarkar_karp  k-way largest differencing (Karmarkar-Karp, Korf's generalization)
    best_of         KK and LPT, whichever has the smaller max load (ties: KK)

`balance_microbatches` splits one rank's share into gradient-accumulation micro-batches;
`freescale_impl.window.lookahead_window` re-packs K consecutive global batches with these
partitioners so that whales (samples much larger than a rank's fair share) run side by
side in one step instead of one per step.

Pure numpy/python: importing this module must not import torch. Batches of thousands of
samples run the same algorithms compiled (plan_kernels: numba, optional), with the same plans.
"""
from __future__ import annotations

import array
import heapq
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from freescale_impl import plan_kernels
from freescale_impl.kk_core import kk_subsets

__all__ = [
    "Plan", "contiguous", "random_split", "lpt", "karmarkar_karp", "best_of",
    "balance_microbatches", "PARTITIONERS",
]


@dataclass(frozen=True, eq=False)
class Plan:
    """Which samples each rank trains, and the cost that gives it."""
    assignment: list[np.ndarray]
    """Sample indices per rank (int64, each sorted ascending); every sample exactly once."""
    loads: np.ndarray
    """Cost per rank (float64), the sum of its samples' costs."""
    method: str
    max_cost: float = 0.0
    """The largest single sample cost: no plan can have a rank below it."""

    @property
    def num_ranks(self) -> int:
        return len(self.assignment)

    @property
    def max_load(self) -> float:
        return float(self.loads.max()) if len(self.loads) else 0.0

    @property
    def mean_load(self) -> float:
        return float(self.loads.mean()) if len(self.loads) else 0.0

    @property
    def lower_bound(self) -> float:
        """max(total/N, largest sample): no assignment has a smaller max load."""
        return max(float(self.loads.sum()) / max(self.num_ranks, 1), self.max_cost)

    @property
    def ratio_to_bound(self) -> float:
        bound = self.lower_bound
        return self.max_load / bound if bound > 0 else 1.0

    @property
    def bubble(self) -> float:
        """Straggler-bubble proxy sum_r(max - load_r) / (N * max): the fraction of rank
        time spent waiting for the slowest rank at the next collective."""
        top = self.max_load
        return float((top - self.loads).sum() / (self.num_ranks * top)) if top > 0 else 0.0

    def owner(self) -> np.ndarray:
        """Rank of each sample (the inverse of `assignment`)."""
        sizes = [len(a) for a in self.assignment]
        out = np.empty(sum(sizes), dtype=np.int64)
        if sizes:
            out[np.concatenate(self.assignment)] = np.repeat(np.arange(len(sizes)), sizes)
        return out


# ---------------------------------------------------------------------------
# Shared plumbing.

def _check(costs, num_ranks: int) -> np.ndarray:
    c = np.asarray(costs, dtype=np.float64)
    if c.ndim != 1:
        raise ValueError(f"costs must be 1-D, got shape {c.shape}")
    if not np.all(np.isfinite(c)) or (c.size and c.min() < 0):
        raise ValueError("costs must be finite and >= 0")
    if not isinstance(num_ranks, (int, np.integer)) or num_ranks < 1:
        raise ValueError(f"num_ranks={num_ranks!r} must be an integer >= 1")
    return c


def _from_owner(costs: np.ndarray, owner: np.ndarray, num_ranks: int, method: str) -> Plan:
    """Build a Plan from the rank of each sample. A stable sort of `owner` lists each
    rank's samples in ascending index order, and bincount sums them in that order too."""
    owner = np.asarray(owner, dtype=np.int64)
    counts = np.bincount(owner, minlength=num_ranks)
    # Stable argsort of a 16-bit key is a radix sort: 10x faster than on int64.
    key = owner.astype(np.int16) if num_ranks <= np.iinfo(np.int16).max else owner
    order = np.argsort(key, kind="stable")
    ends = np.cumsum(counts).tolist()
    loads = np.bincount(owner, weights=costs, minlength=num_ranks).astype(np.float64)
    return Plan(_split(order, ends), loads, method, float(costs.max()) if costs.size else 0.0)


def _split(order: np.ndarray, ends: list[int]) -> list[np.ndarray]:
    return [order[a:b] for a, b in zip([0] + ends[:-1], ends)]


def _uncapped(c: np.ndarray, num_ranks: int, which: int) -> Plan:
    """lpt (which=0), karmarkar_karp (1) or best_of (2) without a token cap; compiled
    for large batches (plan_kernels), with the same plan."""
    if plan_kernels.use(c.size):
        order, ends, loads, method = plan_kernels.plan(c, num_ranks, which)
        return Plan(_split(order, ends), loads, method, float(c.max()) if c.size else 0.0)
    order = _descending(c)
    if which == 0:
        return _from_owner(c, _lpt_owner(c, order, num_ranks, None, None), num_ranks, "lpt")
    kk, as_lpt = _kk_plan(c, num_ranks, order)
    if which == 1:
        return kk
    if as_lpt:  # see best_of
        return Plan(kk.assignment, kk.loads, "best_of:kk(=lpt)", kk.max_cost)
    other = _from_owner(c, _lpt_owner(c, order, num_ranks, None, None), num_ranks, "lpt")
    win = other if other.max_load < kk.max_load else kk
    return Plan(win.assignment, win.loads, "best_of:" + win.method, win.max_cost)


def _descending(costs: np.ndarray) -> np.ndarray:
    """Sample indices by cost descending, ties by lower index first."""
    if plan_kernels.use(costs.size):
        return plan_kernels.descending(costs)
    # A stable sort of -cost keeps equal costs in index order; -0.0 == 0.0 for the sort.
    return np.argsort(-costs, kind="stable")


# ---------------------------------------------------------------------------
# Reference splits.

def contiguous(costs, num_ranks: int) -> Plan:
    """The baselines' split: B/N consecutive samples per rank, the first B % N ranks take
    one more."""
    from fsbench.workloads.batch import contiguous_split  # lazy: fsbench imports torch

    c = _check(costs, num_ranks)
    owner = np.empty(c.size, dtype=np.int64)
    for r, idx in enumerate(contiguous_split(c.size, num_ranks)):
        owner[idx] = r
    return _from_owner(c, owner, num_ranks, "contiguous")


def random_split(costs, num_ranks: int, seed: int = 0) -> Plan:
    """A seeded random permutation cut into equal counts: what shuffling alone gives."""
    c = _check(costs, num_ranks)
    perm = np.random.default_rng(seed).permutation(c.size)
    owner = np.empty(c.size, dtype=np.int64)
    owner[perm] = np.arange(c.size) * num_ranks // max(c.size, 1)
    return _from_owner(c, owner, num_ranks, f"random(seed={seed})")


# ---------------------------------------------------------------------------
# LPT.

def _lpt_owner(costs: np.ndarray, order: np.ndarray, num_ranks: int,
               tokens: np.ndarray | None, cap: float | None) -> np.ndarray | None:
    """Each sample in `order` to the least-loaded rank (ties: fewer samples, then lower
    rank) whose token cap allows it; None if some sample fits nowhere."""
    # Heap entries (load, count, rank): among equally loaded ranks, the one with fewer
    # samples (less memory), then the lower rank.
    heap = [(0.0, 0, r) for r in range(num_ranks)]
    owner = np.empty(costs.size, dtype=np.int64)
    cs = costs[order].tolist()
    if cap is None:
        nonzero = np.count_nonzero(costs)  # zeros come last in `order`
        # Not owner[i] = r: numpy item stores are slow; an array.array is a list of
        # machine ints that numpy then reads without a copy.
        ranks = array.array("q", bytes(8 * nonzero))
        replace = heapq.heapreplace
        for pos, c in enumerate(cs[:nonzero]):
            load, n, r = heap[0]
            replace(heap, (load + c, n + 1, r))
            ranks[pos] = r
        owner[order[:nonzero]] = np.frombuffer(ranks, dtype=np.int64)
        _deal_zeros(owner, order[:nonzero], order[nonzero:], num_ranks)
        return owner
    room = [float(cap)] * num_ranks
    ts = tokens[order].tolist()
    for pos, i in enumerate(order.tolist()):
        skipped = []
        while heap and room[heap[0][2]] < ts[pos]:
            skipped.append(heapq.heappop(heap))  # full for this sample, maybe not for later
        if not heap:
            return None
        load, n, r = heap[0]
        heapq.heapreplace(heap, (load + cs[pos], n + 1, r))
        room[r] -= ts[pos]
        owner[i] = r
        for entry in skipped:
            heapq.heappush(heap, entry)
    return owner


def _deal_zeros(owner: np.ndarray, placed: np.ndarray, zeros: np.ndarray,
                num_ranks: int) -> None:
    """Zero-cost samples change no load: deal them (in place, in index order) to the ranks
    with the fewest samples, ties to the lower rank, to even out counts (memory)."""
    if not zeros.size:
        return
    heap = [(n, r) for r, n in enumerate(np.bincount(owner[placed], minlength=num_ranks)
                                         .tolist())]
    heapq.heapify(heap)
    for i in zeros.tolist():
        n, r = heap[0]
        heapq.heapreplace(heap, (n + 1, r))
        owner[i] = r


def _check_cap(c: np.ndarray, num_ranks: int, tokens, cap) -> np.ndarray:
    if tokens is None:
        raise ValueError("max_tokens_per_rank needs tokens=, the per-sample token counts")
    t = np.asarray(tokens, dtype=np.float64)
    if t.shape != c.shape or not np.all(np.isfinite(t)) or (t.size and t.min() < 0):
        raise ValueError(f"tokens must be finite, >= 0 and shaped like costs {c.shape}")
    if t.size and t.max() > cap:
        i = int(np.argmax(t))
        raise ValueError(f"infeasible max_tokens_per_rank={cap:g}: sample {i} alone has "
                         f"{t[i]:g} tokens, so no rank can hold it")
    total = math.fsum(t.tolist())  # exact, so every rank reaches the same verdict
    if total > cap * num_ranks:
        raise ValueError(f"infeasible max_tokens_per_rank={cap:g}: the batch has "
                         f"{total:g} tokens but {num_ranks} ranks hold at most "
                         f"{cap * num_ranks:g}")
    return t


def lpt(costs, num_ranks: int, *, tokens=None, max_tokens_per_rank: float | None = None
        ) -> Plan:
    """Longest Processing Time: samples by cost descending, each to the least-loaded rank.
    Max load <= (4/3 - 1/(3N)) x optimum (Graham 1969). With `max_tokens_per_rank`, each
    sample goes to the least-loaded rank with room for its `tokens`."""
    c = _check(costs, num_ranks)
    if max_tokens_per_rank is None:
        return _uncapped(c, num_ranks, 0)
    t = _check_cap(c, num_ranks, tokens, max_tokens_per_rank)
    # Cost order first (best balance); if that packs badly, token order, which is first-
    # fit-decreasing packing and succeeds far more often when the cap is tight.
    for order in (_descending(c), np.lexsort((np.arange(c.size), -c, -t))):
        owner = _lpt_owner(c, order, num_ranks, t, float(max_tokens_per_rank))
        if owner is not None:
            return _from_owner(c, owner, num_ranks, "lpt[cap]")
    raise ValueError(
        f"max_tokens_per_rank={max_tokens_per_rank:g}: no assignment found for "
        f"{c.size} samples with {t.sum():g} tokens on {num_ranks} ranks (greedy packing "
        f"failed; the cap may be just feasible, but raise it or add ranks)")


def _kk_plan(c: np.ndarray, num_ranks: int, order: np.ndarray) -> tuple[Plan, bool]:
    """KK's plan, and whether the run was LPT's (see kk_core.kk_subsets); `order` is
    _descending(c), shared with LPT by best_of."""
    owner = np.zeros(c.size, dtype=np.int64)
    as_lpt = True
    if num_ranks > 1 and c.size:
        root, subsets, as_lpt = kk_subsets(c, num_ranks, order)
        # Heaviest subset to rank 0, as in LPT; ties by the subset's root (a sample index).
        rank_of_root = np.zeros(c.size, dtype=np.int64)
        for r, (_, tie) in enumerate(sorted(subsets, key=lambda e: (-e[0], e[1]))):
            rank_of_root[tie] = r
        owner = rank_of_root[root]
        zero = c == 0
        _deal_zeros(owner, np.flatnonzero(~zero), np.flatnonzero(zero), num_ranks)
    return _from_owner(c, owner, num_ranks, "kk"), as_lpt


def karmarkar_karp(costs, num_ranks: int, *, tokens=None,
                   max_tokens_per_rank: float | None = None) -> Plan:
    """k-way largest differencing (Karmarkar & Karp 1982; Korf 2009's multi-way form):
    every sample starts as a k-tuple (c, 0, ..., 0); the two tuples of largest spread
    (max - min) are combined, largest subset of one with smallest of the other, until one
    remains. Max load <= (4/3 - 1/(3N)) x optimum (Michiels et al. 2007).

    With a token cap the KK plan is kept if it respects the cap, else the capped LPT plan
    is returned (its method says so): KK has no natural place to check a second quantity.
    """
    c = _check(costs, num_ranks)
    plan = _uncapped(c, num_ranks, 1)
    if max_tokens_per_rank is None:
        return plan
    return _capped_kk(c, num_ranks, plan, tokens, max_tokens_per_rank)


def _capped_kk(c: np.ndarray, num_ranks: int, plan: Plan, tokens, cap: float) -> Plan:
    t = _check_cap(c, num_ranks, tokens, cap)
    per_rank = np.bincount(plan.owner(), weights=t, minlength=num_ranks)
    if per_rank.max(initial=0.0) <= cap:
        return Plan(plan.assignment, plan.loads, "kk[cap]", plan.max_cost)
    fallback = lpt(c, num_ranks, tokens=t, max_tokens_per_rank=cap)
    return Plan(fallback.assignment, fallback.loads, "lpt[cap] (kk exceeded the cap)",
                fallback.max_cost)


def best_of(costs, num_ranks: int, *, tokens=None,
            max_tokens_per_rank: float | None = None) -> Plan:
    """KK and LPT, whichever has the smaller max load (ties: KK); neither dominates.

    Shortcut: when KK's run never held two partial partitions at once, it was LPT's run
    (each sample, in descending order, joined the smallest subset), so LPT is not rerun.
    Only swaps of equal-cost samples can differ, which may change the last bit of a sum.
    With a cap, the capped LPT plan competes with the KK plan only if the latter happens
    to respect the cap."""
    c = _check(costs, num_ranks)
    if max_tokens_per_rank is None:
        return _uncapped(c, num_ranks, 2)
    kk = _capped_kk(c, num_ranks, _uncapped(c, num_ranks, 1), tokens, max_tokens_per_rank)
    if kk.method.startswith("lpt"):  # KK broke the cap and already fell back to LPT
        return Plan(kk.assignment, kk.loads, "best_of:" + kk.method, kk.max_cost)
    # capped LPT is a different algorithm: run it
    other = lpt(c, num_ranks, tokens=tokens, max_tokens_per_rank=max_tokens_per_rank)
    win = other if other.max_load < kk.max_load else kk
    return Plan(win.assignment, win.loads, "best_of:" + win.method, win.max_cost)


PARTITIONERS: dict[str, Callable[..., Plan]] = {
    "contiguous": contiguous, "random": random_split, "lpt": lpt,
    "kk": karmarkar_karp, "best_of": best_of,
}


# ---------------------------------------------------------------------------
# Micro-batches.

def balance_microbatches(costs, indices, num_micro: int,
                         partitioner: Callable[..., Plan] = best_of) -> Plan:
    """Split one rank's samples (`indices` into the global `costs`) into `num_micro`
    gradient-accumulation micro-batches of balanced cost. The plan's assignment holds
    global sample indices, sorted ascending in each micro-batch."""
    c = _check(costs, num_micro)
    idx = np.asarray(indices, dtype=np.int64)
    local = partitioner(c[idx], num_micro)
    return Plan([np.sort(idx[a]) for a in local.assignment], local.loads, local.method,
                local.max_cost)
