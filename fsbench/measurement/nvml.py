"""NVML on one GPU, for the rank monitor (fsbench.measurement.monitor): device memory,
kernel-active time and, on Hopper and newer, GPM SM occupancy and SM utilization.

Kept apart from the monitor's thread and CPU sampling because it is the part that only a
GPU machine runs; every NVML call is here.
"""
from __future__ import annotations

import os
from typing import Any

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
# Reasons that the environment, not fsbench, decides: no GPU or NVML, a GPU without GPM,
# MIG, and NVML's own words (pynvml's NVMLError strings) for counters the host hides
# (a container without profiling rights, another client such as a profiler holding them).
# A self-test that meets one is "not run: environment", never FAILED
# (fsbench.measurement.selftests).
ENVIRONMENT_LIMITS = ("no GPU", "GPM not supported", "MIG mode", "NVML could not open",
                      "Insufficient Permissions", "Not Supported", "In use by another client",
                      "Function Not Found", "Driver Not Loaded", "Library Not Found")


def environment_limit(reason: str | None) -> bool:
    """True when `reason` (a GPM reason or error) is the environment's limit."""
    return bool(reason) and any(m.lower() in reason.lower() for m in ENVIRONMENT_LIMITS)


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


class NvmlSampler:
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
        out = [float(m.value) if m.nvmlReturn == pynvml.NVML_SUCCESS else None for m in req.metrics[:2]]
        if out == [None, None]:
            # Both metrics refused while the sample itself worked (counters the host
            # hides): say why, or they would read as missing values with no reason.
            self.gpm_error = f"GPM metrics failed ({pynvml.NVMLError(req.metrics[0].nvmlReturn)})"
        return out[0], out[1]

    def sample(self, t_ns: int) -> dict:
        row: dict[str, Any] = {}
        try:
            row["gpu_mem_used_mib"] = pynvml.nvmlDeviceGetMemoryInfo(self._handle).used / MIB
            row["gpu_util_percent"] = float(pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
        except pynvml.NVMLError:
            pass  # a missed reading stays None in this row
        row["gpu_proc_mem_mib"] = self._process_memory()
        row["sm_occupancy"], row["sm_util"] = self._gpm_metrics(t_ns)
        return row

    def _process_memory(self) -> float | None:
        """This process's memory on the GPU as the driver sees it (the CUDA context, the
        caching allocator's reserve, NCCL's and symmetric memory's buffers), or None: not
        listed (in a container NVML may report the host's process ids) or not readable."""
        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except pynvml.NVMLError:
            return None
        used = [p.usedGpuMemory for p in procs if p.pid == os.getpid() and p.usedGpuMemory is not None]
        return used[0] / MIB if used else None

    def close(self) -> None:
        self._free_gpm()
        self.ok = False
        if self._inited:
            self._inited = False
            try:
                pynvml.nvmlShutdown()  # NVML is reference counted: one per nvmlInit
            except Exception:
                pass


def gpm_probe(index: int, gap_s: float = 0.15) -> dict:
    """Two GPM samples `gap_s` apart (over NVML's 100 ms minimum) on CUDA device `index`,
    as the monitor takes them: whether this machine gives SM occupancy at all, before any
    run depends on it. `error` is NVML's reason when not, and `environment` whether that
    reason is the environment's (ENVIRONMENT_LIMITS) rather than fsbench's."""
    import time

    sampler = NvmlSampler(index)
    try:
        out = {"ok": False, "sm_occupancy": None, "sm_util": None, "error": sampler.gpm_reason}
        if sampler.gpm_reason is None:
            t0 = time.monotonic_ns()
            sampler.begin(t0)
            time.sleep(gap_s)
            row = sampler.sample(time.monotonic_ns())
            out.update(sm_occupancy=row["sm_occupancy"], sm_util=row["sm_util"], error=sampler.gpm_error)
            out["ok"] = row["sm_occupancy"] is not None and sampler.gpm_error is None
            if not out["ok"] and out["error"] is None:
                out["error"] = "GPM sampled without error but gave no SM occupancy"
        out["environment"] = environment_limit(out["error"])
        return out
    finally:
        sampler.close()
