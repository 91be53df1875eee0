#!/usr/bin/env bash
# The GPU check: one script for one call of at most 600 s on a lent single-GPU machine
# (H100 or H200, Python 3.12, torch 2.11 cu130, no network, no TorchRec or DeepSpeed).
# Run from the repository root:   bash scripts/gpu_check.sh      (OUT is set there)
# Nothing is installed; the project runs from this source tree (PYTHONPATH=.).
#
# It ends by itself within a deadline of 540 s (GPU_CHECK_DEADLINE_S): every step has a
# budget (BUDGET below; they add up to 510 s, and 25 s stay for the report), and runs
# under `timeout` for the smaller of its budget and what is left. Fastest and most
# telling first: the imports and the GPU (seconds; the check stops there if it fails),
# the self-tests (each CUDA measurement against a known truth), the runs. As each step
# ends its line lands in $OUT/steps.tsv and $OUT/summary.json is rewritten; a trap
# writes the final report on any exit (a failed step, a signal, the deadline), packs
# every log, traceback, run and trace of the work folder into $OUT/work.tar.gz, and
# prints the report. The work folder lives OUTSIDE $OUT (GPU_CHECK_WORK, default a fresh
# temporary folder) and is packed in only at the end: killed too hard for the trap (a
# SIGKILL), $OUT still holds four files (the summary so far among them), never a tree of
# logs and traces that the device tool's file-count limit would cut. What comes back (at
# most 8 files): summary.json, summary.md, steps.tsv, check.log, work.tar.gz,
# traces.tar.gz. NOT YET RUN ON A GPU.
#
#   bash scripts/gpu_check.sh --dry-run   the same steps on CPU (tiny workload, a few
#                                         steps, the python planner; GPU-only steps
#                                         listed as skipped, the self-tests as not
#                                         run): what CI runs (tests/test_gpu_check.py)
#                                         so that the script cannot rot. It writes
#                                         nothing in the checkout.
set -uo pipefail
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
if [ "$DRY" = 1 ]; then
  OUT="${OUT:-$(mktemp -d -t fsbench-gpu-check.XXXXXX)}"
  DEVICE=cpu; WORKLOAD=tiny; STEPS=4; WARMUP=1
  # CI's CPUs run calibrate and simulate slower than the GPU machine's 16 cores: the dry
  # run checks the script, not its timing, so each budget is tripled (the deadline holds).
  BUDGET_SCALE=3
  # The python planner: the simulate step's 64 and 256 ranks would compile the numba one
  # into the fresh NUMBA_CACHE_DIR below (about 20 of the dry run's 80 s on CI's 2 cores).
  # The two make the same plans bit for bit, compiled at cluster scale on every push by
  # tests/test_plan_kernels.py.
  export FSBENCH_PLANNER=python
  # simulate at 8 and 64 GPUs: 256 takes the same code paths (exchanged routing, more than
  # a node, no extrapolation on `tiny`) and timed its input stage for ~18 of the dry run's
  # ~100 s on CI's 2 cores. The projection at 256 is checked on every push by the
  # reference gate (tests/test_compare.py: ddp and freescale on `medium` at 8 and 256).
  SIM_SIZES=8,64
else
  OUT="${OUT:-gpu_out}"
  # 40 steps: 5 warm-up, 8 profiled (one profiler warm-up step before them), 27 timed,
  # long enough for NVML's 100 ms GPM windows on fast steps.
  DEVICE=cuda; WORKLOAD=small; STEPS=40; WARMUP=5
  BUDGET_SCALE=1
  SIM_SIZES=8,64,256
fi
PY="${PY:-python3}"
DEADLINE_S="${GPU_CHECK_DEADLINE_S:-540}"
RESERVE_S="${GPU_CHECK_RESERVE_S:-25}"  # at the end: the full report and the packing
# Seconds per step. Sum: 510 (25+75+40+40+40+45+90+30+30+45+40+10), under the deadline
# less the reserve. docs/gpu.md lists the same table (tests/test_gpu_check.py holds both).
# The preflight tries NCCL, a kernel and GPM (~2 s beyond its imports). simulate replays
# each trainer's step program at 8, 64 and 256 ranks on `small`: 44 s of CPU on the
# 2-core CI VM, hence 40. Paid for by the two option runs (the same work as
# run-freescale, caches warm) and the report (3-5 s on CPU).
declare -A BUDGET=(
  [preflight]=25 [selftests]=75 [run-ddp]=40 [run-freescale]=40 [freescale-sm-free]=40
  [sm-contention]=45 [ground-truth]=90 [freescale-priority-off]=30 [freescale-blocking]=30
  [calibrate]=45 [simulate]=40 [report]=10
)
ORDER=(preflight selftests run-ddp run-freescale freescale-sm-free sm-contention ground-truth
       freescale-priority-off freescale-blocking calibrate simulate report)

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="${GPU_CHECK_WORK:-$(mktemp -d -t fsbench-gpu-work.XXXXXX)}"
mkdir -p "$WORK/logs" "$WORK/tmp"
WORK="$(cd "$WORK" && pwd)"
STEPS_TSV="$OUT/steps.tsv"
CHECK_LOG="$OUT/check.log"
: > "$STEPS_TSV"
: > "$CHECK_LOG"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
export TMPDIR="$WORK/tmp"                  # fsbench's internal-error logs land in the work folder
export NUMBA_CACHE_DIR="$WORK/numba-cache"  # numba's cache, not beside the sources
export MPLCONFIGDIR="$WORK/mpl"
SUMMARY_ARGS=("$OUT" "$DEVICE" --work "$WORK")
[ "$DRY" = 1 ] && SUMMARY_ARGS+=(--dry-run)
STOP_REASON=""
CHILD=""         # the step running now (its `timeout`), for the signal trap
CURRENT_STEP=""

