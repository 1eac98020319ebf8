#!/usr/bin/env python3
"""Latency models for the device: profile its kernels (``tensile-latency
profile``, resumable: it appends and picks up where it stopped), train the
per-op models and the calibrated roofline (``tensile-latency train``), evaluate
them on held-out shapes (``tensilectl latency eval``), and compare the iteration times
they predict with the worker's measured ones (the ``worker`` step's rows).

    latency.py --results DIR --bin DIR --device cuda --profile h100

On CUDA, ``tensile-latency profile`` times each run by the wall clock ending with
a device synchronize (tch has no CUDA events; latency-train/src/measure).
The models go to ``DIR/latency/models-PROFILE``; ``tensilectl plan
--latency-models DIR`` and ``tensile-scheduler --latency-models DIR`` use
them (``auto`` only finds the shipped CPU models).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import proc
import results

STEP = "latency"
NO_ORT = (
    "no ONNX Runtime library here (pip's onnxruntime, or ORT_DYLIB_PATH): the models are trained and kept; "
    "evaluate them with `tensilectl latency eval --models DIR` elsewhere"
)


def ort_library() -> str | None:
    """ONNX Runtime's shared library: ``ORT_DYLIB_PATH``, else the Python
    package's, else None (then tensilectl's built-in default is tried)."""
    env = os.environ.get("ORT_DYLIB_PATH")
    if env and Path(env).exists():
        return env
    spec = importlib.util.find_spec("onnxruntime")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            found = sorted(glob.glob(os.path.join(folder, "capi", "libonnxruntime.so*")))
            if found:
                return found[-1]
    return None


def jsonl_lines(path: Path) -> int:
    return sum(1 for line in path.open() if line.strip()) if path.exists() else 0


def profile(a: argparse.Namespace, data: Path) -> int | None:
    """Profiles until done or the time is up; returns INCOMPLETE when a
    rerun must resume it."""
    if results.has_row(a.results, STEP, "profile"):
        return None
    results.need_time(a.min_profile_s + a.reserve_s, "profiling kernels")
    seconds = int(min(a.max_profile_s, results.time_left() - a.reserve_s))
    cmd = [
        str(a.bin / "tensile-latency"), "profile", "--device", "cuda" if a.device.startswith("cuda") else "cpu",
        "--out", str(data), "--max-seconds", str(seconds), *a.profile_args.split(),
    ]
    log = a.results / "logs" / "latency-profile.log"
    r = proc.run(cmd, log, proc.tch_env(), margin_s=5)
    r.check_time("latency profile")
    m = re.search(r"measured (\d+) samples, (\d+) already done, (\d+) failed", r.stdout)
    stopped = "time limit reached" in r.stdout
    timing = re.search(r"^timing: (.+)$", r.stdout, re.MULTILINE)
    row: dict[str, Any] = {
        "id": "profile",
        "device": a.device,
        "samples": jsonl_lines(data),
        "timing": timing.group(1).strip() if timing else "not printed",
        "data": str(data.relative_to(a.results)),
    }
    if r.rc != 0 or not m:
        row.update(status="failed", reason=r.error() if r.rc != 0 else "no summary printed")
    elif stopped and not a.accept_partial:
        print(f"  profile: {row['samples']} samples so far, stopped at its time limit: rerun to resume")
        return results.INCOMPLETE
    else:
        row["failed_kernels"] = int(m.group(3))
        if stopped:
            row["note"] = "stopped at its time limit (dry run: trained on what was profiled)"
    results.add_row(a.results, STEP, row)
    print(f"  profile: {row['status'] if 'status' in row else 'ok'}, {row['samples']} samples")
    return None


def train(a: argparse.Namespace, data: Path, models: Path) -> None:
    if results.has_row(a.results, STEP, "train"):
        return
    results.need_time(60, "training the latency models")
    cmd = [str(a.bin / "tensile-latency"), "train", "--data", str(data), "--out", str(models), "--device", a.train_device]
    if a.epochs:
        cmd += ["--epochs", str(a.epochs)]
    r = proc.run(cmd, a.results / "logs" / "latency-train.log", proc.tch_env(), margin_s=5)
    r.check_time("latency train")
    m = re.search(r"(\d+) models \((\d+) bytes of ONNX\) from (\d+) samples in ([\d.]+) s", r.stdout)
    row: dict[str, Any] = {"id": "train", "models": str(models.relative_to(a.results)), "train_device": a.train_device}
    if r.rc != 0 or not m:
        row.update(status="failed", reason=r.error() if r.rc != 0 else "no summary printed")
    else:
        row.update(op_types=int(m.group(1)), onnx_bytes=int(m.group(2)), samples=int(m.group(3)), seconds=float(m.group(4)))
    results.add_row(a.results, STEP, row)
    print(f"  train: {row.get('status', 'ok')} {row.get('reason', '')}")


def evaluate(a: argparse.Namespace, models: Path, ort: str | None) -> None:
    if results.has_row(a.results, STEP, "eval"):
        return
    results.need_time(30, "evaluating the latency models")
    cmd = [str(a.bin / "tensilectl"), "latency", "eval", "--models", str(models), "--json"]
    if ort:
        cmd += ["--ort-lib", ort]
    r = proc.run(cmd, a.results / "logs" / "latency-eval.log", proc.tch_env(), margin_s=5)
    r.check_time("latency eval")
    row: dict[str, Any] = {"id": "eval"}
    try:
        out = json.loads(r.stdout[r.stdout.index("{") : r.stdout.rindex("}") + 1])
    except ValueError:
        out = None
    if r.rc != 0 or out is None:
        row.update(status="failed", reason=r.error() if r.rc != 0 else "no JSON printed")
    else:
        per = out.get("per_op_type", {})
        n = sum(v.get("samples", 0) for v in per.values())
        row.update(
            op_types=len(per),
            heldout_samples=n,
            mape=round(sum(v["mape"] * v["samples"] for v in per.values()) / n, 1) if n else None,
            from_roofline=sorted(k for k, v in per.items() if v.get("source") == "roofline"),
            predict_ms_per_model=out.get("predict_ms_per_model", {}),
        )
    results.add_row(a.results, STEP, row)
    print(f"  eval: {row.get('status', 'ok')} held-out MAPE {row.get('mape')}% {row.get('reason', '')}")


def predict(a: argparse.Namespace, models: Path, ort: str | None) -> None:
    """The vanilla iteration time the roofline and the trained models
    predict, against the worker's measured one."""
    env = proc.tch_env()
    if ort:
        env["ORT_DYLIB_PATH"] = ort
    for worker in results.read_rows(a.results, "worker"):
        if worker.get("mode") != "vanilla" or worker.get("status") != "ok":
            continue
        row_id = f"predict-{worker['id'].removesuffix('-vanilla')}"
        if results.has_row(a.results, STEP, row_id):
            continue
        results.need_time(20, row_id)
        job = ["--model", worker["model"], "--batch", str(worker["batch"])]
        if worker.get("resolution"):
            job += ["--resolution", str(worker["resolution"])]
        row: dict[str, Any] = {"id": row_id, "model": worker["model"], "batch": worker["batch"], "measured_ms": worker["time_ms"]}
        for how, key in ((str(models), "learned_ms"), ("roofline", "roofline_ms")):
            cmd = [str(a.bin / "tensilectl"), "plan", *job, "--device", a.profile, "--latency-models", how, "--json"]
            r = proc.run(cmd, a.results / "logs" / f"latency-{row_id}.log", env, margin_s=5)
            r.check_time(row_id)
            try:
                out = json.loads(r.stdout[r.stdout.index("{") : r.stdout.rindex("}") + 1])
                row[key] = round(out["vanilla_time_s"] * 1e3, 2)
            except (ValueError, KeyError):
                row.update(status="failed", reason=f"plan --latency-models {how}: {r.error()}")
        for key in ("learned_ms", "roofline_ms"):
            if row.get(key):
                row[key.replace("_ms", "_vs_measured")] = round(row[key] / row["measured_ms"], 3)
        results.add_row(a.results, STEP, row)
        print(f"  {row_id}: measured {row['measured_ms']} ms, learned {row.get('learned_ms')}, roofline {row.get('roofline_ms')}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--bin", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--profile", default="h100", help="the device profile the models are trained for and plans use")
    p.add_argument("--profile-args", default="", help="more `latency profile` flags (the grid), one string")
    p.add_argument("--max-profile-s", type=float, default=480)
    p.add_argument("--min-profile-s", type=float, default=60, help="do not start profiling with less time left")
    p.add_argument("--reserve-s", type=float, default=90, help="time kept for training and evaluating")
    p.add_argument("--accept-partial", action="store_true", help="train on a profile cut by its time limit (dry run)")
    p.add_argument("--epochs", type=int)
    a = p.parse_args()
    a.train_device = a.profile
    (a.results / STEP).mkdir(parents=True, exist_ok=True)
    data = a.results / STEP / f"profile-{a.profile}.jsonl"
    models = a.results / STEP / f"models-{a.profile}"
    ort = ort_library()
    try:
        if profile(a, data) == results.INCOMPLETE:
            return results.INCOMPLETE
        prof = results.row_of(a.results, STEP, "profile")
        if prof is None or prof.get("status") == "failed":
            return 0
        train(a, data, models)
        trained = results.row_of(a.results, STEP, "train")
        if trained is None or trained.get("status") == "failed":
            return 0
        if ort is None and a.device.startswith("cuda"):
            if not results.has_row(a.results, STEP, "eval"):
                results.add_row(a.results, STEP, {"id": "eval", "status": "skipped", "reason": NO_ORT})
            return 0
        evaluate(a, models, ort)
        predict(a, models, ort)
    except results.OutOfTime as e:
        print(f"  {e}")
        return results.INCOMPLETE
    return 0


if __name__ == "__main__":
    sys.exit(main())
