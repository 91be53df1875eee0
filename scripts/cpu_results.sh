#!/usr/bin/env bash
# Reproduce the CPU numbers committed under results/ (about 8 minutes on 2 cores).
# Run on a quiet machine: every figure is wall- or CPU-time on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
FS=.venv/bin/fsbench
OUT=${OUT:-runs/cpu_results}
mkdir -p results "$OUT"
host="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'), $(date -u +%Y-%m-%d)"
# The commit the numbers come from; "-dirty" when the tree had uncommitted changes to
# tracked files (then the commit alone does not reproduce them).
commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!results' || echo -dirty)"
made_by() { printf '\nMade by `bash scripts/cpu_results.sh` at commit `%s`; each section names its own command.\n' "$commit"; }
section() { printf '\n## %s\n\nMachine: %s; commit `%s`\n\nCommand: `%s`\n\n```\n' "$1" "$host" "$commit" "$2"; }

{
  echo "# Measurement: ground truth and instrumentation overhead (CPU)"
  made_by
  section "Ground truth (fsbench validate)" "fsbench validate --world-size 2"
  $FS validate --world-size 2 --store "$OUT" || echo "(at least one case outside the tolerance)"
  echo '```'
  section "Instrumentation overhead on small" "fsbench overhead --workload small --blocks 22 --steps-per-block 6"
  $FS overhead --workload small --blocks 22 --steps-per-block 6
  echo '```'
} > results/measurement_cpu.md

{
  echo "# FreeScale load balancing (CPU)"
  made_by
  section "Cost model calibration" "fsbench calibrate --workload small"
  $FS calibrate --workload small --store "$OUT" 2>/dev/null
  echo '```'
  section "Side by side, small at 2 ranks" "fsbench sweep --workload small --trainers ddp,freescale --world-sizes 2 --repeats 5"
  $FS sweep --workload small --trainers ddp,freescale --world-sizes 2 --repeats 5 --store "$OUT" 2>/dev/null
  .venv/bin/python - "$OUT" <<'PY'
import sys
from fsbench.running.store import load_runs
runs = load_runs(sys.argv[1])
runs = runs[(runs.workload == "small") & (runs.world_size == 2)].tail(10)
cols = ["trainer", "straggler_bubble_ratio", "load_imbalance", "samples_per_s",
        "predicted_imbalance", "cost_fit_slope", "cost_fit_r2"]
print(runs[[c for c in cols if c in runs]].to_string(index=False))
g = runs.groupby("trainer")
s = g["straggler_bubble_ratio"].median()
t = g["samples_per_s"]
print(f"straggler bubble reduction vs ddp: {1 - s['freescale'] / s['ddp']:.3f}")
print(f"throughput ratio freescale/ddp: median {t.median()['freescale'] / t.median()['ddp']:.3f}, "
      f"per-repeat min {t.min()['freescale'] / t.max()['ddp']:.3f} max {t.max()['freescale'] / t.min()['ddp']:.3f}")
PY
  echo '```'
  section "Noise floor: identical work on both ranks" "fsbench sweep --workload small --trainers ddp --world-sizes 2 --repeats 3 --set lengths=fixed:100"
  $FS sweep --workload small --trainers ddp --world-sizes 2 --repeats 3 --set lengths=fixed:100 --store "$OUT" 2>/dev/null
  echo '```'
  section "Planner time and balance on real-shaped lengths" "python benchmarks/bench_partition.py"
  .venv/bin/python benchmarks/bench_partition.py
  echo '```'
} > results/freescale_balance_cpu.md

{
  echo "# Four trainers on small (CPU): the main job"
  made_by
  section "make run" "fsbench sweep --workload small --trainers ddp,torchrec,deepspeed,freescale --world-sizes 1,2 --repeats 2"
  $FS sweep --workload small --trainers ddp,torchrec,deepspeed,freescale --world-sizes 1,2 --repeats 2 --store "$OUT" 2>/dev/null
  echo '```'
} > results/four_trainers_small_cpu.md
echo "wrote results/measurement_cpu.md results/freescale_balance_cpu.md results/four_trainers_small_cpu.md"
