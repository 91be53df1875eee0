"""Metrics: pure functions from timeline DataFrames to tables, as ARCHITECTURE.md defines them.

Input: one row per span (rank, step, warmup, name, kind, start_ns, dur_ns, cpu_ns,
runq_ns[, gpu_ns]), as `fsbench.measurement.timeline.read_timelines` returns, plus per-rank step
stats (rank, step, num_samples, num_targets, loss). Nothing here reads files or clocks.

For step k on N ranks:
  T          = last rank's end of its `step` span - first rank's start of it
               (every rank starts the span right after the step's start barrier)
  busy_r     = thread CPU time of rank r's compute spans in step k (CUDA runs: the union
               of its compute kernels from the profiler, else CUDA-event time, `gpu_ns`)
  idle_r     = T - busy_r;  bubble = sum_r idle_r / (N T)
  idle_r splits into four causes that sum to it exactly (`rank_causes`):
    straggler_r = max_j busy_j - busy_r                 (idle caused by imbalance)
    exposed_r   = communication waits not hidden by compute: comm/wait spans, and time
                  a compute span was blocked (wall - CPU - run-queue wait) while one of
                  the rank's collectives was in flight (`flight` records: a collective
                  waited on inside backward), less the straggler share found there
    input_r     = waiting for the step's input (`input` spans)
    other_r     = the rest: time outside the rank's step span (barrier release skew, end
                  skew), Python between spans, run-queue waits (a busy neighbour), and
                  blocked time with no collective in flight (a sleep, a host sync, a file
                  read, a lock)
  Where inside a compute span its blocked time fell is not recorded, so a span books as
  communication at most the time during which one of its rank's flights was in flight
  (the span's overlap with the union of the rank's flight intervals, whatever step issued
  them); the rest of its blocked time is other idle. Timelines without any flight record
  (written before trainers recorded them) cannot tell the two apart: there every blocked
  second stays communication, as they were booked when written.
  The straggler share is taken out of the waits it shows up in, in this order: a faster
  rank waits for the slowest at its next collective (comm), else at the step's end
  (other), else for input. Each cause's ratio is sum_r cause_r / (N T).
  imbalance  = sum_r (max_j busy_j - busy_r) / (N max_j busy_j)
  skew       = max_j busy_j / median_r busy_r
  cpu_wait   = sum_r run-queue wait in the step span / sum_r step span wall time (the
               compute threads' wait: what stretched their steps)
  cpu_wait_all_threads = the same for every thread of the ranks' processes and of their
               loader workers (gloo's, the monitor's) over the measured window
  helper_cpu = CPU time of those threads but the compute threads, over the same window
  contended  = cpu_wait_all_threads - 2 helper_cpu + cpu steal > CONTENDED_CPU_WAIT;
               None without schedstat (unknown, never "no")

  comm_overlap = share of communication time hidden under compute (Holistic Trace
               Analysis's definition): sum over collectives issued in measured steps of
               their flight time (issue to completion, `flight` records) that overlaps the
               issuing rank's compute, over their total flight time. A compute span counts
               as busy at its CPU/wall rate (blocked time inside it hides nothing). None
               where a trainer's collectives are not recorded as flights. CUDA runs whose
               busy time is the kernel record take it from that record instead: one clock
               (fsbench.measurement.profiled).

Summaries are totals over measured steps: sum of each cause over sum of N T, samples
and tokens over summed T; per-step p10/p50/p90 beside them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from fsbench.measurement.profiled import (comm_overlap_ratio, kernel_rows, overlap_on_one_clock,
                                          profiler_overhead, timed_bubble)
from fsbench.measurement.speed_probe import probe_ns_per_step

CAUSES = ("straggler", "exposed_comm", "input_stall", "other_idle")
# A run is `contended` when its ranks' threads (every thread of each rank process and of
# its loader workers: a neighbour can starve gloo's threads or a loader without touching
# the compute thread) waited for a CPU (Linux run-queue wait) for more than this share of
# the measured window beyond what the run inflicts on itself: a neighbour took cores.
# Without a spare core each CPU second of a helper thread (gloo's two, the monitor, the
# loader) is a second a compute thread waits, and the helper waits about as long again
# for a core at its wake-ups; so twice the helpers' CPU is the run's own.
# Measured on the 2-core VM at 2 ranks, DDP, one loader per rank: quiet runs wait 6-11%
# (synthetic, ~50 ms steps) and 12-17% (`small`) in all, of which the compute threads
# 2-5%, with helpers' CPU of 4-8%: -4% to +3% beyond twice it; beside one busy process
# all threads wait 29-45%, 23-34% beyond it (compute threads 20-34%).
# (Before every thread was measured: the compute threads' wait beyond the loaders' CPU,
# quiet 1.7-3.4%, beside a busy process 28%; runs recorded then are still judged so.)
CONTENDED_CPU_WAIT = 0.10


def rank_step_table(spans: pd.DataFrame, gpu_busy: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (step, rank): the step span's start/end, busy time and the raw waits
    (ns) of the spans inside the step span: comm_wait_ns, input_wait_ns, runq_ns.

    gpu_busy (CUDA runs, optional): per (step, rank) `busy_ns` from the profiler's kernel
    record (fsbench.measurement.kineto) of the profiled steps, with `comm_ns` and
    `comm_overlap_ns`; in those steps it replaces every other busy measure, and its exposed
    communication kernel time is the comm wait. Other steps keep their own measures, and
    so does a profiled step whose record holds no kernel (`kernels` 0): zeros there are
    no measurement, and would read as a step of pure bubble (`kernel_rows`)."""
    if "runq_ns" not in spans:  # timelines written before run-queue waits were recorded
        spans = spans.assign(runq_ns=0)
    if "nested" in spans:  # inside another span, whose time already holds theirs
        spans = spans[~spans["nested"].eq(True)]
    # Timelines written before the input pipeline called input preparation `data`.
    spans = spans.assign(kind=spans["kind"].replace({"data": "input"}))
    steps = spans[spans["kind"] == "step"]
    if "profiled" not in steps:  # frames built without read_timelines
        steps = steps.assign(profiled=False)
    bounds = steps.groupby(["step", "rank"]).agg(
        start_ns=("start_ns", "min"), dur_ns=("dur_ns", "max"), warmup=("warmup", "first"),
        profiled=("profiled", "first"), step_runq_ns=("runq_ns", "sum"))
    bounds["profiled"] = bounds["profiled"].eq(True)
    bounds["end_ns"] = bounds["start_ns"] + bounds["dur_ns"]
    window = bounds[["start_ns", "end_ns"]].rename(columns=lambda c: f"{c}_step")
    inner = spans[spans["kind"] != "step"].join(window, on=["step", "rank"])
    # Only spans inside the timed step count (the start barrier precedes it).
    inner = inner[(inner["start_ns"] >= inner["start_ns_step"])
                  & (inner["start_ns"] + inner["dur_ns"] <= inner["end_ns_step"])]
    runq = inner["runq_ns"].fillna(0)
    compute = inner["kind"] == "compute"
    use_events = "gpu_ns" in inner and inner.loc[compute, "gpu_ns"].notna().any()
    busy_col = "gpu_ns" if use_events else "cpu_ns"
    # Emulated runs: the real CPU a compute span used around its emulated wait is neither
    # busy nor blocked (fsbench.models.emulation).
    overhead = inner["overhead_ns"].fillna(0) if "overhead_ns" in inner else 0
    blocked = (inner["dur_ns"] - inner["cpu_ns"] - runq - overhead).clip(lower=0)
    flights = spans[spans["kind"] == "flight"]
    if len(flights):  # blocked with no collective in flight is not communication
        blocked = np.minimum(blocked, in_flight_ns(inner, flights))
    inner = inner.assign(
        busy=np.where(compute, inner[busy_col].fillna(0), 0),
        comm=np.where(inner["kind"].isin(["comm", "wait"]), inner["dur_ns"],
                      np.where(compute & ~use_events, blocked, 0)),
        input=np.where(inner["kind"] == "input", inner["dur_ns"], 0))
    sums = inner.groupby(["step", "rank"])[["busy", "comm", "input"]].sum()
    out = bounds.join(sums, how="left").fillna({"busy": 0, "comm": 0, "input": 0})
    out = out.rename(columns={"busy": "busy_ns", "comm": "comm_wait_ns", "input": "input_wait_ns",
                              "step_runq_ns": "runq_ns", "dur_ns": "span_ns"})
    out["memcpy_ns"] = 0
    if gpu_busy is not None and len(gpu_busy):
        g = kernel_rows(gpu_busy).set_index(["step", "rank"])
        rows = out.index.intersection(g.index)
        out.loc[rows, "busy_ns"] = g.loc[rows, "busy_ns"]
        out.loc[rows, "comm_wait_ns"] = g.loc[rows, "comm_ns"] - g.loc[rows, "comm_overlap_ns"]
        if "memcpy_ns" in g:  # copies and sets: neither busy nor communication (kineto)
            out.loc[rows, "memcpy_ns"] = g.loc[rows, "memcpy_ns"]
    for col in ("busy_ns", "comm_wait_ns", "input_wait_ns", "runq_ns", "memcpy_ns"):
        out[col] = out[col].astype("int64")
    return out.reset_index()


