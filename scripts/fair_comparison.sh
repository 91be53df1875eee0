#!/usr/bin/env bash
# Before/after of the fair-comparison protocol (issue 8), side by side on this machine:
# the four trainers at 2 ranks on `small` with two real-shaped length presets, run by the
# code at BASE (default: the commit before the input pipeline) and by this checkout, in
# alternating order so that drift hits both. Writes results/fair_comparison_cpu.md.
# Usage: bash scripts/fair_comparison.sh [BASE_REV]   (about 15 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
BASE="${1:-5d45a71}"
OUT="${OUT:-runs/fair_comparison}"
OLD="$(mktemp -d)/old"
git worktree add -q --detach "$OLD" "$BASE"
trap 'git worktree remove --force "$OLD"' EXIT
PY="$(pwd)/.venv/bin/python"
export TORCH_EXTENSIONS_DIR="$(pwd)/.torch_extensions"  # DeepSpeed's compiled op, shared
sweep() {  # sweep TREE TAG LENGTHS
  (cd "$1" && PYTHONPATH="$1" "$PY" -m fsbench.cli sweep --workload small \
     --trainers ddp,torchrec,deepspeed,freescale --world-sizes 2 --repeats 1 \
     --set "lengths=$3" --out "$OLDPWD/$OUT/$2" 2>/dev/null | tail -n +2)
}
for rep in 1 2; do
  for lengths in amazon-beauty movielens-100k; do
    sweep "$OLD" before "$lengths" > /dev/null
    sweep "$(pwd)" after "$lengths" > /dev/null
  done
done
"$PY" - "$OUT" "$BASE" "$(git rev-parse --short HEAD)" <<'PY' > results/fair_comparison_cpu.md
import sys
import pandas as pd
from fsbench.store import load_runs
out, base, head = sys.argv[1:]
host = open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].split("\n")[0].strip()
import os, torch
print("# Fair comparison: before and after the input pipeline and the bubble's causes\n")
print(f"Machine: {os.cpu_count()} cores, {host}, torch {torch.__version__}. 2 ranks, gloo, "
      f"`small` (HSTU d64 x2, 128 samples/step), two repeats per cell, medians of the "
      f"per-run figures. Before = {base}, after = {head}. Command: "
      "`bash scripts/fair_comparison.sh`.\n")
print("Before: ratios are medians of per-step ratios, and each trainer prepared its input "
      "its own way (TorchRec and FreeScale inside the timed step). After: totals over "
      "measured steps, every trainer's input prepared ahead by a loader worker.\n")
cols = ["samples_per_s", "bubble_ratio", "straggler_bubble_ratio", "exposed_comm_ratio",
        "input_stall_ratio", "other_idle_ratio", "cpu_wait_ratio"]
rows = []
for tag in ("before", "after"):
    runs = load_runs(f"{out}/{tag}")
    runs["lengths"] = runs["workload"].str.replace("small+lengths=", "", regex=False)
    g = runs.groupby(["lengths", "trainer"])[[c for c in cols if c in runs]].median()
    g["version"] = tag
    rows.append(g.reset_index())
t = pd.concat(rows)
ddp = t[t.trainer == "ddp"].set_index(["version", "lengths"])["samples_per_s"]
t["throughput_vs_ddp"] = t.apply(lambda r: r.samples_per_s / ddp[(r.version, r.lengths)], axis=1)
t = t.sort_values(["lengths", "trainer", "version"], ascending=[True, True, False])
fmt = {c: (lambda v: f"{100 * v:.1f}%") for c in cols if c != "samples_per_s"}
fmt["samples_per_s"] = lambda v: f"{v:.0f}"
fmt["throughput_vs_ddp"] = lambda v: f"{v:.2f}x"
order = ["lengths", "trainer", "version", "samples_per_s", "throughput_vs_ddp"] + cols[1:]
print(t[[c for c in order if c in t]].to_markdown(index=False, floatfmt=".3f")
      if False else t[[c for c in order if c in t]].to_string(index=False, formatters=fmt))
PY
echo "wrote results/fair_comparison_cpu.md"
