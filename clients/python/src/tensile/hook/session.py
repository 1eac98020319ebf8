"""The hook's side of the scheduler: the Rust session (``session/``, the
one the worker runs) through ``tensile._core.Session``, with no protocol
logic here.

A background thread owns the connection; training never waits on it. At
each step boundary the loop hands the step's measurements to it
(:meth:`Session.iteration_done`, which returns at once) and takes the
newest plan if one has arrived since the last boundary. A plan that does
not fit the graph is refused, never applied. When the scheduler is
unreachable, vanishes or no longer knows the job, training goes on with the
plan it runs while the session registers again with backoff. The session's messages go to the
``tensile.hook`` logger: one warning per outage, one when the job is
registered again, one when it is queued.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from tensile import _core
from tensile.client import Job, device_ordinal
from tensile.planning import Plan

__all__ = ["PushedPlan", "Session"]

log = logging.getLogger("tensile.hook")

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


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
        self._core = _core.Session(
            graph,
            None if server is None else str(server),
            self.name,
            priority=priority,
            device_ordinal=device_ordinal(device),
            call_timeout_s=call_timeout_s,
            max_backoff_s=max_backoff_s,
        )

    def _said(self) -> dict[str, Any]:
        """Hands the session's messages to the logger; its status."""
        for level, message in self._core.take_log():
            log.log(_LEVELS[level], "tensile: scheduler: %s", message)
        return self._core.status()

    def _pushed(self, got: tuple[int, int, int, dict[str, Any]] | None) -> PushedPlan | None:
        self._said()
        if got is None:
            return None
        job_id, registration, version, doc = got
        return PushedPlan(job_id, version, Plan(self.graph, doc), registration)

    @property
    def job(self) -> Job | None:
        """The current registration, if any."""
        job = self._said()["job"]
        if job is None:
            return None
        return Job(id=job["id"], token=job["token"], state=job["state"], reason=job["reason"], lease_s=job["lease_s"])

    @property
    def state(self) -> str:
        """The job's state as last heard (``JOB_STATE_ACTIVE`` ...)."""
        return self._said()["state"]

    @property
    def reports_sent(self) -> int:
        """Reports the scheduler accepted."""
        return self._said()["reports_sent"]

    @property
    def received(self) -> list[tuple[int, int]]:
        """(job id, version) of every plan received, in order."""
        return [tuple(k) for k in self._said()["received"]]

    @property
    def refused(self) -> list[str]:
        """Why each plan the scheduler pushed was refused."""
        return self._said()["refused"]

    @property
    def last_error(self) -> str | None:
        """The last connection or call error; ``None`` once registered again."""
        return self._said()["last_error"]

    def iteration_done(self, measurements: Mapping[str, Any]) -> PushedPlan | None:
        """Queues one step's report (``Applier.measurements``'s dict; one
        without a latency per op is not sent) and returns the plan to switch
        to, if a newer one than the one running has arrived."""
        return self._pushed(self._core.iteration_done(measurements))

    def take_plan(self) -> PushedPlan | None:
        """The plan to switch to, if a newer one than the one running has
        arrived (marked as running from now), without a report: what a first
        step that waited for its job's admission takes."""
        return self._pushed(self._core.take_plan())

    def wait_for_plan(self, timeout_s: float, *, other_than: tuple[int, int] | None = None) -> PushedPlan | None:
        """Blocks until the newest plan received is not ``other_than`` (a
        :attr:`PushedPlan.key`; default: the plan applied last; ``(0, 0)``:
        any plan), and returns it; for tools and tests that want to see a
        plan arrive (training never needs to). ``None`` after ``timeout_s``."""
        return self._pushed(self._core.wait_for_plan(timeout_s, other_than))

    def finish(self, timeout_s: float = 5.0) -> None:
        """Unregisters the job (when connected) and stops the thread,
        waiting at most ``timeout_s``."""
        self._core.finish(timeout_s)
        self._said()
