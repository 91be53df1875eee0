"""`fsbench compare BASE NEW`: did a change make training slower or bubblier -- or can we
not tell?

For each (workload, trainer, world size) and each metric, four outcomes:

  regressed / improved  the Holm-adjusted p (over the metrics of one key) below `alpha`,
                        the change beyond the metric's threshold, and its 95% interval
                        entirely on that side of "no change"; improved also when
                        significant with the whole interval on the better side but reaching
                        past the threshold (no regression left in the interval);
  unchanged             the whole interval within the threshold: evidence that nothing
                        moved by more than the threshold;
  inconclusive          anything else, named with its reason and what would settle it: the
                        key is on one side only, a metric is missing on one side, every run
                        of a side is contended, oversubscribed or unreadable, the machines
                        differ, the design cannot reach the significance level, or the
                        interval allows a change beyond the threshold.

Effects are totals, as the summaries publish them (fsbench.stats): NEW's summed step
time over BASE's on the same steps, samples over summed step time, idle over capacity.
The design, said in the output, is chosen from what the runs allow:
  paired blocks   one run per seed on both sides that took turns (`fsbench gate`,
                  fsbench.running.pacing): block k of BASE against block k of NEW;
  paired runs     one run per seed on both sides, enough seeds to reach alpha;
  paired batches  too few seeds: consecutive steps of each run pair in batches whose means
                  are not autocorrelated (batch means); the runs did not take turns, so the
                  machine's drift between them is part of the effect (said so);
  unpaired runs / unpaired batches   the same for runs that do not pair by seed.
Peak memory: per rank and run, a t-test on log values (paired rank by rank when runs pair).
The runs and their steps come from fsbench.gates.compare_sides (which runs, which machine).

Exit codes (`outcome`): 0 unchanged or improved, 1 regressed, 3 inconclusive (a
regression anywhere wins); bad input is 2, an internal error 4 (fsbench.cli).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from fsbench import stats
from fsbench.gates.compare_sides import (left_out, machine_lines, machines_differ, pace_of,
                                   peak_samples, readable, usable)
from fsbench.errors import ConfigError

# metric -> (kind, direction that is better). Kinds set how the effect is expressed and
# which threshold applies.
METRICS: dict[str, tuple[str, str]] = {
    "step_time_ms": ("time", "lower"),
    # Not step_time_norm (step time over the CPU-speed probe, in step tables and summaries):
    # in the calibration (results/gate_calibration_cpu.md at 9645b89) it read an injected
    # +11.6% step time as -11.9%, so a gate on it would pass real slowdowns.
    "samples_per_s": ("time", "higher"),
    "bubble_ratio": ("ratio", "lower"),
    "straggler_bubble_ratio": ("ratio", "lower"),
    "exposed_comm_ratio": ("ratio", "lower"),
    "input_stall_ratio": ("ratio", "lower"),
    "other_idle_ratio": ("ratio", "lower"),
    "peak_memory_mb": ("memory", "lower"),
}
# Each timing metric as the ratio of two per-step sums (a summary's total): numerator and
# denominator columns of the step table (`step_samples`).
TOTALS: dict[str, tuple[str, str]] = {
    "step_time_ms": ("step_time_ms", "one"),
    "samples_per_s": ("num_samples", "step_s"),
    "bubble_ratio": ("idle_ns", "capacity_ns"),
    "straggler_bubble_ratio": ("straggler_ns", "capacity_ns"),
    "exposed_comm_ratio": ("exposed_comm_ns", "capacity_ns"),
    "input_stall_ratio": ("input_stall_ns", "capacity_ns"),
    "other_idle_ratio": ("other_idle_ns", "capacity_ns"),
}
# Relative for times and memory, absolute (fraction of capacity) for ratios. Calibrated
# against the noise of identical sweeps on the 2-core VM (results/gate_calibration_cpu.md).
DEFAULT_THRESHOLDS = {"time": 0.05, "memory": 0.05, "ratio": 0.02}
DEFAULT_ALPHA = 0.01
KEY = ["workload", "workload_version", "trainer", "world_size"]
MORE_UNITS = ("more pairs (`fsbench gate --pairs N`) or more steps per run (`--steps`)")
EXIT = {"unchanged": 0, "regressed": 1, "inconclusive": 3}


@dataclasses.dataclass
class Row:
    workload: str
    trainer: str
    world_size: int
    metric: str             # "*" for a whole key that cannot be compared
    base_total: float       # the side's total (as a summary states it)
    new_total: float
    effect: float           # ratio (time, memory) or difference (ratio metrics)
    ci_low: float
    ci_high: float
    p: float
    p_adjusted: float
    n_base: int             # measured steps (peak memory: run x rank values)
    n_new: int
    verdict: str            # regressed | improved | unchanged | inconclusive
    pairing: str = "none"   # the design: "blocks of K steps", "runs", "batches of B steps", "none"
    units: int = 0          # units the interval and p rest on
    p_min: float = 0.0      # the smallest p the design could have given
    reason: str = ""        # inconclusive: why, and what would settle it
    remedy: str = ""


def _nan_row(key: tuple, metric: str, reason: str, remedy: str) -> Row:
    nan = math.nan
    return Row(str(key[0]), str(key[2]), int(key[3]), metric, nan, nan, nan, nan, nan, nan, nan,
               0, 0, "inconclusive", reason=reason, remedy=remedy)


# ---------------------------------------------------------------------------
# Designs: which steps form a unit

def units_needed(metric_count: int, alpha: float) -> int:
    """Paired units whose exact sign-flip test can reach alpha after Holm over the metrics."""
    return max(2, math.ceil(1 + math.log2(metric_count / alpha)) + 1)


def _paired_frames(pairs: list[tuple[pd.DataFrame, pd.DataFrame]]) -> list[pd.DataFrame]:
    return [tb.merge(tn, on="step", suffixes=("_b", "_n")) for tb, tn in pairs]


def paired_design(pairs: list[tuple[pd.DataFrame, pd.DataFrame]], blocks: list,
                  needed: int) -> tuple[str, list[pd.DataFrame]]:
    """(design, joined step frames with a `unit` column) for runs paired by seed."""
    frames = _paired_frames(pairs)
    if blocks and None not in blocks and len(set(blocks)) == 1:
        k = blocks[0]
        return f"blocks of {k} steps", [f.assign(unit=[(i, s // k) for s in f["step"]])
                                        for i, f in enumerate(frames)]
    if len(frames) >= needed:
        return "runs", [f.assign(unit=[(i, 0)] * len(f)) for i, f in enumerate(frames)]
    series = [np.log(f["step_time_ms_n"].to_numpy(float) / f["step_time_ms_b"].to_numpy(float))
              for f in frames]
    size = stats.batch_size(series, needed)
    if size is None:
        return "too few steps for batch means", []
    return (f"batches of {size} steps (runs not paced: drift between them counts as change)",
            [f.assign(unit=[(i, j // size) for j in range(len(f))]) for i, f in enumerate(frames)])


def unpaired_design(base: list[pd.DataFrame], new: list[pd.DataFrame], needed: int
                    ) -> tuple[str, list[pd.DataFrame], list[pd.DataFrame]]:
    """(design, BASE frames, NEW frames), each with a `unit` column: whole runs when there
    are enough to relabel, else batches of steps."""
    runs = len(base) + len(new)
    # Relabelling runs reaches about as low a p as flipping `needed` pairs' signs.
    if math.comb(runs, len(base)) >= 2 ** (needed - 1):
        tag = lambda frames: [f.assign(unit=[(i, 0)] * len(f)) for i, f in enumerate(frames)]  # noqa: E731
        return "runs (unpaired)", tag(base), [f.assign(unit=[(len(base) + i, 0)] * len(f))
                                              for i, f in enumerate(new)]
    series = [f["step_time_ms"].to_numpy(float) for f in [*base, *new]]
    size = stats.batch_size(series, 2 * needed)
    if size is None:
        return "too few steps for batch means", [], []
    tag = lambda frames, first: [f.assign(unit=[(first + i, j // size) for j in range(len(f))])  # noqa: E731
                                 for i, f in enumerate(frames)]
    return (f"batches of {size} steps (unpaired, runs not paced: drift between them counts "
            f"as change)", tag(base, 0), tag(new, len(base)))


def unit_sums(frames: list[pd.DataFrame], metric: str, suffix: str = "") -> tuple[np.ndarray, np.ndarray]:
    num, den = TOTALS[metric]
    table = pd.concat(frames, ignore_index=True)
    if f"{num}{suffix}" not in table or f"{den}{suffix}" not in table:
        raise KeyError(metric)
    sums = table.groupby("unit")[[f"{num}{suffix}", f"{den}{suffix}"]].sum()
    return sums.iloc[:, 0].to_numpy(float), sums.iloc[:, 1].to_numpy(float)


# ---------------------------------------------------------------------------
# The comparison

def compare(base: pd.DataFrame, new: pd.DataFrame, alpha: float = DEFAULT_ALPHA,
            thresholds: dict[str, float] | None = None,
            allow_cross_machine: bool = False) -> tuple[list[Row], list[str]]:
    """Rows (one per key and metric; inconclusive keys as one row, metric "*") and notes
    (runs left out, the machines, anything else a reader must know)."""
    thresholds = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    notes = left_out(base, "BASE") + left_out(new, "NEW")
    differ = machines_differ(base, new)
    notes += [f"{side} machine: {line}" for side, line in machine_lines(base, new)]
    if differ and allow_cross_machine:
        notes.append(f"machines differ ({differ}); compared anyway (--allow-cross-machine)")
    schemas = set(base.get("schema_version", pd.Series([1]))) ^ set(new.get("schema_version", pd.Series([1])))
    if schemas:
        notes.append(f"summary schemas differ ({sorted(schemas)}): metrics missing on one side "
                     "are inconclusive")
    rows: list[Row] = []
    keys = pd.concat([base[KEY], new[KEY]]).astype(str).drop_duplicates()
    for key in map(tuple, keys.to_numpy()):
        pick = lambda runs: runs[(runs[KEY].astype(str) == pd.Series(key, index=KEY)).all(axis=1)]  # noqa: E731
        b_all, n_all = pick(base), pick(new)
        if differ and not allow_cross_machine:
            rows.append(_nan_row(key, "*", f"runs from different machines: {differ}",
                                 "run both sides on one machine (`fsbench gate` does), or "
                                 "pass --allow-cross-machine to compare anyway"))
            continue
        for side, own, other in (("BASE", b_all, n_all), ("NEW", n_all, b_all)):
            if len(own) and not len(other):
                rows.append(_nan_row(key, "*", f"only {side} has runs of this key",
                                     "run this workload, trainer and world size on both sides"))
        if not len(b_all) or not len(n_all):
            continue
        rows += compare_key(key, usable(b_all), usable(n_all), alpha, thresholds, notes)
    if not rows:
        notes.append("nothing to compare")
    return rows, notes


def compare_key(key: tuple, b: pd.DataFrame, n: pd.DataFrame, alpha: float,
                thresholds: dict[str, float], notes: list[str]) -> list[Row]:
    """Every metric of one (workload, version, trainer, world size)."""
    for side, runs in (("BASE", b), ("NEW", n)):
        if not len(runs):
            return [_nan_row(key, "*", f"every {side} run of this key is contended, "
                                       "oversubscribed or simulated (listed below)",
                             "rerun on a quiet machine with no more ranks than cores "
                             "(`fsbench gate` reruns contended pairs)")]
    # A gate's runs come in pairs, one seed per pair on both sides. A run whose partner
    # was left out goes too: unpaired it would turn the comparison into an unpaired one,
    # which no longer cancels the machine's drift.
    common = set(b["seed"]) & set(n["seed"])
    paired = bool(common) and b["seed"].is_unique and n["seed"].is_unique
    if paired:
        for side, runs in (("BASE", b), ("NEW", n)):
            notes += [f"{side} {r.run_id}: its seed-{r.seed} partner was left out, so is it"
                      for r in runs.itertuples() if r.seed not in common]
        b = b[b["seed"].isin(common)].sort_values("seed")
        n = n[n["seed"].isin(common)].sort_values("seed")
    b, tb = readable(b, "BASE", notes)
    n, tn = readable(n, "NEW", notes)
    if paired:  # drop pairs that lost a partner to an unreadable file
        ok = set(b["seed"]) & set(n["seed"])
        tb = [t for t, s in zip(tb, b["seed"]) if s in ok]
        tn = [t for t, s in zip(tn, n["seed"]) if s in ok]
        b, n = b[b["seed"].isin(ok)], n[n["seed"].isin(ok)]
    if not len(b) or not len(n):
        return [_nan_row(key, "*", "no readable run left on one side (listed below)",
                         "rerun the missing side")]
    metric_names = [m for m in METRICS if m == "peak_memory_mb" or
                    any(TOTALS[m][0] in t for t in tb) and any(TOTALS[m][0] in t for t in tn)]
    needed = units_needed(len(METRICS), alpha)
    if paired:
        blocks = [pb[1] if pb and pb == pn else None
                  for pb, pn in zip(map(pace_of, b["run_dir"]), map(pace_of, n["run_dir"]))]
        design, frames = paired_design(list(zip(tb, tn)), blocks, needed)
    else:
        design, fb, fn = unpaired_design(tb, tn, needed)
    found = []
    for metric in METRICS:
        kind, better = METRICS[metric]
        if metric not in metric_names:
            found.append((metric, None, f"{metric} missing on one side (an older summary schema?)"))
            continue
        if metric == "peak_memory_mb":
            vb = np.concatenate([peak_samples(d) for d in b["run_dir"]] or [[]])
            vn = np.concatenate([peak_samples(d) for d in n["run_dir"]] or [[]])
            effect, lo, hi, p, floor = stats.memory_test(vb, vn, paired)
            extra = dict(base_total=float(np.mean(vb)) if len(vb) else math.nan,
                         new_total=float(np.mean(vn)) if len(vn) else math.nan,
                         n_base=len(vb), n_new=len(vn), units=min(len(vb), len(vn)),
                         pairing="per rank" if paired else "none")
            found.append((metric, (effect, lo, hi, p, floor, extra), None))
            continue
        try:
            if paired:
                if not frames:
                    raise KeyError(metric)
                nb, db = unit_sums(frames, metric, "_b")
                nn, dn = unit_sums(frames, metric, "_n")
                p, floor = stats.paired_test(kind, nb, db, nn, dn)
            else:
                if not fb:
                    raise KeyError(metric)
                nb, db = unit_sums(fb, metric)
                nn, dn = unit_sums(fn, metric)
                p, floor = stats.unpaired_test(kind, nb, db, nn, dn)
        except KeyError:
            found.append((metric, None, f"{design}: no units to test"))
            continue
        effect = stats.total_effect(kind, nb, db, nn, dn)
        lo, hi = stats.interval(kind, nb, db, nn, dn, paired)
        total = lambda num, den: float(num.sum() / den.sum())  # noqa: E731
        extra = dict(base_total=total(nb, db), new_total=total(nn, dn),
                     n_base=int(sum(len(t) for t in tb)), n_new=int(sum(len(t) for t in tn)),
                     units=len(nb) if paired else len(nb) + len(nn), pairing=design)
        found.append((metric, (effect, lo, hi, p, floor, extra), None))
    tested = [f for f in found if f[1] is not None]
    adjusted = iter(stats.holm([f[1][3] for f in tested]))
    m = len(tested)
    rows = []
    for metric, result, why in found:
        kind, better = METRICS[metric]
        if result is None:
            rows.append(_nan_row(key, metric, why, "rerun both sides with this fsbench"
                                 if "missing" in why else MORE_UNITS))
            continue
        effect, lo, hi, p, floor, extra = result
        p_adj = next(adjusted)
        row = Row(str(key[0]), str(key[2]), int(key[3]), metric, effect=effect, ci_low=lo,
                  ci_high=hi, p=p, p_adjusted=p_adj, p_min=floor, verdict="", **extra)
        threshold = thresholds.get(metric, thresholds[kind])
        if floor * m >= alpha:
            row.verdict = "inconclusive"
            row.reason = (f"{extra['units']} unit(s) ({extra['pairing']}): the smallest p this "
                          f"design can give is {floor:.2g}, x{m} metrics (Holm) >= alpha {alpha}")
            row.remedy = MORE_UNITS
        else:
            row.verdict = stats.verdict(kind, better, effect, (lo, hi), p_adj, alpha, threshold)
            if row.verdict == "inconclusive":
                row.reason = (f"the 95% interval {_fmt_interval(kind, lo, hi)} reaches beyond the "
                              f"{_fmt_threshold(kind, threshold)} threshold without a significant "
                              f"change (p {p_adj:.2g})")
                row.remedy = MORE_UNITS + ", or a quieter machine"
        rows.append(row)
    return rows


def outcome(rows: list[Row]) -> str:
    """The command's verdict: regressed if anything regressed, else inconclusive if
    anything could not be told, else unchanged (improvements included)."""
    verdicts = {r.verdict for r in rows}
    if "regressed" in verdicts:
        return "regressed"
    if "inconclusive" in verdicts or not rows:
        return "inconclusive"
    return "unchanged"


def exit_code(rows: list[Row]) -> int:
    return EXIT[outcome(rows)]


# ---------------------------------------------------------------------------
# Words for a reason (the tables: fsbench.gates.compare_output)

def _fmt_threshold(kind: str, threshold: float) -> str:
    return f"{100 * threshold:.1f} pp" if kind == "ratio" else f"{100 * threshold:.0f}%"


def _fmt_interval(kind: str, lo: float, hi: float) -> str:
    if kind == "ratio":
        return f"[{100 * lo:+.1f}, {100 * hi:+.1f}] pp"
    return f"[{lo:.3f}, {hi:.3f}]x"


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
