#!/usr/bin/env python3
"""The worker on the device: each job alone (vanilla, then under its plan),
and two copies of a job at once under one job's memory through a
scheduler, as two processes and as one process that trains both.

    worker.py solo --results DIR --bin DIR --device cuda --profile h100 --jobs resnet50:32,bert_base:16
    worker.py colocate --results DIR --bin DIR --device cuda --profile h100 --job resnet50:32

A job is MODEL:BATCH[:RESOLUTION]. Every figure comes from the binaries'
own output: ``tensilectl plan --json`` (the predicted peaks and times),
``tensile-worker --json`` (per iteration: time, measured peak, stalls, and
on a GPU the base it measured: what the process holds outside its
storages), and on a GPU nvidia-smi's device memory per process (CUDA
context included).
Iterations before ``--warmup`` are left out of the medians and peaks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import proc
import results


ROOT = Path(__file__).resolve().parents[2]


def base_mb(profile: str) -> float:
    """The device profile's ``base_bytes`` in MB: what ``tensilectl plan``
    adds to every predicted peak for the CUDA context and the cuDNN and
    cuBLAS workspaces, and what the worker's own storages never include.
    0 for a profile with no file (the CPU)."""
    path = ROOT / "latency-model" / "profiles" / f"{profile}.json"
    if not path.exists():
        return 0.0
    return round(json.loads(path.read_text())["base_bytes"] / 1e6, 1)


MB_PER_MIB = 2**20 / 1e6


def colocate_budget(
    solo: dict[str, Any] | None,
    vanilla_peak_bytes: int,
    profile: str,
    given_base_mb: int | None = None,
    processes: int = 2,
) -> dict[str, Any]:
    """The budget of two co-located workers of one job, and what each
    process holds outside its storages (its base), in MB.

    Where nvidia-smi measured the job's vanilla run alone (a GPU): the budget
    is that whole process (one copy's memory as the GPU sees it, CUDA context
    and allocator included) and the base is the part of it outside the
    storages, passed to the workers' ``--base-mb``. Else (no nvidia-smi, a dry
    run): the plan's predicted vanilla peak and the device profile's base.
    ``given_base_mb`` replaces the base (say, one measured under a plan,
    where the allocator keeps more). The storage budget is what the bases
    of ``processes`` worker processes leave (two, one per copy; one, when
    one process trains both copies): the ledger holds the copies' storages
    to it."""
    smi = solo.get("smi_peak_mib") if solo else None
    peak = solo.get("measured_peak_mb") if solo else None
    if smi and peak:
        budget = math.floor(smi * MB_PER_MIB)
        base, source = max(1, math.ceil(budget - peak)), "measured"
    else:
        budget = math.ceil(vanilla_peak_bytes / 1e6)
        base, source = math.ceil(base_mb(profile)), "profile"
    if given_base_mb is not None:
        base, source = given_base_mb, "given"
    return {"budget_mb": budget, "base_mb": base, "base_source": source,
            "storage_budget_mb": max(1, budget - processes * base)}


def predict_tensors(row: dict[str, Any], profile: str) -> None:
    """The predicted peak of the tensors alone (the plan's less the
    profile's base), and the measured peak against it."""
    if row.get("predicted_peak_mb") is None:
        return
    row["predicted_base_mb"] = base_mb(profile)
    row["predicted_tensors_mb"] = round(row["predicted_peak_mb"] - row["predicted_base_mb"], 1)
    row["peak_vs_predicted"] = ratio(row.get("measured_peak_mb"), row["predicted_tensors_mb"])


@dataclasses.dataclass(frozen=True)
class Job:
    model: str
    batch: int
    resolution: int | None

    @staticmethod
    def parse(text: str) -> Job:
        parts = text.split(":")
        if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[1:]):
            raise SystemExit(f"job {text!r}: expected MODEL:BATCH[:RESOLUTION]")
        return Job(parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else None)

    @property
    def id(self) -> str:
        return f"{self.model}-b{self.batch}" + (f"-r{self.resolution}" if self.resolution else "")

    def args(self) -> list[str]:
        out = ["--model", self.model, "--batch", str(self.batch)]
        return out + (["--resolution", str(self.resolution)] if self.resolution else [])

    def spec(self, name: str) -> str:
        """The job as one ``tensile-worker --job`` spec, named ``name``."""
        out = f"model={self.model},batch={self.batch},name={name}"
        return out + (f",resolution={self.resolution}" if self.resolution else "")


