"""Iteration gates and a plan's pace: when a coordinated job may start.

The Python twin of ``planner/src/gate.rs`` (``Gate``, ``GateClock``), with
the same numbers in its tests (``tests/python/test_hook_gates.py`` copies
the Rust unit tests' cases). The scheduler gives each job it coordinates
with others a gate: the job starts its iterations at the slots ``epoch_ns
+ phase_ns + n * period_ns`` of the host's ``CLOCK_MONOTONIC``, which
every process on the host shares and Python reads as
``time.monotonic_ns()`` (on Linux). A job takes the slot nearest to the
moment it adopts the gate, then one every period; it waits for a slot
ahead of it, and an iteration ready after its slot starts at once (more
than a period late, it drops the slots it missed).

A coordinated plan also carries its *pace*, ``prediction.op_start_ns``:
when each op starts within the iteration, ns from the iteration's start.

Pure (no torch, no clock of its own): the hook reads the clock and waits.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MAX_PERIOD_NS", "Gate", "GateClock", "gate_of", "pace_from_seconds", "pace_of"]

#: The longest gate period (and op start) a plan may carry: an hour
#: (``proto/src/convert.rs``, ``MAX_GATE_PERIOD_NS``).
MAX_PERIOD_NS = 3_600_000_000_000
_U64_MAX = 2**64 - 1
_KEYS = ("period_ns", "phase_ns", "epoch_ns")


@dataclasses.dataclass(frozen=True)
class Gate:
    """When a coordinated job may start its iterations: the slots
    ``epoch_ns + phase_ns + n * period_ns`` for every integer ``n``.

    Checked on construction as the Rust side checks a plan's gate
    (``check_gate``): a period of 1 ns to an hour, a phase less than the
    period; every number a whole number of ns that fits a ``u64``."""

    period_ns: int
    phase_ns: int
    epoch_ns: int

    def __post_init__(self) -> None:
        for key in _KEYS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U64_MAX:
                raise ValueError(f"gate {key} is {value!r}, not a whole number of ns from 0 to 2^64-1")
        if not 1 <= self.period_ns <= MAX_PERIOD_NS:
            raise ValueError(f"gate period {self.period_ns} ns is not in 1 ns to 1 hour")
        if self.phase_ns >= self.period_ns:
            raise ValueError(f"gate phase {self.phase_ns} ns is not less than its period {self.period_ns} ns")

    @classmethod
    def from_dict(cls, doc: Any) -> Gate:
        """A plan file's ``gate`` (``{"period_ns", "phase_ns", "epoch_ns"}``,
        docs/plan-format.md); a missing or unknown key is an error."""
        if not isinstance(doc, Mapping):
            raise ValueError(f"gate is a {type(doc).__name__}, not an object with {', '.join(_KEYS)}")
        unknown = sorted(set(doc) - set(_KEYS))
        if unknown:
            raise ValueError(f"gate has unknown key {unknown[0]!r} (it has {', '.join(_KEYS)})")
        missing = [k for k in _KEYS if k not in doc]
        if missing:
            raise ValueError(f"gate lacks {missing[0]!r}")
        return cls(doc["period_ns"], doc["phase_ns"], doc["epoch_ns"])

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @staticmethod
    def epoch_at(previous: Gate | None, now: int) -> int:
        """The epoch to give the gates of a joint plan published at ``now``:
        the start of the cycle of the gates in use (``previous``) nearest
        to ``now``; ``now`` when no job had a gate."""
        if previous is None:
            return now
        return dataclasses.replace(previous, phase_ns=0).nearest_slot(now)

    @staticmethod
    def epoch_for(previous: Gate | None, anchor: Gate | None, now: int) -> int:
        """The epoch to give the gates of plans published at ``now`` whose
        ``anchor`` job's next slot is to be at ``now`` (it stands where the
        new cycle begins); without one, :meth:`epoch_at` the gates in
        use."""
        if anchor is None:
            return Gate.epoch_at(previous, now)
        period = max(anchor.period_ns, 1)
        phase = anchor.phase_ns % period
        return now - phase if now >= phase else now + period - phase

    def nearest_slot(self, now: int) -> int:
        """The slot nearest to ``now`` (ties go to the earlier one); slots
        before the clock's zero do not exist, so near zero it may be a
        later one."""
        period = self.period_ns
        origin = self.epoch_ns + self.phase_ns % period
        offset = (now - origin) % period  # Python's % of a positive divisor is Euclid's
        slot = now - offset
        if offset > period // 2:
            slot += period
        while slot < 0:
            slot += period
        return min(slot, _U64_MAX)


class GateClock:
    """A driver's position on its job's slots: where the next iteration may
    start. One per job; ``planner/src/gate.rs``'s ``GateClock``."""

    def __init__(self, gate: Gate) -> None:
        self._gate = gate
        #: The slot of the iteration about to start (None: not placed yet).
        self.next_ns: int | None = None

    @property
    def gate(self) -> Gate:
        return self._gate

    def set_gate(self, gate: Gate) -> None:
        """Takes a new plan's gate. The same gate keeps the slots; another
        one places them afresh at the next start: on the slot just passed if
        it passed within a tenth of a period, else on the next one."""
        if gate != self._gate:
            self._gate = gate
            self.next_ns = None

    def start_at(self, now: int) -> int:
        """When the iteration that is ready to start at ``now`` may start
        (``now`` itself when its slot has passed). Call once per iteration."""
        period = self._gate.period_ns
        if self.next_ns is None:
            # A gate adopted anew: the slot just passed if it passed less
            # than a tenth of a period ago (a grid that did not move costs
            # no wait), else the next one (on phase from the start rather
            # than late for several iterations).
            nearest = self._gate.nearest_slot(now)
            if nearest <= now:
                last, upcoming = nearest, min(nearest + period, _U64_MAX)
            else:
                last = nearest - period if nearest >= period else None
                upcoming = nearest
            slot = last if last is not None and now - last <= period // 10 else upcoming
        elif now > min(self.next_ns + period, _U64_MAX):
            # More than a period behind: skip the slots missed rather than
            # run iterations back to back to make them up.
            nearest = self._gate.nearest_slot(now)
            slot = nearest - period if nearest > now else nearest
        else:
            slot = self.next_ns
        self.next_ns = min(slot + period, _U64_MAX)
        return max(slot, now)


