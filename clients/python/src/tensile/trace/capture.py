"""Captures one training iteration of a PyTorch model as an ATen-level FX graph.

The model, its inputs and its optimizer live under a ``FakeTensorMode``: every
tensor has a shape, dtype and device but no data, so tracing ResNet-50 at
batch 16 takes about a second and no real memory. ``make_fx`` then records,
below autograd, every ATen op that one iteration runs: the forward pass, the
loss, the backward pass PyTorch's engine runs for it, and ``optimizer.step()``
in its per-tensor form (``foreach=False, fused=False``), so each parameter
update is its own ops.

Nothing is functionalized: in-place updates (``relu_``, ``addcdiv_`` on a
parameter, the running statistics a batch norm writes) stay in-place ops, and
:mod:`tensile.trace.convert` maps them to aliasing outputs. Parameters,
buffers, optimizer state and the batch are closed over rather than passed in,
so they appear in the graph as ``get_attr`` nodes whose objects are the very
tensors of the model and the optimizer: that identity is how their names and
kinds are recovered.

Forward hooks on every submodule keep a module stack. It names the module of
each forward op (``node.meta["custom"]["module"]``), and, through the autograd
sequence number of the nodes a module's forward creates, the module of each
backward op. When tracing fails, the same stack names the module (or the
backward node and the module that created it) where it failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx.traceback as fx_traceback
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from tensile.trace.eager_paths import Shadows, eager_library_paths

#: ``record_function`` labels that open the backward and the optimizer phases.
BACKWARD_MARK = "tensile::backward"
OPTIMIZER_MARK = "tensile::optimizer"


class TraceError(RuntimeError):
    """The model could not be traced; the message names the module at fault."""


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One tensor of the batch: a name, a shape and a dtype (no data is needed).

    ``value``, the real tensor when the caller has one (``tensile.plan``
    does), makes the tracer take the path eager mode takes for it: see
    :mod:`tensile.trace.eager_paths`."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    value: torch.Tensor | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class Role:
    """What an initial tensor is: its name in the graph, its kind and, for
    parameters and optimizer state, the parameter it belongs to."""

    name: str
    kind: str
    owner: str | None = None


@dataclasses.dataclass
class Captured:
    """The traced iteration and what is needed to turn it into a graph."""

    name: str
    gm: torch.fx.GraphModule
    #: Initial tensors in graph order (inputs, parameters, buffers, state).
    initial: list[tuple[torch.Tensor, Role]]
    #: ``(first sequence number, end, depth, module path)`` of every module call.
    module_calls: list[tuple[int, int, int, str]]
    #: Trainable parameter elements, ``sum(p.numel())``.
    param_count: int
    #: The optimizer's hyperparameters (its one parameter group, less the params).
    hyper: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The optimizer step the traced iteration is (steps run before it, plus one).
    step: int = 2

    def module_of_seq(self, seq: int) -> str | None:
        """The innermost module whose forward created autograd node ``seq``."""
        return innermost_module(self.module_calls, seq)


LossFn = Callable[[Any, torch.Tensor], torch.Tensor]


def capture(
    model: nn.Module | Callable[[], nn.Module],
    optimizer: type[torch.optim.Optimizer],
    optimizer_kwargs: dict[str, Any] | None,
    loss_fn: LossFn,
    inputs: Sequence[InputSpec],
    target: InputSpec,
    name: str = "model",
    device: str = "cpu",
    init_steps: int = 1,
) -> Captured:
    """Traces one iteration: ``loss_fn(model(*inputs), target)``, backward, step.

    ``init_steps`` (fake) optimizer steps run first, so that the optimizer
    has its state; the traced step is step ``init_steps + 1``.

    ``model`` is either a factory (called on the meta device, so building even
    a large model allocates nothing) or a module, whose parameters and buffers
    are then replaced by fake copies for the duration of the trace (through
    the mechanism of ``torch.func.functional_call``); the module itself is
    left as it was.

    ``device`` is where the fake tensors of a built model live. ``cpu`` (the
    default) needs no GPU. ``cuda`` records the ATen ops a GPU runs, which
    differ from the CPU's for a few layers (dropout is one fused op on CUDA, a
    bernoulli mask and two products on the CPU); tensors stay fake, but
    PyTorch's autograd engine needs a CUDA device to run the backward pass.
    """
    fake = FakeTensorMode()
    if isinstance(model, nn.Module):
        module = model
        swap = _fake_state(fake, module)
    else:
        module = build_model(model, name)
        _materialize(fake, module, device)
        swap = {}
    was_training = module.training
    try:
        with quiet_torch_logs(), torch.nn.utils.stateless._reparametrize_module(module, swap, tie_weights=True):
            dev = device if not swap else _device_of(module)
            return _capture_module(
                fake, module, optimizer, optimizer_kwargs or {}, loss_fn, inputs, target, name, dev, init_steps
            )
    finally:
        module.train(was_training)


@contextlib.contextmanager
def quiet_torch_logs() -> Iterator[None]:
    """Silences the tracebacks torch logs when a fake-tensor kernel fails
    (``failed while attempting to run meta``): the failure is re-raised and
    reported as one line naming the module, and the log would bury it."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def build_model(factory: Callable[[], nn.Module], name: str = "model") -> nn.Module:
    """Calls a model factory where it works: on the meta device (no memory),
    else, for builders that compute with tensor values (``.tolist()``,
    ``.item()`` on a tensor they made, which the meta device has no data
    for), on the CPU. Either way the parameters are replaced by fake ones
    before tracing. A failure is one line naming the model."""
    try:
        with torch.device("meta"):
            module = factory()
    except Exception as meta_error:  # noqa: BLE001 - any builder failure: try the CPU
        try:
            with torch.device("cpu"):
                module = factory()
        except Exception as e:  # noqa: BLE001 - reported as one line naming the model
            raise TraceError(
                f"cannot build model {name!r} ({_qualname(factory)}): {_one_line(e)} "
                f"(on the meta device: {_one_line(meta_error)})"
            ) from e
    if not isinstance(module, nn.Module):
        raise TraceError(f"the model factory of {name!r} returned {type(module).__name__}, not an nn.Module")
    return module


