"""TENSILE-rs Python client.

* :mod:`tensile.trace`: captures one training iteration of a model as a
  graph in the project's JSON format (``tensile-graph/v1``).
* :func:`tensile.plan` (:mod:`tensile.planning`): traces the user's own
  model, optimizer and loss, and plans the graph in the process with the
  Rust planner (:mod:`tensile._core`, the project's crates under the
  package: planner, plan format, gate clock, session, endpoint rule).
* :func:`tensile.apply` (:mod:`tensile.hook`): applies such a plan inside
  the user's unchanged eager PyTorch training loop.
* :class:`tensile.Client` (:mod:`tensile.client`): the scheduler's gRPC
  client, over stubs generated from the one proto (:mod:`tensile.v1`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tensile.client import Client, Job, SchedulerError

if TYPE_CHECKING:
    from tensile.hook import BudgetError, PlanApplyError, PlanMismatchError, apply
    from tensile.planning import Plan, PlanError, load_plan, plan

#: The names that need PyTorch, by their module: imported on first use, so
#: that ``import tensile`` and the client work where torch is not installed
#: (the wheel does not require it: ``pip install tensile[torch]``).
_NEEDS_TORCH = {
    "BudgetError": "tensile.hook",
    "PlanApplyError": "tensile.hook",
    "PlanMismatchError": "tensile.hook",
    "apply": "tensile.hook",
    "Plan": "tensile.planning",
    "PlanError": "tensile.planning",
    "load_plan": "tensile.planning",
    "plan": "tensile.planning",
}


def __getattr__(name: str) -> Any:
    """Imports a name of :data:`_NEEDS_TORCH` (or the submodule ``hook``,
    ``planning``, ``trace``) on first use."""
    if name in ("hook", "planning", "trace"):
        return importlib.import_module(f"tensile.{name}")
    module = _NEEDS_TORCH.get(name)
    if module is None:
        raise AttributeError(f"module 'tensile' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "BudgetError",
    "Client",
    "Job",
    "Plan",
    "PlanApplyError",
    "PlanError",
    "PlanMismatchError",
    "SchedulerError",
    "apply",
    "load_plan",
    "plan",
]

__version__ = "0.1.0"
