"""The session semantics, one suite for the one implementation
(``session/``, the ``tensile-session`` crate) through both of its drivers:
the ``tensile-worker`` binary and the Python binding the hook uses
(``tensile.hook.session.Session`` over ``tensile._core.Session``), each
against the same scripted scheduler: a grpcio server on a Unix socket whose
answers each scenario scripts, and which logs every call it gets.

Scenarios: a registration refused as INVALID_ARGUMENT (given up, never
retried); reports refused as FAILED_PRECONDITION (skipped: no new
registration, one unregistration at the end); a report failing with
UNAVAILABLE (the registration is lost: the client leaves, then registers
again); a report answered NOT_FOUND by a scheduler that restarted and
numbers jobs from 1 again, as after a lapsed lease (the client registers
again without leaving, and switches to the new registration's plan
although its job id and version are those of the plan it runs); a job
queued, then admitted (no report before admission); a plan naming a
tensor the graph does not have (refused, never applied); the measured base
(``base_bytes``: 0 until measured, and on the CPU; then the figure the
process measured)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any, Callable

import grpc
import pytest
import torch

from tensile.hook.session import Session
from tensile.trace import InputSpec, trace_training_step
from tensile.v1 import tensile_pb2 as pb
from tensile.v1 import tensile_pb2_grpc as rpc

ROOT = Path(__file__).resolve().parents[2]
WORKER = os.environ.get("TENSILE_WORKER", str(ROOT / "target" / "debug" / "tensile-worker"))

Code = grpc.StatusCode
#: (registration, report number within it) -> the code to fail it with, or None.
ReportScript = Callable[[int, int], "grpc.StatusCode | None"]


class Scripted(rpc.MemorySchedulerServicer):
    """A scheduler whose answers are scripted: RegisterJob fails with the
    codes of ``register`` in turn (then succeeds); a successful
    registration r (1, 2, ...) gets job id r, or 1 every time with
    ``same_ids`` (a restarted scheduler), its plan (version 1, no events)
    on its stream, and its reports fail as ``report`` says. Every call is
    logged as (method, registration or code)."""

    def __init__(self, register: list[Code] | None = None, report: ReportScript | None = None, same_ids: bool = False,
                 queued_s: float = 0.0, then: pb.Plan | None = None):
        self.register_codes = list(register or [])
        self.report = report or (lambda r, n: None)
        self.same_ids = same_ids
        #: The first registration waits queued this long before its plan.
        self.queued_s = queued_s
        self.admitted_at: float | None = None
        #: A second plan pushed 1 s after the first (version 2).
        self.then = then
        self.lock = threading.Lock()
        self.calls: list[tuple[str, Any]] = []
        self.registrations = 0
        self.reports: dict[int, int] = {}
        self.report_times: list[float] = []
        #: The base_bytes of every report taken, in order.
        self.bases: list[int] = []

    def log(self, method: str, what: Any) -> None:
        with self.lock:
            self.calls.append((method, what))

    def of(self, method: str) -> list[Any]:
        with self.lock:
            return [w for m, w in self.calls if m == method]

    @staticmethod
    def registration(token: str) -> int:
        return int(token.removeprefix("tok"))

    def RegisterJob(self, request, context):  # noqa: N802 - the gRPC method's name
        with self.lock:
            code = self.register_codes.pop(0) if self.register_codes else None
            if code is None:
                self.registrations += 1
                r = self.registrations
        if code is not None:
            self.log("RegisterJob", code.name)
            context.abort(code, f"scripted {code.name}")
        self.log("RegisterJob", r)
        queued = r == 1 and self.queued_s > 0
        return pb.RegisterJobResponse(
            job_id=1 if self.same_ids else r,
            token=f"tok{r}",
            state=pb.JOB_STATE_QUEUED if queued else pb.JOB_STATE_ACTIVE,
            lease_s=10.0,
        )

    def SubscribePlans(self, request, context):  # noqa: N802
        r = self.registration(request.token)
        self.log("SubscribePlans", r)
        if r == 1 and self.queued_s > 0:
            yield pb.PlanUpdate(state=pb.JOB_STATE_QUEUED)
            time.sleep(self.queued_s)
            self.admitted_at = time.monotonic()
        yield pb.PlanUpdate(state=pb.JOB_STATE_ACTIVE, plan=pb.Plan(job_id=request.job_id, version=1))
        if self.then is not None:
            time.sleep(1.0)
            yield pb.PlanUpdate(state=pb.JOB_STATE_ACTIVE, plan=self.then)
        while context.is_active():
            time.sleep(0.05)

    def ReportLatencies(self, request, context):  # noqa: N802
        r = self.registration(request.token)
        with self.lock:
            n = self.reports.get(r, 0)
            self.reports[r] = n + 1
        code = self.report(r, n)
        self.log("ReportLatencies", (r, code.name if code else "OK"))
        with self.lock:
            self.report_times.append(time.monotonic())
            if code is None:
                self.bases.append(request.base_bytes)
        if code is not None:
            context.abort(code, f"scripted {code.name}")
        return pb.ReportLatenciesResponse(plan_version=1)

    def Heartbeat(self, request, context):  # noqa: N802
        self.log("Heartbeat", self.registration(request.token))
        return pb.HeartbeatResponse(state=pb.JOB_STATE_ACTIVE, plan_version=1, lease_s=10.0)

    def UnregisterJob(self, request, context):  # noqa: N802
        self.log("UnregisterJob", self.registration(request.token))
        return pb.UnregisterJobResponse()


def serve(tmp_path: Path, script: Scripted) -> tuple[grpc.Server, str]:
    sock = tmp_path / "scripted.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    rpc.add_MemorySchedulerServicer_to_server(script, server)
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    return server, f"unix:{sock}"


@pytest.fixture(scope="module")
def graph() -> dict[str, Any]:
    def model():
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    return trace_training_step(model, torch.optim.Adam, [InputSpec("input", (8, 16))], name="mlp")


class Outcome:
    """What a client did: whether it ended well, its log, and which plans
    (registration, version) its training loop switched to."""

    def __init__(self, ok: bool, log: str, switched: list[tuple[int, int]]):
        self.ok, self.log, self.switched = ok, log, switched


def run_worker(address: str, tmp_path: Path, iterations: int) -> Outcome:
    if not Path(WORKER).exists():
        pytest.fail(f"{WORKER} is missing: cargo build -p tensile-worker (or set TENSILE_WORKER)")
    cmd = [WORKER, "--scheduler", address, "--model", "resnet50", "--batch", "2", "--resolution", "32",
           "--iterations", str(iterations), "--threads", "1", "--link-gbps", "2", "--plan-timeout-s", "30"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    switched = [(0, 1)] * done.stderr.count("from the next iteration")
    return Outcome(done.returncode == 0, done.stderr, switched)


def run_hook_session(address: str, graph: dict[str, Any], iterations: int,
                     base: Callable[[int], int | None] | None = None) -> Outcome:
    """The hook's session for ``iterations`` steps; ``base(i)``, when given,
    is step i's ``base_bytes`` (``None``: not measured)."""
    s = Session(graph, address, "conformance", max_backoff_s=0.2)
    ops = len(graph["ops"])
    switched = []
    first = s.wait_for_plan(10.0, other_than=(0, 0))
    for i in range(iterations):
        measurements = {"iteration": i, "op_latency_s": [1e-3] * ops, "stall_s": 0.0,
                        "late_prefetches": [], "passive_swaps": 0, "peak_bytes": 1}
        if base is not None:
            measurements["base_bytes"] = base(i)
        got = s.iteration_done(measurements)
        if got is not None and got.key != (first.key if first else None):
            switched.append(got.key)
        time.sleep(0.15)
    s.finish(5.0)
    return Outcome(s.last_error is None, s.last_error or "", switched)


