"""`fsbench compare BASE NEW`: did a change make training slower or bubblier?

For each (workload, trainer, world size) present on both sides and each metric:

  effect   times and memory: a ratio NEW/BASE; ratios (bubble and its causes, which sit
           near zero): a difference in percentage points.
  paired   (runs with one seed per run on both sides, as `fsbench gate` makes them: the
           same batches step by step) per step the log ratio (or difference) NEW vs BASE,
           averaged per unit, where the unit is a block of steps when the two runs took
           turns block by block (fsbench.pacing: the two ran a fraction of a second apart) and
           else the whole run (a run's steps share its machine state). Effect, interval
           and p over the units: Hodges-Lehmann, bootstrap, Wilcoxon signed-rank
           (`paired_test`); peak memory pairs rank by rank, with a t-test.
  unpaired (any other two sets of runs) the ratio or difference of medians of the per-step
           samples (peak memory: one value per rank and run), two-sided Mann-Whitney U
           (asv's rule) on them, and a 95% bootstrap interval that resamples whole runs,
           then their steps.
  verdict  regressed / improved when the p (Holm-adjusted over the metrics of one key:
           several metrics, one question) is below `alpha` AND the effect is beyond the
           metric's threshold AND the interval excludes no change, in the bad / good
           direction; else unchanged. Significance alone flags tiny real changes on quiet
           machines; a threshold alone flags noise.

Runs that cannot be compared are named and left out: another workload (name or version),
trainer, world size or summary schema, or a side that ran `contended` (a neighbour took
cores) or `oversubscribed`. Exit codes: 1 on any regression, 0 otherwise, 2 on bad input.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from fsbench import metrics
from fsbench.errors import ConfigError

# metric -> (kind, direction that is better). Kinds set how the effect is expressed and
# which threshold applies.
METRICS: dict[str, tuple[str, str]] = {
    "step_time_ms": ("time", "lower"),
    # Not step_time_norm (step time over the CPU-speed probe, in step tables and summaries):
    # in the calibration (results/gate_calibration_cpu.md) it read an injected +11.6% step
    # time as -11.9% (0 of 20 detected), so a gate on it would pass real slowdowns.
    "samples_per_s": ("time", "higher"),
    "bubble_ratio": ("ratio", "lower"),
    "straggler_bubble_ratio": ("ratio", "lower"),
    "exposed_comm_ratio": ("ratio", "lower"),
    "input_stall_ratio": ("ratio", "lower"),
    "other_idle_ratio": ("ratio", "lower"),
    "peak_memory_mb": ("memory", "lower"),
}
# Relative for times and memory, absolute (fraction of capacity) for ratios. Calibrated
# against the noise of identical sweeps on the 2-core VM (results/gate_calibration_cpu.md).
DEFAULT_THRESHOLDS = {"time": 0.05, "memory": 0.05, "ratio": 0.02}
DEFAULT_ALPHA = 0.01
KEY = ["workload", "workload_version", "trainer", "world_size"]


@dataclasses.dataclass
class Row:
    workload: str
    trainer: str
    world_size: int
    metric: str
    base_median: float
    new_median: float
    effect: float          # ratio (time, memory) or difference (ratio metrics)
    ci_low: float
    ci_high: float
    p: float
    p_adjusted: float
    n_base: int
    n_new: int
    verdict: str
    pairing: str = "none"   # "blocks of K steps", "runs", or "none" (unpaired)
    units: int = 0          # paired units the interval and p rest on


def load_side(path: str | Path) -> pd.DataFrame:
    """Runs of one side: a run directory, or a store (a directory of runs)."""
    from fsbench import store

    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{path}: not a run directory or a store of runs")
    if (path / "manifest.json").exists():
        row = store.run_row(path)
        runs = pd.DataFrame([row] if row else [])
    else:
        runs = store.scan_runs(path)
    if len(runs):
        runs = runs[runs["status"] == "complete"]
    if not len(runs):
        raise ConfigError(f"{path}: holds no complete run")
    return runs.reset_index(drop=True)


def step_samples(run_dir: str | Path) -> pd.DataFrame:
    """Per measured step: step time, throughput, bubble and its causes."""
    from fsbench.runner import read_step_stats
    from fsbench.timeline import read_timelines

    run_dir = Path(run_dir)
    table = metrics.throughput(metrics.step_metrics(read_timelines(run_dir)),
                               read_step_stats(run_dir))
    return table[~table["warmup"]]


def peak_samples(run_dir: str | Path) -> list[float]:
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    return [float(v) for v in summary.get("peak_memory_mb_per_rank") or []]


def holm(p: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (monotone, capped at 1)."""
    order = np.argsort(p)
    adjusted, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def statistic(kind: str, base: np.ndarray, new: np.ndarray) -> float:
    """Ratio of medians NEW/BASE (times, memory), or their difference (ratios)."""
    if kind == "ratio":
        return float(np.median(new) - np.median(base))
    return float(np.median(new) / np.median(base))


