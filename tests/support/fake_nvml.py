"""A test double of the NVML *library* (the `pynvml` module), not of the measurement: the
calls fsbench.measurement.nvml makes, answered from a recorded counter trace, with NVML's
own rules enforced (GPM metrics between two samples more than 100 ms apart, the older one
first; every buffer allocated is freed; one shutdown per init).

GPM samples hold counters; a metric is the counters' change over the window divided by its
length. The trace gives, per metric, a piecewise-constant value over time (a recording of
what the GPU did); the fake integrates it, so a window's metric is that value's time
average over the window, as NVML computes it.
"""
from __future__ import annotations

from types import SimpleNamespace

import pynvml  # the real library's error types, so `except pynvml.NVMLError` sees them

NVMLError = pynvml.NVMLError
NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
NVML_SUCCESS = 0
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
MIN_WINDOW_NS = 100_000_000


class Trace:
    """Piecewise-constant metric values: [(from_ns, {metric_id: percent}), ...]."""

    def __init__(self, pieces: list[tuple[int, dict[int, float]]]) -> None:
        self.pieces = sorted(pieces, key=lambda p: p[0])

    def integral(self, metric: int, t_ns: int) -> float:
        """Percent x nanoseconds from 0 to t_ns."""
        total = 0.0
        for i, (start, values) in enumerate(self.pieces):
            end = self.pieces[i + 1][0] if i + 1 < len(self.pieces) else t_ns
            if start >= t_ns:
                break
            total += values[metric] * (min(end, t_ns) - start)
        return total


class Sample:
    def __init__(self) -> None:
        self.t_ns: int | None = None


class Metric:
    def __init__(self) -> None:
        self.metricId, self.value, self.nvmlReturn = 0, 0.0, -1


class c_nvmlGpmMetricsGet_t:  # noqa: N801  (pynvml's name)
    def __init__(self) -> None:
        self.version, self.numMetrics, self.sample1, self.sample2 = 0, 0, None, None
        self.metrics = [Metric() for _ in range(8)]


class FakeNvml:
    """Set `now_ns` before each call that samples; the calls are recorded in `calls`."""

    NVMLError, NVMLError_LibraryNotFound = NVMLError, NVMLError_LibraryNotFound
    NVML_SUCCESS, NVML_GPM_METRICS_GET_VERSION = NVML_SUCCESS, NVML_GPM_METRICS_GET_VERSION
    NVML_GPM_METRIC_SM_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY = NVML_GPM_METRIC_SM_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY
    c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t

    def __init__(self, trace: Trace, name: str = "NVIDIA H200", mig: int = 0,
                 gpm_supported: bool = True, fail_metrics_after: int | None = None) -> None:
        self.trace, self.name, self.mig, self.gpm_supported = trace, name, mig, gpm_supported
        self.fail_metrics_after = fail_metrics_after
        self.now_ns = 0
        self.pids = None
        self.inits = 0
        self.live: set[int] = set()  # sample buffers allocated and not freed
        self.calls: list[tuple] = []

    # -- lifecycle ------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        assert self.inits > 0, "nvmlShutdown without nvmlInit"
        self.inits -= 1

    # -- devices --------------------------------------------------------------------
    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str):
        self.calls.append(("by_pci", bus_id))
        return ("pci", bus_id)

    def nvmlDeviceGetHandleByIndex(self, index: int):
        self.calls.append(("by_index", index))
        return ("index", index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str):
        self.calls.append(("by_uuid", uuid))
        return ("uuid", uuid)

    def nvmlDeviceGetName(self, handle) -> str:
        return self.name

    def nvmlDeviceGetMigMode(self, handle):
        return self.mig, self.mig

    def nvmlGpmQueryDeviceSupport(self, handle):
        return SimpleNamespace(isSupportedDevice=int(self.gpm_supported))

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=40 * 2**30, total=141 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        """This process (3 GiB: context, allocator reserve, communication buffers) and a
        neighbour's; `pids` replaces the list when set."""
        import os

        if self.pids is not None:
            return self.pids
        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=3 * 2**30),
                SimpleNamespace(pid=1, usedGpuMemory=30 * 2**30)]

    # -- GPM ------------------------------------------------------------------------
    def nvmlGpmSampleAlloc(self) -> Sample:
        buf = Sample()
        self.live.add(id(buf))
        return buf

    def nvmlGpmSampleFree(self, buf: Sample) -> None:
        self.live.discard(id(buf))

    def nvmlGpmSampleGet(self, handle, buf: Sample) -> None:
        assert id(buf) in self.live, "sample into a buffer that was not allocated"
        buf.t_ns = self.now_ns
        self.calls.append(("sample", self.now_ns))

    def nvmlGpmMetricsGet(self, req) -> None:
        done = sum(1 for c in self.calls if c[0] == "metrics")
        self.calls.append(("metrics", req.sample1.t_ns, req.sample2.t_ns))
        if self.fail_metrics_after is not None and done >= self.fail_metrics_after:
            raise NVMLError(pynvml.NVML_ERROR_IN_USE)  # e.g. a profiler took the counters
        assert req.version == NVML_GPM_METRICS_GET_VERSION
        t1, t2 = req.sample1.t_ns, req.sample2.t_ns
        # NVML's rule: the older sample first, and more than 100 ms between them.
        assert t1 is not None and t2 is not None and t2 - t1 > MIN_WINDOW_NS, (t1, t2)
        for m in req.metrics[:req.numMetrics]:
            m.value = (self.trace.integral(m.metricId, t2) - self.trace.integral(m.metricId, t1)) / (t2 - t1)
            m.nvmlReturn = NVML_SUCCESS
