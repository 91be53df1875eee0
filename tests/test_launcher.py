"""The local launcher: a failing rank ends the whole run quickly and is named."""
import subprocess
import sys
import time

import pytest

from fsbench.running.store import read_json


@pytest.mark.dist
def test_a_rank_that_raises_ends_the_run_nonzero_naming_the_rank(tmp_path, rank_pythonpath):
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "fsbench.cli", "run", "--workload", "tiny", "--world-size", "2",
         "--trainer", "trainers_for_tests:RaiseOnRank1", "--store", str(tmp_path)],
        capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr
    assert "rank 1 failed" in proc.stderr
    assert "ValueError: injected failure on rank 1" in proc.stderr
    assert elapsed < 60
    (run_dir,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    manifest = read_json(run_dir / "manifest.json")
    assert manifest["status"] == "failed" and "rank 1" in manifest["error"]
    assert not (run_dir / "summary.json").exists()
    # The failing rank still records its peak memory up to the crash.
    memory = read_json(run_dir / "memory-rank-1.json")
    assert memory["crashed"] is True and memory["cpu_rss_mb"] > 0
