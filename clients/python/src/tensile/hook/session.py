"""The hook's side of the scheduler: register the traced graph as a job,
follow its plans, report every step, renew the lease, survive the
scheduler going away.

The semantics are the Rust worker's (``worker/src/session.rs``). The
training loop never waits on the network: a background thread owns the
connection. At each step boundary the loop hands the step's measurements to
it through a queue (:meth:`Session.iteration_done`, which returns at once)
and takes the newest plan if one has arrived since the last boundary.

* The job is registered with ``allow_recompute = false`` (the hook cannot
  recompute in eager mode) and, after a reconnection, with the last
  measured latencies.
* A plan stream per registration runs on its own thread; every plan pushed
  is checked against the graph (tensor and op ids in range, no
  recomputation) on arrival, and a plan that fails is refused with a
  warning, never applied.
* A report (or, between reports, a heartbeat every third of the lease)
  keeps the lease alive.
* When the scheduler is unreachable, vanishes, or no longer knows the job
  (its lease lapsed: ``NOT_FOUND``; ``PERMISSION_DENIED``), training goes
  on with the plan it runs; one warning per outage goes to the
  ``tensile.hook`` logger (and one when it is registered again), and the
  thread registers the job again with backoff, starting from the last
  measured latencies (a new job id, so plans are identified by job id and
  version; reports made while disconnected are not sent).
* :meth:`Session.finish` (leaving ``tensile.apply``, also on an error)
  unregisters the job and stops the thread, waiting at most a few seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

import grpc

from tensile.client import Client, Job, SchedulerError, plan_to_file
from tensile.planning import Plan
from tensile.v1 import tensile_pb2 as pb

__all__ = ["PushedPlan", "Session"]

log = logging.getLogger("tensile.hook")

#: Calls that are not worth repeating: the scheduler refuses the graph itself.
_FATAL = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNIMPLEMENTED)


@dataclasses.dataclass(frozen=True)
class PushedPlan:
    """A plan the scheduler pushed, as the hook applies it."""

    job_id: int
    version: int
    plan: Plan
    #: Which registration of this session pushed it (1, 2, ...): a restarted
    #: scheduler hands out job ids from 1 again, so (job id, version) alone
    #: could name two different plans.
    registration: int = 1

    @property
    def key(self) -> tuple[int, int]:
        return (self.registration, self.version)


@dataclasses.dataclass(frozen=True)
class _Lost:
    """A registration's plan stream ended (the scheduler went away)."""

    registration: int
    why: str


_DONE = object()
#: How a reason for a lost registration starts when the scheduler no longer has the job.
_GONE = "job"


