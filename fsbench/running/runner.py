"""Run orchestration on this machine: one run (`run_once`) and a sweep of runs (`sweep`).

The run directory is the unit of record: a run writes its manifest before any rank starts
and its summary only after every rank finished, so an interrupted run stays on disk,
marked `failed` or `interrupted`, and is never mistaken for a result.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from fsbench.columns import SUMMARY_KEYS  # noqa: F401  (re-exported: the keys every summary has)
from fsbench.config import ConfigError, RunConfig
from fsbench.config_io import run_from_dict, to_dict
from fsbench.measurement import run_summary
from fsbench.measurement.kineto import read_run_gpu_busy
from fsbench.measurement.timeline import read_step_stats, read_timelines
from fsbench.running import memory
from fsbench.running import store
from fsbench.running.launch.forked import use_forked
from fsbench.running.launch.local import launch_local

def read_run_files(run_dir: Path) -> run_summary.RunFiles:
    """Every file the run's ranks wrote, read once; ConfigError naming a damaged one."""
    def per_rank(pattern: str) -> list[tuple[int, dict]]:
        paths = sorted(run_dir.glob(pattern), key=lambda p: int(p.stem.split("-")[-1]))
        return [(int(p.stem.split("-")[-1]), store.read_object(p)) for p in paths]

    from fsbench.training.evaluate import EVAL_FILE  # torch: only the summarizing process pays it

    evaluation = run_dir / EVAL_FILE
    return run_summary.RunFiles(
        where=str(run_dir),
        manifest=store.read_manifest(run_dir),
        spans=read_timelines(run_dir),
        stats=read_step_stats(run_dir),
        inputs=per_rank("input-rank-*.json"),
        machines=[m for _, m in per_rank("machine-rank-*.json")],
        monitors=[m.get("summary") or {} for _, m in per_rank("monitor-rank-*.json")],
        memories=[m for _, m in per_rank("memory-rank-*.json")],
        gpu_busy=read_run_gpu_busy(run_dir),
        evaluation=store.read_object(evaluation) if evaluation.exists() else None)


def summarize_run(run_dir: Path) -> dict:
    """The run's summary.json content, computed from its files alone."""
    return run_summary.summarize(read_run_files(Path(run_dir)))


def prepare_run_dir(run: RunConfig, out_dir: str | Path, **manifest: object) -> Path:
    """The run's directory with its manifest (plus `manifest` entries, e.g. a sweep's
    repeat index), before any rank starts."""
    run_dir = store.create_run_dir(out_dir, run)
    try:
        # What the run was expected to need per rank, beside what it measures (peak_memory).
        # How ranks start matters to one figure: a forked CPU rank's peak RSS counts the
        # fork server's pages only where it touched them (fsbench.running.launch.forked).
        store.update_manifest(run_dir, **manifest, memory_estimate=memory.run_estimate(run).to_dict(),
                              launch="forked" if use_forked(run.device) else "spawned")
    except BaseException as e:  # a Ctrl-C here must not leave the run marked running
        mark_stopped(run_dir, e)
        raise
    return run_dir


def mark_stopped(run_dir: Path, error: BaseException) -> None:
    """A run that ended early: `interrupted` on Ctrl-C, else `failed`, with the error."""
    if isinstance(error, KeyboardInterrupt):
        store.update_manifest(run_dir, status="interrupted")
    else:
        store.update_manifest(run_dir, status="failed", error=str(error))


def finish_run(run_dir: Path, status: str = "complete", summary: dict | None = None) -> dict:
    """Summarize a run whose ranks all finished (or write `summary`, made already); mark
    it `status` (complete, or what a run stopped early stays: fsbench summarize). Returns
    the summary as written."""
    summary = store.write_summary(run_dir, summary or summarize_run(run_dir))
    ran = run_dir / "trainer-ran.json"
    store.update_manifest(run_dir, status=status,
                          **({"trainer_ran": store.read_object(ran)} if ran.exists() else {}))
    return summary


