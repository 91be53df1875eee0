"""Known device time: `torch.cuda._sleep(cycles)` in milliseconds.

`torch.cuda._sleep` launches a kernel that spins on the SM clock for a number of cycles,
in one block (it occupies almost nothing). Its length in ms is calibrated once with CUDA
events. What uses it: the CUDA self-tests (fsbench.measurement.selftests) and the
ground-truth model on CUDA (fsbench.models.synthetic). Hazard: the SM clock can change
after calibration (boost, power capping), so a caller that needs the exact length
measures it with events around its own kernels; the calibration only chooses how many
cycles to ask for. NOT YET RUN ON A GPU.
"""
from __future__ import annotations

import statistics


class SleepKernel:
    """`torch.cuda._sleep` in milliseconds on `device`, calibrated with CUDA events."""

    def __init__(self, device) -> None:
        import torch

        self.torch, self.device = torch, device
        cycles = 20_000_000
        self.launch_cycles(cycles)  # warm-up: the first launch loads the kernel
        times = []
        for _ in range(3):
            times.append(self.time_ms(lambda: self.launch_cycles(cycles)))
        self.cycles_per_ms = cycles / statistics.median(times)

    def launch_cycles(self, cycles: int) -> None:
        self.torch.cuda._sleep(int(cycles))

    def launch(self, ms: float) -> None:
        """Queue a kernel that spins about `ms` on the current stream (no sync)."""
        self.launch_cycles(ms * self.cycles_per_ms)

    def time_ms(self, launch) -> float:
        """Event time of the work `launch` queues on the current stream. note: a CPU-GPU
        sync point (the truth is read at once)."""
        a = self.torch.cuda.Event(enable_timing=True)
        b = self.torch.cuda.Event(enable_timing=True)
        a.record()
        launch()
        b.record()
        b.synchronize()
        return a.elapsed_time(b)


_calibrated: dict = {}


def sleep_kernel(device) -> SleepKernel:
    """One calibration per device per process."""
    key = str(device)
    if key not in _calibrated:
        _calibrated[key] = SleepKernel(device)
    return _calibrated[key]