class Session:
    """The connection of one ``tensile.apply`` block to a scheduler.

    ``server``: ``unix:PATH``, an absolute path, ``HOST:PORT``, or ``None``
    for the scheduler of ``device``'s GPU (``tensile.client.resolve_server``;
    a ``ResolveError`` at once when ``gpus.json`` serves no such GPU).
    ``call_timeout_s`` bounds every unary call made by the background
    thread; ``max_backoff_s`` the pause between reconnection attempts.
    """

    def __init__(
        self,
        graph: dict[str, Any],
        server: str | None,
        name: str = "",
        *,
        priority: int = 0,
        call_timeout_s: float = 5.0,
        max_backoff_s: float = 5.0,
        device: Any = None,
    ) -> None:
        self.graph = graph
        self.name = name or str(graph.get("name", ""))
        self.priority = priority
        self.max_backoff_s = max_backoff_s
        self.client = Client(server, timeout_s=call_timeout_s, device=device)
        self._queue: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self._newest: PushedPlan | None = None
        self._applied: tuple[int, int] | None = None  # PushedPlan.key
        self._registrations = 0
        self._job: Job | None = None
        self._state = pb.JOB_STATE_UNSPECIFIED
        self._outage = False
        self._last_measured: list[float] = []
        #: Reports the scheduler accepted, and plans it pushed that were refused.
        self.reports_sent = 0
        self.refused: list[str] = []
        #: (job id, version) of every plan received, in order.
        self.received: list[tuple[int, int]] = []
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="tensile-scheduler-session", daemon=True)
        self._thread.start()

    # -- the training loop's side (never blocks on the network) -----------

    @property
    def job(self) -> Job | None:
        """The current registration, if any."""
        with self._lock:
            return self._job

    @property
    def state(self) -> str:
        """The job's state as last heard (``JOB_STATE_ACTIVE`` ...)."""
        with self._lock:
            return pb.JobState.Name(self._state)

    def iteration_done(self, measurements: Mapping[str, Any]) -> PushedPlan | None:
        """Queues one step's report (``Applier.measurements``'s dict; one
        without a latency per op is not sent) and returns the plan to switch
        to, if a newer one than the one running has arrived."""
        if len(measurements.get("op_latency_s", ())) == len(self.graph["ops"]):
            self._queue.put(dict(measurements))
        with self._lock:
            newest = self._newest
            if newest is None or self._applied == newest.key:
                return None
            self._applied = newest.key
            return newest

    def wait_for_plan(self, timeout_s: float, *, other_than: tuple[int, int] | None = None) -> PushedPlan | None:
        """Blocks until the newest plan received is not ``other_than`` (a
        :attr:`PushedPlan.key`; default: the plan applied last; ``(0, 0)``:
        any plan), and returns it; for tools and tests that want to see a
        plan arrive (training never needs to). ``None`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                newest = self._newest
                unwanted = self._applied if other_than is None else other_than
                if newest is not None and newest.key != unwanted:
                    return newest
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)

    def finish(self, timeout_s: float = 5.0) -> None:
        """Unregisters the job (when connected) and stops the thread,
        waiting at most ``timeout_s``."""
        self._queue.put(_DONE)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("tensile: the scheduler session did not end within %.0f s; leaving it behind", timeout_s)
        else:
            self.client.close()

    # -- the background thread ---------------------------------------------

    def _warn_once(self, why: str, then: str) -> None:
        """One warning per outage (the first reason); the retries' reasons
        go to the debug log."""
        with self._lock:
            self.last_error = why
            first = not self._outage
            self._outage = True
        if first:
            log.warning("tensile: scheduler %s: %s; %s", self.client.target, why, then)
        else:
            log.debug("tensile: scheduler %s: %s", self.client.target, why)

    def _run(self) -> None:
        backoff = 0.1
        while True:
            before = self._registrations
            try:
                ended = self._registration()
            except Exception as e:  # noqa: BLE001 - the thread must never die silently
                ended = f"unexpected {type(e).__name__}: {e}"
            with self._lock:
                self._job = None
                self._state = pb.JOB_STATE_UNSPECIFIED
            if ended is None:
                return
            if ended.startswith("fatal: "):
                why = ended[len("fatal: ") :]
                self.last_error = why
                log.warning(
                    "tensile: scheduler %s: %s; training goes on with the plan it has, without the scheduler",
                    self.client.target,
                    why,
                )
                self._drain_until_done(None)
                return
            self._warn_once(ended, "training goes on with the plan it has, reconnecting")
            if self._registrations != before:
                backoff = 0.1  # the backoff starts over after a registration that succeeded
            if self._drain_until_done(backoff):
                return
            backoff = min(backoff * 2, self.max_backoff_s)

    def _drain_until_done(self, wait_s: float | None) -> bool:
        """Waits ``wait_s`` (forever: ``None``) keeping only the newest
        latencies of the reports queued meanwhile; True when the loop ended."""
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                return False
            if item is _DONE:
                return True
            if isinstance(item, dict):
                self._last_measured = list(item["op_latency_s"])

    def _registration(self) -> str | None:
        """One registration: register, subscribe, report and heartbeat until
        the scheduler is lost (the reason) or the loop ends (``None``)."""
        try:
            job = self.client.register(
                self.graph,
                name=self.name,
                priority=self.priority,
                allow_recompute=False,
                op_latency_s=self._last_measured,
            )
        except SchedulerError as e:
            prefix = "fatal: " if e.code in _FATAL else ""
            return f"{prefix}RegisterJob: {e.code.name}: {e.message}"
        with self._lock:
            self._job, self._state = job, job.state
            self._registrations += 1
            registration = self._registrations
            self.last_error = None
            back = self._outage
            self._outage = False
        log.log(
            logging.WARNING if back else logging.INFO,
            "tensile: %sregistered with scheduler %s as job %d (%s)",
            "reconnected: " if back else "",
            self.client.target,
            job.id,
            job.state_name,
        )
        if job.state == pb.JOB_STATE_QUEUED:
            log.warning(
                "tensile: scheduler %s: job %d is queued (%s); training goes on with the plan in use, "
                "which the scheduler has not admitted",
                self.client.target,
                job.id,
                job.reason or "it does not fit beside the other jobs yet",
            )
        stream = self.client.plan_stream(job)
        reader = threading.Thread(
            target=self._read, args=(job, registration, stream), name="tensile-plan-stream", daemon=True
        )
        reader.start()
        try:
            why = self._serve(job, registration)
        finally:
            stream.cancel()
        if why is not None and not why.startswith(_GONE):
            # Lost for another reason while the scheduler may still hold the
            # job: leave rather than linger (or wait in its queue) until the
            # lease lapses. Best effort: it is often unreachable.
            try:
                self.client.unregister(job)
            except SchedulerError:
                pass
        return why

    def _serve(self, job: Job, registration: int) -> str | None:
        interval = (job.lease_s if job.lease_s > 0 else 10.0) / 3
        next_beat = time.monotonic() + interval
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, next_beat - time.monotonic()))
            except queue.Empty:
                item = None
            try:
                if item is None:
                    self.client.heartbeat(job)
                elif item is _DONE:
                    self._unregister(job)
                    return None
                elif isinstance(item, _Lost):
                    if item.registration == registration:
                        return item.why
                    continue  # an earlier registration's stream
                else:
                    self._last_measured = list(item["op_latency_s"])
                    with self._lock:
                        if self._state == pb.JOB_STATE_QUEUED:
                            continue  # not admitted: no plan to report on (its latencies are kept)
                        newest = self._newest
                        version = newest.version if newest and newest.registration == registration else 0
                    self.client.report(
                        job,
                        iteration=int(item["iteration"]),
                        plan_version=version,
                        op_latency_s=self._last_measured,
                        stall_s=float(item.get("stall_s", 0.0)),
                        late_prefetches=[int(t) for t in item.get("late_prefetches", [])],
                        passive_swaps=int(item.get("passive_swaps", 0)),
                        peak_bytes=int(item.get("peak_bytes", 0)),
                    )
                    self.reports_sent += 1
            except SchedulerError as e:
                if e.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED):
                    return f"{_GONE} {job.id} is no longer registered ({e.method}: {e.code.name}: {e.message})"
                if e.method == "ReportLatencies" and e.code == grpc.StatusCode.FAILED_PRECONDITION:
                    log.debug("tensile: scheduler %s: report not taken: %s", self.client.target, e.message)
                    continue
                if e.method == "ReportLatencies" and e.code == grpc.StatusCode.INVALID_ARGUMENT:
                    log.warning("tensile: scheduler %s: report refused: %s", self.client.target, e.message)
                    continue
                return f"{e.method}: {e.code.name}: {e.message}"
            next_beat = time.monotonic() + interval

    def _unregister(self, job: Job) -> None:
        try:
            self.client.unregister(job)
            log.info("tensile: unregistered job %d", job.id)
        except SchedulerError as e:
            log.warning("tensile: scheduler %s: UnregisterJob %d: %s", self.client.target, job.id, e)

    def _read(self, job: Job, registration: int, stream: Any) -> None:
        """The plan stream's thread: stores every plan pushed."""
        try:
            for update in stream:
                self._take(job, registration, update)
            why = "the plan stream ended"
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED:
                return  # cancelled by _registration: it knows why
            why = f"plan stream: {e.code().name}: {e.details()}"
        self._queue.put(_Lost(registration, why))

    def _take(self, job: Job, registration: int, update: pb.PlanUpdate) -> None:
        with self._lock:
            was, self._state = self._state, update.state
        if update.state == pb.JOB_STATE_DONE:
            self._queue.put(_Lost(registration, f"{_GONE} {job.id} is no longer registered (the scheduler removed it)"))
            return
        if update.state == pb.JOB_STATE_QUEUED:
            if was == pb.JOB_STATE_QUEUED:
                return
            reason = "; ".join(d.message for d in update.diagnostics) or "it does not fit beside the other jobs yet"
            log.warning(
                "tensile: scheduler %s: job %d is queued (%s); training goes on with the plan in use, "
                "which the scheduler has not admitted",
                self.client.target,
                job.id,
                reason,
            )
            return
        if update.state != pb.JOB_STATE_ACTIVE or not update.HasField("plan"):
            return
        version = update.plan.version
        try:
            doc = plan_to_file(update.plan, self.graph, update.diagnostics)
        except ValueError as e:
            self._refuse(version, str(e))
            return
        recomputes = [e for e in doc["events"] if e["kind"] == "recompute"]
        if recomputes:
            self._refuse(version, f"it recomputes {recomputes[0]['tensor_name']!r}, which the hook cannot do")
            return
        plan = Plan(self.graph, doc)
        with self._lock:
            self._newest = PushedPlan(job.id, version, plan, registration)
            self.received.append((job.id, version))
        log.info("tensile: job %d: plan version %d received", job.id, version)

    def _refuse(self, version: int, why: str) -> None:
        message = f"plan version {version} refused: {why}"
        self.refused.append(message)
        log.warning("tensile: scheduler %s: %s; keeping the plan in use", self.client.target, message)
