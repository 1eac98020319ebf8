#!/usr/bin/env bash
# The whole test suite: formatting, clippy with -D warnings, every Rust test,
# and the Python tests against the reference PyTorch models. Sets up what it
# needs first (scripts/setup.sh is idempotent).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

step "setup"
scripts/setup.sh

step "rustfmt"
cargo fmt --all --check

step "clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
cargo test --workspace --locked

step "GPU tests, output shown (without a GPU they pass and print SKIPPED)"
cargo test --locked -p tensile-worker --test it on_a_gpu -- --nocapture 2>&1 | grep -E "SKIPPED|^test |test result"

step "python tests"
cargo build --locked -p tensilectl -p tensile-scheduler
TENSILECTL="$PWD/target/debug/tensilectl" TENSILE_SCHEDULER="$PWD/target/debug/tensile-scheduler" \
  .venv/bin/python -m pytest -q tests/python

step "all tests passed"
