"""The forms one ATen op takes: what the tracer records against what eager runs.

The hook checks every op eager PyTorch runs against the graph's op at the
same index. The tracer and eager mode do not always write the same op the
same way: ``make_fx`` records ``torch.tensor(...)``'s ``aten::lift_fresh``
as ``aten::lift_fresh_copy`` (a copy, so that later in-place ops cannot
write a constant baked into the graph), functionalization writes every view
as its ``*_copy`` variant and every in-place op out of place, and a view may
be written under another name. Comparing op names alone refused every
Hugging Face causal LM, whose key/value cache starts from ``torch.tensor([])``.

This module is the one place that says which forms are the same op. An op
is reduced to *what it is* (:func:`what`) by the rules of :data:`FORMS`, and
a traced op and the op eager ran match when they reduce to the same op
(:func:`same_op`). Everything else still differs: ``relu_`` against
``gelu``, ``index_copy`` against ``index`` (not a view), an overload
against another (``bernoulli_.float`` against ``bernoulli.p``). The hook
still checks the output shapes, and its storage bookkeeping never trusts a
form: a saved tensor whose storage is not the one the plan's storage
already has is left to autograd (``Applier.pack``), so an op matched here
whose aliasing differs (a copy traced, a view run) costs at most a storage
the plan does not move, never a wrong value.

Absent ops are not forms and are not here: autograd's ``aten::detach`` of a
saved output, which the trace has and eager with saved-tensor hooks does
not run, is stepped over by the hook itself (``Applier._skip_saved_detaches``).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch.utils._python_dispatch import get_alias_info

#: ``(schema name, overload)``, as the hook and the graph key an op.
OpKey = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class Form:
    """One rule: ops of ``pattern`` are the op ``means``, for the reason ``why``."""

    name: str
    pattern: str
    means: str
    why: str


#: The correspondences, in the order :func:`what` applies them.
FORMS: tuple[Form, ...] = (
    Form(
        "view copy",
        "aten::X_copy, where aten::X (same overload) returns a view of its input",
        "aten::X",
        "functionalization writes each view as a copy; make_fx records lift_fresh (torch.tensor) as lift_fresh_copy",
    ),
    Form(
        "in place",
        "aten::X_, where it writes its first argument and aten::X (same overload) exists",
        "aten::X",
        "functionalization writes in-place ops out of place, and the same update can be written either way",
    ),
    Form(
        "renamed view",
        "aten::_unsafe_view, aten::_reshape_alias",
        "aten::view",
        "the same view of the same bytes; the names differ only in how autograd tracks the alias",
    ),
)

#: The renamed views (the third form), by name.
RENAMED_VIEWS: dict[str, OpKey] = {
    "aten::_unsafe_view": ("aten::view", "default"),
    "aten::_reshape_alias": ("aten::view", "default"),
}


def same_op(traced: OpKey, ran: OpKey) -> bool:
    """Whether the op eager ran is the traced op, in the same or another form."""
    return traced == ran or what(traced) == what(ran)


def form_of(traced: OpKey, ran: OpKey) -> str | None:
    """The name of the form that makes ``ran`` the traced op (None when the
    keys are equal or the ops differ), for the hook's counters and messages."""
    if traced == ran or what(traced) != what(ran):
        return None
    for key in (traced, ran):
        rule = _rule(key)
        if rule is not None:
            return rule
    return None


@functools.lru_cache(maxsize=None)
def what(key: OpKey) -> OpKey:
    """The op ``key`` is, written in its plain form: rules applied until none does."""
    step = _reduce(key)
    return key if step is None else what(step[1])


def _rule(key: OpKey) -> str | None:
    step = _reduce(key)
    return None if step is None else step[0]


def _reduce(key: OpKey) -> tuple[str, OpKey] | None:
    """One rule of :data:`FORMS` applied to ``key``: (form name, plainer key)."""
    name, overload = key
    if name in RENAMED_VIEWS:
        return FORMS[2].name, RENAMED_VIEWS[name]
    namespace, _, op = name.partition("::")
    if namespace != "aten":
        return None
    if op.endswith("_copy") and len(op) > len("_copy"):
        base = op[: -len("_copy")]
        overload_op = _overload(base, overload)
        if overload_op is not None and _returns_view(overload_op):
            return FORMS[0].name, (f"aten::{base}", overload)
    if op.endswith("_") and not op.endswith("__") and len(op) > 1:
        base = op[:-1]
        in_place, plain = _overload(op, overload), _overload(base, overload)
        if in_place is not None and plain is not None and _writes_first_argument(in_place):
            return FORMS[1].name, (f"aten::{base}", overload)
    return None


def _overload(op: str, overload: str) -> torch._ops.OpOverload | None:
    try:
        packet = getattr(torch.ops.aten, op)
        return getattr(packet, overload)
    except (AttributeError, RuntimeError):
        return None


def _returns_view(op: torch._ops.OpOverload) -> bool:
    """Every tensor it returns aliases an input without writing it (``Tensor(a)``)."""
    outs = list(get_alias_info(op).outs)
    return bool(outs) and all(o.alias_set and not o.is_write for o in outs)


def _writes_first_argument(op: torch._ops.OpOverload) -> bool:
    args = list(get_alias_info(op).args)
    return bool(args) and bool(args[0].is_write)
