"""The statistics behind `fsbench compare`, `fsbench gate` and the report's intervals: pure
functions over arrays (numpy only, no fsbench import).

Every timing metric a summary publishes is a ratio of two totals over the measured steps
(step time: summed step time over steps; throughput: samples over summed step time; the
bubble and its causes: idle over capacity N x T). The gate tests exactly those totals, so
a stall that hits one step in eight counts as it counts in the summaries (a median of
per-step changes would not see it).

Units. Steps are grouped into units (a block of steps the two versions ran a fraction of
a second apart, a batch of consecutive steps, or a whole run); each unit carries, per side,
the numerator and denominator sums of every metric. The effect is NEW's total over BASE's
(a ratio for times, a difference in points for ratio metrics); its interval resamples
units; its p comes from a randomization test over units:
  paired    (unit k of BASE and of NEW hold the same batches) swap the two sides of each
            unit with a coin: under "no change" -- and under the gate's own coin for which
            version runs first in a block -- each assignment is as likely as the observed.
  unpaired  relabel whole units between the sides (a two-sample permutation test).
A design with few units cannot reach a small p at all (2 paired units: p >= 0.5); every
test here returns the smallest p it could have given, and compare calls a design that
cannot reach the significance level inconclusive instead of "unchanged".
"""
from __future__ import annotations

import itertools
import math

import numpy as np

# Random draws when exact enumeration would be larger than this: the smallest p a Monte
# Carlo test reaches is 1 / (DRAWS + 1), so 1e-4, below alpha / metrics (0.01 / 8).
DRAWS = 9999
BOOTSTRAP = 2000


