"""The k-way Karmarkar-Karp (largest differencing) engine behind `partition.karmarkar_karp`.

Split out of partition.py because it is the one intricate, performance-tuned part; the
public partitioners and plans stay there. `kk_subsets` is a pure, deterministic function
of (costs, k, order). Pure numpy/python: importing this module must not import torch.
"""
from __future__ import annotations

import array
import bisect
import heapq
import operator

import numpy as np

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


def kk_subsets(costs: np.ndarray, k: int, order: np.ndarray
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
