#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs on a GPU machine (which has PyTorch
# 2.11 but no Rust toolchain and no network) and bundles it in gpu-bundle/
# (git-ignored): release builds of tensile-worker, tensilectl,
# tensile-latency and tensile-scheduler, of the Python package's Rust core (tensile._core, in
# python/; gpu-check.sh puts it in the package) and the GPU test
# executables (the worker's `it` tests, the swap executor's and the latency
# profiler's unit tests),
# with their debug info stripped, a COMMIT file and a MANIFEST. What travels to the GPU machine is limited (64 MiB
# with the working tree), so it fails when the bundle is over
# GPU_BUNDLE_MAX_MIB (default 56), and strips every symbol when the bundle
# and the working tree together are over GPU_BUNDLE_ROOM_MIB (default 48:
# room is left for a results folder carried back to resume a check).
#
#   scripts/gpu-pack.sh
#
# Then, on the GPU machine, from the repository root: scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

OUT=gpu-bundle
MAX_MIB=${GPU_BUNDLE_MAX_MIB:-56}
ROOM_MIB=${GPU_BUNDLE_ROOM_MIB:-48}
step() { printf '\n==> %s\n' "$*"; }
die() {
  printf 'gpu-pack: %s\n' "$*" >&2
  exit 1
}

command -v cargo >/dev/null || die "no cargo: build the bundle on a machine with the Rust toolchain"
if command -v strip >/dev/null; then
  STRIP=(strip)
elif command -v objcopy >/dev/null; then
  STRIP=(objcopy)
else
  die "neither strip nor objcopy (binutils) is installed: the binaries cannot be stripped"
fi
PY=python3
[[ -x .venv/bin/python ]] && PY=.venv/bin/python
command -v "$PY" >/dev/null || die "no python3 (it reads cargo's JSON output)"

# The worker and tensile-latency force libtorch's CUDA library in (their build
# scripts, TENSILE_LINK_CUDA): nothing names its symbols, yet libtorch sees
# a GPU only once it is loaded.
export TENSILE_LINK_CUDA=1

step "release build: tensile-worker, tensilectl, tensile-latency, tensile-scheduler, tensile._core"
cargo build --release --locked -p tensile-worker -p tensilectl -p tensile-latency -p tensile-scheduler -p tensile-python

step "release build: the GPU test executables"
WORKER_IT=$(cargo test --release --locked -p tensile-worker --test it --no-run --message-format=json |
  "$PY" scripts/gpu_check/test_exes.py) || die "no test executable for tensile-worker's it tests"
SWAP_LIB=$(cargo test --release --locked -p tensile-swap-executor --lib --no-run --message-format=json |
  "$PY" scripts/gpu_check/test_exes.py) || die "no test executable for tensile-swap-executor's unit tests"
LATENCY_LIB=$(cargo test --release --locked -p tensile-latency-train --lib --no-run --message-format=json |
  "$PY" scripts/gpu_check/test_exes.py) || die "no test executable for tensile-latency-train's unit tests"

# Copies $1 to $2 without its debug info (symbols kept: panics name their
# functions), or with nothing but what runs when $3 is "all".
strip_to() {
  local how=${3:-debug}
  if [[ ${STRIP[0]} == strip ]]; then
    if [[ $how == all ]]; then strip -o "$2" "$1"; else strip --strip-debug -o "$2" "$1"; fi
  else
    if [[ $how == all ]]; then objcopy --strip-all "$1" "$2"; else objcopy --strip-debug "$1" "$2"; fi
  fi
}

pack() {
  local how=$1
  rm -rf "$OUT"
  mkdir -p "$OUT/bin" "$OUT/tests" "$OUT/python"
  for b in tensile-worker tensilectl tensile-latency tensile-scheduler; do
    strip_to "target/release/$b" "$OUT/bin/$b" "$how"
  done
  strip_to target/release/lib_core.so "$OUT/python/_core.abi3.so" "$how"
  strip_to "$WORKER_IT" "$OUT/tests/worker-it" "$how"
  strip_to "$SWAP_LIB" "$OUT/tests/swap-executor-lib" "$how"
  strip_to "$LATENCY_LIB" "$OUT/tests/latency-train-lib" "$how"
}

bytes() { du -cb "$@" | tail -n1 | cut -f1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | awk '/\ttotal$/ { s += $1 } END { print s + 0 }')

step "stripping into $OUT/"
pack debug
total=$(bytes "$OUT")
stripped="stripped"
if ((total > MAX_MIB * 1048576 || total + tree > ROOM_MIB * 1048576)); then
  echo "$(mib "$total") MiB with symbols kept ($(mib $((total + tree))) MiB with the working tree): stripping everything"
  pack all
  total=$(bytes "$OUT")
  stripped="stripped of all symbols"
fi

commit=$(git rev-parse --short=12 HEAD)
if [[ -n $(git status --porcelain --untracked-files=no) ]]; then
  commit+=" with uncommitted changes"
fi
printf '%s (built %s, release, %s)\n' "$commit" "$(date -u '+%Y-%m-%d %H:%M UTC')" "$stripped" >"$OUT/COMMIT"
{
  echo "# gpu-bundle: what scripts/gpu-pack.sh built; run scripts/gpu-check.sh on the GPU machine"
  echo "# commit: $(cat "$OUT/COMMIT")"
  for f in "$OUT"/bin/* "$OUT"/tests/* "$OUT"/python/*; do
    cuda=no
    if command -v readelf >/dev/null && readelf -d "$f" | grep -q 'libtorch_cuda'; then cuda=yes; fi
    printf '%-32s %10d bytes  links libtorch_cuda: %s\n' "${f#"$OUT"/}" "$(bytes "$f")" "$cuda"
  done
} >"$OUT/MANIFEST"
cat "$OUT/MANIFEST"
if command -v readelf >/dev/null && [[ -n $("$PY" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so"))' 2>/dev/null | xargs -r ls 2>/dev/null) ]]; then
  for b in tensile-worker tensile-latency; do
    readelf -d "$OUT/bin/$b" | grep -q 'libtorch_cuda' ||
      die "$b does not link libtorch_cuda: it would never see a GPU (see libtorch-link/src/lib.rs)"
  done
fi

echo
echo "bundle: $(mib "$total") MiB in $OUT/ (limit $MAX_MIB MiB); the working tree: $(mib "$tree") MiB; together $(mib $((total + tree))) MiB"
if ((total > MAX_MIB * 1048576)); then
  die "the bundle is $(mib "$total") MiB, over $MAX_MIB MiB (GPU_BUNDLE_MAX_MIB)"
fi
if ((total + tree > 64 * 1048576)); then
  echo "warning: bundle and working tree together are over 64 MiB: if the transfer counts both, it will not fit" >&2
fi
echo "next: on the GPU machine, from the repository root (with $OUT/ beside it): scripts/gpu-check.sh"
