"""The results store: atomic files, a runs table derived from run directories, and runs
killed at any point left readable and marked incomplete."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from fsbench.running import store

# Asserts nothing a test running beside it can move: the dist tier runs it two at a time.
pytestmark = pytest.mark.parallel_safe


def test_write_json_atomic_replaces_whole_files_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "x.json"
    store.write_json_atomic(path, {"a": 1})
    store.write_json_atomic(path, {"b": [1, 2]})
    assert store.read_json(path) == {"b": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def _rank_pids(run_dir):
    """Processes whose stdout is one of the run's rank logs: the ranks, whether started
    cold or forked from the warm server (whose command line is not the worker's)."""
    logs = {str(run_dir / f"rank-{r}.log") for r in range(2)}
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.readlink(proc / "fd" / "1") in logs:
                pids.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours to read
            pass
    return pids


@pytest.mark.dist
def test_sigkill_mid_run_leaves_store_readable_and_run_incomplete(tmp_path):
    from fsbench.cli import main

    args = ["run", "--workload", "tiny", "--world-size", "2", "--store", str(tmp_path)]
    # One complete run first: the table must keep it through the kill. (In this process,
    # whose fork server is warm: only the run to be killed needs a launcher of its own.)
    assert main(args) == 0
    before = set(tmp_path.iterdir())
    proc = subprocess.Popen([sys.executable, "-m", "fsbench.cli", *args, "--steps", "100000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    killed_dir = None
    while time.monotonic() < deadline and killed_dir is None:
        for d in set(tmp_path.iterdir()) - before:
            if d.is_dir() and (d / "rank-1.jsonl").exists() and (d / "rank-1.jsonl").stat().st_size > 2000:
                killed_dir = d
        time.sleep(0.1)
    assert killed_dir is not None, "the long run never started writing its timeline"
    assert _rank_pids(killed_dir)  # alive before the kill: the check below could fail
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)

    # The ranks die with their launcher (no orphans left training).
    deadline = time.monotonic() + 10
    while _rank_pids(killed_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _rank_pids(killed_dir)

    runs = store.load_runs(tmp_path, status=None)
    status = dict(zip(runs["run_dir"], runs["status"]))
    assert status[str(killed_dir)] == "incomplete"
    assert sorted(status.values()) == ["complete", "incomplete"]
    assert not (killed_dir / "summary.json").exists()
    # The table written after the first run is intact and the run's own files parse.
    table = pd.read_parquet(tmp_path / "runs.parquet")
    assert list(table["status"]) == ["complete"] and (table["schema_version"] == 1).all()
    assert store.read_json(killed_dir / "manifest.json")["status"] == "running"
    from fsbench.measurement.timeline import read_timelines
    assert len(read_timelines(killed_dir)) > 10
    # Refreshing now records the kill in the table too.
    assert "incomplete" in set(store.refresh_table(tmp_path)["status"])
