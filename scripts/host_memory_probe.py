"""What large tensors cost on this host, behind two figures of the `local` simulator's
batch terms (fsbench/costmodel/batch_terms.py) and of the planner's scratch
(freescale_impl/window_kernels.py): the time to touch fresh 1 MB arrays, and the encoder's
time on fixed-length batches of the longest length at growing sizes against the same
samples' time at about 2,048 tokens (where cost(L) is measured). One thread.

    python scripts/host_memory_probe.py [--workload small] [--length 200]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
import torch

from fsbench.models import build_model
from fsbench.costmodel.batch_terms import TOKENS_PER_POINT
from fsbench.costmodel.timing import time_encoder_ms
from fsbench.workloads.generator import SyntheticBatches
from fsbench.workloads.presets import get_workload


def fresh_mb_ms(arrays: int = 6, repeats: int = 20) -> float:
    """Median ms to allocate and fill `arrays` fresh 1 MB arrays, per array."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        [np.ones(131072, np.int64) for _ in range(arrays)]
        times.append((time.perf_counter() - t0) / arrays)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="small")
    ap.add_argument("--length", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"fresh 1 MB array, allocated and filled: {fresh_mb_ms():.2f} ms")
    w = get_workload(args.workload)
    base, per_sample = None, None
    for n in sorted({max(1, TOKENS_PER_POINT // args.length), 16, 64, 128}):
        wn = dataclasses.replace(w, lengths=f"fixed:{args.length}", global_batch_size=n)
        model, batch = build_model(wn, seed=0), SyntheticBatches(wn, seed=0).global_batch(0)
        ms = time_encoder_ms(model, batch, repeats=3, warmup=1)
        if per_sample is None:
            base, per_sample = n, ms / n
        print(f"{n:4d} samples of {args.length}: {ms:7.1f} ms, {ms / n / per_sample:.2f}x "
              f"the per-sample time at {base} samples")


if __name__ == "__main__":
    main()
