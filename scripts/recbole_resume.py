"""The bookkeeping that lets scripts/recbole_reference.py be cut off and rerun.

A converged RecBole seed takes hours on this machine's cores, longer than a session lives,
so the reference is run as one command that is simply rerun until it is done. This module
holds the parts of that which need neither torch nor RecBole (so fsbench's fast tests can
check them, tests/test_recbole_resume.py):

- which RecBole settings make two runs the same protocol (the override dict minus the paths
  that only say where files go);
- which finished seeds of an earlier --out are kept (same dataset sha256 and protocol; a
  different one is refused rather than overwritten, since it holds hours of work);
- the "in_progress" list, built from each seed's progress.json: a seed not yet finished,
  shown so a reader sees how far it is, and labelled as not a result;
- atomic writes (a temporary file, fsync, os.replace), so a kill at any moment leaves either
  the previous file or the new one, never half of one.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable, IO

# Overrides that say where files go, not what is computed.
PATH_KEYS = ("data_path", "checkpoint_dir")
IN_PROGRESS_NOTE = ("not a result: a seed still training (or cut off); rerun the same command "
                    "to resume it from its last completed epoch")


def protocol_of(overrides: dict, *, with_seed: bool = True) -> dict:
    """The RecBole override dict minus paths, normalised through JSON (what is compared)."""
    kept = {k: v for k, v in overrides.items()
            if k not in PATH_KEYS and (with_seed or k != "seed")}
    return json.loads(json.dumps(kept, sort_keys=True))


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write through `write(file)` into path + '.tmp', fsync, then os.replace onto path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, value) -> None:
    text = json.dumps(value, indent=1) + "\n"
    atomic_write(path, lambda f: f.write(text.encode()))


class ProtocolMismatch(RuntimeError):
    """An earlier output or saved state is of another dataset or protocol."""


def kept_runs(out: Path | None, dataset_sha: str, protocol: dict) -> list[dict]:
    """Finished runs of an earlier --out to keep; [] if there is none. Refuses another protocol.

    `protocol` is protocol_of(overrides, with_seed=False), stored as
    report["protocol"]["recbole_overrides"].
    """
    if out is None or not out.exists():
        return []
    old = json.loads(out.read_text())
    old_sha = old.get("dataset", {}).get("sha256")
    old_protocol = old.get("protocol", {}).get("recbole_overrides")
    if old.get("runs") and (old_sha != dataset_sha or old_protocol != protocol):
        what = "dataset" if old_sha != dataset_sha else "protocol"
        raise ProtocolMismatch(
            f"{out} holds {len(old['runs'])} finished run(s) of another {what}; pass another "
            "--out (or move that file away) rather than overwrite them")
    return [r for r in old.get("runs", []) if r.get("status", "finished") == "finished"]


def merge_run(runs: list[dict], run: dict) -> list[dict]:
    """runs with `run` added (replacing a run of the same seed), ordered by seed."""
    return sorted([r for r in runs if r["seed"] != run["seed"]] + [run], key=lambda r: r["seed"])


def in_progress_entry(progress: dict) -> dict:
    """One line of report["in_progress"] from a seed's progress.json."""
    keys = ("seed", "epochs_done", "best_epoch", "best_valid_score", "best_valid_result",
            "cur_step", "resumed_at_epochs", "fit_s_so_far", "updated")
    return {"status": "in_progress", "note": IN_PROGRESS_NOTE,
            **{k: progress.get(k) for k in keys}}


def read_progress(seed_dir: Path, protocol: dict) -> dict | None:
    """A seed's progress.json if it is of this protocol (`protocol` with the seed), else None."""
    path = seed_dir / "progress.json"
    if not path.exists():
        return None
    progress = json.loads(path.read_text())
    return progress if progress.get("protocol") == protocol else None


def describe_inter(path: Path) -> dict:
    """The data file's sha256 (what a saved run is matched on) and its size."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    users, items, rows = set(), set(), 0
    with path.open() as f:
        header = f.readline().rstrip("\n").split("\t")
        names = [h.split(":")[0] for h in header]
        u, i = names.index("user_id"), names.index("item_id")
        for line in f:
            if not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            users.add(cols[u])
            items.add(cols[i])
            rows += 1
    return {"path": str(path), "sha256": digest, "header": header, "interactions": rows,
            "users": len(users), "items": len(items)}


def seed_dir(state_root: Path, dataset_sha: str, seed: int) -> Path:
    return state_root / dataset_sha[:12] / f"seed{seed}"
