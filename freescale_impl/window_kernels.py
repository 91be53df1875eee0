"""The look-ahead window's bookkeeping compiled (numba, optional; plan_kernels loads it and
says when to use it): after the pooled plan, which sample goes to which step and rank,
keeping each step's size, and each step's plan. window.py's numpy path does the same in
~10 array passes over the pooled samples and a heap in Python (4-5 ms for 4 x 32,768 onto
256 ranks); this is two passes and a few small sorts, with the same steps and plans bit
for bit: the same total orders (cost, then index or pool position; load, then rank) and
the same additions in the same order (np.bincount's: in index order)."""
from __future__ import annotations

import numpy as np

from freescale_impl.partition import _split
from freescale_impl.plan_kernels import _buffers, _kernel


def settle(costs: np.ndarray, bins: np.ndarray, bin_ends: np.ndarray,
           step_of_bin: np.ndarray, rank_of_bin: np.ndarray, sizes: np.ndarray, n: int):
    """Per step of the window: (its samples' positions in `costs`, ascending; its plan's
    assignment; loads per rank; largest cost). `bins` lists the pooled plan's bins' samples
    end to end (bin b ends at bin_ends[b]; entries >= costs.size are skipped: fillers);
    step_of_bin/rank_of_bin place each bin."""
    c = np.ascontiguousarray(costs, dtype=np.float64)
    step, rank = _buffers(c.size)[:2]  # scratch: a fresh MB costs ~0.4 ms to touch (host_memory_probe.py)
    positions, order, counts, loads, largest = _settle(
        c, bins.astype(np.int64, copy=False), bin_ends.astype(np.int64, copy=False),
        step_of_bin.astype(np.int64), rank_of_bin.astype(np.int64), sizes.astype(np.int64), n,
        step[:c.size], rank[:c.size])
    out, at = [], 0
    for j, size in enumerate(sizes.tolist()):
        assignment = _split(order[at:at + size], np.cumsum(counts[j]).tolist())
        out.append((positions[at:at + size], assignment, loads[j], float(largest[j])))
        at += size
    return out


@_kernel
def _settle(costs, bins, bin_ends, step_of_bin, rank_of_bin, sizes, n, step, rank):
    have, begin = np.zeros(sizes.size, np.int64), 0
    for b in range(bin_ends.size):
        for q in range(begin, bin_ends[b]):
            if bins[q] < costs.size:  # others are the pooled plan's fillers
                step[bins[q]], rank[bins[q]] = step_of_bin[b], rank_of_bin[b]
                have[step_of_bin[b]] += 1
        begin = bin_ends[b]
    members = np.empty(costs.size, np.int64)
    first = _members(step, have, members)
    if np.any(have != sizes):
        _keep_step_sizes(costs, step, rank, members, first, have, sizes, n)
        first = _members(step, sizes, members)
    return (members,) + _group(costs, members, first, sizes, rank, n)


@_kernel
def _members(step, have, members):
    """Each step's samples in index order, laid end to end in `members`: step j's from
    first[j] (returned)."""
    first = np.cumsum(have) - have
    fill = first.copy()
    for i in range(step.size):
        members[fill[step[i]]] = i
        fill[step[i]] += 1
    return first


@_kernel
def _keep_step_sizes(costs, step, rank, members, first, have, sizes, n):
    """window._keep_step_sizes: the cheapest samples of over-full steps (each step's, by
    cost then index), biggest first (ties by that order), each to the least-loaded rank
    (ties: the lowest) of the next under-full step."""
    k, surplus = sizes.size, have - sizes
    pool, p = np.empty(np.maximum(surplus, 0).sum(), np.int64), 0
    for j in range(k):
        if surplus[j] > 0:
            mine = members[first[j]:first[j] + have[j]]
            pool[p:p + surplus[j]] = mine[_cheapest(costs[mine], surplus[j])]
            p += surplus[j]
    pool = pool[np.argsort(-costs[pool], kind="mergesort")]
    p = 0
    for j in range(k):
        if surplus[j] >= 0:
            continue
        loads = np.zeros(n)
        for i in members[first[j]:first[j] + have[j]]:  # np.bincount's order: by index
            loads[rank[i]] += costs[i]
        for _ in range(-surplus[j]):
            i, r = pool[p], np.argmin(loads)  # the first minimum: a heap of (load, rank)
            loads[r] += costs[i]
            step[i], rank[i], p = j, r, p + 1


@_kernel
def _cheapest(c, s):
    """window._cheapest: the s cheapest of c, by cost then index."""
    if s >= c.size:
        return np.argsort(c, kind="mergesort")
    cut = np.partition(c, s - 1)[s - 1]
    pick, m = np.empty(s, np.int64), 0
    for i in range(c.size):
        if c[i] < cut:
            pick[m], m = i, m + 1
    for i in range(c.size):
        if m == s:
            break
        if c[i] == cut:
            pick[m], m = i, m + 1
    return pick[np.argsort(c[pick], kind="mergesort")]


@_kernel
def _group(costs, members, first, sizes, rank, n):
    """Each step's plan as partition._from_owner makes it: its samples by rank (ascending
    within), loads summed in index order; and the largest cost."""
    k = sizes.size
    order, counts = np.empty(members.size, np.int64), np.zeros((k, n), np.int64)
    loads, largest = np.zeros((k, n)), np.zeros(k)
    for j in range(k):
        mine = members[first[j]:first[j] + sizes[j]]
        for i in mine:
            counts[j, rank[i]] += 1
        fill = first[j] + np.cumsum(counts[j]) - counts[j]
        for local in range(mine.size):
            i = mine[local]
            order[fill[rank[i]]] = local
            fill[rank[i]] += 1
            loads[j, rank[i]] += costs[i]
            largest[j] = max(largest[j], costs[i])
    return order, counts, loads, largest
