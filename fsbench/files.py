"""Files written atomically: a reader sees the old file or the new one, never half of one,
whatever happens to the writer (write to a temp file beside it, fsync, rename, fsync the
folder). A leaf: the store of runs, the cost fits and every rank's records use it."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Have `write(tmp_path)` fill a temp file beside `path`, fsync it and rename it over
    `path`: a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    # The rename is durable only once the directory entry is on disk too.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json_atomic(path: str | os.PathLike, obj: object) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, default=str)
            f.write("\n")
    atomic_write(path, write)


def read_json(path: str | os.PathLike) -> dict:
    with open(path) as f:
        return json.load(f)
