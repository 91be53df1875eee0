"""The balancing planner compiled (numba, optional) for batches of thousands of samples:
partition's uncapped lpt, karmarkar_karp and best_of (the look-ahead window's too) and its
_descending. Python takes 10-40 ms for 32,768 samples onto 256 ranks (a heap operation a
sample); this about a millisecond, with the same plans bit for bit: no fastmath, the same
additions in the same order, the same total orders (cost then index; LPT's load, count,
rank; KK's spread, seq and (sum, tie), as kk_core).

Fast, not only compiled: greedy steps keep the keys sorted in a gap buffer and move the
gap to each new key; costs come descending, so a key lands next to the last one (~2 moves
a sample on every length preset; a heap sifts log2(ranks) levels). KK tuples stay sorted
(combining two is a merge); joins are logged for ranks to flow back at the end. Sorts are LSD radix sorts of the costs' bits
(non-negative doubles order like their bits) over the bits that vary (24-30 of 64). Scratch
is kept per thread: on this VM a fresh megabyte can cost 0.3 ms of page faults.

FSBENCH_PLANNER=auto (the default) compiles batches of >= THRESHOLD samples if numba
imports, so that short-lived processes with small batches (CI's ranks) never load numba
(0.4 s with the code cached) nor compile (15 s, once: cache=True keeps it in __pycache__); =python
forces the python path, =compiled the kernels at any size. Importing this module does not
import numba. Kernels share this file (numba's cache misses a callee's edit elsewhere);
window_kernels' call none of these.
"""
from __future__ import annotations

import heapq
import os
import threading

import numpy as np

THRESHOLD = 2048
ENV = "FSBENCH_PLANNER"
METHODS = ("lpt", "kk", "best_of:kk(=lpt)", "best_of:kk", "best_of:lpt")
_KERNELS: list[tuple[dict, str, str]] = []  # (its module's globals, name, numba's inline option)
_loaded: bool | None = None  # None: numba not tried yet
_njit = None  # numba.njit once loaded
_work = threading.local()


def _kernel(fn, inline: str = "never"):
    """Register fn (here or in window_kernels) for _load; compiled now if numba is loaded."""
    _KERNELS.append((fn.__globals__, fn.__name__, inline))
    return _njit(cache=True, inline=inline)(fn) if _loaded else fn


def _load() -> bool:
    """Import numba and swap each kernel for its dispatcher (compiled at its first call,
    finding the others as globals); False without numba."""
    global _loaded, _njit
    if _loaded is None:
        try:
            from numba import njit as _njit
        except ImportError:
            _loaded = False
            return False
        for module_globals, name, inline in _KERNELS:
            module_globals[name] = _njit(cache=True, inline=inline)(module_globals[name])
        _loaded = True
    return _loaded


def use(size: int) -> bool:
    """Whether to plan a batch of `size` samples with the compiled kernels."""
    mode = os.environ.get(ENV, "auto")
    if mode not in ("auto", "python", "compiled"):
        raise ValueError(f"{ENV}={mode!r}: expected auto, python or compiled")
    if mode == "compiled" and not _load():
        raise RuntimeError(f"{ENV}=compiled but numba is not installed (pip install numba)")
    return mode == "compiled" or (mode == "auto" and size >= THRESHOLD and _load())


def _buffers(n: int) -> tuple:
    """This thread's scratch, at least n long: four int64 arrays and a float64 one."""
    have = getattr(_work, "arrays", None)
    if have is None or have[0].size < n:
        have = _work.arrays = tuple(np.empty(max(n, THRESHOLD), dtype=t) for t in "qqqqd")
    return have


def plan(costs: np.ndarray, num_ranks: int, which: int):
    """Uncapped lpt (which=0), kk (1), best_of (2): (order by rank, ends, loads, method)."""
    c = np.ascontiguousarray(costs)
    order, ends, loads, tag = _plan(c, num_ranks, which, *_buffers(c.size))
    return order, ends.tolist(), loads, METHODS[tag]


