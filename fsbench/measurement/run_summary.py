"""The summary of one run (its summary.json), computed in one pass over what its ranks
wrote.

`RunFiles` holds the content of every file a run's ranks leave (read once, from a run
directory, by fsbench.running.runner.read_run_files); `summarize` derives every summary
key from it, in this order: the run's identity (manifest), the step metrics and their
causes (fsbench.measurement.metrics), the balancer's plan accuracy, the monitors, peak
memory, and quality. Nothing here reads a file or a clock.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from fsbench.errors import ConfigError
from fsbench.measurement import host_syncs, metrics, profiled

# The evaluation keys of a summary (None for a run without --eval); fsbench.training.evaluate
# writes the eval.json they come from.
QUALITY_KEYS = ("hr_at_10", "ndcg_at_10", "hr_at_10_logq", "ndcg_at_10_logq", "eval_users",
                "target_hr10", "time_to_target_s", "steps_to_target")


@dataclasses.dataclass
class RunFiles:
    """Everything a run's ranks wrote, as read from its directory."""
    where: str                       # the run directory, for error messages
    manifest: dict
    spans: pd.DataFrame              # every rank's timeline (timeline.read_timelines)
    stats: pd.DataFrame              # every rank's per-step records (timeline.read_step_stats)
    inputs: list[tuple[int, dict]]   # (rank, input-rank-R.json): the input stage's CPU time
    machines: list[dict]             # machine-rank-R.json: steal and run-queue counters
    monitors: list[dict]             # monitor-rank-R.json summaries (CPU, NVML)
    memories: list[dict]             # memory-rank-R.json in rank order
    gpu_busy: pd.DataFrame | None    # CUDA runs: compute kernels from the profiler (kineto)
    evaluation: dict | None          # eval.json of a run with --eval (fsbench.training.evaluate)


def summarize(files: RunFiles) -> dict:
    """The run's summary.json content."""
    manifest, spans, stats = files.manifest, files.spans, files.stats
    workload = manifest["config"]["workload"]
    summary = {
        "run_id": manifest["run_id"],
        "trainer": manifest["trainer"],
        "workload": manifest["workload"],
        "world_size": manifest["world_size"],
        "seed": manifest["seed"],
        "steps": workload["steps"],
        "warmup": workload["warmup"],
        "oversubscribed": manifest.get("oversubscribed"),
        # compute=emulated: busy time is the calibrated model's, not measured (fsbench.models.emulation)
        "emulated": workload.get("compute") == "emulated",
    }
    silent = [r for r in range(manifest["world_size"])
              if r not in set(spans["rank"]) or r not in set(stats["rank"])]
    if silent:  # metrics over the other ranks alone would look sound and be wrong
        raise ConfigError(f"{files.where}: no timeline or step records of rank(s) "
                          f"{', '.join(map(str, silent))}; copy every rank's files into it")
    # The steps every rank finished: all of them, unless the run was stopped early (a
    # summary of an interrupted run counts what it has, not what it was set to run). A run
    # that early stopping ended (eval.patience: every rank stopped after the evaluation
    # that eval.json names) ran all it was meant to: complete, with the steps it ran.
    done = int(stats.groupby("rank")["step"].nunique().min())
    stopped = (files.evaluation or {}).get("stopped_at_step")
    if done < summary["steps"]:
        summary.update(steps=done, **({} if stopped is not None and done == stopped + 1
                                      else {"steps_planned": workload["steps"]}))
    input_cpu = pd.DataFrame([{"rank": r, "step": int(k), "cpu_ns": v} for r, i in files.inputs
                              for k, v in i.get("worker_cpu_ns", {}).items()],
                             columns=["rank", "step", "cpu_ns"])
    # Which record the busy time came from, and which profiled steps fell back to CUDA
    # events because the kernel record held nothing for them (fsbench.measurement.profiled).
    profiled_steps = set(spans.loc[spans["profiled"] & ~spans["warmup"].astype(bool), "step"].astype(int))
    summary.update(profiled.busy_source(files.gpu_busy, profiled_steps, bool(spans["gpu_ns"].notna().any())))
    machines = files.machines
    summary.update(metrics.summarize(spans, stats, files.gpu_busy, input_cpu,
                                     steal_ticks=max((s["steal_ticks"] for s in machines), default=0),
                                     total_ticks=max((s["total_ticks"] for s in machines), default=0),
                                     # absent in runs recorded before the worker measured it
                                     threads_runq=[(s["threads_runq_ns"], s["helper_cpu_ns"], s["window_ns"])
                                                   for s in machines if "window_ns" in s] or None))
    summary.update(input_stage_cpu(files.inputs, spans, stats))
    summary.update(plan_accuracy(spans, stats))
    if summary.get("plan_ms_per_step") is not None and summary.get("step_time_ms_median"):
        summary["plan_share_of_step"] = summary["plan_ms_per_step"] / summary["step_time_ms_median"]
    summary.update(host_syncs.per_step(stats[~stats["step"].isin(warmup_steps(spans))]))
    summary.update(merge_monitors(files.monitors))
    summary.update(peak_memory(files.memories))
    if files.evaluation:
        summary.update(quality(files.evaluation, step_times_ms(spans, files.gpu_busy),
                               samples_per_step(stats, manifest["world_size"])))
    else:
        summary.update(quality(None, {}))
    if files.inputs:  # 0 on every rank: no trainer generated data in its training process
        summary["batches_generated_in_rank"] = max(i["batches_generated_in_rank"] for _, i in files.inputs)
        summary["input_workers"] = files.inputs[0][1]["input_workers"]
        # Steps a trainer re-packs samples across (FreeScale's window; absent: runs before it)
        summary["step_alignment"] = files.inputs[0][1].get("step_alignment", 1)
    return summary


