"""What instrumentation costs: step time with spans + monitor against a bare loop.

One process, a gloo world of one, the real trainer on the real workload. Blocks of steps
alternate between `instrumented` (timeline spans written each step, the monitor thread
sampling) and `bare` (spans disabled, no monitor), in ABBA order so drift on a shared
machine hits both alike; each step is timed from outside with perf_counter. The first
pair of blocks is warm-up and discarded.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fsbench.training import dist as fsdist
from fsbench.config import RunConfig, WorkloadConfig
from fsbench.running.launch.local import free_port
from fsbench.measurement.monitor import RankMonitor
from fsbench.measurement.timeline import Timeline, set_current
from fsbench.running.launch.worker import parse_options
from fsbench.training.trainer import resolve_trainer_class
from fsbench.workloads import make_batch_source


def _time_block(trainer, inputs, timeline: Timeline, monitor: RankMonitor | None) -> list[float]:
    set_current(timeline)
    if monitor:
        monitor.start()
    times = []
    for prepared in inputs:
        t0 = time.perf_counter()
        timeline.begin_step(prepared.step, warmup=False)
        with timeline.span("step"):
            trainer.step(iter([prepared]))
        timeline.flush()
        times.append(time.perf_counter() - t0)
    if monitor:
        monitor.stop()
    return times


def measure_overhead(workload: WorkloadConfig, trainer_name: str = "ddp", blocks: int = 8,
                     steps_per_block: int = 5, seed: int = 0) -> dict:
    """Median step time instrumented vs bare, and the relative overhead."""
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                       "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    torch.set_num_threads(1)
    ctx = fsdist.init_distributed("gloo", "cpu")
    try:
        run = RunConfig(workload=workload, trainer=trainer_name, world_size=1, seed=seed)
        cls = resolve_trainer_class(trainer_name)
        trainer = cls()
        trainer.options = parse_options(cls, trainer_name, {})
        source = make_batch_source(workload, seed)
        trainer.setup(ctx, run, source)
        # The same prepared inputs in both modes: input preparation is in neither.
        prepare = trainer.make_preparer()
        inputs = [prepare(s) for s in range(steps_per_block)]
        times: dict[str, list[float]] = {"bare": [], "instrumented": []}
        with tempfile.TemporaryDirectory() as tmp:
            for block in range(blocks):
                # ABBA: bare, instr, instr, bare, bare, instr, ...
                mode = ("bare", "instrumented")[(block + block // 2) % 2]
                instrumented = mode == "instrumented"
                timeline = Timeline(Path(tmp) / f"rank-0-{block}.jsonl", enabled=instrumented)
                monitor = RankMonitor(ctx.device) if instrumented else None
                block_times = _time_block(trainer, inputs, timeline, monitor)
                if block >= 2:  # the first two blocks (one of each mode) are warm-up
                    times[mode] += block_times
        trainer.close()
    finally:
        set_current(Timeline(None))
        fsdist.shutdown()
    bare, instr = statistics.median(times["bare"]), statistics.median(times["instrumented"])
    return {
        "workload": workload.name, "trainer": trainer_name,
        "steps_per_mode": len(times["bare"]),
        "bare_step_ms_median": bare * 1e3,
        "instrumented_step_ms_median": instr * 1e3,
        "overhead_ratio": instr / bare - 1.0,
    }
