#!/usr/bin/env bash
# Every CUDA path and the GPU tables in one command, on a GPU machine, over
# the binaries scripts/gpu-pack.sh bundled (that machine has no Rust and no
# network). Run from anywhere; it works in the repository root.
#
#   scripts/gpu-check.sh [--results DIR] [--only STEP] [--force] [--time-limit S]
#                        [--bin-dir DIR] [--profile NAME] [--latency-args ARGS]
#                        [--colocate-base-mb MB]
#                        [--dry-run]
#
# Steps, in order: tests, copy-bw, worker, hook, colocate, latency. Each one
# writes its rows as they end (DIR/STEP.rows.jsonl) and its result when it
# ends (DIR/STEP.json); a step whose result exists is skipped, so after a
# time limit the same command resumes (a step cut short resumes at its next
# row). A step's failure is recorded and the next step runs. The report,
# DIR/gpu-results.md (copy it to docs/gpu-results.md), is rewritten after
# every step. Exit status: 0 when no step failed, 1 when one did, 3 when a
# step stopped for time (rerun to resume), 2 for a usage or setup error.
#
#   --results DIR     results folder (default gpu-results/)
#   --only STEP       run this step only
#   --force           rerun the steps even when their results exist
#   --time-limit S    stop starting work S seconds after the start, leaving
#                     time for the report (default 540: the GPU machine's
#                     commands end at 600 s)
#   --bin-dir DIR     the binaries: a bundle (DIR/bin, DIR/tests, as
#                     gpu-pack.sh makes) or a cargo profile folder such as
#                     target/debug. Default: gpu-bundle/, else target/release,
#                     else target/debug
#   --profile NAME    tensilectl's device profile (default: from the GPU's
#                     name: h200 for an H200, h100 for an H100 and others;
#                     cpu in a dry run)
#   --latency-args ARGS  more flags for scripts/gpu_check/latency.py, one
#                     string, after the built-in ones (a later flag wins):
#                     e.g. "--max-profile-s 90 --reserve-s 40 --accept-partial"
#                     to fit the latency step into a short lease
#   --colocate-base-mb MB  the colocate step's base of each process (what it
#                     holds outside its storages), instead of the one the
#                     vanilla run alone showed; its row is named for it
#   --dry-run         the same steps on the CPU at toy sizes, so that CI
#                     tests this script; GPU-only steps say "skipped: no GPU"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
HERE=$ROOT/scripts/gpu_check
ALL_STEPS=(tests copy-bw worker hook colocate latency)

say() { printf '[gpu-check %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() {
  printf 'gpu-check: %s\n' "$*" >&2
  exit 2
}

RESULTS=gpu-results
ONLY=""
FORCE=0
TIME_LIMIT=540
BIN_DIR=""
PROFILE=""
DRY=0
LATENCY_EXTRA=""
COLOCATE_EXTRA=()
while (($#)); do
  case $1 in
    --results) RESULTS=${2:?--results needs a folder}; shift 2 ;;
    --only) ONLY=${2:?--only needs a step}; shift 2 ;;
    --force) FORCE=1; shift ;;
    --time-limit) TIME_LIMIT=${2:?--time-limit needs seconds}; shift 2 ;;
    --bin-dir) BIN_DIR=${2:?--bin-dir needs a folder}; shift 2 ;;
    --profile) PROFILE=${2:?--profile needs a name}; shift 2 ;;
    --latency-args) LATENCY_EXTRA=${2?--latency-args needs a string}; shift 2 ;;
    --colocate-base-mb)
      [[ ${2-} =~ ^[1-9][0-9]*$ ]] || die "--colocate-base-mb needs a positive whole number of MB"
      COLOCATE_EXTRA=(--base-mb "$2"); shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
if [[ -n $ONLY && " ${ALL_STEPS[*]} " != *" $ONLY "* ]]; then
  die "--only $ONLY: no such step (${ALL_STEPS[*]})"
fi
[[ $TIME_LIMIT =~ ^[0-9]+$ ]] || die "--time-limit $TIME_LIMIT: a whole number of seconds"
mkdir -p "$RESULTS/logs"
RESULTS=$(cd "$RESULTS" && pwd)
START=$(date +%s)
export GPU_CHECK_DEADLINE=$((START + TIME_LIMIT))

