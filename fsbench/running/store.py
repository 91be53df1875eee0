"""Run directories and manifests, written atomically.

Layout of one run: `<out>/<run_id>/`
    manifest.json      frozen config, trainer, world size, seed, git sha, versions, host,
                       status (running -> complete | failed)
    run_spec.json      what every rank reads at start (the RunConfig)
    rank-<r>.jsonl     rank r's timeline spans
    steps-rank-<r>.jsonl  rank r's per-step stats (loss, samples, targets)
    rank-<r>.log       rank r's stdout/stderr
    summary.json       the run's metrics (only once the run completed)

Every JSON file is written to a temp file, fsynced and renamed, so a reader never sees a
half-written file, whatever happens to the writer.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
import platform
import re
import secrets
import socket
import subprocess
import sys
from pathlib import Path

from fsbench.config import ConfigError, RunConfig
from fsbench.config_io import to_dict
# Atomic writes are every layer's (cost fits, ranks' records): fsbench.files; named here
# too because a run's files are written through the store.
from fsbench.files import atomic_write, read_json, write_json_atomic  # noqa: F401
from fsbench.training.trainer import resolve_trainer_class

SCHEMA_VERSION = 1
# Where `fsbench simulate` puts its runs inside a store: apart from the measured ones.
SIMULATED_DIR = "simulated"
_VERSIONED_PACKAGES = ("torch", "numpy", "pandas", "torchrec", "fbgemm-gpu", "fbgemm-gpu-cpu",
                       "deepspeed", "nvidia-ml-py", "fsbench")


def write_summary(run_dir: str | os.PathLike, summary: dict) -> dict:
    """Write RUN_DIR/summary.json; NaN and infinity (a diverged loss, a ratio of nothing)
    are written as null, never as a number JSON does not have, and the keys that held
    them are listed under `non_finite`. Returns what was written."""
    bad: list[str] = []

    def finite(value, key):
        if isinstance(value, float) and not math.isfinite(value):
            bad.append(key)
            return None
        if isinstance(value, dict):
            return {k: finite(v, key) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(v, key) for v in value]
        return value

    clean = {k: finite(v, k) for k, v in summary.items() if k != "non_finite"}
    if bad:
        clean["non_finite"] = sorted(set(bad))

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(clean, f, indent=2, sort_keys=True, default=str, allow_nan=False)
            f.write("\n")
    atomic_write(Path(run_dir) / "summary.json", write)
    return clean


def new_run_id(run: RunConfig) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    # Workload names of overridden presets carry their --set values (paths, '=', ':').
    workload = re.sub(r"[^A-Za-z0-9.+-]+", "_", run.workload.name)[:48]
    trainer = re.sub(r"[^A-Za-z0-9.+-]+", "_", run.trainer)[:32]
    return f"{stamp}-{workload}-{trainer}-n{run.world_size}-{secrets.token_hex(3)}"


def git_sha() -> str | None:
    try:
        root = Path(__file__).resolve().parents[2]  # the checkout: fsbench/running/store.py
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=5)
        if out.returncode != 0:
            return None
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def package_versions() -> dict[str, str]:
    out = {}
    for name in _VERSIONED_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_model() -> str | None:
    """The CPU's model name (Linux /proc/cpuinfo), else the platform's processor string:
    compare refuses to pair runs of different CPUs without being told to."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def host_info() -> dict:
    import torch

    info = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": usable_cpus(),
        "cpu_model": cpu_model(),
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def is_oversubscribed(run: RunConfig, cpus: int | None = None) -> bool:
    """More busy threads than cores: wall-clock figures then measure time-sharing."""
    if run.device == "cuda" or run.workload.compute == "emulated":
        return False  # emulated compute sleeps: ranks wait for no core (cpu wait still shows)
    return run.world_size * run.threads_per_rank > (cpus or usable_cpus())


