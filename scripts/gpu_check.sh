#!/usr/bin/env bash
# The GPU checks, as one short script for a lent GPU machine. Run through the device tool
# from the repository root:   bash scripts/gpu_check.sh      (OUT is set there; default ./gpu_out)
# That machine's python3 already has torch (2.11, CUDA) and no network: nothing is
# installed; the project runs from this source tree (PYTHONPATH=.). TorchRec and DeepSpeed
# are not on it: their runs are skipped with a line saying so. Every step runs whatever
# the one before did (one scarce try collects everything); each step's exit code lands in
# $OUT/report.txt. Budget: under ~8 minutes. NOT YET RUN ON A GPU.
set -uo pipefail
OUT="${OUT:-gpu_out}"
PY="${PY:-python3}"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
REPORT="$OUT/report.txt"
: > "$REPORT"
step() {  # step NAME TIMEOUT_S CMD...: run, log, record the exit code
  local name="$1" limit="$2"; shift 2
  echo "## $name" >> "$REPORT"
  timeout "$limit" "$@" >> "$REPORT" 2>&1
  echo "exit code ($name): $?" >> "$REPORT"
}
step "gpu" 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
step "versions" 60 "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None, 'gpus', torch.cuda.device_count())"
step "gpu tests" 240 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider
trainers="ddp freescale"
for t in torchrec deepspeed; do
  if "$PY" -c "import $t" 2>/dev/null; then trainers="$trainers $t"
  else echo "$t: not installed on this machine, skipped" >> "$REPORT"; fi
done
for t in $trainers; do
  step "run $t" 150 "$PY" -m fsbench.cli run --workload small --trainer "$t" --device cuda \
    --world-size 1 --steps 12 --warmup 4 --store "$OUT/runs"
done
# FreeScale's embedding exchange over copy engines (symmetric memory), on the one GPU: one
# rank exercises rendezvous, staging, pulls and barriers; the comm-heavy preset moves the most.
step "freescale sm_free" 150 "$PY" -m fsbench.cli run --workload comm-heavy --trainer freescale \
  --device cuda --world-size 1 --steps 12 --warmup 4 --set freescale.transport=sm_free --store "$OUT/runs"
step "freescale collective" 150 "$PY" -m fsbench.cli run --workload comm-heavy --trainer freescale \
  --device cuda --world-size 1 --steps 12 --warmup 4 --store "$OUT/runs"
# GEMM alone / beside an SM copy / beside copy-engine copies: < 1 s of GPU work at these
# sizes (an 8192^3 GEMM is ~2 ms on an H200); the rest is start-up. Record: $OUT/micro/*.json
step "sm-contention" 90 "$PY" -m fsbench.cli micro sm-contention --gemm-size 8192 \
  --bytes 268435456 --repeats 20 --out "$OUT/micro"
step "report" 60 "$PY" -m fsbench.cli report --store "$OUT/runs" --format md --out "$OUT/report" --no-plots
cat "$REPORT"
