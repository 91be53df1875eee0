"""History-length and item-popularity distributions, parsed from one-line specs.

Length specs (`WorkloadConfig.lengths`) name either a dataset preset, whose numbers come
from public sequential-recommendation datasets, or a parametric kind:

    fixed:L | uniform:LO-HI | powerlaw:alpha=..,xmin=..[,scale=..][,shift=..] | hist:PATH
    lognormal:mu=..,sigma=..[,shift=..][,min=..][,max=..][,mode=truncate|clip]

Heterogeneous lengths are the point of the benchmark: they make stragglers, so the
presets reproduce the real median and p90, not only the mean.

Item popularity (`zipf:S`) lives in `popularity.py`.

Parsing and checking a spec, and the presets' numbers, live in `fsbench.specs` (standard
library only, so building a config never imports numpy or torch); this module turns a
parsed spec into the object that samples. Specs are parsed on every config construction,
so both steps are cheap: presets are prebuilt and histogram files are cached by
(path, mtime, size).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

from fsbench import specs


def _finish(values: np.ndarray, max_len: int) -> np.ndarray:
    """Every length distribution ends here: int64, clipped into [1, max_len]."""
    if max_len < 1:
        raise ValueError(f"max_len={max_len} must be >= 1")
    # Clip while still float: an inf or huge draw would overflow the int64 cast.
    return np.clip(values, 1, max_len).astype(np.int64)


# ---------------------------------------------------------------------------
# Length distributions: one small frozen dataclass per kind.

@dataclass(frozen=True, slots=True)
class FixedLength:
    length: int

    def sample(self, rng: np.random.Generator, n: int, max_len: int) -> np.ndarray:
        return _finish(np.full(n, self.length, dtype=np.float64), max_len)

    def describe(self) -> str:
        return f"every history has length {self.length}"


@dataclass(frozen=True, slots=True)
class UniformLength:
    lo: int
    hi: int

    def sample(self, rng: np.random.Generator, n: int, max_len: int) -> np.ndarray:
        return _finish(rng.integers(self.lo, self.hi, n, endpoint=True).astype(np.float64),
                       max_len)

    def describe(self) -> str:
        return f"uniform integer length in [{self.lo}, {self.hi}]"


@dataclass(frozen=True, slots=True)
class LogNormalLength:
    """round(shift + LogNormal(mu, sigma)), optionally bounded to [min, max].

    `mode="truncate"` conditions on the bounds (the shape inside them is kept and
    renormalized); `mode="clip"` piles the outside mass onto the bounds. They differ a
    lot: against Amazon Beauty's real 5-core histogram the preset's truncated form has
    KS 0.005 and the clipped form KS 0.09 (it piles the whole lower tail onto length 5).
    """
    mu: float
    sigma: float
    shift: float = 0.0
    min: int | None = None
    max: int | None = None
    mode: str = "truncate"

    def _z_bounds(self) -> tuple[float, float]:
        """Standard-normal interval whose rounded image lies in [min, max]."""
        return specs.lognormal_z_bounds(self.mu, self.sigma, self.shift, self.min, self.max)

    def truncated_mass(self) -> float:
        """Probability of the [min, max] window under the untruncated distribution."""
        return specs.lognormal_window_mass(self.mu, self.sigma, self.shift, self.min,
                                           self.max)

    def sample(self, rng: np.random.Generator, n: int, max_len: int) -> np.ndarray:
        if self.mode == "truncate" and (self.min is not None or self.max is not None):
            z = self._truncated_normal(rng, n)
        else:
            z = rng.standard_normal(n)
        values = np.rint(self.shift + np.exp(self.mu + self.sigma * z))
        if self.min is not None or self.max is not None:
            # Also guards truncation against float slop exactly at a bound.
            values = np.clip(values, self.min, self.max)
        return _finish(values, max_len)

    def _truncated_normal(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Inverse-CDF draw of N(0,1) restricted to the bounds: exact, no rejection loop
        (a bound far in a tail would make rejection sampling spin forever)."""
        lo, hi = self._z_bounds()
        flip = lo > 0  # sample the mirrored interval so cdf values stay away from 1.0
        a, b = (-hi, -lo) if flip else (lo, hi)
        u = rng.uniform(specs.normal_cdf(a), specs.normal_cdf(b), n)
        z = torch.special.ndtri(torch.from_numpy(u)).numpy()
        z = np.clip(z, a, b)  # ndtri(0) is -inf; keep draws inside the interval
        return -z if flip else z

    def describe(self) -> str:
        base = f"LogNormal(mu={self.mu:g}, sigma={self.sigma:g})"
        text = f"round({self.shift:g} + {base})" if self.shift else f"round({base})"
        if self.min is None and self.max is None:
            return text
        lo = "-inf" if self.min is None else self.min
        hi = "inf" if self.max is None else self.max
        verb = "truncated to" if self.mode == "truncate" else "clipped to"
        return f"{text} {verb} [{lo}, {hi}]"


