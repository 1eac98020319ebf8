"""Iteration gates and a plan's pace: ``planner/src/gate.rs`` itself,
through ``tensile._core`` (where their documentation is). The hook reads
the host's ``CLOCK_MONOTONIC`` (``time.monotonic_ns()``) and waits."""

from tensile._core import MAX_PERIOD_NS, Gate, GateClock, gate_of, pace_from_seconds, pace_of

__all__ = ["MAX_PERIOD_NS", "Gate", "GateClock", "gate_of", "pace_from_seconds", "pace_of"]