def run_bootstrap(kind: str, base: list[np.ndarray], new: list[np.ndarray],
                  n_resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95% interval of `statistic` resampling whole runs (then their steps): consecutive
    steps of one run share its machine state, so a run, not a step, is the independent
    unit. Two runs or more per side; else the interval is the point."""
    point = statistic(kind, np.concatenate(base), np.concatenate(new))
    if len(base) < 2 or len(new) < 2:
        return point, point
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_resamples):
        picks = [rng.integers(0, len(base), len(base)), rng.integers(0, len(new), len(new))]
        sides = [np.concatenate([rng.choice(runs[i], len(runs[i])) for i in pick])
                 for runs, pick in zip((base, new), picks)]
        draws.append(statistic(kind, *sides))
    return float(np.quantile(draws, 0.025)), float(np.quantile(draws, 0.975))


def pace_of(run_dir: str | Path) -> tuple[str, int] | None:
    """(turn-taking group, block steps) of a run made under fsbench.pacing, else None."""
    path = Path(run_dir) / "pace.json"
    if not path.exists():
        return None
    pace = json.loads(path.read_text())
    return pace["group"], int(pace["block_steps"])


def paired_units(kind: str, metric: str, pairs: list[tuple[pd.DataFrame, pd.DataFrame, int | None]]
                 ) -> np.ndarray:
    """Per unit the mean of the steps' paired changes (log ratio for times, difference for
    ratios); `pairs`: (base steps, new steps, block steps when paced together, else None)."""
    units = []
    for tb, tn, block in pairs:
        if metric not in tb or metric not in tn:
            continue
        j = tb[["step", metric]].merge(tn[["step", metric]], on="step", suffixes=("_b", "_n")).dropna()
        b, n = j[f"{metric}_b"].to_numpy(float), j[f"{metric}_n"].to_numpy(float)
        if kind == "ratio":
            change = n - b
        else:
            ok = (b > 0) & (n > 0)
            j, change = j[ok], np.log(n[ok] / b[ok])
        unit = (j["step"] // block).to_numpy() if block else np.zeros(len(j), dtype=int)
        units += list(pd.Series(change).groupby(unit).mean())
    return np.asarray(units, dtype=float)


def paired_memory(base: list[np.ndarray], new: list[np.ndarray]) -> np.ndarray:
    """Peak memory, paired run by run and rank by rank: log ratios."""
    units = []
    for b, n in zip(base, new):
        k = min(len(b), len(n))
        ok = (b[:k] > 0) & (n[:k] > 0)
        units += list(np.log(n[:k][ok] / b[:k][ok]))
    return np.asarray(units, dtype=float)


def hodges_lehmann(x: np.ndarray) -> float:
    """Median of the pairwise averages (Walsh averages): the location estimate that goes
    with the signed-rank test, robust to a few steps a neighbour's burst stretched."""
    i, j = np.triu_indices(len(x))
    return float(np.median((x[i] + x[j]) / 2))


def paired_test(kind: str, units: np.ndarray, seed: int = 0) -> tuple[float, float, float, float]:
    """(effect, 95% low, 95% high, two-sided p) over paired units; times and memory back
    on the ratio scale.

    Timing metrics: Wilcoxon's signed-rank p, the Hodges-Lehmann estimate and its
    bootstrap interval over units (scipy.stats.bootstrap, percentile). Why: the gate
    draws which version goes first in every block, so under "no change" each unit's sign
    is a coin flip (the signed-rank null), and the machine's noise has heavy tails.
    Peak memory: a one-sample t-test and its interval; it is a size, not a timing, its
    units (runs x ranks) are few and jitter by about 1%, too few for a rank test ever to
    reach alpha (4 units: p >= 0.125)."""
    from scipy import stats

    units = np.asarray(units, dtype=float)
    units = units[np.isfinite(units)]
    n = len(units)
    if n < 2 or np.ptp(units) == 0:
        # Nothing to test (one unit), or every unit the same: exactly no change (p = 1),
        # or one exact change (a size that moved by the same amount on every rank).
        center = float(units[0]) if n else 0.0
        out, p = (center, center, center), (1.0 if n < 2 or center == 0 else 0.0)
    elif kind == "memory":
        mean, se = float(units.mean()), float(units.std(ddof=1) / math.sqrt(n))
        half = float(stats.t.ppf(0.975, n - 1) * se)
        out, p = (mean, mean - half, mean + half), float(2 * stats.t.sf(abs(mean) / se, n - 1))
    else:
        ci = stats.bootstrap((units,), hodges_lehmann, vectorized=False, n_resamples=999,
                             method="percentile", random_state=seed).confidence_interval
        out = (hodges_lehmann(units), float(ci.low), float(ci.high))
        p = float(stats.wilcoxon(units).pvalue)
    if kind != "ratio":
        out = tuple(math.exp(v) for v in out)
    return (*out, p)


