"""Per-op latencies on CUDA, from timing events around each op's call.

On the CPU an op's call is its run, and the hook times the call. On CUDA the
call only queues kernels, so :class:`CudaOpTimer` records a timing event on
the current stream before and after the call and reads the elapsed times at
the step's end, after one synchronize (never one per op): an op's latency
is the time its stream took from the first event to the second, which
includes the launch when the stream was idle waiting for the host. Events
are pooled and reused from step to step.

The event class and the synchronize are parameters so that the bookkeeping
can be tested without a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch


class TimingEvent(Protocol):
    """What the timer needs of ``torch.cuda.Event(enable_timing=True)``."""

    def record(self, stream: Any = None) -> None: ...

    def elapsed_time(self, end_event: Any) -> float: ...


class Timed:
    """The two events around one op's call."""

    __slots__ = ("start", "end")

    def __init__(self, start: TimingEvent, end: TimingEvent) -> None:
        self.start, self.end = start, end


class CudaOpTimer:
    """Times graph ops on a CUDA device with event pairs, resolved per step."""

    def __init__(
        self,
        device: torch.device,
        new_event: Callable[[], TimingEvent] | None = None,
        synchronize: Callable[[], None] | None = None,
        stream: Callable[[], Any] | None = None,
    ) -> None:
        self.device = device
        self._new_event = new_event or (lambda: torch.cuda.Event(enable_timing=True))
        self._synchronize = synchronize or (lambda: torch.cuda.synchronize(device))
        self._stream = stream or (lambda: torch.cuda.current_stream(device))
        self._free: list[TimingEvent] = []
        self._kept: list[tuple[int, Timed]] = []
        #: Events made so far (the pool's size): constant after the first step.
        self.events_made = 0
        #: Synchronizes done so far: one per step that timed an op.
        self.syncs = 0

    def _event(self) -> TimingEvent:
        if self._free:
            return self._free.pop()
        self.events_made += 1
        return self._new_event()

    def begin(self) -> Timed:
        """Before an op's call: its start event, recorded on the current stream."""
        start = self._event()
        start.record(self._stream())
        return Timed(start, start)

    def end(self, timed: Timed) -> None:
        """After the call: its end event, recorded on the current stream."""
        timed.end = self._event()
        timed.end.record(self._stream())

    def keep(self, k: int, timed: Timed) -> None:
        """The call was graph op ``k``: its latency is read at the step's end."""
        self._kept.append((k, timed))

    def drop(self, timed: Timed | None) -> None:
        """The call was not a graph op: its events go back to the pool."""
        if timed is None:
            return
        self._free.append(timed.start)
        if timed.end is not timed.start:
            self._free.append(timed.end)

    def resolve(self) -> dict[int, int]:
        """At the step's end: every kept op's latency in ns, by op index,
        after one synchronize; the events go back to the pool."""
        if not self._kept:
            return {}
        self._synchronize()
        self.syncs += 1
        out: dict[int, int] = {}
        for k, timed in self._kept:
            ms = timed.start.elapsed_time(timed.end)
            out[k] = max(0, round(ms * 1e6)) if math.isfinite(ms) else 0
            self.drop(timed)
        self._kept = []
        return out

    def clear(self) -> None:
        """Forgets the ops kept in an iteration that did not finish (a
        refused plan): their events go back to the pool unread."""
        for _, timed in self._kept:
            self.drop(timed)
        self._kept = []
