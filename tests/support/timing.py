"""What a timing test does when every try found the machine contended."""
from __future__ import annotations

import os

import pytest


def contended_after_retries(reason: str) -> None:
    """Locally: skip, saying why (a developer's busy laptop is not a failure). Under CI
    (CI=true): fail with the reason -- on a CI runner a skipped timing test would make the
    only end-to-end check of the numbers vanish without anyone noticing."""
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"contended in every try, under CI: {reason}", pytrace=False)
    pytest.skip(reason)
