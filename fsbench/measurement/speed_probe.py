"""A CPU-speed probe for speed-normalized step time on CPU runs.

On a shared VM the CPU's own speed wanders: a fixed matmul's thread CPU time moves by
about ±15% within seconds (scripts/machine_noise.py cpu-speed), so the median step time of
identical code differs by up to 30% between runs a minute apart, which hides a 10% slowdown
from any gate. Right after each step's start barrier, before the timed step begins (so no
metric of the step sees it), every CPU rank times a fixed burst of work, two 256x256
float32 matmuls on its own thread (about 0.8 ms).

Why after the barrier, all ranks at once: a virtual CPU's speed depends on what its
sibling hyperthread runs. Probed before the barrier, a rank probed while the other rank was
still computing or already waiting, which the code under test decides: an injected +11%
step time then read as 0.79x normalized (runs/gate_calibration_probe, 10 rounds). After
the barrier every rank probes while every other rank probes too. `step_time_norm` is then the step time over the probe's
time around that step: step time in units of "what this CPU does in a fixed burst right
now", which cancels the drift and keeps what the code under test changed.

Measured on the 2-core VM (40 s, a probe between ~100 ms bursts of model-like work): the
spread of 20-burst medians fell from 29% (wall time) to 4.8% (normalized).
"""
from __future__ import annotations

import numpy as np
import torch

PROBE_SPAN = "speed_probe"
# Probes of the steps k-2..k+2 (all ranks) set step k's speed: one 0.8 ms probe is noisy
# (CV ~12%), the drift it tracks moves over seconds.
WINDOW_STEPS = 5


class SpeedProbe:
    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.a = torch.randn(256, 256, generator=gen)
        self.tmp, self.out = torch.empty(256, 256), torch.empty(256, 256)

    def run(self) -> None:
        torch.mm(self.a, self.a, out=self.tmp)
        torch.mm(self.tmp, self.a, out=self.out)


def probe_ns_per_step(spans: "pd.DataFrame") -> "pd.Series | None":  # noqa: F821
    """The probe's thread CPU time (ns) around each step: the median of every rank's
    probes in a window of WINDOW_STEPS steps centred on it. None when the run has no probes
    (CUDA runs, or runs recorded before the probe existed). In a `compute=emulated` run a
    span's `cpu_ns` is its emulated compute (none in the probe) and its real thread CPU is
    `overhead_ns`: the probe's CPU is their sum in every run."""
    import pandas as pd  # analysis only: ranks import this module to probe, without pandas

    probes = spans[spans["name"] == PROBE_SPAN] if "name" in spans else spans.iloc[:0]
    cpu = probes["cpu_ns"] + (probes["overhead_ns"] if "overhead_ns" in probes else 0)
    probes = probes.assign(probe_cpu_ns=cpu)[cpu > 0]  # a probe measured no CPU: no speed
    if not len(probes):
        return None
    per_step = probes.groupby("step")["probe_cpu_ns"].apply(lambda s: s.to_numpy(dtype=float))
    steps = per_step.index.to_numpy()
    half = WINDOW_STEPS // 2
    out = {}
    for i, step in enumerate(steps):
        window = np.concatenate(per_step.iloc[max(0, i - half): i + half + 1].to_list())
        out[int(step)] = float(np.median(window))
    return pd.Series(out, name="probe_ns")
