"""Timing tests never vanish in CI: a contended machine fails them there, skips them locally."""
import pytest
from timing import contended_after_retries


def test_contended_timing_test_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="under CI: busy"):
        contended_after_retries("busy")


def test_contended_timing_test_skips_locally_saying_why(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="busy"):
        contended_after_retries("busy")
