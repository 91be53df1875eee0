"""Processes that must not outlive the process that started them.

A run starts a tree: the launcher, its rank fork server, the ranks, each rank's input
loader workers. Whatever ends the run (success, a rank raising, a rank killed by the OOM
killer, Ctrl-C, SIGTERM, the launcher itself killed), nothing of that tree may stay
behind: a leaked rank keeps its GPU memory, and on a CI runner leaked processes pile up
run after run. Two mechanisms, because neither covers every case alone:

* every child asks Linux to SIGKILL it when its parent dies (`die_with_parent`): covers a
  parent that is killed and gets no chance to clean up (SIGKILL, the OOM killer);
* each rank leads its own process group, which its loader workers join, and the launcher
  ends the whole group on every exit path (fsbench.running.launch.local): covers a rank
  that exits or is killed while its workers still run.
"""
from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(expected_parent: int | None = None) -> None:
    """In a child, before it does its work: be SIGKILLed when the parent dies. Linux sends
    the signal when the thread that forked this process ends, which for every process
    here is its parent's main thread. `expected_parent`: the parent's pid as the parent
    knew it; if the parent already died before this call, the child ends now (the signal
    would never come). Elsewhere than Linux: nothing (orphans are then possible after a
    SIGKILL of their parent)."""
    if sys.platform != "linux":
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        return
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), signal.SIGKILL)


def lead_own_group() -> None:
    """Make this process (a rank) the leader of a new process group that its children
    inherit, so the launcher can end the rank and everything it started at once."""
    try:
        os.setpgid(0, 0)
    except OSError:  # not permitted (already a session leader): the launcher then signals the rank alone
        pass


def loader_worker_init(rank_pid: int, worker_id: int) -> None:
    """A DataLoader `worker_init_fn` (bound to the rank's pid with functools.partial): the
    worker dies with its rank, whatever kills the rank."""
    die_with_parent(rank_pid)