def holm(p: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (monotone, capped at 1)."""
    order = np.argsort(p)
    adjusted, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def _effect(kind: str, nb, db, nn, dn):
    """NEW's total against BASE's, along the last axis: log ratio for times (so that the
    test is symmetric), difference for ratio metrics. Works on stacked resamples."""
    tb, tn = nb.sum(-1) / db.sum(-1), nn.sum(-1) / dn.sum(-1)
    if kind == "ratio":
        return tn - tb
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(tn / tb)


def _on_scale(kind: str, value: float) -> float:
    return value if kind == "ratio" else math.exp(value)


def total_effect(kind: str, nb, db, nn, dn) -> float:
    """The effect on its reporting scale: NEW/BASE ratio of totals, or points difference."""
    return _on_scale(kind, float(_effect(kind, *map(np.asarray, (nb, db, nn, dn)))))


def _p_from(observed: float, draws: np.ndarray, exact: bool) -> float:
    # A relative tolerance: draws equal to the observed up to rounding count as as extreme.
    extreme = np.abs(draws) >= abs(observed) * (1 - 1e-9) - 1e-15
    if exact:  # the draws are every assignment, the observed one among them
        return float(extreme.mean())
    return float((1 + extreme.sum()) / (len(draws) + 1))


def paired_test(kind: str, nb, db, nn, dn, seed: int = 0) -> tuple[float, float]:
    """(p, smallest attainable p) of the sign-flip randomization test on paired units."""
    nb, db, nn, dn = (np.asarray(a, dtype=float) for a in (nb, db, nn, dn))
    n = len(nb)
    if n == 0:
        return 1.0, 1.0
    observed = float(_effect(kind, nb, db, nn, dn))
    exact = 2 ** n <= DRAWS + 1
    if exact:
        swap = np.array(list(itertools.product([False, True], repeat=n)), dtype=bool)
    else:
        swap = np.random.default_rng(seed).random((DRAWS, n)) < 0.5
    draws = _effect(kind, np.where(swap, nn, nb), np.where(swap, dn, db),
                    np.where(swap, nb, nn), np.where(swap, db, dn))
    floor = 2.0 / 2 ** n if exact else max(2.0 / 2 ** min(n, 60), 1.0 / (DRAWS + 1))
    if not np.isfinite(observed):
        return 1.0, floor
    return _p_from(observed, draws[np.isfinite(draws)], exact), floor


def unpaired_test(kind: str, nb, db, nn, dn, seed: int = 0) -> tuple[float, float]:
    """(p, smallest attainable p) of the permutation test relabelling units between sides."""
    nb, db, nn, dn = (np.asarray(a, dtype=float) for a in (nb, db, nn, dn))
    k, n = len(nb), len(nb) + len(nn)
    if k == 0 or k == n:
        return 1.0, 1.0
    num, den = np.r_[nb, nn], np.r_[db, dn]
    observed = float(_effect(kind, nb, db, nn, dn))
    splits = math.comb(n, k)
    exact = splits <= DRAWS + 1
    if exact:
        labels = np.zeros((splits, n), dtype=bool)
        for row, picked in enumerate(itertools.combinations(range(n), k)):
            labels[row, list(picked)] = True
    else:
        rng = np.random.default_rng(seed)
        labels = np.zeros((DRAWS, n), dtype=bool)
        for row in range(DRAWS):
            labels[row, rng.choice(n, k, replace=False)] = True
    # Masked sums: BASE's units are the labelled ones.
    zero = np.zeros_like
    draws = _effect(kind, np.where(labels, num, 0.0), np.where(labels, den, 0.0),
                    np.where(labels, zero(num), num), np.where(labels, zero(den), den))
    # A split and its complement give mirrored effects only when the sides are the same size.
    floor = (2.0 if 2 * k == n else 1.0) / splits
    if not exact:
        floor = max(floor, 1.0 / (DRAWS + 1))
    if not np.isfinite(observed):
        return 1.0, floor
    return _p_from(observed, draws[np.isfinite(draws)], exact), floor


def interval(kind: str, nb, db, nn, dn, paired: bool, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of the effect, resampling units (paired units
    together). One unit per side: the interval is the point (nothing to resample)."""
    nb, db, nn, dn = (np.asarray(a, dtype=float) for a in (nb, db, nn, dn))
    point = total_effect(kind, nb, db, nn, dn)
    if len(nb) < 2 or len(nn) < 2:
        return point, point
    rng = np.random.default_rng(seed)
    ib = rng.integers(0, len(nb), (BOOTSTRAP, len(nb)))
    inn = ib if paired else rng.integers(0, len(nn), (BOOTSTRAP, len(nn)))
    draws = _effect(kind, nb[ib], db[ib], nn[inn], dn[inn])
    draws = draws[np.isfinite(draws)]
    if not len(draws):
        return point, point
    lo, hi = np.quantile(draws, [0.025, 0.975])
    return _on_scale(kind, float(lo)), _on_scale(kind, float(hi))


def memory_test(base: np.ndarray, new: np.ndarray, paired: bool) -> tuple[float, float, float, float, float]:
    """Peak memory (a size, not a timing; values per run and rank): (effect, low, high, p,
    smallest p). Ratio of means with a t-test on log values, paired rank by rank when the
    runs pair. Identical values on both sides are an exact answer (p = 1, nothing moved);
    one exact shift on every rank is one too (p = 0)."""
    from scipy import stats

    base, new = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    ok_b, ok_n = base[base > 0], new[new > 0]
    if not len(ok_b) or not len(ok_n):
        return math.nan, math.nan, math.nan, 1.0, 1.0
    effect = float(ok_n.mean() / ok_b.mean())
    if paired:
        k = min(len(base), len(new))
        x = np.log(new[:k] / base[:k])
        x = x[np.isfinite(x)]
        if len(x) and np.ptp(x) == 0:
            return effect, effect, effect, (1.0 if x[0] == 0 else 0.0), 0.0
        if len(x) < 2:
            return effect, effect, effect, 1.0, 1.0
        mean, se = float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x)))
        half = float(stats.t.ppf(0.975, len(x) - 1) * se)
        p = float(2 * stats.t.sf(abs(mean) / se, len(x) - 1))
        return effect, math.exp(mean - half), math.exp(mean + half), p, 0.0
    lb, ln = np.log(ok_b), np.log(ok_n)
    if np.ptp(np.r_[lb, ln]) == 0:
        return effect, effect, effect, 1.0, 0.0
    if np.ptp(lb) == 0 and np.ptp(ln) == 0:  # two constants: an exact change
        return effect, effect, effect, 0.0, 0.0
    if len(lb) < 2 or len(ln) < 2:
        return effect, effect, effect, 1.0, 1.0
    t = stats.ttest_ind(ln, lb, equal_var=False)
    ci = t.confidence_interval(0.95)
    return effect, math.exp(ci.low), math.exp(ci.high), float(t.pvalue), 0.0


