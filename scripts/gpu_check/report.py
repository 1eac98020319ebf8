#!/usr/bin/env python3
"""The GPU check's machine record and its Markdown report.

    report.py meta --results DIR --mode gpu|dry [--commit-file FILE] [--bin-dir DIR]
    report.py markdown --results DIR [--out FILE]     # default DIR/gpu-results.md
    report.py empty [--out FILE]                      # docs/gpu-results.md before any GPU

Every figure in the report is read from the results folder; a table whose
step has not run says so, and nothing is filled in otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import results

Row = dict[str, Any]
STEPS = ["tests", "copy-bw", "worker", "hook", "colocate", "latency"]
TITLES = {
    "tests": "1. GPU tests",
    "copy-bw": "2. Copy bandwidth, pinned and pageable",
    "worker": "3. The worker on the device",
    "hook": "4. The hook (tensile.apply) against save_on_cpu and checkpointing",
    "colocate": "5. Two jobs on one GPU under one job's memory",
    "latency": "6. Latency models for the device",
}
NOT_MEASURED = (
    "\n\nNot measured by this script: EOR against what the simulator predicts for the same device profile "
    "(`tensilectl sim`), and the pinned pool of the Rust CUDA engine itself (the copy table is PyTorch's copies "
    "of pinned and pageable buffers)."
)
HOW_TO_RUN = """\
How to run it: on the build machine `scripts/gpu-pack.sh` (release build,
stripped binaries and the GPU test executables in `gpu-bundle/`, under
56 MiB); then on the GPU machine, from the repository root,
`scripts/gpu-check.sh` (each step resumable: rerun it after a time limit;
`--only STEP` runs one step; results in `gpu-results/`, this file as
`gpu-results/gpu-results.md`, copied here). `scripts/gpu-check.sh --dry-run`
runs the same steps on the CPU (CI does, in `scripts/test.sh`)."""


# -- meta ------------------------------------------------------------------


def _run(cmd: Sequence[str]) -> str:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine(mode: str) -> Row:
    out: Row = {"cpus": os.cpu_count()}
    if shutil.which("nvidia-smi"):
        q = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
        gpus = [[p.strip() for p in line.split(",")] for line in q.splitlines() if line.strip()]
        if gpus:
            out["gpu"], out["driver"], out["gpu_memory"] = (gpus[0] + ["", "", ""])[:3]
            out["gpus"] = len(gpus)
    try:
        import torch

        out["torch"] = torch.__version__
        out["torch_cuda"] = torch.version.cuda
        out["cuda_available"] = torch.cuda.is_available()
    except ImportError:
        out["torch"] = None
    if mode == "dry":
        out.setdefault("gpu", "none (dry run on the CPU)")
    return out


def commit(commit_file: Path | None) -> str:
    if commit_file is not None and commit_file.exists():
        return commit_file.read_text().strip()
    head = _run(["git", "rev-parse", "--short=12", "HEAD"])
    if not head:
        return "unknown"
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return head + (" with uncommitted changes" if dirty else "")


def meta(root: Path, mode: str, commit_file: Path | None, bin_dir: str) -> int:
    path = root / "meta.json"
    now = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    old = json.loads(path.read_text()) if path.exists() else None
    if old is not None and old.get("mode") != mode:
        print(
            f"gpu-check: {root} holds results of a {old.get('mode')} run, this is a {mode} run: "
            "use another --results folder (or remove it)",
            file=sys.stderr,
        )
        return 2
    data = old or {"mode": mode, "first_run": now, "runs": 0}
    data.update(machine(mode))
    data.update(commit=commit(commit_file), bin_dir=bin_dir, last_run=now, runs=data.get("runs", 0) + 1)
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


# -- tables ----------------------------------------------------------------


def fmt(v: Any, spec: str = "") -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float) and spec:
        return format(v, spec)
    return str(v).replace("|", "/")


def pct(a: Any, b: Any) -> str:
    """``a`` against ``b`` as a signed percentage."""
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not b:
        return "-"
    return f"{a / b - 1:+.0%}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def status_cell(r: Row) -> str:
    s = r.get("status", "ok")
    return s if s == "ok" else f"{s}: {fmt(r.get('reason'))}"


def tests_table(rows: list[Row]) -> str:
    head = ["suite", "what", "status", "passed", "failed", "skipped", "log"]
    return table(head, [[r["id"], fmt(r.get("what")), status_cell(r), fmt(r.get("passed")), fmt(r.get("failed")),
                         fmt(r.get("skipped")), fmt(r.get("log"))] for r in rows])


def copy_table(rows: list[Row]) -> str:
    cols = ["h2d_pinned_side", "h2d_pinned_default", "h2d_pageable", "d2h_pinned_side", "d2h_pinned_default", "d2h_pageable"]
    head = ["size", "H2D pinned, side stream", "H2D pinned, default stream", "H2D pageable",
            "D2H pinned, side stream", "D2H pinned, default stream", "D2H pageable", "both ways at once, pinned", "status"]
    body = []
    for r in rows:
        cells = [fmt((r.get(c) or {}).get("median_gbps"), ".1f") for c in cols]
        both = fmt((r.get("duplex_pinned_wall") or {}).get("median_gbps"), ".1f")
        body.append([f"{r.get('mib', '?')} MiB", *cells, both, status_cell(r)])
    text = "GB/s (10^9 bytes per second), median of the repeats, CUDA events on the copy's stream (both ways: wall clock).\n\n"
    text += table(head, body)
    def rate(r: Row, case: str, key: str) -> float:
        return (r.get(case) or {}).get(key) or 0

    best = {d: max((rate(r, c, "best_gbps") for r in rows for c in cols if c.startswith(d)), default=0) for d in ("h2d", "d2h")}
    side = {d: max((rate(r, f"{d}_pinned_side", "median_gbps") for r in rows), default=0) for d in ("h2d", "d2h")}
    if best["h2d"] and best["d2h"]:
        text += (
            f"\n\nPinned copies on a side stream at their best size: {side['h2d'] / best['h2d']:.0%} (host to device) and "
            f"{side['d2h'] / best['d2h']:.0%} (device to host) of the fastest copy measured on this link."
        )
    return text


def worker_table(rows: list[Row]) -> str:
    head = ["model", "batch", "mode", "iteration ms", "predicted ms", "measured peak MB", "predicted peak MB",
            "measured / predicted", "predicted with base MB", "allocator peak MB", "nvidia-smi MiB", "stall ms",
            "late prefetches", "status"]
    body = [
        [fmt(r.get("model")), fmt(r.get("batch")), fmt(r.get("mode")), fmt(r.get("time_ms")), fmt(r.get("predicted_time_ms")),
         fmt(r.get("measured_peak_mb")), fmt(r.get("predicted_tensors_mb", r.get("predicted_peak_mb"))),
         fmt(r.get("peak_vs_predicted")), fmt(r.get("predicted_peak_mb")),
         fmt(r.get("allocator_peak_mb")), fmt(r.get("smi_peak_mib")), fmt(r.get("stall_ms")),
         fmt(r.get("late_prefetches")), status_cell(r)]
        for r in rows
    ]
    note = ("Medians over the iterations after the warm-up; peaks are the worker's own `measured_peak_bytes` (MB, "
            "10^6 bytes: the storages the plan moves), predictions `tensilectl plan`'s. The predicted peak is the "
            "plan's less the device profile's `base_bytes` (the CUDA context and the cuDNN and cuBLAS workspaces "
            "that the plan adds to every job and the worker's storages never hold); 'with base' is the plan's own "
            "figure. The allocator peak is the "
            "CUDA caching allocator's `allocator_peak_bytes` (every tensor of the process, kernels' temporaries "
            "included; none on the CPU); nvidia-smi's figure is the whole process, CUDA context included.\n\n")
    return note + table(head, body)


def hook_table(rows: list[Row]) -> str:
    plain = {(r.get("model"), r.get("batch")): r for r in rows if r.get("mode") == "plain" and r.get("status") == "ok"}
    head = ["model", "batch", "mode", "step ms", "vs plain", "peak MB", "vs plain", "saved peak MB", "ops timed",
            "reports latencies", "status"]
    body = []
    for r in rows:
        p = plain.get((r.get("model"), r.get("batch")), {})
        timed = f"{r['ops_timed']}/{r['ops']}" if "ops_timed" in r else "-"
        body.append([fmt(r.get("model")), fmt(r.get("batch")), fmt(r.get("mode")), fmt(r.get("step_ms")),
                     pct(r.get("step_ms"), p.get("step_ms")), fmt(r.get("peak_mb")), pct(r.get("peak_mb"), p.get("peak_mb")),
                     fmt(r.get("saved_peak_mb")), timed, fmt(r.get("reports_latencies")), status_cell(r)])
    note = ("Median step time after the warm-up; peak is `torch.cuda.max_memory_allocated` over the measured steps "
            "(none on the CPU); saved peak is the hook's own resident saved bytes. `tensile-untimed` is "
            "`tensile` with the CUDA op timing off (what timing costs). The encoder is the tracer's "
            "TransformerClassifier at BERT-base's sizes.\n\n")
    return note + table(head, body)


def colocate_table(rows: list[Row]) -> str:
    head = ["model", "batch", "mode", "budget MB", "base MB (each)", "storage budget MB", "iteration ms (each job)",
            "alone ms", "slowdown", "peaks MB (each job)", "joint peak MB", "within storage budget",
            "nvidia-smi MiB (each)", "nvidia-smi MiB (both)", "GPU within budget", "ledger", "status"]
    body = []
    for r in rows:
        jobs = r.get("jobs") or []
        base = r.get("base_mb")
        body.append([fmt(r.get("model")), fmt(r.get("batch")), fmt(r.get("mode")), fmt(r.get("budget_mb")),
                     f"{fmt(base)} ({r['base_source']})" if base is not None else "-",
                     fmt(r.get("storage_budget_mb")),
                     " / ".join(fmt(j.get("time_ms")) for j in jobs) or "-", fmt(r.get("solo_time_ms")),
                     fmt(r.get("slowdown_vs_solo")), " / ".join(fmt(j.get("measured_peak_mb")) for j in jobs) or "-",
                     fmt(r.get("joint_peak_mb")), fmt(r.get("within_budget")),
                     " / ".join(fmt(j.get("smi_peak_mib")) for j in jobs) or "-", fmt(r.get("smi_joint_peak_mib")),
                     fmt(r.get("device_within_budget")),
                     fmt(r.get("ledger")), status_cell(r)])
    note = ("Two workers of the same job at once: without plans (`vanilla`), then through one scheduler whose "
            "budget is ONE copy's memory. On a GPU that is the job's vanilla process alone as nvidia-smi saw it "
            "(CUDA context and allocator included), and each process's base, passed to `--base-mb`, is that "
            "process's memory outside its storages (`measured`); without nvidia-smi, the plan's predicted "
            "vanilla peak and the device profile's base (`profile`). The scheduler plans each job with its "
            "base inside the budget; the storage budget, what the two bases leave, is what the workers' ledger "
            "holds their storages to. The joint peak is the most storage bytes the two held at one time, from "
            "their `--memory-trace` files (warm-up included); 'within storage budget' compares it (or, where it "
            "is missing, the sum of the two peaks) with the storage budget. 'nvidia-smi (both)' is the most "
            "nvidia-smi saw the two processes hold in one poll (5 a second: a shorter spike can pass unseen); "
            "'GPU within budget' compares it with the budget. Slowdown is the slower job against the job alone "
            "(the worker step's vanilla row).\n\n")
    return note + table(head, body)


def latency_table(rows: list[Row]) -> str:
    by = {r["id"]: r for r in rows}
    stages = []
    if "profile" in by:
        r = by["profile"]
        what = f"{fmt(r.get('samples'))} samples; timing: {fmt(r.get('timing'))}; {fmt(r.get('note'))}"
        stages.append(["profile", what, status_cell(r)])
    if "train" in by:
        r = by["train"]
        what = f"{fmt(r.get('op_types'))} op types, {fmt(r.get('samples'))} samples -> `{fmt(r.get('models'))}`"
        stages.append(["train", what, status_cell(r)])
    if "eval" in by:
        r = by["eval"]
        stages.append(["eval", f"held-out MAPE {fmt(r.get('mape'))}% over {fmt(r.get('heldout_samples'))} samples, "
                       f"{fmt(r.get('op_types'))} op types", status_cell(r)])
    text = table(["stage", "result", "status"], stages)
    preds = [r for r in rows if r["id"].startswith("predict-")]
    text += "\n\nVanilla iteration time predicted against the worker's measured one:\n\n"
    text += table(
        ["model", "batch", "measured ms", "learned models ms", "learned / measured", "roofline ms", "roofline / measured",
         "status"],
        [[fmt(r.get("model")), fmt(r.get("batch")), fmt(r.get("measured_ms")), fmt(r.get("learned_ms")),
          fmt(r.get("learned_vs_measured")), fmt(r.get("roofline_ms")), fmt(r.get("roofline_vs_measured")), status_cell(r)]
         for r in preds],
    )
    return text


TABLES: dict[str, Callable[[list[Row]], str]] = {
    "tests": tests_table,
    "copy-bw": copy_table,
    "worker": worker_table,
    "hook": hook_table,
    "colocate": colocate_table,
    "latency": latency_table,
}


def targets(root: Path) -> str:
    """The issue's targets, each with the figures measured for it."""
    out = []
    hook = [r for r in results.read_rows(root, "hook") if r.get("status") == "ok"]
    for model in sorted({r["model"] for r in hook}):
        modes = {r["mode"]: r for r in hook if r["model"] == model}
        plain, ours, soc = modes.get("plain"), modes.get("tensile"), modes.get("save_on_cpu")
        if plain and ours and plain.get("peak_mb") and ours.get("peak_mb"):
            less, slower = 1 - ours["peak_mb"] / plain["peak_mb"], ours["step_ms"] / plain["step_ms"] - 1
            met = less >= 0.30 and slower <= 0.10
            what = f"hook, {model}: >= 30% less peak than plain, <= 10% slower"
            out.append([what, f"{less:.0%} less, {slower:+.0%} time", fmt(met)])
        if ours and soc and ours.get("peak_mb") and soc.get("peak_mb"):
            out.append([f"hook, {model}: faster than save_on_cpu", f"{ours['step_ms']} ms against {soc['step_ms']} ms "
                        f"(peaks {ours['peak_mb']} / {soc['peak_mb']} MB)", fmt(ours["step_ms"] < soc["step_ms"])])
    for r in results.read_rows(root, "worker"):
        if r.get("mode") == "planned" and r.get("peak_vs_predicted"):
            off = r["peak_vs_predicted"] - 1
            what = f"worker, {r['model']} b{r['batch']}: measured peak within 5% of predicted"
            out.append([what, f"{off:+.1%}", fmt(abs(off) <= 0.05)])
    text = table(["target (issue 23)", "measured", "met"], out) if out else "No figure for any target yet."
    return text + NOT_MEASURED


