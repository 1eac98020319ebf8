"""The hook's clock: the points of a step where Python runs anyway, and the
plan's events placed on them.

Outside the steps it checks op by op, the hook runs no Python per op. It
runs only at *points*: the iteration's start (the model's forward
pre-hook), each tensor autograd saves (pack) and each one it takes back
(unpack), the forward pre-hook of each module that holds a parameter or a
buffer, one point per chunk of the optimizer's update, and the step's end.
A checked step (:mod:`tensile.hook.runtime`) records these points with the
*clock* at each, the count of the graph's ops done when it was reached, and
:func:`place` puts every event of the plan on the first point at or after
its due op. A prefetch that would land at or after the point that needs its
storage (an unpack, a module's pre-hook, an optimizer chunk) moves to the
last point of an earlier op, so it is issued before the storage is needed,
as the planner meant; the same holds for a recomputation.

Pure data: no torch. The record's keys (a saved tensor's shape and dtype,
the fingerprint a later step is checked against) are whatever the runtime
puts there.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from tensile.hook.schedule import Event

START, PACK, UNPACK, MODULE, CHUNK, END = range(6)
KIND_NAMES = ("start", "pack", "unpack", "module", "chunk", "end")

#: No storage at this point (``Record.storages``).
NONE = -1


@dataclasses.dataclass
class Record:
    """The points of one step, in the order they were reached."""

    #: ``START``, ``PACK``...
    kinds: list[int] = dataclasses.field(default_factory=list)
    #: Graph ops done when the point was reached.
    clocks: list[int] = dataclasses.field(default_factory=list)
    #: ``PACK``: the planned storage saved there; ``UNPACK``: the planned
    #: storage the handle holds; ``NONE`` elsewhere or when unplanned.
    storages: list[int] = dataclasses.field(default_factory=list)
    #: ``PACK``: the saved tensor's fingerprint; ``UNPACK``: the point of
    #: the pack it takes back; ``MODULE``: the module's index; ``CHUNK``:
    #: the chunk's index.
    keys: list[Any] = dataclasses.field(default_factory=list)
    #: Storages that must be on the device when the point is reached.
    needs: list[tuple[int, ...]] = dataclasses.field(default_factory=list)

    def add(self, kind: int, clock: int, storage: int = NONE, key: Any = None, needs: tuple[int, ...] = ()) -> int:
        self.kinds.append(kind)
        self.clocks.append(clock)
        self.storages.append(storage)
        self.keys.append(key)
        self.needs.append(needs)
        return len(self.kinds) - 1

    def __len__(self) -> int:
        return len(self.kinds)

    def count(self, kind: int) -> int:
        return self.kinds.count(kind)

    def ended(self, chunks: Sequence[tuple[int, tuple[int, ...]]], n_ops: int) -> Record:
        """This record (a checked step's, up to the optimizer) with the
        optimizer's chunk points and the end: ``chunks`` is each chunk's
        first op and the storages it needs."""
        out = dataclasses.replace(
            self,
            kinds=list(self.kinds),
            clocks=list(self.clocks),
            storages=list(self.storages),
            keys=list(self.keys),
            needs=list(self.needs),
        )
        for i, (first_op, needs) in enumerate(chunks):
            out.add(CHUNK, first_op, key=i, needs=needs)
        out.add(END, n_ops)
        return out


def place(events: Iterable[Event], rec: Record, *, skip: set[int] | None = None, out_at_start: Iterable[int] = ()) -> list[list[Event]]:
    """The events to fire at each point of ``rec`` (a list per point).

    A swap-out or a release fires at the first point whose clock is at
    least its due count (never before its op has run; the last point, the
    end, when none is). A ``swap_in`` or ``recompute`` of a storage that
    left (by its swap-out or release, or at the start for the storages in
    ``out_at_start``, which begin the step on the host) fires at the last
    point reached by its due op (never later than planned) and after it
    left; if that is at or after the first point needing the storage since
    it left, at the last point before that one with an earlier clock (an
    earlier op), and at the needing point itself when there is none after
    it left.
    Events of storages in ``skip`` are left out. At one point, events keep
    their due order, then the plan's."""
    n = len(rec)
    if n == 0:
        return []
    # Clocks as reached, made non-decreasing (a point never moves the clock back).
    clocks: list[int] = []
    top = 0
    for c in rec.clocks:
        top = max(top, c)
        clocks.append(top)
    need_points: dict[int, list[int]] = {}
    for p in range(n):
        for s in rec.needs[p]:
            need_points.setdefault(s, []).append(p)
        if rec.kinds[p] == UNPACK and rec.storages[p] != NONE:
            need_points.setdefault(rec.storages[p], []).append(p)
    for pts in need_points.values():
        pts.sort()
    gone_at: dict[int, int] = {s: -1 for s in out_at_start}
    fire: list[list[Event]] = [[] for _ in range(n)]
    for ev in sorted(events, key=lambda e: (e.due, e.order)):
        if skip is not None and ev.storage in skip:
            continue
        p = min(bisect.bisect_left(clocks, ev.due), n - 1)
        if ev.kind in ("swap_out", "release"):
            gone_at[ev.storage] = p
        elif ev.kind in ("swap_in", "recompute") and ev.storage in gone_at:
            left = gone_at.pop(ev.storage)
            # Never later than planned: the last point reached by its due
            # op (the planner gave the copy its lead from there), though
            # after the storage left.
            p = max(bisect.bisect_right(clocks, ev.due) - 1, left + 1, 0)
            p = min(p, n - 1)
            pts = need_points.get(ev.storage, [])
            i = bisect.bisect_right(pts, left)
            if i < len(pts) and p >= pts[i]:
                need = pts[i]
                p = need
                q = need - 1
                while q > left and clocks[q] >= clocks[need]:
                    q -= 1
                if q > left:
                    p = q
        fire[p].append(ev)
    for evs in fire:
        if len(evs) > 1:
            evs.sort(key=lambda e: (e.due, e.order))
    return fire


def chunks_of(spans: Sequence[tuple[int, int, int]], moved: Sequence[int], max_chunks: int) -> list[tuple[int, int]]:
    """Consecutive parameters of the optimizer's update grouped into chunks.

    ``spans`` is, per parameter in update order, ``(group, first op, last
    op)``; ``moved`` the bytes the plan moves for that parameter's update
    (its parameter and state). A chunk never spans two parameter groups;
    within a group, parameters join the current chunk while its moved bytes
    stay within an equal share of the total (``max_chunks`` chunks' worth;
    a parameter moving more is a chunk of its own), so the host makes a
    bounded number of update calls whatever the model.
    Returns each chunk as ``(first parameter, end parameter)``."""
    total = sum(moved)
    if not spans:
        return []
    limit = -(-total // max(1, max_chunks))  # a parameter over it is a chunk of its own
    out: list[tuple[int, int]] = []
    start, acc = 0, 0
    for i, (group, _, _) in enumerate(spans):
        if i > start and (group != spans[start][0] or (total > 0 and acc + moved[i] > limit)):
            out.append((start, i))
            start, acc = i, 0
        acc += moved[i]
    out.append((start, len(spans)))
    return out
