"""`fsbench history --store DIR`: every stored run in commit order, change points per metric.

Runs are ordered by the commit date of the commit they measured (`git_sha` in the
manifest; a commit this checkout does not know sorts by the run's own date), then by run
date. For each (workload, trainer, world size) and each metric the series of run values
is segmented by `ruptures` (PELT, least-squares cost, a BIC-like penalty from the
series' own noise: 2 log n sigma^2, sigma from the median absolute difference of
neighbours, robust to the shifts being looked for). Output: `history.html` (one
self-contained page, a plot per metric with change points marked) and `history.md`.
"""
from __future__ import annotations

import base64
import html
import io
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd

from fsbench.errors import ConfigError

METRICS = ("step_time_ms_median", "samples_per_s", "bubble_ratio", "straggler_bubble_ratio",
           "exposed_comm_ratio", "input_stall_ratio", "other_idle_ratio", "peak_memory_mb")
KEY = ["workload", "trainer", "world_size", "simulated"]  # a projection is no point of a measured series


def commit_dates(shas: list[str]) -> dict[str, str]:
    """ISO commit date of each sha this checkout knows."""
    out = {}
    for sha in {s for s in shas if isinstance(s, str) and s}:
        done = subprocess.run(["git", "show", "-s", "--format=%cI", sha.split("-")[0]],
                              capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip():
            out[sha] = done.stdout.strip()
    return out


def ordered_runs(runs: pd.DataFrame) -> pd.DataFrame:
    dates = commit_dates(runs["git_sha"].tolist())
    runs = runs.assign(commit_date=[dates.get(s, c) for s, c in zip(runs["git_sha"], runs["created"])])
    return runs.sort_values(["commit_date", "created"], kind="stable").reset_index(drop=True)


def change_points(values: np.ndarray) -> list[int]:
    """Indices where a new segment starts (empty: no change)."""
    import ruptures

    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) < 4:
        return []
    sigma = 1.4826 * np.median(np.abs(np.diff(x))) / np.sqrt(2)
    if sigma == 0:
        sigma = max(1e-12, np.std(x) / 10)
    ends = ruptures.Pelt(model="l2", min_size=2, jump=1).fit(x).predict(pen=2 * np.log(len(x)) * sigma ** 2)
    return [int(e) for e in ends[:-1]]


def history(runs: pd.DataFrame) -> list[dict]:
    """Per key and metric: the series and its change points (with before/after medians)."""
    out = []
    for key, g in ordered_runs(runs).groupby(KEY, sort=True):
        for metric in METRICS:
            # A value of the wrong type (a hand-edited or foreign summary) is no value.
            series = pd.to_numeric(g[metric], errors="coerce").to_numpy(dtype=float) \
                if metric in g else np.array([np.nan])
            if np.isnan(series).all():
                continue
            points = change_points(series)
            bounds = [0, *points, len(series)]
            segments = [float(np.nanmedian(series[a:b])) for a, b in zip(bounds, bounds[1:])]
            named = {**dict(zip(KEY, key)), "simulated": bool(key[-1])}  # numpy bool -> JSON
            out.append({"key": named, "metric": metric, "values": series.tolist(),
                        "shas": g["git_sha"].fillna("").str[:10].tolist(),
                        "change_points": points, "segment_medians": segments})
    return out


def _plot(item: dict) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 2.6))
    ax.plot(item["values"], marker="o", ms=3, lw=1)
    for cp in item["change_points"]:
        ax.axvline(cp - 0.5, color="tab:red", ls="--", lw=1)
    ax.set_xlabel("run (commit order)")
    ax.set_ylabel(item["metric"])
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def ranks(key: dict) -> str:
    return f"{key['world_size']}" + (" (simulated)" if key.get("simulated") else "")


def changes(item: dict) -> str:
    """An item's change points as text: `run (sha): median before -> median after`."""
    return ", ".join(f"{cp} ({item['shas'][cp]}): {item['segment_medians'][i]:.4g} -> "
                     f"{item['segment_medians'][i + 1]:.4g}"
                     for i, cp in enumerate(item["change_points"])) or "none"


def table(items: list[dict]) -> str:
    """One row per (workload, trainer, ranks, metric): how many runs, where it changed."""
    from fsbench.table import grid

    rows = [[str(it["key"]["workload"]), str(it["key"]["trainer"]), ranks(it["key"]),
             it["metric"], str(len(it["values"])), changes(it)] for it in items]
    return grid(["workload", "trainer", "ranks", "metric", "runs",
                 "change points (run: before -> after)"], rows,
                align=["left", "left", "right", "left", "right", "left"])


def write(items: list[dict], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    body = ["<!doctype html><html><head><meta charset='utf-8'><title>fsbench history</title>",
            "<style>body{font-family:sans-serif;max-width:60em;margin:auto}h2{font-size:1.1em}</style>",
            "</head><body><h1>fsbench history</h1>"]
    for it in items:
        k = it["key"]
        body.append(f"<h2>{html.escape(str(k['workload']))} / {html.escape(str(k['trainer']))} / "
                    f"{ranks(k)} ranks: {it['metric']}</h2><p>change points: "
                    f"{html.escape(changes(it))}</p><img alt='{it['metric']}' "
                    f"src='data:image/png;base64,{_plot(it)}'>")
    body.append("</body></html>")
    (out / "history.md").write_text("# fsbench history\n\n" + table(items) + "\n")
    (out / "history.html").write_text("\n".join(body))
    return out / "history.html", out / "history.md"


def load(runs_dir: str | Path) -> pd.DataFrame:
    from fsbench.running.store import load_runs

    if not Path(runs_dir).is_dir():
        raise ConfigError(f"--store {runs_dir}: not a directory")
    runs = load_runs(runs_dir)
    if not len(runs):
        raise ConfigError(f"--store {runs_dir}: holds no complete run")
    return runs
