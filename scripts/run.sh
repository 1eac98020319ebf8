#!/usr/bin/env bash
# The main job on built-in defaults: the planner demo. Three zoo jobs
# (ResNet-50, VGG-16, Inception-V3 at batch 2, Adam) share one simulated
# RTX A6000; they run under vanilla (free after last use) and under the
# TENSILE planner, side by side, and the memory over time is drawn to
# target/tensile-demo.svg. Extra arguments go to `tensilectl sim`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The build links libtorch and loads ONNX Runtime from .venv/, which
# scripts/setup.sh makes (idempotent: under a second once done). Its report
# goes to stderr so that stdout is the demo's alone.
scripts/setup.sh >&2
cargo build --release --locked -q -p tensilectl
./target/release/tensilectl zoo
echo
./target/release/tensilectl sim --plot target/tensile-demo.svg "$@"
