"""`tensile.Client` against the real `tensile-scheduler` binary on a Unix
socket in a temporary folder: register a traced graph, receive its plan,
report latencies, receive the re-plan; wrong tokens, unknown jobs and bad
reports raise SchedulerError with the scheduler's status code."""

import json
import os
import subprocess
import time
from pathlib import Path

import grpc
import pytest
import torch

import tensile
from tensile import client as tc
from tensile.trace import InputSpec, trace_training_step
from tensile.v1 import tensile_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER = os.environ.get("TENSILE_SCHEDULER", str(ROOT / "target" / "debug" / "tensile-scheduler"))
ADMIN = "s3cret-admin-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sched")
    sock = folder / "scheduler.sock"
    token_file = folder / "admin.token"
    token_file.write_text(ADMIN + "\n")
    token_file.chmod(0o600)
    log = open(folder / "scheduler.log", "w")
    proc = subprocess.Popen(
        [SCHEDULER, "--listen", f"unix:{sock}", "--state", str(folder / "state"), "--admin-token-file", str(token_file), "--budget-mb", "4096"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"tensile-scheduler did not start: {(folder / 'scheduler.log').read_text()}")
        time.sleep(0.05)
    yield f"unix:{sock}"
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("tensile-scheduler did not stop within 15 s of SIGTERM")
    log.close()


@pytest.fixture(scope="module")
def graph():
    def model():
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

    return trace_training_step(model, torch.optim.Adam, [InputSpec("input", (16, 64))], name="mlp")


def test_register_plan_report_replan(server, graph):
    with tensile.Client(server) as client:
        job = client.register(graph, name="live-mlp")
        assert job.id > 0 and len(job.token) >= 16
        stream = client.plans(job, timeout_s=60)
        first = next(stream)
        while first.state != pb.JOB_STATE_ACTIVE:  # PLANNING first, then the plan
            first = next(stream)
        assert first.plan.version >= 1 and first.plan.job_id == job.id
        plan_file = tc.plan_to_file(first.plan, graph, first.diagnostics)
        assert plan_file["graph"] == "mlp" and plan_file["version"] == first.plan.version

        status = client.status(job.id)
        (mine,) = [j for j in status.jobs if j.job_id == job.id]
        assert mine.name == "live-mlp" and mine.plan_version == first.plan.version and mine.ops == len(graph["ops"])

        # Measured latencies far from the cold start's: a re-plan, pushed on the stream.
        planned = client.plan_graph(graph).op_latency_s
        assert len(planned) == len(graph["ops"])
        answer = client.report(job, iteration=0, plan_version=first.plan.version, op_latency_s=[3 * t + 1e-5 for t in planned], peak_bytes=12345)
        assert answer.change_rate > 0.5
        later = next(stream)
        while later.state != pb.JOB_STATE_ACTIVE or later.plan.version <= first.plan.version:
            later = next(stream)
        assert later.plan.version > first.plan.version
        assert client.status(job.id).jobs[0].iterations_reported == 1
        # The job's base: the profile's until a report measures one far
        # from it, which the scheduler then plans with.
        (mine,) = client.status(job.id).jobs
        assert (mine.base_source, mine.reported_base_bytes) == ("profile", 0) and mine.base_bytes > 0
        measured = mine.base_bytes + 10**9
        answer = client.report(job, iteration=1, plan_version=later.plan.version,
                               op_latency_s=[3 * t + 1e-5 for t in planned], base_bytes=measured)
        assert answer.replanned
        (mine,) = client.status(job.id).jobs
        assert (mine.base_bytes, mine.base_source, mine.reported_base_bytes) == (measured, "measured", measured)
        client.unregister(job)
        with pytest.raises(tensile.SchedulerError) as gone:
            client.heartbeat(job)
        assert gone.value.code == grpc.StatusCode.NOT_FOUND


def test_bad_calls_raise_with_their_status(server, graph):
    with tensile.Client(server) as client:
        job = client.register(graph)
        wrong = tc.Job(id=job.id, token="0" * len(job.token), state=job.state)
        with pytest.raises(tensile.SchedulerError) as e:
            client.report(wrong, 0, 1, [1e-4] * len(graph["ops"]))
        assert e.value.code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
        assert e.value.method == "ReportLatencies"

        with pytest.raises(tensile.SchedulerError) as e:
            client.heartbeat(tc.Job(id=987654321, token=job.token, state=0))
        assert e.value.code == grpc.StatusCode.NOT_FOUND

        with pytest.raises(tensile.SchedulerError) as e:
            client.report(job, 0, 1, [1e-4] * (len(graph["ops"]) - 1))
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and str(len(graph["ops"])) in e.value.message

        with pytest.raises(tensile.SchedulerError) as e:
            client.report(job, 0, 1, [float("nan")] * len(graph["ops"]))
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT

        # A measured base past the device's memory is no measurement.
        with pytest.raises(tensile.SchedulerError) as e:
            client.report(job, 0, 1, [1e-4] * len(graph["ops"]), base_bytes=2**64 - 1)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "base_bytes" in e.value.message

        with pytest.raises(tensile.SchedulerError) as e:
            client.set_budget(1 << 30, admin_token="not-the-token")
        assert e.value.code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
        assert client.set_budget(3 << 30, admin_token=ADMIN).budget_bytes == 3 << 30

        broken = json.loads(json.dumps(graph))
        broken["ops"][1]["inputs"] = [len(broken["tensors"]) + 5]
        with pytest.raises(tensile.SchedulerError) as e:
            client.register(broken)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and broken["ops"][1]["name"] in e.value.message
        client.unregister(job)


def test_no_scheduler_is_a_clear_error(tmp_path):
    with tensile.Client(f"unix:{tmp_path / 'nobody.sock'}", timeout_s=2) as client:
        with pytest.raises(tensile.SchedulerError) as e:
            client.status()
    assert e.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_a_plan_from_the_scheduler_applies_bit_identically(server, tmp_path):
    """`tensile.plan(..., server=...)`: the scheduler's PlanGraph plans the
    user's model (recomputation off), and `tensile.apply` runs it: three
    Adam steps give the same parameters as plain training."""
    torch.set_num_threads(1)

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(3)]

    def train(model, plan=None):
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        hook = tensile.apply(plan, model, optimizer) if plan is not None else None
        if hook is not None:
            hook.__enter__()
        try:
            for x, y in data:
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
        finally:
            if hook is not None:
                hook.__exit__(None, None, None)
        return [p.detach().clone() for p in model.parameters()]

    plain = train(make())
    model = make()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    plan = tensile.plan(model, optimizer, data[0], torch.nn.functional.cross_entropy, server=server, workdir=tmp_path)
    assert plan.events, "the scheduler's plan has no events: nothing would be tested"
    assert not [e for e in plan.events if e["kind"] == "recompute"]
    hooked = train(model, plan)
    assert all(torch.equal(a, b) for a, b in zip(plain, hooked))