check_meta() {  # the deadline and the time used so far, for the report
  printf '{"deadline_s": %s, "elapsed_s": %s, "dry_run": %s}\n' "$DEADLINE_S" "$SECONDS" \
    "$([ "$DRY" = 1 ] && echo true || echo false)" > "$WORK/check.json"
}

partial_summary() {  # cheap (standard library only): after every step
  check_meta
  timeout 20 "$PY" scripts/gpu_check_summary.py "${SUMMARY_ARGS[@]}" --steps-only \
    >> "$WORK/logs/summary.log" 2>&1
}

record() {  # record NAME RESULT SECONDS: one line of steps.tsv, then the report so far
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${BUDGET[$1]}" >> "$STEPS_TSV"
  partial_summary
}

skip() {  # skip NAME WHY: a step this machine cannot run (the dry run's GPU steps), said so
  echo "## $1: skipped ($2)" >> "$CHECK_LOG"
  record "$1" "skipped: $2" 0
}

not_run() {  # not_run NAME WHY: a step that should have run and did not: the check fails
  echo "## $1: NOT RUN ($2)" >> "$CHECK_LOG"
  record "$1" "not run: $2" 0
}

step() {  # step NAME CMD...: run under the smaller of its budget and the time left
  local name="$1"; shift
  local left=$(( DEADLINE_S - RESERVE_S - SECONDS ))
  if [ -n "$STOP_REASON" ]; then not_run "$name" "$STOP_REASON"; return 1; fi
  if [ "$left" -lt 5 ]; then not_run "$name" "no time left before the ${DEADLINE_S} s deadline"; return 1; fi
  local budget=$(( BUDGET[$name] * BUDGET_SCALE ))
  local limit=$(( budget < left ? budget : left ))
  local log="$WORK/logs/$name.log" t0=$SECONDS code
  # In the background and waited for: a signal then reaches the trap at once (bash runs
  # traps only between foreground commands), which stops the step and writes the report.
  CURRENT_STEP="$name"
  timeout --kill-after=5 "$limit" "$@" > "$log" 2>&1 &
  CHILD=$!
  wait "$CHILD"
  code=$?
  CHILD=""; CURRENT_STEP=""
  {
    echo "## $name: exit $code after $(( SECONDS - t0 )) s (budget ${BUDGET[$name]} s, limit $limit s)"
    [ "$code" = 124 ] || [ "$code" = 137 ] && echo "TIMED OUT at $limit s"
    tail -n 25 "$log"
  } >> "$CHECK_LOG"
  record "$name" "$code" "$(( SECONDS - t0 ))"
  return "$code"
}

run() {  # run NAME WORKLOAD TRAINER [ARGS...]: one fsbench run on $DEVICE at world size 1
  local name="$1" workload="$2" trainer="$3"; shift 3
  step "$name" "$PY" -m fsbench.cli run --workload "$workload" --trainer "$trainer" \
    --device "$DEVICE" --world-size 1 --steps "$STEPS" --warmup "$WARMUP" --store "$WORK/runs" "$@"
}

pack() {  # the work folder into two archives in $OUT (each under the 16 MiB a file may
  # be; their members named work/...), then the folder removed
  local parent base
  parent="$(dirname "$WORK")"; base="$(basename "$WORK")"
  (cd "$parent" && find "$base" -name 'kineto-*' > "$WORK/tmp/traces.txt" 2>/dev/null
   tar -czf "$OUT/work.tar.gz" --transform "s|^$base|work|" --exclude='kineto-*' \
     --exclude="$base/tmp" "$base" 2>> "$CHECK_LOG"
   if [ -s "$WORK/tmp/traces.txt" ]; then
     tar -czf "$OUT/traces.tar.gz" --transform "s|^$base|work|" -T "$WORK/tmp/traces.txt" 2>> "$CHECK_LOG"
   fi)
  for f in "$OUT/work.tar.gz" "$OUT/traces.tar.gz"; do
    if [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt $(( 15 * 1024 * 1024 )) ]; then
      echo "$(basename "$f") is over 15 MiB: left out (it would not come back)" >> "$CHECK_LOG"; rm -f "$f"
    fi
  done
  rm -rf "$WORK"
}

