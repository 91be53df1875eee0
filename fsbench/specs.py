"""The one-line workload specs, parsed into small frozen descriptions: standard library only.

`WorkloadConfig` checks its `lengths`, `popularity` and `data` strings here, so building
a config never imports numpy or torch, and `fsbench.config` never imports
`fsbench.workloads`. The workloads turn a parsed spec into the object that samples or
loads (`fsbench.workloads.distributions.parse_length_spec` and friends).

    lengths     a dataset preset (LENGTH_PRESET_SPECS), or
                fixed:L | uniform:LO-HI | powerlaw:alpha=..,xmin=..[,scale=..][,shift=..] | hist:PATH
                lognormal:mu=..,sigma=..[,shift=..][,min=..][,max=..][,mode=truncate|clip]
    popularity  zipf:S
    data        synthetic | sasrec:PATH | recbole:PATH | otto:PATH

Every bad spec raises ConfigError with one line naming the field and what is allowed.
Parsing runs on every config construction, so it is cheap: presets are a fixed table and
histogram files are cached by (path, mtime, size). Imports from fsbench: only
fsbench.errors (a leaf).
"""
from __future__ import annotations

import csv
import functools
import math
import os
from dataclasses import dataclass, field
from typing import ClassVar

from fsbench.errors import ConfigError

# ---------------------------------------------------------------------------
# Lognormal window math, shared with the sampler (distributions.LogNormalLength).


def normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def lognormal_z_bounds(mu: float, sigma: float, shift: float, lo: int | None,
                       hi: int | None) -> tuple[float, float]:
    """Standard-normal interval whose rounded image of shift + exp(mu + sigma z) lies in
    [lo, hi] (None: unbounded). round(v) >= m exactly when v >= m - 0.5 (ties have
    probability zero)."""
    def z_of(bound: float) -> float:
        x = bound - shift
        return -math.inf if x <= 0 else (math.log(x) - mu) / sigma
    z_lo = -math.inf if lo is None else z_of(lo - 0.5)
    z_hi = math.inf if hi is None else z_of(hi + 0.5)
    return z_lo, z_hi


def lognormal_window_mass(mu: float, sigma: float, shift: float, lo: int | None,
                          hi: int | None) -> float:
    """Probability of the [lo, hi] window under the untruncated distribution."""
    z_lo, z_hi = lognormal_z_bounds(mu, sigma, shift, lo, hi)
    # Hazard: 1 - cdf loses all precision in the upper tail; use the mirrored side.
    if z_lo > 0:
        return normal_cdf(-z_lo) - normal_cdf(-z_hi)
    return normal_cdf(z_hi) - normal_cdf(z_lo)


# ---------------------------------------------------------------------------
# Length specs: one small frozen dataclass per kind.

@dataclass(frozen=True, slots=True)
class FixedLengthSpec:
    kind: ClassVar[str] = "fixed"
    length: int


@dataclass(frozen=True, slots=True)
class UniformLengthSpec:
    kind: ClassVar[str] = "uniform"
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class LogNormalLengthSpec:
    """round(shift + LogNormal(mu, sigma)), optionally bounded to [min, max]; `mode` is
    truncate (condition on the bounds) or clip (pile the outside mass onto them)."""
    kind: ClassVar[str] = "lognormal"
    mu: float
    sigma: float
    shift: float = 0.0
    min: int | None = None
    max: int | None = None
    mode: str = "truncate"

    def truncated_mass(self) -> float:
        return lognormal_window_mass(self.mu, self.sigma, self.shift, self.min, self.max)


@dataclass(frozen=True, slots=True)
class PowerLawLengthSpec:
    kind: ClassVar[str] = "powerlaw"
    alpha: float
    xmin: int
    scale: int = 1  # L = scale X + shift tokens (interleaved items and actions: scale 2)
    shift: int = 0


@dataclass(frozen=True, slots=True)
class HistLengthSpec:
    """A `length_bin,count` CSV, already read and checked: bins >= 1, counts >= 0 and
    finite, some count positive."""
    kind: ClassVar[str] = "hist"
    path: str
    """Absolute path."""
    bins: tuple[int, ...] = field(repr=False)
    counts: tuple[float, ...] = field(repr=False)


@dataclass(frozen=True, slots=True)
class LengthPresetSpec:
    """A dataset preset: the fit plus the real statistics it must reproduce."""
    kind: ClassVar[str] = "preset"
    name: str
    distribution: LogNormalLengthSpec
    median: float  # the target median history length
    p90: float  # and 90th percentile
    source: str
    """Where the fit and the targets come from."""


LengthSpec = (FixedLengthSpec | UniformLengthSpec | LogNormalLengthSpec | PowerLawLengthSpec
              | HistLengthSpec | LengthPresetSpec)


def _lognormal_quantile(z: float, mu: float, sigma: float, shift: float) -> float:
    """shift + LogNormal(mu, sigma) at the standard-normal quantile z."""
    return shift + math.exp(mu + sigma * z)


