import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests must not flake on a busy 2-core CI machine: no per-example deadline
# (timing is for benchmarks), and a fixed example sequence (a failure reproduces).
settings.register_profile("fsbench", deadline=None, derandomize=True)
settings.load_profile("fsbench")

SUPPORT = Path(__file__).parent / "support"
sys.path.insert(0, str(SUPPORT))


@pytest.fixture
def rank_pythonpath(monkeypatch):
    """Let spawned ranks import the test-only trainers in tests/support."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(SUPPORT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory):
    """A real sweep, made once per session for the tests that only read it: `tiny`, ddp and
    freescale at 1 and 2 ranks."""
    from fsbench.cli import main

    out = tmp_path_factory.mktemp("tiny_sweep")
    assert main(["sweep", "--workload", "tiny", "--trainers", "ddp,freescale", "--world-sizes",
                 "1,2", "--out", str(out)]) == 0
    return out
