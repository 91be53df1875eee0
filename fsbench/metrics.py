"""Metrics: pure functions from timeline DataFrames to tables, as ARCHITECTURE.md defines them.

Input: one row per span (rank, step, warmup, name, kind, start_ns, dur_ns, cpu_ns), as
`fsbench.timeline.read_timelines` returns, plus per-rank step stats (rank, step,
num_samples, num_targets, loss). Nothing here reads files or clocks.

For step k on N ranks:
  T          = last rank's end of its `step` span - first rank's start of it
               (every rank starts the span right after the step's start barrier)
  busy_r     = thread CPU time of rank r's compute spans in step k (on CUDA runs: their
               compute-stream time from CUDA events, `gpu_ns`)
  bubble     = sum_r (T - busy_r) / (N T)
  straggler  = sum_r (max_j busy_j - busy_r) / (N T)
  exposed    = bubble - straggler
  imbalance  = sum_r (max_j busy_j - busy_r) / (N max_j busy_j)
  skew       = max_j busy_j / median_r busy_r
"""
from __future__ import annotations

import numpy as np
import pandas as pd

STEP_COLUMNS = [
    "step", "step_time_ms", "busy_max_ms", "busy_mean_ms", "bubble_ratio",
    "straggler_bubble_ratio", "exposed_comm_ratio", "load_imbalance",
]


def rank_step_busy(spans: pd.DataFrame) -> pd.DataFrame:
    """One row per (step, rank): step span start/end and busy time (ns)."""
    steps = spans[spans["kind"] == "step"]
    bounds = steps.groupby(["step", "rank"]).agg(
        start_ns=("start_ns", "min"),
        end_ns=("start_ns", "max"),
        dur_ns=("dur_ns", "max"),
        warmup=("warmup", "first"),
    )
    bounds["end_ns"] = bounds["end_ns"] + bounds["dur_ns"]
    compute = spans[spans["kind"] == "compute"]
    # CUDA runs: compute-stream time from CUDA events (gpu_ns) is busy time; on CPU runs
    # the column is empty and thread CPU time is.
    col = "gpu_ns" if "gpu_ns" in compute and compute["gpu_ns"].notna().any() else "cpu_ns"
    busy = compute.groupby(["step", "rank"])[col].sum()
    out = bounds.drop(columns="dur_ns").join(busy.rename("busy_ns"), how="left")
    out["busy_ns"] = out["busy_ns"].fillna(0).astype("int64")
    return out.reset_index()


def step_metrics(spans: pd.DataFrame) -> pd.DataFrame:
    """One row per step with the definitions above (warm-up steps included, flagged)."""
    per_rank = rank_step_busy(spans)
    rows = []
    for step, g in per_rank.groupby("step"):
        t = float(g["end_ns"].max() - g["start_ns"].min())
        busy = g["busy_ns"].to_numpy(dtype=float)
        n, bmax = len(busy), busy.max()
        bubble = float(np.sum(t - busy) / (n * t)) if t > 0 else 0.0
        straggler = float(np.sum(bmax - busy) / (n * t)) if t > 0 else 0.0
        rows.append({
            "step": int(step),
            "warmup": bool(g["warmup"].iloc[0]),
            "num_ranks": n,
            "step_time_ms": t / 1e6,
            "busy_max_ms": bmax / 1e6,
            "busy_mean_ms": float(busy.mean()) / 1e6,
            # Clip at 0: a rank's thread CPU time can exceed wall time by clock granularity.
            "bubble_ratio": max(bubble, 0.0),
            "straggler_bubble_ratio": straggler,
            "exposed_comm_ratio": max(bubble, 0.0) - straggler,
            "load_imbalance": float(np.sum(bmax - busy) / (n * bmax)) if bmax > 0 else 0.0,
            # Per-rank skew: the slowest rank against the typical one (1.0 = no skew).
            "busy_skew": float(bmax / np.median(busy)) if np.median(busy) > 0 else 1.0,
        })
    return pd.DataFrame(rows)


def throughput(step_table: pd.DataFrame, stats: pd.DataFrame) -> pd.DataFrame:
    """Adds samples_per_s and tokens_per_s per step (global counts over step time)."""
    totals = stats.groupby("step")[["num_samples", "num_targets"]].sum()
    out = step_table.join(totals, on="step")
    secs = out["step_time_ms"] / 1e3
    out["samples_per_s"] = out["num_samples"] / secs
    out["tokens_per_s"] = out["num_targets"] / secs
    return out


def summarize(spans: pd.DataFrame, stats: pd.DataFrame) -> dict:
    """Medians over measured (non-warm-up) steps, plus the global loss per step."""
    table = throughput(step_metrics(spans), stats)
    measured = table[~table["warmup"]]
    if measured.empty:
        raise ValueError("no measured steps: every step is a warm-up step")
    med = measured.median(numeric_only=True)
    losses = stats.groupby("step")["loss"].sum().sort_index()
    return {
        "steps_measured": int(len(measured)),
        "step_time_ms_median": float(med["step_time_ms"]),
        "step_time_ms_p10": float(measured["step_time_ms"].quantile(0.1)),
        "step_time_ms_p90": float(measured["step_time_ms"].quantile(0.9)),
        "samples_per_s": float(med["samples_per_s"]),
        "tokens_per_s": float(med["tokens_per_s"]),
        "bubble_ratio": float(med["bubble_ratio"]),
        "straggler_bubble_ratio": float(med["straggler_bubble_ratio"]),
        "exposed_comm_ratio": float(med["exposed_comm_ratio"]),
        "load_imbalance": float(med["load_imbalance"]),
        "busy_max_ms_median": float(med["busy_max_ms"]),
        "busy_skew": float(med["busy_skew"]),
        "bubble_ratio_p10": float(measured["bubble_ratio"].quantile(0.1)),
        "bubble_ratio_p90": float(measured["bubble_ratio"].quantile(0.9)),
        "loss_first": float(losses.iloc[0]),
        "loss_last": float(losses.iloc[-1]),
        "losses": [float(x) for x in losses],
    }


def plan_accuracy(spans: pd.DataFrame, stats: pd.DataFrame) -> dict:
    """How well a load balancer's predicted per-rank costs matched measured busy time.

    Needs per-step `predicted_cost`, `plan_max`, `plan_lower_bound` and `cost_unit` in the
    step stats (FreeScale writes them). Returns medians over measured steps of:
    predicted_imbalance (the plan's own load imbalance), plan_ratio_to_bound (max load
    over max(total/N, largest sample)), and, when the cost unit is ms,
    cost_prediction_error (|predicted - busy| / busy per rank and step, busy being the
    thread CPU time of the forward and backward spans)."""
    if "predicted_cost" not in stats.columns or stats["predicted_cost"].isna().all():
        return {}
    busy = rank_step_busy(spans)
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