def markdown(root: Path) -> str:
    m = json.loads((root / "meta.json").read_text()) if (root / "meta.json").exists() else {}
    dry = m.get("mode") == "dry"
    lines = ["# GPU results", ""]
    if dry:
        lines += ["**A dry run on the CPU**: it checks the script, its steps and this report. Its figures are CPU "
                  "smoke-test numbers at toy sizes, not GPU results; the GPU-only steps say `skipped: no GPU`.", ""]
    gpu = m.get("gpu", "-")
    if m.get("driver"):
        gpu += f" ({m.get('gpu_memory')}), driver {m['driver']}"
    lines += [
        table(["", ""], [
            ["device", gpu],
            ["PyTorch", f"{fmt(m.get('torch'))} (CUDA {fmt(m.get('torch_cuda'))})"],
            ["commit", fmt(m.get("commit"))],
            ["date", f"{fmt(m.get('first_run'))} (last run {fmt(m.get('last_run'))}; runs: {fmt(m.get('runs'))})"],
            ["binaries", fmt(m.get("bin_dir"))],
            ["CPU cores", fmt(m.get("cpus"))],
        ]),
        "",
    ]
    summary = []
    for step in STEPS:
        res = results.read_result(root, step)
        rows = results.read_rows(root, step)
        if res is not None:
            summary.append([step, res["status"], fmt(res.get("seconds")), fmt(res.get("reason"))])
        elif rows:
            summary.append([step, "incomplete", "-", f"{len(rows)} rows so far: rerun to resume"])
        else:
            summary.append([step, "not run", "-", "-"])
    lines += ["## Steps", "", table(["step", "status", "seconds", "reason"], summary), ""]
    for step in STEPS:
        res = results.read_result(root, step)
        rows = res["rows"] if res is not None else results.read_rows(root, step)
        lines += [f"## {TITLES[step]}", ""]
        if res is not None and res["status"] == "skipped" and all(r.get("status") == "skipped" for r in rows):
            lines += [f"skipped: {res['reason']}", ""]
            if step != "tests":
                continue
        elif res is None and not rows:
            lines += ["not run yet.", ""]
            continue
        lines += [TABLES[step](rows), ""]
        notes = sorted({str(r["note"]) for r in rows if r.get("note")})
        lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    lines += ["## Targets", "", "not measured: a dry run has no GPU figure." if dry else targets(root), ""]
    return "\n".join(lines)