CLIENTS = ["worker", "hook"]


def run(client: str, address: str, tmp_path: Path, graph: dict[str, Any], iterations: int = 12) -> Outcome:
    if client == "worker":
        return run_worker(address, tmp_path, iterations)
    return run_hook_session(address, graph, iterations)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_registration_refused_as_invalid_is_given_up_not_retried(client, tmp_path, graph):
    script = Scripted(register=[Code.INVALID_ARGUMENT])
    server, address = serve(tmp_path, script)
    try:
        if client == "worker":
            out = run_worker(address, tmp_path, 3)
            assert not out.ok and "refused the job" in out.log and "INVALID_ARGUMENT" in out.log.upper(), out.log
        else:
            s = Session(graph, address, "conformance", max_backoff_s=0.2)
            time.sleep(1.0)  # several backoffs, had it retried
            assert s.last_error and "INVALID_ARGUMENT" in s.last_error, s.last_error
            s.finish(5.0)
        assert script.of("RegisterJob") == ["INVALID_ARGUMENT"], script.calls
    finally:
        server.stop(0)


@pytest.mark.parametrize("client", CLIENTS)
def test_reports_refused_as_a_precondition_are_skipped(client, tmp_path, graph):
    script = Scripted(report=lambda r, n: Code.FAILED_PRECONDITION)
    server, address = serve(tmp_path, script)
    try:
        out = run(client, address, tmp_path, graph)
        assert out.ok, out.log
        assert script.of("RegisterJob") == [1], script.calls
        assert len(script.of("ReportLatencies")) >= 3, script.calls
        assert script.of("UnregisterJob") == [1], script.calls
    finally:
        server.stop(0)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_lost_registration_leaves_before_registering_again(client, tmp_path, graph):
    script = Scripted(report=lambda r, n: Code.UNAVAILABLE if (r, n) == (1, 0) else None)
    server, address = serve(tmp_path, script)
    try:
        out = run(client, address, tmp_path, graph)
        assert out.ok, out.log
        calls = [c for c in script.calls if c[0] in ("RegisterJob", "UnregisterJob")]
        assert calls[:3] == [("RegisterJob", 1), ("UnregisterJob", 1), ("RegisterJob", 2)], script.calls
        assert script.of("UnregisterJob") == [1, 2], script.calls
    finally:
        server.stop(0)


