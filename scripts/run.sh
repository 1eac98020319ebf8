#!/usr/bin/env bash
# The main job on built-in defaults: the real system on this machine. A
# tensile-scheduler on a socket in a temporary folder, with a memory budget
# that the jobs' vanilla peaks exceed together, and three tensile-workers
# (three ResNet-50 copies, real kernels on the CPU, real copies through the
# host engine at a scaled link bandwidth) that register, receive plans and
# gates and train, with a live table; then the same jobs without plans,
# side by side and one after another, and measured memory over time drawn
# to target/tensile-demo.svg.
# Everything it starts is stopped when it ends, also on Ctrl-C. Extra
# arguments go to `tensilectl demo` (see its --help). The simulator is one
# command away: target/release/tensilectl sim.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The build links libtorch and loads ONNX Runtime from .venv/, which
# scripts/setup.sh makes (idempotent: under a second once done). Its report
# goes to stderr so that stdout is the demo's alone.
scripts/setup.sh >&2
echo "building tensilectl, tensile-scheduler and tensile-worker (release; the first time takes several minutes)" >&2
cargo build --release --locked -q -p tensilectl -p tensile-scheduler -p tensile-worker
# tensilectl demo stops its children itself (on an error and on Ctrl-C);
# this trap is the last line of defence should tensilectl itself be killed.
trap 'pkill -TERM -P $$ 2>/dev/null || true' EXIT
./target/release/tensilectl demo "$@"
