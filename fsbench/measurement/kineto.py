"""GPU busy time from the GPU's own record: the profiler's (Kineto) kernel intervals.

On CUDA a rank's busy time is the union of its compute-kernel intervals during the step.
CUDA events recorded around compute spans are not busy time: the interval between two
events on the compute stream includes the stream's waits on communication (DDP's
all-reduce at the end of backward, an embedding all-to-all) and the gaps where the CPU
had not launched the next kernel yet, so they under-report exactly the bubbles fsbench
exists to find. The profiler records when each kernel really ran.

- Union, not sum: kernels on several streams overlap in time.
- Communication kernels (NCCL's, and the symmetric-memory kernels and peer-to-peer copies
  of FreeScale's sm_free transport: `_communication`) are not compute. Nor is anything
  launched inside a `fsbench.comm.<name>` annotation (`comm_launch`), nor anything else
  on a stream that carries only such launches (`comm_activity`): the sm_free transport's
  pulls are `copy_` from a symmetric buffer mapped on the local device, which CUPTI
  calls device-to-device copies, not peer-to-peer, so their name cannot say what they
  are; the stream they run on can. Their union
  and its overlap with the compute union give the exposed communication (not overlapped
  by compute) and the share hidden under compute, as Holistic Trace Analysis defines
  communication/computation overlap.
- Memory copies and sets (`gpu_memcpy`, `gpu_memset`) are neither: kept apart.
- A profiled step with no kernel at all in its window (`kernels` 0) has no kernel
  record to read: the metrics keep its CUDA-event busy time (fsbench.measurement.metrics),
  rather than reading it as one long bubble.
- Steps: the worker wraps each measured step in `record_function("fsbench.step.<k>")`,
  a CPU-side `user_annotation` in the trace, and synchronizes the device at the end of
  every step inside that annotation (`launch.worker.end_of_step_sync`), so step k's
  kernels run inside that window; they are clipped to it anyway.
- Clock hazard: Kineto's `ts` (microseconds) is the profiler's own clock. It is never
  compared with fsbench's CLOCK_MONOTONIC timelines; only per-step durations leave here.

Why not Holistic Trace Analysis itself: `holistictraceanalysis` 0.5 computes the same
from the same traces, but installs 86 packages (jupyterlab among them) into what is a
core measurement; the union/overlap arithmetic here is ~40 lines and follows its
definitions. Standard library, numpy and pandas only: the tests run it on CPU against
trace fixtures.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

GPU_TRACE_GLOB = "kineto-rank-*.json*"
_STEP = re.compile(r"^fsbench\.step\.(\d+)$")
_RANK = re.compile(r"kineto-rank-(\d+)\.json(\.gz)?$")
KINDS = {"kernel": "compute", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
# Kernels that are communication (`_communication`): NCCL's (ncclDevKernel_*, ncclKernel_*)
# and torch's symmetric memory (c10d::symmetric_memory::barrier_kernel and friends).
COMM_KERNEL = re.compile(r"nccl|symmetric_memory", re.IGNORECASE)
PEER_COPY = re.compile(r"\bPtoP\b", re.IGNORECASE)  # CUPTI's peer-to-peer memcpy kind
# A user annotation around the launch of communication that no kernel name gives away.
from fsbench.measurement.comm_annotation import COMM_ANNOTATION, comm_launch  # noqa: F401 (re-exported)
# The CPU-side records of a launch: their `correlation` names the GPU activity launched.
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")


def _communication(kind: str, name: str) -> str:
    """`comm` for GPU activity that is communication whatever it runs on: NCCL kernels, the
    symmetric-memory kernels of the sm_free transport (its barriers spin on SMs while they
    wait for peers: counted as compute they would read as busy), and peer-to-peer copies
    (the transport's pulls on copy engines); otherwise `kind` unchanged."""
    if kind == "compute" and COMM_KERNEL.search(name):
        return "comm"
    if kind == "memcpy" and PEER_COPY.search(name):
        return "comm"
    return kind


def load_trace(path: str | Path) -> list[dict]:
    """The trace's events (`.json` or `.json.gz`)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return trace.get("traceEvents", []) if isinstance(trace, dict) else trace


def comm_launches(events: list[dict]) -> set:
    """Correlation ids of the GPU activity launched inside a `fsbench.comm.*` annotation:
    the launch calls (CUDA runtime or driver) on the annotation's thread, in its interval."""
    windows: dict[tuple, list[tuple[float, float]]] = {}
    for e in events:
        if (e.get("ph") == "X" and e.get("cat") == "user_annotation"
                and e.get("name", "").startswith(COMM_ANNOTATION)):
            ts = float(e["ts"])
            windows.setdefault((e.get("pid"), e.get("tid")), []).append((ts, ts + float(e.get("dur", 0.0))))
    ids = set()
    for e in events:
        if e.get("cat") not in LAUNCH_CATEGORIES or (e.get("pid"), e.get("tid")) not in windows:
            continue
        ts = float(e["ts"])
        corr = (e.get("args") or {}).get("correlation")
        if corr is not None and any(lo <= ts <= hi for lo, hi in windows[(e.get("pid"), e.get("tid"))]):
            ids.add(corr)
    return ids


def comm_activity(rows: pd.DataFrame, launched: set) -> pd.Series:
    """Per row of GPU activity: communication by its launch (inside a comm annotation) or
    by its stream (a stream whose every launch with a known correlation was inside one)."""
    by_launch = rows["correlation"].isin(launched)
    known = rows["correlation"].notna()
    per_stream = pd.DataFrame({"key": list(zip(rows["device"], rows["stream"])),
                               "comm": by_launch, "other": known & ~by_launch})
    streams = per_stream.groupby("key")[["comm", "other"]].any()
    dedicated = set(streams.index[streams["comm"] & ~streams["other"]])
    return by_launch | per_stream["key"].isin(dedicated)


def kernel_intervals(events: list[dict], device: int | None = None) -> pd.DataFrame:
    """GPU activity as rows: start_us, end_us, name, stream, device, kind (compute, comm,
    memcpy, memset). `device` keeps one GPU's rows (None: all)."""
    rows = []
    for e in events:
        kind = KINDS.get(e.get("cat", ""))
        if kind is None or e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        if device is not None and args.get("device") not in (None, device):
            continue
        kind = _communication(kind, e.get("name", ""))
        ts = float(e["ts"])
        rows.append({"start_us": ts, "end_us": ts + float(e.get("dur", 0.0)),
                     "name": e.get("name", ""), "stream": args.get("stream"),
                     "device": args.get("device"), "kind": kind,
                     "correlation": args.get("correlation")})
    out = pd.DataFrame(rows, columns=["start_us", "end_us", "name", "stream", "device", "kind",
                                      "correlation"])
    if len(out):
        out.loc[comm_activity(out, comm_launches(events)).to_numpy(), "kind"] = "comm"
    return out.drop(columns="correlation")


def merge(intervals: np.ndarray) -> np.ndarray:
    """Disjoint, sorted intervals covering the same time as `intervals` ([n, 2])."""
    if len(intervals) == 0:
        return np.empty((0, 2))
    iv = intervals[np.argsort(intervals[:, 0])]
    out = [list(iv[0])]
    for start, end in iv[1:]:
        if start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return np.array(out)


def union_length(intervals: np.ndarray) -> float:
    """Length of the union of intervals ([n, 2])."""
    m = merge(intervals)
    return float((m[:, 1] - m[:, 0]).sum()) if len(m) else 0.0


def overlap_length(a: np.ndarray, b: np.ndarray) -> float:
    """Length of (union of a) intersected with (union of b)."""
    a, b = merge(a), merge(b)
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i, 0], b[j, 0]), min(a[i, 1], b[j, 1])
        total += max(0.0, hi - lo)
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return total