def descending(costs: np.ndarray) -> np.ndarray:
    out, c = np.empty(costs.size, np.int64), np.ascontiguousarray(costs)
    _descending(c.view(np.int64), out, *_buffers(c.size)[:3])
    return out


# ---------------------------------------------------------------------------
# Sorting.

@_kernel
def _radix(a, n, out, b, d):
    """out[:n] = the stable ascending order of the keys a[:n] (int64 >= 0, clobbered);
    b, d: scratch. LSD passes of <= 11 bits (the counts stay in L1) over the bits that
    vary, the index packed below the key when they fit in one int64."""
    orv, andv, lo, hi = np.int64(0), np.int64(-1), 0, 63
    for i in range(n):
        orv, andv = orv | a[i], andv & a[i]
    while lo < 64 and ((orv ^ andv) >> lo) & 1 == 0:
        lo += 1
    while hi >= 0 and ((orv ^ andv) >> hi) & 1 == 0:
        hi -= 1
    if n < 2 or hi < lo:
        out[:n] = np.arange(n)
        return
    ib = 1  # bits of an index
    while (n - 1) >> ib:
        ib += 1
    passes = (hi - lo + 11) // 11
    w = (hi - lo + passes) // passes
    mask, packed = (1 << w) - 1, hi - lo + 1 + ib <= 63
    if packed:
        for i in range(n):
            a[i] = ((a[i] >> lo) << ib) | i
        lo = ib
    counts = np.zeros((passes, mask + 1), np.int64)
    for i in range(n):  # every pass's histogram in one read
        for q in range(passes):
            counts[q, (a[i] >> (lo + q * w)) & mask] += 1
    for q in range(passes):
        counts[q] = np.cumsum(counts[q]) - counts[q]
    for q in range(passes):
        shift, last = lo + q * w, q == passes - 1
        # Unpacked, indices ping-pong between d and out so that the last pass fills out.
        dst_i, src_i = (out, d) if (passes - 1 - q) % 2 == 0 else (d, out)
        digit = (a[0] >> shift) & mask  # a run of one digit (skewed costs): its next
        j = counts[q, digit]  # slot stays in a register
        for i in range(n):
            k = a[i]
            if (k >> shift) & mask != digit:
                counts[q, digit], digit = j, (k >> shift) & mask
                j = counts[q, digit]
            if packed and last:
                out[j] = k & ((1 << ib) - 1)
            elif not last:
                b[j] = k
            if not packed:
                dst_i[j] = i if q == 0 else src_i[i]
            j += 1
        a, b = b, a


@_kernel
def _descending(bits, out, a, b, d):
    """out = np.argsort(-costs, kind="stable") from the costs' bits; returns how many
    are nonzero (they come first)."""
    top, zeros = np.int64(0x7FFFFFFFFFFFFFFF), 0
    for i in range(bits.size):
        a[i] = top - (bits[i] & top)  # sign cleared: -0.0 sorts as 0.0
        zeros += a[i] == top
    _radix(a, bits.size, out, b, d)
    return bits.size - zeros


@_kernel
def _sort_pairs(s, t, n, ws, wt):
    """Sort (s[:n], t[:n]) by (s, t), s >= 0 and t unique, in place; ws, wt: scratch.
    One ascending run is usual (one tuple's spread dwarfs the other's); a few are
    merged; more are radix-sorted by s, equal sums then put in t order."""
    starts, runs = np.zeros(n + 1, np.int64), 1
    for i in range(1, n):
        if s[i - 1] > s[i] or (s[i - 1] == s[i] and t[i - 1] > t[i]):
            starts[runs], runs = i, runs + 1
    starts[runs] = n
    if runs > 8:
        order = np.empty(n, np.int64)
        _radix(s[:n].copy().view(np.int64), n, order, np.empty(n, np.int64), starts)
        s[:n], t[:n] = s[:n][order], t[:n][order]
        for i in range(1, n):
            b, j = t[i], i
            while j > 0 and s[j - 1] == s[i] and t[j - 1] > b:
                t[j], j = t[j - 1], j - 1
            t[j] = b
        return
    while runs > 1:
        done = 0
        for r in range(0, runs, 2):
            lo, mid, hi = starts[r], starts[r + 1], starts[min(r + 2, runs)]
            _merge(s[lo:mid], t[lo:mid], s[mid:hi], t[mid:hi], ws, wt, lo)
            starts[done], done = lo, done + 1
        starts[done], runs = n, done
        s[:n], t[:n] = ws[:n], wt[:n]


