#!/usr/bin/env bash
# The planner's targets (issue "planner and executor in virtual time"),
# printed side by side with vanilla on one simulated device:
#   - single job at batch 16 for the paper's five models and BERT;
#   - 1-3 copies of each model at batch 2;
#   - the mixed five at batch 2;
# with MSR (vs free-at-last-use and vs keep-all), MSR at the lower bound,
# EOR, stalls and planning times. Usage: scripts/bench-planner.sh [DEVICE]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
device="${1:-a6000}"
# The build needs .venv/ (libtorch, ONNX Runtime): see scripts/run.sh.
scripts/setup.sh >&2
cargo build --release --locked -q -p tensilectl
ctl=./target/release/tensilectl
models=(vgg16 resnet50 inception_v3 inception_v4 densenet121)

row() { # label, jobs
  "$ctl" sim --device "$device" --jobs "$2" --json 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin); s = r["system"]
worst = max(j["eor"] for j in r["jobs"])
cells = (sys.argv[1], s["msr"], s["msr_vs_keepall"], s["msr_max"], s["eor"], worst,
         s["stall_s"] * 1e3, r["first_plan_ms"], s["replans"], r["replan_mean_ms"], r["replan_max_ms"])
print("%-26s %6.3f %7.3f %7.3f %7.4f %9.4f %8.2f %9.2f %4d %8.2f %8.2f" % cells)
' "$1"
}

printf "device %s, 10 iterations, Adam, seed 1\n" "$device"
printf "%-26s %6s %7s %7s %7s %9s %8s %9s %4s %8s %8s\n" \
  workload msr msr/ka msr_max eor "worst eor" "stall ms" "plan ms" rp "rp mean" "rp max"
n=$(( ${#models[@]} + 1 + 3 * ${#models[@]} + 1 )); i=0
progress() { i=$((i + 1)); printf "[%d/%d] %s\n" "$i" "$n" "$1" >&2; }
for m in "${models[@]}" bert_base; do progress "$m:16"; row "$m x1 b16" "$m:16"; done
for m in "${models[@]}"; do
  for k in 1 2 3; do
    jobs=$(printf "$m:2,%.0s" $(seq "$k")); progress "$m x$k b2"
    row "$m x$k b2" "${jobs%,}"
  done
done
progress "mixed five"
row "mixed five b2" "vgg16:2,resnet50:2,inception_v3:2,inception_v4:2,densenet121:2"
