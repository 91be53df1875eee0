"""fsbench's quality against RecBole's SASRec, seed by seed: is fsbench's mean test HR@10
(and NDCG@10) at least a fraction (default 0.9) of RecBole's converged mean, and what is
the interval of the difference?

    python scripts/quality_vs_recbole.py --quality runs/quality/quality/quality.json \\
        --recbole results/recbole_sasrec_ml100k.json

Inputs: the `quality.json` that `fsbench quality` writes (its rows carry each seed's test
HR@10 and NDCG@10), and the JSON of `scripts/recbole_reference.py` (its finished seeds in
`runs`). The unit is the seed on both sides (RecBole's file has no per-user ranks): the
difference of the two means, with a 95% t interval that pools the two sides' seed-to-seed
variance (the same model family on the same file; with one RecBole seed, the pooled
variance is fsbench's alone, and the table says so).

The verdict per trainer: `met` when the mean ratio is at least the fraction, `missed` when
not; `inconclusive` (and why) when the reference cannot tell: fewer than 2 seeds on
fsbench's side, or a RecBole seed that did not stop early (not converged), or fewer finished
RecBole seeds than fsbench ran. Under a ratio short of the fraction, a capped RecBole seed
still decides `missed`: its best so far is a lower bound on its converged score. Exit 0 met for every trainer, 1 one missed, 3 inconclusive.
Beside each: how many seeds a side a t test would need to tell a mean at 0.95x RecBole's
from one at 0.9x (95% level, 80% power, the seeds' pooled spread).
Standard library and scipy only; RecBole is not needed.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from scipy import stats

METRICS = (("HR@10", "hr_at_10_per_seed", "test_hit@10"),
           ("NDCG@10", "ndcg_at_10_per_seed", "test_ndcg@10"))


def pooled_interval(a: list[float], b: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high): a t interval with the two samples' pooled variance."""
    diff = statistics.fmean(a) - statistics.fmean(b)
    df = len(a) + len(b) - 2
    if df < 1:
        return diff, math.nan, math.nan
    ss = sum((x - statistics.fmean(a)) ** 2 for x in a) + sum((x - statistics.fmean(b)) ** 2 for x in b)
    se = math.sqrt(ss / df * (1 / len(a) + 1 / len(b)))
    half = stats.t.ppf(0.5 + level / 2, df) * se
    return diff, diff - half, diff + half


def seeds_to_tell(a: list[float], b: list[float], high: float, low: float, level: float = 0.95,
                  power: float = 0.8) -> float:
    """Seeds a side for a two-sided t test at `level` to tell, with `power`, an fsbench mean
    at `high` x RecBole's from one at `low` x (the normal approximation, the two sides'
    pooled seed-to-seed spread): 2 (z_level + z_power)^2 s^2 / delta^2."""
    df = len(a) + len(b) - 2
    if df < 1 or not b:
        return math.nan
    ss = sum((x - statistics.fmean(a)) ** 2 for x in a) + sum((x - statistics.fmean(b)) ** 2 for x in b)
    delta = (high - low) * statistics.fmean(b)
    z = stats.norm.ppf(0.5 + level / 2) + stats.norm.ppf(power)
    return 2 * z * z * (ss / df) / (delta * delta)


def why_inconclusive(fs_seeds: int, runs: list[dict], in_progress: list[dict]) -> str | None:
    if fs_seeds < 2:
        return f"fsbench has {fs_seeds} seed (2 or more give an interval)"
    if not runs:
        return "RecBole has no finished seed"
    capped = [r["seed"] for r in runs if not r.get("stopped_early")]
    if capped:
        return f"RecBole seed(s) {capped} hit the epoch cap: not converged"
    if len(runs) < fs_seeds:
        going = [p.get("seed") for p in in_progress]
        return (f"RecBole has {len(runs)} finished seed(s) of {fs_seeds}"
                + (f" (seeds {going} still training)" if going else ""))
    return None


