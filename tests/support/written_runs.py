"""Run directories written from given step times, in the store's own file formats: fixtures
for the readers of stored runs (compare, report), which read files and nothing else. The
measurement itself is tested on real runs elsewhere; these exist so that a statistic or a
store shape can be tested in milliseconds, with a known truth."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def write_run(store: Path, name: str, step_ms: np.ndarray, *, seed: int = 0, trainer: str = "ddp",
              world_size: int = 2, warmup: int = 2, busy_share: float = 0.8,
              contended: bool | None = False, host: dict | None = None, torch: str = "2.13.0+cpu",
              block_steps: int | None = None, group: str = "g") -> Path:
    """One complete run of `len(step_ms)` steps (the first `warmup` of them warm-up): each
    rank's step span lasts the step time and computes `busy_share` of it (thread CPU)."""
    run = store / name
    run.mkdir(parents=True)
    steps = len(step_ms)
    workload = {"name": "tiny", "version": 1, "steps": steps, "warmup": warmup}
    manifest = {"schema_version": 1, "run_id": name, "status": "complete", "created": name,
                "trainer": trainer, "workload": "tiny", "world_size": world_size, "seed": seed,
                "config": {"workload": workload}, "oversubscribed": False,
                "host": host or {"hostname": "box", "cpu_model": "cpu", "cpus": 2,
                                 "cuda_available": False},
                "packages": {"torch": torch}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "summary.json").write_text(json.dumps(
        {"contended": contended, "peak_memory_mb_per_rank": [500.0] * world_size}))
    if block_steps:
        (run / "pace.json").write_text(json.dumps({"group": group, "block_steps": block_steps}))
    t = 0
    for rank in range(world_size):
        spans, stats, t = [], [], 0
        for k, ms in enumerate(step_ms):
            dur = int(ms * 1e6)
            common = {"rank": rank, "step": k, "warmup": k < warmup, "runq_ns": 0}
            spans.append({**common, "name": "step", "kind": "step", "start_ns": t, "dur_ns": dur,
                          "cpu_ns": dur})
            busy = int(dur * busy_share)
            spans.append({**common, "name": "forward", "kind": "compute", "start_ns": t,
                          "dur_ns": busy, "cpu_ns": busy})
            stats.append({"rank": rank, "step": k, "loss": 1.0, "num_samples": 16, "num_targets": 64})
            t += dur + 1000
        (run / f"rank-{rank}.jsonl").write_text("".join(json.dumps(s) + "\n" for s in spans))
        (run / f"steps-rank-{rank}.jsonl").write_text("".join(json.dumps(s) + "\n" for s in stats))
    return run