def empty() -> str:
    """docs/gpu-results.md before any GPU: how to run, and the headings."""
    lines = [
        "# GPU results",
        "",
        "**No GPU has been lent to this project yet**: nothing below has been measured, and no figure is "
        "estimated. The tables are filled in by `scripts/gpu-check.sh` on a GPU machine.",
        "",
        HOW_TO_RUN,
        "",
        table(["", ""], [["device", "-"], ["PyTorch", "-"], ["commit", "-"], ["date", "-"]]),
        "",
    ]
    for step in STEPS:
        lines += [f"## {TITLES[step]}", "", "not run yet: no GPU.", "", TABLES[step]([]), ""]
    lines += ["## Targets", "", table(["target (issue 23)", "measured", "met"], []) + NOT_MEASURED, ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("meta")
    m.add_argument("--results", type=Path, required=True)
    m.add_argument("--mode", choices=["gpu", "dry"], required=True)
    m.add_argument("--commit-file", type=Path)
    m.add_argument("--bin-dir", default="")
    md = sub.add_parser("markdown")
    md.add_argument("--results", type=Path, required=True)
    md.add_argument("--out", type=Path)
    e = sub.add_parser("empty")
    e.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    if a.cmd == "meta":
        return meta(a.results, a.mode, a.commit_file, a.bin_dir)
    text = markdown(a.results) if a.cmd == "markdown" else empty()
    out = a.out or (a.results / "gpu-results.md" if a.cmd == "markdown" else None)
    if out is None:
        print(text)
    else:
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
