"""Item popularity, parsed from a one-line spec (`WorkloadConfig.popularity`): `zipf:S`.

Real item popularity is heavy-tailed (the datasets in ARCHITECTURE.md's sources have Gini
0.44-0.66, Zipf rank slopes 0.7-1.4); hot items matter for row-wise sharding and for
all-to-all volume, so the sampler is exact in the head and cheap at any vocabulary size.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from fsbench import specs

_ZIPF_HEAD = 1 << 16
"""Ranks tabulated exactly. Beyond this the pmf k^-S is integrated over [k-1/2, k+1/2]
instead of summed; the midpoint rule's relative error there is about S(S+1)/(24 k^2)
(2e-11 at S=1), so the sampler is exact in practice at any vocabulary while the table
stays 512 KiB: a 1e8-item vocabulary never allocates 1e8 entries."""


@dataclass(frozen=True, slots=True)
class _ZipfTable:
    head_cdf: np.ndarray  # cumulative probability of ranks 1..H, normalized by the total
    head_mass: float       # head_cdf[-1]: the probability of drawing a tabulated rank
    tail_lo: float         # the tail is the continuous law on [H + 1/2, N + 1/2]
    tail_hi: float
    multiplier: int        # rank -> id bijection, coprime to N


def _power_integral(s: float, a: float, b: float) -> float:
    """∫_a^b x^-s dx, stable as s -> 1."""
    t, log_ratio = 1.0 - s, math.log(b / a)
    if abs(t * log_ratio) < 1e-12:
        return a ** t * log_ratio
    return a ** t * math.expm1(t * log_ratio) / t


@functools.lru_cache(maxsize=16)
def _zipf_table(s: float, n_items: int) -> _ZipfTable:
    h = min(n_items, _ZIPF_HEAD)
    head = np.cumsum(np.arange(1, h + 1, dtype=np.float64) ** -s)
    tail = _power_integral(s, h + 0.5, n_items + 0.5) if n_items > h else 0.0
    total = head[-1] + tail
    # Golden-ratio multiplier: consecutive ranks land far apart (three-distance theorem),
    # so the hottest items fall into different row-wise shards.
    m = max(1, round(n_items * 0.6180339887498949))
    while math.gcd(m, n_items) != 1:
        m += 1
    return _ZipfTable(head / total, float(head[-1] / total), h + 0.5, n_items + 0.5, m)


@dataclass(frozen=True, slots=True)
class ZipfPopularity:
    """Item ids whose popularity ranks follow P(rank k) ∝ 1/k^s over the vocab-1 items."""
    s: float

    def sample(self, rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
        """n int64 item ids in [1, vocab-1] (0 is padding)."""
        return self.id_of_rank(self.sample_ranks(rng, n, vocab), vocab)

    def sample_ranks(self, rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
        """n int64 popularity ranks in [1, vocab-1]; rank 1 is the most popular."""
        if vocab < 2:
            raise ValueError(f"vocab={vocab} must be >= 2 (id 0 is padding)")
        table = _zipf_table(self.s, vocab - 1)
        u = rng.random(n)
        ranks = np.searchsorted(table.head_cdf, u, side="right") + 1
        in_tail = u >= table.head_mass
        if in_tail.any():
            # Inverse CDF of x^-s on [lo, hi], then round to the nearest rank.
            v = (u[in_tail] - table.head_mass) / (1.0 - table.head_mass)
            t, lo = 1.0 - self.s, table.tail_lo
            log_ratio = math.log(table.tail_hi / lo)
            if abs(t * log_ratio) < 1e-12:
                x = lo * np.exp(v * log_ratio)
            else:
                x = lo * np.exp(np.log1p(v * math.expm1(t * log_ratio)) / t)
            ranks[in_tail] = np.floor(x + 0.5)
        # Hazard: u within float error of the head/tail seam can step one rank outside.
        return np.clip(ranks, 1, vocab - 1).astype(np.int64)

    def id_of_rank(self, ranks: np.ndarray | int, vocab: int) -> np.ndarray:
        """The fixed bijection rank -> id on [1, vocab-1]: 1 + (rank-1)*m mod (vocab-1).
        (rank-1)*m < N^2 fits int64 for any N below 3e9."""
        n_items = vocab - 1
        m = _zipf_table(self.s, n_items).multiplier
        return 1 + (np.asarray(ranks, dtype=np.int64) - 1) * m % n_items

    def describe(self) -> str:
        return f"Zipf popularity, P(rank k) ∝ 1/k^{self.s:g}, ranks scattered over the ids"


def parse_popularity_spec(spec: str) -> ZipfPopularity:
    """The popularity a `popularity=` spec names; ConfigError (one line) if bad."""
    return ZipfPopularity(specs.parse_popularity(spec).s)
