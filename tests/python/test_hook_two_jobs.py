"""Two copies of a user's training script on one scheduler whose budget is
too small for both, run as two processes as a user would run them: the
second waits at its first step until the first has left (said on its log
with the scheduler's reason), then trains on the scheduler's plan; the
peaks the jobs report never add up past the budget at any poll of the
scheduler's status; each trains bit-identically to the same script
without the hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tensile

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER = os.environ.get("TENSILE_SCHEDULER", str(ROOT / "target" / "debug" / "tensile-scheduler"))
#: One job's lower bound is 3.1 MB, its plan 5.2 MB: one fits, two do not.
BUDGET_MB = 5
#: The first job trains long enough (about 10 s) for the second to reach
#: its first step meanwhile.
FIRST_STEPS, SECOND_STEPS = 40, 6

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from torch.nn import functional as F
    import tensile
    from tensile.trace.models import TransformerClassifier

    address, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
    steps = int(sys.argv[4])
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randint(0, 1000, (8, 64), generator=g), torch.randint(0, 10, (8,), generator=g))
            for _ in range(steps)]

    def model():
        torch.manual_seed(0)
        return TransformerClassifier(vocab=1000, seq_len=64, d_model=128, heads=4, layers=2, classes=10)

    def train(m, opt, between=lambda: None):
        torch.manual_seed(2)
        for x, y in data:
            F.cross_entropy(m(x), y).backward()
            opt.step()
            opt.zero_grad()
            between()
        return [p.detach().clone() for p in m.parameters()]

    plain_model = model()
    plain = train(plain_model, torch.optim.Adam(plain_model.parameters(), lr=1e-3))
    m = model()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    plan = tensile.plan(m, opt, data[0], F.cross_entropy, server=address)
    ends = []
    with tensile.apply(plan, m, opt, name=name) as hook:
        hooked = train(m, opt, lambda: (ends.append(time.monotonic_ns()), time.sleep(0.25)))
        job = hook.session.job.id
    json.dump({
        "job": job,
        "starts": [s.start_ns for s in hook.stats],
        "ends": ends,
        "plan_jobs": [s.plan_job for s in hook.stats],
        "identical": all(torch.equal(a, b) for a, b in zip(plain, hooked)),
    }, open(out, "w"))
    """
)


def test_a_second_job_waits_until_the_first_leaves_and_the_budget_holds(tmp_path):
    sock = tmp_path / "scheduler.sock"
    log = open(tmp_path / "scheduler.log", "w")
    scheduler = subprocess.Popen(
        [SCHEDULER, "--listen", f"unix:{sock}", "--state", "none", "--device", "cpu", "--budget-mb", str(BUDGET_MB)],
        stdout=log, stderr=subprocess.STDOUT,
    )
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    jobs: list[subprocess.Popen[str]] = []
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert scheduler.poll() is None and time.monotonic() < deadline, (tmp_path / "scheduler.log").read_text()
            time.sleep(0.05)
        address = f"unix:{sock}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}

        def start(name: str, steps: int) -> subprocess.Popen[str]:
            return subprocess.Popen(
                [sys.executable, str(script), address, name, str(tmp_path / f"{name}.json"), str(steps)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            )

        polls = []
        with tensile.Client(address, timeout_s=10) as client:
            jobs.append(start("first", FIRST_STEPS))
            while not any(j.state == tensile.v1.tensile_pb2.JOB_STATE_ACTIVE for j in client.status().jobs):
                assert jobs[0].poll() is None, jobs[0].communicate()[0]
                time.sleep(0.05)
            jobs.append(start("second", SECOND_STEPS))
            while any(j.poll() is None for j in jobs):
                status = client.status()
                active = [j for j in status.jobs if j.state == tensile.v1.tensile_pb2.JOB_STATE_ACTIVE]
                polls.append((len(status.jobs), sum(j.reported_peak_bytes for j in active)))
                time.sleep(0.05)
        logs = [j.communicate(timeout=60)[0] for j in jobs]
        assert all(j.returncode == 0 for j in jobs), logs
    finally:
        for j in jobs:
            if j.poll() is None:
                j.kill()
        scheduler.terminate()
        scheduler.wait(timeout=15)
        log.close()
    first, second = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("first", "second"))
    assert first["identical"] and second["identical"]
    # The second waited at its first step: it started no step before the
    # first had ended its last, said why, and trained on the scheduler's plan.
    assert second["starts"][0] > first["ends"][-1], (second["starts"][0], first["ends"][-1])
    assert "queued job" in logs[1] and "waits until it is admitted" in logs[1], logs[1]
    assert all(j == second["job"] for j in second["plan_jobs"]) and all(j == first["job"] for j in first["plan_jobs"])
    # Both were registered at once at some poll, and the peaks the active
    # jobs reported never added up past the budget.
    assert max(n for n, _ in polls) == 2
    peak = max(p for _, p in polls)
    assert 0 < peak <= BUDGET_MB * 1_000_000, polls
