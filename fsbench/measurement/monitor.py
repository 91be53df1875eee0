"""Background per-rank samplers: NVML GPM SM occupancy on NVIDIA GPUs, CPU and memory always.

Usage in a rank's worker::

    monitor = RankMonitor(device, interval_s=0.1)    # construct before warm-up
    ...warm-up steps...
    monitor.start()                                   # at the first measured step
    ...measured steps...
    monitor.stop()
    info = monitor.summary()                          # flat, JSON-able
    rows = monitor.samples()                          # raw samples, one dict per tick

What is measured (ARCHITECTURE.md, "SM occupancy"):
- `sm_occupancy` / `sm_util`: NVML GPM metrics SM_OCCUPANCY (active warps / theoretical
  maximum) and SM_UTIL (share of SMs busy), in percent, each computed between two GPM
  samples. Hopper and newer only; anywhere else they are None and `sm_occupancy_reason`
  says why. Both are *device-wide*: other processes on the same GPU count too.
- `gpu_util_percent`: `nvmlDeviceGetUtilizationRates().gpu`, the share of time in which
  at least one kernel ran. It is NOT occupancy (one tiny kernel reads 100%) and is kept
  in its own column so that nobody reports it as such.
- `cpu_util_percent`: this process's CPU time (user + system, all its threads, not its
  child processes such as data-loader workers) over wall time; 100 = one core busy.
- `rss_peak_mib`: the highest resident set size seen at a sample (a spike shorter than
  the interval can fall between samples).

Overhead: the sampler thread sleeps in `Event.wait` between ticks; a tick is a few
/proc reads and, on GPUs, a few NVML calls (ctypes releases the GIL during them). It never
calls torch's CUDA API, so it never synchronizes the device or touches the caching
allocator, and it shares no lock with the training thread. Nothing raised while sampling
reaches the training thread: errors are kept in `RankMonitor.errors`.
"""
from __future__ import annotations

import os
import statistics
import threading
from typing import Any

import psutil

from fsbench.measurement.clock import now_ns
from fsbench.measurement.nvml import GPM_MIN_WINDOW_NS, MIB, NvmlSampler

SAMPLE_KEYS = ("time_ns", "cpu_util_percent", "rss_mib", "gpu_util_percent",
               "gpu_mem_used_mib", "gpu_proc_mem_mib", "sm_occupancy", "sm_util")


