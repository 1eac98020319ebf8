"""TENSILE-rs Python client.

Today it holds the PyTorch tracer (:mod:`tensile.trace`), which captures one
training iteration of a model as a graph in the project's JSON format
(``tensile-graph/v1``) for ``tensilectl`` and the scheduler.
"""

from tensile.client import Client, Job, SchedulerError

__all__ = ["Client", "Job", "SchedulerError"]

__version__ = "0.1.0"
