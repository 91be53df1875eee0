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

`balance_microbatches` splits one rank's share into gradient-accumulation micro-batches,
and `lookahead_window` re-packs K consecutive global batches so that whales (samples much
larger than a rank's fair share) run side by side in one step instead of one per step.

Pure numpy/python: importing this module must not import torch.
"""
from __future__ import annotations

import array
import bisect
import heapq
import math
import operator
from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = [
    "Plan", "WindowStep", "contiguous", "random_split", "lpt", "karmarkar_karp", "best_of",
    "balance_microbatches", "lookahead_window", "PARTITIONERS",
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
        out = np.empty(sum(len(a) for a in self.assignment), dtype=np.int64)
        for r, idx in enumerate(self.assignment):
            out[idx] = r
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
    assignment = [order[a:b] for a, b in zip([0] + ends[:-1], ends)]
    loads = np.bincount(owner, weights=costs, minlength=num_ranks).astype(np.float64)
    return Plan(assignment, loads, method, float(costs.max()) if costs.size else 0.0)


def _descending(costs: np.ndarray) -> np.ndarray:
    """Sample indices by cost descending, ties by lower index first."""
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
        return _from_owner(c, _lpt_owner(c, _descending(c), num_ranks, None, None),
                           num_ranks, "lpt")
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


# ---------------------------------------------------------------------------
# Karmarkar-Karp, k-way.
#
# A partial partition ("tuple") holds up to k subsets, each a (sum, tie) pair: tie is a
# sample index, unique among live subsets, that names the subset. Membership is a
# union-find forest over sample indices (`parent`): a subset is the tree rooted at its
# tie, so merging two subsets is one store, never a list copy. Sums are absolute: KK's
# normalization (subtract the min) changes no pairing decision, only the spread, computed
# here as max - min, min = 0 while a tuple has fewer than k subsets (the others are empty
# and not stored).
#
# Speed (8k samples on 256 ranks in a few ms): samples are a pre-sorted stream, never
# heap entries. A tuple is either a heap (list), for the common LPT-like step of adding
# one sample to its smallest subset, or two numpy arrays sorted by (sum, tie), for
# combining with another big tuple in a few vectorized operations; it switches lazily.

_BULK = 16  # combine with numpy once the smaller tuple has this many subsets


class _Tuple:
    __slots__ = ("heap", "sums", "ties", "top", "seq")

    def __init__(self, top: float, seq: int, heap: list | None = None,
                 sums: np.ndarray | None = None, ties: np.ndarray | None = None):
        # top: the largest subset sum; seq: the sample index that orders equal spreads
        self.top, self.seq, self.heap, self.sums, self.ties = top, seq, heap, sums, ties

    def size(self) -> int:
        return len(self.heap) if self.heap is not None else len(self.sums)

    def spread(self, k: int) -> float:
        if self.size() < k:
            return self.top
        return self.top - (self.heap[0][0] if self.heap is not None else self.sums[0])

    def to_heap(self) -> list:
        if self.heap is None:  # a sorted list is a valid heap
            self.heap = list(zip(self.sums.tolist(), self.ties.tolist()))
            self.sums = self.ties = None
        return self.heap

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self.heap is not None:
            pairs = np.array(self.heap, dtype=np.float64).reshape(-1, 2)
            order = np.lexsort((pairs[:, 1], pairs[:, 0]))
            self.sums = pairs[order, 0]
            self.ties = pairs[order, 1].astype(np.int64)  # sample indices: exact in f64
            self.heap = None
        return self.sums, self.ties


def _combine(x: _Tuple, y: _Tuple, k: int, parent) -> _Tuple:
    """KK's step: pair the largest subsets of one tuple with the smallest of the other.
    F (more subsets) keeps its identity; S's subsets, largest first, fill F's empty
    subsets first and then join F's smallest ones in ascending order."""
    f, s = (x, y) if x.size() >= y.size() else (y, x)
    if f.heap is None or s.size() >= _BULK:
        return _combine_arrays(f, s, k, parent)
    heap = f.heap
    free = k - len(heap)
    s_desc = sorted(s.to_heap(), reverse=True)
    low = [heapq.heappop(heap) for _ in range(max(0, len(s_desc) - free))]
    top = f.top
    for e in s_desc[:free]:
        heapq.heappush(heap, e)
    for (a, ta), (b, tb) in zip(low, s_desc[free:]):
        parent[tb] = ta
        heapq.heappush(heap, (a + b, ta))
        top = max(top, a + b)
    return _Tuple(max(top, s.top), f.seq, heap=heap)


def _combine_arrays(f: _Tuple, s: _Tuple, k: int, parent) -> _Tuple:
    fs, ft = f.to_arrays()
    ss, st = s.to_arrays()
    ss, st = ss[::-1], st[::-1]  # largest first
    free = k - len(fs)
    m = max(0, len(ss) - free)
    np.frombuffer(parent, dtype=np.int64)[st[free:]] = ft[:m]
    sums = np.concatenate((fs[m:], ss[:free], fs[:m] + ss[free:]))
    ties = np.concatenate((ft[m:], st[:free], ft[:m]))
    order = np.lexsort((ties, sums))
    sums, ties = sums[order], ties[order]
    return _Tuple(float(sums[-1]), f.seq, sums=sums, ties=ties)


def _kk_subsets(costs: np.ndarray, k: int, order: np.ndarray
                ) -> tuple[np.ndarray, list, bool]:
    """The final partition as (root of each sample, its (sum, root) subsets), and whether
    the run was LPT's: true when it never held two partial partitions at once, so that
    every sample, in descending order, joined the one partition's smallest subset."""
    order = order[:np.count_nonzero(costs)]  # zeros are dealt out by count afterwards
    stream = (costs[order], order, costs[order].tolist(), order.tolist())
    cs, ids = stream[2], stream[3]
    m = len(ids)
    parent = array.array("q", range(costs.size))  # numpy reads and writes it in place
    # Priority: larger spread first, ties by seq (a sample index). Singletons are never
    # pushed: they are consumed from the pre-sorted stream `p`; `live` holds merged tuples.
    live: list = []
    p = 0
    held: _Tuple | None = None  # the newest tuple, kept out of `live` while on top
    as_lpt = True

    def pop() -> _Tuple | None:
        nonlocal p
        if live and (p >= m or (-live[0][0], -live[0][1]) >= (cs[p], -ids[p])):
            return heapq.heappop(live)[2]
        if p < m:
            p += 1
            return _Tuple(cs[p - 1], ids[p - 1], heap=[(cs[p - 1], ids[p - 1])])
        return None

    while True:
        if held is not None:
            p = _absorb(held, stream, p, live, k, parent)
            heapq.heappush(live, (-held.spread(k), held.seq, held))
            held = None
        x, y = pop(), pop()
        if y is None:
            break
        as_lpt = as_lpt and not live and (x.size() == 1 or y.size() == 1)
        held = _combine(x, y, k, parent)
    # Pointer jumping: every sample's root in O(log depth) vectorized passes.
    root = np.frombuffer(parent, dtype=np.int64)
    while True:
        up = root[root]
        if np.array_equal(up, root):
            break
        root = up
    return root, ([] if x is None else x.to_heap()), as_lpt


def _absorb(held: _Tuple, stream: tuple, p: int, live: list, k: int, parent) -> int:
    """KK's common step, fast: while `held` has the largest spread and the next sample
    (cs[p], ids[p]) the second largest, the sample joins held's smallest subset (an LPT
    step; a new subset while held has fewer than k). Returns the new stream position."""
    cs_np, ids_np, cs, ids = stream
    m = len(cs)
    # The live top's (spread, seq): the stream head must beat it to come second.
    big, big_seq = (-live[0][0], live[0][1]) if live else (-1.0, 0)
    if p < m and held.size() < k:
        # Sparse held: spread == top >= every later sample, and on a tie held wins (all
        # its samples cost top and came earlier in the stream, so seq < i). So held stays
        # on top while the samples beat the live top; they fill new subsets in one go.
        hi = min(m, p + k - held.size())
        q = bisect.bisect_left(cs, -big, p, hi, key=operator.neg)  # first c <= big
        while q < hi and cs[q] == big and ids[q] < big_seq:
            q += 1
        if q - p >= _BULK:
            sums, ties = cs_np[p:q], ids_np[p:q]
            order = np.lexsort((ties, sums))  # ascending (sum, tie), as tuples keep them
            add = _Tuple(cs[p], ids[p], sums=sums[order], ties=ties[order])
            merged = _combine_arrays(held, add, k, parent)
            held.heap, held.sums, held.ties = None, merged.sums, merged.ties
        elif q > p:
            heap = held.to_heap()
            heap.extend(zip(cs[p:q], ids[p:q]))
            heapq.heapify(heap)
        p = q
    if p >= m or held.size() < k:
        return p
    spread, c = held.spread(k), cs[p]
    if (spread < c or c < big or (spread == c and held.seq > ids[p])
            or (c == big and ids[p] > big_seq)):
        return p  # not even one LPT step: keep held as it is
    heap, top, seq = held.to_heap(), held.top, held.seq
    replace = heapq.heapreplace
    smallest = heap[0]
    while p < m:
        c = cs[p]
        spread = top - smallest[0]
        # Stop unless held beats the sample and the sample beats the live top, i.e.
        # (-spread, seq) < (-c, i) < (-big, big_seq) as priority keys.
        if spread <= c or c <= big:
            i = ids[p]
            if (spread < c or c < big or (spread == c and seq > i)
                    or (c == big and i > big_seq)):
                break
        load, tie = smallest
        parent[ids[p]] = tie
        total = load + c
        replace(heap, (total, tie))
        smallest = heap[0]
        if total > top:
            top = total
        p += 1
    held.top = top
    return p


def _kk_plan(c: np.ndarray, num_ranks: int, order: np.ndarray) -> tuple[Plan, bool]:
    """KK's plan, and whether the run was LPT's (see _kk_subsets); `order` is
    _descending(c), shared with LPT by best_of."""
    owner = np.zeros(c.size, dtype=np.int64)
    as_lpt = True
    if num_ranks > 1 and c.size:
        root, subsets, as_lpt = _kk_subsets(c, num_ranks, order)
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
    plan, _ = _kk_plan(c, num_ranks, _descending(c))
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
    order = _descending(c)
    kk, as_lpt = _kk_plan(c, num_ranks, order)
    if max_tokens_per_rank is not None:
        kk = _capped_kk(c, num_ranks, kk, tokens, max_tokens_per_rank)
        if kk.method.startswith("lpt"):  # KK broke the cap and already fell back to LPT
            return Plan(kk.assignment, kk.loads, "best_of:" + kk.method, kk.max_cost)
        as_lpt = False  # capped LPT is a different algorithm: run it
    if as_lpt:
        return Plan(kk.assignment, kk.loads, "best_of:kk(=lpt)", kk.max_cost)
    if max_tokens_per_rank is None:
        owner = _lpt_owner(c, order, num_ranks, None, None)
        other = _from_owner(c, owner, num_ranks, "lpt")
    else:
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


# ---------------------------------------------------------------------------
# Look-ahead window: whales.
#
# A whale (one sample bigger than total/N) sets its step's time alone, however well the
# rest is balanced: max(total/N, largest) is the bound. With one whale per batch, K steps
# cost K whales. Pooling K batches and packing them into K*N bins (the same partitioner,
# K*N "virtual ranks") puts each whale in its own bin and evens out everything else; the
# N heaviest bins then form step 0, the next N step 1, and so on: for fixed bins, grouping
# them in load order minimizes the sum of per-step maxima (the i-th step's max can be no
# smaller than the ((i-1)N+1)-th largest bin). So the whales run side by side in one step.
#
# Deviation from the data order: samples move between the K steps of their window (never
# out of it), so every sample is still trained exactly once per window, but a step's
# samples are no longer one original batch. Step sizes are kept (step i of the window has
# the size of the window's i-th batch) by moving the cheapest samples from over-full steps
# to under-full ones, where they go to the least-loaded ranks; they are small, so this
# barely moves any step's max.

@dataclass(frozen=True, eq=False)
class WindowStep:
    window_start: int
    """Index, in `costs_per_batch`, of the first batch of this step's window."""
    samples: list[tuple[int, int]]
    """(batch_offset_in_window, sample_index) of each sample of the step, sorted."""
    plan: Plan
    """The step's plan; its assignment indexes into `samples`."""


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
        plain = [WindowStep(start, [(j, i) for i in range(c.size)],
                            partitioner(c, num_ranks)) for j, c in enumerate(group)]
        if len(group) == 1:
            steps.extend(plain)
            continue
        packed = _pack_window(group, num_ranks, partitioner, start)
        # Never worse than no window: keep the data order unless re-packing saves time.
        if sum(s.plan.max_load for s in packed) < sum(s.plan.max_load for s in plain):
            steps.extend(packed)
        else:
            steps.extend(plain)
    return steps


def _pack_window(batches: list[np.ndarray], n: int, partitioner, start: int
                 ) -> list[WindowStep]:
    k = len(batches)
    sizes = np.array([b.size for b in batches], dtype=np.int64)
    pooled = np.concatenate(batches)
    offset = np.repeat(np.arange(k), sizes)
    index = np.arange(pooled.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    packed = partitioner(pooled, k * n)
    by_load = np.argsort(-packed.loads, kind="stable")
    step_of_bin = np.empty(k * n, dtype=np.int64)
    rank_of_bin = np.empty(k * n, dtype=np.int64)
    for j in range(k):
        group = np.sort(by_load[j * n:(j + 1) * n])  # ranks keep the bins' own order
        step_of_bin[group] = j
        rank_of_bin[group] = np.arange(n)
    bins = packed.owner()
    step, rank = step_of_bin[bins], rank_of_bin[bins]
    _keep_step_sizes(pooled, step, rank, sizes, n)
    out = []
    for j in range(k):
        chosen = np.flatnonzero(step == j)  # pooled order is (offset, index) order
        plan = _from_owner(pooled[chosen], rank[chosen], n, f"{packed.method}+window{k}")
        samples = list(zip(offset[chosen].tolist(), index[chosen].tolist()))
        out.append(WindowStep(start, samples, plan))
    return out


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
        moved.append(mine[np.argsort(costs[mine], kind="stable")[:surplus[j]]])
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
