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
