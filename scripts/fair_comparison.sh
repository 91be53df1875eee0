#!/usr/bin/env bash
# Before/after of the fair-comparison protocol (issue 8), side by side on this machine:
# the four trainers at 2 ranks on `small` with two real-shaped length presets, run by the
# code at BASE (default: the commit before the input pipeline) and by this checkout,
# alternating so that drift hits both. Both sets of runs are then summarized by THIS
# checkout's metrics (totals, the four causes), beside what the old code reported.
# Writes results/fair_comparison_cpu.md.   Usage: bash scripts/fair_comparison.sh [BASE]
set -euo pipefail
cd "$(dirname "$0")/.."
BASE="${1:-5d45a71}"
OUT="${OUT:-runs/fair_comparison}"
REPEATS="${REPEATS:-2}"
OLD="$(mktemp -d)/old"
git worktree add -q --detach "$OLD" "$BASE"
trap 'git worktree remove --force "$OLD"' EXIT
HERE="$(pwd)"
PY="$HERE/.venv/bin/python"
export TORCH_EXTENSIONS_DIR="$HERE/.torch_extensions"  # DeepSpeed's compiled op, shared
sweep() {  # sweep TREE TAG LENGTHS
  # The store's flag: --store, or --out in a tree older than the flags' one vocabulary.
  local store=--out
  { [ -f "$1/fsbench/cli/args.py" ] || [ -f "$1/fsbench/cli_args.py" ]; } && store=--store
  (cd "$1" && PYTHONPATH="$1" "$PY" -m fsbench.cli sweep --workload small \
     --trainers ddp,torchrec,deepspeed,freescale --world-sizes 2 --repeats 1 \
     --set "lengths=$3" "$store" "$HERE/$OUT/$2" > /dev/null 2>&1)
}
for rep in $(seq "$REPEATS"); do
  for lengths in amazon-beauty movielens-100k; do
    echo "repeat $rep, $lengths: before" >&2; sweep "$OLD" before "$lengths"
    echo "repeat $rep, $lengths: after" >&2; sweep "$HERE" after "$lengths"
  done
done
"$PY" scripts/fair_comparison_table.py "$OUT" "$BASE" "$(git rev-parse --short HEAD)" \
  > results/fair_comparison_cpu.md
echo "wrote results/fair_comparison_cpu.md"