def _median(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return float(statistics.median(vals)) if vals else None


def _peak(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return float(max(vals)) if vals else None


class _ProcessSampler:
    """CPU utilization and RSS of this process, from psutil (reads /proc; no shared locks).

    CPU utilization is the delta of (user + system) CPU time over the delta of wall time
    between consecutive ticks. psutil's own `cpu_percent()` would do the same, but keeps
    its reference point inside the Process object; owning it here keeps windows explicit.
    Hazard: Linux accounts process CPU time in clock ticks (10 ms at USER_HZ=100), so one
    50 ms window reads in steps of ~20%; report the median over many windows, not a row.
    """

    def __init__(self) -> None:
        self._proc = psutil.Process(os.getpid())
        self._t_ns = 0
        self._cpu_s = 0.0

    def _cpu_seconds(self) -> float:
        t = self._proc.cpu_times()
        return t.user + t.system

    def begin(self, t_ns: int) -> None:
        self._t_ns, self._cpu_s = t_ns, self._cpu_seconds()

    def sample(self, t_ns: int) -> dict:
        cpu_s = self._cpu_seconds()
        wall_s = (t_ns - self._t_ns) / 1e9
        util = 100.0 * (cpu_s - self._cpu_s) / wall_s if wall_s > 0 else None
        self._t_ns, self._cpu_s = t_ns, cpu_s
        return {"cpu_util_percent": util, "rss_mib": self._proc.memory_info().rss / MIB}


class RankMonitor:
    """Samples one rank's GPU (NVML) and process (psutil) metrics on a daemon thread.

    `start()` begins a measured window (discarding samples of an earlier one), `stop()`
    ends it and releases NVML; `summary()` and `samples()` read what was collected.
    None of these raise on sampling failures; see `errors`.
    """

    def __init__(self, device: Any = None, interval_s: float = 0.1) -> None:
        import torch

        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.interval_s = float(interval_s)
        self.errors: list[str] = []
        self._rows: list[dict] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._last_t_ns = 0
        self._window_ns = (0, 0)  # the sampled window's start and end (CLOCK_MONOTONIC)
        self._proc = _ProcessSampler()
        self._gpu: NvmlSampler | None = None
        self._reason: str | None = None  # why there are no SM metrics, fixed at open time
        self._gpm_error: str | None = None  # GPM failure of the last window, kept past stop()
        self._released = False  # stop() closed NVML; a later start() reopens it
        self._open_gpu()

    # -- backends -------------------------------------------------------------------
    def _open_gpu(self) -> None:
        if self.device.type != "cuda":
            self._reason = f"CPU run (device={self.device.type}): no GPU to sample"
            return
        index = self.device.index
        if index is None:
            try:
                import torch

                index = torch.cuda.current_device()
            except Exception:
                index = 0
        try:
            gpu = NvmlSampler(index)
        except Exception as e:  # never let monitoring break a run
            self._reason = f"no GPU: NVML sampler failed to open ({e!r})"
            return
        self._reason = gpu.gpm_reason
        self._gpu = gpu if gpu.ok else None
        if not gpu.ok:
            gpu.close()

    # -- thread ---------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        if self._released:
            self._released = False
            self._open_gpu()  # restarted after stop() released NVML
        self._gpm_error = None
        self._rows = []
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"fsbench-monitor-{os.getpid()}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=max(5.0, 10 * self.interval_s))
        if thread.is_alive():
            # Stuck in a driver call: leave the daemon thread and its NVML buffers alone.
            self.errors.append("sampler thread did not stop in time")
            return
        if self._gpu is not None:
            self._gpm_error = self._gpu.gpm_error
            self._gpu.close()
            self._gpu = None
        self._released = True

    def __enter__(self) -> "RankMonitor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            t = now_ns()  # CLOCK_MONOTONIC, the clock of timeline spans
            self._window_ns = (t, t)
            self._proc.begin(t)
            if self._gpu is not None:
                self._gpu.begin(t)
            self._last_t_ns = t
            while not self._stop.wait(self.interval_s):
                self._tick()
            # The tail since the last tick, unless it is too short to give a stable rate.
            if now_ns() - self._last_t_ns >= 0.5 * self.interval_s * 1e9:
                self._tick()
        except BaseException as e:  # the training thread must never see this
            self.errors.append(f"sampler thread died: {e!r}")

    def _tick(self) -> None:
        t = now_ns()
        row: dict[str, Any] = dict.fromkeys(SAMPLE_KEYS)
        row["time_ns"] = t
        try:
            row.update(self._proc.sample(t))
        except Exception as e:
            self.errors.append(f"process sample failed: {e!r}")
        if self._gpu is not None:
            try:
                row.update(self._gpu.sample(t))
            except Exception as e:
                self.errors.append(f"GPU sample failed: {e!r}")
        self._last_t_ns = t
        self._window_ns = (self._window_ns[0], t)
        self._rows.append(row)  # list.append is atomic; readers take a copy

    # -- results --------------------------------------------------------------------
    def samples(self) -> list[dict]:
        return [dict(r) for r in list(self._rows)]

    def summary(self) -> dict:
        rows = list(self._rows)
        col = lambda k: [r.get(k) for r in rows]  # noqa: E731
        occ, util = _median(col("sm_occupancy")), _median(col("sm_util"))
        reason = self._reason
        gpm_error = self._gpu.gpm_error if self._gpu is not None else self._gpm_error
        if reason is None:
            if occ is None and util is None:
                # NVML's GPM needs windows over 100 ms: a short timed window (a few fast
                # steps) gives none. Say how long it was, so the fix (more steps) is plain.
                sampled_ms = (self._window_ns[1] - self._window_ns[0]) / 1e6
                reason = gpm_error or (
                    f"no GPM window completed: the sampled steps lasted {sampled_ms:.0f} ms, "
                    f"NVML needs windows over {GPM_MIN_WINDOW_NS / 1e6:.0f} ms (run more steps)")
            elif gpm_error:
                reason = f"partial: {gpm_error}"  # values cover only the span before it
        return {
            "sm_occupancy": occ,
            "sm_util": util,
            "sm_occupancy_reason": reason,
            "gpu_util_percent": _median(col("gpu_util_percent")),
            "gpu_mem_used_peak_mib": _peak(col("gpu_mem_used_mib")),
            "gpu_proc_mem_peak_mib": _peak(col("gpu_proc_mem_mib")),
            "cpu_util_percent": _median(col("cpu_util_percent")),
            "rss_peak_mib": _peak(col("rss_mib")),
            "monitor_samples": len(rows),
            "monitor_interval_s": self.interval_s,
        }

