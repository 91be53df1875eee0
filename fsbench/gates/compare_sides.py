"""The two sides of a comparison, read from a store: which runs, on which machine, and
their measured steps (fsbench.gates.compare tests them; nothing here is a statistic).

A store holds whatever users made, so every reader here names what it cannot use
(contended, oversubscribed, simulated, unreadable runs) instead of failing on it.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from fsbench.measurement import metrics
from fsbench.errors import ConfigError

# What a run's machine is, as compare checks it (from its manifest).
MACHINE_FIELDS = ("hostname", "cpu_model", "cpus", "accelerator", "torch")


def load_side(path: str | Path) -> pd.DataFrame:
    """Runs of one side: a run directory, or a store (a directory of runs). Complete runs
    only; bad input (no such directory, nothing complete) is a ConfigError."""
    from fsbench.running import store

    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{path}: not a run directory or a store of runs")
    if (path / "manifest.json").exists():
        row = store.run_row(path)
        runs = pd.DataFrame([row] if row else [])
    else:
        runs = store.scan_store(path)  # simulated runs too: named below as unusable
    if len(runs):
        runs = runs[runs["status"] == "complete"]
    if not len(runs):
        raise ConfigError(f"{path}: holds no complete run")
    runs = runs.reset_index(drop=True)
    for col, default in (("workload_version", None), ("seed", 0), ("simulated", False)):
        if col not in runs:
            runs[col] = default
    return runs


def step_samples(run_dir: str | Path) -> pd.DataFrame:
    """Per measured step: step time, throughput, bubble and its causes, with the sums the
    totals are made of (`TOTALS`)."""
    from fsbench.measurement.timeline import read_step_stats
    from fsbench.measurement.timeline import read_timelines

    from fsbench.running import store

    run_dir = Path(run_dir)
    spans, stats = read_timelines(run_dir), read_step_stats(run_dir)
    # A rank whose file is empty or cut to nothing would leave the others' steps looking
    # sound (no straggler, less communication wait): the run cannot be compared.
    world = int(store.read_object(run_dir / "manifest.json").get("world_size") or 1)
    silent = [r for r in range(world) if r not in set(spans["rank"]) or r not in set(stats["rank"])]
    if silent:
        raise ValueError(f"no timeline or step records of rank(s) {', '.join(map(str, silent))}")
    table = metrics.throughput(metrics.step_metrics(spans), stats)
    table = table[~table["warmup"]]
    if table.empty:
        raise ValueError("no measured steps in its rank files")
    return table.assign(one=1.0, step_s=table["step_time_ms"] / 1e3)


def peak_samples(run_dir: str | Path) -> list[float]:
    from fsbench.running import store

    summary = store.read_object(Path(run_dir) / "summary.json")
    return [float(v) for v in summary.get("peak_memory_mb_per_rank") or []]


def machine_of(run_dir: str | Path) -> dict:
    """The machine a run measured, from its manifest: host, CPU model, cores, accelerator,
    torch. Fields an older manifest lacks are None (not compared)."""
    from fsbench.running import store

    try:
        manifest = store.read_object(Path(run_dir) / "manifest.json")
    except ConfigError:
        manifest = {}
    host = manifest.get("host") or {}
    gpus = host.get("gpus")
    return {"hostname": host.get("hostname"), "cpu_model": host.get("cpu_model"),
            "cpus": host.get("cpus"),
            "accelerator": ", ".join(gpus) if gpus else ("none" if "cuda_available" in host else None),
            "torch": (manifest.get("packages") or {}).get("torch")}


def machines_differ(base: pd.DataFrame, new: pd.DataFrame) -> str | None:
    """How BASE's machines differ from NEW's, or None when every known field agrees."""
    seen = {side: [machine_of(d) for d in runs["run_dir"]] for side, runs in
            (("BASE", base), ("NEW", new))}
    diffs = []
    for field in MACHINE_FIELDS:
        values = {side: {m[field] for m in ms if m[field] is not None} for side, ms in seen.items()}
        if values["BASE"] and values["NEW"] and values["BASE"] != values["NEW"]:
            diffs.append(f"{field} {'/'.join(map(str, sorted(values['BASE'], key=str)))} vs "
                         f"{'/'.join(map(str, sorted(values['NEW'], key=str)))}")
    return "; ".join(diffs) or None


def machine_lines(base: pd.DataFrame, new: pd.DataFrame) -> list[tuple[str, str]]:
    """What each side ran on, one line per distinct machine ("both" when they agree)."""
    def lines(runs):
        seen = [machine_of(d) for d in runs["run_dir"]]
        return list(dict.fromkeys(", ".join(f"{k}={m[k] if m[k] is not None else 'unknown'}"
                                            for k in MACHINE_FIELDS) for m in seen))
    b, n = lines(base), lines(new)
    if b == n:
        return [("BASE and NEW", line) for line in b]
    return [("BASE", line) for line in b] + [("NEW", line) for line in n]


def _flag(runs: pd.DataFrame, name: str) -> pd.Series:
    if name not in runs:
        return pd.Series(False, index=runs.index)
    return runs[name].map(lambda v: v is True or v == 1 or v == "True")


def usable(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs a timing comparison can use: measured (not simulated), not contended, not
    oversubscribed. A run whose contention is unknown (null) stays, and is noted."""
    keep = ~(_flag(runs, "contended") | _flag(runs, "oversubscribed") | _flag(runs, "simulated"))
    return runs[keep]


def left_out(runs: pd.DataFrame, side: str) -> list[str]:
    """Why runs of one side are left out, one line each."""
    why = []
    for flag, text in (("simulated", "simulated, not a measurement"),
                       ("contended", "contended (a neighbour took the CPU)"),
                       ("oversubscribed", "oversubscribed (more busy threads than cores)")):
        why += [f"{side} {r.run_id}: {text}, left out" for r in runs[_flag(runs, flag)].itertuples()]
    if "contended" in runs:
        unknown = runs["contended"].isna() & ~_flag(runs, "simulated")
        why += [f"{side} {r.run_id}: contention unknown (no schedstat on its machine), kept"
                for r in runs[unknown].itertuples()]
    return why



def readable(runs: pd.DataFrame, side: str, notes: list[str]) -> tuple[pd.DataFrame, list]:
    """The runs whose rank files read, with their step tables; the rest named in notes."""
    keep, tables = [], []
    for i, r in runs.iterrows():
        try:
            tables.append(step_samples(r["run_dir"]))
            keep.append(i)
        # A damaged file raises ConfigError (a ValueError), a missing one OSError, a record
        # without a field KeyError; anything else is a bug and must not pass as "unreadable".
        except (OSError, ValueError, KeyError) as e:
            notes.append(f"{side} {r['run_id']}: rank files unreadable "
                         f"({type(e).__name__}: {str(e)[:80]}), left out")
    return runs.loc[keep], tables


def pace_of(run_dir: str | Path) -> tuple[str, int] | None:
    """(turn-taking group, block steps) of a run made under fsbench.running.pacing, else None."""
    from fsbench.running import store

    path = Path(run_dir) / "pace.json"
    if not path.exists():
        return None
    try:
        pace = store.read_object(path)
        return str(pace["group"]), int(pace["block_steps"])
    except (ConfigError, KeyError, TypeError, ValueError):
        return None
