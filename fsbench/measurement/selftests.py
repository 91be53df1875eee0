"""Self-tests of the CUDA measurements against truths known on one GPU.

Each runs the measurement code a CUDA run uses (timeline spans and flights, the host-sync
counter, the Kineto reader, the NVML monitor) on device work whose answer is known
independently, and returns a `SelfTest`: measured, truth, tolerance, passed. They are
pytest tests (tests/test_gpu_selftests.py, skipped without CUDA) and code the device
check runs (scripts/gpu_selftests.py, which also runs the transport's and the ground
truth's), so a wrong reading fails on the first GPU that runs either. NOT YET RUN ON A
GPU.

Known device time comes from sleep kernels (fsbench.measurement.device_sleep), and each
test's truth is measured by CUDA events bracketing exactly the kernels it launched (the
SM clock may drift from the sleep's calibration), never by the code under test.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from fsbench.measurement import kineto
from fsbench.measurement.device_sleep import SleepKernel
from fsbench.measurement.host_syncs import HostSyncCounter
from fsbench.measurement.monitor import RankMonitor
from fsbench.measurement.nvml import environment_limit
from fsbench.measurement.timeline import Timeline

RELATIVE_TOLERANCE = 0.05  # the 5%: far above launch latency (~10 us of 50 ms)
BUSY_OCCUPANCY_MIN = 0.25  # warps resident over the maximum, under a wide elementwise kernel
BUSY_SM_UTIL_MIN = 0.80    # share of SMs busy under the same kernel
IDLE_MAX = 0.05            # both, with nothing running


@dataclasses.dataclass
class SelfTest:
    name: str
    what: str           # the truth, in words
    measured: float | None
    truth: float | None
    unit: str
    tolerance: str      # what "within" means, in words
    passed: bool | None  # None: could not run here (`detail` says why)
    detail: str = ""
    record: dict | None = None  # what a reader needs beyond one number (copies' verdicts)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def within(measured: float | None, truth: float, rel: float = RELATIVE_TOLERANCE) -> bool:
    return measured is not None and abs(measured - truth) <= rel * abs(truth)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _fresh_timeline(path: Path, device) -> Timeline:
    """A CUDA timeline writing to `path`, emptied first (a timeline appends)."""
    path.unlink(missing_ok=True)
    timeline = Timeline(path, device=device)
    timeline.begin_step(0, warmup=False)
    return timeline


def flight_of_known_delay(device, work_dir: Path, sleep: SleepKernel, delay_ms: float = 50.0) -> SelfTest:
    """A collective replaced by a known device delay: a sleep kernel on a side stream,
    completed through a CUDA future as NCCL's work is. The flight (an event at issue on
    the issuing stream, one in the future's callback on the stream torch makes wait for
    it: fsbench.measurement.timeline.Flight) must read the delay, not the ~0 ms the
    future's host-side completion would."""
    torch = sleep.torch
    torch.cuda.synchronize(device)
    timeline = _fresh_timeline(work_dir / "selftest-flight.jsonl", device)
    side = torch.cuda.Stream(device)
    flight = timeline.in_flight("selftest.delay")
    side.wait_stream(torch.cuda.current_stream(device))
    future = torch.futures.Future(devices=[device])
    with torch.cuda.stream(side):
        truth = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        truth[0].record()
        sleep.launch(delay_ms)
        truth[1].record()
        # Set on the side stream: the future records an event there, and its callbacks
        # run on streams made to wait for it (a CUDA-aware future, as ProcessGroupNCCL's).
        future.set_result(torch.zeros(1, device=device))
    future.then(lambda _: flight.finish())
    torch.cuda.synchronize(device)  # note: a CPU-GPU sync point, as the worker's end of step
    timeline.flush()
    rec = [r for r in _records(work_dir / "selftest-flight.jsonl") if r["kind"] == "flight"]
    measured = rec[0]["dur_ns"] / 1e6 if rec else None
    true_ms = truth[0].elapsed_time(truth[1])
    return SelfTest("flight_of_known_delay", "a sleep kernel on a side stream, completed through a future",
                    measured, true_ms, "ms", "within 5%", within(measured, true_ms),
                    "" if rec else "no flight record was written")


def compute_span_of_known_kernels(device, work_dir: Path, sleep: SleepKernel) -> SelfTest:
    """A compute span around three sleep kernels: its CUDA-event time (`gpu_ns`) is their
    length, while the host leaves the span as soon as they are queued."""
    torch = sleep.torch
    torch.cuda.synchronize(device)
    timeline = _fresh_timeline(work_dir / "selftest-span.jsonl", device)
    pieces = []
    with timeline.span("forward"):
        for ms in (5.0, 10.0, 15.0):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            sleep.launch(ms)
            b.record()
            pieces.append((a, b))
    timeline.flush()  # note: syncs on the span's end event
    true_ms = sum(a.elapsed_time(b) for a, b in pieces)
    rec = [r for r in _records(work_dir / "selftest-span.jsonl") if r["name"] == "forward"][0]
    measured = rec.get("gpu_ns", 0) / 1e6
    return SelfTest("compute_span_of_known_kernels", "three sleep kernels of 5, 10 and 15 ms",
                    measured, true_ms, "ms", "within 5%", within(measured, true_ms),
                    f"host time of the span {rec['dur_ns'] / 1e6:.3f} ms (launches only)")


