"""No host sync between FreeScale's forward and backward (issue 50, "latency paid once"):
with exchanged routing every size a step's exchanges need came a step ahead, in one
control message read at the step's start (freescale_impl.request_pipeline).

On 2 gloo ranks, with priority on and off and 3 chunks, every call FreeScale's step code
makes that would make a GPU's host wait (tests/support/host_syncs.py: `.cpu()`,
`.tolist()`, a boolean mask...) is recorded with its time. In every step but the first
(the pipeline's start) none falls between the forward's first span and the backward's
end, and the step's control message is read on the host before its forward: the recorder
sees that read, so it is live."""
from __future__ import annotations

import dataclasses
import json

import pytest

from fsbench.config import RunConfig
from fsbench.measurement.timeline import read_timelines
from fsbench.running.runner import run_once
from fsbench.workloads.presets import tiny

pytestmark = pytest.mark.dist
STEPS = 8


@pytest.mark.parametrize("priority", ["on", "off"])
def test_no_host_sync_between_forward_and_backward(priority, tmp_path, rank_pythonpath, monkeypatch):
    monkeypatch.setenv("FSBENCH_TEST_DUMP", str(tmp_path))
    workload = dataclasses.replace(tiny(), steps=STEPS, warmup=1, lengths="yelp", global_batch_size=12)
    run = RunConfig(workload=workload, trainer="trainers_for_tests:HostSyncFreeScale", world_size=2,
                    seed=3, trainer_options={"routing": "exchanged", "chunks": "3", "priority": priority})
    run_dir, _ = run_once(run, tmp_path / "runs", timeout_s=300)
    spans = read_timelines(run_dir)
    for rank in range(2):
        found = json.loads((tmp_path / f"syncs-rank-{rank}.json").read_text())
        s = spans[spans["rank"] == rank]
        for k in range(1, STEPS):
            step = s[s["step"] == k]
            fwd_start = step[step["name"] == "forward"]["start_ns"].min()
            backward = step[step["name"] == "backward"]
            bwd_end = (backward["start_ns"] + backward["dur_ns"]).max()
            syncs = [(call, where) for at, call, where, t in found if at == k]
            inside = [(call, where) for at, call, where, t in found if at == k and fwd_start <= t <= bwd_end]
            assert inside == [], (rank, k, inside)
            if k < STEPS - 2:  # a control message was sent the step before
                before = [w for at, call, w, t in found if at == k and t < fwd_start and call == "cpu"]
                assert any(w.startswith("request_pipeline.py") for w in before), (rank, k, syncs)