def step_times_ms(spans: pd.DataFrame, gpu_busy: pd.DataFrame | None) -> dict[int, float]:
    """T per step (ms), warm-up steps included: what time to quality sums."""
    steps = metrics.step_metrics(spans, gpu_busy)
    return dict(zip(steps["step"].astype(int), steps["step_time_ms"]))


def samples_per_step(stats: pd.DataFrame, world_size: int) -> dict[int, int]:
    """The samples each step trained, summed over the ranks' own counts (a trainer that
    re-packs samples, FreeScale's window, reports what it trained); steps some rank did not
    record are left out."""
    by_step = stats.groupby("step")["num_samples"].agg(["sum", "size"])
    whole = by_step[by_step["size"] == world_size]
    return {int(s): int(n) for s, n in zip(whole.index, whole["sum"])}


def merge_monitors(ranks: list[dict]) -> dict:
    """One run-level view of the ranks' monitor summaries: SM occupancy and utilization
    averaged over ranks (None, with the first rank's reason, unless every rank measured
    it), CPU utilization as the median rank, memory peaks as the largest rank."""
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
    # Why there is no figure, or why a figure is partial (GPM failed part-way): the first
    # rank's reason, in every summary. Measured on every rank without a caveat: None.
    reason = next((r["sm_occupancy_reason"] for r in ranks if r.get("sm_occupancy_reason")), None)
    return {
        "sm_occupancy": None if sm is None else sm / 100.0,  # a fraction, like every ratio
        "sm_util": None if mean("sm_util") is None else mean("sm_util") / 100.0,
        "sm_occupancy_reason": reason or (None if sm is not None else "not measured"),
        "gpu_util_percent": mean("gpu_util_percent"),
        "gpu_mem_used_peak_mib": peak("gpu_mem_used_peak_mib"),
        # The driver's view of the rank's own memory (NVML, sampled): beside the allocator's
        # peak_memory_mb it holds NCCL's and symmetric memory's buffers and the context.
        "gpu_proc_mem_peak_mib": peak("gpu_proc_mem_peak_mib"),
        "cpu_util_percent": cpu[len(cpu) // 2] if cpu else None,
        "rss_peak_mib": peak("rss_peak_mib"),
    }


def peak_memory(per_rank: list[dict]) -> dict:
    """Peak memory per rank (MiB): the GPU allocator's peak on CUDA runs, else the rank
    process's peak RSS; None for runs written before ranks recorded it."""
    if not per_rank:
        return {"peak_memory_mb": None, "peak_memory_mb_per_rank": None, "peak_memory_kind": None}
    kind = "cuda_allocated_mb" if all("cuda_allocated_mb" in m for m in per_rank) else "cpu_rss_mb"
    values = [float(m[kind]) for m in per_rank]
    return {"peak_memory_mb": max(values), "peak_memory_mb_per_rank": values,
            "peak_memory_kind": kind.removesuffix("_mb")}


def quality(record: dict | None, step_time_ms: dict[int, float],
            step_samples: dict[int, int] | None = None) -> dict:
    """The summary's evaluation keys from `eval.json` (None without one), the run's step
    times T per step (ms) and samples trained per step (global): the last evaluation's
    metrics, time to quality, and the learning curve."""
    out = dict.fromkeys(QUALITY_KEYS)
    if not record or not record.get("evaluations"):
        return out
    evals = sorted(record["evaluations"], key=lambda e: e["step"])
    final, target = evals[-1], record.get("target_hr10")
    out.update(hr_at_10=final["hr_at_10"], ndcg_at_10=final["ndcg_at_10"],
               hr_at_10_logq=final.get("hr_at_10_logq"),
               ndcg_at_10_logq=final.get("ndcg_at_10_logq"),
               eval_users=record["eval_users"], target_hr10=target)
    # The learning curve: every evaluation with the training time through its step and the
    # global samples trained through it, warm-up steps included (None where a step's
    # record is missing), for `fsbench quality` and the report.
    elapsed, samples, through, counted = {}, {}, 0.0, 0
    step_samples = step_samples or {}
    for s in range(evals[-1]["step"] + 1):
        through = None if through is None or s not in step_time_ms else through + step_time_ms[s]
        counted = None if counted is None or s not in step_samples else counted + step_samples[s]
        elapsed[s] = None if through is None else through / 1e3
        samples[s] = counted
    out["quality_curve"] = [{**e, "train_s": elapsed[e["step"]], "samples": samples[e["step"]]}
                            for e in evals]
    reached = next((e for e in evals if target is not None and e["hr_at_10"] >= target), None)
    if reached is not None:
        out["steps_to_target"] = reached["step"] + 1
        out["time_to_target_s"] = elapsed[reached["step"]]  # None: a step's timeline is missing
    return out


EXCHANGE_PREP_SPAN = "emb.route"
"""Spans of the rank thread's input work inside the step (FreeScale's request building
and service preparation where requests are exchanged)."""


def input_stage_cpu(inputs: list[tuple[int, dict]], spans: pd.DataFrame, stats: pd.DataFrame) -> dict:
    """The input stage's CPU per measured step, the mean over ranks (ms): what the loader
    worker spends preparing a step (`stage_cpu_ns`: plan, routing, the trainer's batch
    building; the data source's reading left out: fsbench.training.inputs.prepare_timed),
    plus the rank thread's exchange preparation (`emb.route` spans). None where the run
    predates the stage's timing. The routing's part, where a trainer times it
    (`route_ms`, `read_ms` in its step stats), beside it."""
    measured = set(spans.loc[~spans["warmup"].astype(bool), "step"].astype(int))
    stage = [(r, int(k), v) for r, i in inputs for k, v in i.get("stage_cpu_ns", {}).items()
             if int(k) in measured]
    if not stage:
        return {"input_ms_per_step": None}
    ranks = {r for r, _ in inputs}
    worker_ms = sum(v for *_, v in stage) / 1e6 / len(stage)
    prep = spans[(spans["name"] == EXCHANGE_PREP_SPAN) & spans["step"].isin(measured)]
    # The thread's real CPU: an emulated run books it as overhead_ns (its cpu_ns is the
    # emulated compute inside the span, none here); elsewhere overhead_ns is 0.
    prep_ms = float((prep["cpu_ns"] + prep["overhead_ns"]).sum()) / 1e6 / (len(measured) * len(ranks))
    out = {"input_ms_per_step": worker_ms + prep_ms, "input_worker_stage_ms_per_step": worker_ms,
           "exchange_prep_ms_per_step": prep_ms}
    for key in ("route_ms", "read_ms"):
        if key in stats.columns:
            values = stats.loc[stats["step"].isin(measured), key]
            if values.notna().all():
                out[f"{key.removesuffix('_ms')}_ms_per_step"] = float(values.mean())
    return out


def plan_accuracy(spans: pd.DataFrame, stats: pd.DataFrame) -> dict:
    """How well a load balancer's predicted per-rank costs matched measured busy time.

    Needs per-step `predicted_cost`, `plan_max`, `plan_lower_bound` and `cost_unit` in the
    step stats (FreeScale writes them; `plan_ms` too since it times its planner). Returns
    plan_ms_per_step (mean over measured steps and ranks), and medians over measured steps of:
    predicted_imbalance (the plan's own load imbalance), plan_ratio_to_bound (max load
    over max(total/N, largest sample)), and, when the cost unit is ms,
    cost_prediction_error (|predicted - busy| / busy per rank and step, busy being the
    thread CPU time of the forward and backward spans)."""
    if "predicted_cost" not in stats.columns or stats["predicted_cost"].isna().all():
        return {}
    busy = metrics.rank_step_busy(spans)
    # The plan predicts per-sample work (forward + backward); the optimizer's cost is the
    # same on every rank and not part of a sample's cost, so it is left out here.
    fwd_bwd = spans[spans["name"].isin(["forward", "backward"])].groupby(["step", "rank"])["cpu_ns"].sum()
    busy = busy.drop(columns="busy_ns").join(fwd_bwd.rename("busy_ns"), on=["step", "rank"])
    joined = stats.merge(busy[["step", "rank", "busy_ns", "warmup"]], on=["step", "rank"])
    joined = joined[~joined["warmup"]]
    per_step = joined.groupby("step").agg(
        plan_max=("plan_max", "first"), bound=("plan_lower_bound", "first"),
        n=("rank", "size"), total=("predicted_cost", "sum"))
    predicted_imbalance = (per_step["plan_max"] * per_step["n"] - per_step["total"]) / (
        per_step["plan_max"] * per_step["n"])
    out = {
        # The planner's CPU time per measured step (a window's planning spread over its
        # steps, as whole windows are measured), beside the step time: where it nears the
        # step time, the input stage, not the step, sets the pace.
        **({"plan_ms_per_step": float(joined["plan_ms"].mean())}
           if "plan_ms" in joined.columns and joined["plan_ms"].notna().all() else {}),
        "predicted_imbalance": float(predicted_imbalance.median()),
        "plan_ratio_to_bound": float((per_step["plan_max"] / per_step["bound"]).median()),
        "cost_unit": str(joined["cost_unit"].iloc[0]),
    }
    if out["cost_unit"] == "ms":
        busy_ms = (joined["busy_ns"] / 1e6).to_numpy()
        pred = joined["predicted_cost"].to_numpy(dtype=float)
        out["cost_prediction_error"] = float(np.median(np.abs(pred - busy_ms) / busy_ms))
        # busy = slope * predicted + intercept over (rank, step): the intercept is per-step
        # work no per-sample model holds (dense embedding gradients, loss setup), equal on
        # every rank and so harmless to balance; the slope and R^2 say how well the
        # per-sample part was predicted.
        if len(pred) >= 3 and np.ptp(pred) > 0:
            slope, intercept = np.polyfit(pred, busy_ms, 1)
            resid = busy_ms - (slope * pred + intercept)
            out.update(cost_fit_slope=float(slope), cost_fit_intercept_ms=float(intercept),
                       cost_fit_r2=float(1 - (resid ** 2).sum() / ((busy_ms - busy_ms.mean()) ** 2).sum()))
    return out


def warmup_steps(spans: pd.DataFrame) -> set[int]:
    """The steps the timelines mark warm-up."""
    return set(spans.loc[spans["warmup"].astype(bool), "step"].astype(int))
