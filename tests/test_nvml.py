"""The NVML sampler's windowing and arithmetic, against a test double of the NVML library
(tests/support/fake_nvml.py: NVML's rules enforced, a recorded counter trace). What only a
GPU can show (the real library, a real kernel's occupancy) is scripts/gpu_check.sh's."""
import time

import pytest
import torch

from fake_nvml import FakeNvml, Trace, NVML_GPM_METRIC_SM_OCCUPANCY as OCC, NVML_GPM_METRIC_SM_UTIL as UTIL
from fsbench.measurement import nvml
from fsbench.measurement.monitor import RankMonitor

MS = 1_000_000
# 0-300 ms: a kernel filling half the warps on 80% of the SMs; then a quarter on 40%.
TRACE = Trace([(0, {OCC: 50.0, UTIL: 80.0}), (300 * MS, {OCC: 25.0, UTIL: 40.0})])


@pytest.fixture
def fake(monkeypatch):
    lib = FakeNvml(TRACE)
    monkeypatch.setattr(nvml, "pynvml", lib)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return lib


def at(lib: FakeNvml, sampler: nvml.NvmlSampler, t_ms: float) -> dict:
    lib.now_ns = int(t_ms * MS)
    return sampler.sample(lib.now_ns)


def test_gpm_metrics_are_the_time_averages_between_the_older_and_the_newer_sample(fake):
    s = nvml.NvmlSampler(0)
    assert s.ok and s.gpm_reason is None and s.gpm_active
    s.begin(0)
    row = at(fake, s, 60)  # 60 ms: too short a window for GPM; memory still sampled
    assert row["sm_occupancy"] is None and row["sm_util"] is None
    assert row["gpu_mem_used_mib"] == 40 * 1024 and row["gpu_util_percent"] == 97.0
    assert row["gpu_proc_mem_mib"] == 3 * 1024  # the driver's view of this process alone
    row = at(fake, s, 200)  # [0, 200] ms: all in the first piece
    assert (row["sm_occupancy"], row["sm_util"]) == pytest.approx((50.0, 80.0))
    row = at(fake, s, 450)  # [200, 450]: 100 ms at 50%, 150 ms at 25% -> 35%
    assert (row["sm_occupancy"], row["sm_util"]) == pytest.approx((35.0, 56.0))
    assert [c for c in fake.calls if c[0] == "metrics"] == [("metrics", 0, 200 * MS),
                                                             ("metrics", 200 * MS, 450 * MS)]
    s.close()
    assert not fake.live and fake.inits == 0  # buffers freed, NVML shut down once


def test_a_gpm_failure_stops_gpm_and_keeps_memory_and_utilization(monkeypatch):
    lib = FakeNvml(TRACE, fail_metrics_after=1)
    monkeypatch.setattr(nvml, "pynvml", lib)
    s = nvml.NvmlSampler(0)
    s.begin(0)
    assert at(lib, s, 150)["sm_occupancy"] == pytest.approx(50.0)
    row = at(lib, s, 300)
    assert row["sm_occupancy"] is None and "GPM sampling failed" in s.gpm_error
    row = at(lib, s, 450)
    assert row["sm_occupancy"] is None and row["gpu_util_percent"] == 97.0
    assert sum(c[0] == "metrics" for c in lib.calls) == 2  # no GPM call after the failure
    s.close()
    assert not lib.live and lib.inits == 0


@pytest.mark.parametrize("kwargs, reason", [
    ({"mig": 1}, "MIG mode enabled on NVIDIA H200"),
    ({"gpm_supported": False, "name": "NVIDIA A100"}, "GPM not supported on NVIDIA A100"),
])
def test_devices_without_whole_gpu_gpm_say_why_and_still_sample_memory(monkeypatch, kwargs, reason):
    lib = FakeNvml(TRACE, **kwargs)
    monkeypatch.setattr(nvml, "pynvml", lib)
    s = nvml.NvmlSampler(0)
    assert s.ok and not s.gpm_active and reason in s.gpm_reason
    s.begin(0)
    row = at(lib, s, 500)
    assert row["sm_occupancy"] is None and row["gpu_mem_used_mib"] == 40 * 1024
    s.close()
    assert not lib.live and lib.inits == 0


