"""The table of scripts/fair_comparison.sh: every run of both versions summarized by this
checkout's metrics, beside the figures the old code reported (medians of per-step ratios).
Usage: python scripts/fair_comparison_table.py OUT BASE HEAD"""
import os
import platform
import sys
from pathlib import Path

import pandas as pd
import torch

from fsbench.measurement import metrics
from fsbench.measurement.timeline import read_step_stats
from fsbench.running.store import load_runs
from fsbench.measurement.timeline import read_timelines

out, base, head = sys.argv[1:]
CAUSES = ["straggler_bubble_ratio", "exposed_comm_ratio", "input_stall_ratio", "other_idle_ratio"]
rows = []
for tag in ("before", "after"):
    for _, run in load_runs(f"{out}/{tag}").iterrows():
        now = metrics.summarize(read_timelines(run["run_dir"]), read_step_stats(Path(run["run_dir"])))
        rows.append({"version": tag, "lengths": run["workload"].split("lengths=")[-1],
                     "trainer": run["trainer"], "reported_samples_per_s": run["samples_per_s"],
                     "reported_bubble": run["bubble_ratio"],
                     **{k: now[k] for k in ["samples_per_s", "bubble_ratio", *CAUSES, "cpu_wait_ratio"]}})
t = pd.DataFrame(rows).groupby(["lengths", "trainer", "version"], sort=False).median().reset_index()
ddp = t[t.trainer == "ddp"].set_index(["version", "lengths"])["samples_per_s"]
t["vs_ddp"] = [r.samples_per_s / ddp[(r.version, r.lengths)] for r in t.itertuples()]
t = t.sort_values(["lengths", "trainer", "version"], ascending=[True, True, False])
pct = lambda v: f"{100 * v:.1f}"  # noqa: E731
fmt = {c: pct for c in ["reported_bubble", "bubble_ratio", *CAUSES, "cpu_wait_ratio"]}
fmt.update(samples_per_s=lambda v: f"{v:.0f}", reported_samples_per_s=lambda v: f"{v:.0f}",
           vs_ddp=lambda v: f"{v:.2f}x")
print("# Fair comparison: before and after the input pipeline and the bubble's causes\n")
print(f"Machine: {os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
      f"torch {torch.__version__}, gloo, 2 ranks; `small` (HSTU d64 x2, 128 samples per step, "
      f"30 steps, 5 warm-up) with two real-shaped length presets. Before = `{base}`, after = "
      f"`{head}`, runs alternating, medians over repeats. Command: "
      "`bash scripts/fair_comparison.sh`.\n")
print("`reported_*`: what each version's own summary said (before: medians of per-step "
      "ratios; the TorchRec and FreeScale trainers prepared input inside the timed step). "
      "The other columns re-read every run's timelines with this checkout's metrics: totals "
      "over measured steps, the bubble split into four causes (percent of N x T). Before, "
      "`data` spans inside the step count as input stall.\n")
print("```")
print(t.to_string(index=False, formatters=fmt))
print("```")
after = load_runs(f"{out}/after")
gap = (after[CAUSES].sum(axis=1) - after["bubble_ratio"]).abs().max()
print(f"\nAfter, every run's summary: |sum of the four causes - bubble| <= {gap:.1e}; "
      f"batches generated in a rank's training process: {int(after['batches_generated_in_rank'].max())} "
      f"(max over runs); contended runs: {int(after['contended'].sum())} of {len(after)}.")
spread = after.groupby(["workload", "trainer"])["samples_per_s"].agg(lambda x: (x.max() - x.min()) / x.median())
print("\nThroughput spread over repeats, (max - min) / median, after: "
      + ", ".join(f"{w.split('=')[-1]}/{t}: {v:.1%}" for (w, t), v in spread.items()) + ".")
