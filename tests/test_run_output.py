"""`fsbench run` and `fsbench sweep` end to end on `tiny`: what lands on disk and screen."""
import json

import pytest

from fsbench.cli import main
from fsbench.running.runner import SUMMARY_KEYS
from fsbench.running.store import read_json

pytestmark = pytest.mark.dist


def test_run_writes_manifest_timelines_and_summary(tmp_path, capsys):
    assert main(["run", "--workload", "tiny", "--world-size", "2", "--store", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("|")]
    assert "bubble %" in rows[0] and rows[2][:2] == ["ddp", "2"]
    (run_dir,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    manifest = read_json(run_dir / "manifest.json")
    assert manifest["status"] == "complete"
    assert manifest["world_size"] == 2 and manifest["trainer"] == "ddp"
    assert manifest["config"]["workload"]["name"] == "tiny"
    assert "torch" in manifest["packages"] and manifest["host"]["cpus"] >= 1
    for key in ("git_sha", "seed", "schema_version"):
        assert key in manifest
    summary = read_json(run_dir / "summary.json")
    for key in SUMMARY_KEYS:
        assert key in summary, key
    for key in ("bubble_ratio", "straggler_bubble_ratio", "exposed_comm_ratio", "load_imbalance"):
        assert 0.0 <= summary[key] <= 1.0, (key, summary[key])
    assert summary["sm_occupancy"] is None and summary["sm_occupancy_reason"]
    assert summary["steps"] == 4 and summary["steps_measured"] == 3
    for rank in (0, 1):
        lines = (run_dir / f"rank-{rank}.jsonl").read_text().splitlines()
        spans = [json.loads(x) for x in lines]
        assert {s["step"] for s in spans} == {0, 1, 2, 3}
        assert {"forward", "backward", "optimizer", "step", "input"} <= {s["name"] for s in spans}
        assert any(s["warmup"] for s in spans) and not all(s["warmup"] for s in spans)


def test_sweep_prints_one_row_per_trainer_and_world_size_with_ratio(tmp_path, capsys):
    assert main(["sweep", "--workload", "tiny", "--trainers", "ddp", "--world-sizes", "1,2",
                 "--store", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("|")]
    assert [r[:2] for r in rows[2:]] == [["ddp", "1"], ["ddp", "2"]]
    ratio = rows[0].index("throughput vs ddp")
    assert all(r[ratio] == "1.00x" for r in rows[2:])
    assert len([d for d in tmp_path.iterdir() if d.is_dir()]) == 2
    assert (tmp_path / "runs.parquet").exists() and (tmp_path / "runs.csv").exists()


def test_overridden_workloads_are_named_apart_from_their_preset(tmp_path, capsys):
    assert main(["run", "--workload", "tiny", "--steps", "3", "--set", "lengths=fixed:4",
                 "--store", str(tmp_path)]) == 0
    (run_dir,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    manifest = read_json(run_dir / "manifest.json")
    assert manifest["workload"] == "tiny+lengths=fixed:4"
    assert manifest["config"]["workload"]["steps"] == 3
    assert "-tiny+lengths_fixed_4-ddp-n1-" in run_dir.name
