"""What the report's plots show, as data: pure functions over report tables and run
timelines, tested without matplotlib (fsbench.reporting.plots draws them).

`cause_bars` (the bubble's four causes per report row), `relative_scaling` (the scaling
plot's values), `step_timeline` (one step's per-rank spans for a Gantt chart),
`median_step_busy_idle`, and which run the per-rank plots draw (`step_run_candidates`,
`run_spans`).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from fsbench.config import ConfigError
from fsbench.measurement import metrics
from fsbench.running import store

CAUSES = ("straggler_bubble_ratio", "exposed_comm_ratio", "input_stall_ratio", "other_idle_ratio")
# Span kinds in a rank's step partition (fsbench.measurement.metrics.rank_step_table): `wait` is
# waiting on communication; `data` is what the input stage was called in older timelines.
# `step`, `flight` (a collective in flight, not the thread's time) and `probe` are not drawn.
TIMELINE_KINDS = {"compute": "compute", "comm": "comm", "wait": "comm", "input": "input", "data": "input"}


def flag_column(rows: pd.DataFrame, col: str) -> pd.Series:
    return rows[col].fillna(False).astype(bool) if col in rows else pd.Series(False, index=rows.index)


def cause_bars(table: pd.DataFrame) -> pd.DataFrame:
    """One stacked bar per report row: the bubble's four causes, summing to its bubble_ratio.

    A report row holds medians over repeats, and the causes' medians need not sum to the
    median bubble; the bar keeps the median bubble's height and splits it in proportion to
    the causes' medians (with one repeat, the causes exactly as measured). A row without
    causes (runs from before the bubble was split) is one `unsplit` segment.

    Returns the row keys and flags, bubble_ratio, and one column per cause plus `unsplit`
    (fractions of capacity)."""
    keys = [c for c in ("workload", "trainer", "world_size", "simulated", "emulated",
                        "oversubscribed", "contended") if c in table]
    bubble = pd.to_numeric(table["bubble_ratio"], errors="coerce").fillna(0.0).to_numpy(dtype=float)
    causes = np.column_stack([pd.to_numeric(table[c], errors="coerce").fillna(0.0).to_numpy(dtype=float)
                              if c in table else np.zeros(len(table)) for c in CAUSES])
    causes = causes.clip(min=0.0)  # `other` can dip below 0 by clock granularity
    total = causes.sum(axis=1)
    split = total > 0
    scale = np.divide(bubble, total, out=np.zeros_like(bubble), where=split)
    out = table[keys].reset_index(drop=True).copy()
    out["bubble_ratio"] = bubble
    for i, c in enumerate(CAUSES):
        out[c] = causes[:, i] * scale
    out["unsplit"] = np.where(split, 0.0, bubble)
    return out


def relative_scaling(table: pd.DataFrame) -> pd.DataFrame:
    """The scaling plot's values: `table` with, per (workload, trainer, simulated) line, its
    smallest world size N0 (`base_world_size`) and `relative_efficiency` = throughput(N) /
    ((N / N0) x throughput(N0)). Where N0 = 1 that is the table's scaling efficiency; a
    line without a 1-rank row (a store of 2-rank runs, simulated runs from 8 GPUs up) has
    none (n/a in the table), and its plot is drawn relative to N0, labelled so."""
    keys = ["workload", "trainer", "simulated"]
    first = table.loc[table.groupby(keys, sort=False)["world_size"].idxmin()].set_index(keys)
    lines = pd.MultiIndex.from_frame(table[keys])
    out = table.copy()
    out["base_world_size"] = first["world_size"].reindex(lines).to_numpy()
    base = first["samples_per_s"].reindex(lines).to_numpy()
    out["relative_efficiency"] = out["samples_per_s"] / (out["world_size"] / out["base_world_size"] * base)
    return out


def median_step(spans: pd.DataFrame) -> int:
    """The measured step with the median step time (the lower median, so a real step)."""
    steps = metrics.step_metrics(spans)
    measured = steps[~steps["warmup"]].sort_values(["step_time_ms", "step"])
    if measured.empty:
        raise ConfigError("no measured steps in the run's timelines")
    return int(measured.iloc[(len(measured) - 1) // 2]["step"])


def median_step_busy_idle(spans: pd.DataFrame) -> tuple[int, float, pd.DataFrame]:
    """The median measured step (`median_step`), its T in ms, and per rank busy_ms and
    idle_ms = T - busy (clipped at 0: thread CPU time can exceed wall time by clock
    granularity)."""
    step = median_step(spans)
    per_rank = metrics.rank_step_busy(spans)
    per_rank = per_rank[per_rank["step"] == step].sort_values("rank")
    t_ns = float(per_rank["end_ns"].max() - per_rank["start_ns"].min())
    out = pd.DataFrame({"rank": per_rank["rank"].to_numpy(),
                        "busy_ms": per_rank["busy_ns"].to_numpy() / 1e6,
                        "idle_ms": (t_ns - per_rank["busy_ns"].to_numpy()).clip(min=0) / 1e6})
    return step, t_ns / 1e6, out


def step_timeline(spans: pd.DataFrame, step: int | None = None) -> tuple[int, pd.DataFrame, pd.DataFrame]:
    """One step's per-rank spans, as the metrics partition it, for a Gantt chart.

    Args:
        spans: a run's timelines (fsbench.measurement.timeline.read_timelines).
        step: the step to show; default the median measured step (`median_step`).
    Returns:
        (step, windows, segments). windows: one row per rank, its step span's start_ms and
        end_ms. segments: rank, kind (compute | comm | input), name, start_ms, end_ms and,
        for compute, busy_ms (thread CPU time, the emulated time on emulated runs, CUDA
        time where recorded; the rest of a compute span is blocked time, which the
        metrics count as communication wait). Only the spans the metrics count: not
        nested, of a drawn kind, wholly inside the rank's step span. Times in ms from the
        first rank's step start.
    """
    step = median_step(spans) if step is None else int(step)
    here = spans[spans["step"] == step]
    bounds = here[here["kind"] == "step"].groupby("rank").agg(start_ns=("start_ns", "min"),
                                                              dur_ns=("dur_ns", "max"))
    if bounds.empty:
        raise ConfigError(f"step {step} has no step spans in the run's timelines")
    t0 = bounds["start_ns"].min()
    bounds["end_ns"] = bounds["start_ns"] + bounds["dur_ns"]
    windows = pd.DataFrame({"rank": bounds.index.to_numpy(),
                            "start_ms": (bounds["start_ns"].to_numpy() - t0) / 1e6,
                            "end_ms": (bounds["end_ns"].to_numpy() - t0) / 1e6})
    nested = here["nested"].eq(True) if "nested" in here else pd.Series(False, index=here.index)
    seg = here[here["kind"].isin(list(TIMELINE_KINDS)) & ~nested]
    seg = seg.join(bounds[["start_ns", "end_ns"]].rename(columns=lambda c: f"{c}_step"), on="rank")
    end = seg["start_ns"] + seg["dur_ns"]
    seg = seg[(seg["start_ns"] >= seg["start_ns_step"]) & (end <= seg["end_ns_step"])]
    busy = seg["cpu_ns"].astype(float)
    if "gpu_ns" in seg:  # CUDA runs: the device's time, as the metrics take it
        busy = seg["gpu_ns"].astype(float).where(seg["gpu_ns"].notna(), busy)
    kind = seg["kind"].map(TIMELINE_KINDS)
    segments = pd.DataFrame({
        "rank": seg["rank"].to_numpy(), "kind": kind.to_numpy(), "name": seg["name"].to_numpy(),
        "start_ms": (seg["start_ns"].to_numpy() - t0) / 1e6,
        "end_ms": ((seg["start_ns"] + seg["dur_ns"]).to_numpy() - t0) / 1e6,
        "busy_ms": np.where(kind == "compute", np.minimum(busy, seg["dur_ns"]) / 1e6, np.nan)})
    return step, windows, segments.sort_values(["rank", "start_ms"]).reset_index(drop=True)


def step_run_candidates(runs: pd.DataFrame, trainer: str, others: bool = True) -> list[str]:
    """Measured complete runs in the order the per-rank plots try them: `trainer`'s, largest
    world size first (ties: the last run directory by name), then (`others`) the other
    trainers' in the same order."""
    measured = runs[~flag_column(runs, "simulated")]
    if "status" in measured:
        measured = measured[measured["status"] == "complete"]
    measured = measured.assign(_own=measured["trainer"] == trainer)
    if not others:
        measured = measured[measured["_own"]]
    order = measured.sort_values(["_own", "world_size", "run_dir"], ascending=False)
    return [str(d) for d in order["run_dir"]]