finish() {  # on any exit: the final report, the archives, the report printed
  local code=$?
  trap - EXIT
  if [ -n "$CURRENT_STEP" ]; then  # killed in the middle of a step
    [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null && wait "$CHILD" 2>/dev/null
    echo "## $CURRENT_STEP: killed by a signal (exit $code)" >> "$CHECK_LOG"
    record "$CURRENT_STEP" "$code" 0
  fi
  check_meta
  timeout "$(( RESERVE_S > 13 ? RESERVE_S - 8 : 5 ))" "$PY" scripts/gpu_check_summary.py "${SUMMARY_ARGS[@]}" \
    >> "$WORK/logs/summary.log" 2>&1
  local written=$?  # 0: all passed, 3: something failed; else the report itself failed
  if [ "$written" != 0 ] && [ "$written" != 3 ]; then
    echo "## the final report failed (exit $written, work/logs/summary.log): summary.json is the steps-only one" >> "$CHECK_LOG"
    partial_summary
  fi
  pack
  cat "$OUT/summary.md" 2>/dev/null || cat "$CHECK_LOG"
  echo "report: $OUT/summary.json, $OUT/summary.md (the script's own exit code before the report: $code)"
  [ "$written" = 0 ] && exit 0  # everything that ran passed
  exit 1
}
trap finish EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# 1. The imports and the GPU, in seconds: everything after needs them.
PREFLIGHT=("$PY" scripts/gpu_preflight.py "$WORK/preflight.json")
[ "$DRY" = 1 ] && PREFLIGHT+=(--dry-run)
step preflight "${PREFLIGHT[@]}" || STOP_REASON="the preflight step failed (see its lines in check.log)"

# 2. Each CUDA measurement against a truth known on one GPU (scripts/gpu_selftests.py);
#    in the dry run they are imported and listed as not run.
step selftests "$PY" scripts/gpu_selftests.py "$WORK/selftests.json" "$WORK/selftests" quick

# 3. The trainers that run here at world size 1 on `small`: ddp, FreeScale's defaults, and
#    FreeScale over the copy-engine transport (symmetric memory, at one rank).
run run-ddp "$WORKLOAD" ddp
run run-freescale "$WORKLOAD" freescale
if [ "$DRY" = 1 ]; then skip freescale-sm-free "needs CUDA ranks"
else run freescale-sm-free "$WORKLOAD" freescale --set freescale.transport=sm_free; fi

# 4. A GEMM alone, beside an SM copy, beside the other copies (<1 s of GPU work), each copy
#    labelled by GPM SM utilization while it ran alone (~0.5 s each).
if [ "$DRY" = 1 ]; then skip sm-contention "needs a GPU"
else step sm-contention "$PY" -m fsbench.cli micro sm-contention --gemm-size 8192 \
  --bytes 268435456 --repeats 20 --out "$WORK/micro"; fi

# 5. fsbench validate's ground-truth workloads on CUDA (device time), within 0.03.
step ground-truth "$PY" scripts/gpu_selftests.py "$WORK/groundtruth.json" "$WORK/selftests" ground-truth

# 6. FreeScale's other switches that mean something at one rank.
run freescale-priority-off "$WORKLOAD" freescale --set freescale.priority=off
run freescale-blocking "$WORKLOAD" freescale --set freescale.overlap=off --set freescale.priority=off

# 7. The encoder measured on this device, and the h100 projection booking it
#    (--cluster-fit) in place of the assumed FLOPs figures.
step calibrate "$PY" -m fsbench.cli calibrate --workload "$WORKLOAD" --device "$DEVICE" \
  --passes 1 --repeats 3 --store "$WORK/runs"
FIT=$(ls "$WORK"/runs/calibrations/*.json 2>/dev/null | grep -v '/comm__' | head -n 1)
if [ -n "$FIT" ]; then
  step simulate "$PY" -m fsbench.cli simulate --cluster h100 --cluster-fit "$FIT" \
    --workload "$WORKLOAD" --trainers ddp,freescale --world-sizes "$SIM_SIZES" --steps 6 --warmup 2 \
    --store "$WORK/runs" --sim-store "$WORK/simulated"
else
  not_run simulate "no fit was stored by the calibrate step"
fi
step report "$PY" -m fsbench.cli report --store "$WORK/runs" --format md --out "$WORK/report" --no-plots
exit 0  # the trap writes the report and sets the exit code