@_kernel
def _merge(a_s, a_t, b_s, b_t, out_s, out_t, o):
    """Merge two runs sorted by (s, t) into out[o:]; returns the end. No branch on the
    side to take: it is unpredictable."""
    i = j = 0
    while i < a_s.size and j < b_s.size:
        x, y = a_s[i], b_s[j]
        b_first = (y < x) | ((y == x) & (b_t[j] < a_t[i]))
        out_s[o] = y if b_first else x
        out_t[o] = b_t[j] if b_first else a_t[i]
        i, j, o = i + 1 - b_first, j + b_first, o + 1
    rest = a_s.size - i + b_s.size - j
    out_s[o:o + rest] = a_s[i:] if i < a_s.size else b_s[j:]
    out_t[o:o + rest] = a_t[i:] if i < a_s.size else b_t[j:]
    return o + rest


# ---------------------------------------------------------------------------
# Greedy steps. The gap buffer: keys (a, b) ascending are La/Lb[st], ..., [st + nL - 1]
# (a circular deque, capacity mask + 1) then Ra/Rb[nR - 1], ..., [0] (a stack).

def _insert(La, Lb, Ra, Rb, st, nL, nR, mask, a, b):
    """Insert key (a, b), moving the gap to it; returns (nL, nR)."""
    while nL and (a < La[(st + nL - 1) & mask]
                  or (a == La[(st + nL - 1) & mask] and b < Lb[(st + nL - 1) & mask])):
        nL, nR = nL - 1, nR + 1
        Ra[nR - 1], Rb[nR - 1] = La[(st + nL) & mask], Lb[(st + nL) & mask]
    while nR and (a > Ra[nR - 1] or (a == Ra[nR - 1] and b > Rb[nR - 1])):
        La[(st + nL) & mask], Lb[(st + nL) & mask] = Ra[nR - 1], Rb[nR - 1]
        nL, nR = nL + 1, nR - 1
    La[(st + nL) & mask], Lb[(st + nL) & mask] = a, b
    return nL + 1, nR


_kernel(_insert, "always")  # once a sample: inlined (a call with arrays costs ~8 ns)


@_kernel
def _deal_zeros(owner, placed, zeros, n):
    """partition._deal_zeros: each zero, in the given order, to the rank with the fewest
    samples, ties to the lower rank (a heap of count << 32 | rank)."""
    if zeros.size:
        counts = np.bincount(owner[placed], minlength=n)
        heap = [(counts[r] << 32) | r for r in range(n)]
        heapq.heapify(heap)
        for i in zeros:
            owner[i] = heap[0] & 0xFFFFFFFF
            heapq.heapreplace(heap, heap[0] + (1 << 32))


@_kernel
def _lpt(costs, order, m, n, owner):
    """partition._lpt_owner(costs, order, n, None, None) into owner: the first m samples of
    `order` (the nonzero ones) each to the least-loaded rank, keys (load, count<<32|rank)."""
    mask = (1 << int(np.ceil(np.log2(n)))) - 1  # the deque's capacity, a power of 2, - 1
    La, Lb, Ra, Rb = np.zeros(mask + 1), np.arange(mask + 1), np.empty(n), np.empty(n, np.int64)
    st, nL, nR = 0, n, 0
    for p in range(m):
        i = order[p]
        if nL:
            a, b, st, nL = La[st], Lb[st], (st + 1) & mask, nL - 1
        else:
            a, b, nR = Ra[nR - 1], Rb[nR - 1], nR - 1
        owner[i] = b & 0xFFFFFFFF
        nL, nR = _insert(La, Lb, Ra, Rb, st, nL, nR, mask, a + costs[i], b + (1 << 32))
    _deal_zeros(owner, order[:m], order[m:], n)