def status_after(manifest: dict, summary: dict) -> str:
    """What a run summarized after the fact is: complete only if it was not stopped and
    every rank recorded every step; a run that was stopped keeps saying so."""
    if manifest.get("status") in ("interrupted", "failed"):
        return manifest["status"]
    return "complete" if "steps_planned" not in summary else "interrupted"


def run_once(run: RunConfig, out_dir: str | Path, timeout_s: float | None = None,
             **manifest: object) -> tuple[Path, dict]:
    """Launch one run on local ranks, then summarize it. Returns (run_dir, summary)."""
    run_dir = prepare_run_dir(run, out_dir, **manifest)
    try:
        launch_local(run_dir, run.world_size, run.threads_per_rank, timeout_s=timeout_s,
                     device=run.device)
        summary = finish_run(run_dir)
    except BaseException as e:
        mark_stopped(run_dir, e)
        raise
    finally:
        store.refresh_table(out_dir)
    return run_dir, summary


def sweep_plan(trainers: list[str], world_sizes: list[int], repeats: int,
               workloads: list[str] = ("",)) -> list[tuple[int, str, int, str]]:
    """(repeat, workload, world_size, trainer) in run order. Repeats are the outer loop, so
    drift on a shared machine (another job, thermal state) hits every combination alike."""
    return [(r, w, n, t) for r, w, n, t in
            itertools.product(range(repeats), workloads, world_sizes, trainers)]


def finished_runs(out_dir: str | Path) -> dict[tuple[str, int], tuple[Path, dict]]:
    """Complete runs in the store by (their exact configuration, repeat index): what a
    resumed sweep need not run again."""
    done = {}
    if not Path(out_dir).is_dir():
        return done
    for run_dir in sorted(Path(out_dir).iterdir()):
        manifest, summary = run_dir / "manifest.json", run_dir / "summary.json"
        if not (manifest.exists() and summary.exists()):
            continue
        try:
            m = store.read_json(manifest)
            if m.get("status") == "complete" and "repeat" in m:
                # Read back and written again: a config stored before a field existed
                # compares equal to today's with that field at its default.
                config = to_dict(run_from_dict(m["config"]))
                done[(json.dumps(config, sort_keys=True), int(m["repeat"]))] = (
                    run_dir, store.read_json(summary))
        except (OSError, ValueError, KeyError, TypeError, ConfigError):
            continue  # unreadable: not a finished run; run_row warns about it elsewhere
    return done


def sweep(make_run: Callable[..., RunConfig], trainers: list[str], world_sizes: list[int],
          repeats: int, out_dir: str | Path,
          progress: Callable[[Iterable], Iterable] = lambda it: it,
          workloads: list[str] = ("",), rerun: bool = False,
          on_skip: Callable[[int, int], None] = lambda skipped, total: None) -> pd.DataFrame:
    """Run every (workload, trainer, world size) `repeats` times; one row per run.

    Resumable: a run whose exact configuration and repeat index the store already holds,
    complete, is not run again (unless `rerun`); its stored summary is used. Stopped with
    Ctrl-C, every finished run stays complete on disk and the one in progress is marked
    interrupted, so running the same sweep again picks up where it stopped.
    `make_run(trainer, world_size[, workload])`: workload only when `workloads` are named."""
    plan = sweep_plan(trainers, world_sizes, repeats, list(workloads))
    done = {} if rerun else finished_runs(out_dir)
    todo, rows = [], []
    for repeat, workload, n, trainer in plan:
        run = make_run(trainer, n, workload) if workload else make_run(trainer, n)
        key = (json.dumps(to_dict(run), sort_keys=True), repeat)
        if key in done:
            run_dir, summary = done[key]
            rows.append({**summary, "repeat": repeat, "run_dir": str(run_dir)})
        else:
            todo.append((repeat, run))
    on_skip(len(plan) - len(todo), len(plan))
    for repeat, run in progress(todo):
        run_dir, summary = run_once(run, out_dir, repeat=repeat)
        rows.append({**summary, "repeat": repeat, "run_dir": str(run_dir)})
    return pd.DataFrame(rows)
