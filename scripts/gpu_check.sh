#!/usr/bin/env bash
# The GPU checks, as one short script for a lent GPU machine. Run through the device tool
# from the repository root:   bash scripts/gpu_check.sh      (OUT is set there; default ./gpu_out)
# That machine's python3 already has torch (2.11, CUDA) and no network: nothing is
# installed; the project runs from this source tree (PYTHONPATH=.). TorchRec and DeepSpeed
# are not on it: their runs are skipped with a line saying so. Every step runs whatever
# the one before did (one scarce try collects everything); each step's exit code lands in
# $OUT/report.txt, and $OUT/summary.json + $OUT/summary.md gather the steps' exit codes
# and every run's summary. Budget: under ~8 minutes. NOT YET RUN ON A GPU.
#
#   bash scripts/gpu_check.sh --dry-run   the same steps on CPU (tiny, a few steps), the
#                                         GPU-only ones listed as skipped: what CI runs
#                                         (tests/test_gpu_check.py) so the script cannot rot.
set -uo pipefail
OUT="${OUT:-gpu_out}"
PY="${PY:-python3}"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
if [ "$DRY" = 1 ]; then
  DEVICE=cpu; WORKLOAD=tiny; HEAVY=tiny; STEPS=4; WARMUP=1
else
  DEVICE=cuda; WORKLOAD=small; HEAVY=comm-heavy; STEPS=12; WARMUP=4
fi
mkdir -p "$OUT"
REPORT="$OUT/report.txt"
STEPS_TSV="$OUT/steps.tsv"
: > "$REPORT"
: > "$STEPS_TSV"
step() {  # step NAME TIMEOUT_S CMD...: run, log, record the exit code
  local name="$1" limit="$2"; shift 2
  echo "## $name" >> "$REPORT"
  timeout "$limit" "$@" >> "$REPORT" 2>&1
  local code=$?
  echo "exit code ($name): $code" >> "$REPORT"
  printf '%s\t%s\n' "$name" "$code" >> "$STEPS_TSV"
}
skip() {  # skip NAME WHY: a step this machine cannot run, said so
  echo "## $1: skipped ($2)" >> "$REPORT"
  printf '%s\tskipped: %s\n' "$1" "$2" >> "$STEPS_TSV"
}
run() {  # run NAME WORKLOAD TRAINER [ARGS...]: one fsbench run on $DEVICE at world size 1
  local name="$1" workload="$2" trainer="$3"; shift 3
  step "$name" 150 "$PY" -m fsbench.cli run --workload "$workload" --trainer "$trainer" \
    --device "$DEVICE" --world-size 1 --steps "$STEPS" --warmup "$WARMUP" --store "$OUT/runs" "$@"
}

if [ "$DRY" = 1 ]; then
  skip "gpu" "dry run on CPU"
else
  step "gpu" 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
fi
step "versions" 60 "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None, 'gpus', torch.cuda.device_count())"
if [ "$DRY" = 1 ]; then
  skip "gpu tests" "dry run on CPU"
else
  step "gpu tests" 240 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider
fi
trainers="ddp freescale"
for t in torchrec deepspeed; do
  if [ "$DRY" = 1 ]; then skip "run $t" "not in the dry run (the GPU machine has no $t)"
  elif "$PY" -c "import $t" 2>/dev/null; then trainers="$trainers $t"
  else skip "run $t" "$t is not installed on this machine"; fi
done
for t in $trainers; do
  run "run $t" "$WORKLOAD" "$t"
done
# FreeScale's embedding exchange over copy engines (symmetric memory), on the one GPU: one
# rank exercises rendezvous, staging, pulls and barriers; the comm-heavy preset moves the most.
if [ "$DRY" = 1 ]; then
  skip "freescale sm_free" "needs CUDA ranks"
else
  run "freescale sm_free" "$HEAVY" freescale --set freescale.transport=sm_free
fi
run "freescale collective" "$HEAVY" freescale
# GEMM alone / beside an SM copy / beside copy-engine copies: < 1 s of GPU work at these
# sizes (an 8192^3 GEMM is ~2 ms on an H200); the rest is start-up. Record: $OUT/micro/*.json
if [ "$DRY" = 1 ]; then
  skip "sm-contention" "needs a GPU"
else
  step "sm-contention" 90 "$PY" -m fsbench.cli micro sm-contention --gemm-size 8192 \
    --bytes 268435456 --repeats 20 --out "$OUT/micro"
fi
# The encoder measured on this device (one pass: the GPU is not shared), then the h100
# projection booking it in place of the assumed FLOPs figures (--cluster-fit).
step "calibrate" 120 "$PY" -m fsbench.cli calibrate --workload "$WORKLOAD" --device "$DEVICE" \
  --passes 1 --repeats 3 --store "$OUT/runs"
FIT=$(ls "$OUT"/runs/calibrations/*.json 2>/dev/null | grep -v '/comm__' | head -n 1)
if [ -n "$FIT" ]; then
  step "simulate with the fit" 120 "$PY" -m fsbench.cli simulate --cluster h100 --cluster-fit "$FIT" \
    --workload "$WORKLOAD" --trainers ddp,freescale --world-sizes 8,64,256 --steps 6 --warmup 2 \
    --store "$OUT/runs" --sim-store "$OUT/simulated"
else
  skip "simulate with the fit" "no fit was stored by the calibrate step"
fi
step "report" 60 "$PY" -m fsbench.cli report --store "$OUT/runs" --format md --out "$OUT/report" --no-plots
step "summary" 60 "$PY" scripts/gpu_check_summary.py "$OUT" "$DEVICE"
cat "$REPORT"
