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

from fsbench.running import memory
from fsbench.measurement import metrics
from fsbench.running import store
from fsbench.columns import SUMMARY_KEYS  # noqa: F401  (re-exported: the keys every summary has)
from fsbench.config import ConfigError, RunConfig
from fsbench.measurement.kineto import read_run_gpu_busy
from fsbench.running.launch.local import launch_local
from fsbench.measurement.timeline import read_records, read_timelines

def read_step_stats(run_dir: Path) -> pd.DataFrame:
    """Every rank's per-step stats; ConfigError naming a damaged file (read_records)."""
    rows = []
    for p in sorted(Path(run_dir).glob("steps-rank-*.jsonl")):
        rows += read_records(p, {"rank": int, "step": int})
    # Trainers may add their own per-step columns (e.g. a balancer's predictions).
    base = ["rank", "step", "loss", "num_samples", "num_targets"]
    df = pd.DataFrame(rows)
    return df.reindex(columns=base + [c for c in df.columns if c not in base])


def merge_monitors(run_dir: Path) -> dict:
    """One run-level view of the ranks' monitor summaries: SM occupancy and utilization
    averaged over ranks (None, with the first rank's reason, unless every rank measured
    it), CPU utilization as the median rank, memory peaks as the largest rank."""
    ranks = [store.read_object(p).get("summary") or {} for p in sorted(run_dir.glob("monitor-rank-*.json"))]
    if not ranks:
        return {"sm_occupancy": None, "sm_occupancy_reason": "no monitor output"}
    def mean(key):
        vals = [r.get(key) for r in ranks]
        return None if any(v is None for v in vals) else sum(vals) / len(vals)
    def peak(key):
        vals = [r[key] for r in ranks if r.get(key) is not None]
        return max(vals) if vals else None
    cpu = sorted(r["cpu_util_percent"] for r in ranks if r.get("cpu_util_percent") is not None)
    sm = mean("sm_occupancy")
    return {
        "sm_occupancy": None if sm is None else sm / 100.0,  # a fraction, like every ratio
        "sm_util": None if mean("sm_util") is None else mean("sm_util") / 100.0,
        "sm_occupancy_reason": None if sm is not None else next(
            (r["sm_occupancy_reason"] for r in ranks if r.get("sm_occupancy_reason")), "not measured"),
        "gpu_util_percent": mean("gpu_util_percent"),
        "gpu_mem_used_peak_mib": peak("gpu_mem_used_peak_mib"),
        "cpu_util_percent": cpu[len(cpu) // 2] if cpu else None,
        "rss_peak_mib": peak("rss_peak_mib"),
    }


def summarize_run(run_dir: Path) -> dict:
    """The run's summary.json content, computed from its files alone."""
    manifest = store.read_manifest(run_dir)
    summary = {
        "run_id": manifest["run_id"],
        "trainer": manifest["trainer"],
        "workload": manifest["workload"],
        "world_size": manifest["world_size"],
        "seed": manifest["seed"],
        "steps": manifest["config"]["workload"]["steps"],
        "warmup": manifest["config"]["workload"]["warmup"],
        "oversubscribed": manifest.get("oversubscribed"),
        # compute=emulated: busy time is the calibrated model's, not measured (fsbench.models.emulation)
        "emulated": manifest["config"]["workload"].get("compute") == "emulated",
    }
    spans, stats = read_timelines(run_dir), read_step_stats(run_dir)
    silent = [r for r in range(manifest["world_size"])
              if r not in set(spans["rank"]) or r not in set(stats["rank"])]
    if silent:  # metrics over the other ranks alone would look sound and be wrong
        raise ConfigError(f"{run_dir}: no timeline or step records of rank(s) "
                          f"{', '.join(map(str, silent))}; copy every rank's files into it")
    inputs = [(int(p.stem.split("-")[-1]), store.read_object(p))
              for p in sorted(run_dir.glob("input-rank-*.json"))]
    input_cpu = pd.DataFrame([{"rank": r, "step": int(k), "cpu_ns": v} for r, i in inputs
                              for k, v in i.get("worker_cpu_ns", {}).items()],
                             columns=["rank", "step", "cpu_ns"])
    # CUDA runs: busy time from the profiler's kernel record, when the ranks wrote one.
    gpu_busy = read_run_gpu_busy(run_dir)
    summary["busy_source"] = "kineto" if gpu_busy is not None else (
        "cuda_events" if spans["gpu_ns"].notna().any() else "thread_cpu_time")
    steal = [store.read_object(p) for p in sorted(run_dir.glob("machine-rank-*.json"))]
    summary.update(metrics.summarize(spans, stats, gpu_busy, input_cpu,
                                     steal_ticks=max((s["steal_ticks"] for s in steal), default=0),
                                     total_ticks=max((s["total_ticks"] for s in steal), default=0),
                                     # absent in runs recorded before the worker measured it
                                     threads_runq=[(s["threads_runq_ns"], s["helper_cpu_ns"], s["window_ns"])
                                                   for s in steal if "window_ns" in s] or None))
    summary.update(metrics.plan_accuracy(spans, stats))
    summary.update(merge_monitors(run_dir))
    summary.update(peak_memory(run_dir))
    summary.update(quality(run_dir, spans, gpu_busy))
    if inputs:  # 0 on every rank: no trainer generated data in its training process
        summary["batches_generated_in_rank"] = max(i["batches_generated_in_rank"] for _, i in inputs)
        summary["input_workers"] = inputs[0][1]["input_workers"]
    return summary


def quality(run_dir: Path, spans: pd.DataFrame, gpu_busy: pd.DataFrame | None) -> dict:
    """HR@10, NDCG@10 and time to quality from rank 0's eval.json (fsbench.running.evaluate);
    each None for a run without --eval."""
    from fsbench.running import evaluate  # torch: only when summarizing

    path = run_dir / evaluate.EVAL_FILE
    if not path.exists():
        return evaluate.summarize(None, {})
    steps = metrics.step_metrics(spans, gpu_busy)  # T per step, warm-up steps included
    return evaluate.summarize(store.read_object(path),
                              dict(zip(steps["step"].astype(int), steps["step_time_ms"])))


def peak_memory(run_dir: Path) -> dict:
    """Peak memory per rank (MiB): the GPU allocator's peak on CUDA runs, else the rank
    process's peak RSS; None for runs written before ranks recorded it."""
    per_rank = [store.read_object(p) for p in sorted(run_dir.glob("memory-rank-*.json"),
                                                   key=lambda p: int(p.stem.split("-")[-1]))]
    if not per_rank:
        return {"peak_memory_mb": None, "peak_memory_mb_per_rank": None, "peak_memory_kind": None}
    kind = "cuda_allocated_mb" if all("cuda_allocated_mb" in m for m in per_rank) else "cpu_rss_mb"
    values = [float(m[kind]) for m in per_rank]
    return {"peak_memory_mb": max(values), "peak_memory_mb_per_rank": values,
            "peak_memory_kind": kind.removesuffix("_mb")}


def prepare_run_dir(run: RunConfig, out_dir: str | Path, **manifest: object) -> Path:
    """The run's directory with its manifest (plus `manifest` entries, e.g. a sweep's
    repeat index), before any rank starts."""
    run_dir = store.create_run_dir(out_dir, run)
    try:
        # What the run was expected to need per rank, beside what it measures (peak_memory).
        store.update_manifest(run_dir, **manifest, memory_estimate=memory.estimate(
            run, available_source="measure").to_dict())
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


def finish_run(run_dir: Path) -> dict:
    """Summarize a run whose ranks all finished; mark it complete. Returns the summary."""
    summary = summarize_run(run_dir)
    store.write_json_atomic(run_dir / "summary.json", summary)
    ran = run_dir / "trainer-ran.json"
    store.update_manifest(run_dir, status="complete",
                          **({"trainer_ran": store.read_object(ran)} if ran.exists() else {}))
    return summary


def run_once(run: RunConfig, out_dir: str | Path, timeout_s: float | None = None,
             **manifest: object) -> tuple[Path, dict]:
    """Launch one run on local ranks, then summarize it. Returns (run_dir, summary)."""
    run_dir = prepare_run_dir(run, out_dir, **manifest)
    try:
        launch_local(run_dir, run.world_size, run.threads_per_rank, timeout_s=timeout_s)
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
                done[(json.dumps(m["config"], sort_keys=True), int(m["repeat"]))] = (
                    run_dir, store.read_json(summary))
        except (OSError, ValueError, KeyError, TypeError):
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
    from fsbench.config import to_dict

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