@dataclasses.dataclass
class Ctx:
    results: Path
    bin: Path
    device: str
    profile: str
    iterations: int
    warmup: int
    threads: int | None

    def exe(self, name: str) -> str:
        return str(self.bin / name)

    def logs(self) -> Path:
        return self.results / "logs"

    def worker_args(self) -> list[str]:
        out = ["--device", self.device, "--iterations", str(self.iterations), "--json"]
        return out + (["--threads", str(self.threads)] if self.threads else [])


def plan_summary(ctx: Ctx, job: Job, step: str) -> tuple[dict[str, Any] | None, Path, str]:
    """``tensilectl plan --json -o FILE`` for the job (kept: a rerun reuses it)."""
    folder = ctx.results / step
    folder.mkdir(parents=True, exist_ok=True)
    plan, summary = folder / f"{job.id}.plan.json", folder / f"{job.id}.plan-summary.json"
    if plan.exists() and summary.exists():
        return json.loads(summary.read_text()), plan, ""
    cmd = [ctx.exe("tensilectl"), "plan", *job.args(), "--device", ctx.profile, "--json", "-o", str(plan)]
    r = proc.run(cmd, ctx.logs() / f"{step}-{job.id}-plan.log", proc.tch_env())
    r.check_time(f"planning {job.id}")
    if r.rc != 0:
        return None, plan, f"tensilectl plan: {r.error()}"
    try:
        data = json.loads(r.stdout[r.stdout.index("{") : r.stdout.rindex("}") + 1])
    except ValueError:
        return None, plan, "tensilectl plan printed no JSON"
    summary.write_text(json.dumps(data, indent=1) + "\n")
    return data, plan, ""


def iterations(stdout: str) -> list[dict[str, Any]]:
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return [it for it in out if "time_ns" in it]


