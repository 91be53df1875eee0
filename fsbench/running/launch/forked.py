"""Ranks forked from a warm process instead of started cold. A cold CPU rank spends ~1.6 s
importing torch and ~1.2 s more importing torch._dynamo (DDP) before it does anything a
run measures; a sweep, a gate or the test suite starts hundreds of ranks, so on 2 cores
that was most of their time.

The local launcher asks multiprocessing's forkserver for ranks: one server per launching
process imports `fsbench.running.launch.warm` once (torch, the worker, the trainers'
frameworks), then forks a rank per request (fsbench.training.warm_start; the co-run
calibration forks its processes from the same server). A forked rank is still its own process with
its own process group and log, and nothing a run measures starts before the fork (the
worker's main runs in the child). What differs from a cold start is only what was
imported before the fork, so:

* the child's environment is the launcher's at launch time (`os.environ` is replaced),
  except what a module read at import: none of fsbench's rank code does, bar the clock
  skew of torchrun tests (torchrun starts its ranks itself), and the worker sets the
  run's thread count before the first op;
* a forked rank's peak RSS (the peak memory of a CPU run) counts the server's pages only
  where the rank maps them: a TorchRec rank of `tiny` read ~320 MB forked, ~360 MB cold.
  The manifest says `launch: forked|spawned`; compare runs started the same way;
* CUDA runs start cold all the same (`use_forked`): a forked child cannot use a CUDA
  context made before the fork, and their start-up is small beside a GPU run;
* `FSBENCH_LAUNCH=spawn` starts every rank cold, as before.
"""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

from fsbench.training.lifetime import die_with_parent, lead_own_group
from fsbench.training.warm_start import warm_context


def use_forked(device: str) -> bool:
    """Fork CPU ranks on Linux unless FSBENCH_LAUNCH=spawn asks for cold starts."""
    return (sys.platform == "linux" and device == "cpu"
            and os.environ.get("FSBENCH_LAUNCH", "fork") != "spawn")


def start_rank(run_dir: str, env: dict[str, str], log_path: str) -> "ForkedRank":
    proc = warm_context().Process(target=_rank_main, args=(run_dir, env, log_path), daemon=False)
    proc.start()
    return ForkedRank(proc)


def _rank_main(run_dir: str, env: dict[str, str], log_path: str) -> None:
    """The child: the rank's log as stdout and stderr, the launcher's environment, then
    the worker's main, as `python -m fsbench.running.launch.worker RUN_DIR` would run.
    It dies with the fork server (which dies with the launcher) and leads its own process
    group, which the launcher ends on every exit path (fsbench.training.lifetime)."""
    die_with_parent()
    lead_own_group()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # Line-buffered, as PYTHONUNBUFFERED gives a cold rank: a killed rank keeps its lines.
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.clear()
    os.environ.update(env)
    # multiprocessing made "forkserver" this process's default start method when it
    # started it; a cold rank has the platform's default, with which the input stage's
    # loader workers fork from the rank (and exit with it) instead of from a new server.
    multiprocessing.set_start_method(None, force=True)
    # Already imported by the server (warm.py): binding the name costs nothing here, and
    # importing it at the top would load torch into every launcher that imports this.
    from fsbench.running.launch import worker

    sys.exit(worker.main([run_dir]))


class ForkedRank:
    """A forked rank with the part of subprocess.Popen's interface the launcher uses."""

    def __init__(self, proc) -> None:
        self._proc = proc
        self.pid = proc.pid

    def poll(self) -> int | None:
        return self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self._proc.kill()

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
        return self._proc.exitcode