@_kernel
def _group(owner, n, loads):
    """partition._from_owner: indices by rank (ascending in each), group ends, loads
    (np.bincount's, which sums in index order, as numpy's)."""
    counts = np.bincount(owner, minlength=n)
    ends = np.cumsum(counts)
    fill, out = ends - counts, np.empty(owner.size, np.int64)
    for i in range(owner.size):
        out[fill[owner[i]]], fill[owner[i]] = i, fill[owner[i]] + 1
    return out, ends, loads


@_kernel
def _plan(costs, n, which, order, own, own2, aux, fbuf):
    """Uncapped lpt (which=0), karmarkar_karp (1), best_of (2): (grouped indices, group
    ends, loads, index into METHODS)."""
    size = costs.size
    order, own, own2, aux = order[:size], own[:size], own2[:size], aux[:size]
    m = _descending(costs.view(np.int64), order, own, own2, aux)
    if which == 0:
        _lpt(costs, order, m, n, own)
        return _group(own, n, np.bincount(own, costs, n)) + (0,)
    as_lpt = _kk(costs, order, m, n, own, aux, own2, fbuf)
    if which == 1 or as_lpt:
        return _group(own, n, np.bincount(own, costs, n)) + (which,)
    _lpt(costs, order, m, n, own2)  # best_of: LPT wins only with a smaller max load
    kk, other = np.bincount(own, costs, n), np.bincount(own2, costs, n)
    return _group(own2, n, other) + (4,) if other.max() < kk.max() else _group(own, n, kk) + (3,)


# ---------------------------------------------------------------------------
# Karmarkar-Karp: kk_core's algorithm, tie rules and shortcuts (see its comments).

@_kernel
def _row(rs, rt, size, top, seq, free, cap):
    """A free tuple row (a new one if none)."""
    if not len(free):
        free.append(len(rs))
        rs.append(np.empty(cap))
        rt.append(np.empty(cap, np.int64))
        size.append(0), top.append(0.0), seq.append(0)
    return free.pop()