# -- Python and PyTorch ------------------------------------------------------
if [[ -n ${PYTHON:-} ]]; then
  PY=$PYTHON
elif [[ -x .venv/bin/python ]]; then
  PY=$ROOT/.venv/bin/python
else
  PY=python3
fi
command -v "$PY" >/dev/null || die "no $PY: Python 3 with PyTorch is needed (set PYTHON)"
TORCH_LIB=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null) ||
  die "$PY cannot import torch: PyTorch 2.11 is needed (the binaries link its libtorch)"
export LD_LIBRARY_PATH=$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# ONNX Runtime for the shipped cold-start latency models (the hook's tests
# plan on the cpu profile): the binaries' built-in path is the build
# machine's, so this machine's onnxruntime package is named instead.
if [[ -z ${ORT_DYLIB_PATH:-} ]]; then
  ORT_LIB=$("$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import latency; print(latency.ort_library() or "")' "$HERE" 2>/dev/null) || ORT_LIB=""
  if [[ -n $ORT_LIB ]]; then export ORT_DYLIB_PATH=$ORT_LIB; fi
fi
export PYTHONPATH=$ROOT/clients/python/src${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 RUST_BACKTRACE=0

# -- the device --------------------------------------------------------------
TCH_PRELOAD=""
if ((DRY)); then
  DEVICE=cpu
  PROFILE=${PROFILE:-cpu}
else
  command -v nvidia-smi >/dev/null ||
    die "no nvidia-smi: this machine has no NVIDIA driver (on a machine without a GPU use --dry-run)"
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1) ||
    die "nvidia-smi sees no GPU: $(nvidia-smi 2>&1 | head -n1)"
  [[ -n $GPU_NAME ]] || die "nvidia-smi lists no GPU"
  "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' ||
    die "PyTorch ($PY) sees no CUDA device although nvidia-smi lists $GPU_NAME"
  DEVICE=cuda
  if [[ -z $PROFILE ]]; then
    case $GPU_NAME in
      *A6000*) PROFILE=a6000 ;;
      *H200*) PROFILE=h200 ;; # calibrated on this project's H200 runs
      *) PROFILE=h100 ;; # H100, and the closest profile for others
    esac
  fi
  # tch binaries do not link libtorch_cuda.so (only kernels' tests force it
  # in); without it libtorch sees no CUDA device, so it is preloaded.
  if [[ -e $TORCH_LIB/libtorch_cuda.so ]]; then
    TCH_PRELOAD=$TORCH_LIB/libtorch_cuda.so
  else
    die "no $TORCH_LIB/libtorch_cuda.so: this PyTorch has no CUDA"
  fi
  export GPU_CHECK_SMI=1
fi
export TENSILE_TCH_PRELOAD=$TCH_PRELOAD

# -- the binaries ------------------------------------------------------------
has_bins() { [[ -x $1/tensile-worker && -x $1/tensilectl && -x $1/tensile-scheduler ]]; }
if [[ -z $BIN_DIR ]]; then
  for d in gpu-bundle target/release target/debug; do
    if has_bins "$d/bin" || has_bins "$d"; then
      BIN_DIR=$d
      break
    fi
  done
  [[ -n $BIN_DIR ]] || die "no gpu-bundle/ (run scripts/gpu-pack.sh on the build machine and bring gpu-bundle/ here) and no binaries in target/"
fi
[[ -d $BIN_DIR ]] || die "--bin-dir $BIN_DIR: no such folder"
BIN_DIR=$(cd "$BIN_DIR" && pwd)
COMMIT_FILE=""
if has_bins "$BIN_DIR/bin"; then
  BINS=$BIN_DIR/bin
  TESTS=$BIN_DIR/tests
  COMMIT_FILE=$BIN_DIR/COMMIT
