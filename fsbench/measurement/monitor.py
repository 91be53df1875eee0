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
import time
from typing import Any

import psutil

from fsbench.measurement.clock import now_ns

try:  # nvidia-ml-py; a hard dependency, but a broken install must not break CPU runs
    import pynvml
except Exception:  # pragma: no cover - depends on the environment
    pynvml = None

MIB = 1024 * 1024

# NVML's GPM docs: "the interval between two nvmlGpmSampleGet() calls must be greater
# than 100 ms due to the internal sample refresh rate"; shorter windows give zeros or
# stale values. With a tick shorter than that (interval_s < 0.1), GPM metrics are computed
# only on ticks at least this far from the previous GPM sample; other rows hold None.
# The default tick is 0.1 s: each tick takes the GIL, and a Python-bound training thread
# (e.g. the ground-truth spin) then loses that time; at 0.05 s it cost ~1% of wall time.
GPM_MIN_WINDOW_NS = 100_000_000

SAMPLE_KEYS = ("time_ns", "cpu_util_percent", "rss_mib", "gpu_util_percent",
               "gpu_mem_used_mib", "sm_occupancy", "sm_util")


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


def _cuda_pci_bus_id(index: int) -> str | None:
    """The PCI address of CUDA device `index` as NVML accepts it, or None.

    Called once, on the constructing thread, before sampling starts. Hazard this avoids:
    CUDA indices are not NVML indices. CUDA_VISIBLE_DEVICES renumbers devices ("cuda:0"
    may be physical GPU 3), and CUDA's default order (CUDA_DEVICE_ORDER=FASTEST_FIRST)
    can differ from NVML's PCI order even without it. The bus id names the same chip in
    both worlds.
    """
    try:
        import torch

        props = torch.cuda.get_device_properties(index)
        # NVML accepts "domain:bus:device.function" in hex; CUDA reports function 0.
        return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except Exception:
        return None


def _nvml_handle(index: int):
    """Open the NVML handle of CUDA device `index`: by PCI bus id, else by remapped index."""
    bus_id = _cuda_pci_bus_id(index)
    if bus_id is not None:
        return pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
    # Fallback without torch's properties: undo CUDA_VISIBLE_DEVICES by hand. Still wrong
    # if CUDA_DEVICE_ORDER is not PCI_BUS_ID and the GPUs differ in speed (see above).
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible:
        entry = visible[index]
        if entry.isdigit():
            return pynvml.nvmlDeviceGetHandleByIndex(int(entry))
        return pynvml.nvmlDeviceGetHandleByUUID(entry)  # "GPU-..." entries
    return pynvml.nvmlDeviceGetHandleByIndex(index)


