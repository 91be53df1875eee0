"""Start a process that a test will Ctrl-C as a terminal starts its foreground job, however
the suite itself was started.

A shell without job control (`bash -c 'make test-dist > log &'`, a CI script that puts the
suite in the background, `nohup`) starts a background command with SIGINT and SIGQUIT
ignored, and an ignored signal stays ignored across fork and exec. Python then installs no
KeyboardInterrupt handler, so a test's SIGINT changes nothing: a sweep ran all three of its
runs (tests/test_sweep_resume.py, 2026-12-05), and a launcher trained on for minutes, failing
tests/test_process_lifetime.py after 120 s and contending every test after it (2026-12-07).
"""
from __future__ import annotations

import signal
from pathlib import Path


def sigint_default() -> None:
    """A `preexec_fn`: the child gets SIGINT's default disposition, as Ctrl-C finds a
    foreground job (Python then raises KeyboardInterrupt on it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ignores_sigint(pid: int) -> bool:
    """Whether process `pid` ignores SIGINT (Linux: the SigIgn mask of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGINT - 1) & 1)
    return False
