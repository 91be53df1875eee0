"""Peak memory per rank is in every summary; sharded tables hold less than replicas."""
import dataclasses

import pytest

from fsbench.config import RunConfig
from fsbench.runner import peak_memory, run_once
from fsbench.workloads.presets import tiny

pytestmark = pytest.mark.dist


def test_every_rank_reports_its_peak_and_sharding_saves_memory(tmp_path):
    # Tables big enough (128k x 64 item rows: 32 MiB, and as much again for the gradient
    # and for Adagrad's state) that their replicas dominate a rank's memory.
    workload = dataclasses.replace(tiny(), item_vocab=128_000, steps=3, warmup=1,
                                   model=dataclasses.replace(tiny().model, dim=64))
    peaks = {}
    for trainer in ("ddp", "freescale"):
        _, summary = run_once(RunConfig(workload=workload, trainer=trainer, world_size=2),
                              tmp_path, timeout_s=240)
        assert summary["peak_memory_kind"] == "cpu_rss"
        assert len(summary["peak_memory_mb_per_rank"]) == 2
        assert all(v > 0 for v in summary["peak_memory_mb_per_rank"])
        assert summary["peak_memory_mb"] == max(summary["peak_memory_mb_per_rank"])
        peaks[trainer] = summary["peak_memory_mb"]
    # DDP: weights, gradient, Adagrad state and the all-reduce bucket of the whole table on
    # every rank (~4 x 31 MiB); FreeScale: half the rows and their state per rank.
    assert peaks["freescale"] < peaks["ddp"] - 40, peaks


def test_runs_without_memory_files_read_as_unknown(tmp_path):
    assert peak_memory(tmp_path) == {"peak_memory_mb": None, "peak_memory_mb_per_rank": None,
                                     "peak_memory_kind": None}