def test_a_client_finds_its_gpus_scheduler_through_gpus_json(tmp_path, graph, monkeypatch):
    """One scheduler serving two (simulated: nvidia-smi out of reach) GPUs;
    clients with no address go to their GPU's socket."""
    log = open(tmp_path / "scheduler.log", "w")
    proc = subprocess.Popen(
        [SCHEDULER, "--gpus", "0,1", "--socket-dir", str(tmp_path), "--state", "none", "--latency-models", "roofline", "--budget-mb", "3000"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PATH": "/nonexistent"},
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "gpus.json").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"tensile-scheduler did not start: {(tmp_path / 'scheduler.log').read_text()}")
            time.sleep(0.05)
        assert [g["uuid"] for g in tc.read_gpus_file(tmp_path)["gpus"]] == ["sim-0", "sim-1"]
        monkeypatch.setenv("TENSILE_SOCKET_DIR", str(tmp_path))
        monkeypatch.delenv("TENSILE_SERVER", raising=False)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
        with tensile.Client() as client:
            assert client.target == f"unix:{tmp_path}/gpu1.sock"
            job = client.register(graph, name="on-gpu1")
            assert [j.name for j in client.status().jobs] == ["on-gpu1"]
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
        with tensile.Client(device="cuda:0") as gpu0:
            assert gpu0.status().jobs == [] and gpu0.status().memory.budget_bytes == 3_000_000_000
        with tensile.Client(device=1) as gpu1:
            gpu1.unregister(job)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()
    assert proc.returncode == 0
    assert not (tmp_path / "gpus.json").exists()
