"""``tensile.apply``: a plan applied to the user's own eager training loop.

    plan = tensile.plan(model, optimizer, (inputs, target), loss_fn)
    with tensile.apply(plan, model, optimizer) as hook:
        for inputs, target in loader:
            loss = loss_fn(model(inputs), target)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    print(hook.stats[-1])

An iteration is the model's forward call (with gradients on) up to the end
of ``optimizer.step()``. The first one is checked op by op against the
plan's graph (:class:`PlanMismatchError` names the first op that differs)
and recorded; the next ones run Python only at the points where the plan
acts (the saved-tensor hooks, the pre-hooks of the modules holding
parameters, the optimizer's chunks, the step's start and end), checked
against that record. What the hook does and does not handle is in
``runtime.py``'s docs and ``docs/framework-hook.md``.

With a scheduler (``server=``, or a plan made by ``tensile.plan(...,
server=...)``) the block is also a job of that scheduler: see
:mod:`tensile.hook.session`; its first step waits while the scheduler has
not admitted it. A plan the scheduler coordinates with other jobs carries a
gate and a pace (:mod:`tensile.hook.gate`), which the hook keeps;
``budget_mb=`` bounds the hook's resident saved bytes (the guard in
``runtime.py``, whose choice of what to move is the executor's rule).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Literal

import torch
from torch import nn

from tensile.hook.gate import Gate, GateClock
from tensile.hook.runtime import Applier, BudgetError, IterationStats, PlanApplyError, PlanMismatchError
from tensile.hook.schedule import Schedule
from tensile.hook.session import PushedPlan, Session
from tensile.hook.store import MIN_MOVE_BYTES, Copies
from tensile.planning import Plan

__all__ = [
    "apply",
    "Applier",
    "BudgetError",
    "Gate",
    "GateClock",
    "IterationStats",
    "PlanApplyError",
    "PlanMismatchError",
    "PushedPlan",
    "Schedule",
    "Session",
]


@contextlib.contextmanager
def apply(
    plan: Plan,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    budget_mb: float | None = None,
    server: str | os.PathLike[str] | Literal[False] | None = None,
    name: str = "",
    priority: int = 0,
    copies_complete_after: int = 0,
    check: Literal["step", "ops"] = "step",
    copies: Copies = "sync",
    min_move_bytes: int = MIN_MOVE_BYTES,
) -> Iterator[Applier]:
    """Applies ``plan`` to every training iteration run inside the block.

    Yields the :class:`Applier`, whose ``stats`` list holds one
    :class:`IterationStats` per iteration. On leaving the block (normally or
    on an error) every parameter, buffer and optimizer state tensor is back on
    its device.

    The first step is checked op by op against the plan's graph; the next
    ones run with Python only at the saved-tensor hooks, the pre-hooks of
    the modules holding parameters, the optimizer's chunks and the step's
    ends, each checked against the first step's record (a step that differs,
    a smaller last batch, runs unplanned from there, said once; the step
    after it is checked again). ``check="ops"`` checks every step op by op
    (for debugging: several times slower).

    ``copies`` (CPU models) says how the CPU engine moves bytes: ``"sync"``
    copies at once, ``"thread"`` on a copy thread, ``"none"`` hands the
    storage itself over (the CPU's device and host memory being one). On
    CUDA copies run on a side stream. ``copies_complete_after`` is a test
    option for CPU models: each copy then looks in flight for that many
    points, as GPU copies are. Storages under ``min_move_bytes`` (64 KiB by
    default) are never moved: a copy costs the host microseconds whatever
    its size, and such storages free next to nothing.

    ``budget_mb`` (MB of 10^6 bytes, as ``tensile.plan``'s; any positive
    number; default None: no limit) bounds the hook's *resident saved
    bytes* (the activation storages autograd saved that the hook holds on
    the device, ``stats[i].peak_saved_bytes``): a prefetch that would pass
    it is held back until there is room (or its consumer fetches it), and
    a tensor saved or fetched on demand that would pass it first moves
    other saved tensors to the host, the one used again last first;
    :class:`BudgetError` names the op and the bytes when the budget is
    below what one op needs. A budget given to ``tensile.plan`` is the
    planner's and is not applied here unless passed again.

    A plan with a ``gate`` (a job the scheduler coordinates with others)
    holds each iteration until its slot on ``time.monotonic_ns()``, and one
    with a pace (``prediction.op_start_ns``) starts no op before its
    planned time in the iteration; ``stats[i].gate_wait_ns`` and
    ``paced_ns`` say how long.

    ``server`` (``unix:PATH``, ``HOST:PORT``, ``"default"`` for the
    scheduler of the model's GPU, as :func:`tensile.client.resolve_server`
    finds it; default: the server ``plan`` came from, if any; ``False``:
    none) makes the block a job of that scheduler, named ``name`` (default:
    the graph's name). Its first step waits for the registration's outcome
    and, while the scheduler has not admitted the job (its budget has no
    room beside the others), until it does, saying why every 30 s; it then
    trains on the scheduler's plan. Each step's measurements are reported
    (with the op latencies of the last step timed op by op: the second step
    is), the lease is renewed, and a newer plan the scheduler pushes is
    applied at the next step boundary. Training never waits on a scheduler
    that does not answer: when it is unreachable or goes away, training goes
    on with the plan in use (a warning on the ``tensile.hook`` logger) while
    the session registers again. The job is unregistered on leaving the
    block.
    """
    if not isinstance(plan, Plan):
        raise PlanApplyError(f"plan is a {type(plan).__name__}, not a tensile Plan (use tensile.plan)")
    address = plan.server if server is None else server
    if not (address is None or address is False or isinstance(address, (str, os.PathLike))):
        raise PlanApplyError(
            f"server is a {type(address).__name__}: give a scheduler's address (unix:PATH, HOST:PORT, "
            "'default'), None or False"
        )
    applier = Applier(
        plan,
        model,
        optimizer,
        copies_complete_after,
        _budget_bytes(budget_mb),
        check=check,
        copies=copies,
        min_move_bytes=min_move_bytes,
    )
    with contextlib.ExitStack() as stack:
        if address is not False and address is not None:
            target = None if str(address) == "default" else str(address)
            device = next(model.parameters(), torch.empty(0)).device
            session = Session(plan.graph, target, name, priority=priority, device=device)
            stack.callback(session.finish)
            applier.session = session
        stack.callback(applier.finish)
        for handle in (
            # The module the plan was traced from (inside a DistributedDataParallel).
            applier.model.register_forward_pre_hook(applier.forward_pre_hook),
            optimizer.register_step_pre_hook(applier.step_pre_hook),
            optimizer.register_step_post_hook(applier.step_post_hook),
            *(m.register_forward_pre_hook(applier.module_pre_hook(i)) for i, (m, _) in enumerate(applier.modules)),
        ):
            stack.callback(handle.remove)
        applier.start()
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(applier.pack, applier.unpack))
        yield applier


def _budget_bytes(budget_mb: float | None) -> int | None:
    """``budget_mb`` in bytes (MB = 10^6 bytes, as ``tensile.plan`` and
    ``tensilectl`` count them)."""
    if budget_mb is None:
        return None
    if isinstance(budget_mb, bool) or not isinstance(budget_mb, (int, float)) or not math.isfinite(budget_mb) or budget_mb <= 0:
        raise PlanApplyError(f"budget_mb must be a positive number of MB (10^6 bytes) or None, got {budget_mb!r}")
    budget = int(budget_mb * 1_000_000)
    if budget < 1:
        raise PlanApplyError(f"budget_mb={budget_mb!r} is less than one byte")
    return budget