elif has_bins "$BIN_DIR"; then
  # A cargo profile folder: the test executables are found through cargo.
  BINS=$BIN_DIR
  TESTS=$RESULTS/test-executables
  if [[ ! -x $TESTS/worker-it || ! -x $TESTS/swap-executor-lib || ! -x $TESTS/latency-train-lib ]]; then
    command -v cargo >/dev/null || die "no test executables in $TESTS and no cargo to find them (use a bundle from scripts/gpu-pack.sh)"
    profile_flag=()
    [[ $(basename "$BIN_DIR") == release ]] && profile_flag=(--release)
    say "finding the test executables through cargo (${profile_flag[*]:-debug})"
    mkdir -p "$TESTS"
    exe=$(cargo test --locked "${profile_flag[@]}" -p tensile-worker --test it --no-run --message-format=json 2>/dev/null |
      "$PY" "$HERE/test_exes.py") || die "cargo could not build the worker's test executable"
    ln -sf "$exe" "$TESTS/worker-it"
    exe=$(cargo test --locked "${profile_flag[@]}" -p tensile-swap-executor --lib --no-run --message-format=json 2>/dev/null |
      "$PY" "$HERE/test_exes.py") || die "cargo could not build the swap executor's test executable"
    ln -sf "$exe" "$TESTS/swap-executor-lib"
    exe=$(cargo test --locked "${profile_flag[@]}" -p tensile-latency-train --lib --no-run --message-format=json 2>/dev/null |
      "$PY" "$HERE/test_exes.py") || die "cargo could not build the latency profiler's test executable"
    ln -sf "$exe" "$TESTS/latency-train-lib"
  fi
else
  die "no tensile-worker, tensilectl and tensile-scheduler in $BIN_DIR or $BIN_DIR/bin (run scripts/gpu-pack.sh)"
fi
export TENSILECTL=$BINS/tensilectl TENSILE_SCHEDULER=$BINS/tensile-scheduler
# tensile._core, the Python package's Rust core (tensile.plan, the hook's
# gates and session): built in place by scripts/setup.sh on the build
# machine, brought in the bundle's python/ to a GPU machine.
CORE=$ROOT/clients/python/src/tensile/_core.abi3.so
if [[ ! -e $CORE && -f $BIN_DIR/python/_core.abi3.so ]]; then
  cp "$BIN_DIR/python/_core.abi3.so" "$CORE"
fi

"$PY" "$HERE/report.py" meta --results "$RESULTS" --mode "$( ((DRY)) && echo dry || echo gpu)" \
  ${COMMIT_FILE:+--commit-file "$COMMIT_FILE"} --bin-dir "$BIN_DIR" || exit 2
if ((DRY)); then
  say "dry run on the CPU: binaries from $BIN_DIR, results in $RESULTS"
else
  say "on $GPU_NAME (profile $PROFILE): binaries from $BIN_DIR, results in $RESULTS, ${TIME_LIMIT} s"
fi

# -- sizes: the GPU's, or toys for the dry run --------------------------------
if ((DRY)); then
  WORKER_JOBS=resnet50:2:64
  WORKER_ARGS=(--iterations 2 --warmup 1 --threads 1)
  HOOK_RUNS=("--model resnet50 --batch 2 --resolution 64" "--model encoder --batch 2 --tiny"
    "--model llama --batch 1 --seq 32 --tiny")
  HOOK_ARGS=(--steps 1 --warmup 1 --threads 1)
  COLOCATE_JOB=resnet50:2:64
  LATENCY_ARGS=(--profile-args "--batches 1 --resolution 32 --random-builds 0 --random-nets 2 --loads 0 --repeats 1 --threads 1"
    --max-profile-s 20 --min-profile-s 5 --reserve-s 10 --accept-partial --epochs 30)
else
  WORKER_JOBS=resnet50:32,bert_base:16
  WORKER_ARGS=(--iterations 12 --warmup 2)
  HOOK_RUNS=("--model resnet50 --batch 64 --resolution 224" "--model encoder --batch 32"
    "--model llama --batch 2 --seq 1024")
  HOOK_ARGS=(--steps 8 --warmup 2)
  COLOCATE_JOB=resnet50:32
  LATENCY_ARGS=(--profile-args "--batches 4,16,32 --resolution 0 --random-builds 4 --random-nets 100 --loads 0,1")
fi

if [[ -n $LATENCY_EXTRA ]]; then
  read -ra extra <<<"$LATENCY_EXTRA"
  LATENCY_ARGS+=("${extra[@]}")
fi