def compare(quality: dict, recbole: dict, fraction: float) -> list[dict]:
    runs = recbole.get("runs") or []
    out = []
    for row in quality["rows"]:
        if "hr_at_10_per_seed" not in row:
            raise SystemExit(f"error: {row['trainer']}'s row has no per-seed scores (a quality.json "
                             "written before they were stored): rerun fsbench quality")
        entry = {"trainer": row["trainer"], "world_size": row["world_size"],
                 "fsbench_seeds": row.get("seed_list"), "recbole_seeds": [r["seed"] for r in runs],
                 "recbole_epochs": [r.get("epochs_trained") for r in runs],
                 "recbole_stopped_early": [r.get("stopped_early") for r in runs]}
        for name, ours, theirs in METRICS:
            a, b = row[ours], [float(r[theirs]) for r in runs]
            diff, lo, hi = pooled_interval(a, b) if b else (math.nan, math.nan, math.nan)
            entry[name] = {"fsbench_per_seed": a, "recbole_per_seed": b,
                           "fsbench_mean": statistics.fmean(a),
                           "recbole_mean": statistics.fmean(b) if b else math.nan,
                           "ratio": statistics.fmean(a) / statistics.fmean(b) if b else math.nan,
                           "difference": diff, "difference_95": [lo, hi],
                           "seeds_to_tell_0.95_from_0.9": seeds_to_tell(a, b, 0.95, 0.9)}
        why = why_inconclusive(len(row["hr_at_10_per_seed"]), runs, recbole.get("in_progress") or [])
        ratio = entry["HR@10"]["ratio"]
        if why and "epoch cap" in why and ratio < fraction:
            # A capped seed's best so far is a lower bound on its converged score.
            entry["verdict"] = f"missed, against a reference that can only rise ({why})"
        else:
            entry["verdict"] = (f"inconclusive: {why}" if why else
                                "met" if ratio >= fraction else "missed")
        out.append(entry)
    return out


def markdown(rows: list[dict], fraction: float) -> str:
    lines = [f"Test scores, mean over seeds; target: fsbench's HR@10 mean at least {fraction:g}x "
             "RecBole's. Difference: fsbench - RecBole, 95% t interval over seeds (pooled variance).",
             "", "| trainer | ranks | metric | fsbench per seed | RecBole per seed | ratio "
             "| difference [95%] | seeds a side to tell 0.95x from 0.9x | verdict |",
             "|---|--:|---|---|---|--:|---|--:|---|"]
    for r in rows:
        for name, _, _ in METRICS:
            m = r[name]
            lo, hi = m["difference_95"]
            lines.append(
                f"| {r['trainer']} | {r['world_size']} | {name} | "
                f"{', '.join(f'{v:.4f}' for v in m['fsbench_per_seed'])} | "
                f"{', '.join(f'{v:.4f}' for v in m['recbole_per_seed']) or 'none'} | "
                f"{m['ratio']:.3f} | {m['difference']:+.4f} [{lo:+.4f}, {hi:+.4f}] | "
                f"{math.ceil(m['seeds_to_tell_0.95_from_0.9']) if m['seeds_to_tell_0.95_from_0.9'] == m['seeds_to_tell_0.95_from_0.9'] else 'n/a'} | "
                f"{r['verdict'] if name == 'HR@10' else ''} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quality", type=Path, required=True, help="fsbench quality's quality.json")
    ap.add_argument("--recbole", type=Path, required=True, help="recbole_reference.py's JSON")
    ap.add_argument("--fraction", type=float, default=0.9, help="target: this fraction of RecBole's mean")
    ap.add_argument("--format", choices=["md", "json"], default="md")
    args = ap.parse_args()
    if not 0 < args.fraction <= 1:
        ap.error(f"--fraction={args.fraction} must be in (0, 1]")
    try:
        quality, recbole = (json.loads(p.read_text()) for p in (args.quality, args.recbole))
    except (OSError, ValueError) as e:
        ap.error(f"cannot read the inputs: {e}")
    rows = compare(quality, recbole, args.fraction)
    print(json.dumps(rows, indent=1) if args.format == "json" else markdown(rows, args.fraction))
    verdicts = [r["verdict"] for r in rows]
    if any(v.startswith("inconclusive") for v in verdicts):
        return 3
    return 1 if any(v.startswith("missed") for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
