"""Run orchestration on this machine: one run (`run_once`) and a sweep of runs (`sweep`).

The run directory is the unit of record: a run writes its manifest before any rank starts
and its summary only after every rank finished, so an interrupted run stays on disk,
marked `failed` or `interrupted`, and is never mistaken for a result.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from fsbench import metrics, store
from fsbench.config import RunConfig
from fsbench.launch.local import launch_local
from fsbench.timeline import read_timelines

# Summary columns every run reports (ratios are fractions in [0, 1]).
SUMMARY_KEYS = (
    "trainer", "workload", "world_size", "steps", "step_time_ms_median", "samples_per_s",
    "tokens_per_s", "bubble_ratio", "straggler_bubble_ratio", "exposed_comm_ratio",
    "load_imbalance", "sm_occupancy", "oversubscribed",
)


def read_step_stats(run_dir: Path) -> pd.DataFrame:
    rows = []
    for p in sorted(run_dir.glob("steps-rank-*.jsonl")):
        rows += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return pd.DataFrame(rows, columns=["rank", "step", "loss", "num_samples", "num_targets"])


def summarize_run(run_dir: Path) -> dict:
    """The run's summary.json content, computed from its files alone."""
    manifest = store.read_json(run_dir / "manifest.json")
    summary = {
        "run_id": manifest["run_id"],
        "trainer": manifest["trainer"],
        "workload": manifest["workload"],
        "world_size": manifest["world_size"],
        "seed": manifest["seed"],
        "steps": manifest["config"]["workload"]["steps"],
        "warmup": manifest["config"]["workload"]["warmup"],
        "oversubscribed": manifest["oversubscribed"],
        # No GPU sampler yet on CPU runs: occupancy is not measurable here.
        "sm_occupancy": None,
        "sm_occupancy_reason": "no GPU: SM occupancy is not measurable on a CPU run",
    }
    summary.update(metrics.summarize(read_timelines(run_dir), read_step_stats(run_dir)))
    return summary


def run_once(run: RunConfig, out_dir: str | Path, timeout_s: float | None = None) -> tuple[Path, dict]:
    """Launch one run on local ranks, then summarize it. Returns (run_dir, summary)."""
    run_dir = store.create_run_dir(out_dir, run)
    try:
        launch_local(run_dir, run.world_size, run.threads_per_rank, timeout_s=timeout_s)
        summary = summarize_run(run_dir)
        store.write_json_atomic(run_dir / "summary.json", summary)
        store.update_manifest(run_dir, status="complete")
    except KeyboardInterrupt:
        store.update_manifest(run_dir, status="interrupted")
        raise
    except BaseException as e:
        store.update_manifest(run_dir, status="failed", error=str(e))
        raise
    finally:
        store.refresh_table(out_dir)
    return run_dir, summary


def sweep_plan(trainers: list[str], world_sizes: list[int], repeats: int) -> list[tuple[int, int, str]]:
    """(repeat, world_size, trainer) in run order. Repeats are the outer loop, so drift on
    a shared machine (another job, thermal state) hits every combination alike."""
    return [(r, n, t) for r, n, t in itertools.product(range(repeats), world_sizes, trainers)]


def sweep(make_run: Callable[[str, int], RunConfig], trainers: list[str], world_sizes: list[int],
          repeats: int, out_dir: str | Path,
          progress: Callable[[Iterable], Iterable] = lambda it: it) -> pd.DataFrame:
    """Run every (trainer, world size) `repeats` times; one row per run."""
    rows = []
    for repeat, n, trainer in progress(sweep_plan(trainers, world_sizes, repeats)):
        run_dir, summary = run_once(make_run(trainer, n), out_dir)
        rows.append({**summary, "repeat": repeat, "run_dir": str(run_dir)})
    return pd.DataFrame(rows)


def comparison_table(runs: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Median over repeats per (trainer, world size), with throughput and step-time ratios
    to `baseline` at the same world size (ratios of medians from the same sweep)."""
    cols = ["step_time_ms_median", "samples_per_s", "tokens_per_s", "bubble_ratio",
            "straggler_bubble_ratio", "exposed_comm_ratio", "load_imbalance"]
    g = runs.groupby(["trainer", "world_size"], sort=False)
    table = g[cols].median()
    table["repeats"] = g.size()
    table["oversubscribed"] = g["oversubscribed"].any()
    base = table.xs(baseline, level="trainer") if baseline in table.index.get_level_values(0) else None
    if base is not None:
        n = table.index.get_level_values("world_size")
        table["throughput_vs_" + baseline] = table["samples_per_s"].to_numpy() / base.loc[n, "samples_per_s"].to_numpy()
    return table.reset_index()
