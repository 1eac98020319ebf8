#!/usr/bin/env python3
"""Copy bandwidth between host buffers and the GPU, both directions.

For each size, the same device buffer is copied to and from a pinned host
buffer (``pin_memory=True``) with ``non_blocking=True`` on a side stream (as
the hook's CUDA engine and the worker's copy stream do), the same pinned
buffer on the default stream (a plain ``cudaMemcpyAsync``), and a pageable
host buffer; then both directions at once on two side streams (pinned).
Each copy is timed by CUDA events on its stream (the median of the repeats
after a warm-up; the best is kept too), and by the wall clock around the
copy and a synchronize. One row per size, written as it ends.

    python3 scripts/gpu_check/copy_bw.py --results gpu-results [--sizes-mib 8,32,128,512]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import results

STEP = "copy-bw"


def _time(copy: Callable[[], Any], stream: Any, repeats: int) -> tuple[list[float], list[float]]:
    """Seconds per copy by events and by the wall clock, after one warm-up."""
    import torch

    by_events, by_wall = [], []
    for i in range(repeats + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            start.record(stream)
            copy()
            end.record(stream)
        end.synchronize()
        wall = time.perf_counter() - t0
        if i > 0:
            by_events.append(start.elapsed_time(end) / 1e3)
            by_wall.append(wall)
    return by_events, by_wall


def _rates(nbytes: int, seconds: list[float]) -> dict[str, float]:
    gbps = [nbytes / s / 1e9 for s in seconds if s > 0]
    if not gbps:
        return {"median_gbps": 0.0, "best_gbps": 0.0}
    return {"median_gbps": round(statistics.median(gbps), 2), "best_gbps": round(max(gbps), 2)}


def measure(mib: int, repeats: int) -> dict[str, Any]:
    import torch

    n = mib << 20
    dev = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
    pinned = torch.ones(n, dtype=torch.uint8).pin_memory()
    pageable = torch.ones(n, dtype=torch.uint8)
    side, back = torch.cuda.Stream(), torch.cuda.Stream()
    default = torch.cuda.default_stream()
    row: dict[str, Any] = {"id": f"{mib}MiB", "mib": mib, "repeats": repeats}
    cases: dict[str, tuple[Callable[[], Any], Any]] = {
        "h2d_pinned_side": (lambda: dev.copy_(pinned, non_blocking=True), side),
        "h2d_pinned_default": (lambda: dev.copy_(pinned, non_blocking=True), default),
        "h2d_pageable": (lambda: dev.copy_(pageable, non_blocking=True), side),
        "d2h_pinned_side": (lambda: pinned.copy_(dev, non_blocking=True), side),
        "d2h_pinned_default": (lambda: pinned.copy_(dev, non_blocking=True), default),
        "d2h_pageable": (lambda: pageable.copy_(dev, non_blocking=True), side),
    }
    for name, (copy, stream) in cases.items():
        by_events, by_wall = _time(copy, stream, repeats)
        row[name] = _rates(n, by_events)
        row[name + "_wall"] = _rates(n, by_wall)
    # Both directions at once: one buffer in, another out, on two streams.
    other = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(2)
    pinned_in = torch.ones(n, dtype=torch.uint8).pin_memory()
    walls = []
    for i in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.stream(side):
            dev.copy_(pinned_in, non_blocking=True)
        with torch.cuda.stream(back):
            pinned.copy_(other, non_blocking=True)
        torch.cuda.synchronize()
        if i > 0:
            walls.append(time.perf_counter() - t0)
    row["duplex_pinned_wall"] = _rates(2 * n, walls)
    del dev, other, pinned, pinned_in, pageable
    torch.cuda.empty_cache()
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--sizes-mib", default="8,32,128,512")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("copy-bw: no CUDA device visible to PyTorch", file=sys.stderr)
        return 1
    for mib in [int(s) for s in a.sizes_mib.split(",") if s]:
        row_id = f"{mib}MiB"
        if results.has_row(a.results, STEP, row_id):
            print(f"  {row_id}: done before")
            continue
        try:
            results.need_time(30, f"the {row_id} copies")
        except results.OutOfTime as e:
            print(f"  {e}")
            return results.INCOMPLETE
        try:
            row = measure(mib, a.repeats)
        except Exception as e:  # a failure is a result: recorded, the next size goes on
            row = {"id": row_id, "mib": mib, "status": "failed", "reason": f"{type(e).__name__}: {e}"}
        results.add_row(a.results, STEP, row)
        if row.get("status") == "failed":
            print(f"  {row_id}: failed: {row['reason']}")
        else:
            print(
                f"  {row_id}: h2d pinned {row['h2d_pinned_side']['median_gbps']} GB/s, "
                f"pageable {row['h2d_pageable']['median_gbps']}; d2h pinned {row['d2h_pinned_side']['median_gbps']}, "
                f"pageable {row['d2h_pageable']['median_gbps']}; both ways {row['duplex_pinned_wall']['median_gbps']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
