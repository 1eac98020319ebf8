"""Maps a captured FX graph to the project's graph JSON (``tensile-graph/v1``).

The rules follow ``graph/src/json.rs`` and ``graph/src/validate.rs``:

* Every tensor has a shape, a dtype and ``bytes = numel * itemsize``, and a
  kind. Initial tensors (inputs, parameters, buffers, optimizer state) come
  first, in the order of ``named_parameters()``; produced tensors are
  activations in the forward pass, gradients in the backward pass, and
  ``workspace`` in the optimizer step (its per-parameter temporaries such as
  Adam's denominator); new versions of parameters, buffers and optimizer
  state keep their kind. The loss is the ``output``. Adam's ``step`` counter,
  a host scalar in PyTorch's per-tensor form, is kept as a 4-byte
  ``optimizer_state`` tensor.
* Every ATen op becomes one op, its type the schema name (``aten::addcdiv_``),
  its tensor arguments the inputs, the other arguments attributes named as in
  the schema, and the phase the one its ``record_function`` mark opened.
* Aliasing comes from the op schemas: a return annotated ``Tensor(a!)`` is an
  in-place output of the argument in alias set ``a``; ``Tensor(a)`` is a view.
  An argument written in place but not returned (``out=`` arguments, and a
  batch norm's running statistics, which ``native_batch_norm``'s schema does
  not even mark as written) gets an extra in-place output, so that every
  mutation is a new version of the tensor. Later reads go to the newest version, which is what
  the program reads and what validation demands (an overwritten version is
  never read again). Views and versions share their root's storage, so bytes
  are never counted twice.
* A backward op records its autograd node (``@grad_fn``, the node's
  sequence number): the hook's memory prediction ends a saved tensor's life
  with the node that last reads it, as autograd does.
* ``getitem`` picks an output of a multi-output op; scalar arithmetic on the
  host and ``_local_scalar_dense`` (the optimizer reading its step count) are
  not device ops and are left out, as are profiler marks.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torch.fx import Node
from torch.utils._python_dispatch import get_alias_info

from tensile.trace.capture import BACKWARD_MARK, OPTIMIZER_MARK, Captured, TraceError

FORMAT = "tensile-graph/v1"

DTYPES: dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
}

_PHASE_KIND = {"forward": "activation", "backward": "gradient", "optimizer": "workspace"}
_PERSISTENT = ("parameter", "buffer", "optimizer_state")
_SKIPPED = {"aten::_local_scalar_dense"}
# Ops that write arguments their schema does not mark as written: batch norm
# in training updates its running statistics in place.
_UNANNOTATED_WRITES = {
    "aten::native_batch_norm": ("running_mean", "running_var"),
    "aten::cudnn_batch_norm": ("running_mean", "running_var"),
    "aten::miopen_batch_norm": ("running_mean", "running_var"),
}
_MAX_ATTR_LEN = 4096
#: Reserved attribute prefix of the binding of a tensor argument: ``@ARG`` is
#: the list of input indices the argument takes, ``-1`` for a ``None``
#: element of a ``Tensor?[]`` list (see ``kernels/src/bind.rs``).
BIND_PREFIX = "@"
#: Attribute of a backward op: the sequence number of its autograd node.
NODE_ATTR = "@grad_fn"


def to_graph(captured: Captured) -> dict[str, Any]:
    """The graph of one captured iteration, as a JSON-ready dict."""
    return _Converter(captured).run()


class _Converter:
    def __init__(self, captured: Captured) -> None:
        self.c = captured
        self.tensors: list[dict[str, Any]] = []
        self.ops: list[dict[str, Any]] = []
        self.root: list[int] = []  # storage root of each tensor
        self.newer: dict[int, int] = {}  # tensor -> its next in-place version
        self.of_object: dict[int, int] = {}  # id(initial tensor) -> tensor id
        self.env: dict[Node, Any] = {}
        self.phase = "forward"
        self.keep: list[torch.Tensor] = []  # keeps ids of constants unique
        self.owner: dict[int, str] = {}  # root tensor -> the parameter it belongs to
        self.updating: str | None = None  # the parameter the optimizer is updating

    # -- tensors ---------------------------------------------------------

    def new_tensor(self, name: str, t: torch.Tensor, kind: str, root: int | None = None) -> int:
        if t.dtype not in DTYPES:
            raise TraceError(f"tensor {name!r} has dtype {t.dtype}, which the graph format has no name for")
        tid = len(self.tensors)
        shape = [int(d) for d in t.shape]
        self.tensors.append(
            {
                "id": tid,
                "name": name,
                "shape": shape,
                "dtype": DTYPES[t.dtype],
                "bytes": math.prod(shape) * t.element_size(),
                "kind": kind,
            }
        )
        self.root.append(tid if root is None else self.root[root])
        return tid

    def latest(self, tid: int) -> int:
        while tid in self.newer:
            tid = self.newer[tid]
        return tid

    def kind_of_alias(self, base: int, in_place: bool) -> str:
        """A new version of persistent storage keeps its kind (``fc.weight'``
        is a parameter); views, and versions of anything else, take the
        phase's kind, as in the zoo."""
        kind = self.tensors[self.root[base]]["kind"]
        return kind if in_place and kind in _PERSISTENT else _PHASE_KIND[self.phase]

    # -- the walk --------------------------------------------------------

    def run(self) -> dict[str, Any]:
        for t, role in self.c.initial:
            tid = self.new_tensor(role.name, t, role.kind)
            self.of_object[id(t)] = tid
            if role.owner is not None:
                self.owner[tid] = role.owner
        loss: int | None = None
        for node in self.c.gm.graph.nodes:
            if node.op == "get_attr":
                self.env[node] = self.get_attr(node)
            elif node.op == "call_function":
                self.call(node)
            elif node.op == "output":
                flat = node.args[0]
                first = flat[0] if isinstance(flat, (list, tuple)) else flat
                if isinstance(first, Node) and isinstance(self.env.get(first), int):
                    loss = self.latest(self.env[first])
            elif node.op == "placeholder":
                raise TraceError(f"unexpected graph input {node.name}")
        if loss is None:
            raise TraceError("the traced iteration does not return the loss")
        self.tensors[self.root[loss]]["kind"] = "output"
        return {"format": FORMAT, "name": self.c.name, "tensors": self.tensors, "ops": self.ops}

    def get_attr(self, node: Node) -> int:
        obj = getattr(self.c.gm, str(node.target))
        if not isinstance(obj, torch.Tensor):
            raise TraceError(f"constant {node.target} is a {type(obj).__name__}, not a tensor")
        tid = self.of_object.get(id(obj))
        if tid is None:
            # A tensor the model closes over that is neither a parameter nor
            # a buffer (a constant built in forward): persistent, like a buffer.
            tid = self.new_tensor(f"constant:{node.target}", obj, "buffer")
            self.of_object[id(obj)] = tid
            self.keep.append(obj)
        return tid

    def call(self, node: Node) -> None:
        target = node.target
        if target is operator.getitem:
            base = self.env.get(node.args[0])
            self.env[node] = base[node.args[1]] if isinstance(base, list) else None
            return
        if not isinstance(target, torch._ops.OpOverload):
            if isinstance(node.meta.get("val"), torch.Tensor):
                raise TraceError(f"unsupported operation {target} ({node.name}) produces a tensor")
            return  # host-side scalar arithmetic
        schema = target._schema
        if schema.name.startswith("profiler::"):
            if schema.name == "profiler::_record_function_enter_new" and node.args:
                if node.args[0] == BACKWARD_MARK:
                    self.phase = "backward"
                elif node.args[0] == OPTIMIZER_MARK:
                    self.phase = "optimizer"
            return
        if schema.name in _SKIPPED:
            return
        self.aten_op(node, target, schema)

    def aten_op(self, node: Node, target: torch._ops.OpOverload, schema: Any) -> None:
        inputs: list[int] = []
        arg_inputs: dict[str, list[int]] = {}  # argument name -> input indices
        attrs: dict[str, Any] = {}
        written: list[tuple[set[str], str]] = []  # (alias set, argument) written in place
        arg_alias, out_alias = _aliasing(target)
        for i, arg in enumerate(schema.arguments):
            if i < len(node.args):
                value = node.args[i]
            elif arg.name in node.kwargs:
                value = node.kwargs[arg.name]
            else:
                continue
            tids = self.tensor_ids(value)
            if tids is None:
                attr = _attr(value)
                if attr is not None:
                    attrs[arg.name] = attr
                continue
            idx = []
            for tid in tids:
                if tid is None:
                    idx.append(-1)  # a None element of a Tensor?[] list
                    continue
                tid = self.latest(tid)
                if tid not in inputs:
                    inputs.append(tid)
                idx.append(inputs.index(tid))
            arg_inputs[arg.name] = [i for i in idx if i >= 0]
            # The binding: which inputs this argument takes (inputs are
            # de-duplicated, absent optional tensors dropped and lists
            # flattened, so their order alone does not say).
            attrs[f"{BIND_PREFIX}{arg.name}"] = idx
            if arg_alias[arg.name].is_write:
                written.append((arg_alias[arg.name].alias_set, arg.name))
        if attrs.get("training") is True:
            written += [(set(), a) for a in _UNANNOTATED_WRITES.get(schema.name, ()) if a in arg_inputs]
        if target._overloadname != "default":
            attrs["overload"] = target._overloadname
        seq = (node.meta.get("custom") or {}).get("seq")
        if self.phase == "backward" and seq is not None and inputs:
            # The autograd node whose backward runs the op: autograd frees a
            # node's saved tensors when the node ends, not at their last
            # read (tensile.hook.Schedule.saved_storages). Reserved like a
            # binding, so the kernels do not take it for an argument.
            attrs[NODE_ATTR] = int(seq)

        name = self.op_name(node, inputs)
        if self.phase == "optimizer" and self.updating is not None:
            # The gradient an update reads is the parameter's .grad.
            for t in inputs:
                if self.tensors[t]["kind"] == "gradient" and not self.tensors[t]["name"].endswith(".grad"):
                    self.tensors[t]["name"] = f"{self.updating}.grad"
        outputs: list[int] = []
        aliases: list[dict[str, Any]] = []
        covered: set[str] = set()
        val = node.meta.get("val")
        returns = list(schema.returns)
        if len(returns) == 1 and isinstance(returns[0].type, torch.ListType):
            values = [(out_alias[0], v) for v in val]  # one Tensor[] return
            env_is_list = True
        elif len(returns) == 1:
            values = [(out_alias[0], val)]
            env_is_list = False
        else:
            values = list(zip(out_alias, val if isinstance(val, (list, tuple)) else [val]))
            env_is_list = True
        env: list[int | None] = []
        multi = sum(isinstance(v, torch.Tensor) for _, v in values) > 1
        for k, (alias, v) in enumerate(values):
            if not isinstance(v, torch.Tensor):
                env.append(None)
                continue
            tname = f"{name}.{k}" if multi else name
            base_idx = self.aliased_input(alias.alias_set, arg_alias, arg_inputs)
            if base_idx is None:
                tid = self.new_tensor(tname, v, _PHASE_KIND[self.phase])
            else:
                base = inputs[base_idx]
                in_place = bool(alias.is_write)
                btensor = self.tensors[base]
                same = btensor["shape"] == [int(d) for d in v.shape] and btensor["dtype"] == DTYPES.get(v.dtype)
                if in_place and not same:
                    in_place = False  # e.g. resize_: count it as a view of the old storage
                if btensor["dtype"] != DTYPES.get(v.dtype):
                    tid = self.new_tensor(tname, v, _PHASE_KIND[self.phase])  # dtype-changing view: own bytes
                else:
                    if in_place:
                        tname = self.version_name(base, tname)
                    tid = self.new_tensor(tname, v, self.kind_of_alias(base, in_place), root=base)
                    kind = "in_place" if in_place else "view"
                    aliases.append({"output": len(outputs), "input": base_idx, "kind": kind})
                    if in_place:
                        self.newer[base] = tid
                        covered.update(alias.alias_set)
            outputs.append(tid)
            env.append(tid)
        # Arguments written in place but not returned get a new version too.
        for alias_set, arg_name in written:
            if covered.intersection(alias_set):
                continue
            for base_idx in arg_inputs.get(arg_name, []):
                base = inputs[base_idx]
                like = self.tensors[base]
                tid = len(self.tensors)
                self.tensors.append({**like, "id": tid, "name": self.version_name(base, f"{name}.{arg_name}"),
                                     "kind": self.kind_of_alias(base, True)})
                self.root.append(self.root[base])
                aliases.append({"output": len(outputs), "input": base_idx, "kind": "in_place"})
                outputs.append(tid)
                self.newer[base] = tid
        self.env[node] = env if env_is_list else env[0]
        if not outputs:
            return  # no memory effect (asserts, record-keeping ops)
        op: dict[str, Any] = {
            "id": len(self.ops),
            "name": name,
            "type": schema.name,
            "phase": self.phase,
            "inputs": inputs,
            "outputs": outputs,
        }
        if attrs:
            op["attrs"] = attrs
        if aliases:
            op["aliases"] = aliases
        self.ops.append(op)

    def tensor_ids(self, value: Any) -> list[int | None] | None:
        """The tensor ids an argument holds (``None`` for a ``None`` element
        of a list), or None when it holds no tensor."""
        if isinstance(value, Node):
            tid = self.env.get(value)
            return [tid] if isinstance(tid, int) else None
        if isinstance(value, (list, tuple)) and value and any(isinstance(v, Node) for v in value):
            tids = [self.env.get(v) if isinstance(v, Node) else None for v in value]
            tids = [t if isinstance(t, int) else None for t in tids]
            return tids if any(t is not None for t in tids) else None
        return None

    @staticmethod
    def aliased_input(alias_set: set[str], arg_alias: dict[str, Any], arg_inputs: dict[str, list[int]]) -> int | None:
        """The input index of the argument in the same alias set, if any."""
        if not alias_set:
            return None
        for name, info in arg_alias.items():
            if info.alias_set & alias_set and arg_inputs.get(name):
                return arg_inputs[name][0]
        return None

    def version_name(self, base: int, fallback: str) -> str:
        """Persistent tensors keep their name with a prime per version, as the zoo does."""
        if self.tensors[self.root[base]]["kind"] in _PERSISTENT:
            return self.tensors[base]["name"] + "'"
        return fallback

    def op_name(self, node: Node, inputs: list[int]) -> str:
        if self.phase == "optimizer":
            # Per-tensor optimizers update one parameter at a time: name each
            # op after the parameter whose tensors (or temporaries) it touches.
            owners = [self.owner[self.root[t]] for t in inputs if self.root[t] in self.owner]
            if owners:
                self.updating = owners[0]
            return f"{self.updating}.update.{node.name}" if self.updating else node.name
        custom = node.meta.get("custom") or {}
        module = custom.get("module")
        if module is None and "seq" in custom:
            owner = self.c.module_of_seq(custom["seq"])
            module = f"{owner or 'model'}.backward" if owner is not None else "loss.backward"
        if module is None and self.phase == "backward":
            module = "backward"  # the seed, and gradients summed by the engine
        return f"{module}.{node.name}" if module else node.name


