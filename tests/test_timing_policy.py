"""Timing tests never vanish: a contended machine makes them warn and judge only what
contention cannot move, and under CI=true fail naming the wait (tests/support/timing.py)."""
import os
import subprocess
import sys
import time

import pytest
from timing import ContendedMachineWarning, judged_under_contention, with_foreign_cpu_share


def test_a_contended_timing_test_warns_saying_what_it_did_not_judge(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.warns(ContendedMachineWarning, match="contended in every try: bubble not judged"):
        judged_under_contention("bubble not judged")


def test_under_ci_a_contended_timing_test_fails_naming_the_wait(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="under CI=true: CPU wait 14.0%"):
        judged_under_contention("CPU wait 14.0%")


def test_a_busy_neighbour_shows_as_foreign_cpu_and_sleeping_does_not():
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # the interpreter's start is the neighbour's, but let it settle
        _, busy = with_foreign_cpu_share(lambda: time.sleep(1.0))
    finally:
        hog.kill()
        hog.wait()
    # One spinning process on this machine's cores is 1/cores of its capacity.
    assert busy > 0.5 / (os.cpu_count() or 1)

    # Our own CPU is not foreign: spinning one core ourselves, ours plus the foreign share
    # cannot pass the machine's capacity (counted twice, it would on any machine).
    def spin() -> float:
        t0, c0 = time.monotonic(), time.process_time()
        while time.monotonic() - t0 < 1.0:
            pass
        return time.process_time() - c0
    own_s, foreign = with_foreign_cpu_share(spin)
    assert own_s / (1.0 * (os.cpu_count() or 1)) + foreign <= 1.05
