"""What a CUDA run's profiled window says beside the bubble: whether its kernel record
covers the profiled steps (`busy_source`), communication hidden under compute on the
profiler's own clock, and the profiler's cost to the steps it ran in.

One clock per figure. A `flight` (fsbench.measurement.timeline) is GPU execution time
between two CUDA events, while a compute span on CUDA is a host launch window that runs
ahead of its kernels: comparing the two says nothing. Where the busy time comes from the
kernel record (`busy_source` kineto), the hidden share of communication comes from the
same record (`comm_ns`, `comm_overlap_ns` per step: fsbench.measurement.kineto), as does
the exposed communication (fsbench.measurement.metrics.rank_step_table).

The profiler slows the host; a step under it takes longer than one without it, and the
difference lands in the bubble's other idle. The timed steps (after the profiled window)
run without it: `profiler_overhead_ratio` is the share of a profiled step's time the
profiler added, so at most that much of `bubble_ratio` is the profiler's.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def kernel_rows(gpu_busy: pd.DataFrame) -> pd.DataFrame:
    """The rows of a kernel record that measured something: at least one kernel in the
    step's window (records written before `kernels` was counted: any kernel time)."""
    if "kernels" in gpu_busy:
        return gpu_busy[gpu_busy["kernels"] > 0]
    return gpu_busy[(gpu_busy["busy_ns"] + gpu_busy["comm_ns"]) > 0]


def busy_source(gpu_busy: pd.DataFrame | None, profiled_steps: set[int], events: bool) -> dict:
    """`busy_source` (kineto, cuda_events, kineto+cuda_events or thread_cpu_time) and
    `busy_source_note`: which profiled steps had no kernel in the record and so kept
    their CUDA-event busy time (None when nothing fell back)."""
    fallback = "cuda_events" if events else "thread_cpu_time"
    if gpu_busy is None:
        # A CUDA run with no kernel record at all (too short to profile, or the profiler
        # wrote nothing): say so, since its bubble is then CUDA-event time.
        note = ("no profiled window with kernels: busy time is CUDA-event time, and no "
                "communication overlap is measured") if events else None
        return {"busy_source": fallback, "busy_source_note": note}
    rows = gpu_busy[gpu_busy["step"].isin(profiled_steps)] if profiled_steps else gpu_busy
    kept = kernel_rows(rows)
    empty = sorted(set(rows["step"].astype(int)) - set(kept["step"].astype(int)))
    if not empty:
        return {"busy_source": "kineto", "busy_source_note": None}
    note = (f"profiled step(s) {', '.join(map(str, empty))} had no kernel in the profiler's "
            f"record: their busy time is {fallback.replace('_', ' ')}")
    return {"busy_source": "kineto+" + fallback if len(kept) else fallback, "busy_source_note": note}


def kernel_comm_overlap(gpu_busy: pd.DataFrame, steps: set[int]) -> float | None:
    """Share of communication-kernel time hidden under compute kernels over `steps` (the
    measured profiled ones); None where they hold no communication kernel (one GPU)."""
    rows = kernel_rows(gpu_busy[gpu_busy["step"].isin(steps)])
    comm = float(rows["comm_ns"].sum())
    return float(rows["comm_overlap_ns"].sum()) / comm if comm > 0 else None


def profiler_overhead(profiled: pd.DataFrame, timed: pd.DataFrame) -> dict:
    """profiler_overhead_ms: median step time under the profiler less the timed steps'
    median; profiler_overhead_ratio: that over the profiled median (module docstring).
    None without a profiled window apart from the timed steps."""
    if profiled is timed or not len(profiled) or not len(timed):
        return {"profiler_overhead_ms": None, "profiler_overhead_ratio": None}
    under, without = float(profiled["step_time_ms"].median()), float(timed["step_time_ms"].median())
    return {"profiler_overhead_ms": under - without,
            "profiler_overhead_ratio": (under - without) / under if under > 0 else None}


