"""Which engine moves a copy's bytes, measured rather than assumed.

A copy on a copy engine (a DMA) runs no thread block, so NVML's GPM SM utilization reads
about 0 while it runs alone; a copy carried by a kernel (an elementwise copy, NCCL) keeps
SMs busy. Hazard this exists for: `dst.copy_(src)` on one GPU is a cudaMemcpyAsync, but
it runs at about 90% of HBM bandwidth on an H100 (~3 TB/s), more than copy engines are
known to give, so the driver probably runs it on SMs; the one-rank pull of the sm_free
transport is such a copy. So every copy that a label calls "copy engine" is sampled here
while it runs alone, and labelled by the reading (`verdict`): the SM-contention
micro-benchmark (fsbench.scaling.micro), the device check's `copies_on_copy_engines`
self-test (same-GPU and pinned host-to-device copies, beside an SM copy as the control)
and the transport's own (freescale_impl.transport_selftest). NOT YET RUN ON A GPU.
"""
from __future__ import annotations

import statistics
import time

CE_MAX_SM_UTIL = 0.05      # a copy engine's copy: SMs as idle as an idle GPU (selftests.IDLE_MAX)
SM_COPY_MIN_SM_UTIL = 0.5  # the control: an elementwise copy kernel keeps most SMs busy
SAMPLE_S = 0.4             # copies run back to back this long: 3 GPM windows of >100 ms
BURST_MS = 20.0            # copies queued between host waits (short queue: samples see only them)
GPM_WINDOW_NS = 120_000_000  # over NVML's 100 ms minimum (fsbench.measurement.nvml)
COPY_BYTES = 256 << 20     # as the micro-benchmark's default: ~0.1 ms on HBM, ~5 ms over PCIe


def verdict(sm_util: float | None) -> str:
    """What moved the bytes, from the SM utilization (a fraction) read while the copy ran
    alone: "copy engine", "SM", or "unverified" where GPM gave no reading."""
    if sm_util is None:
        return "unverified"
    return "copy engine" if sm_util <= CE_MAX_SM_UTIL else "SM"


def burst(op_ms: float) -> int:
    """Copies to queue before each host wait: about BURST_MS of them (at least one)."""
    return max(1, int(BURST_MS / max(op_ms, 1e-3)))


def sm_util_while(device, op, seconds: float = SAMPLE_S) -> tuple[float | None, str | None]:
    """(mean GPM SM utilization as a fraction, None) while `op` (a copy, queued on the
    current stream) runs back to back on an otherwise idle `device` for `seconds`; (None,
    why) where GPM gives no reading (no GPU, pre-Hopper, counters hidden by the host)."""
    import torch

    from fsbench.measurement.nvml import NvmlSampler

    sampler = NvmlSampler(getattr(device, "index", None) or 0)
    try:
        if sampler.gpm_reason:
            return None, sampler.gpm_reason
        op()
        torch.cuda.synchronize(device)  # note: a sync point: warm-up (first launch) done
        t0 = time.monotonic_ns()
        op()
        torch.cuda.synchronize(device)  # note: a sync point: one copy timed, to size bursts
        n = burst((time.monotonic_ns() - t0) / 1e6)
        readings = []
        start = time.monotonic_ns()
        sampler.begin(start)
        due, end = start + GPM_WINDOW_NS, start + int(seconds * 1e9)
        while time.monotonic_ns() < end:
            for _ in range(n):
                op()
            torch.cuda.synchronize(device)  # note: a sync point: keeps the queue to one burst
            now = time.monotonic_ns()
            if now >= due:
                util = sampler.sample(now)["sm_util"]
                if util is not None:
                    readings.append(util / 100)
                due = now + GPM_WINDOW_NS
        if not readings:
            return None, sampler.gpm_error or "GPM gave no reading while the copies ran"
        return statistics.mean(readings), None
    finally:
        sampler.close()


def judged(name: str, sm_util: float | None, why: str | None) -> dict:
    """One copy's entry in a self-test's record: its reading and its verdict."""
    return {"copy": name, "sm_util": sm_util, "moved_by": verdict(sm_util), "reason": why}


def copies_on_copy_engines(device, nbytes: int = COPY_BYTES):
    """Self-test: SM utilization while each copy runs alone, with an elementwise copy kernel
    as the control that SMs are seen (>= SM_COPY_MIN_SM_UTIL) and a pinned host-to-device
    copy as the control that a DMA reads about 0. Passes when both controls hold; the
    same-GPU copy's verdict is the finding (record["copies"]), whichever it is."""
    import torch

    from fsbench.measurement.nvml import environment_limit
    from fsbench.measurement.selftests import SelfTest

    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    host = torch.empty(nbytes // 4, pin_memory=True)  # pinned: a DMA, no staging copy
    ops = {"sm_kernel_copy": lambda: torch.add(src, 0, out=dst),
           "same_gpu_copy": lambda: dst.copy_(src),
           "pinned_h2d_copy": lambda: dst.copy_(host, non_blocking=True)}
    copies = [judged(name, *sm_util_while(device, op)) for name, op in ops.items()]
    by = {c["copy"]: c for c in copies}
    what = "SM utilization while each copy runs alone: an SM kernel copy, a same-GPU copy_, a pinned H2D copy"
    missing = [c for c in copies if c["sm_util"] is None]
    if missing:
        why = missing[0]["reason"] or "no reading"
        env = environment_limit(why)
        return SelfTest("copies_on_copy_engines", what, None, None, "fraction", "",
                        None if env else False, f"not run: environment: {why}" if env else why,
                        record={"copies": copies})
    ok = (by["sm_kernel_copy"]["sm_util"] >= SM_COPY_MIN_SM_UTIL
          and by["pinned_h2d_copy"]["sm_util"] <= CE_MAX_SM_UTIL)
    return SelfTest("copies_on_copy_engines", what, by["same_gpu_copy"]["sm_util"], None, "SM util fraction",
                    f"controls: SM copy >= {SM_COPY_MIN_SM_UTIL}, pinned H2D <= {CE_MAX_SM_UTIL}; "
                    f"a copy at <= {CE_MAX_SM_UTIL} is on a copy engine, above it on SMs", ok,
                    "; ".join(f"{c['copy']}: {c['sm_util']:.3f} ({c['moved_by']})" for c in copies),
                    record={"copies": copies})
