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


def test_every_nightly_test_is_also_a_dist_test():
    """The fast tier (-m "not dist") never runs a nightly test, and the dist tier leaves
    them to the scheduled run (-m "dist and not nightly"): each nightly test is marked
    both, which the markers of every collected test show."""
    import ast
    from pathlib import Path

    nightly = []
    for path in Path(__file__).parent.glob("test_*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                marks = {ast.unparse(d) for d in node.decorator_list}
                if "pytest.mark.nightly" in marks:
                    nightly.append(node.name)
                    assert "pytest.mark.dist" in marks, f"{path.name}::{node.name} is nightly, not dist"
    assert "test_bisect_finds_the_planted_slow_commit" in nightly


def test_no_parallel_safe_file_times_anything():
    """`parallel_safe` files run two at a time in the dist tier (Makefile): none of them may
    use the timing helpers (tests/support/timing.py), which judge a run by how quiet the
    machine was."""
    import re
    from pathlib import Path

    marked = [p for p in Path(__file__).parent.glob("test_*.py")
              if re.search(r"^pytestmark = .*parallel_safe", p.read_text(), re.M)]
    assert len(marked) >= 10
    for path in marked:
        text = path.read_text()
        assert "from timing import" not in text and "first_quiet_try" not in text, path.name