class _NvmlGpmSampler:
    """Device memory, kernel-active time and (Hopper+) GPM SM metrics of one GPU via NVML.

    After construction: `ok` is True when an NVML handle is open (memory and utilization
    columns are sampled); `gpm_reason` is None when GPM SM metrics are sampled, else why not.
    Create it in the rank process itself: NVML handles do not survive fork().
    """

    def __init__(self, index: int) -> None:
        self.ok = False
        self.gpm_reason: str | None = None
        self.gpm_error: str | None = None  # set if GPM sampling failed after it started
        self._inited = False
        self._handle = None
        self._bufs: list = []
        self._req = None
        self._prev_t_ns = 0
        if pynvml is None:
            self.gpm_reason = "no GPU: nvidia-ml-py (pynvml) is not importable"
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            self.gpm_reason = "no GPU: NVML library not found (libnvidia-ml.so.1)"
            return
        except pynvml.NVMLError as e:
            self.gpm_reason = f"no GPU: NVML init failed ({e})"
            return
        self._inited = True
        try:
            self._handle = _nvml_handle(index)
            name = pynvml.nvmlDeviceGetName(self._handle)
            self.ok = True
        except Exception as e:
            self.gpm_reason = f"NVML could not open CUDA device {index} ({e})"
            return
        self.gpm_reason = self._gpm_unsupported(name)
        if self.gpm_reason is None:
            try:
                self._setup_gpm()
            except pynvml.NVMLError as e:
                self.gpm_reason = f"GPM setup failed on {name} ({e})"
                self._free_gpm()

    def _gpm_unsupported(self, name: str) -> str | None:
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(self._handle)
        except pynvml.NVMLError:  # not a MIG-capable GPU: NotSupported
            current = 0
        if current:
            # With MIG on, whole-GPU GPM would mix all GPU instances, and this rank's
            # instance id would have to come from its MIG UUID (nvmlGpmMigSampleGet).
            return f"MIG mode enabled on {name}: per-instance GPM sampling is not implemented"
        try:
            support = pynvml.nvmlGpmQueryDeviceSupport(self._handle)
        except pynvml.NVMLError as e:  # old driver (FunctionNotFound) or NotSupported
            return f"GPM not supported on {name} ({e})"
        if not support.isSupportedDevice:
            return f"GPM not supported on {name}"  # pre-Hopper GPUs
        return None

    def _setup_gpm(self) -> None:
        # Two sample buffers used in turn: the previous sample and the one being taken.
        self._bufs = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
        # One request struct, reused: it is ~19 KB (NVML_GPM_METRIC_MAX entries).
        req = pynvml.c_nvmlGpmMetricsGet_t()
        req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = 2
        self._req = req

    def _free_gpm(self) -> None:
        for buf in self._bufs:
            try:
                pynvml.nvmlGpmSampleFree(buf)
            except Exception:
                pass
        self._bufs, self._req = [], None

    @property
    def gpm_active(self) -> bool:
        return self.gpm_reason is None and self.gpm_error is None and bool(self._bufs)

    def begin(self, t_ns: int) -> None:
        if self.gpm_active:
            try:
                pynvml.nvmlGpmSampleGet(self._handle, self._bufs[0])
                self._prev_t_ns = t_ns
            except pynvml.NVMLError as e:
                self.gpm_error = f"nvmlGpmSampleGet failed ({e})"

    def _gpm_metrics(self, t_ns: int) -> tuple[float | None, float | None]:
        if not self.gpm_active or t_ns - self._prev_t_ns <= GPM_MIN_WINDOW_NS:
            return None, None
        prev, cur = self._bufs
        try:
            pynvml.nvmlGpmSampleGet(self._handle, cur)
            req = self._req
            req.sample1, req.sample2 = prev, cur  # sample1 older, sample2 newer
            req.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
            req.metrics[1].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
            pynvml.nvmlGpmMetricsGet(req)
        except pynvml.NVMLError as e:
            # E.g. a profiler holding the counters. Stop GPM; keep the other columns.
            self.gpm_error = f"GPM sampling failed ({e})"
            return None, None
        self._bufs = [cur, prev]
        self._prev_t_ns = t_ns
        out = []
        for m in req.metrics[:2]:
            out.append(float(m.value) if m.nvmlReturn == pynvml.NVML_SUCCESS else None)
        return out[0], out[1]

    def sample(self, t_ns: int) -> dict:
        row: dict[str, Any] = {}
        try:
            row["gpu_mem_used_mib"] = pynvml.nvmlDeviceGetMemoryInfo(self._handle).used / MIB
            row["gpu_util_percent"] = float(pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
        except pynvml.NVMLError:
            pass  # a missed reading stays None in this row
        row["sm_occupancy"], row["sm_util"] = self._gpm_metrics(t_ns)
        return row

    def close(self) -> None:
        self._free_gpm()
        self.ok = False
        if self._inited:
            self._inited = False
            try:
                pynvml.nvmlShutdown()  # NVML is reference counted: one per nvmlInit
            except Exception:
                pass


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
        self._proc = _ProcessSampler()
        self._gpu: _NvmlGpmSampler | None = None
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
            gpu = _NvmlGpmSampler(index)
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
                reason = gpm_error or ("no GPM window completed: measured span shorter than "
                                       f"{GPM_MIN_WINDOW_NS / 1e9:g} s")
            elif gpm_error:
                reason = f"partial: {gpm_error}"  # values cover only the span before it
        return {
            "sm_occupancy": occ,
            "sm_util": util,
            "sm_occupancy_reason": reason,
            "gpu_util_percent": _median(col("gpu_util_percent")),
            "gpu_mem_used_peak_mib": _peak(col("gpu_mem_used_mib")),
            "cpu_util_percent": _median(col("cpu_util_percent")),
            "rss_peak_mib": _peak(col("rss_mib")),
            "monitor_samples": len(rows),
            "monitor_interval_s": self.interval_s,
        }