def batch_size(series: list[np.ndarray], min_batches: int) -> int | None:
    """Steps per batch for batch means over runs whose steps are autocorrelated (the
    machine's state drifts): the smallest size whose batch means show no significant
    lag-1 autocorrelation (below 2 / sqrt(batches)), with at least `min_batches` batches
    over all runs. None when no size qualifies (too few steps for their correlation)."""
    longest = max((len(s) for s in series), default=0)
    for size in range(1, longest + 1):
        means = [np.add.reduceat(s[: len(s) // size * size], np.arange(0, len(s) // size * size, size)) / size
                 for s in series if len(s) >= size]
        count = sum(len(m) for m in means)
        if count < min_batches:
            return None
        lagged = [(m[:-1] - m.mean(), m[1:] - m.mean()) for m in means if len(m) > 2]
        num = sum(float((a * b).sum()) for a, b in lagged)
        den = sum(float(((m - m.mean()) ** 2).sum()) for m in means if len(m) > 2)
        r1 = num / den if den > 0 else 0.0
        if r1 < 2 / math.sqrt(count):
            return size
    return None


def verdict(kind: str, better: str, effect: float, ci: tuple[float, float], p_adj: float,
            alpha: float, threshold: float) -> str:
    """regressed / improved: significant (Holm-adjusted p below alpha), beyond the
    threshold, and the interval entirely on that side of "no change". unchanged: the
    whole interval within the threshold (evidence of no change that matters). Also
    improved: significant with the whole interval on the better side, reaching past the
    threshold there (an improvement of about the threshold's size: no regression is left
    in the interval, so a gate has nothing to wait for; on the worse side the same reach
    stays inconclusive). Anything else is inconclusive: the data allow a regression
    beyond the threshold, or a change, but do not show one."""
    none = 0.0 if kind == "ratio" else 1.0
    if not all(map(math.isfinite, (effect, *ci))):
        return "inconclusive"
    change = effect - none  # + means the metric went up
    one_side = ci[0] > none or ci[1] < none
    worse = change > 0 if better == "lower" else change < 0
    if p_adj < alpha and abs(change) > threshold and one_side:
        return "regressed" if worse else "improved"
    if none - threshold <= ci[0] and ci[1] <= none + threshold:
        return "unchanged"
    if p_adj < alpha and one_side and not worse:
        return "improved"
    return "inconclusive"


def median_ratio_interval(base, new, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of median(new) / median(base), resampling each
    side's runs (unpaired: the two sides are different runs). The report's throughput
    ratio is that ratio of medians over repeats, so its interval resamples the same way.
    (nan, nan) when either side has fewer than 2 runs: one run has nothing to resample."""
    base, new = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    base, new = base[np.isfinite(base)], new[np.isfinite(new)]
    if len(base) < 2 or len(new) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    draws = (np.median(new[rng.integers(0, len(new), (BOOTSTRAP, len(new)))], axis=1)
             / np.median(base[rng.integers(0, len(base), (BOOTSTRAP, len(base)))], axis=1))
    lo, hi = np.quantile(draws, [0.025, 0.975])
    return float(lo), float(hi)


def mean_interval(values, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (one per user, say),
    resampling them; (nan, nan) for fewer than 2."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    draws = values[rng.integers(0, len(values), (BOOTSTRAP, len(values)))].mean(axis=1)
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def equivalence(differences, margin: float, seed: int = 0) -> tuple[str, tuple[float, float]]:
    """Two one-sided tests at 5% as one 90% interval of the mean paired difference
    (per user: new minus base): `equivalent` when it lies inside (-margin, margin),
    `different` when it lies wholly outside, else `inconclusive` (too few users or too
    noisy to tell), with the interval."""
    lo, hi = mean_interval(differences, level=0.90, seed=seed)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive", (lo, hi)
    if -margin < lo and hi < margin:
        return "equivalent", (lo, hi)
    if hi <= -margin or lo >= margin:
        return "different", (lo, hi)
    return "inconclusive", (lo, hi)
