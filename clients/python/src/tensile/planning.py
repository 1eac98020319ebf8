"""``tensile.plan``: trace a user's model, optimizer and loss, then plan it.

The user's own ``nn.Module`` instance and optimizer instance are traced (the
tracer runs them on fake copies of their parameters and leaves them
untouched) and the graph is planned in this process by the project's Rust
planner (``tensile._core.plan``, what ``tensilectl plan`` runs: the same
graph, profile and budget give the same plan), or by a scheduler. The plan
is a ``tensile-plan/v1`` document (``docs/plan-format.md``), read and
checked by the same Rust code as every other reader of plans. The returned
:class:`Plan` holds both: the graph (op sequence, tensor ids, names and
bytes) and the plan's events, which is what :func:`tensile.apply` needs.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tensile import _core
from tensile.trace import InputSpec, TraceError, trace_training_step
from tensile.trace.capture import LossFn

__all__ = ["Plan", "PlanError", "plan", "load_plan"]

log = logging.getLogger("tensile")
#: Optimizer settings that the tracer sets itself or refuses.
_TRACER_FLAGS = ("params", "foreach", "fused", "capturable", "differentiable")


class PlanError(RuntimeError):
    """Planning failed; the message says what is wrong (one line)."""


@dataclasses.dataclass
class Plan:
    """A traced graph and its plan, both as read from their JSON files."""

    graph: dict[str, Any]
    plan: dict[str, Any]
    graph_path: Path | None = None
    plan_path: Path | None = None
    #: The scheduler the plan came from (``tensile.plan(..., server=...)``):
    #: ``tensile.apply`` reports to it and follows its plans.
    server: str | None = None
    #: What the planner said of a plan made in this process (``tensilectl
    #: plan --json``'s report: peaks, time, events, the lower bound,
    #: diagnostics); ``None`` for a plan read from files or a scheduler.
    report: dict[str, Any] | None = None

    @property
    def ops(self) -> list[dict[str, Any]]:
        """The graph's ops, in the order one iteration runs them."""
        return self.graph["ops"]

    @property
    def tensors(self) -> list[dict[str, Any]]:
        return self.graph["tensors"]

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.plan["events"]

    @property
    def start_on_host(self) -> list[int]:
        return [e["tensor"] for e in self.plan.get("start_on_host", [])]

    @property
    def prediction(self) -> dict[str, Any]:
        return self.plan["prediction"]

    def op_label(self, index: int) -> str:
        """``aten::relu_ (layer1.0.relu.relu_)``: an op's type and name."""
        op = self.ops[index]
        overload = op.get("attrs", {}).get("overload")
        kind = op["type"] + (f".{overload}" if overload else "")
        return f"{kind} ({op['name']})"

    def summary(self) -> str:
        p = self.prediction
        kinds: dict[str, int] = {}
        for e in self.events:
            kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
        counts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "no events"
        return (
            f"{self.graph['name']}: {len(self.ops)} ops; peak {p['vanilla_peak_bytes'] / 2**20:.1f} MiB vanilla, "
            f"{p['planned_peak_bytes'] / 2**20:.1f} MiB planned; {counts}"
        )


def load_plan(graph_path: str | os.PathLike[str], plan_path: str | os.PathLike[str]) -> Plan:
    """A plan read back from a graph file and its plan file, checked against
    the graph by the plan format's rules (``tensile._core.read_plan``: ids and
    names, storage roots, gate, pace); :class:`PlanError` names what is wrong."""
    graph = _read_json(Path(graph_path), "graph")
    doc = _read_json(Path(plan_path), "plan")
    try:
        checked = _core.read_plan(graph, doc)
    except (_core.PlanFormatError, ValueError) as e:
        raise PlanError(f"{plan_path}: {e}") from None
    return Plan(graph, checked, Path(graph_path), Path(plan_path))


