"""`tensile.apply(..., server=...)` against the real `tensile-scheduler`
binary on a Unix socket in a temporary folder (issue 15, item 3).

The proofs: training the tracer's transformer encoder with a scheduler
gives parameters bit-identical to plain training while the scheduler
receives every step's report (GetStatus: iterations reported, the reported
peak, latencies "measured") and pushes new plans, which the hook applies at
step boundaries; killing the scheduler mid-run leaves training to finish
with the last plan, bit-identical; an unreachable scheduler is the same; a
job dropped by the scheduler registers again; the job is gone from the
status after the block, also when the block ends with an error.
"""

import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

import tensile
from tensile.trace.models import TransformerClassifier

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER = os.environ.get("TENSILE_SCHEDULER", str(ROOT / "target" / "debug" / "tensile-scheduler"))
ADMIN = "hook-live-admin-token"
STEPS = 6


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True, scope="module")
def tensilectl_env():
    os.environ.setdefault("TENSILECTL", str(ROOT / "target" / "debug" / "tensilectl"))
    yield


class Scheduler:
    """One `tensile-scheduler` process on a socket of its own."""

    def __init__(self, folder: Path, lease_s: float = 10.0, budget_mb: int = 4096) -> None:
        self.sock = folder / "scheduler.sock"
        token = folder / "admin.token"
        token.write_text(ADMIN + "\n")
        token.chmod(0o600)
        self.log_path = folder / "scheduler.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [SCHEDULER, "--listen", f"unix:{self.sock}", "--state", "none", "--admin-token-file", str(token),
             "--budget-mb", str(budget_mb), "--lease-s", str(lease_s)],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while not self.sock.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"tensile-scheduler did not start: {self.log_path.read_text()}")
            time.sleep(0.05)
        self.address = f"unix:{self.sock}"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=15)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


@pytest.fixture()
def scheduler(tmp_path):
    s = Scheduler(tmp_path)
    yield s
    s.stop()


def encoder():
    torch.manual_seed(0)
    return TransformerClassifier(vocab=100, seq_len=32, d_model=64, heads=4, layers=2, classes=10)


