#!/usr/bin/env bash
# The GPU checks, as one short script for a lent GPU machine (see README): installs the
# CUDA builds, runs the GPU-marked tests and a 1-rank CUDA run of each trainer on `tiny`
# and `small`, and writes a small report under $OUT (default ./gpu_out).
# Not yet run on a GPU: no device was lent to the sessions that wrote it.
set -uo pipefail
OUT="${OUT:-gpu_out}"
mkdir -p "$OUT"
export FSBENCH_GPU=1
bash scripts/setup.sh .venv-gpu > "$OUT/setup.log" 2>&1 || { echo "setup failed"; tail -20 "$OUT/setup.log"; exit 1; }
PY=.venv-gpu/bin/python
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY -m pytest -q -m gpu tests 2>&1 | tail -15
  for t in ddp freescale deepspeed torchrec; do
    $PY -m fsbench.cli run --workload small --trainer "$t" --device cuda --world-size 1 \
        --out "$OUT/runs" 2>&1 | tail -3
  done
} 2>&1 | tee "$OUT/report.txt"