@_kernel
def _kk(costs, order, m, k, owner, child, parent, cs):
    """kk_core.kk_subsets + partition._kk_plan for `order` = _descending(costs), its first
    m samples nonzero: owner (written), as_lpt. A finished tuple is a row of subsets
    ascending by (sum, tie); the newest ("held") is a gap buffer while it absorbs. Every
    join is logged (child, parent: sample or subset ties) for ranks to flow back."""
    if k == 1 or costs.size == 0:
        owner[:] = 0
        return True
    ids = order[:m]
    for j in range(m):
        cs[j] = costs[ids[j]]
    cap = max(1, min(k, m))  # a tuple has at most min(k, m) subsets
    mask = (1 << int(np.ceil(np.log2(cap)))) - 1
    rs, rt, free = [np.empty(mask + 1)], [np.empty(mask + 1, np.int64)], [0]
    size, top, seq = [0], [0.0], [0]
    La, Lb = np.empty(mask + 1), np.empty(mask + 1, np.int64)
    Ra, Rb = np.empty(cap), np.empty(cap, np.int64)
    Qs, Qt, Ws, Wt = np.empty(cap), np.empty(cap, np.int64), np.empty(cap), np.empty(cap, np.int64)
    live = [(0.0, 0, 0) for _ in range(0)]  # (-spread, seq, row), as kk_core's heap
    st = nL = nR = hseq = p = logged = 0
    htop, held, as_lpt, x, y = 0.0, False, True, -1, -1
    while True:
        if held:
            big, bseq = (-live[0][0], live[0][1]) if len(live) else (-1.0, 0)
            # kk_core._absorb: held leads; while the stream's head beats the live top, it
            # comes second, and opens a subset (held has fewer than k) ...
            while (p < m and nL + nR < k
                   and not (cs[p] < big or (cs[p] == big and ids[p] > bseq))):
                nL, nR = _insert(La, Lb, Ra, Rb, st, nL, nR, mask, cs[p], ids[p])
                p += 1
            while p < m and nL + nR == k:  # ... or joins the smallest subset
                c, i = cs[p], ids[p]
                a, b = (La[st], Lb[st]) if nL else (Ra[nR - 1], Rb[nR - 1])
                if (htop - a < c or c < big or (htop - a == c and hseq > i)
                        or (c == big and i > bseq)):
                    break
                if nL:
                    st, nL = (st + 1) & mask, nL - 1
                else:
                    nR -= 1
                child[logged], parent[logged], logged = i, b, logged + 1
                nL, nR = _insert(La, Lb, Ra, Rb, st, nL, nR, mask, a + c, b)
                htop, p = max(htop, a + c), p + 1
            h = _row(rs, rt, size, top, seq, free, mask + 1)
            if st == 0 and nR == 0:  # already in order: swap arrays rather than copy
                La, rs[h], Lb, rt[h] = rs[h], La, rt[h], Lb
            else:
                for j in range(nL):
                    rs[h][j], rt[h][j] = La[(st + j) & mask], Lb[(st + j) & mask]
                rs[h][nL:nL + nR], rt[h][nL:nL + nR] = Ra[:nR][::-1], Rb[:nR][::-1]
            size[h], top[h], seq[h], held = nL + nR, htop, hseq, False
            heapq.heappush(live, (-(htop if nL + nR < k else htop - rs[h][0]), hseq, h))
        for t in range(2):  # the two of largest spread: the live top or the stream's head
            if len(live) and (p >= m or -live[0][0] > cs[p]
                              or (-live[0][0] == cs[p] and live[0][1] <= ids[p])):
                h = heapq.heappop(live)[2]
            elif p < m:
                h = _row(rs, rt, size, top, seq, free, mask + 1)
                rs[h][0], rt[h][0], size[h], top[h], seq[h] = cs[p], ids[p], 1, cs[p], ids[p]
                p += 1
            else:
                h = -1
            x, y = (h, y) if t == 0 else (x, h)
        if y < 0:
            break
        as_lpt = as_lpt and len(live) == 0 and (size[x] == 1 or size[y] == 1)
        # kk_core._combine: F (more subsets; x on a tie) keeps its ties; S's largest fill
        # F's free subsets, the rest join F's smallest, largest with smallest.
        f, s = (x, y) if size[x] >= size[y] else (y, x)
        nf, ns = size[f], size[s]
        Fs, Ft, Ss, St = rs[f][:nf], rt[f][:nf], rs[s][:ns], rt[s][:ns]
        mm = max(0, ns - (k - nf))
        for i in range(mm):
            Qs[i], Qt[i] = Fs[i] + Ss[mm - 1 - i], Ft[i]
            child[logged + i], parent[logged + i] = St[mm - 1 - i], Ft[i]
        logged += mm
        _sort_pairs(Qs, Qt, mm, Ws, Wt)
        if nf > mm and ns > mm:
            o = _merge(Fs[mm:], Ft[mm:], Ss[mm:], St[mm:], Ws, Wt, 0)
            Us, Ut = Ws[:o], Wt[:o]
        else:
            Us, Ut = (Fs[mm:], Ft[mm:]) if nf > mm else (Ss[mm:], St[mm:])
        st, nL, nR = 0, _merge(Us, Ut, Qs[:mm], Qt[:mm], La, Lb, 0), 0
        htop, hseq, held = La[nL - 1], seq[f], True
        free.append(f)
        free.append(s)
    # _kk_plan: the heaviest subset to rank 0, ties by tie; then down the log, latest
    # first, each child takes its parent's rank (final by then: a parent joins later).
    r, hi = 0, size[x] if x >= 0 else 0
    while hi > 0:
        j = hi - 1
        while j > 0 and rs[x][j - 1] == rs[x][hi - 1]:
            j -= 1
        owner[rt[x][j:hi]] = np.arange(r, r + hi - j)
        r, hi = r + hi - j, j
    for j in range(logged - 1, -1, -1):
        owner[child[j]] = owner[parent[j]]
    _deal_zeros(owner, ids, order[m:], k)
    return as_lpt