_Z90 = 1.2815515655446004  # standard-normal 90th percentile

# Hazard: stored runs name these presets; changing a number changes every batch drawn
# from it (bump the workload presets' versions).
LENGTH_PRESET_SPECS: dict[str, LengthPresetSpec] = {p.name: p for p in (
    # 22,363 users; lengths min 5, median 6, mean 8.88, p90 14, p99 43, max 204.
    # Fit: 4 + round(LN(0.683, 1.232)) truncated below at 5, KS <= 0.006.
    LengthPresetSpec("amazon-beauty",
                     LogNormalLengthSpec(mu=0.683, sigma=1.232, shift=4, min=5),
                     median=6, p90=14, source="Amazon Beauty 5-core as preprocessed by ICLRec"),
    # 30,431 users; min 5, median 7, mean 10.40, p90 19, p99 54, max 350.
    # Fit: 4 + round(LN(0.944, 1.290)) truncated below at 5, KS <= 0.006.
    LengthPresetSpec("yelp",
                     LogNormalLengthSpec(mu=0.944, sigma=1.290, shift=4, min=5),
                     median=7, p90=19, source="Yelp 5-core as preprocessed by ICLRec"),
    # 943 users; min 20, median 65, mean 106.0, p90 244.4, p99 442.5, max 737.
    # Fit: round(LN(3.728, 1.218)) truncated below at 20, KS 0.063.
    LengthPresetSpec("movielens-100k",
                     LogNormalLengthSpec(mu=3.728, sigma=1.218, min=20),
                     median=65, p90=244.4, source="MovieLens-100K, RecBole example file"),
    # LensKit's published fit: loc 17.7 + LogNormal(s=1.387, scale=67.25), mean 165.6,
    # KL 0.134. MovieLens keeps users with >= 20 ratings, hence the floor.
    LengthPresetSpec("movielens-1m",
                     LogNormalLengthSpec(mu=math.log(67.25), sigma=1.387, shift=17.7, min=20),
                     median=round(17.7 + 67.25, 2),
                     p90=round(_lognormal_quantile(_Z90, math.log(67.25), 1.387, 17.7), 1),
                     source="LensKit's MovieLens-1M fit; targets are the fit's own analytical "
                            "median and p90, as no raw quantiles are published"),
    # LensKit's published fit: loc 19.1 + LogNormal(s=1.609, scale=43.09), mean 144.4,
    # KL 0.036.
    LengthPresetSpec("movielens-20m",
                     LogNormalLengthSpec(mu=math.log(43.09), sigma=1.609, shift=19.1, min=20),
                     median=round(19.1 + 43.09, 2),
                     p90=round(_lognormal_quantile(_Z90, math.log(43.09), 1.609, 19.1), 1),
                     source="LensKit's MovieLens-20M fit; targets are the fit's own "
                            "analytical median and p90, as no raw quantiles are published"),
    # 12,899,779 sessions; min 2, median 6, mean 16.8, p75 15, p90 39, p95 68, max 500.
    # Fit: LN(1.761, 1.483) clipped to [2, 500], max log residual 0.053 on the quantiles.
    LengthPresetSpec("otto-sessions",
                     LogNormalLengthSpec(mu=1.761, sigma=1.483, min=2, max=500, mode="clip"),
                     median=6, p90=39, source="OTTO train sessions, official dataset README"),
    # 1,000 users; p10 1998, p25 4370, median 8327, mean 11,713, p75 14990, p90 24418,
    # p99 62626, max 127,557. Fit: LN(8.934, 0.932), implied mean 11,710. The fit matches
    # the mean and p90; its median (7,583) sits 9% below the real one.
    LengthPresetSpec("kuairand-1k",
                     LogNormalLengthSpec(mu=8.934, sigma=0.932),
                     median=8327, p90=24418,
                     source="KuaiRand-1K users, official totals and third-party quantiles"),
)}

LENGTH_KINDS = ("fixed:L", "uniform:LO-HI",
                "lognormal:mu=..,sigma=..[,shift=..,min=..,max=..,mode=truncate|clip]",
                "powerlaw:alpha=..,xmin=..[,scale=..][,shift=..]", "hist:PATH (a length_bin,count CSV)")
_LENGTHS_ALLOWED = ("allowed: a preset (" + ", ".join(LENGTH_PRESET_SPECS) + ") or "
                    + ", ".join(LENGTH_KINDS))


# ---------------------------------------------------------------------------
# Parsing length specs.

def _bad_length(spec: str, why: str) -> ConfigError:
    return ConfigError(f"lengths={spec!r}: {why}; {_LENGTHS_ALLOWED}")


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


def _parse_lognormal(spec: str, body: str) -> LogNormalLengthSpec:
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
    parsed = LogNormalLengthSpec(mu=_float(spec, "mu", kv["mu"]), sigma=sigma,
                                 shift=_float(spec, "shift", kv.get("shift", "0")),
                                 min=lo, max=hi, mode=mode)
    if mode == "truncate" and parsed.truncated_mass() < 1e-12:
        raise _bad_length(spec, "min/max leave no probability mass to truncate to")
    return parsed


