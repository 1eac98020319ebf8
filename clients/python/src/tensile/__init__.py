"""TENSILE-rs Python client.

* :mod:`tensile.trace`: captures one training iteration of a model as a
  graph in the project's JSON format (``tensile-graph/v1``).
* :func:`tensile.plan` (:mod:`tensile.planning`): traces the user's own
  model, optimizer and loss, and plans the graph with ``tensilectl plan``.
* :func:`tensile.apply` (:mod:`tensile.hook`): applies such a plan inside
  the user's unchanged eager PyTorch training loop.
* :class:`tensile.Client` (:mod:`tensile.client`): the scheduler's gRPC
  client, over stubs generated from the one proto (:mod:`tensile.v1`).
"""

from tensile.client import Client, Job, SchedulerError
from tensile.hook import BudgetError, PlanApplyError, PlanMismatchError, apply
from tensile.planning import Plan, PlanError, load_plan, plan

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