def plan(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    example_batch: Any,
    loss_fn: LossFn,
    budget_mb: int | None = None,
    server: str | None = None,
    *,
    device_profile: str | None = None,
    name: str | None = None,
    workdir: str | os.PathLike[str] | None = None,
    recompute: bool = True,
) -> Plan:
    """Traces one training step of ``model`` and plans it.

    ``example_batch`` is ``(inputs, target)``: ``inputs`` a tensor or a tuple
    of tensors passed to ``model(*inputs)``, ``target`` what ``loss_fn(output,
    target)`` takes; only their shapes and dtypes are used. ``budget_mb`` (a
    whole number of MB, 10^6 bytes) asks the planner to fit that much; a plan
    that cannot is returned and said at once (a warning on the ``tensile``
    logger naming its peak and the lowest peak any plan reaches).
    ``recompute=False`` plans without recomputation (swaps only);
    :func:`tensile.apply` rebuilds recomputed tensors from their saved
    inputs, as checkpointing does.
    ``device_profile`` is a device profile as ``tensilectl --device`` takes
    it (``a6000``, ``h100``, ``h200``, ``paper``, ``cpu`` or a profile
    file; default: see :func:`default_profile`). With ``workdir`` the graph and the plan
    are also written there, as ``NAME.graph.json`` and ``NAME.plan.json``,
    which the returned plan's ``graph_path`` and ``plan_path`` name;
    without one nothing is written and those paths are ``None``.

    Without ``server`` the plan is made in this process (no scheduler, no
    ``tensilectl``), with the GIL released while it plans. With ``server``
    (a scheduler's address: ``unix:PATH``, ``HOST:PORT``, or ``"default"``
    for its default socket) the plan comes from the scheduler's PlanGraph,
    which touches no registered job. The plan remembers ``server``:
    :func:`tensile.apply` then registers the job there, reports every step
    and follows the scheduler's plans.
    """
    if not isinstance(model, nn.Module):
        raise PlanError(f"model is a {type(model).__name__}, not an nn.Module")
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        # One process's compute is its module's: the wrapper's all-reduces
        # run beside the plan (tensile.apply takes the wrapper too).
        model = model.module
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise PlanError(f"optimizer is a {type(optimizer).__name__}, not a torch.optim.Optimizer")
    if budget_mb is not None and (isinstance(budget_mb, bool) or not isinstance(budget_mb, int) or budget_mb < 1):
        raise PlanError(f"budget_mb must be a positive whole number of MB, got {budget_mb!r}")
    inputs, target = _split_batch(example_batch)
    opt_kwargs = optimizer_settings(model, optimizer)
    device = _device_of(model)
    graph_name = name or f"{type(model).__name__.lower()}_b{inputs[0].shape[0] if inputs[0].shape else 1}"
    try:
        graph = trace_training_step(
            model,
            type(optimizer),
            inputs,
            target,
            loss_fn,
            optimizer_kwargs=opt_kwargs,
            name=graph_name,
            device=device,
        )
    except TraceError as e:
        raise PlanError(f"cannot trace {type(model).__name__}: {e}") from e
    # As a reader of the graph file would see it (lists, not tuples).
    graph = json.loads(json.dumps(graph))
    profile = device_profile or default_profile(device)
    if server is not None:
        doc, report = _plan_on_server(server, graph, budget_mb, profile), None
    else:
        doc, report = _plan_here(graph, budget_mb, profile, recompute)
    planned = Plan(graph, doc, server=server, report=report)
    if budget_mb is not None:
        _say_if_over(planned, budget_mb)
    if workdir is not None:
        folder = Path(workdir)
        folder.mkdir(parents=True, exist_ok=True)
        planned.graph_path = folder / f"{graph_name}.graph.json"
        planned.plan_path = folder / f"{graph_name}.plan.json"
        planned.graph_path.write_text(json.dumps(graph))
        planned.plan_path.write_text(json.dumps(doc, indent=2) + "\n")
    return planned