def _parse_powerlaw(spec: str, body: str) -> PowerLawLengthSpec:
    kv = {"scale": "1", "shift": "0", **_keyvals(spec, body, {"alpha", "xmin"}, {"scale", "shift"})}
    alpha = _float(spec, "alpha", kv["alpha"])
    if alpha <= 1:
        raise _bad_length(spec, f"alpha={alpha:g} must be > 1")
    return PowerLawLengthSpec(alpha, _int(spec, "xmin", kv["xmin"]), _int(spec, "scale", kv["scale"]),
                              _int(spec, "shift", kv["shift"], minimum=0))


def _parse_uniform(spec: str, body: str) -> UniformLengthSpec:
    lo_text, dash, hi_text = body.partition("-")
    if not dash:
        raise _bad_length(spec, "expected uniform:LO-HI")
    lo, hi = _int(spec, "LO", lo_text), _int(spec, "HI", hi_text)
    if lo > hi:
        raise _bad_length(spec, f"LO={lo} must be <= HI={hi}")
    return UniformLengthSpec(lo, hi)


@functools.lru_cache(maxsize=64)
def _load_hist(path: str, _mtime_ns: int, _size: int) -> HistLengthSpec:
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
        if b < 1 or not (math.isfinite(c) and c >= 0):
            raise ValueError(f"line {line_no}: length_bin={b} (>= 1), count={row[1].strip()!r} (finite, >= 0)")
        bins.append(b)
        counts.append(c)
    if sum(counts) <= 0:
        raise ValueError("no bin has a positive count")
    return HistLengthSpec(path, tuple(bins), tuple(counts))


def _parse_hist(spec: str, path: str) -> HistLengthSpec:
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


def parse_lengths(spec: str) -> LengthSpec:
    """What a `lengths=` spec names (a preset's table entry, or the kind and its
    parameters); ConfigError (one line) if bad. A hist file is read and checked, and the
    result cached until the file changes."""
    if not isinstance(spec, str):
        raise _bad_length(str(spec), "must be a string")
    if spec in LENGTH_PRESET_SPECS:
        return LENGTH_PRESET_SPECS[spec]
    kind, colon, body = spec.partition(":")
    if not colon:
        raise _bad_length(spec, "unknown preset or kind")
    if kind == "fixed":
        return FixedLengthSpec(_int(spec, "L", body))
    if kind == "uniform":
        return _parse_uniform(spec, body)
    if kind == "lognormal":
        return _parse_lognormal(spec, body)
    if kind == "powerlaw":
        return _parse_powerlaw(spec, body)
    if kind == "hist":
        return _parse_hist(spec, body)
    raise _bad_length(spec, f"unknown kind {kind!r}")


# ---------------------------------------------------------------------------
# Popularity specs.

@dataclass(frozen=True, slots=True)
class ZipfSpec:
    """P(rank k) ∝ 1/k^s."""
    kind: ClassVar[str] = "zipf"
    s: float


PopularitySpec = ZipfSpec


def parse_popularity(spec: str) -> PopularitySpec:
    """What a `popularity=` spec names; ConfigError (one line) if bad."""
    def bad(why: str) -> ConfigError:
        return ConfigError(f"popularity={spec!r}: {why}; allowed: zipf:S with S > 0 "
                           "(e.g. zipf:1.0)")

    kind, colon, body = str(spec).partition(":")
    if kind != "zipf" or not colon:
        raise bad("unknown form")
    try:
        s = float(body)
    except ValueError:
        raise bad(f"S={body!r} is not a number") from None
    if not (s > 0 and math.isfinite(s)):
        raise bad(f"S={body} must be a finite number > 0")
    return ZipfSpec(s)


# ---------------------------------------------------------------------------
# Data specs.

DATA_KINDS = ("sasrec", "recbole", "otto")
DATA_ALLOWED = "allowed: synthetic, sasrec:PATH, recbole:PATH, otto:PATH"


@dataclass(frozen=True, slots=True)
class DataSpec:
    kind: str
    """`synthetic` or one of DATA_KINDS."""
    path: str | None = None

    def __str__(self) -> str:
        return self.kind if self.path is None else f"{self.kind}:{self.path}"


def parse_data(spec: str) -> DataSpec:
    """The data source a `data=` spec names; ConfigError (one line) if bad. Only checks
    that the file exists: reading it is load_histories' job."""
    if spec == "synthetic":
        return DataSpec("synthetic")
    kind, colon, path = str(spec).partition(":")
    if kind not in DATA_KINDS or not colon:
        raise ConfigError(f"data={spec!r}: unknown kind {kind!r}; {DATA_ALLOWED}")
    if not os.path.isfile(path):
        raise ConfigError(f"data={spec!r}: no such file {path!r}; {DATA_ALLOWED}")
    return DataSpec(kind, path)
