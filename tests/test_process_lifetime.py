"""No process outlives its run (issue 44). A run at 2 ranks, with a loader worker per rank,
is started in its own session and ended each way a run can end; 5 s after the
launcher exited, no process of that session is alive (launcher, fork server, resource
tracker, ranks, loader workers). A rank that raises also ends the run quickly, named. Before the fix, Ctrl-C, SIGTERM and a rank's SIGKILL
each left the loader workers (and with them the resource tracker) alive for good."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from foreground import ignores_sigint, sigint_default

# Asserts nothing a test running beside it can move: the dist tier runs it two at a time.
pytestmark = [pytest.mark.dist, pytest.mark.parallel_safe]

GRACE_S = 5.0


def session_processes(sid: int) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command) of every live process of session `sid` (/proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        state, ppid, session = fields[0], int(fields[1]), int(fields[3])
        if session == sid and state != "Z":
            found[int(entry.name)] = (ppid, cmd.strip())
    return found


def _start(store: Path, workload: str, *more: str, launch: str = "fork") -> subprocess.Popen:
    argv = [sys.executable, "-m", "fsbench.cli", "run", "--workload", workload, "--world-size", "2",
            "--input-workers", "1", "--store", str(store), *more]
    log = open(store.parent / f"{store.name}.log", "w")
    # SIGINT's default disposition, as Ctrl-C finds a terminal's foreground job: a suite
    # started in the background inherits it ignored (tests/support/foreground.py).
    return subprocess.Popen(argv, start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "FSBENCH_LAUNCH": launch}, preexec_fn=sigint_default)


def _wait_for_steps(store: Path, launcher: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Until rank 1 recorded a step: every process of the run exists by then."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        steps = list(store.glob("*/steps-rank-1.jsonl"))
        if steps and steps[0].stat().st_size > 0:
            return
        assert launcher.poll() is None, "the run ended before it was stopped"
        time.sleep(0.1)
    raise AssertionError("rank 1 recorded no step in time")


def _ranks(processes: dict[int, tuple[int, str]], launcher: int) -> list[int]:
    """The ranks: children of the fork server (itself a child of the launcher), or with
    FSBENCH_LAUNCH=spawn the launcher's own children running the worker."""
    servers = {pid for pid, (ppid, cmd) in processes.items() if ppid == launcher and "forkserver" in cmd}
    return sorted(pid for pid, (ppid, cmd) in processes.items() if ppid in servers or (
        ppid == launcher and "fsbench.running.launch.worker" in cmd))


def _kill_session(sid: int) -> dict[int, tuple[int, str]]:
    """SIGKILL every process of session `sid`; returns what was alive."""
    left = session_processes(sid)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


@pytest.fixture
def start():
    """_start, and at teardown, whatever failed, every process of the runs it started
    SIGKILLed: a launcher that did not stop must not train on beside the tests after this
    one (in CI, one did for minutes and every later timing test read contended)."""
    launchers = []

    def go(*args, **kwargs) -> subprocess.Popen:
        launchers.append(_start(*args, **kwargs))
        return launchers[-1]
    yield go
    for launcher in launchers:
        _kill_session(launcher.pid)
        launcher.wait(timeout=30)


def _left_after(launcher: subprocess.Popen) -> dict[int, tuple[int, str]]:
    launcher.wait(timeout=120)
    deadline = time.monotonic() + GRACE_S
    left = session_processes(launcher.pid)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = session_processes(launcher.pid)
    _kill_session(launcher.pid)  # never leave them to the next test
    return left


def _status(store: Path) -> str:
    (manifest,) = store.glob("*/manifest.json")
    return json.loads(manifest.read_text())["status"]


@pytest.mark.parametrize("how, code, status, launch", [
    ("SIGINT to the launcher", 130, "interrupted", "fork"),
    ("SIGTERM to the launcher", 143, "interrupted", "fork"),
    ("SIGKILL to a rank", 1, "failed", "fork"),
    ("SIGKILL to the launcher", -9, "incomplete", "fork"),
    ("SIGTERM to the launcher", 143, "interrupted", "spawn"),
    ("SIGKILL to the launcher", -9, "incomplete", "spawn"),
])
def test_nothing_of_a_stopped_run_is_alive_5_s_after_its_launcher(how, code, status, launch, tmp_path, start):
    store = tmp_path / "store"
    # `small`: a step's prepared input (~0.3 MB) is more than a pipe holds, so a loader
    # worker whose rank vanished blocks on its queue for good (as it did before the fix).
    launcher = start(store, "small", "--set", "steps=4000", launch=launch)
    _wait_for_steps(store, launcher)
    running = session_processes(launcher.pid)
    ranks = _ranks(running, launcher.pid)
    # launcher, 2 ranks, a loader worker each; forked: the fork server and its tracker too
    assert len(ranks) == 2 and len(running) >= (7 if launch == "fork" else 5), running
    assert not ignores_sigint(launcher.pid), "the launcher ignores SIGINT: Ctrl-C cannot reach it"
    if how == "SIGKILL to a rank":
        os.kill(ranks[1], signal.SIGKILL)
    else:
        launcher.send_signal({"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM,
                              "SIGKILL": signal.SIGKILL}[how.split()[0]])
    left = _left_after(launcher)
    assert not left, f"{how}: alive {GRACE_S:.0f} s after the launcher exited: {left}"
    assert launcher.returncode == code
    if status == "incomplete":  # its launcher could record nothing: the store says so
        from fsbench.running.store import run_status

        (manifest,) = store.glob("*/manifest.json")
        assert run_status(json.loads(manifest.read_text())) == "incomplete"
    else:
        assert _status(store) == status
    if how == "SIGKILL to a rank":
        said = (tmp_path / "store.log").read_text()
        assert "rank 1 failed (exit code -9): killed by SIGKILL" in said, said[-500:]


def test_nothing_of_a_run_is_alive_5_s_after_it_ended(tmp_path, start):
    store = tmp_path / "store"
    launcher = start(store, "tiny")
    left = _left_after(launcher)
    assert not left, f"alive {GRACE_S:.0f} s after the launcher exited: {left}"
    assert launcher.returncode == 0 and _status(store) == "complete"


def test_a_rank_that_raises_ends_the_run_quickly_naming_it_and_nothing_is_left(tmp_path, rank_pythonpath, start):
    """A failing rank must not hang the others (they would block in a collective until the
    process group's timeout): the launcher stops the run at once, exits 1 naming the rank
    and its error, keeps the run marked failed with the rank's memory peak up to the
    crash, and 5 s later nothing of it is alive."""
    store = tmp_path / "store"
    started = time.monotonic()
    launcher = start(store, "tiny", "--trainer", "trainers_for_tests:RaiseOnRank1")
    launcher.wait(timeout=120)
    elapsed = time.monotonic() - started
    left = _left_after(launcher)
    assert not left, f"alive {GRACE_S:.0f} s after the launcher exited: {left}"
    said = (tmp_path / "store.log").read_text()
    assert launcher.returncode == 1 and "rank 1 failed" in said, said[-1000:]
    assert "ValueError: injected failure on rank 1" in said and elapsed < 60
    (run_dir,) = [d for d in store.iterdir() if d.is_dir()]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "rank 1" in manifest["error"]
    assert not (run_dir / "summary.json").exists()
    memory = json.loads((run_dir / "memory-rank-1.json").read_text())
    assert memory["crashed"] is True and memory["cpu_rss_mb"] > 0