# -- the steps ---------------------------------------------------------------
step_tests() {
  local dry=()
  ((DRY)) && dry=(--dry-run)
  "$PY" "$HERE/tests.py" --results "$RESULTS" --tests "$TESTS" "${dry[@]}"
}

step_copy_bw() {
  if ((DRY)); then
    "$PY" -m py_compile "$HERE/copy_bw.py"
    "$PY" "$HERE/results.py" row "$RESULTS" copy-bw all --status skipped --reason "no GPU (dry run)"
    return 0
  fi
  "$PY" "$HERE/copy_bw.py" --results "$RESULTS"
}

step_worker() {
  "$PY" "$HERE/worker.py" solo --results "$RESULTS" --bin "$BINS" --device "$DEVICE" --profile "$PROFILE" \
    --jobs "$WORKER_JOBS" "${WORKER_ARGS[@]}"
}

step_hook() {
  local run rc
  for run in "${HOOK_RUNS[@]}"; do
    # shellcheck disable=SC2086 # each run is a list of flags
    "$PY" "$HERE/hook.py" --results "$RESULTS" --device "$DEVICE" --profile "$PROFILE" $run "${HOOK_ARGS[@]}" || {
      rc=$?
      return "$rc"
    }
  done
}

step_colocate() {
  "$PY" "$HERE/worker.py" colocate --results "$RESULTS" --bin "$BINS" --device "$DEVICE" --profile "$PROFILE" \
    --job "$COLOCATE_JOB" "${WORKER_ARGS[@]}" "${COLOCATE_EXTRA[@]}"
}

step_latency() {
  if ! "$BINS/tensile-latency" profile --help 2>/dev/null | grep -q -- '--device'; then
    "$PY" "$HERE/results.py" row "$RESULTS" latency profile --status skipped \
      --reason "not built: no tensile-latency with profile --device in $BINS"
    return 0
  fi
  "$PY" "$HERE/latency.py" --results "$RESULTS" --bin "$BINS" --device "$DEVICE" --profile "$PROFILE" "${LATENCY_ARGS[@]}"
}

report() {
  "$PY" "$HERE/report.py" markdown --results "$RESULTS" || say "could not write the report"
}

FAILED=0
INCOMPLETE=0
run_step() {
  local name=$1 t0 rc status
  if [[ -e $RESULTS/$name.json ]] && ((!FORCE)); then
    status=$("$PY" "$HERE/results.py" status "$RESULTS" "$name")
    say "$name: done before ($status); skipped (--force reruns it)"
    [[ $status == failed ]] && FAILED=1
    return 0
  fi
  if ((FORCE)); then
    rm -f "$RESULTS/$name.json" "$RESULTS/$name.rows.jsonl"
  fi
  if (($(date +%s) >= GPU_CHECK_DEADLINE)); then
    say "$name: not started, the time limit is reached: rerun to resume"
    INCOMPLETE=1
    return 0
  fi
  say "$name: starting"
  t0=$(date +%s)
  set +e
  (
    set -e
    "step_${name//-/_}"
  ) 2>&1 | tee -a "$RESULTS/logs/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  case $rc in
    0) status=$("$PY" "$HERE/results.py" finish "$RESULTS" "$name" --seconds $(($(date +%s) - t0))) ;;
    3)
      status="incomplete: stopped for time, rerun to resume"
      INCOMPLETE=1
      ;;
    *) status=$("$PY" "$HERE/results.py" finish "$RESULTS" "$name" --seconds $(($(date +%s) - t0)) \
      --error "the step stopped with exit status $rc (see logs/$name.log)") ;;
  esac
  [[ $status == failed* ]] && FAILED=1
  say "$name: $status ($(($(date +%s) - t0)) s)"
  report
}

for name in "${ALL_STEPS[@]}"; do
  [[ -z $ONLY || $ONLY == "$name" ]] || continue
  run_step "$name"
done
report
say "report: $RESULTS/gpu-results.md ($(($(date +%s) - START)) s in all)"
if ((FAILED)); then
  say "some steps failed: see the report and $RESULTS/logs/"
  exit 1
fi
if ((INCOMPLETE)); then
  say "some steps stopped for time: rerun the same command to resume"
  exit 3
fi