def gate_of(plan: Mapping[str, Any]) -> Gate | None:
    """The gate of a ``tensile-plan/v1`` document, or None (the job runs free)."""
    doc = plan.get("gate")
    return None if doc is None else Gate.from_dict(doc)


def pace_of(plan: Mapping[str, Any], ops: int) -> list[int]:
    """The pace of a ``tensile-plan/v1`` document (``prediction.op_start_ns``),
    checked as ``proto/src/plan_json.rs`` reads it: empty, or one whole
    number of ns per op of the graph, non-decreasing."""
    starts = plan.get("prediction", {}).get("op_start_ns", [])
    if not isinstance(starts, Sequence) or isinstance(starts, (str, bytes)):
        raise ValueError(f"prediction.op_start_ns is a {type(starts).__name__}, not a list of ns")
    if starts and len(starts) != ops:
        raise ValueError(f"prediction.op_start_ns has {len(starts)} op starts for a graph of {ops} ops")
    for i, ns in enumerate(starts):
        if isinstance(ns, bool) or not isinstance(ns, int) or not 0 <= ns <= _U64_MAX:
            raise ValueError(f"prediction.op_start_ns: op {i} starts at {ns!r}, not a whole number of ns")
        if i and ns < starts[i - 1]:
            raise ValueError(f"prediction.op_start_ns: op {i} starts before op {i - 1}")
    return list(starts)


def pace_from_seconds(starts_s: Sequence[float], ops: int) -> list[int]:
    """A pace from the wire (``PlanPrediction.op_start_s``, seconds) in ns,
    checked as ``proto/src/convert.rs``'s ``check_pace`` checks it: empty,
    or one start per op, finite, in 0 s to 1 hour, non-decreasing once
    rounded to ns (half away from zero, as Rust's ``f64::round``)."""
    if not starts_s:
        return []
    if len(starts_s) != ops:
        raise ValueError(f"{len(starts_s)} op starts for a graph of {ops} ops")
    out: list[int] = []
    for op, s in enumerate(starts_s):
        if not (math.isfinite(s) and 0.0 <= s <= MAX_PERIOD_NS / 1e9):
            raise ValueError(f"op {op} starts at {s} s, not in 0 s to 1 hour")
        x = s * 1e9
        whole = math.floor(x)
        ns = whole + 1 if x - whole >= 0.5 else whole
        if out and ns < out[-1]:
            raise ValueError(f"op {op} starts before op {op - 1}")
        out.append(ns)
    return out