def summarize(its: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Medians and maxima over the iterations after the warm-up (the last
    one when there are no more)."""
    steady = its[warmup:] or its[-1:]
    if not steady:
        return {}

    def med(key: str) -> float:
        return statistics.median(it.get(key, 0) for it in steady)

    return {
        "iterations_run": len(its),
        "iterations_counted": len(steady),
        "time_ms": round(med("time_ns") / 1e6, 2),
        "first_time_ms": round(its[0]["time_ns"] / 1e6, 2),
        "measured_peak_mb": round(max(it.get("measured_peak_bytes", 0) for it in steady) / 1e6, 1),
        "executor_peak_mb": round(max(it.get("executor_peak_bytes", 0) for it in steady) / 1e6, 1),
        # The CUDA caching allocator's peak (absent on the CPU).
        "allocator_peak_mb": (
            round(max(it["allocator_peak_bytes"] for it in steady) / 1e6, 1)
            if all("allocator_peak_bytes" in it for it in steady)
            else None
        ),
        # The base the worker measured (the process's device memory by NVML
        # less its storages' peak; the whole process's when it trains
        # several jobs, from a worker with --job), median over the iterations that carry it: absent on the
        # CPU, before the worker's own warm-up and where NVML failed.
        "measured_base_mb": (
            round(statistics.median(it["base_bytes"] for it in steady if "base_bytes" in it) / 1e6, 1)
            if any("base_bytes" in it for it in steady)
            else None
        ),
        "stall_ms": round(med("stall_ns") / 1e6, 2),
        "late_prefetches": sum(it.get("late_prefetches", 0) for it in steady),
        "passive_swaps": sum(it.get("passive_swaps", 0) for it in steady),
        "failed_copies": sum(it.get("failed_copies", 0) for it in steady),
        "guard_evictions": sum(it.get("guard_evictions", 0) for it in steady),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def solo(ctx: Ctx, jobs: list[Job]) -> int:
    step = "worker"
    for job in jobs:
        ids = {mode: f"{job.id}-{mode}" for mode in ("vanilla", "planned")}
        if all(results.has_row(ctx.results, step, i) for i in ids.values()):
            print(f"  {job.id}: done before")
            continue
        results.need_time(60, f"{job.id} on the worker")
        summary, plan, plan_error = plan_summary(ctx, job, step)
        for mode, row_id in ids.items():
            if results.has_row(ctx.results, step, row_id):
                continue
            results.need_time(30, row_id)
            row: dict[str, Any] = {
                "id": row_id,
                "model": job.model,
                "batch": job.batch,
                "resolution": job.resolution,
                "mode": mode,
                "device": ctx.device,
                "profile": ctx.profile,
            }
            if summary is not None:
                key = "vanilla" if mode == "vanilla" else "planned"
                row["predicted_peak_mb"] = round(summary[f"{key}_peak_bytes"] / 1e6, 1)
                row["predicted_time_ms"] = round(summary[f"{key}_time_s"] * 1e3, 2)
            if mode == "planned" and summary is None:
                row.update(status="failed", reason=plan_error)
                results.add_row(ctx.results, step, row)
                print(f"  {row_id}: failed: {plan_error}")
                continue
            how = ["--vanilla"] if mode == "vanilla" else ["--plan", str(plan)]
            cmd = [ctx.exe("tensile-worker"), *job.args(), *how, *ctx.worker_args()]
            r = proc.run(cmd, ctx.logs() / f"worker-{row_id}.log", proc.tch_env())
            r.check_time(row_id)
            its = iterations(r.stdout)
            row.update(summarize(its, ctx.warmup))
            row["smi_peak_mib"] = r.smi_peak_mib
            predict_tensors(row, ctx.profile)
            row["time_vs_predicted"] = ratio(row.get("time_ms"), row.get("predicted_time_ms"))
            if r.rc != 0 or not its:
                row.update(status="failed", reason=r.error() if r.rc != 0 else "no iteration printed")
            results.add_row(ctx.results, step, row)
            if row.get("status") == "failed":
                print(f"  {row_id}: failed: {row['reason']}")
            else:
                print(
                    f"  {row_id}: {row['time_ms']} ms/iteration, peak {row['measured_peak_mb']} MB "
                    f"(predicted {row.get('predicted_tensors_mb')}), measured base {row.get('measured_base_mb')} MB"
                )
    return 0


def worker_help(ctx: Ctx) -> str:
    r = subprocess.run([ctx.exe("tensile-worker"), "--help"], capture_output=True, text=True, env=proc.tch_env())
    return r.stdout


def ledger_supported(ctx: Ctx) -> bool:
    return "--ledger" in worker_help(ctx)


def copies_supported(ctx: Ctx) -> bool:
    return "--copies" in worker_help(ctx)


def jobs_supported(ctx: Ctx) -> bool:
    """Whether this tensile-worker trains different jobs in one process
    (``--job SPEC``, repeated)."""
    return "--job <SPEC>" in worker_help(ctx)


def wait_for_socket(sock: Path, p: subprocess.Popen[str], seconds: float) -> str:
    end = time.time() + seconds
    while time.time() < end:
        if sock.exists():
            return ""
        if p.poll() is not None:
            return f"the scheduler exited with status {p.returncode}"
        time.sleep(0.1)
    return f"no socket {sock} after {seconds:.0f} s"


def stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def joint_peak_mb(traces: list[Path]) -> float | None:
    """The most device bytes the workers held at one time, MB, from their
    ``--memory-trace`` files (``unix_time_s,bytes`` at every change): each
    worker holds its last traced figure until its next one. None when a
    trace is missing or empty."""
    events = []
    for i, path in enumerate(traces):
        if not path.exists():
            return None
        rows = []
        for line in path.read_text().splitlines():
            t, _, b = line.partition(",")
            try:
                rows.append((float(t), i, int(b)))
            except ValueError:
                continue  # a line cut short when the worker was stopped
        if not rows:
            return None
        events += rows
    held = [0] * len(traces)
    peak = 0
    for _, i, b in sorted(events):
        held[i] = b
        peak = max(peak, sum(held))
    return round(peak / 1e6, 1)


def pair(
    ctx: Ctx, job: Job, extra: list[str], tag: str, traces: Path, one_process: bool = False
) -> tuple[list[dict[str, Any]], list[str], tuple[int, int], float | None]:
    """Two copies of ``job`` at once, as two worker processes or, with
    ``one_process``, as one process that trains both as two jobs of its own
    (``--job SPEC --job SPEC``; ``--copies 2`` for a worker without
    ``--job``), registered at the scheduler as jobs of one process:
    their summaries, their errors, the sum of the processes' nvidia-smi
    peaks and the most nvidia-smi saw them hold in one poll (0, 0 when not
    sampled), and the copies' joint storage peak (from memory traces
    written in ``traces``)."""
    t0 = time.time()
    started = []
    names = ("a", "b")
    if one_process:
        files = [traces / f"{tag}.{i}.trace" for i in range(len(names))]
        if jobs_supported(ctx):
            how = [a for name in names for a in ("--job", job.spec(f"{job.model}-{name}"))]
        else:
            how = ["--copies", str(len(names))]
        procs = [("ab", [*how, "--memory-trace", str(traces / f"{tag}.trace")])]
    else:
        files = [traces / f"{tag}-{name}.trace" for name in names]
        procs = [(name, ["--name", f"{job.model}-{name}", "--memory-trace", str(f)]) for name, f in zip(names, files)]
    with proc.SmiSampler() as smi:
        for name, own in procs:
            log = ctx.logs() / f"colocate-{tag}-{name}.log"
            which = [] if one_process and "--job" in own else job.args()
            cmd = [ctx.exe("tensile-worker"), *which, *ctx.worker_args(), *own, *extra]
            p = proc.start(cmd, log, proc.tch_env())
            smi.pids.add(p.pid)
            started.append((name, p, log))
        runs = [(name, p.pid, proc.finish(p, log, t0, results.time_left() - 15)) for name, p, log in started]
    for name, _, r in runs:
        r.check_time(f"worker {job.model}-{name} ({tag})")
    jobs, errors = [], []
    for name, pid, r in runs:
        its = iterations(r.stdout)
        # One process prints both jobs' lines, each naming its job (or copy).
        copies = (
            [[it for it in its if it.get("job", it.get("copy")) == i] for i in range(len(names))] if one_process else [its]
        )
        for i, mine in enumerate(copies):
            s = summarize(mine, ctx.warmup)
            s["name"] = f"{job.model}-{names[i] if one_process else name}"
            s["smi_peak_mib"] = smi.peak_mib.get(pid) if smi.enabled else None
            jobs.append(s)
            if r.rc != 0 or "time_ms" not in s:
                errors.append(f"{s['name']}: {r.error() if r.rc != 0 else 'no iteration printed'}")
    return jobs, errors, (sum(smi.peak_mib.values()), smi.joint_peak_mib), joint_peak_mb(files)


def colocate(ctx: Ctx, job: Job, given_base_mb: int | None = None) -> int:
    step = "colocate"
    summary, _, plan_error = plan_summary(ctx, job, step)
    solo_row = results.row_of(ctx.results, "worker", f"{job.id}-vanilla")
    solo_ms = solo_row.get("time_ms") if solo_row and solo_row.get("status") == "ok" else None
    base = {"model": job.model, "batch": job.batch, "resolution": job.resolution, "device": ctx.device, "solo_time_ms": solo_ms}
    for tag in ("vanilla", "scheduler", "one-process"):
        row_id = f"{job.id}-x2-{tag}"
        if given_base_mb is not None:
            if tag == "vanilla":
                continue  # the same with any base
            row_id += f"-base{given_base_mb}"
        if results.has_row(ctx.results, step, row_id):
            print(f"  {row_id}: done before")
            continue
        results.need_time(60, row_id)
        row: dict[str, Any] = {"id": row_id, "mode": tag, **base}
        tmp = Path(tempfile.mkdtemp(prefix="tensile-gpu-check-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
        sched: subprocess.Popen[str] | None = None
        try:
            if tag == "vanilla":
                jobs, errors, smi, joint = pair(ctx, job, ["--vanilla"], tag, tmp)
            else:
                if summary is None:
                    row.update(status="failed", reason=plan_error)
                    results.add_row(ctx.results, step, row)
                    continue
                one_process = tag == "one-process"
                if one_process and not (jobs_supported(ctx) or copies_supported(ctx)):
                    row.update(status="failed", reason="this tensile-worker has neither --job nor --copies")
                    results.add_row(ctx.results, step, row)
                    continue
                budget = colocate_budget(
                    solo_row if solo_ms else None,
                    summary["vanilla_peak_bytes"],
                    ctx.profile,
                    given_base_mb,
                    processes=1 if one_process else 2,
                )
                row.update(budget)
                budget_mb, room_mb = budget["budget_mb"], budget["storage_budget_mb"]
                sock = tmp / "scheduler.sock"
                sched_cmd = [
                    ctx.exe("tensile-scheduler"), "--listen", f"unix:{sock}", "--device", ctx.profile,
                    "--budget-mb", str(budget_mb), "--state", "none",
                ]
                sched = proc.start(sched_cmd, ctx.logs() / "colocate-scheduler.log", dict(os.environ))
                err = wait_for_socket(sock, sched, 30)
                if err:
                    row.update(status="failed", reason=err)
                    results.add_row(ctx.results, step, row)
                    continue
                extra = ["--scheduler", f"unix:{sock}", "--plan-timeout-s", str(max(30, int(results.time_left() - 30)))]
                if budget["base_source"] != "profile":
                    extra += ["--base-mb", str(budget["base_mb"])]
                row["ledger"] = ledger_supported(ctx)
                if row["ledger"]:
                    extra += ["--ledger", str(tmp / "ledger"), "--memory-mb", str(room_mb)]
                jobs, errors, smi, joint = pair(ctx, job, extra, tag, tmp, one_process)
        finally:
            if sched is not None:
                stop(sched)
            shutil.rmtree(tmp, ignore_errors=True)
        row["jobs"] = jobs
        peaks = [j.get("measured_peak_mb") for j in jobs]
        if all(p is not None for p in peaks):
            row["sum_peak_mb"] = round(sum(peaks), 1)  # type: ignore[arg-type]
        row["joint_peak_mb"] = joint
        held = joint if joint is not None else row.get("sum_peak_mb")
        if held is not None and "storage_budget_mb" in row:
            row["within_budget"] = held <= row["storage_budget_mb"]
        times = [j["time_ms"] for j in jobs if "time_ms" in j]
        if times and solo_ms:
            row["slowdown_vs_solo"] = round(max(times) / solo_ms, 3)
        row["smi_sum_peak_mib"] = smi[0] or None
        row["smi_joint_peak_mib"] = smi[1] or None
        if smi[1] and "budget_mb" in row:
            row["device_within_budget"] = smi[1] * MB_PER_MIB <= row["budget_mb"]
        if errors:
            row.update(status="failed", reason="; ".join(errors))
        results.add_row(ctx.results, step, row)
        what = f"failed: {row['reason']}" if errors else f"times {times} ms, sum of peaks {row.get('sum_peak_mb')} MB, joint peak {joint} MB"
        print(f"  {row_id}: {what}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["solo", "colocate"])
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--bin", type=Path, required=True, help="folder of tensile-worker, tensilectl, tensile-latency, tensile-scheduler")
    p.add_argument("--device", default="cuda")
    p.add_argument("--profile", default="h100", help="tensilectl's device profile for the plans")
    p.add_argument("--jobs", default="resnet50:32,bert_base:16")
    p.add_argument("--job", default="resnet50:32")
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int)
    p.add_argument("--base-mb", type=int, help="colocate: each process's base, MB (default: measured alone)")
    a = p.parse_args()
    ctx = Ctx(a.results, a.bin, a.device, a.profile, a.iterations, a.warmup, a.threads)
    try:
        if a.what == "solo":
            return solo(ctx, [Job.parse(j) for j in a.jobs.split(",") if j])
        return colocate(ctx, Job.parse(a.job), a.base_mb)
    except results.OutOfTime as e:
        print(f"  {e}")
        return results.INCOMPLETE


if __name__ == "__main__":
    sys.exit(main())
