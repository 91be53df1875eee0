"""Local launcher: N ranks on this machine, each its own process with the environment
torchrun would give it: CPU ranks forked from a warm server (fsbench.running.launch.forked,
which says what that changes), others a fresh Python process.

A rank that fails must not hang the others (they would block in a collective until the
process-group timeout): the launcher watches every rank, and at the first non-zero exit
stops the rest and raises `RankFailed` naming the rank and its error.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fsbench.running.launch.forked import start_rank, use_forked
from fsbench.training.lifetime import die_with_parent, lead_own_group

_POLL_S = 0.05
_GRACE_S = 5.0


class RankFailed(RuntimeError):
    def __init__(self, rank: int, returncode: int, detail: str) -> None:
        self.rank, self.returncode, self.detail = rank, returncode, detail
        super().__init__(f"rank {rank} failed (exit code {returncode}): {detail}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world_size: int, port: int, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "RANK": str(rank), "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size),
        # Must be set before the rank imports torch: OpenMP reads it once at load.
        "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
    })
    return env


def _error_detail(run_dir: Path, rank: int) -> str:
    err = run_dir / f"error-rank-{rank}.txt"
    if err.exists():
        return err.read_text().splitlines()[0]
    log = run_dir / f"rank-{rank}.log"
    tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
    return tail[0] if tail else "no error message (see rank log)"


def _error_time(run_dir: Path, rank: int) -> float:
    err = run_dir / f"error-rank-{rank}.txt"
    return err.stat().st_mtime_ns if err.exists() else float("inf")


def _signal_group(p, sig: int) -> None:
    """Signal rank `p` and every process of its group (its loader workers), even after the
    rank itself exited (a worker can outlive it); a group that is gone is no error."""
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:  # no member left, or the rank had no group of its own yet
        if p.poll() is None:
            p.send_signal(sig)
    except PermissionError:  # the rank did not lead a group (lead_own_group failed)
        p.send_signal(sig)


def _stop(procs: list) -> None:  # Popen or ForkedRank
    """End every rank and whatever it started: SIGTERM to each rank's group, up to
    _GRACE_S for them to exit, then SIGKILL to every group (also those of ranks that
    exited: leftover workers). Ctrl-C while waiting skips the grace."""
    for p in procs:
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
    try:
        deadline = time.monotonic() + _GRACE_S
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:  # also on a second Ctrl-C: nothing of the run may stay behind
        for p in procs:
            _signal_group(p, signal.SIGKILL)
        for p in procs:
            p.wait()


def _rank_preexec() -> None:
    """A cold rank, between fork and exec: dies with the launcher, leads its own group."""
    die_with_parent()
    lead_own_group()


def launch_local(run_dir: Path, world_size: int, threads_per_rank: int = 1,
                 timeout_s: float | None = None, device: str = "cpu") -> None:
    """Run `fsbench.running.launch.worker RUN_DIR` on `world_size` local ranks; raise on failure."""
    port = free_port()
    procs = []
    try:
        for rank in range(world_size):
            env = rank_env(rank, world_size, port, threads_per_rank)
            if use_forked(device):
                procs.append(start_rank(str(run_dir), env, str(run_dir / f"rank-{rank}.log")))
                continue
            with open(run_dir / f"rank-{rank}.log", "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "fsbench.running.launch.worker", str(run_dir)],
                    # stdin: nothing to read, and a rank in its own process group that
                    # read the terminal would be stopped (SIGTTIN)
                    env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    preexec_fn=_rank_preexec if sys.platform == "linux" else None,
                ))
        start = time.monotonic()
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                # Several ranks may have died: the one whose error was written first is
                # the cause, the others usually failed because that peer vanished.
                time.sleep(0.2)  # let the failing rank finish writing its error file
                # ... and look again: the rank that caused it may exit just after a peer
                # that lost its connection to it.
                codes = [p.poll() for p in procs]
                failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                # A rank killed by a signal (the OOM killer's SIGKILL) wrote no error: it is
                # the cause, the others lost their peer.
                killed = [(r, c) for r, c in failed if c < 0]
                if killed:
                    rank, code = killed[0]
                    raise RankFailed(rank, code, f"killed by {signal.Signals(-code).name} (the "
                                     "out-of-memory killer sends SIGKILL when memory runs out)")
                rank, code = min(failed, key=lambda rc: _error_time(run_dir, rc[0]))
                raise RankFailed(rank, code, _error_detail(run_dir, rank))
            if all(c == 0 for c in codes):
                return
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise TimeoutError(f"run did not finish within {timeout_s:.0f} s")
            time.sleep(_POLL_S)
    finally:
        _stop(procs)