@pytest.mark.parametrize("client", CLIENTS)
def test_after_a_restart_the_new_registrations_plan_is_taken_though_its_ids_are_the_same(client, tmp_path, graph):
    script = Scripted(report=lambda r, n: Code.NOT_FOUND if (r, n) == (1, 0) else None, same_ids=True)
    server, address = serve(tmp_path, script)
    try:
        out = run(client, address, tmp_path, graph)
        assert out.ok, out.log
        assert script.of("RegisterJob") == [1, 2], script.calls
        # Gone: nothing to leave before registering again.
        assert script.of("UnregisterJob") == [2], script.calls
        assert len(out.switched) == 1, f"switched to {out.switched}: {out.log}"
        if client == "hook":
            assert out.switched == [(2, 1)]
    finally:
        server.stop(0)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_queued_job_reports_nothing_until_admitted(client, tmp_path, graph):
    script = Scripted(queued_s=1.5)
    server, address = serve(tmp_path, script)
    try:
        out = run(client, address, tmp_path, graph)
        assert out.ok, out.log
        assert script.admitted_at is not None
        assert script.report_times, "no report after admission"
        assert min(script.report_times) >= script.admitted_at, "a report while queued"
        assert script.of("RegisterJob") == [1], script.calls
    finally:
        server.stop(0)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_plan_for_another_graph_is_refused_and_never_applied(client, tmp_path, graph):
    alien = pb.Plan(version=2, events=[pb.PlanEvent(tensor=1_000_000, kind=pb.EVENT_KIND_RELEASE,
                                                      trigger=pb.TRIGGER_KIND_AFTER, trigger_op=0)])
    script = Scripted(then=alien)
    server, address = serve(tmp_path, script)
    try:
        out = run(client, address, tmp_path, graph, iterations=14)
        assert out.ok, out.log
        assert out.switched == [], f"switched to {out.switched}: {out.log}"
        if client == "worker":
            assert "plan version 2 refused" in out.log, out.log
        assert script.of("RegisterJob") == [1], script.calls
    finally:
        server.stop(0)


@pytest.mark.parametrize("client", CLIENTS)
def test_the_measured_base_goes_with_the_reports_and_zero_means_not_measured(client, tmp_path, graph):
    script = Scripted()
    server, address = serve(tmp_path, script)
    measured = 912_000_000
    try:
        if client == "worker":
            # On the CPU the worker measures no base: every report says 0.
            out = run_worker(address, tmp_path, 6)
        else:
            # Not measured (None) for the first three steps, as the worker
            # does, then the figure measured.
            out = run_hook_session(address, graph, 6, base=lambda i: None if i < 3 else measured)
        assert out.ok, out.log
        assert len(script.bases) >= 4, script.calls
        if client == "worker":
            assert set(script.bases) == {0}, script.bases
        else:
            first = script.bases.index(measured)
            assert first >= 1 and set(script.bases[:first]) == {0}, script.bases
            assert set(script.bases[first:]) == {measured}, script.bases
    finally:
        server.stop(0)
