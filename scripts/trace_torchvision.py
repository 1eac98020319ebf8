#!/usr/bin/env python3
"""Traces every torchvision classification model at a small resolution.

    PYTHONPATH=clients/python/src .venv/bin/python scripts/trace_torchvision.py \
        [--resolution R] [--batch 2] [--timeout 300] [--only NAME ...] > table.md

Each model runs `python -m tensile.trace` in its own process (a crash or a
hang is that model's row, not the end of the survey), and its graph is then
checked with `tensilectl graph check` ($TENSILECTL, when set); the output
is a Markdown table: model, resolution, result (traced and checked: ops,
seconds) or the tracer's one-line error. The table in
docs/trace-torchvision.md comes from it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torchvision

#: Models that cannot take the requested resolution: Inception-V3's
#: auxiliary head needs 299, MaxViT fixes 224 when built, ViT-H/14's patches
#: need a multiple of 14.
RESOLUTION = {"inception_v3": 299, "maxvit_t": 224, "vit_h_14": 70}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolution", type=int, help="image side for every model (default 64, or what RESOLUTION says)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--only", nargs="*", help="these models only")
    args = p.parse_args()
    names = args.only or torchvision.models.list_models(module=torchvision.models)
    tensilectl = os.environ.get("TENSILECTL")
    out = Path(tempfile.mkdtemp(prefix="trace-torchvision-")) / "graph.json"
    print(f"| model | resolution | result |\n|---|---|---|", flush=True)
    for name in names:
        r = args.resolution or RESOLUTION.get(name, 64)
        cmd = [
            sys.executable, "-m", "tensile.trace", "--model", f"torchvision:{name}",
            "--batch", str(args.batch), "--resolution", str(r), "--compact", "-o", str(out),
        ]
        start = time.perf_counter()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"| {name} | {r} | timed out after {args.timeout} s |", flush=True)
            continue
        elapsed = time.perf_counter() - start
        lines = done.stderr.strip().splitlines()
        last = lines[-1] if lines else "(no output)"
        if done.returncode == 0:
            result = f"traced: {last.split(': ', 1)[-1].split(' in ')[0]}, {elapsed:.0f} s"
            if tensilectl:
                check = subprocess.run([tensilectl, "graph", "check", str(out)], capture_output=True, text=True)
                ok = check.returncode == 0
                result += "; graph check ok" if ok else f"; graph check FAILS: {check.stderr.strip()[:200]}"
        elif len(lines) == 1 and last.startswith("error: "):
            result = "fails: " + last[len("error: "):].replace("|", "\\|")
        else:
            result = f"crashed (exit {done.returncode}, {len(lines)} lines): " + last.replace("|", "\\|")
        print(f"| {name} | {r} | {result} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
