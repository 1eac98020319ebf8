#!/usr/bin/env python3
"""The GPU tests: the worker's CUDA tests and the swap executor's (bundled
test executables), and the hook's CUDA tests (pytest). Each suite's output
is saved in ``logs/``; one row per suite.

On a GPU a test that prints SKIPPED did not run, and fails the suite; in a
dry run every suite is expected to skip, and is recorded as skipped.

    tests.py --results DIR --tests DIR [--dry-run]
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import proc
import results

STEP = "tests"
ROOT = Path(__file__).resolve().parents[2]

#: (row id, bundled executable, filter, what it covers)
SUITES = [
    ("worker", "worker-it", "on_a_gpu", "worker/tests/it: the CUDA copy engine over the worker's tensors"),
    ("swap-executor", "swap-executor-lib", "cuda::", "swap-executor/src/cuda.rs: driver and device errors"),
    ("latency-clock", "latency-train-lib", "on_cuda", "latency-train/src/measure/clock.rs: kernels timed by CUDA events"),
]
#: SKIPPED lines that are no skip of a GPU test: the swap executor's test
#: skips its no-driver half where there is a GPU.
EXPECTED_SKIPS = ("SKIPPED (the no-driver half)",)
HOOK_TESTS = ["tests/python/test_hook.py", "tests/python/test_hook_cuda_timing.py"]


def judge(row: dict[str, Any], rc: int, passed: int, failed: int, skipped: int, skip_line: str, dry: bool) -> None:
    """A suite's status: failed on a failure; in a dry run skipped when a
    test said SKIPPED (no GPU); on a GPU failed when one did (it did not run)."""
    row.update(passed=passed, failed=failed, skipped=skipped)
    if rc != 0 or failed:
        row.update(status="failed", reason=f"exit status {rc}, {failed} failed")
    elif passed + skipped == 0:
        row.update(status="failed", reason="no test ran")
    elif skipped and dry:
        row.update(status="skipped", reason=f"no GPU (dry run: {passed} passed, {skipped} said SKIPPED)")
    elif skipped:
        row.update(status="failed", reason=f"{skipped} tests skipped on a GPU machine: {skip_line}")


def rust_suite(root: Path, tests: Path, suite: tuple[str, str, str, str], dry: bool) -> dict[str, Any]:
    row_id, exe_name, filt, what = suite
    row: dict[str, Any] = {"id": row_id, "what": what, "filter": filt}
    exe = tests / exe_name
    if not exe.exists():
        row.update(status="failed", reason=f"no test executable {exe} (scripts/gpu-pack.sh bundles it)")
        return row
    log = root / "logs" / f"tests-{row_id}.log"
    r = proc.run([str(exe), filt, "--nocapture", "--test-threads=1"], log, proc.tch_env())
    r.check_time(f"the {row_id} tests")
    text = log.read_text(errors="replace") + r.stdout
    m = re.search(r"test result: \w+\. (\d+) passed; (\d+) failed", text)
    passed, failed = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    skips = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("SKIPPED")]
    skips = [ln for ln in skips if not ln.startswith(EXPECTED_SKIPS)]
    judge(row, r.rc, passed, failed, len(skips), skips[0] if skips else "", dry)
    row["log"] = str(log.relative_to(root))
    return row


def importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def hook_suite(root: Path, dry: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"id": "hook", "what": "tests/python: the hook on CUDA (parity, event timing)", "filter": "cuda or gpu"}
    missing = [m for m in ("pytest", "grpc", "google.protobuf") if not importable(m)]
    if missing:
        names = {"pytest": "pytest", "grpc": "grpcio", "google.protobuf": "protobuf"}
        row.update(
            status="skipped",
            reason=f"{', '.join(names[m] for m in missing)} not installed for {sys.executable} "
            "(the tests import tensile, whose client needs grpcio and protobuf)",
        )
        return row
    files = HOOK_TESTS
    if importlib.util.find_spec("torchvision") is None:
        files = [f for f in files if not f.endswith("test_hook.py")]
        row["note"] = "test_hook.py (CUDA parity) left out: torchvision is not installed"
    log = root / "logs" / "tests-hook.log"
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *files, "-k", "cuda or gpu"]
    r = proc.run(cmd, log, None)
    r.check_time("the hook's tests")
    text = r.stdout
    count = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", text)}
    skips = [ln for ln in text.splitlines() if ln.startswith("SKIPPED")]
    rc = 0 if r.rc == 5 and not count else r.rc  # 5: nothing collected
    judge(row, rc, count.get("passed", 0), count.get("failed", 0) + count.get("error", 0), count.get("skipped", 0),
          skips[0] if skips else "", dry)
    row["log"] = str(log.relative_to(root))
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--tests", type=Path, required=True, help="folder of the bundled test executables")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args()
    try:
        for suite in SUITES:
            if not results.has_row(a.results, STEP, suite[0]):
                row = rust_suite(a.results, a.tests, suite, a.dry_run)
                results.add_row(a.results, STEP, row)
                print(f"  {row['id']}: {row['status']} {row.get('reason', '')}")
        if not results.has_row(a.results, STEP, "hook"):
            row = hook_suite(a.results, a.dry_run)
            results.add_row(a.results, STEP, row)
            print(f"  hook: {row['status']} {row.get('reason', '')}")
    except results.OutOfTime as e:
        print(f"  {e}")
        return results.INCOMPLETE
    return 0


if __name__ == "__main__":
    sys.exit(main())
