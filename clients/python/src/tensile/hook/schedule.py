"""A plan as the hook reads it: per op, what to check and which events fire.

Pure data over the graph and plan dicts (no torch): the storage root of
every tensor, the ops the dispatcher must run in order, the events by
trigger, and the plan's prediction of the *resident saved bytes* that the
hook measures (see :meth:`Schedule.predicted_saved_curve`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tensile.planning import Plan

PERSISTENT = ("parameter", "buffer", "optimizer_state")
#: The autograd node of a backward op (``tensile.trace.convert.NODE_ATTR``).
NODE_ATTR = "@grad_fn"


@dataclasses.dataclass(frozen=True)
class Event:
    kind: str  # swap_out | swap_in | release | recompute
    storage: int  # root tensor id
    name: str


class Schedule:
    """Everything the hook looks up per op, computed once per plan."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        ops, tensors = plan.ops, plan.tensors
        self.n_ops = len(ops)
        #: ``(schema name, overload)`` of every op, what the dispatcher must run.
        self.op_keys = self.op_keys_of(plan)
        self.root = list(range(len(tensors)))
        for op in ops:
            for alias in op.get("aliases", []):
                out = op["outputs"][alias["output"]]
                self.root[out] = self.root[op["inputs"][alias["input"]]]
        self.kind = [t["kind"] for t in tensors]
        self.bytes = [t["bytes"] for t in tensors]
        self.names = [t["name"] for t in tensors]
        phases = [op["phase"] for op in ops]
        self.backward_start = phases.index("backward") if "backward" in phases else self.n_ops
        self.optimizer_start = phases.index("optimizer") if "optimizer" in phases else self.n_ops
        self.at_start: list[Event] = []
        self.after: dict[int, list[Event]] = {}
        self.before: dict[int, list[Event]] = {}
        for e in plan.events:
            ev = Event(e["kind"], e["tensor"], e["tensor_name"])
            if e["trigger"] == "iteration_start":
                self.at_start.append(ev)
            elif e["trigger"] == "after":
                self.after.setdefault(e["trigger_op"], []).append(ev)
            else:
                self.before.setdefault(e["trigger_op"], []).append(ev)
        self.recomputes = [e for e in plan.events if e["kind"] == "recompute"]
        #: Storages the plan swaps in somewhere: a late fetch of one of them
        #: is a late prefetch, of any other a passive swap.
        self.prefetched = {e["tensor"] for e in plan.events if e["kind"] == "swap_in"}
        self.start_on_host = plan.start_on_host
        self.has_optimizer_state = "optimizer_state" in self.kind
        #: For the memory guard (``Applier(budget_bytes=)``): the storage
        #: roots each op reads or writes, the backward ops that read each
        #: root (in order), and each backward op's autograd node as the
        #: span of ops ``(first, last)`` that run it.
        self.op_roots = [{self.root[t] for t in (*op["inputs"], *op["outputs"])} for op in ops]
        self.backward_reads: dict[int, list[int]] = {}
        spans: dict[Any, list[int]] = {}
        for i in range(self.backward_start, self.optimizer_start):
            op = ops[i]
            for t in dict.fromkeys(self.root[t] for t in op["inputs"]):
                self.backward_reads.setdefault(t, []).append(i)
            node = op.get("attrs", {}).get(NODE_ATTR)
            if node is not None:
                span = spans.setdefault(node, [i, i])
                span[1] = i
        self._node_span = {
            i: (span[0], span[1])
            for i, op in enumerate(ops)
            if (node := op.get("attrs", {}).get(NODE_ATTR)) is not None and (span := spans.get(node))
        }

    def node_span(self, k: int) -> tuple[int, int]:
        """The ops ``(first, last)`` of the autograd node that runs backward
        op ``k``; ``(k, k)`` for an op without a recorded node."""
        return self._node_span.get(k, (k, k))

    @staticmethod
    def op_keys_of(plan: Plan) -> list[tuple[str, str]]:
        return [(op["type"], op.get("attrs", {}).get("overload", "default")) for op in plan.ops]

    def is_persistent(self, storage: int) -> bool:
        return self.kind[storage] in PERSISTENT

    def saved_storages(self) -> dict[int, tuple[int, int]]:
        """The activation storages autograd keeps for the backward pass:
        ``{root: (first op it counts after, end op)}`` for every root of kind ``activation``
        made in the forward pass (loss included) and read by at least one
        backward op.

        Autograd saves a tensor when an op that needs it for its backward
        runs: its producer (an op that saves its output, after the op) or a
        later op that reads it (its inputs are saved before the op runs, so
        they count from the op before). The graph does not say which op
        saves, so the *saving op* is the op before the first forward op
        that reads the storage other than to view it (``view``, ``t``: views
        save nothing), at the earliest the producer; a storage read only
        by ops that save nothing (a cast) is counted from that read
        although autograd saves it later. Autograd frees a node's
        saved tensors when the node's backward ends, so the *end op* is the
        last op of the autograd node (``@grad_fn``, recorded by the tracer)
        of the storage's last backward read; in a graph without it, that
        read."""
        first: dict[int, int] = {}
        saved_at: dict[int, int] = {}
        last: dict[int, tuple[int, int | None]] = {}
        node_end: dict[int, int] = {}
        for i, op in enumerate(self.plan.ops):
            if i < self.backward_start:
                view_inputs = {
                    op["inputs"][a["input"]] for a in op.get("aliases", []) if a["kind"] == "view"
                }
                only_views = len(op.get("aliases", [])) == len(op["outputs"]) and all(
                    a["kind"] == "view" for a in op.get("aliases", [])
                )
                for t in op["inputs"]:
                    r = self.root[t]
                    if r in first and r not in saved_at and not (only_views and t in view_inputs):
                        saved_at[r] = i
                for t in op["outputs"]:
                    r = self.root[t]
                    if self.kind[r] == "activation":
                        first.setdefault(r, i)
            elif i < self.optimizer_start:
                node = op.get("attrs", {}).get(NODE_ATTR)
                if node is not None:
                    node_end[node] = i
                for t in op["inputs"]:
                    r = self.root[t]
                    if r in first:
                        last[r] = (i, node)
        ends = {r: node_end.get(node, i) if node is not None else i for r, (i, node) in last.items()}
        return {r: (max(first[r], saved_at.get(r, first[r] + 1) - 1), ends[r]) for r in last}

    def predicted_saved_curve(self, after: dict[int, list[Event]] | None = None) -> list[int]:
        """The plan's prediction of the resident saved bytes after each op of
        the forward and backward passes (index ``k``: after op ``k`` and the
        events it triggers).

        A saved storage (:meth:`saved_storages`) counts from its producing op
        until its last backward read, except while the plan has it on the
        host: from the op whose ``after`` event swaps it out until the op
        whose event swaps it back in. Event delays are not modelled: the hook
        fires an op's events as soon as the op (and autograd's saving of its
        tensors) is done, and copies on the CPU finish before the next op.
        """
        saved = self.saved_storages()
        on_host: set[int] = set()
        for ev in self.at_start:
            self._apply(ev, on_host)
        starts: dict[int, list[int]] = {}
        for r, (p, _) in saved.items():
            starts.setdefault(p, []).append(r)
        live: set[int] = set()
        curve = []
        for k in range(self.optimizer_start):
            live.update(starts.get(k, []))
            for ev in (self.after if after is None else after).get(k, []):
                self._apply(ev, on_host)
            live = {r for r in live if saved[r][1] > k}
            curve.append(sum(self.bytes[r] for r in live if r not in on_host))
        return curve

    @staticmethod
    def _apply(ev: Event, on_host: set[int]) -> None:
        if ev.kind == "swap_out":
            on_host.add(ev.storage)
        elif ev.kind == "swap_in":
            on_host.discard(ev.storage)

    def vanilla_saved_curve(self) -> list[int]:
        """The same curve with no event applied (every saved tensor resident)."""
        saved = self.saved_storages()
        return [sum(self.bytes[r] for r, (p, last) in saved.items() if p <= k < last) for k in range(self.optimizer_start)]
