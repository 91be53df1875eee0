"""Per-rank timelines: `with span("forward"):` appends one JSON line per span.

A record is {rank, step, warmup, name, kind, start_ns, dur_ns, cpu_ns, runq_ns}:
- `start_ns`/`dur_ns` come from CLOCK_MONOTONIC (`time.monotonic_ns`), which is shared
  by all processes of one host, so spans of different ranks on one machine line up.
  (Ranks on different hosts are compared by durations only.)
- `cpu_ns` is the *calling thread's* CPU time during the span (`time.thread_time_ns`).
  With one intra-op thread per rank this is the rank's compute time even when ranks
  share cores, and it excludes time blocked in a collective (a blocked thread burns
  no CPU; gloo's own worker threads are not counted).
- `runq_ns` is the time the calling thread waited for a CPU during the span (runnable,
  not running: Linux `/proc/thread-self/schedstat`, second field): a neighbour process
  or oversubscription taking the core. 0 where schedstat does not exist (the worker
  records that apart, with every thread's wait: `threads_schedstat`).
- `warmup` is true for steps that are not measured: warm-up steps, and steps outside
  whole look-ahead windows (fsbench.training.trainer.measured_steps).
- `profiled` (CUDA runs, only where true): the step ran under the profiler (its kernel
  record gives busy time, so the bubble; its step time carries the profiler's host
  overhead, so step time and throughput come from the other measured steps:
  fsbench.measurement.metrics.summarize).
- `gpu_ns` (CUDA runs, compute spans only): the compute stream's time between two CUDA
  events recorded at the span's ends, read at the end of the step.
- `kind` classifies the span for the metrics: compute | comm | wait | input | step
  (fsbench.training.trainer.Trainer says which spans belong where).
- kind `flight` is not a span of the calling thread but one collective's time in flight,
  from its issue to its completion (`Timeline.in_flight`): what `comm_overlap_ratio`
  measures against compute spans. Its `step` is the step that issued it; it may end in a
  later step. On CPU (gloo) completion is stamped by gloo's own thread when the work's
  future completes. On CUDA that future "completes" when NCCL's work is enqueued, so a
  flight is two CUDA events instead: one recorded on the issuing stream at issue, one
  recorded in the future's callback, on the stream torch makes wait for the collective;
  `flush` reads them after the step's sync and places them on the host clock through an
  anchor event recorded on the idle device (`gpu_flight`).

Spans never synchronize a device. Lines are buffered in memory and written at the end
of every step, so a crash loses at most the step in flight.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Iterator

from fsbench.measurement.clock import emulated_ns, now_ns
from fsbench.measurement.schedstat import runqueue_wait_ns
from fsbench.errors import ConfigError

# `probe`: the CPU-speed probe before a step's barrier (fsbench.measurement.speed_probe), outside every
# step window, so in no partition.
SPAN_KINDS = ("compute", "comm", "wait", "input", "step", "flight", "probe")

# Default kind of the span names trainers use; anything else must pass kind= explicitly.
DEFAULT_KINDS = {
    "forward": "compute",
    "backward": "compute",
    "optimizer": "compute",
    "embedding": "compute",
    "compute": "compute",
    "comm": "comm",
    "allreduce": "comm",
    "all_to_all": "comm",
    "wait": "wait",
    "barrier": "wait",
    "input": "input",
    "step": "step",
}


class Timeline:
    """Collects one rank's spans and appends them to `path` as JSON lines."""

    def __init__(self, path: str | os.PathLike | None, rank: int = 0, enabled: bool = True,
                 device: object = None, emulated: bool = False) -> None:
        self.path = Path(path) if path is not None else None
        self.rank = rank
        # enabled=False makes span() free: the baseline of the instrumentation-overhead
        # benchmark (fsbench.running.overhead).
        self.enabled = enabled
        # On CUDA, compute spans also record a pair of CUDA events on the current stream:
        # `gpu_ns` is then the compute stream's time for the span, the GPU busy measure.
        self.cuda = device is not None and getattr(device, "type", device) == "cuda"
        self.step = -1
        self.warmup = False
        self.profiled = False
        # compute=emulated (fsbench.models.emulation): a span's busy time is the emulated compute
        # inside it; its real thread CPU is recorded apart, as `overhead_ns`.
        self.emulated = emulated
        self._pending: list[tuple[dict, object, object]] = []  # (record, start, end event)
        self._flights: list[tuple[dict, object, object]] = []  # CUDA flights: the same
        self._buffer: list[dict] = []
        # Flights finish on the communication library's threads: appends and the flush's
        # swap of the buffer take this lock.
        self._lock = threading.Lock()
        # Open spans other than `step`: a span opened inside one (a collective issued from
        # an autograd hook inside `backward`) is recorded `nested` and left out of the
        # step's partition (its time is already in the enclosing span), kept for traces.
        self._open = 0
        self._names: list[str] = []  # the names of the open spans (open_spans)
        self._watched: list[tuple["Flight", object]] = []  # host flights and their Work (Flight.watch)

    def open_spans(self) -> list[str]:
        """The names of the spans open now (any order)."""
        return list(self._names)

    def begin_step(self, step: int, warmup: bool, profiled: bool = False) -> None:
        self.step, self.warmup, self.profiled = step, warmup, profiled

    @contextlib.contextmanager
    def span(self, name: str, kind: str | None = None) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        kind = kind or DEFAULT_KINDS.get(name)
        if kind not in SPAN_KINDS:
            raise ValueError(f"span {name!r}: kind must be one of {SPAN_KINDS}, got {kind!r}")
        events = self._cuda_events() if self.cuda and kind == "compute" else None
        nested = self._open > 0
        self._open += kind != "step"
        e0 = emulated_ns() if self.emulated else 0
        # The wall interval encloses the CPU-time one (read first, read last), so a span's
        # cpu_ns never exceeds its dur_ns by the cost of the clock reads themselves.
        self._poll_flights()
        q0, t0, cpu0 = runqueue_wait_ns(), now_ns(), time.thread_time_ns()
        self._names.append(name)
        try:
            yield
        finally:
            cpu1, t1, q1 = time.thread_time_ns(), now_ns(), runqueue_wait_ns()
            self._poll_flights()
            # Kept as a multiset (only which names are open matters): spans opened from
            # autograd's threads (CUDA) may close in another order than this thread's.
            self._names.remove(name)
            self._open -= kind != "step"
            rec = {
                "rank": self.rank, "step": self.step, "warmup": self.warmup,
                "name": name, "kind": kind,
                "start_ns": t0, "dur_ns": t1 - t0, "cpu_ns": cpu1 - cpu0, "runq_ns": q1 - q0,
            }
            if self.emulated:
                rec["overhead_ns"], rec["cpu_ns"] = rec["cpu_ns"], emulated_ns() - e0
            if nested:
                rec["nested"] = True
            if self.profiled:
                rec["profiled"] = True
            if events:
                events[1].record()
                self._pending.append((rec, *events))
            self._append(rec)

    def _append(self, rec: dict) -> None:
        with self._lock:
            self._buffer.append(rec)

    def _poll_flights(self) -> None:
        """Stamp the watched flights whose Work has completed (Flight.watch): at every span's
        start and end, so a flight's end is late by at most the time between two spans,
        not by the GIL's switch interval its callback may wait."""
        if not self._watched:
            return
        with self._lock:
            watched, self._watched = self._watched, []
        left = []
        for flight, work in watched:
            if flight.rec["dur_ns"]:
                continue  # stamped already (its callback, or its wait)
            if work.is_completed():
                flight.finish()
            else:
                left.append((flight, work))
        with self._lock:
            self._watched = left + self._watched

    def in_flight(self, name: str) -> "Flight":
        """Start timing one collective's flight; call `.finish()` when it completes (from
        any thread, e.g. a future's callback)."""
        return Flight(self, name)

    @staticmethod
    def _cuda_events():
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()  # enqueued on the current stream; no synchronization
        return start, end

    def flush(self) -> None:
        if self._pending:
            # note: a CPU-GPU sync point, at the end of a step (after the trainer's own
            # loss.item() sync, so it waits for nothing the step had not finished).
            self._pending[-1][2].synchronize()
            for rec, start, end in self._pending:
                rec["gpu_ns"] = int(start.elapsed_time(end) * 1e6)
            self._pending.clear()
        if self._flights:
            self._flush_cuda_flights()
        with self._lock:
            buffer, self._buffer = self._buffer, []
        if self.path is not None and buffer:
            # No fsync: once write() returns the lines are in the kernel and survive a
            # SIGKILL of this process (only a machine crash could lose them), and an fsync
            # per step would cost milliseconds of step time on slow disks.
            with open(self.path, "a") as f:
                f.write("\n".join(json.dumps(r) for r in buffer) + "\n")

    def _flush_cuda_flights(self) -> None:
        """Finished flights placed on the host clock: their end events were recorded
        before the worker's end-of-step sync, so they have completed; an anchor event
        recorded now, on the idle device, runs at once and marks the instant `now_ns()`
        reads right after it completes. NOT YET RUN ON A GPU."""
        import torch

        anchor = torch.cuda.Event(enable_timing=True)
        anchor.record()
        anchor.synchronize()
        anchor_ns = now_ns()
        with self._lock:
            ready, self._flights = self._flights, []
        for rec, start, end in ready:
            rec.update(gpu_flight(anchor_ns, start.elapsed_time(anchor), start.elapsed_time(end)))
            self._append(rec)