def step_windows(events: list[dict]) -> pd.DataFrame:
    """step, window_start_us, window_end_us from the `fsbench.step.<k>` annotations."""
    rows = [{"step": int(m.group(1)), "window_start_us": float(e["ts"]),
             "window_end_us": float(e["ts"]) + float(e.get("dur", 0.0))}
            for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
            and (m := _STEP.match(e.get("name", "")))]
    if not rows:
        raise ValueError("the trace has no fsbench.step.<k> annotations: was it written by "
                         "the fsbench worker?")
    return pd.DataFrame(rows).drop_duplicates("step").sort_values("step").reset_index(drop=True)


def _clipped(k: pd.DataFrame, lo: float, hi: float) -> np.ndarray:
    iv = np.column_stack([k["start_us"].clip(lo, hi), k["end_us"].clip(lo, hi)]) if len(k) else np.empty((0, 2))
    return iv[iv[:, 1] > iv[:, 0]] if len(iv) else iv


def gpu_step_busy(events: list[dict], device: int | None = None) -> pd.DataFrame:
    """One row per annotated step: busy_ns (union of compute kernels), comm_ns (union of
    communication kernels), comm_overlap_ns (their intersection), memcpy_ns (copies and
    sets), all clipped to the step's window, and `kernels`: how many compute and
    communication kernels fell in it (0: the record has nothing to say about the step,
    and its zeros are no measurement: fsbench.measurement.metrics falls back)."""
    kernels = kernel_intervals(events, device)
    rows = []
    for w in step_windows(events).itertuples():
        lo, hi = w.window_start_us, w.window_end_us
        part = {kind: _clipped(kernels[kernels["kind"].isin(kinds)], lo, hi)
                for kind, kinds in (("compute", ["compute"]), ("comm", ["comm"]),
                                    ("memcpy", ["memcpy", "memset"]))}
        us_to_ns = 1e3
        rows.append({"step": w.step, "window_start_us": lo, "window_end_us": hi,
                     "busy_ns": int(round(union_length(part["compute"]) * us_to_ns)),
                     "comm_ns": int(round(union_length(part["comm"]) * us_to_ns)),
                     "comm_overlap_ns": int(round(overlap_length(part["comm"], part["compute"]) * us_to_ns)),
                     "memcpy_ns": int(round(union_length(part["memcpy"]) * us_to_ns)),
                     "kernels": len(part["compute"]) + len(part["comm"])})
    return pd.DataFrame(rows)


def read_run_gpu_busy(run_dir: str | Path) -> pd.DataFrame | None:
    """gpu_step_busy of every rank's trace in a run directory (a `rank` column added);
    None when the run wrote no trace (CPU runs)."""
    frames = []
    for path in sorted(Path(run_dir).glob(GPU_TRACE_GLOB)):
        m = _RANK.search(path.name)
        if m:
            frames.append(gpu_step_busy(load_trace(path)).assign(rank=int(m.group(1))))
    return pd.concat(frames, ignore_index=True) if frames else None
