"""Known device time: `torch.cuda._sleep(cycles)` in milliseconds.

`torch.cuda._sleep` launches a kernel that spins on the SM clock for a number of cycles,
in one block (it occupies almost nothing). Its length in ms is calibrated with CUDA
events. What uses it: the CUDA self-tests (fsbench.measurement.selftests) and the
ground-truth model on CUDA (fsbench.models.synthetic), whose expected ratios take the
nominal lengths.

Hazard: the SM clock follows the load. An idle H100 clocks at about 345 MHz and a loaded
one at about 1,980 MHz, so cycles per ms measured right after the GPU idled can be off by
far more than the ground truth's 0.03 tolerance allows (a 10% clock error moves its mixed
cases by about 0.025). So the calibration first keeps the GPU spinning for WARM_MS, then
times rounds of sleeps until two consecutive medians agree within AGREE (`calibrate`);
`calibration` says how many rounds that took. A caller that needs the exact length of its
own kernels still measures them with events. NOT YET RUN ON A GPU.
"""
from __future__ import annotations

import statistics

WARM_MS = 200.0      # of back-to-back sleeps before timing: the clock ramps up under load
AGREE = 0.01         # two consecutive medians within 1%: the clock has settled
ROUND = 3            # sleeps per round (their median)
MAX_ROUNDS = 12      # then it gives up, saying so (`calibration["settled"]` False)
CYCLES = 20_000_000  # per timed sleep: ~10 ms at 2 GHz, far above launch latency


def calibrate(time_cycles, warm, cycles: int = CYCLES, agree: float = AGREE,
              max_rounds: int = MAX_ROUNDS) -> dict:
    """Cycles per ms, once the clock has settled: `warm()` first, then rounds of ROUND
    timings (`time_cycles(cycles)` -> ms) until a round's median is within `agree` of the
    previous round's. Returns {"cycles_per_ms", "rounds", "settled", "medians_ms"}."""
    warm()
    medians: list[float] = []
    while len(medians) < max_rounds:
        medians.append(statistics.median(time_cycles(cycles) for _ in range(ROUND)))
        if len(medians) >= 2 and abs(medians[-1] / medians[-2] - 1) <= agree:
            break
    settled = len(medians) >= 2 and abs(medians[-1] / medians[-2] - 1) <= agree
    return {"cycles_per_ms": cycles / medians[-1], "rounds": len(medians), "settled": settled,
            "medians_ms": medians}


class SleepKernel:
    """`torch.cuda._sleep` in milliseconds on `device`, calibrated warm with CUDA events."""

    def __init__(self, device) -> None:
        import torch

        self.torch, self.device = torch, device
        self.launch_cycles(CYCLES)  # the first launch loads the kernel
        self.torch.cuda.synchronize(device)  # note: a sync point, so the warm-up is timed alone
        self.calibration = calibrate(lambda c: self.time_ms(lambda: self.launch_cycles(c)), self.warm)
        self.cycles_per_ms = self.calibration["cycles_per_ms"]

    def warm(self, ms: float = WARM_MS) -> None:
        """Keep the GPU spinning for `ms` of event time, in sleeps of CYCLES: counted in
        time, not cycles, since the clock is what is still ramping."""
        spun = 0.0
        while spun < ms:
            spun += self.time_ms(lambda: self.launch_cycles(CYCLES))

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
