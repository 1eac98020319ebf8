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
cargo build --locked -p tensilectl -p tensile-scheduler -p tensile-worker
TENSILECTL="$PWD/target/debug/tensilectl" TENSILE_SCHEDULER="$PWD/target/debug/tensile-scheduler" \
  TENSILE_WORKER="$PWD/target/debug/tensile-worker" .venv/bin/python -m pytest -q tests/python

step "gpu-check dry run (scripts/gpu-check.sh on the CPU: every step, then a rerun that resumes)"
gpu_results=$(mktemp -d)
scripts/gpu-check.sh --dry-run --bin-dir target/debug --results "$gpu_results"
rerun=$(scripts/gpu-check.sh --dry-run --bin-dir target/debug --results "$gpu_results")
[[ $(grep -c "done before" <<<"$rerun") == 6 ]] || { printf 'gpu-check did not resume:\n%s\n' "$rerun"; exit 1; }
grep -q "^## 6. Latency models" "$gpu_results/gpu-results.md" || { echo "gpu-check wrote no report"; exit 1; }
# The colocate step's rows (two processes, one process training both
# copies) ran and held their storage budget.
.venv/bin/python - "$gpu_results/colocate.rows.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
modes = {r["id"].rsplit("-x2-", 1)[-1] for r in rows}
bad = [r["id"] for r in rows if r.get("status") != "ok" or r.get("within_budget") is False]
if bad or not {"vanilla", "scheduler", "one-process"} <= modes:
    sys.exit(f"gpu-check colocate: failed or over budget {bad}, modes {sorted(modes)}")
PY
rm -rf "$gpu_results"

step "all tests passed"