def planted_host_sync_counted_once(device) -> SelfTest:
    """One `.item()` inside a forward span among kernels that never sync: counted once,
    and once inside forward/backward."""
    import torch

    timeline = Timeline(None, device=device)
    counter = HostSyncCounter(True, timeline.open_spans)
    with counter.step() as counts:
        x = torch.ones(1024, device=device) * 2  # no sync
        with timeline.span("forward"):
            y = (x + 1).sum()
            value = y.item()  # the planted sync
    measured = counts["host_syncs"], counts["host_syncs_fwd_bwd"]
    return SelfTest("planted_host_sync_counted_once", "one .item() inside forward",
                    float(measured[0]), 1.0, "syncs", "exactly (and 1 inside forward)",
                    measured == (1, 1), f"counts {counts}, value {value}")


def kineto_busy_of_known_sequence(device, work_dir: Path, sleep: SleepKernel) -> SelfTest:
    """A profiled step of two sleep kernels with a host-made gap of idle device between
    them: the kernel record's busy time is their length, not the step's."""
    torch = sleep.torch
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize(device)
    pieces = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("fsbench.step.0"):
            for ms in (10.0, 20.0):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                sleep.launch(ms)
                b.record()
                pieces.append((a, b))
                torch.cuda.synchronize(device)  # note: a sync point, to make the gap
                time.sleep(0.015)  # 15 ms with the device idle
    path = work_dir / "selftest-kineto.json"
    prof.export_chrome_trace(str(path))
    row = kineto.gpu_step_busy(kineto.load_trace(path), device=device.index or 0).iloc[0]
    true_ms = sum(a.elapsed_time(b) for a, b in pieces)
    measured = row["busy_ns"] / 1e6
    window = (row["window_end_us"] - row["window_start_us"]) / 1e3
    return SelfTest("kineto_busy_of_known_sequence", "sleep kernels of 10 and 20 ms, 15 ms idle gaps",
                    measured, true_ms, "ms", "within 5%", within(measured, true_ms),
                    f"step window {window:.1f} ms, {int(row['kernels'])} kernels")


def sleep_lengths_match_nominal(device, sleep: SleepKernel, lengths_ms=(10.0, 30.0),
                                rel: float = 0.02) -> SelfTest:
    """The sleep kernel, calibrated warm (fsbench.measurement.device_sleep), runs its
    nominal lengths: the ground truth's expected ratios take them as they are, so a clock
    error of a few % would eat its 0.03 tolerance. Passes when the calibration settled
    (two medians within 1%) and each length is within `rel`."""
    measured = [sleep.time_ms(lambda ms=ms: sleep.launch(ms)) for ms in lengths_ms]
    worst = max(abs(m / ms - 1) for m, ms in zip(measured, lengths_ms))
    cal = sleep.calibration
    return SelfTest("sleep_lengths_match_nominal", f"sleep kernels of {', '.join(f'{ms:g}' for ms in lengths_ms)} ms, "
                    "calibrated warm", worst, 0.0, "relative error", f"within {rel:.0%}, calibration settled",
                    bool(cal["settled"] and worst <= rel),
                    f"measured {', '.join(f'{m:.3f}' for m in measured)} ms; calibration settled "
                    f"{cal['settled']} after {cal['rounds']} rounds (medians {cal['medians_ms']})")


def _occupancy(device, work) -> dict:
    monitor = RankMonitor(device, interval_s=0.1)
    monitor.start()
    work()
    monitor.stop()
    return monitor.summary()


def sm_occupancy_busy_and_idle(device, seconds: float = 0.6) -> SelfTest:
    """NVML GPM under a wide elementwise kernel run back to back (every SM full of warps)
    reads high occupancy and utilization; with the device idle, about 0."""
    import torch

    x = torch.ones(64 << 20, device=device)  # 256 MiB: ~10^5 blocks per launch

    def busy():
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(20):
                x.mul_(1.0000001)
            torch.cuda.synchronize(device)  # note: keeps the queue short, so stop() is on time
    loaded = _occupancy(device, busy)
    idle = _occupancy(device, lambda: time.sleep(seconds))
    return judge_occupancy(loaded, idle)


def judge_occupancy(loaded: dict, idle: dict) -> SelfTest:
    """The occupancy self-test's verdict from the monitor's summaries under load and idle.
    Where the environment gives no GPM (pre-Hopper, MIG, no NVML, counters the host hides:
    fsbench.measurement.nvml.environment_limit) it is not run, saying so; a GPU with GPM
    that gave no reading has failed."""
    name, what = "sm_occupancy_busy_and_idle", "elementwise kernels back to back, then idle"
    occ, util = loaded["sm_occupancy"], loaded["sm_util"]
    if occ is None or util is None:
        why = loaded["sm_occupancy_reason"] or "no reading"
        if environment_limit(why):
            return SelfTest(name, what, None, None, "fraction", "", None, f"not run: environment: {why}")
        return SelfTest(name, what, None, None, "fraction", "", False, why)
    occ, util = occ / 100, util / 100
    idle_occ = (idle["sm_occupancy"] or 0) / 100
    idle_util = (idle["sm_util"] or 0) / 100
    ok = (occ >= BUSY_OCCUPANCY_MIN and util >= BUSY_SM_UTIL_MIN and idle["sm_occupancy"] is not None
          and idle_occ <= IDLE_MAX and idle_util <= IDLE_MAX)
    return SelfTest(name, what, occ, BUSY_OCCUPANCY_MIN, "fraction",
                    f"busy: occupancy >= {BUSY_OCCUPANCY_MIN}, SM util >= {BUSY_SM_UTIL_MIN}; "
                    f"idle: both <= {IDLE_MAX}", ok,
                    f"busy SM util {util:.3f}; idle occupancy {idle_occ:.3f}, SM util {idle_util:.3f}")