def create_run_dir(out_dir: str | os.PathLike, run: RunConfig) -> Path:
    """Make `<out>/<run_id>/` with its manifest (status: running) and the ranks' spec."""
    run_id = new_run_id(run)
    run_dir = Path(out_dir) / run_id
    run_dir.mkdir(parents=True, exist_ok=False)
    config = to_dict(run)
    write_json_atomic(run_dir / "run_spec.json", config)
    write_json_atomic(run_dir / "manifest.json", {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "status": "running",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "trainer": run.trainer,
        "workload": run.workload.name,
        "world_size": run.world_size,
        "seed": run.seed,
        "config": config,
        "git_sha": git_sha(),
        "packages": package_versions(),
        "host": host_info(),
        "oversubscribed": is_oversubscribed(run),
        # What the trainer's framework hides from the timeline (e.g. communication inside
        # a fused backward), in the trainer's own words.
        "trainer_notes": getattr(resolve_trainer_class(run.trainer), "notes", None),
        # Lets a reader tell a run in progress from one whose launcher was killed.
        "launcher": {"pid": os.getpid(), "hostname": socket.gethostname()},
    })
    return run_dir


def update_manifest(run_dir: str | os.PathLike, **fields: object) -> dict:
    path = Path(run_dir) / "manifest.json"
    manifest = read_json(path) | fields
    write_json_atomic(path, manifest)
    return manifest


# ---------------------------------------------------------------------------
# The runs table: one tidy row per run, derived from the run directories.
#
# The directories are the record; the table (`runs.parquet`, `runs.csv` beside it) is
# rebuilt from them after every run and written atomically, so it can always be
# regenerated and a crash mid-write leaves the previous table intact.

TABLE_SCHEMA_VERSION = 1
RUN_STATUSES = ("complete", "failed", "interrupted", "incomplete", "running", "corrupt")
_REQUIRED = ("run_id", "trainer", "workload", "world_size", "seed")
_warned: set[str] = set()


def warn_skip(path: Path, why: str) -> None:
    """One line on stderr per bad file per process (a sweep rescans the store after every
    run; the same line once is enough)."""
    if str(path) not in _warned:
        _warned.add(str(path))
        print(f"fsbench: warning: skipping {path}: {why}", file=sys.stderr)


def _read_dict(path: Path) -> tuple[dict | None, str | None]:
    """(content, None) or (None, why it is unusable): a store may hold anything."""
    try:
        with open(path) as f:
            obj = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"not readable JSON ({type(e).__name__})"
    if not isinstance(obj, dict):
        return None, f"JSON {type(obj).__name__}, not an object"
    return obj, None


def read_object(path: str | os.PathLike) -> dict:
    """A JSON object file of a run (manifest, a rank's record), or ConfigError in one line
    naming it: readers refuse a damaged file instead of failing somewhere inside."""
    obj, why = _read_dict(Path(path))
    if why:
        raise ConfigError(f"{path}: {why}")
    return obj


def _manifest_problem(manifest: dict) -> str | None:
    """Why a manifest is not one fsbench can use (None if it is)."""
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing or not isinstance(manifest.get("config"), dict) \
            or not isinstance(manifest["config"].get("workload"), dict):
        return f"not an fsbench manifest (missing {', '.join(missing) or 'config.workload'})"
    n = manifest["world_size"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return f"not an fsbench manifest (world_size {n!r} is not a positive integer)"
    seed = manifest["seed"]  # the table's column is int64: a larger seed breaks every rebuild
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        return f"not an fsbench manifest (seed {seed!r} is not an integer in 0..2**63-1)"
    return None


def read_manifest(run_dir: str | os.PathLike) -> dict:
    """RUN_DIR's manifest, or ConfigError in one line saying why it cannot be used."""
    path = Path(run_dir) / "manifest.json"
    if not path.is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no manifest.json)")
    manifest = read_object(path)
    why = _manifest_problem(manifest)
    if why:
        raise ConfigError(f"{path}: {why}")
    return manifest


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_status(manifest: dict) -> str:
    """The manifest's status, with `running` turned into `incomplete` when the launcher
    that wrote it is gone (killed without a chance to record anything)."""
    status = manifest.get("status", "incomplete")
    if status == "running":
        same_host = manifest.get("launcher", {}).get("hostname") == socket.gethostname()
        if same_host and not _pid_alive(manifest.get("launcher", {}).get("pid")):
            return "incomplete"
    return status


