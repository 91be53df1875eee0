"""A run launched by torchrun: two node agents on this machine (--nnodes 2, one rank
each, c10d rendezvous on localhost), the second with its clock 7 s off. The run
completes with one summary, and its step times do not see the offset."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from fsbench.measurement import metrics
from fsbench.measurement.timeline import read_timelines
from support.ports import free_port

pytestmark = pytest.mark.dist

SKEW_NS = 7_000_000_000


def launch_two_nodes(out, node1_env: dict, steps: int = 6) -> list[subprocess.CompletedProcess]:
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "fsbench-test",
           "--max-restarts", "0",
           "-m", "fsbench.cli", "run", "--workload", "tiny", "--trainer", "ddp",
           "--steps", str(steps), "--warmup", "1", "--store", str(out)]
    base = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(cmd, env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for env in ({}, node1_env)]
    done = []
    for p in procs:
        out_text, err_text = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(cmd, p.returncode, out_text, err_text))
    return done


def the_run(out):
    dirs = [d for d in out.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    """(the torchrun run with node 1's clock SKEW_NS off, the agents' outputs): launched
    once for the tests below, each of which works on its own copy."""
    out = tmp_path_factory.mktemp("torchrun")
    done = launch_two_nodes(out, {"FSBENCH_CLOCK_SKEW_NS": str(SKEW_NS)})
    assert all(d.returncode == 0 for d in done), [d.stderr[-2000:] for d in done]
    return the_run(out), done


def copy_of(run_dir, tmp_path):
    return shutil.copytree(run_dir, tmp_path / run_dir.name)


def test_two_torchrun_nodes_with_clock_offset(tmp_path, skewed):
    run_dir, done = copy_of(skewed[0], tmp_path), skewed[1]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["world_size"] == 2
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "bubble %" in done[0].stdout and "run stored in" in done[0].stderr  # rank 0 printed them
    # The measured offset undoes the injected one (to within the ping-pong's half round trip).
    clock = json.loads((run_dir / "clock-rank-1.json").read_text())
    assert abs(clock["offset_ns"] + SKEW_NS) <= max(clock["rtt_ns"], 2_000_000), clock
    # With offsets, steps take milliseconds; with raw stamps they would take seconds.
    assert summary["step_time_ms_median"] < 2_000, summary["step_time_ms_median"]
    assert summary["bubble_ratio"] < 0.9
    (run_dir / "clock-rank-1.json").unlink()
    raw = metrics.step_metrics(read_timelines(run_dir))
    assert raw["step_time_ms"].median() > SKEW_NS / 1e6 * 0.9  # the test could fail


def test_a_node_that_cannot_see_the_run_directory_sends_its_files(tmp_path):
    done = launch_two_nodes(tmp_path, {"FSBENCH_TEST_UNSHARED": "1"}, steps=4)
    assert all(d.returncode == 0 for d in done), [d.stderr[-2000:] for d in done]
    run_dir = next(d for d in tmp_path.iterdir() if d.is_dir() and ".node-rank-" not in d.name)
    for name in ("rank-1.jsonl", "steps-rank-1.jsonl", "clock-rank-1.json", "memory-rank-1.json"):
        assert (run_dir / name).exists(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["peak_memory_mb_per_rank"]) == 2


def test_summarize_completes_a_run_from_its_files(tmp_path, skewed, capsys):
    """From the skewed run: summarize must apply the clock offsets again to agree."""
    from fsbench.cli import main

    run_dir = copy_of(skewed[0], tmp_path)
    before = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").unlink()
    assert main(["summarize", str(run_dir)]) == 0
    after = json.loads((run_dir / "summary.json").read_text())
    assert after["step_time_ms_median"] == before["step_time_ms_median"]
    (run_dir / "steps-rank-1.jsonl").unlink()
    assert main(["summarize", str(run_dir)]) == 2
    assert "rank(s) 1" in capsys.readouterr().err