def gpu_flight(anchor_ns: int, start_to_anchor_ms: float, start_to_end_ms: float) -> dict:
    """A CUDA flight's host-clock start and its duration (ns) from its events' times
    (`Event.elapsed_time`, ms) and an anchor event that completed at host time anchor_ns."""
    dur = max(int(round(start_to_end_ms * 1e6)), 1)
    return {"start_ns": anchor_ns - int(round(start_to_anchor_ms * 1e6)), "dur_ns": dur}


class Flight:
    """One collective in flight (see `Timeline.in_flight`); a no-op when disabled. Call
    `finish()` where the collective is complete as the caller's stream sees it: in its
    future's callback (or after a synchronous call returns). It may be called from more
    than one place: the first call records it. A callback runs on the communication
    library's thread and needs the GIL, which it can wait for a switch interval (5 ms)
    while the rank's thread runs Python, past the rank's own wait for it: host flights
    are also stamped by the rank's thread when it first sees them done (`watch`)."""

    __slots__ = ("timeline", "rec", "events")

    def __init__(self, timeline: Timeline, name: str) -> None:
        self.timeline = timeline
        self.rec = None if not timeline.enabled else {
            "rank": timeline.rank, "step": timeline.step, "warmup": timeline.warmup,
            "name": name, "kind": "flight", "start_ns": now_ns(), "dur_ns": 0,
            "cpu_ns": 0, "runq_ns": 0}
        # CUDA: the issue instant on the issuing stream (the collective cannot start
        # before the work queued ahead of it there). NOT YET RUN ON A GPU.
        self.events = timeline._cuda_events() if self.rec is not None and timeline.cuda else None

    def finish(self) -> None:
        if self.rec is None or self.rec["dur_ns"]:
            return
        if self.events is not None:
            # In a CUDA future's callback torch makes the current stream wait for the
            # collective: an event recorded on it completes when the collective does.
            self._end_on(None)
            return
        end = now_ns()
        with self.timeline._lock:  # two threads may finish it: the first one records
            if self.rec["dur_ns"]:
                return
            self.rec["dur_ns"] = max(end - self.rec["start_ns"], 1)
            self.timeline._buffer.append(self.rec)

    def watch(self, work) -> None:
        """Host flights: the rank's thread also checks `work.is_completed()` at every span
        boundary (Timeline._poll_flights: a wait's span ends right after its wait returns)
        and stamps the flight when it first sees it done, where the callback still waits
        for the GIL. On CUDA a completed Work says nothing of the device: only the
        callback's event marks the end."""
        if self.rec is not None and self.events is None:
            with self.timeline._lock:
                self.timeline._watched.append((self, work))

    def finish_on(self, stream) -> None:
        """CUDA: the collective is the work queued on `stream` so far (a transport that
        moves bytes on its own stream, as sm_free's copies do): the flight ends when that
        work does, at an event recorded there now, however late the caller waits for it.
        Elsewhere the same as `finish()`. NOT YET RUN ON A GPU."""
        if self.rec is None or self.rec["dur_ns"]:
            return
        if self.events is None:
            self.finish()
            return
        self._end_on(stream)

    def _end_on(self, stream) -> None:
        start, end = self.events
        with self.timeline._lock:
            if self.rec["dur_ns"]:
                return
            self.rec["dur_ns"] = -1  # finished; the duration is read at flush
            end.record(stream)  # None: the current stream
            self.timeline._flights.append((self.rec, start, end))