def in_flight_ns(spans: pd.DataFrame, flights: pd.DataFrame) -> np.ndarray:
    """Per span: ns of it during which at least one flight of its rank was in flight (its
    overlap with the union of the rank's flight intervals)."""
    out = np.zeros(len(spans))
    start = spans["start_ns"].to_numpy(dtype=float)
    end = start + spans["dur_ns"].to_numpy(dtype=float)
    rank = spans["rank"].to_numpy()
    for r, fl in flights.groupby("rank"):
        s = fl["start_ns"].to_numpy(dtype=float)
        mine = rank == r
        covered = _union_before(s, s + fl["dur_ns"].to_numpy(dtype=float))
        out[mine] = covered(end[mine]) - covered(start[mine])
    return out


def _union_before(starts: np.ndarray, ends: np.ndarray):
    """t -> length of the union of the intervals [starts, ends) that lies before t."""
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    first = np.r_[True, s[1:] > e[:-1]]  # starts a new disjoint piece of the union
    lo, hi = s[first], e[np.r_[first[1:], True]]
    before = np.r_[0.0, np.cumsum(hi - lo)]

    def covered(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(lo, t, side="right") - 1
        j = np.maximum(i, 0)
        return np.where(i >= 0, before[j] + np.clip(t - lo[j], 0, hi[j] - lo[j]), 0.0)
    return covered


def rank_step_busy(spans: pd.DataFrame) -> pd.DataFrame:
    """One row per (step, rank): step span start/end and busy time (ns)."""
    return rank_step_table(spans)[["step", "rank", "start_ns", "end_ns", "warmup", "busy_ns"]]


def rank_causes(t: float, busy: np.ndarray, comm: np.ndarray, inp: np.ndarray) -> dict[str, np.ndarray]:
    """Each rank's idle time T - busy_r split into the four causes (module docstring);
    they sum to it exactly, rank by rank."""
    idle = t - busy
    straggler = busy.max() - busy
    room = np.maximum(idle, 0.0)
    # Waits cannot exceed the idle time (they can by clock granularity, or where a GPU's
    # record and a CPU's spans disagree): clip, and let `other` hold the rest.
    input_stall = np.minimum(inp, room)
    comm = np.minimum(comm, room - input_stall)
    other = idle - comm - input_stall
    rest = straggler.copy()
    for part in ("comm", "other", "input"):
        pool = {"comm": comm, "other": other, "input": input_stall}[part]
        take = np.clip(np.minimum(rest, pool), 0.0, None)
        pool -= take
        rest -= take
    other -= rest  # only where T < max busy (granularity): keeps the sum exact
    return {"idle": idle, "straggler": straggler, "exposed_comm": comm,
            "input_stall": input_stall, "other_idle": other}


def step_metrics(spans: pd.DataFrame, gpu_busy: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per step with the definitions above (unmeasured steps included, flagged),
    plus the sums (ns) that summaries total: idle_ns, <cause>_ns, capacity_ns = N T."""
    per_rank = rank_step_table(spans, gpu_busy)
    rows = []
    for step, g in per_rank.groupby("step"):
        t = float(g["end_ns"].max() - g["start_ns"].min())
        busy = g["busy_ns"].to_numpy(dtype=float)
        parts = rank_causes(t, busy, g["comm_wait_ns"].to_numpy(dtype=float),
                            g["input_wait_ns"].to_numpy(dtype=float))
        n, bmax, cap = len(busy), busy.max(), len(busy) * t
        row = {
            "step": int(step), "warmup": bool(g["warmup"].iloc[0]),
            "profiled": bool(g["profiled"].any()), "num_ranks": n,
            "step_time_ms": t / 1e6, "busy_max_ms": bmax / 1e6,
            "busy_mean_ms": float(busy.mean()) / 1e6, "capacity_ns": cap,
            "load_imbalance": float(np.sum(bmax - busy) / (n * bmax)) if bmax > 0 else 0.0,
            # Per-rank skew: the slowest rank against the typical one (1.0 = no skew).
            "busy_skew": float(bmax / np.median(busy)) if np.median(busy) > 0 else 1.0,
            "runq_ns": float(g["runq_ns"].sum()), "span_ns": float(g["span_ns"].sum()),
            "memcpy_ns": float(g["memcpy_ns"].sum()),
        }
        for name, values in parts.items():
            row[f"{name}_ns"] = float(values.sum())
        row["bubble_ratio"] = row["idle_ns"] / cap if cap > 0 else 0.0
        for name in CAUSES:
            key = "straggler_bubble_ratio" if name == "straggler" else f"{name}_ratio"
            row[key] = row[f"{name}_ns"] / cap if cap > 0 else 0.0
        row["cpu_wait_ratio"] = row["runq_ns"] / row["span_ns"] if row["span_ns"] > 0 else 0.0
        rows.append(row)
    table = pd.DataFrame(rows)
    probe_ns = probe_ns_per_step(spans)
    if probe_ns is not None:  # CPU runs: step time in units of the CPU-speed probe
        table["step_time_norm"] = table["step_time_ms"] * 1e6 / table["step"].map(probe_ns)
    return table


def split_profiled(measured: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(steps for busy time and bubbles, steps for step time and throughput) of the
    measured steps. CUDA runs profile a window of them (training.trainer.profiled_window): the
    kernel record there is the busy time, and the profiler's host overhead there would
    slow the step, so time comes from the others (the overhead itself is reported:
    fsbench.measurement.profiled.profiler_overhead). Without a profiled window (CPU), or
    with nothing but one, both are every measured step."""
    profiled = measured["profiled"].astype(bool)
    if profiled.any() and not profiled.all():
        return measured[profiled], measured[~profiled]
    return measured, measured


def throughput(step_table: pd.DataFrame, stats: pd.DataFrame) -> pd.DataFrame:
    """Adds samples_per_s and tokens_per_s per step (global counts over step time)."""
    totals = stats.groupby("step")[["num_samples", "num_targets"]].sum()
    out = step_table.join(totals, on="step")
    secs = out["step_time_ms"] / 1e3
    out["samples_per_s"] = out["num_samples"] / secs
    out["tokens_per_s"] = out["num_targets"] / secs
    return out


RATIO_KEYS = ("bubble_ratio", "straggler_bubble_ratio", "exposed_comm_ratio",
              "input_stall_ratio", "other_idle_ratio")


def summarize(spans: pd.DataFrame, stats: pd.DataFrame,
              gpu_busy: pd.DataFrame | None = None,
              input_cpu: pd.DataFrame | None = None, steal_ticks: int = 0,
              total_ticks: int = 0,
              threads_runq: list[tuple[int | None, int | None, int]] | None = None) -> dict:
    """Totals over measured (non-warm-up) steps, per-step quantiles beside them, and the
    global loss per step.

    input_cpu (optional): per (rank, step) `cpu_ns` its loader worker spent preparing that
    step's input. On a machine without a spare core that CPU time is taken from the
    ranks, so it is run-queue wait the run inflicted on itself, not a neighbour's:
    `contended` counts only the wait beyond it.

    steal_ticks / total_ticks (optional): the machine's CPU steal over the measured steps
    (/proc/stat): the hypervisor running something else on our virtual CPUs stretches
    wall time without any run-queue wait, so it counts towards `contended` too.

    threads_runq (optional): per rank, over the measured window, the run-queue wait (ns)
    of all threads of its process and of its loader workers, the CPU time (ns) of those
    but its compute thread (None, None where the machine has no schedstat), and the
    window's wall time (ns). Without it (runs recorded before the worker measured it) the
    compute threads' wait beyond the loaders' CPU decides `contended`, as it did then;
    where every span's wait is 0 there was no schedstat either (a thread running whole
    steps always waits some nanoseconds). Unknown wait makes `contended` None, never
    False."""
    table = throughput(step_metrics(spans, gpu_busy), stats)
    measured = table[~table["warmup"]]
    if measured.empty:
        raise ValueError("no measured steps: every step is a warm-up step")
    m, timed = split_profiled(measured)
    cap, secs = m["capacity_ns"].sum(), timed["step_time_ms"].sum() / 1e3
    # NaN stays NaN (a diverged rank), where pandas' sum would skip it and read 0.0.
    losses = stats.groupby("step")["loss"].agg(lambda x: x.to_numpy(dtype=float).sum()).sort_index()
    q = lambda col, p, of=m: float(of[col].quantile(p))  # noqa: E731
    out = {
        "steps_measured": int(len(measured)),
        "measured_first_step": int(measured["step"].min()),
        # CUDA: the measured steps that ran under the profiler (bubbles) and the rest
        # (step time, throughput); equal on CPU, where nothing is profiled.
        "steps_profiled": int(measured["profiled"].sum()),
        "steps_timed": int(len(timed)),
        "step_time_ms_mean": float(timed["step_time_ms"].mean()),
        "step_time_ms_median": q("step_time_ms", 0.5, timed),
        "step_time_ms_p10": q("step_time_ms", 0.1, timed),
        "step_time_ms_p90": q("step_time_ms", 0.9, timed),
        # Step time over the CPU-speed probe's time (fsbench.measurement.speed_probe): drift of the
        # machine's speed cancels. None on CUDA runs and runs recorded before the probe.
        "step_time_norm_median": q("step_time_norm", 0.5, timed)
        if "step_time_norm" in timed and timed["step_time_norm"].notna().all() else None,
        "samples_per_s": float(timed["num_samples"].sum() / secs),
        "tokens_per_s": float(timed["num_targets"].sum() / secs),
        "bubble_ratio": float(m["idle_ns"].sum() / cap),
        "straggler_bubble_ratio": float(m["straggler_ns"].sum() / cap),
        "exposed_comm_ratio": float(m["exposed_comm_ns"].sum() / cap),
        "input_stall_ratio": float(m["input_stall_ns"].sum() / cap),
        "other_idle_ratio": float(m["other_idle_ns"].sum() / cap),
        # Busy-time ratios: total imbalance over the measured steps' max-busy capacity.
        "load_imbalance": float((m["load_imbalance"] * m["num_ranks"] * m["busy_max_ms"]).sum()
                                / (m["num_ranks"] * m["busy_max_ms"]).sum())
        if (m["busy_max_ms"] > 0).any() else 0.0,
        "busy_max_ms_median": q("busy_max_ms", 0.5),
        "busy_skew": q("busy_skew", 0.5),
        "cpu_wait_ratio": float(m["runq_ns"].sum() / m["span_ns"].sum()) if m["span_ns"].sum() > 0 else 0.0,
        "loss_first": float(losses.iloc[0]),
        "loss_last": float(losses.iloc[-1]),
        "losses": [float(x) for x in losses],
    }
    own = 0.0
    if input_cpu is not None and len(input_cpu) and m["span_ns"].sum() > 0:
        worker_cpu = input_cpu[input_cpu["step"].isin(m["step"])]
        own = float(worker_cpu["cpu_ns"].sum() / m["span_ns"].sum())
    out["input_worker_cpu_ratio"] = own
    cuda = gpu_busy is not None or ("gpu_ns" in spans and bool(spans["gpu_ns"].notna().any()))
    out.update(overlap_on_one_clock(spans, gpu_busy, m, cuda))
    out.update(profiler_overhead(m, timed))
    # CUDA: the bubble on the timed steps' clock beside the profiled one, and the share of
    # the profiled steps the GPU spent in memory copies (neither busy nor communication:
    # a copy that runs on SMs reads as other idle): fsbench.measurement.profiled.
    out["bubble_ratio_timed"] = timed_bubble(m, timed)
    out["memcpy_ratio"] = float(m["memcpy_ns"].sum() / cap) if gpu_busy is not None and cap > 0 else None
    out["cpu_steal_ratio"] = steal_ticks / total_ticks if total_ticks > 0 else 0.0
    out.update(contention(m, spans, threads_runq, own, out["cpu_steal_ratio"]))
    for key in RATIO_KEYS:
        out[f"{key}_p10"], out[f"{key}_p50"], out[f"{key}_p90"] = (q(key, p) for p in (0.1, 0.5, 0.9))
    return out


def contention(measured: pd.DataFrame, spans: pd.DataFrame,
               threads_runq: list[tuple[int | None, int | None, int]] | None,
               own: float, steal: float) -> dict:
    """cpu_wait_all_threads_ratio, helper_cpu_ratio and `contended` (summarize's
    threads_runq); None where schedstat was missing."""
    unknown = {"cpu_wait_all_threads_ratio": None, "helper_cpu_ratio": None, "contended": None}
    if threads_runq:
        window = sum(ns for _, _, ns in threads_runq)
        if window <= 0 or any(wait is None for wait, _, _ in threads_runq):
            return unknown
        wait = sum(w for w, _, _ in threads_runq) / window
        helpers = sum(c for _, c, _ in threads_runq) / window
        return {"cpu_wait_all_threads_ratio": wait, "helper_cpu_ratio": helpers,
                "contended": bool(wait - 2 * helpers + steal > CONTENDED_CPU_WAIT)}
    # Runs recorded before the worker measured every thread: their compute threads' wait.
    runq = spans["runq_ns"] if "runq_ns" in spans else pd.Series(dtype=float)
    span_ns = measured["span_ns"].sum()
    if not runq.fillna(0).gt(0).any() or span_ns <= 0:
        return unknown
    wait = float(measured["runq_ns"].sum() / span_ns)
    return {**unknown, "contended": bool(wait - own + steal > CONTENDED_CPU_WAIT)}
