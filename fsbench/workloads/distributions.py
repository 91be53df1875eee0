"""History-length and item-popularity distributions, parsed from one-line specs.

Length specs (`WorkloadConfig.lengths`) name either a dataset preset, whose numbers come
from public sequential-recommendation datasets, or a parametric kind:

    fixed:L | uniform:LO-HI | powerlaw:alpha=..,xmin=.. | hist:PATH
    lognormal:mu=..,sigma=..[,shift=..][,min=..][,max=..][,mode=truncate|clip]

Heterogeneous lengths are the point of the benchmark: they make stragglers, so the
presets reproduce the real median and p90, not only the mean.

Item popularity (`zipf:S`) lives in `popularity.py`.

Specs are parsed on every config construction, so parsing is cheap: presets are
prebuilt and histogram files are cached by (path, mtime, size).
"""
from __future__ import annotations

import csv
import functools
import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from fsbench.config import ConfigError

_KINDS = ("fixed:L", "uniform:LO-HI",
          "lognormal:mu=..,sigma=..[,shift=..,min=..,max=..,mode=truncate|clip]",
          "powerlaw:alpha=..,xmin=..", "hist:PATH (a length_bin,count CSV)")


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


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


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
        """Standard-normal interval whose rounded image lies in [min, max]. round(v) >= m
        exactly when v >= m - 0.5 (ties have probability zero)."""
        def z_of(bound: float) -> float:
            x = bound - self.shift
            return -math.inf if x <= 0 else (math.log(x) - self.mu) / self.sigma
        lo = -math.inf if self.min is None else z_of(self.min - 0.5)
        hi = math.inf if self.max is None else z_of(self.max + 0.5)
        return lo, hi

    def truncated_mass(self) -> float:
        """Probability of the [min, max] window under the untruncated distribution."""
        lo, hi = self._z_bounds()
        # Hazard: 1 - cdf loses all precision in the upper tail; use the mirrored side.
        if lo > 0:
            return _normal_cdf(-lo) - _normal_cdf(-hi)
        return _normal_cdf(hi) - _normal_cdf(lo)

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
        u = rng.uniform(_normal_cdf(a), _normal_cdf(b), n)
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

    def sample(self, rng: np.random.Generator, n: int, max_len: int) -> np.ndarray:
        u = rng.random(n)
        with np.errstate(over="ignore", divide="ignore"):  # u -> 1 gives inf; clipped below
            x = np.floor((self.xmin - 0.5) * (1.0 - u) ** (-1.0 / (self.alpha - 1.0)) + 0.5)
        return _finish(x, max_len)  # x >= xmin already: the factor is >= 1

    def describe(self) -> str:
        return f"discrete power law alpha={self.alpha:g} from length {self.xmin}"


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


def _lognormal_quantile(z: float, mu: float, sigma: float, shift: float) -> float:
    """shift + LogNormal(mu, sigma) at the standard-normal quantile z."""
    return shift + math.exp(mu + sigma * z)


_Z90 = 1.2815515655446004  # standard-normal 90th percentile