@pytest.mark.parametrize("visible, index, call", [
    (None, 1, ("by_index", 1)),
    ("5,2", 1, ("by_index", 2)),            # CUDA renumbers: cuda:1 is the machine's GPU 2
    ("GPU-8f3a,GPU-11c0", 0, ("by_uuid", "GPU-8f3a")),
])
def test_the_handle_is_the_cuda_devices_gpu(fake, monkeypatch, visible, index, call):
    """Without torch's PCI bus id (no CUDA here), CUDA_VISIBLE_DEVICES is undone by hand."""
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    nvml.NvmlSampler(index).close()
    assert fake.calls[0] == call


def test_a_cuda_ranks_monitor_summarizes_gpm_windows(monkeypatch):
    """The monitor's thread with the fake on the real clock: a constant 40% occupancy and
    70% SM utilization read as exactly that, in percent, over every completed window."""
    lib = FakeNvml(Trace([(0, {OCC: 40.0, UTIL: 70.0})]))
    monkeypatch.setattr(nvml, "pynvml", lib)
    real_get = lib.nvmlGpmSampleGet

    def get(handle, buf):  # the device's counters run on the monitor's clock
        lib.now_ns = time.monotonic_ns()
        real_get(handle, buf)
    lib.nvmlGpmSampleGet = get
    # Ticks 150 ms apart: every window clears NVML's 100 ms on the fake's clock too.
    mon = RankMonitor(torch.device("cuda:0"), interval_s=0.15)
    mon.start()
    deadline = time.monotonic() + 30
    while sum(r["sm_occupancy"] is not None for r in mon.samples()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    mon.stop()
    s = mon.summary()
    assert s["sm_occupancy"] == pytest.approx(40.0) and s["sm_util"] == pytest.approx(70.0)
    assert s["sm_occupancy_reason"] is None and s["gpu_mem_used_peak_mib"] == 40 * 1024
    assert s["gpu_proc_mem_peak_mib"] == 3 * 1024
    assert mon.errors == [] and not lib.live and lib.inits == 0


def test_a_process_the_driver_does_not_list_reads_as_unknown(fake):
    """In a container NVML may list the host's process ids: then this process's memory is
    not known (None), never another process's."""
    from types import SimpleNamespace

    fake.pids = [SimpleNamespace(pid=1, usedGpuMemory=30 * 2**30)]
    s = nvml.NvmlSampler(0)
    assert at(fake, s, 10)["gpu_proc_mem_mib"] is None
    s.close()


def test_a_timed_window_too_short_for_gpm_says_how_long_it_was(monkeypatch):
    """Six fast steps can last under NVML's 100 ms GPM window: no figure, and the reason
    says how long the sampled steps lasted, so that the fix (more steps) is plain."""
    lib = FakeNvml(Trace([(0, {OCC: 40.0, UTIL: 70.0})]))
    monkeypatch.setattr(nvml, "pynvml", lib)
    # A tick far longer than the window: stopped before its first tick, deterministically.
    mon = RankMonitor(torch.device("cuda:0"), interval_s=30)
    mon.start()
    mon.stop()
    s = mon.summary()
    assert s["sm_occupancy"] is None and s["monitor_samples"] == 0
    assert "the sampled steps lasted 0 ms" in s["sm_occupancy_reason"]
    assert "over 100 ms" in s["sm_occupancy_reason"]


def test_a_partial_sm_occupancy_keeps_its_reason_in_the_run_summary():
    """A rank whose GPM sampling failed part-way has a figure and a caveat: the run's
    summary keeps the caveat (before, any figure erased the reason)."""
    from fsbench.measurement.run_summary import merge_monitors

    ranks = [{"sm_occupancy": 40.0, "sm_util": 70.0, "sm_occupancy_reason": "partial: GPM sampling failed"},
             {"sm_occupancy": 50.0, "sm_util": 80.0, "sm_occupancy_reason": None}]
    merged = merge_monitors(ranks)
    assert merged["sm_occupancy"] == pytest.approx(0.45)
    assert merged["sm_occupancy_reason"] == "partial: GPM sampling failed"
    assert merge_monitors([{**ranks[1]}])["sm_occupancy_reason"] is None