def choose_step_run(runs: pd.DataFrame, trainer: str) -> str | None:
    """The measured run of `trainer` at its largest world size (any trainer's if it has no
    measured run); ties go to the last run directory by name."""
    return next(iter(step_run_candidates(runs, trainer)), None)


def run_spans(run_dir: str | os.PathLike) -> pd.DataFrame:
    """A run's timelines, checked for what the per-rank plots need: spans of every rank of
    its world size and a measured step. ConfigError saying what is missing or damaged."""
    from fsbench.measurement.timeline import read_timelines

    spans = read_timelines(run_dir)  # a damaged file: ConfigError naming it
    if spans.empty:
        raise ConfigError("no timelines (rank-*.jsonl)")
    world = run_manifest(run_dir).get("world_size")
    missing = sorted(set(range(world)) - set(spans["rank"])) if isinstance(world, int) else []
    if missing:  # a plot of the other ranks would look like a smaller world
        raise ConfigError(f"no timeline of rank(s) {', '.join(map(str, missing))}")
    median_step(spans)  # ConfigError without a measured step
    return spans


def run_manifest(run_dir: str | os.PathLike) -> dict:
    """The run's manifest for a plot's labels; {} where it is unreadable (the spans suffice)."""
    try:
        return store.read_object(Path(run_dir) / "manifest.json")
    except ConfigError:
        return {}


# A simulated row made before summaries carried their cluster's assumptions.
UNRECORDED = "assumptions not recorded (simulated before fsbench recorded them)"


def simulated_assumptions(table: pd.DataFrame) -> list[str]:
    """Each simulated cluster's assumptions line (sim_inputs.assumptions), once."""
    if "assumptions" not in table:
        return [UNRECORDED] if table["simulated"].any() else []
    return list(dict.fromkeys(a for a, sim in zip(table["assumptions"], table["simulated"]) if sim and a))