LENGTH_PRESETS: dict[str, LengthPreset] = {p.name: p for p in (
    # 22,363 users; lengths min 5, median 6, mean 8.88, p90 14, p99 43, max 204.
    # Fit: 4 + round(LN(0.683, 1.232)) truncated below at 5, KS <= 0.006.
    LengthPreset("amazon-beauty",
                 LogNormalLength(mu=0.683, sigma=1.232, shift=4, min=5),
                 median=6, p90=14, source="Amazon Beauty 5-core as preprocessed by ICLRec"),
    # 30,431 users; min 5, median 7, mean 10.40, p90 19, p99 54, max 350.
    # Fit: 4 + round(LN(0.944, 1.290)) truncated below at 5, KS <= 0.006.
    LengthPreset("yelp",
                 LogNormalLength(mu=0.944, sigma=1.290, shift=4, min=5),
                 median=7, p90=19, source="Yelp 5-core as preprocessed by ICLRec"),
    # 943 users; min 20, median 65, mean 106.0, p90 244.4, p99 442.5, max 737.
    # Fit: round(LN(3.728, 1.218)) truncated below at 20, KS 0.063.
    LengthPreset("movielens-100k",
                 LogNormalLength(mu=3.728, sigma=1.218, min=20),
                 median=65, p90=244.4, source="MovieLens-100K, RecBole example file"),
    # LensKit's published fit: loc 17.7 + LogNormal(s=1.387, scale=67.25), mean 165.6,
    # KL 0.134. MovieLens keeps users with >= 20 ratings, hence the floor.
    LengthPreset("movielens-1m",
                 LogNormalLength(mu=math.log(67.25), sigma=1.387, shift=17.7, min=20),
                 median=round(17.7 + 67.25, 2),
                 p90=round(_lognormal_quantile(_Z90, math.log(67.25), 1.387, 17.7), 1),
                 source="LensKit's MovieLens-1M fit; targets are the fit's own analytical "
                        "median and p90, as no raw quantiles are published"),
    # LensKit's published fit: loc 19.1 + LogNormal(s=1.609, scale=43.09), mean 144.4,
    # KL 0.036.
    LengthPreset("movielens-20m",
                 LogNormalLength(mu=math.log(43.09), sigma=1.609, shift=19.1, min=20),
                 median=round(19.1 + 43.09, 2),
                 p90=round(_lognormal_quantile(_Z90, math.log(43.09), 1.609, 19.1), 1),
                 source="LensKit's MovieLens-20M fit; targets are the fit's own analytical "
                        "median and p90, as no raw quantiles are published"),
    # 12,899,779 sessions; min 2, median 6, mean 16.8, p75 15, p90 39, p95 68, max 500.
    # Fit: LN(1.761, 1.483) clipped to [2, 500], max log residual 0.053 on the quantiles.
    LengthPreset("otto-sessions",
                 LogNormalLength(mu=1.761, sigma=1.483, min=2, max=500, mode="clip"),
                 median=6, p90=39, source="OTTO train sessions, official dataset README"),
    # 1,000 users; p10 1998, p25 4370, median 8327, mean 11,713, p75 14990, p90 24418,
    # p99 62626, max 127,557. Fit: LN(8.934, 0.932), implied mean 11,710. The fit matches
    # the mean and p90; its median (7,583) sits 9% below the real one.
    LengthPreset("kuairand-1k",
                 LogNormalLength(mu=8.934, sigma=0.932),
                 median=8327, p90=24418,
                 source="KuaiRand-1K users, official totals and third-party quantiles"),
)}

_ALLOWED = ("allowed: a preset (" + ", ".join(LENGTH_PRESETS) + ") or "
            + ", ".join(_KINDS))


# ---------------------------------------------------------------------------
# Parsing.

def _bad_length(spec: str, why: str) -> ConfigError:
    return ConfigError(f"lengths={spec!r}: {why}; {_ALLOWED}")


