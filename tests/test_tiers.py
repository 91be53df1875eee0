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


@pytest.fixture(scope="module")
def module_fixture_starting_ranks():
    """A fixture wider than a test is set up before function-scoped fixtures: the guard
    must already hold there."""
    try:
        proc = subprocess.Popen([sys.executable, "-m", "fsbench.running.launch.worker", "/nonexistent"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except RuntimeError as e:
        return str(e)
    proc.wait()
    return "started"


def test_a_module_fixture_of_an_unmarked_test_cannot_start_ranks(module_fixture_starting_ranks):
    assert "not marked dist" in module_fixture_starting_ranks
