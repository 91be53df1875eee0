"""Ground-truth compute: a model whose cost is known exactly.

With `compute=synthetic` every target token costs `us_per_token` of thread CPU time (a
third in forward, the rest in backward), one chosen rank can be made slower, every rank
can be made to wait before its gradient collective, and every rank can stall in its
optimizer step. The expected step time, bubble, its four causes and load imbalance then
follow in closed form
(`expected_ratios`), and a measured run can be checked against them: the proof that the
harness's spans, clocks and metrics mean what they say.

The spin burns *thread CPU time* rather than wall time, so a rank's cost stays exact when
ranks share cores; the delay *sleeps*, so it shows as idle time, as a slow network would,
and is recorded as a collective in flight (a `flight`), as a slow network's transfer would
be. The optimizer stall sleeps with no collective in flight (a host sync, a file read):
blocked time that is other idle, not communication.

On CUDA the same costs are device time, so that the GPU's busy measure (the profiler's
compute kernels) is what is checked: the spin is a sleep kernel of that length on the
compute stream, which the host then waits for (the CPU spin's thread is busy that long
too); the delay is a sleep kernel on a stream of its own, launched as communication
(fsbench.measurement.comm_annotation.comm_launch) and flown as a flight ending on that stream,
which the compute stream and the host wait for. Every wait here is a CPU-GPU sync point
by design: the closed form adds the parts up. NOT YET RUN ON A GPU.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from fsbench.config import SyntheticComputeConfig, WorkloadConfig
from fsbench.measurement.device_sleep import sleep_kernel
from fsbench.measurement.comm_annotation import comm_launch
from fsbench.measurement.timeline import current
from fsbench.workloads.batch import JaggedBatch

FORWARD_SHARE = 1 / 3


def spin_cpu(ns: float) -> None:
    """Busy-loop until this thread has used `ns` more nanoseconds of CPU time."""
    end = time.thread_time_ns() + int(ns)
    while time.thread_time_ns() < end:
        pass


def spin(ns: float, device: torch.device) -> None:
    """`ns` of compute: thread CPU time on CPU; on CUDA a sleep kernel of that length on
    the current stream, waited for. note: a CPU-GPU sync point (module docstring)."""
    if device.type != "cuda":
        spin_cpu(ns)
        return
    sleep_kernel(device).launch(ns / 1e6)
    torch.cuda.current_stream(device).synchronize()


_delay_streams: dict = {}


def delay_collective(ns: float, device: torch.device) -> None:
    """A collective that takes `ns`, in flight while the rank waits for it: a sleep on
    the host (CPU), or a sleep kernel on a communication stream (CUDA; module docstring)."""
    flight = current().in_flight("synthetic.comm_delay")
    if device.type != "cuda":
        time.sleep(ns / 1e9)
        flight.finish()
        return
    side = _delay_streams.setdefault(str(device), torch.cuda.Stream(device))
    compute = torch.cuda.current_stream(device)
    side.wait_stream(compute)
    with torch.cuda.stream(side), comm_launch("synthetic.comm_delay"):
        sleep_kernel(device).launch(ns / 1e6)
    flight.finish_on(side)
    compute.wait_stream(side)
    side.synchronize()  # note: a CPU-GPU sync point: the host waits as for a slow network


def rank_cost_ns(num_targets: int, rank: int, cfg: SyntheticComputeConfig) -> float:
    factor = 1.0 + cfg.slow_factor if rank == cfg.slow_rank else 1.0
    return num_targets * cfg.us_per_token * 1e3 * factor


class _Spin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight, cost_ns: float, delay_ns: float):
        spin(cost_ns * FORWARD_SHARE, weight.device)
        ctx.cost_ns, ctx.delay_ns, ctx.device = cost_ns, delay_ns, weight.device
        return weight.sum() + 1.0

    @staticmethod
    def backward(ctx, grad):
        spin(ctx.cost_ns * (1 - FORWARD_SHARE), ctx.device)
        # The gradient collective (DDP's all-reduce hook) fires once this returns, so
        # a delay here delays every rank's collective by the same amount: a transfer
        # that takes that long, in flight while the rank waits.
        if ctx.delay_ns > 0:
            delay_collective(ctx.delay_ns, ctx.device)
        return grad.expand(1), None, None


class SpinModel(nn.Module):
    """Stands in for the *reference model* (not for anything measured): one parameter, a
    loss normalized like the real one (this batch's targets over the global count)."""

    def __init__(self, workload: WorkloadConfig) -> None:
        super().__init__()
        self.cfg = workload.synthetic
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, batch: JaggedBatch) -> torch.Tensor:
        rank = dist.get_rank() if dist.is_initialized() else 0
        cost = rank_cost_ns(batch.num_targets, rank, self.cfg)
        out = _Spin.apply(self.weight, cost, self.cfg.comm_delay_ms * 1e6)
        return out * (batch.num_trained / batch.global_num_targets)  # cost by tokens, share by targets


def expected_ratios(tokens_per_rank: list[int], cfg: SyntheticComputeConfig,
                    input_inline: bool = True) -> dict[str, float]:
    """Closed-form metrics of one step of the synthetic model with a final collective:
    busy_r = c_r, T = input delay + max_r c_r + comm delay + optimizer stall. The input
    delay is on the step's critical path when inputs are prepared inline (input_workers=0);
    a prefetching worker hides it when it is shorter than the step. Every rank stalls in
    its optimizer at once, after the gradient collective: other idle on every rank."""
    busy = [rank_cost_ns(t, r, cfg) for r, t in enumerate(tokens_per_rank)]
    n, bmax = len(busy), max(busy)
    input_ns = cfg.input_delay_ms * 1e6 if input_inline else 0.0
    stall_ns = cfg.optimizer_sleep_ms * 1e6
    t = input_ns + bmax + cfg.comm_delay_ms * 1e6 + stall_ns
    bubble = sum(t - b for b in busy) / (n * t)
    straggler = sum(bmax - b for b in busy) / (n * t)
    return {
        "step_time_ms": t / 1e6,
        "bubble_ratio": bubble,
        "straggler_bubble_ratio": straggler,
        "exposed_comm_ratio": cfg.comm_delay_ms * 1e6 / t,
        "input_stall_ratio": input_ns / t,
        "other_idle_ratio": stall_ns / t,
        "load_imbalance": sum(bmax - b for b in busy) / (n * bmax),
    }