# Trainers call `span(...)` without carrying a Timeline around; the worker installs the
# rank's timeline here once. A process is one rank, so one current timeline suffices.
_current: Timeline = Timeline(None)


def set_current(timeline: Timeline) -> None:
    global _current
    _current = timeline


def current() -> Timeline:
    return _current


def span(name: str, kind: str | None = None):
    """`with span("forward"):` on the current rank's timeline."""
    return _current.span(name, kind)


# The fields every record of a rank's JSONL files has, with their types.
SPAN_FIELDS = {"rank": int, "step": int, "name": str, "kind": str, "start_ns": int, "dur_ns": int}


def read_records(path: str | os.PathLike, fields: dict[str, type]) -> list[dict]:
    """The records a rank appended to one JSONL file.

    A torn last line (a rank killed mid-write) is dropped. Anything else that is not a
    JSON object with `fields` of their types (bytes that are not text, a line that is not
    JSON, a record without its fields) raises ConfigError naming the file and line: a
    damaged file is refused in one line, never half read into wrong figures.
    """
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    records = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):
                break
            raise ConfigError(f"{path}: line {i} is not JSON (the file is damaged)") from None
        if not isinstance(rec, dict) or not all(
                isinstance(rec.get(k), t) and not isinstance(rec.get(k), bool) for k, t in fields.items()):
            raise ConfigError(f"{path}: line {i} is not a record with {', '.join(fields)} "
                              "(the file is damaged)")
        records.append(rec)
    return records