_ALIASING: dict[torch._ops.OpOverload, tuple[dict[str, Any], list[Any]]] = {}


def _aliasing(op: torch._ops.OpOverload) -> tuple[dict[str, Any], list[Any]]:
    """Alias sets of an op's arguments (by name) and returns. PyTorch's own
    parser (torchgen, via ``get_alias_info``) is used because the TorchScript
    schema objects drop the alias set of a list return such as ``split``'s
    ``Tensor(a)[]``."""
    if op not in _ALIASING:
        info = get_alias_info(op)
        _ALIASING[op] = ({a.name: a for a in info.args}, list(info.outs))
    return _ALIASING[op]


def _attr(value: Any) -> Any:
    """A JSON attribute for a non-tensor argument, or None to leave it out."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool):
        try:
            return int(value)
        except Exception:  # noqa: BLE001 - a symbolic size: leave it out
            return None
    if isinstance(value, (float, torch.SymFloat)):
        try:
            f = float(value)
        except Exception:  # noqa: BLE001
            return None
        return f if math.isfinite(f) else str(f)
    if isinstance(value, str):
        return value[:_MAX_ATTR_LEN]
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(value)
    if isinstance(value, (list, tuple)) and len(value) <= _MAX_ATTR_LEN:
        items = [_attr(v) for v in value]
        if items and all(isinstance(v, bool) for v in items):
            return [int(v) for v in items]
        if items and all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            return items
        if items and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
            return [float(v) for v in items]
    return None


# -- step-dependent scalars ---------------------------------------------------

#: Scalars of a per-tensor optimizer step that depend on the step count, as
#: ``torch.optim.Adam`` / ``AdamW`` (``foreach=False``, not capturable)
#: compute them in Python floats: ``value`` of the ``addcdiv_`` that updates
#: the parameter, and the divisor of the denominator. The names are what the
#: kernels recompute (``kernels/src/bind.rs``).
STEP_FORMULAS: dict[str, Any] = {
    "adam.neg_step_size": lambda h, s: -(h["lr"] / (1 - h["betas"][0] ** s)),
    "adam.bias_correction2_sqrt": lambda h, s: (1 - h["betas"][1] ** s) ** 0.5,
}


def mark_step_dependent(graph: dict[str, Any], later: dict[str, Any], hyper: dict[str, Any], step: int) -> None:
    """Finds the attributes of ``graph`` (traced at optimizer step ``step``)
    that differ in ``later`` (the same iteration traced at step ``step + 1``):
    scalars the optimizer computed from its step count and baked in. Each must
    be one of :data:`STEP_FORMULAS` at both steps; the op then records how to
    recompute it on every run: ``@scalar.ARG`` (the formula), ``@step`` (the
    input index of its parameter's step tensor, added as an input, in the
    version after the step's increment) and the hyperparameters ``@lr``,
    ``@beta1``, ``@beta2``. Anything else is a :class:`TraceError`: a graph
    that would be right only at the traced step is refused."""
    # Only the optimizer step is compared: the backward pass of two traces
    # may differ in bookkeeping ops (the engine's buffers), not in scalars.
    ops = [op for op in graph["ops"] if op["phase"] == "optimizer"]
    others = [op for op in later["ops"] if op["phase"] == "optimizer"]
    if len(ops) != len(others) or any(a["type"] != b["type"] for a, b in zip(ops, others)):
        raise TraceError("the optimizer step's ops differ from one step to the next: it is not one static graph")
    tensors = graph["tensors"]
    steps = {t["name"][: -len(".step")]: t["id"] for t in tensors if t["kind"] == "optimizer_state" and t["name"].endswith(".step")}
    newer: dict[int, int] = {}

    def latest(tid: int) -> int:
        while tid in newer:
            tid = newer[tid]
        return tid

    for op, other in zip(ops, others):
        attrs, attrs2 = op.get("attrs", {}), other.get("attrs", {})
        changed = sorted(k for k, v in attrs.items() if attrs2.get(k) != v)
        for key in changed:
            v1, v2 = attrs[key], attrs2.get(key)
            formula = None
            if isinstance(v1, float) and isinstance(v2, float) and "betas" in hyper and "lr" in hyper:
                for fname, f in STEP_FORMULAS.items():
                    if f(hyper, step) == v1 and f(hyper, step + 1) == v2:
                        formula = fname
                        break
            if formula is None:
                raise TraceError(
                    f"op {op['name']} ({op['type']}): attribute {key} is {v1!r} at optimizer step {step} and "
                    f"{v2!r} at step {step + 1}, and no known formula gives it: a graph of one step would be "
                    "wrong at the others"
                )
            owner = max((p for p in steps if op["name"].startswith(f"{p}.update.")), key=len, default=None)
            if owner is None:
                raise TraceError(f"op {op['name']} ({op['type']}): a step-dependent {key} with no step tensor")
            step_tid = latest(steps[owner])
            if step_tid not in op["inputs"]:
                op["inputs"].append(step_tid)
            attrs[f"@scalar.{key}"] = formula
            attrs[f"{BIND_PREFIX}step"] = [op["inputs"].index(step_tid)]
            attrs["@lr"] = float(hyper["lr"])
            attrs["@beta1"] = float(hyper["betas"][0])
            attrs["@beta2"] = float(hyper["betas"][1])
            op["attrs"] = attrs
        for a in op.get("aliases", []):
            if a["kind"] == "in_place":
                newer[op["inputs"][a["input"]]] = op["outputs"][a["output"]]