def run_row(run_dir: Path) -> dict | None:
    """One table row for a run directory, or None if it is not one. A directory without
    manifest.json is not a run (e.g. `calibrations/`); one whose manifest or summary is
    corrupt or foreign is skipped with one warning line (a summary: the row stays, status
    `corrupt`, without metrics), never an exception."""
    path = run_dir / "manifest.json"
    if not path.exists():
        return None
    manifest, why = _read_dict(path)
    why = why or _manifest_problem(manifest)
    if why:
        warn_skip(path, why)
        return None
    row = {
        "schema_version": TABLE_SCHEMA_VERSION,
        "run_id": manifest["run_id"],
        "run_dir": str(run_dir),
        "status": run_status(manifest),
        "created": manifest.get("created"),
        "trainer": manifest["trainer"],
        "workload": manifest["workload"],
        "workload_version": manifest["config"]["workload"].get("version"),
        "world_size": manifest["world_size"],
        "seed": manifest["seed"],
        "git_sha": manifest.get("git_sha"),
        "hostname": (manifest.get("host") or {}).get("hostname"),
        "oversubscribed": manifest.get("oversubscribed"),
        "simulated": bool(manifest.get("simulated", False)),  # fsbench simulate's runs
    }
    summary_path = run_dir / "summary.json"
    if row["status"] == "complete" and summary_path.exists():
        summary, why = _read_dict(summary_path)
        if why:
            warn_skip(summary_path, why)
            row["status"] = "corrupt"
        else:
            row.update({k: v for k, v in summary.items()
                        if not isinstance(v, (list, dict)) and k not in row})
    return row


def _runs_table(dirs: list[Path]) -> "pd.DataFrame":  # noqa: F821
    """The runs among `dirs` as a DataFrame (one row per run), newest last. Stray files
    (notes, other tools' output) and directories that are not runs are simply not rows;
    run_row warns about run directories it cannot read."""
    import pandas as pd

    df = pd.DataFrame([r for d in dirs if d.is_dir() and (r := run_row(d))])
    return df.sort_values("created", kind="stable").reset_index(drop=True) if len(df) else df


def scan_runs(out_dir: str | os.PathLike) -> "pd.DataFrame":  # noqa: F821
    """Every run directly under `out_dir` as a DataFrame, newest last (the runs table a
    store keeps of its own runs: refresh_table)."""
    return _runs_table(sorted(Path(out_dir).iterdir()))


def store_run_dirs(store_dir: str | os.PathLike) -> list[Path]:
    """The folders a user reads as a store's runs: its own and those `fsbench simulate`
    wrote into its SIMULATED_DIR (their manifests say simulated, so readers keep them apart
    from measured rows). A store holding only simulated runs is still a store."""
    root = Path(store_dir)
    dirs = sorted(d for d in root.iterdir() if d.is_dir() and d.name != SIMULATED_DIR)
    sim = root / SIMULATED_DIR
    if sim.is_dir() and not (sim / "manifest.json").is_file():  # not a run named so
        dirs += sorted(d for d in sim.iterdir() if d.is_dir())
    return dirs


def scan_store(store_dir: str | os.PathLike) -> "pd.DataFrame":  # noqa: F821
    """Every run of a store (store_run_dirs) as a DataFrame, newest last."""
    return _runs_table(store_run_dirs(store_dir))


def write_table_atomic(df: "pd.DataFrame", path: Path) -> None:  # noqa: F821
    if path.suffix == ".parquet":
        atomic_write(path, lambda tmp: df.to_parquet(tmp, index=False))
    else:
        atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))


def refresh_table(out_dir: str | os.PathLike) -> "pd.DataFrame":  # noqa: F821
    """Rebuild `runs.parquet` and `runs.csv` in `out_dir` from its run directories."""
    out_dir = Path(out_dir)
    df = scan_runs(out_dir)
    write_table_atomic(df, out_dir / "runs.parquet")
    write_table_atomic(df, out_dir / "runs.csv")
    return df


def load_runs(out_dir: str | os.PathLike, status: str | None = "complete") -> "pd.DataFrame":  # noqa: F821
    """The runs of the store `out_dir`, its simulated ones included (scan_store; rescanned,
    so it reflects runs killed since the last refresh), optionally only runs with `status`."""
    df = scan_store(out_dir)
    if status is not None and len(df):
        df = df[df["status"] == status].reset_index(drop=True)
    return df
