import os
import sys
from pathlib import Path

import pytest

SUPPORT = Path(__file__).parent / "support"
sys.path.insert(0, str(SUPPORT))


@pytest.fixture
def rank_pythonpath(monkeypatch):
    """Let spawned ranks import the test-only trainers in tests/support."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(SUPPORT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
