"""`fsbench micro planner`: how long a trainer's input stage takes to plan one global
batch at cluster sizes (e.g. 32,768 samples onto 256 ranks), and how good the plan is.

Lengths are drawn from the workload's length distribution (its preset, `--set
lengths=...` or a `hist:` file) with the generator's seeded draws; the trainer declares
its planners (`planners(workload, window)`: FreeScale's partitioners, alone and with the
look-ahead window). Each is run `warmup` times untimed, then timed `repeats` times with
`time.perf_counter` on one core (the process pinned to one CPU where Linux allows it);
the median and p90 are reported, with the plan's max rank cost over the lower bound
max(total / ranks, largest sample) (1.0 = no split of whole samples does better).
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator

import numpy as np

from fsbench.config import MAX_GLOBAL_BATCH, WorkloadConfig
from fsbench.errors import ConfigError
from fsbench.table import grid


def check_args(samples: int, ranks: int, repeats: int, window: int) -> None:
    for name, value, least in (("--samples", samples, 1), ("--ranks", ranks, 1),
                               ("--repeats", repeats, 1), ("--window", window, 1)):
        if value < least:
            raise ConfigError(f"{name}={value} must be >= {least}")
    if samples > MAX_GLOBAL_BATCH:
        raise ConfigError(f"--samples={samples} must be <= {MAX_GLOBAL_BATCH:,} (2**24, the "
                          "largest global batch a workload may have)")
    if samples < ranks:
        raise ConfigError(f"--samples={samples} must be >= --ranks={ranks} (every rank gets a sample)")


@contextlib.contextmanager
def one_core() -> Iterator[str]:
    """While open, this process runs on one CPU with one torch thread, as the input stage
    does (a loader worker, the rank thread at one thread a rank); yields which CPU, or why
    it could not pin. The previous affinity and thread count are restored. (Two OpenMP
    threads pinned to one core wait for each other's turns: torch.isin and unique took
    0.2-0.4 s a call, and the stage read 36 ms a step at 8 ranks instead of 10.)"""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        try:
            before = os.sched_getaffinity(0)
            cpu = min(before)
            os.sched_setaffinity(0, {cpu})
        except (AttributeError, OSError) as e:
            yield f"not pinned ({e.__class__.__name__})"
            return
        try:
            yield f"pinned to cpu {cpu}"
        finally:
            os.sched_setaffinity(0, before)
    finally:
        torch.set_num_threads(threads)


def draw_lengths(workload: WorkloadConfig, samples: int, batches: int, seed: int) -> list[np.ndarray]:
    from fsbench.workloads.distributions import parse_length_spec
    from fsbench.workloads.generator import step_rng

    dist = parse_length_spec(workload.lengths)
    return [dist.sample(step_rng(seed, k), samples, workload.max_seq_len) for k in range(batches)]


def time_planners(planners: dict, lengths: list[np.ndarray], ranks: int, repeats: int,
                  warmup: int = 2) -> list[dict]:
    """One row per planner: `planners` maps a name to (batches it plans, fn(lengths of those
    batches, ranks) -> plans), as a trainer's `planners(workload, window)` declares."""
    rows = []
    for name, (count, plan) in planners.items():
        batches = lengths[:count]
        for _ in range(warmup):
            plans = plan(batches, ranks)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            plans = plan(batches, ranks)
            times.append((time.perf_counter() - t0) * 1e3)
        rows.append({"planner": name, "batches": len(batches), "samples": int(sum(b.size for b in batches)),
                     "ranks": ranks, "median_ms": float(np.median(times)),
                     "p90_ms": float(np.quantile(times, 0.9)),
                     "median_ms_per_batch": float(np.median(times)) / len(batches),
                     "ratio_to_bound": max(p.ratio_to_bound for p in plans)})
    return rows


def format_table(record: dict) -> str:
    rows = [[r["planner"], str(r["samples"]), str(r["ranks"]), f"{r['median_ms']:.2f}",
             f"{r['p90_ms']:.2f}", f"{r['median_ms_per_batch']:.2f}", f"{r['ratio_to_bound']:.4f}"]
            for r in record["rows"]]
    head = (f"planner on {record['workload']} lengths ({record['lengths']}), {record['repeats']} "
            f"timed runs each after {record['warmup']} untimed, {record['core']}")
    return head + "\n" + grid(["planner", "samples", "ranks", "median ms", "p90 ms",
                               "ms per batch", "max / bound"], rows,
                              align=["left"] + ["right"] * 6)
