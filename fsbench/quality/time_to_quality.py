"""Time to quality: how long, and on how many samples, a trainer trains until its model is
good enough; the column `fsbench quality` prints and `fsbench report` shows.

- **Target**: validation NDCG@10 (each user's second-to-last item, the split that picks
  the epoch; never test), `fraction` (default 0.95) x the baseline's best at the same world
  size: each baseline seed's best validation NDCG@10 over its evaluations, averaged over
  its seeds. One target per world size, the same for every trainer there.
- **Reached** at a run's first evaluation whose validation NDCG@10 is >= the target.
- **Time**: that evaluation's `train_s`, the summed step times T of every step trained
  through it, warm-up steps included; evaluation runs between steps, so its time is in
  none (fsbench.measurement.run_summary.quality).
- **Samples**: that evaluation's `samples`, the global samples trained through it, each
  rank's own count summed (a trainer that re-packs samples across steps, FreeScale's
  look-ahead window, counts what it trained). None in runs stored before it was counted.
- Per trainer and world size: the median over the seeds that reached it, and how many did;
  where none did, "not reached" with the best validation NDCG@10 any of its seeds scored.

Pure, and the standard library only (the CLI imports it to parse its flag): curves in
(fsbench.measurement.run_summary's `quality_curve`), numbers and cells out.
"""
from __future__ import annotations

import math
import statistics

METRIC = "valid_ndcg_at_10"
"""The score time to quality waits for: validation NDCG@10."""
TARGET_FRACTION = 0.95
"""The default target: this fraction of the baseline's best validation NDCG@10."""
FIELDS = ("target_valid_ndcg_at_10", "time_to_quality_s", "samples_to_quality",
          "seeds_reached_quality", "best_valid_ndcg_at_10")
"""A row's time-to-quality keys (absent from results stored before them)."""
STORED_BEFORE = "n/a (stored before time to quality)"


def check_fraction(fraction: float, flag: str = "--target-fraction") -> float:
    from fsbench.errors import ConfigError

    if not 0 < fraction <= 1:  # NaN fails too
        raise ConfigError(f"{flag}={fraction} must be in (0, 1]: the fraction of the "
                          "baseline's best validation NDCG@10 to reach")
    return fraction


def best(curve: list[dict]) -> float | None:
    """A run's best validation NDCG@10 (None: no evaluation scored validation)."""
    scores = [e[METRIC] for e in curve if e.get(METRIC) is not None]
    return max(scores) if scores else None


def target(baseline_curves: list[list[dict]], fraction: float = TARGET_FRACTION) -> float | None:
    """`fraction` x the mean over the baseline's seeds of each seed's best validation
    NDCG@10; None without a baseline run that scored validation."""
    bests = [b for b in map(best, baseline_curves) if b is not None]
    return fraction * statistics.fmean(bests) if bests else None


def first_reaching(curve: list[dict], goal: float) -> dict | None:
    """The first evaluation whose validation NDCG@10 is >= `goal` (None: none)."""
    return next((e for e in sorted(curve, key=lambda e: e["step"])
                 if e.get(METRIC) is not None and e[METRIC] >= goal), None)


def row(curves: list[list[dict]], goal: float | None) -> dict:
    """One trainer's time-to-quality keys at one world size, over its seeds' curves."""
    bests = [best(c) for c in curves]
    known = [b for b in bests if b is not None]
    out = {"target_valid_ndcg_at_10": goal, "time_to_quality_s": None, "samples_to_quality": None,
           "seeds_reached_quality": 0, "best_valid_ndcg_at_10": max(known) if known else None,
           "best_valid_ndcg_at_10_not_reached": None}
    if goal is None:
        return out
    hits = [first_reaching(c, goal) for c in curves]
    reached = [e for e in hits if e is not None]
    missed = [b for b, e in zip(bests, hits) if e is None and b is not None]
    out.update(seeds_reached_quality=len(reached),
               best_valid_ndcg_at_10_not_reached=max(missed) if missed else None)
    if reached:
        out["time_to_quality_s"] = _median([e.get("train_s") for e in reached])
        out["samples_to_quality"] = _median([e.get("samples") for e in reached])
    return out


def rows_by_key(curves: dict[tuple, list[list[dict]]], baseline: str,
                fraction: float = TARGET_FRACTION) -> dict[tuple, dict]:
    """`row` for every key (..., trainer, world_size) of `curves` (the seeds' curves),
    each against the target from the baseline's curves at the same other keys."""
    out = {}
    for key, runs in curves.items():
        *rest, trainer, n = key
        out[key] = row(runs, target(curves.get((*rest, baseline, n), []), fraction))
        out[key]["seeds"] = len(runs)
    return out


def cells(r: dict) -> tuple[str, str]:
    """(time, samples) as a table shows them: the median over the seeds that reached the
    target; "not reached (best X)" where none did; how many did where some did not; a
    reason in place of a number that is not there."""
    if "time_to_quality_s" not in r:
        return STORED_BEFORE, STORED_BEFORE
    if r["target_valid_ndcg_at_10"] is None:
        why = "n/a (no baseline run with validation scores)"
        return why, why
    reached, seeds = r["seeds_reached_quality"], r.get("seeds", r["seeds_reached_quality"])
    if reached == 0:
        b = r["best_valid_ndcg_at_10"]
        return f"not reached (best {'n/a' if b is None else format(b, '.4f')})", "not reached"
    t, n = r["time_to_quality_s"], r["samples_to_quality"]
    time = "n/a (a step's time is missing)" if t is None else f"{t:.1f}"
    samples = "n/a (not counted when stored)" if n is None else f"{n:.0f}"
    if reached < seeds:
        missed = r.get("best_valid_ndcg_at_10_not_reached")
        miss = "" if missed is None else f"; the others not reached, best {missed:.4f}"
        time, samples = f"{time} ({reached}/{seeds} seeds{miss})", f"{samples} ({reached}/{seeds} seeds)"
    return time, samples


def values(r: dict) -> tuple:
    """(target, time, samples) of a report's row: numbers where every seed reached the
    target, else `cells`' text."""
    time, samples = cells(r)
    whole = r["seeds_reached_quality"] == r["seeds"]
    return (r["target_valid_ndcg_at_10"],
            r["time_to_quality_s"] if whole and r["time_to_quality_s"] is not None else time,
            r["samples_to_quality"] if whole and r["samples_to_quality"] is not None else samples)


def report_note(baseline: str) -> str:
    """The report's footnote on its time-to-quality columns (the default target)."""
    return (f"train s / samples to quality: summed step times (evaluation excluded) and global "
            f"samples trained until validation NDCG@10 first reaches the val NDCG@10 target, "
            f"{TARGET_FRACTION:.0%} of {baseline}'s best (each run's best, averaged over its "
            "runs, at the same world size); median over the runs that reached it.")


def describe_target(fraction: float, baseline: str, targets: dict[int, float | None]) -> str:
    """The header's sentence: what the target is, per world size."""
    per = ", ".join(f"{n} ranks {'n/a' if t is None else format(t, '.4f')}"
                    for n, t in sorted(targets.items()))
    return (f"time to quality = training s (summed step times, evaluation excluded) and "
            f"samples until validation NDCG@10 first reaches {fraction:.0%} of {baseline}'s "
            f"best (each seed's best, averaged over seeds, at the same world size: {per}); "
            "median over the seeds that reached it")


def _median(values: list) -> float | None:
    """The median, None if any value is missing (a run stored without it)."""
    if not values or any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
        return None
    return float(statistics.median(values))
