"""The fast tier stays fast: a test without the `dist` mark cannot start ranks."""
import subprocess
import sys

import pytest


def test_an_unmarked_test_cannot_start_ranks():
    with pytest.raises(RuntimeError, match="not marked dist"):
        subprocess.Popen([sys.executable, "-m", "fsbench.running.launch.worker", "/nonexistent"])
    with pytest.raises(RuntimeError, match="not marked dist"):
        subprocess.run([sys.executable, "-m", "fsbench.cli", "run", "--workload", "tiny"])
    # Other programs run as usual.
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0


@pytest.mark.dist
def test_a_dist_test_may_start_them():
    proc = subprocess.run([sys.executable, "-m", "fsbench.cli", "run", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "--world-size" in proc.stdout