def verdict(kind: str, better: str, effect: float, ci: tuple[float, float], p_adj: float,
            alpha: float, threshold: float) -> str:
    """Regressed/improved: significant (Holm-adjusted), beyond the threshold, and the
    interval entirely on that side of "no change"."""
    none = 0.0 if kind == "ratio" else 1.0
    change = effect - none  # + means the metric went up
    if not p_adj < alpha or abs(change) <= threshold:
        return "unchanged"
    if not (ci[0] > none or ci[1] < none):
        return "unchanged"
    worse = change > 0 if better == "lower" else change < 0
    return "regressed" if worse else "improved"


def incomparable(base: pd.DataFrame, new: pd.DataFrame) -> list[str]:
    """Why some runs are left out, one line each."""
    why = []
    for side, runs in (("BASE", base), ("NEW", new)):
        for flag in ("contended", "oversubscribed"):
            if flag in runs and runs[flag].fillna(False).astype(bool).any():
                bad = runs[runs[flag].fillna(False).astype(bool)]
                why += [f"{side} {r.run_id}: {flag}, left out" for r in bad.itertuples()]
    schemas = set(base.get("schema_version", pd.Series([1]))) ^ set(new.get("schema_version", pd.Series([1])))
    if schemas:
        why.append(f"summary schemas differ ({sorted(schemas)}): runs of another schema left out")
    keys_b = set(map(tuple, base[KEY].astype(str).to_numpy()))
    keys_n = set(map(tuple, new[KEY].astype(str).to_numpy()))
    why += [f"BASE only: {' '.join(k)}" for k in sorted(keys_b - keys_n)]
    why += [f"NEW only: {' '.join(k)}" for k in sorted(keys_n - keys_b)]
    return why


def usable(runs: pd.DataFrame) -> pd.DataFrame:
    keep = pd.Series(True, index=runs.index)
    for flag in ("contended", "oversubscribed"):
        if flag in runs:
            keep &= ~runs[flag].fillna(False).astype(bool)
    return runs[keep]


def compare(base: pd.DataFrame, new: pd.DataFrame, alpha: float = DEFAULT_ALPHA,
            thresholds: dict[str, float] | None = None) -> tuple[list[Row], list[str]]:
    thresholds = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    notes = incomparable(base, new)
    base, new = usable(base), usable(new)
    rows: list[Row] = []
    for key, b in base.groupby(KEY, dropna=False):
        n = new[(new[KEY].astype(str) == pd.Series(key, index=KEY).astype(str)).all(axis=1)]
        if not len(n):
            continue
        # A gate's runs come in pairs, one seed per pair on both sides. A run whose partner
        # was left out (contended) goes too: unpaired it would turn the comparison into an
        # unpaired one, which no longer cancels the machine's drift.
        common = set(b["seed"]) & set(n["seed"])
        paired = bool(common) and b["seed"].is_unique and n["seed"].is_unique
        if paired:
            for side, runs in (("BASE", b), ("NEW", n)):
                notes += [f"{side} {r.run_id}: its seed-{r.seed} partner was left out, so is it"
                          for r in runs.itertuples() if r.seed not in common]
            b = b[b["seed"].isin(common)].sort_values("seed")
            n = n[n["seed"].isin(common)].sort_values("seed")
        sides = {side: ([step_samples(d) for d in runs["run_dir"]],
                        [np.asarray(peak_samples(d), dtype=float) for d in runs["run_dir"]],
                        [pace_of(d) for d in runs["run_dir"]])
                 for side, runs in (("base", b), ("new", n))}
        # Blocks pair only where every pair of runs took turns together, in one block size.
        blocks = [pb[1] if pb and pb == pn else None
                  for pb, pn in zip(sides["base"][2], sides["new"][2])]
        if None in blocks or len(set(blocks)) != 1:
            blocks = [None] * len(blocks)
        pairing = "none" if not paired else f"blocks of {blocks[0]} steps" if blocks[0] else "runs"
        found = []
        for metric, (kind, better) in METRICS.items():
            per_run = {s: ([x for x in sides[s][1] if len(x)] if metric == "peak_memory_mb"
                           else [t[metric].to_numpy(dtype=float) for t in sides[s][0]
                              if len(t) and metric in t])
                       for s in ("base", "new")}
            if not per_run["base"] or not per_run["new"]:
                continue
            xb, xn = np.concatenate(per_run["base"]), np.concatenate(per_run["new"])
            if paired:
                units = (paired_memory(sides["base"][1], sides["new"][1]) if metric == "peak_memory_mb"
                         else paired_units(kind, metric, list(zip(sides["base"][0], sides["new"][0],
                                                                  blocks))))
                effect, lo, hi, p = paired_test(kind, units)
                found.append((metric, kind, better, xb, xn, effect, (lo, hi), p, len(units)))
            else:
                ci = run_bootstrap(kind, per_run["base"], per_run["new"])
                found.append((metric, kind, better, xb, xn, statistic(kind, xb, xn), ci,
                              mann_whitney(xb, xn), 0))
        adjusted = holm([f[7] for f in found])
        for (metric, kind, better, xb, xn, effect, ci, p, units), p_adj in zip(found, adjusted):
            rows.append(Row(key[0], key[2], int(key[3]), metric, float(np.median(xb)),
                            float(np.median(xn)), effect, ci[0], ci[1], p, p_adj, len(xb), len(xn),
                            verdict(kind, better, effect, ci, p_adj, alpha,
                                    thresholds.get(metric, thresholds[kind])),
                            "per rank" if paired and metric == "peak_memory_mb" else pairing, units))
    if not rows and not notes:
        notes.append("no (workload, trainer, world size) is present on both sides")
    return rows, notes