def _qualname(factory: Callable[..., Any]) -> str:
    return getattr(factory, "__qualname__", None) or type(factory).__name__


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def _device_of(module: nn.Module) -> str:
    for t in module.parameters():
        return str(t.device)
    return "cpu"


def _materialize(fake: FakeTensorMode, module: nn.Module, device: str) -> None:
    """Replaces meta parameters and buffers by fake ones, keeping tied ones tied."""
    memo: dict[int, torch.Tensor] = {}

    def fresh(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in memo:
            with fake:
                new = torch.empty(t.shape, dtype=t.dtype, device=device)
            memo[id(t)] = nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else new
        return memo[id(t)]

    for m in module.modules():
        for key, p in m._parameters.items():
            if p is not None:
                m._parameters[key] = fresh(p)
        for key, b in m._buffers.items():
            if b is not None:
                m._buffers[key] = fresh(b)


def _fake_state(fake: FakeTensorMode, module: nn.Module) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for n, p in module.named_parameters():
        with torch.no_grad():
            t = fake.from_tensor(p)
        state[n] = nn.Parameter(t, requires_grad=p.requires_grad)
    for n, b in module.named_buffers():
        state[n] = fake.from_tensor(b)
    return state


def _capture_module(
    fake: FakeTensorMode,
    module: nn.Module,
    optimizer_cls: type[torch.optim.Optimizer],
    optimizer_kwargs: dict[str, Any],
    loss_fn: LossFn,
    inputs: Sequence[InputSpec],
    target: InputSpec,
    name: str,
    device: str,
    init_steps: int,
) -> Captured:
    module.train()
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if not named:
        raise TraceError(f"{type(module).__name__} has no trainable parameters")
    with fake:
        batch = [torch.empty(s.shape, dtype=s.dtype, device=device) for s in inputs]
        labels = torch.empty(target.shape, dtype=target.dtype, device=device)
        opt = _make_optimizer(optimizer_cls, [p for _, p in named], optimizer_kwargs)
        _init_optimizer_state(opt, [p for _, p in named], init_steps)

    initial: list[tuple[torch.Tensor, Role]] = []
    initial += [(t, Role(s.name, "input")) for t, s in zip(batch, inputs)]
    initial.append((labels, Role(target.name, "input")))
    initial += [(p, Role(n, "parameter", owner=n)) for n, p in named]
    initial += [(p, Role(n, "buffer")) for n, p in module.named_parameters() if not p.requires_grad]
    initial += [(b, Role(n, "buffer")) for n, b in module.named_buffers()]
    for n, p in named:
        for key, value in opt.state[p].items():
            if isinstance(value, torch.Tensor):
                initial.append((value, Role(f"{n}.{key}", "optimizer_state", owner=n)))

    tracker = _ModuleTracker(module)
    # With the batch's values the trace follows eager mode's path (see
    # eager_paths): libraries see no tracer, and values read are computed.
    eager = any(s.value is not None for s in inputs)
    shadows = Shadows() if eager else None
    if shadows is not None:
        for t, s in zip(batch, inputs):
            if s.value is not None:
                shadows.give(t, s.value)

    def step() -> torch.Tensor:
        with shadows if shadows is not None else contextlib.nullcontext():
            return iteration()

    def iteration() -> torch.Tensor:
        out = module(*batch)
        tracker.leave_model()
        loss = loss_fn(out, labels)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise TraceError("the loss function must return a scalar tensor")
        tracker.hook_backward(loss)
        with torch.autograd.profiler.record_function(BACKWARD_MARK):
            loss.backward()
        tracker.phase = "optimizer step"
        with torch.autograd.profiler.record_function(OPTIMIZER_MARK):
            opt.step()
        return loss

    for _, p in named:
        p.grad = None
    try:
        paths = eager_library_paths() if eager else contextlib.nullcontext()
        with fake, fx_traceback.preserve_node_meta(), paths:
            gm = make_fx(step, tracing_mode="real")()
    except TraceError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure inside the model is re-raised naming it
        raise TraceError(tracker.describe_failure(e)) from e
    finally:
        tracker.remove()
        for _, p in named:
            p.grad = None
    return Captured(
        name=name,
        gm=gm,
        initial=initial,
        module_calls=tracker.calls,
        param_count=sum(p.numel() for _, p in named),
        hyper={k: v for k, v in opt.param_groups[0].items() if k != "params"},
        step=init_steps + 1,
    )


def _make_optimizer(
    cls: type[torch.optim.Optimizer], params: list[torch.Tensor], kwargs: dict[str, Any]
) -> torch.optim.Optimizer:
    """The optimizer in its per-tensor form: one update per parameter."""
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = dict(kwargs)
    for flag in ("foreach", "fused"):
        if flag in accepted:
            if kwargs.get(flag):
                raise TraceError(f"{cls.__name__}({flag}=True) is not traced: the tracer records per-tensor updates")
            kwargs[flag] = False
    for flag in ("capturable", "differentiable"):
        if kwargs.get(flag):
            raise TraceError(f"{cls.__name__}({flag}=True) is not supported by the tracer")
    return cls(params, **kwargs)


def _init_optimizer_state(opt: torch.optim.Optimizer, params: list[torch.Tensor], steps: int = 1) -> None:
    """Runs ``steps`` (fake) steps so that the optimizer creates its state
    lazily, as it does on the first real iteration; the traced iteration is a
    later one, which reads and updates that state."""
    for p in params:
        p.grad = torch.zeros_like(p)
    for _ in range(steps):
        opt.step()
    for p in params:
        p.grad = None


class _ModuleTracker:
    """Forward hooks that keep the stack of running modules (see module docs)."""

    def __init__(self, model: nn.Module) -> None:
        self.stack: list[tuple[str, nn.Module, int]] = []
        self.calls: list[tuple[int, int, int, str]] = []
        self.phase = "forward pass"
        self.grad_fn: Any = None
        self.model_type = type(model).__name__
        self.types = {path: type(m).__name__ for path, m in model.named_modules()}
        self.handles: list[Any] = []
        for path, m in model.named_modules():
            self.handles.append(m.register_forward_pre_hook(functools.partial(self._enter, path)))
            self.handles.append(m.register_forward_hook(functools.partial(self._exit, path)))

    def _enter(self, path: str, module: nn.Module, args: Any) -> None:
        self.stack.append((path, module, torch.autograd._get_sequence_nr()))
        self._set_meta({"module": path})

    def _exit(self, path: str, module: nn.Module, args: Any, output: Any) -> None:
        if not self.stack or self.stack[-1][0] != path:
            return  # a module re-entered oddly; keep the stack we have
        _, _, start = self.stack.pop()
        self.calls.append((start, torch.autograd._get_sequence_nr(), len(self.stack), path))
        self._set_meta({"module": self.stack[-1][0]} if self.stack else {})

    def leave_model(self) -> None:
        self.phase = "loss"
        self._set_meta({"module": "loss"})

    @staticmethod
    def _set_meta(custom: dict[str, Any]) -> None:
        meta = fx_traceback.get_current_meta()
        if custom:
            meta["custom"] = custom
        else:
            meta.pop("custom", None)

    def hook_backward(self, loss: torch.Tensor) -> None:
        """Tags the ops each autograd node's backward runs with that node."""
        self.phase = "backward pass"
        self._set_meta({})
        seen: set[Any] = set()
        todo = [loss.grad_fn]
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            todo.extend(fn for fn, _ in node.next_functions)
            if type(node).__name__ == "AccumulateGrad":
                continue
            node.register_prehook(functools.partial(self._grad_fn_enter, node))
            node.register_hook(functools.partial(self._grad_fn_exit, node))

    def _grad_fn_enter(self, node: Any, grad_outputs: Any) -> None:
        self.grad_fn = node
        self._set_meta({"grad_fn": node.name(), "seq": node._sequence_nr()})

    def _grad_fn_exit(self, node: Any, grad_inputs: Any, grad_outputs: Any) -> None:
        self.grad_fn = None
        self._set_meta({})

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def describe_failure(self, e: Exception) -> str:
        """One message saying where tracing stopped and why."""
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        if _is_data_dependent(e):
            why = (
                "the model reads tensor values or branches on them (data-dependent control flow: "
                "if/while on a tensor, .item(), .tolist(), nonzero): one iteration is not a static graph"
            )
        elif _is_shape_error(e):
            why = "the input's shape does not fit this module (another resolution or input shape may)"
        else:
            why = "an operation that cannot be traced under fake tensors"
        if self.grad_fn is not None:
            where = f"the backward of {self.grad_fn.name()}"
            module = innermost_module(self.calls, self.grad_fn._sequence_nr())
            if module is not None:
                where += f" (created in module {module or '<root>'!r} ({self.types.get(module, '?')}))"
        elif self.stack:
            path, module, _ = self.stack[-1]
            where = f"module {path or '<root>'!r} ({type(module).__name__}) in the forward pass"
        else:
            where = f"the {self.phase} (outside any module of {self.model_type})"
        function = _autograd_function_frame(e)
        if function is not None:
            where += f", in custom autograd function {function}"
        return f"cannot trace {where}: {why} [{reason}]"


def innermost_module(calls: list[tuple[int, int, int, str]], seq: int) -> str | None:
    """The innermost module call whose sequence-number range holds ``seq``:
    module calls nest, so it is the containing one that started last, and of
    calls that started at the same number, the deepest."""
    best: tuple[int, int, str] | None = None
    for start, end, depth, path in calls:
        if start <= seq < end and (best is None or (start, depth) > best[:2]):
            best = (start, depth, path)
    return None if best is None else best[2]


def _autograd_function_frame(e: BaseException) -> str | None:
    """``Class.forward`` or ``Class.backward`` of the innermost custom autograd
    function the failure passed through (their methods take ``ctx``)."""
    found = None
    tb = e.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name in ("forward", "backward", "setup_context") and "ctx" in code.co_varnames[:2]:
            found = code.co_qualname
        tb = tb.tb_next
    return found


def _is_shape_error(e: BaseException) -> bool:
    """A kernel's shape check failed (pooling output too small, a reshape or
    a matmul that does not fit): the model expects another input size."""
    text = str(e)
    return isinstance(e, (RuntimeError, ValueError)) and any(
        s in text for s in ("Output size is too small", "is invalid for input of size", "size mismatch",
                            "shapes cannot be multiplied", "must match the size", "Expected size")
    )


def _is_data_dependent(e: BaseException) -> bool:
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, (DataDependentOutputException, DynamicOutputShapeException)):
            return True
        text = str(seen)
        if "data-dependent" in text or "data dependent" in text or "DataDependent" in type(seen).__name__:
            return True
        seen = seen.__cause__ or seen.__context__
    return False