def read_timelines(run_dir: str | os.PathLike) -> "pd.DataFrame":  # noqa: F821
    """All `rank-*.jsonl` files of a run as one DataFrame (one row per span). ConfigError,
    naming the file, when one is damaged (`read_records`)."""
    import pandas as pd

    rows = []
    for p in sorted(Path(run_dir).glob("rank-*.jsonl")):
        rows += read_records(p, SPAN_FIELDS)
    cols = ["rank", "step", "warmup", "name", "kind", "start_ns", "dur_ns", "cpu_ns", "runq_ns",
            "gpu_ns", "nested", "overhead_ns", "profiled"]
    df = pd.DataFrame(rows, columns=cols)
    # Every rank's stamps on rank 0's clock (fsbench.measurement.clock); runs from before offsets
    # were measured, and one-host runs, have none or ~0.
    for p in Path(run_dir).glob("clock-rank-*.json"):
        try:
            offset = json.loads(p.read_text())["offset_ns"]
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
            offset = None
        if not isinstance(offset, int):  # a wrong offset would misplace the rank's spans
            raise ConfigError(f"{p}: not a clock record with offset_ns (the file is damaged)")
        if offset:
            rank = int(p.stem.split("-")[-1])
            df.loc[df["rank"] == rank, "start_ns"] += offset
    df["runq_ns"] = df["runq_ns"].fillna(0).astype("int64")  # absent in older runs
    df["overhead_ns"] = df["overhead_ns"].fillna(0).astype("int64")  # emulated runs only
    df["nested"] = df["nested"].eq(True)  # absent (NaN) in most records
    df["profiled"] = df["profiled"].eq(True)  # CUDA runs' profiled window only
    return df


def read_step_stats(run_dir: str | os.PathLike) -> "pd.DataFrame":  # noqa: F821
    """Every rank's per-step stats (steps-rank-R.jsonl); ConfigError naming a damaged file
    (read_records)."""
    import pandas as pd

    rows = []
    for p in sorted(Path(run_dir).glob("steps-rank-*.jsonl")):
        rows += read_records(p, {"rank": int, "step": int})
    # Trainers may add their own per-step columns (e.g. a balancer's predictions).
    base = ["rank", "step", "loss", "num_samples", "num_targets"]
    df = pd.DataFrame(rows)
    return df.reindex(columns=base + [c for c in df.columns if c not in base])