def mann_whitney(base: np.ndarray, new: np.ndarray) -> float:
    from scipy import stats

    if np.ptp(np.concatenate([base, new])) == 0:
        return 1.0  # identical constants: nothing to test
    return float(stats.mannwhitneyu(base, new, alternative="two-sided").pvalue)


def _fmt_effect(row: Row) -> str:
    kind = METRICS[row.metric][0]
    if kind == "ratio":
        return (f"{100 * row.effect:+.1f} pp [{100 * row.ci_low:+.1f}, {100 * row.ci_high:+.1f}]")
    return f"{row.effect:.3f}x [{row.ci_low:.3f}, {row.ci_high:.3f}]"


def markdown(rows: list[Row], notes: list[str]) -> str:
    mark = {"regressed": "**regressed**", "improved": "improved", "unchanged": "unchanged"}
    lines = ["| workload | trainer | ranks | metric | base | new | change [95% CI] | p (Holm) | verdict |",
             "|---|---|---:|---|---:|---:|---|---:|---|"]
    for r in rows:
        lines.append(f"| {r.workload} | {r.trainer} | {r.world_size} | {r.metric} | "
                     f"{r.base_median:.4g} | {r.new_median:.4g} | {_fmt_effect(r)} | "
                     f"{r.p_adjusted:.2g} | {mark[r.verdict]} |")
    regressions = sum(r.verdict == "regressed" for r in rows)
    lines.append("")
    lines.append(f"{regressions} regression(s), "
                 f"{sum(r.verdict == 'improved' for r in rows)} improvement(s) in {len(rows)} comparisons.")
    for r in rows:
        if r.metric == "step_time_ms":
            lines.append(f"- {r.workload} {r.trainer} {r.world_size} ranks: " + (
                f"paired by {r.pairing} ({r.units} units; signed-rank test)" if r.pairing != "none"
                else "unpaired (Mann-Whitney U on steps, run-level bootstrap interval)"))
    lines += [f"- not compared: {n}" for n in notes]
    return "\n".join(lines) + "\n"


def to_json(rows: list[Row], notes: list[str]) -> str:
    clean = lambda v: None if isinstance(v, float) and math.isnan(v) else v  # noqa: E731
    return json.dumps({"rows": [{k: clean(v) for k, v in dataclasses.asdict(r).items()} for r in rows],
                       "not_compared": notes,
                       "regressions": sum(r.verdict == "regressed" for r in rows)}, indent=1)


def parse_thresholds(pairs: list[str]) -> dict[str, float]:
    """`--threshold time=0.05 --threshold bubble_ratio=0.03`: per kind or per metric."""
    out = {}
    allowed = [*DEFAULT_THRESHOLDS, *METRICS]
    for pair in pairs:
        kind, eq, value = pair.partition("=")
        if not eq or kind not in allowed:
            raise ConfigError(f"--threshold {pair!r}: expected NAME=VALUE with NAME one of: "
                              f"{', '.join(allowed)}")
        try:
            out[kind] = float(value)
        except ValueError:
            raise ConfigError(f"--threshold {pair!r}: {value!r} is not a number") from None
        if out[kind] < 0:
            raise ConfigError(f"--threshold {pair!r}: must be >= 0")
    return out
