"""Where a command may write: checked before it measures or reads anything, so that a bad
`--store`/`--out` fails in one line (exit 2) instead of after minutes of work, and a
copy of some output never lands on a file that a store keeps as its record.

A store is a folder of run directories plus its runs table (`runs.parquet`, `runs.csv`);
a run directory is the folder holding a run's `manifest.json` and the files its ranks
wrote (fsbench.running.store lists them).
"""
from __future__ import annotations

import fnmatch
import os
import tempfile
from pathlib import Path

from fsbench.errors import ConfigError

# A run directory's record (fsbench.running.store's layout): what its ranks and its
# launcher wrote. `*rank-*` covers rank-<r>.jsonl/.log, steps-rank-<r>.jsonl, and the
# clock/machine/input/memory/monitor/kineto/error files of rank r; pace.json (a gated
# run's turns) and steps.csv (a simulated run's steps).
RUN_RECORD = ("manifest.json", "run_spec.json", "summary.json", "trainer-ran.json",
              "eval.json", "pace.json", "steps.csv", "*rank-*")
# A store's runs table, rebuilt from its run directories after every run.
STORE_TABLES = ("runs.parquet", "runs.csv")


def _given(path: str | os.PathLike, flag: str) -> Path:
    if not str(path).strip():
        raise ConfigError(f"{flag} '': an empty path; give a directory or file name")
    return Path(path)


def check_writable_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Create `path` if needed and prove it writable, or raise ConfigError in one line
    naming it (before any rank starts, so nothing is lost later)."""
    path = _given(path, flag)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".fsbench-write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write there ({e.strerror or e}); "
                          "choose another directory") from None
    return path


def is_run_dir(path: Path) -> bool:
    return (path / "manifest.json").is_file()


def is_store(path: Path) -> bool:
    """A folder holding a runs table or at least one run directory."""
    if any((path / name).is_file() for name in STORE_TABLES):
        return True
    try:
        return any(is_run_dir(child) for child in path.iterdir() if child.is_dir())
    except OSError:
        return False


def record_owner(path: Path) -> Path | None:
    """The run directory or store whose record `path` would overwrite, or None."""
    parent = path.absolute().parent
    if is_run_dir(parent) and any(fnmatch.fnmatch(path.name, p) for p in RUN_RECORD):
        return parent
    if path.name in STORE_TABLES and is_store(parent):
        return parent
    return None


def check_output_file(path: str | os.PathLike, flag: str = "--out") -> Path:
    """`path` as a file this command may (over)write, its folder created; else ConfigError
    in one line: a directory, a folder that cannot hold it, or a store's own record."""
    path = _given(path, flag)
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory; give a file name, e.g. "
                          f"{path / 'out.txt'}")
    owner = record_owner(path)
    if owner is not None:
        raise ConfigError(f"{flag} {path}: {path.name} is part of the record of {owner} "
                          "(fsbench rebuilds or reads it); write to another file")
    check_writable_dir(path.absolute().parent, flag)
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{flag} {path}: the file is not writable; choose another")
    return path
