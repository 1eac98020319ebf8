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
of ``optimizer.step()``; the ops between must be the ones traced, in order
(:class:`PlanMismatchError` names the first that differs). What the hook
does and does not handle is in ``runtime.py``'s docs and ``docs/framework-hook.md``.

With a scheduler (``server=``, or a plan made by ``tensile.plan(...,
server=...)``) the block is also a job of that scheduler: see
:mod:`tensile.hook.session`. A plan the scheduler coordinates with other
jobs carries a gate and a pace (:mod:`tensile.hook.gate`), which the hook
keeps; ``budget_mb=`` bounds the hook's resident saved bytes (the guard in
``runtime.py``).
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
) -> Iterator[Applier]:
    """Applies ``plan`` to every training iteration run inside the block.

    Yields the :class:`Applier`, whose ``stats`` list holds one
    :class:`IterationStats` per iteration. On leaving the block (normally or
    on an error) every parameter, buffer and optimizer state tensor is back on
    its device. ``copies_complete_after`` is a test option for CPU models:
    each copy then looks in flight for that many op boundaries, as GPU
    copies are.

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
    finds it; default: the server ``plan`` came from, if
    any; ``False``: none) makes the block a job of that scheduler, named
    ``name`` (default: the graph's name): the graph is registered with
    recomputation off, each step's measured op latencies and late
    prefetches are reported, the lease is renewed, and a newer plan the
    scheduler pushes is applied at the next step boundary. Training never
    waits on the scheduler: when it is unreachable or goes away, training
    goes on with the plan in use (a warning on the ``tensile.hook``
    logger) while the session registers again. The job is unregistered on
    leaving the block.
    """
    if not isinstance(plan, Plan):
        raise PlanApplyError(f"plan is a {type(plan).__name__}, not a tensile Plan (use tensile.plan)")
    address = plan.server if server is None else server
    if not (address is None or address is False or isinstance(address, (str, os.PathLike))):
        raise PlanApplyError(
            f"server is a {type(address).__name__}: give a scheduler's address (unix:PATH, HOST:PORT, "
            "'default'), None or False"
        )
    applier = Applier(plan, model, optimizer, copies_complete_after, _budget_bytes(budget_mb))
    with contextlib.ExitStack() as stack:
        if address is not False and address is not None:
            target = None if str(address) == "default" else str(address)
            device = next(model.parameters(), torch.empty(0)).device
            session = Session(plan.graph, target, name, priority=priority, device=device)
            stack.callback(session.finish)
            applier.session = session
        stack.callback(applier.finish)
        for handle in (
            model.register_forward_pre_hook(applier.forward_pre_hook),
            optimizer.register_step_pre_hook(applier.step_pre_hook),
            optimizer.register_step_post_hook(applier.step_post_hook),
        ):
            stack.callback(handle.remove)
        applier.start()
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(applier.pack, applier.unpack))
        stack.enter_context(applier)
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
