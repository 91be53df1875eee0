"""The two noise figures the gates' thresholds rest on (results/gate_calibration_cpu.md,
docs/ci.md), measured on this machine:

  cpu-speed   thread CPU time of a fixed 256x256 matmul loop (40 products), every 0.5 s
              for --seconds: how much the CPU's own speed wanders (min, p10, p50, p90, max)
  bench       the pytest-benchmark suite run --repeats times: spread of each benchmark's
              median (max/min - 1), which sets --benchmark-compare-fail

    python scripts/machine_noise.py cpu-speed [--seconds 60]
    python scripts/machine_noise.py bench [--repeats 3]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def cpu_speed(seconds: float) -> None:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    values, end = [], time.time() + seconds
    while time.time() < end:
        t = time.thread_time_ns()
        for _ in range(40):
            a @ a
        values.append((time.thread_time_ns() - t) / 1e6)
        time.sleep(0.5)
    q = np.percentile(values, [0, 10, 50, 90, 100])
    print(f"{len(values)} probes, ms: min {q[0]:.2f} p10 {q[1]:.2f} p50 {q[2]:.2f} "
          f"p90 {q[3]:.2f} max {q[4]:.2f}")


def bench(repeats: int) -> None:
    store = tempfile.mkdtemp(prefix="fsbench-bench-noise-")
    for _ in range(repeats):
        subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-q", "--benchmark-only",
                        f"--benchmark-storage={store}", "--benchmark-autosave", "-p", "no:cacheprovider"],
                       check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{store}/*/*.json"))]
    for b in runs[0]["benchmarks"]:
        meds = [next(x["stats"]["median"] for x in r["benchmarks"] if x["name"] == b["name"]) for r in runs]
        print(f"{b['name']:58s} spread of medians {100 * (max(meds) / min(meds) - 1):.1f}%")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probe", choices=["cpu-speed", "bench"])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cpu_speed(args.seconds) if args.probe == "cpu-speed" else bench(args.repeats)