def _plan_here(graph: dict[str, Any], budget_mb: int | None, profile: str, recompute: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Plans ``graph`` in this process (``tensile._core.plan``)."""
    try:
        out = _core.plan(
            graph,
            profile,
            budget_bytes=None if budget_mb is None else budget_mb * 1_000_000,
            recompute=recompute,
        )
    except (_core.PlanningError, ValueError) as e:
        raise PlanError(f"cannot plan {graph['name']}: {e}") from None
    for warning in out["warnings"]:
        log.warning("tensile.plan: %s", warning)
    return out["plan"], out["report"]


def _plan_on_server(server: str, graph: dict[str, Any], budget_mb: int | None, profile: str) -> dict[str, Any]:
    """Plans ``graph`` with the scheduler's PlanGraph; the plan document."""
    from tensile.client import Client, SchedulerError, plan_to_file

    address = None if server == "default" else server
    try:
        with Client(address) as client:
            answer = client.plan_graph(
                graph,
                budget_bytes=(budget_mb or 0) * 1_000_000,
                device=profile,
            )
    except SchedulerError as e:
        raise PlanError(f"the scheduler could not plan {graph['name']}: {e}") from e
    try:
        return plan_to_file(answer.plan, graph, answer.diagnostics)
    except ValueError as e:
        raise PlanError(f"the scheduler's plan for {graph['name']}: {e}") from None


def _say_if_over(planned: Plan, budget_mb: int) -> None:
    """A plan whose predicted peak is over ``budget_mb`` is said when it is
    made (a warning on the ``tensile`` logger), with the lowest peak the
    planner could reach and what to do."""
    peak = planned.prediction["planned_peak_bytes"]
    budget = budget_mb * 1_000_000
    if peak <= budget:
        return
    lowest = (planned.report or {}).get("lower_bound_bytes")
    floor = f"; no plan goes under {lowest / 1e6:.1f} MB (the lower bound)" if lowest else ""
    log.warning(
        "tensile.plan: %s's plan peaks at %.1f MB, over budget_mb=%d%s: give a larger budget, a smaller batch, or "
        "let the scheduler share the device (server=)",
        planned.graph["name"],
        peak / 1e6,
        budget_mb,
        floor,
    )


def default_profile(device: str) -> str:
    """The device profile for where the model lives: ``cpu``, ``h200`` on
    an H200, ``h100`` on an H100, else ``a6000``."""
    if device == "cpu":
        return "cpu"
    if device == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for gpu, profile in (("H200", "h200"), ("H100", "h100")):
            if gpu in name:
                return profile
    return "a6000"


def optimizer_settings(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's constructor settings, for the tracer to rebuild it.

    The tracer updates the model's trainable parameters in
    ``named_parameters()`` order with one set of settings, so the optimizer
    must hold exactly those, in that order, in groups whose settings agree
    (the learning rate may differ: it changes no op).
    """
    trainable = [p for p in model.parameters() if p.requires_grad]
    held = [p for g in optimizer.param_groups for p in g["params"]]
    if len(held) != len(trainable) or any(a is not b for a, b in zip(held, trainable)):
        names = {id(p): n for n, p in model.named_parameters()}
        for i, (a, b) in enumerate(zip(held, trainable)):
            if a is not b:
                raise PlanError(
                    f"the optimizer's parameter {i} is {names.get(id(a), 'not a parameter of the model')}, "
                    f"the model's trainable parameter {i} is {names[id(b)]}: pass model.parameters() in order"
                )
        raise PlanError(
            f"the optimizer holds {len(held)} parameters, the model has {len(trainable)} trainable ones"
        )
    accepted = inspect.signature(type(optimizer).__init__).parameters
    groups = optimizer.param_groups
    settings = [{k: v for k, v in g.items() if k in accepted and k not in _TRACER_FLAGS} for g in groups]
    for i, s in enumerate(settings[1:], start=1):
        differ = sorted(k for k in s if k != "lr" and s[k] != settings[0].get(k))
        if differ:
            raise PlanError(f"optimizer group {i} differs from group 0 in {', '.join(differ)}: not traced")
    for flag in ("foreach", "fused"):
        if any(g.get(flag) for g in groups):
            raise PlanError(
                f"{type(optimizer).__name__}({flag}=True) runs multi-tensor kernels; "
                f"the plan needs per-tensor updates: construct it with {flag}=False"
            )
    return settings[0]


def _split_batch(example_batch: Any) -> tuple[list[InputSpec], InputSpec]:
    if not (isinstance(example_batch, (tuple, list)) and len(example_batch) == 2):
        raise PlanError("example_batch must be (inputs, target): inputs a tensor or a tuple of tensors")
    inputs, target = example_batch
    seq: Sequence[Any] = (inputs,) if isinstance(inputs, torch.Tensor) else inputs
    if not seq or not all(isinstance(t, torch.Tensor) for t in seq):
        raise PlanError("example_batch's inputs must be a tensor or a non-empty tuple of tensors")
    if not isinstance(target, torch.Tensor):
        raise PlanError(f"example_batch's target is a {type(target).__name__}, not a tensor")
    # The values go along: the tracer takes the path eager mode takes for
    # this batch (tensile.trace.eager_paths), the one tensile.apply checks.
    specs = [
        InputSpec(f"input{i}" if len(seq) > 1 else "input", tuple(t.shape), t.dtype, value=t)
        for i, t in enumerate(seq)
    ]
    return specs, InputSpec("target", tuple(target.shape), target.dtype)


def _device_of(model: nn.Module) -> str:
    for p in model.parameters():
        return p.device.type
    raise PlanError(f"{type(model).__name__} has no parameters")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PlanError(f"cannot read the {what} file {path}: {e}") from e
    if not isinstance(doc, dict):
        raise PlanError(f"the {what} file {path} is not a JSON object")
    return doc
