#!/usr/bin/env bash
# The main job on built-in defaults: the model zoo, one training iteration
# per model at batch 16, with parameter counts and vanilla peaks.
# (The planner demo replaces this once the planner lands.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo run --release --locked -q -p tensilectl -- zoo "$@"
