"""The PyTorch tracer: one training iteration of a model as a TENSILE graph.

``trace_training_step`` captures forward, loss, backward and the optimizer
step of a model under fake tensors (:mod:`tensile.trace.capture`) and maps
the ATen graph to the project's JSON format (:mod:`tensile.trace.convert`),
ready for ``tensilectl graph check|stats`` and the scheduler. The command
line is ``python -m tensile.trace`` (:mod:`tensile.trace.__main__`).

Example::

    import torch, torchvision
    from tensile.trace import InputSpec, trace_training_step

    graph = trace_training_step(
        lambda: torchvision.models.resnet50(),
        optimizer=torch.optim.Adam,
        inputs=[InputSpec("input", (16, 3, 224, 224))],
        target=InputSpec("target", (16,), torch.int64),
    )
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from tensile.trace.capture import InputSpec, LossFn, TraceError, capture
from tensile.trace.convert import mark_step_dependent, to_graph
from tensile.trace.models import classification_loss

__all__ = ["InputSpec", "TraceError", "trace_training_step", "OPTIMIZERS"]

#: Optimizer names the command line accepts, with the zoo's settings.
OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "adam": (torch.optim.Adam, {"lr": 1e-3}),
    "adamw": (torch.optim.AdamW, {"lr": 1e-3}),
    "sgd": (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}),
}


def trace_training_step(
    model: nn.Module | Callable[[], nn.Module],
    optimizer: type[torch.optim.Optimizer] = torch.optim.Adam,
    inputs: Sequence[InputSpec] = (),
    target: InputSpec | None = None,
    loss_fn: LossFn = classification_loss,
    optimizer_kwargs: dict[str, Any] | None = None,
    name: str = "model",
    device: str = "cpu",
) -> dict[str, Any]:
    """Traces one training iteration and returns its graph as a JSON-ready dict.

    ``model`` is a module or, better, a function that builds one (it is then
    built on the meta device and allocates nothing); a module is traced on
    fake copies of its parameters and left untouched. ``target`` defaults to class
    indices, one per sample of the first input. ``device`` (``cpu`` or
    ``cuda``, which needs a CUDA device for autograd) is where a built
    model's fake tensors live.
    Raises :class:`TraceError`
    naming the module when the model cannot be traced.
    """
    if not inputs:
        raise TraceError("at least one input spec is needed")
    if target is None:
        target = InputSpec("target", (inputs[0].shape[0],), torch.int64)
    captured = capture(model, optimizer, optimizer_kwargs, loss_fn, inputs, target, name, device)
    graph = to_graph(captured)
    if any(role.kind == "optimizer_state" and role.name.endswith(".step") for _, role in captured.initial):
        # The optimizer counts steps: trace the next step too, and have the
        # scalars it baked in from the count recomputed on every run.
        later = capture(
            model, optimizer, optimizer_kwargs, loss_fn, inputs, target, name, device, init_steps=captured.step
        )
        mark_step_dependent(graph, to_graph(later), captured.hyper, captured.step)
    produced = {t for op in graph["ops"] for t in op["outputs"]}
    traced = sum(
        _numel(t["shape"]) for t in graph["tensors"] if t["kind"] == "parameter" and t["id"] not in produced
    )
    if traced != captured.param_count:
        raise TraceError(f"internal: graph has {traced} parameter elements, the model {captured.param_count}")
    return graph


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
