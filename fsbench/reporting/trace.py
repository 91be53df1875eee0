"""One run's rank timelines merged into a Chrome Trace Event Format file.

The output opens in Perfetto (ui.perfetto.dev) and chrome://tracing:
- one process per rank (pid = rank, named "rank N"),
- one thread (track) per span kind, so compute and communication sit on separate tracks,
- one complete event ("ph": "X") per span, ts/dur in microseconds from the run's earliest
  span, args carrying step, warmup and the span's thread CPU time (cpu_ms).

Both viewers draw the events of one track as a stack, which is only correct when any two
events are disjoint or nested. Spans of one kind can partially overlap (asynchronous
communication chunks in flight together), so such a span moves to an extra lane of its
kind ("comm #2") instead of corrupting the stack.

Timestamps come from CLOCK_MONOTONIC, shared by the processes of one host only: ranks on
different hosts are placed on one axis but their relative offsets mean nothing.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from fsbench.running import store
from fsbench.config import ConfigError
from fsbench.measurement.timeline import SPAN_KINDS, read_timelines
from fsbench.table import warn

# Track order in a rank: the step frames everything, compute and comm sit side by side so
# overlap (or its absence) is visible at a glance; collectives in flight right below them.
TRACK_ORDER = ("step", "compute", "comm", "flight", "wait", "input", "probe")
assert set(TRACK_ORDER) == set(SPAN_KINDS)
# Tracks of one kind are numbered kind_index * LANE_STRIDE + lane, so tids sort by kind.
LANE_STRIDE = 1000


def _kind_order(kinds: list[str]) -> dict[str, int]:
    """TRACK_ORDER first; unknown kinds (hand-made data) after, sorted."""
    extra = sorted(k for k in set(kinds) if k not in TRACK_ORDER)
    return {k: i for i, k in enumerate(list(TRACK_ORDER) + extra)}


def _assign_lanes(starts: list[int], ends: list[int]) -> list[int]:
    """Lane per interval such that intervals in a lane are pairwise disjoint or nested.

    Intervals are visited by start (longest first on ties, so a parent precedes its
    children); each lane keeps the stack of intervals still open at the current start.
    """
    order = sorted(range(len(starts)), key=lambda i: (starts[i], -ends[i]))
    stacks: list[list[int]] = []  # per lane: ends of the open intervals, outermost first
    lanes = [0] * len(starts)
    for i in order:
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= starts[i]:
                stack.pop()
            if not stack or ends[i] <= stack[-1]:  # fits inside the innermost open one
                stack.append(ends[i])
                lanes[i] = lane
                break
        else:
            stacks.append([ends[i]])
            lanes[i] = len(stacks) - 1
    return lanes


def _metadata(pid: int, tid: int | None, name: str, value: str | int) -> dict:
    event = {"ph": "M", "pid": pid, "name": name, "args": {}}
    if tid is not None:
        event["tid"] = tid
    key = "sort_index" if name.endswith("sort_index") else "name"
    event["args"][key] = value
    return event


def chrome_trace(spans: pd.DataFrame) -> dict:
    """Chrome trace dict from timeline spans (columns as `read_timelines` returns)."""
    if spans.empty:
        raise ConfigError("no spans to trace: the timelines are empty")
    t0 = int(spans["start_ns"].min())
    order = _kind_order(spans["kind"].tolist())
    events: list[dict] = []
    tracks: set[tuple[int, str, int]] = set()
    for (rank, kind), g in spans.groupby(["rank", "kind"], sort=True):
        starts = g["start_ns"].astype("int64").tolist()
        ends = (g["start_ns"] + g["dur_ns"]).astype("int64").tolist()
        lanes = _assign_lanes(starts, ends)
        for lane, rec in zip(lanes, g.itertuples(index=False)):
            tid = order[kind] * LANE_STRIDE + lane
            tracks.add((int(rank), kind, lane))
            cpu = None if pd.isna(rec.cpu_ns) else round(float(rec.cpu_ns) / 1e6, 6)
            events.append({
                "name": str(rec.name), "cat": kind, "ph": "X",
                "pid": int(rank), "tid": tid,
                # ns -> us, keeping ns precision so nesting survives the conversion.
                "ts": (int(rec.start_ns) - t0) / 1e3, "dur": int(rec.dur_ns) / 1e3,
                "args": {"step": int(rec.step), "warmup": bool(rec.warmup), "cpu_ms": cpu},
            })
    events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
    meta = []
    for rank in sorted({r for r, _, _ in tracks}):
        meta.append(_metadata(rank, None, "process_name", f"rank {rank}"))
        meta.append(_metadata(rank, None, "process_sort_index", rank))
    for rank, kind, lane in sorted(tracks):
        tid = order[kind] * LANE_STRIDE + lane
        meta.append(_metadata(rank, tid, "thread_name", kind if lane == 0 else f"{kind} #{lane + 1}"))
        meta.append(_metadata(rank, tid, "thread_sort_index", tid))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"time_origin_ns": t0, "clock": "CLOCK_MONOTONIC"}}


def write_trace(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> tuple[Path, int]:
    """Write RUN_DIR's merged trace (default RUN_DIR/trace.json). Returns (path, spans)."""
    run_dir = Path(run_dir)
    try:  # who/what the trace shows, for whoever opens the file later; the spans need none of it
        m = store.read_object(run_dir / "manifest.json")
    except ConfigError:
        m = {}
    if m.get("simulated"):
        raise ConfigError(f"{run_dir} is a simulated run (fsbench simulate): it has no rank "
                          "timelines to trace")
    if not run_dir.is_dir() or not any(run_dir.glob("rank-*.jsonl")):
        if (run_dir / "manifest.json").is_file():
            raise ConfigError(f"{run_dir} has no rank timelines (rank-*.jsonl) to trace")
        raise ConfigError(f"{run_dir} is not a run directory (no rank-*.jsonl timelines)")
    spans = read_timelines(run_dir)
    # A rank whose file held no readable span (cut short, damaged) is not in the trace:
    # said, so that a missing lane is not read as an idle rank.
    world = m.get("world_size")
    traced = set(spans["rank"]) if "rank" in spans else set()
    silent = [r for r in range(world) if r not in traced] if isinstance(world, int) else []
    if silent:
        warn(f"{run_dir}: no timeline spans of rank(s) {', '.join(map(str, silent))}; "
             "the trace shows the other ranks only")
    trace = chrome_trace(spans)
    trace["otherData"].update({k: m.get(k) for k in ("run_id", "trainer", "workload", "world_size")
                               if k in m})
    out = Path(out) if out is not None else run_dir / "trace.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    store.write_json_atomic(out, trace)
    return out, len(spans)
