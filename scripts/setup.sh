#!/usr/bin/env bash
# Create (or update) the virtual environment with fsbench and its test tools.
# Idempotent: re-running only installs what changed.   Usage: scripts/setup.sh [VENV_DIR]
set -euo pipefail
VENV="${1:-.venv}"
PYTHON="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/pip"
# torch first and pinned: a bare `torch` requirement can resolve to a multi-GB CUDA build.
"$PIP" install -q "torch==2.13.0"
"$PIP" install -q -e ".[dev]"