@dataclass(frozen=True, slots=True)
class PowerLawLength:
    """Discrete power law P(L) ∝ L^-alpha for L >= xmin.

    Drawn with the continuous approximation of Clauset, Shalizi & Newman (2009):
    L = floor((xmin - 0.5) * (1 - u)^(-1/(alpha-1)) + 0.5). It is close for xmin of about
    5 or more (the dataset fits start at 5 and 6) and cruder for xmin of 1 or 2.
    """
    alpha: float
    xmin: int
    scale: int = 1
    shift: int = 0

    def sample(self, rng: np.random.Generator, n: int, max_len: int) -> np.ndarray:
        u = rng.random(n)
        with np.errstate(over="ignore", divide="ignore"):  # u -> 1 gives inf; clipped below
            x = np.floor((self.xmin - 0.5) * (1.0 - u) ** (-1.0 / (self.alpha - 1.0)) + 0.5)
        return _finish(self.scale * x + self.shift, max_len)  # x >= xmin already: the factor is >= 1

    def describe(self) -> str:
        tokens = f", {self.scale} tokens an item + {self.shift}" if (self.scale, self.shift) != (1, 0) else ""
        return f"discrete power law alpha={self.alpha:g} from length {self.xmin}{tokens}"


@dataclass(frozen=True, slots=True)
class HistogramLength:
    """Empirical lengths: bin `length_bin` is drawn with probability ∝ its count."""
    path: str
    bins: np.ndarray = field(compare=False, repr=False)
    cdf: np.ndarray = field(compare=False, repr=False)

    def sample(self, rng: np.random.Generator, n: int, max_len: int) -> np.ndarray:
        idx = np.searchsorted(self.cdf, rng.random(n), side="right")
        # Hazard: float rounding can leave cdf[-1] a hair below 1.0.
        idx = np.minimum(idx, len(self.bins) - 1)
        return _finish(self.bins[idx].astype(np.float64), max_len)

    def describe(self) -> str:
        return f"empirical histogram of {len(self.bins)} lengths from {self.path}"


LengthDistribution = (FixedLength | UniformLength | LogNormalLength | PowerLawLength
                      | HistogramLength)


# ---------------------------------------------------------------------------
# Dataset presets: the fit plus the real statistics it must reproduce.

@dataclass(frozen=True, slots=True)
class LengthPreset:
    name: str
    distribution: LengthDistribution
    median: float
    """Target median history length."""
    p90: float
    """Target 90th-percentile history length."""
    source: str
    """Where the fit and the targets come from."""

    def describe(self) -> str:
        return (f"{self.distribution.describe()}; targets median {self.median:g}, "
                f"p90 {self.p90:g} ({self.source})")


def _lognormal(spec: specs.LogNormalLengthSpec) -> LogNormalLength:
    return LogNormalLength(mu=spec.mu, sigma=spec.sigma, shift=spec.shift, min=spec.min,
                           max=spec.max, mode=spec.mode)


# The numbers (and where they come from) are in fsbench.specs.LENGTH_PRESET_SPECS.
LENGTH_PRESETS: dict[str, LengthPreset] = {
    name: LengthPreset(name, _lognormal(p.distribution), median=p.median, p90=p.p90,
                       source=p.source)
    for name, p in specs.LENGTH_PRESET_SPECS.items()
}


# ---------------------------------------------------------------------------
# Parsed spec -> distribution.

@functools.lru_cache(maxsize=64)
def _histogram(spec: specs.HistLengthSpec) -> HistogramLength:
    """Cached, so an unchanged file gives the same object (specs caches the read)."""
    cdf = np.cumsum(np.asarray(spec.counts)) / sum(spec.counts)
    return HistogramLength(spec.path, np.asarray(spec.bins, dtype=np.int64), cdf)


def length_distribution(spec: specs.LengthSpec) -> LengthDistribution:
    """The distribution that samples a parsed length spec."""
    if isinstance(spec, specs.LengthPresetSpec):
        return LENGTH_PRESETS[spec.name].distribution
    if isinstance(spec, specs.FixedLengthSpec):
        return FixedLength(spec.length)
    if isinstance(spec, specs.UniformLengthSpec):
        return UniformLength(spec.lo, spec.hi)
    if isinstance(spec, specs.LogNormalLengthSpec):
        return _lognormal(spec)
    if isinstance(spec, specs.PowerLawLengthSpec):
        return PowerLawLength(alpha=spec.alpha, xmin=spec.xmin, scale=spec.scale, shift=spec.shift)
    if isinstance(spec, specs.HistLengthSpec):
        return _histogram(spec)
    raise TypeError(f"not a length spec: {spec!r}")


def parse_length_spec(spec: str) -> LengthDistribution:
    """The length distribution a `lengths=` spec names; ConfigError (one line) if bad."""
    return length_distribution(specs.parse_lengths(spec))