def _int(spec: str, name: str, text: str, minimum: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _bad_length(spec, f"{name}={text!r} is not an integer") from None
    if value < minimum:
        raise _bad_length(spec, f"{name}={value} must be >= {minimum}")
    return value


def _float(spec: str, name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _bad_length(spec, f"{name}={text!r} is not a number") from None
    if not math.isfinite(value):
        raise _bad_length(spec, f"{name}={text!r} must be finite")
    return value


def _keyvals(spec: str, body: str, required: set[str], optional: set[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in body.split(","):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in required | optional:
            raise _bad_length(spec, f"unexpected {part.strip()!r}")
        if key in out:
            raise _bad_length(spec, f"{key} given twice")
        out[key] = value.strip()
    missing = sorted(required - out.keys())
    if missing:
        raise _bad_length(spec, "missing " + ", ".join(missing))
    return out


def _parse_lognormal(spec: str, body: str) -> LogNormalLength:
    kv = _keyvals(spec, body, {"mu", "sigma"}, {"shift", "min", "max", "mode"})
    sigma = _float(spec, "sigma", kv["sigma"])
    if sigma <= 0:
        raise _bad_length(spec, f"sigma={sigma:g} must be > 0")
    lo = _int(spec, "min", kv["min"]) if "min" in kv else None
    hi = _int(spec, "max", kv["max"]) if "max" in kv else None
    if lo is not None and hi is not None and lo > hi:
        raise _bad_length(spec, f"min={lo} must be <= max={hi}")
    mode = kv.get("mode", "truncate")
    if mode not in ("truncate", "clip"):
        raise _bad_length(spec, f"mode={mode!r} must be truncate or clip")
    dist = LogNormalLength(mu=_float(spec, "mu", kv["mu"]), sigma=sigma,
                           shift=_float(spec, "shift", kv.get("shift", "0")),
                           min=lo, max=hi, mode=mode)
    if mode == "truncate" and dist.truncated_mass() < 1e-12:
        raise _bad_length(spec, "min/max leave no probability mass to truncate to")
    return dist


def _parse_powerlaw(spec: str, body: str) -> PowerLawLength:
    kv = _keyvals(spec, body, {"alpha", "xmin"}, set())
    alpha = _float(spec, "alpha", kv["alpha"])
    if alpha <= 1:
        raise _bad_length(spec, f"alpha={alpha:g} must be > 1")
    return PowerLawLength(alpha=alpha, xmin=_int(spec, "xmin", kv["xmin"]))


def _parse_uniform(spec: str, body: str) -> UniformLength:
    lo_text, dash, hi_text = body.partition("-")
    if not dash:
        raise _bad_length(spec, "expected uniform:LO-HI")
    lo, hi = _int(spec, "LO", lo_text), _int(spec, "HI", hi_text)
    if lo > hi:
        raise _bad_length(spec, f"LO={lo} must be <= HI={hi}")
    return UniformLength(lo, hi)


@functools.lru_cache(maxsize=64)
def _load_hist(path: str, _mtime_ns: int, _size: int) -> HistogramLength:
    """Read a `length_bin,count` CSV; ValueError says what is wrong with it. The stat
    fields are only cache keys, so an edited file is re-read."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(str(e)) from None
    if not rows or [c.strip() for c in rows[0]] != ["length_bin", "count"]:
        raise ValueError("the first line must be the header length_bin,count")
    bins, counts = [], []
    for line_no, row in enumerate(rows[1:], start=2):
        if not "".join(row).strip():
            continue
        try:
            if len(row) != 2:
                raise ValueError
            b, c = int(row[0]), float(row[1])
        except ValueError:
            raise ValueError(f"line {line_no} is not 'length_bin,count': "
                             f"{','.join(row)!r}") from None
        if b < 1 or not (c >= 0 and math.isfinite(c)):
            raise ValueError(f"line {line_no}: length_bin must be >= 1 and count >= 0")
        bins.append(b)
        counts.append(c)
    total = sum(counts)
    if total <= 0:
        raise ValueError("no bin has a positive count")
    cdf = np.cumsum(np.asarray(counts)) / total
    return HistogramLength(path, np.asarray(bins, dtype=np.int64), cdf)


def _parse_hist(spec: str, path: str) -> HistogramLength:
    if not path:
        raise _bad_length(spec, "hist needs a path")
    path = os.path.abspath(path)
    try:
        st = os.stat(path)
        return _load_hist(path, st.st_mtime_ns, st.st_size)
    except OSError as e:
        why = e.strerror
    except ValueError as e:
        why = str(e)
    raise ConfigError(f"lengths={spec!r}: cannot use {path}: {why}")


def parse_length_spec(spec: str) -> LengthDistribution:
    """The length distribution a `lengths=` spec names; ConfigError (one line) if bad."""
    if not isinstance(spec, str):
        raise _bad_length(str(spec), "must be a string")
    if spec in LENGTH_PRESETS:
        return LENGTH_PRESETS[spec].distribution
    kind, colon, body = spec.partition(":")
    if not colon:
        raise _bad_length(spec, "unknown preset or kind")
    if kind == "fixed":
        return FixedLength(_int(spec, "L", body))
    if kind == "uniform":
        return _parse_uniform(spec, body)
    if kind == "lognormal":
        return _parse_lognormal(spec, body)
    if kind == "powerlaw":
        return _parse_powerlaw(spec, body)
    if kind == "hist":
        return _parse_hist(spec, body)
    raise _bad_length(spec, f"unknown kind {kind!r}")