def overlap_on_one_clock(spans: pd.DataFrame, gpu_busy: pd.DataFrame | None,
                         measured: pd.DataFrame, cuda: bool = False) -> dict:
    """comm_overlap_ratio, its `comm_overlap_source` and `comm_overlap_note`: the kernel
    record's where it has kernels in the profiled steps, flights against compute spans on
    CPU runs. A CUDA run without kernels in its profiled window gets no figure and a note
    saying so: never flights against host spans, which are two clocks there."""
    steps = set(measured.loc[measured["profiled"], "step"].astype(int))
    if gpu_busy is not None and steps and len(kernel_rows(gpu_busy[gpu_busy["step"].isin(steps)])):
        return {"comm_overlap_ratio": kernel_comm_overlap(gpu_busy, steps), "comm_overlap_source": "kineto",
                "comm_overlap_note": None}
    if cuda:
        why = "no profiled window" if not steps or gpu_busy is None else "no kernel in the profiled window"
        return {"comm_overlap_ratio": None, "comm_overlap_source": None,
                "comm_overlap_note": f"CUDA run with {why}: not measured (flights and host spans "
                                     "are two clocks)"}
    ratio = comm_overlap_ratio(spans)
    return {"comm_overlap_ratio": ratio, "comm_overlap_source": None if ratio is None else "flights",
            "comm_overlap_note": None}


def timed_bubble(profiled: pd.DataFrame, timed: pd.DataFrame) -> float | None:
    """The bubble on the timed steps' clock: 1 - median(profiled busy) / median(timed step
    time), busy being the ranks' mean. The profiled `bubble_ratio` divides by steps that
    ran under the profiler, whose host overhead stretches them; this one divides by steps
    without it (busy time is the kernels', which the profiler barely slows). None without
    a profiled window apart from the timed steps (CPU runs)."""
    if profiled is timed or not len(profiled) or not len(timed):
        return None
    step_ms = float(timed["step_time_ms"].median())
    return 1.0 - float(profiled["busy_mean_ms"].median()) / step_ms if step_ms > 0 else None


def comm_overlap_ratio(spans: pd.DataFrame) -> float | None:
    """Hidden share of communication (module docstring); None without flights.

    A compute span on a CPU rank can hold blocked time (DDP waits for its last all-reduce
    inside `backward`); that is not compute hiding anything. Without knowing where in the
    span the thread ran, each compute span counts as busy at its average rate, CPU time
    over wall time, so a flight under a half-blocked span is half hidden."""
    flights = spans[(spans["kind"] == "flight") & ~spans["warmup"].astype(bool)]
    if flights.empty:
        return None
    hidden = total = 0.0
    for rank, fl in flights.groupby("rank"):
        comp = spans[(spans["rank"] == rank) & (spans["kind"] == "compute")
                     & ~spans.get("nested", pd.Series(False, index=spans.index)).eq(True)]
        comp = comp.sort_values("start_ns")
        starts = comp["start_ns"].to_numpy(dtype=np.int64)
        durs = comp["dur_ns"].to_numpy(dtype=np.int64)
        rate = np.clip(comp["cpu_ns"].to_numpy(dtype=float) / np.maximum(durs, 1), 0.0, 1.0)
        before = np.concatenate([[0.0], np.cumsum(durs * rate)])  # busy time before span i

        def busy_until(t: np.ndarray) -> np.ndarray:
            """Compute busy time before t (one rank's compute spans never overlap)."""
            i = np.searchsorted(starts, t, side="right") - 1
            j = np.maximum(i, 0)
            inside = np.clip(t - starts[j], 0, durs[j]) * rate[j]
            return np.where(i >= 0, before[j] + inside, 0.0)

        s = fl["start_ns"].to_numpy(dtype=np.int64)
        e = s + fl["dur_ns"].to_numpy(dtype=np.int64)
        if len(starts):
            hidden += float((busy_until(e) - busy_until(s)).sum())
        total += float((e - s).sum())
    return hidden / total if total > 0 else None
