#!/usr/bin/env bash
# pytest-benchmark against a base commit, as a CI step: the base's suite runs from a
# worktree of BASE and is saved, then this checkout's suite runs and is compared with it;
# exit 1 when a benchmark regressed beyond FAIL (pytest-benchmark's --benchmark-compare-fail).
#
#   scripts/bench_compare.sh BASE [FAIL]        FAIL default median:10% (docs/ci.md: why 10%)
#
# Both sides run on this machine in one job, one after the other, so they share its
# environment (PYTHON, default .venv/bin/python) and its noise. Results: .benchmarks/.
set -euo pipefail
BASE="${1:?usage: scripts/bench_compare.sh BASE [FAIL]}"
FAIL="${2:-median:10%}"
PY="${PYTHON:-.venv/bin/python}"
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # absolute, venv link kept
BENCH_DIR="${BENCH_DIR:-benchmarks}"
STORE="$PWD/.benchmarks"
base_tree="$(mktemp -d)"
cleanup() { git worktree remove --force "$base_tree" > /dev/null 2>&1 || rm -rf "$base_tree"; }
trap cleanup EXIT
git rev-parse --verify --quiet "$BASE^{commit}" > /dev/null \
  || { echo "bench_compare: BASE '$BASE' is not a commit here (a shallow clone? fetch it)" >&2; exit 2; }
git worktree add --detach --quiet "$base_tree" "$BASE"
echo "bench_compare: the base $(git rev-parse --short "$BASE") from $base_tree" >&2
# The base's code first on the path: its own package, not this checkout's.
(cd "$base_tree" && PYTHONPATH="$base_tree${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest "$BENCH_DIR" -q \
  -p no:cacheprovider --benchmark-only --benchmark-storage="file://$STORE" --benchmark-save=base)
echo "bench_compare: this checkout against it (fail on $FAIL)" >&2
"$PY" -m pytest "$BENCH_DIR" -q -p no:cacheprovider --benchmark-only \
  --benchmark-storage="file://$STORE" --benchmark-compare --benchmark-compare-fail="$FAIL"
