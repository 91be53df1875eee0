"""The co-run calibration's processes (fsbench.costmodel.corun) never outlive it: one that
freezes is killed after CORUN_TIMEOUT_S and the calibration fails saying so, one that
fails is named by its exit code. A frozen co-run process held a CI run's output open
after its test timed out, so the run never ended (2026-12-07)."""
import psutil
import pytest

from fsbench.costmodel import corun
from fsbench.workloads.presets import get_workload


def _my_children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())}


def test_a_co_run_that_runs_past_its_bound_is_killed_and_says_so(monkeypatch):
    monkeypatch.setattr(corun, "CORUN_TIMEOUT_S", 3.0)
    before = _my_children()
    with pytest.raises(RuntimeError, match="still ran after 3 s; all were killed"):
        # 100,000 timed batches: far longer than the bound
        corun._time_in_processes("encoder", get_workload("tiny"), 64, 100_000, 2)
    server = {p.pid for p in psutil.Process().children() if "forkserver" in " ".join(p.cmdline())}
    left = _my_children() - before - server
    assert not left, f"co-run processes left behind: {left}"


def test_a_co_run_process_that_fails_is_reported_with_its_exit_code():
    with pytest.raises(RuntimeError, match=r"a process failed \(exit codes \[1, 1\]\)"):
        corun._time_in_processes("no-such-work", get_workload("tiny"), 64, 1, 2)