def batches(n=STEPS):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 100, (4, 32), generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(n)]


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def train(model, optimizer, data, between=None):
    """The user's unchanged loop; `between(i)` runs after step i."""
    torch.manual_seed(2)  # dropout masks: the same draws with and without the hook
    for i, (x, y) in enumerate(data):
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if between is not None:
            between(i)
    return [p.detach().clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def plain():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the tests run (the function-scoped fixture comes later)
    model = encoder()
    yield train(model, adam(model), batches())
    torch.set_num_threads(threads)


def assert_bit_identical(plain, hooked):
    assert len(plain) == len(hooked)
    for i, (a, b) in enumerate(zip(plain, hooked)):
        assert torch.equal(a, b), f"parameter {i} differs after {STEPS} steps"


def job_ids(address):
    with tensile.Client(address, timeout_s=10) as client:
        return {j.job_id for j in client.status().jobs}


def test_reports_each_step_and_applies_pushed_plans_at_step_boundaries(scheduler, plain, tmp_path):
    model = encoder()
    optimizer = adam(model)
    plan = tensile.plan(model, optimizer, batches(1)[0], F.cross_entropy, server=scheduler.address, workdir=tmp_path)
    assert plan.server == scheduler.address and plan.events
    seen = {}

    with tensile.apply(plan, model, optimizer, name="hook-live") as hook:  # the server the plan came from
        session = hook.session
        assert session is not None

        def between(i):
            if i == 0:
                # The job's first plan (applied at the end of step 0 or 1).
                first = session.wait_for_plan(60, other_than=(0, 0))
                assert first is not None, f"no plan from the scheduler ({session.last_error})"
            if i == 1:
                # Step 1 is the first with every op timed (step 0 creates Adam's state): its report,
                # CPU latencies far from the cold start's, makes the scheduler re-plan.
                assert session.wait_for_plan(60) is not None, "no re-plan after the first report"
            if i == 3:
                # A budget change re-plans every job: a plan pushed mid-run, applied at the next boundary.
                seen["before_budget"] = hook.plan_id
                with tensile.Client(scheduler.address) as admin:
                    admin.set_budget(2000 * 10**6, admin_token=ADMIN)
                assert session.wait_for_plan(60) is not None, "no plan after the budget change"

        hooked = train(model, optimizer, batches(), between)
        job = session.job
        assert job is not None
        deadline = time.monotonic() + 60  # reports are sent in the background
        while session.reports_sent < STEPS - 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        with tensile.Client(scheduler.address) as client:
            (status,) = client.status(job.id).jobs
        seen["status"] = status

    assert_bit_identical(plain, hooked)
    status = seen["status"]
    # Every step's report but the first's carries latencies: step 1 is
    # checked and timed (step 0 creates Adam's state), the later ones
    # report its latencies.
    reported = sum(1 for i in range(STEPS) if hook.measurements(i)["op_latency_s"])
    assert reported == STEPS - 1 and [s.mode for s in hook.stats[:3]] == ["checked", "checked", "fast"]
    assert status.iterations_reported == reported == session.reports_sent
    assert status.latency_source == "measured"  # the reports replaced the cold start's latencies
    assert status.reported_peak_bytes == hook.stats[-1].device_peak_bytes == hook.stats[-1].max_managed_bytes > 0
    assert not session.refused

    # The plan each step ran: the job's first plan from the first step (the
    # first step waits for the registration and takes it); the re-plan
    # after step 1's report from step 3; the budget's from step 5.
    runs = [(s.plan_job, s.plan_version) for s in hook.stats]
    assert all(j == job.id for j, _ in runs), runs
    versions = [v for _, v in runs[2:]]
    assert versions == sorted(versions), runs
    assert runs[3][1] > runs[2][1], runs
    assert runs[5][1] > seen["before_budget"][1] and runs[5][1] <= status.plan_version, runs
    assert job.id not in job_ids(scheduler.address)


def test_scheduler_killed_mid_run_training_finishes_with_its_last_plan(scheduler, plain, tmp_path, caplog):
    model = encoder()
    optimizer = adam(model)
    plan = tensile.plan(model, optimizer, batches(1)[0], F.cross_entropy, workdir=tmp_path)  # tensilectl's plan
    caplog.set_level(logging.WARNING, logger="tensile.hook")
    step_s = []

    with tensile.apply(plan, model, optimizer, server=scheduler.address) as hook:
        session = hook.session

        def between(i):
            step_s.append(time.monotonic())
            if i == 0:
                assert session.wait_for_plan(60, other_than=(0, 0)) is not None
            if i == 2:
                scheduler.kill()

        hooked = train(model, optimizer, batches(), between)
        last = hook.plan_id

    assert_bit_identical(plain, hooked)
    assert last[0] > 0, "no scheduler plan was ever applied"
    assert all(s.plan_job == last[0] for s in hook.stats[3:]), "the plan changed after the scheduler died"
    assert max(b - a for a, b in zip(step_s[2:], step_s[3:])) < 5, "a step waited on the dead scheduler"
    lost = [r for r in caplog.records if "training goes on with the plan it has" in r.getMessage()]
    assert len(lost) == 1, [r.getMessage() for r in lost]  # said once, not at every retry


def test_unreachable_scheduler_training_goes_on(plain, tmp_path, caplog):
    model = encoder()
    optimizer = adam(model)
    plan = tensile.plan(model, optimizer, batches(1)[0], F.cross_entropy, workdir=tmp_path)
    caplog.set_level(logging.WARNING, logger="tensile.hook")
    started = time.monotonic()
    with tensile.apply(plan, model, optimizer, server=f"unix:{tmp_path / 'nobody.sock'}") as hook:
        hooked = train(model, optimizer, batches())
    assert time.monotonic() - started < 60
    assert_bit_identical(plain, hooked)
    assert all(s.plan_job == 0 for s in hook.stats)
    assert hook.session.reports_sent == 0
    assert any("nobody.sock" in r.getMessage() and "training goes on" in r.getMessage() for r in caplog.records)


def test_a_dropped_job_registers_again(scheduler, tmp_path, caplog):
    model = encoder()
    optimizer = adam(model)
    plan = tensile.plan(model, optimizer, batches(1)[0], F.cross_entropy, workdir=tmp_path)
    caplog.set_level(logging.WARNING, logger="tensile.hook")
    ids = []
    with tensile.apply(plan, model, optimizer, server=scheduler.address) as hook:
        session = hook.session

        def between(i):
            if i == 0:
                assert session.wait_for_plan(60, other_than=(0, 0)) is not None
                ids.append(session.job.id)
                with tensile.Client(scheduler.address) as other:
                    other.unregister(session.job)  # as when its lease lapses
            if i == 1:
                # Step 1's report meets NOT_FOUND; the session registers again.
                deadline = time.monotonic() + 60
                while (session.job is None or session.job.id == ids[0]) and time.monotonic() < deadline:
                    time.sleep(0.02)
                ids.append(session.job.id if session.job else None)

        train(model, optimizer, batches(4), between)
        assert ids[1] is not None and ids[1] != ids[0]
        assert job_ids(scheduler.address) == {ids[1]}
        with tensile.Client(scheduler.address) as client:
            (again,) = client.status(ids[1]).jobs
        assert again.latency_source == "measured"  # registered again with the last measured latencies
    assert any("no longer registered" in r.getMessage() for r in caplog.records)
    assert job_ids(scheduler.address) == set()


def test_the_job_is_unregistered_when_the_block_fails(scheduler, tmp_path):
    model = encoder()
    optimizer = adam(model)
    plan = tensile.plan(model, optimizer, batches(1)[0], F.cross_entropy, workdir=tmp_path)
    with pytest.raises(RuntimeError, match="the user's own error"):
        with tensile.apply(plan, model, optimizer, server=scheduler.address) as hook:
            train(model, optimizer, batches(2))
            deadline = time.monotonic() + 60
            while hook.session.job is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert job_ids(scheduler.address) == {hook.session.job.id}
            raise RuntimeError("the user's own error")
    assert job_ids(scheduler.address) == set()


def test_a_restarted_scheduler_gets_the_job_back(tmp_path, plain, caplog):
    """Killed after step 1 and started again on the same socket after step
    2: the session registers the job again (with the measured latencies)
    and the new scheduler's plan is applied at a step boundary, although
    the new job id and plan version may equal the old ones."""
    model = encoder()
    optimizer = adam(model)
    plan = tensile.plan(model, optimizer, batches(1)[0], F.cross_entropy, workdir=tmp_path / "plan")
    caplog.set_level(logging.INFO, logger="tensile.hook")
    folder = tmp_path / "sched"
    folder.mkdir()
    servers = [Scheduler(folder)]
    try:
        with tensile.apply(plan, model, optimizer, server=servers[0].address) as hook:
            session = hook.session

            def between(i):
                if i == 0:
                    assert session.wait_for_plan(60, other_than=(0, 0)) is not None
                if i == 1:
                    servers[0].kill()
                if i == 2:
                    servers[0].stop()
                    servers.append(Scheduler(folder))
                    pushed = session.wait_for_plan(60)
                    assert pushed is not None and pushed.registration == 2, (pushed, session.last_error)

            hooked = train(model, optimizer, batches(), between)
            with tensile.Client(servers[1].address) as client:
                (again,) = client.status().jobs
        assert again.latency_source == "measured"
        assert hook.stats[-1].plan_job == again.job_id
        assert_bit_identical(plain, hooked)
        assert any("reconnected" in r.getMessage() for r in caplog.records)
        assert job_ids(servers[1].address) == set()
    finally:
        for s in servers:
            s.stop()


def test_a_queued_job_waits_at_its_first_step_until_it_is_admitted(tmp_path, plain, caplog):
    """A budget no plan fits: the scheduler queues the job, and its first
    step waits (said with the scheduler's reason) instead of training on a
    plan the scheduler has not admitted. Once the budget is raised the job
    is admitted, trains on the scheduler's plan, bit-identical, and the
    queued job was never registered twice or left behind."""
    server = Scheduler(tmp_path, budget_mb=1)
    try:
        model = encoder()
        optimizer = adam(model)
        plan = tensile.plan(model, optimizer, batches(1)[0], F.cross_entropy, workdir=tmp_path / "plan")
        caplog.set_level(logging.WARNING, logger="tensile.hook")
        out: dict = {}

        def run() -> None:
            with tensile.apply(plan, model, optimizer, server=server.address) as hook:
                out["hook"] = hook
                out["params"] = train(model, optimizer, batches())

        worker = threading.Thread(target=run)
        worker.start()
        time.sleep(3.0)
        hook = out["hook"]
        assert worker.is_alive() and hook.stats == [], "a step ran before the scheduler admitted the job"
        assert hook.session.state == "JOB_STATE_QUEUED" and job_ids(server.address) == {hook.session.job.id}
        with tensile.Client(server.address) as admin:
            admin.set_budget(4096 * 10**6, admin_token=ADMIN)
        worker.join(timeout=120)
        assert not worker.is_alive()
        assert_bit_identical(plain, out["params"])
        assert all(s.plan_job == hook.session.received[0][0] for s in hook.stats), "a step ran on the plan given"
        said = [r.getMessage() for r in caplog.records]
        assert any("queued job" in m and "waits until it is admitted" in m for m in said), said
        assert any("admitted after" in m for m in said), said
        assert job_ids(server.address) == set()
    finally:
        server.stop()
