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
    #: When it is due, as a count of the graph's ops done: an ``after`` op
    #: ``k`` event once op ``k`` has run (``k + 1``), a ``before`` op ``k``
    #: event before op ``k`` runs (``k``), ``iteration_start`` at 0.
    due: int = 0
    #: Its place in the plan's event list (events due together keep it).
    order: int = 0


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
        self.events: list[Event] = []
        for i, e in enumerate(plan.events):
            trigger = e["trigger"]
            due = 0 if trigger == "iteration_start" else e["trigger_op"] + (trigger == "after")
            ev = Event(e["kind"], e["tensor"], e["tensor_name"], due, i)
            self.events.append(ev)
            if trigger == "iteration_start":
                self.at_start.append(ev)
            elif trigger == "after":
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
        #: The optimizer's update parameter by parameter, in update order:
        #: ``(parameter name, first op, last op)`` from the tracer's op names
        #: (``<parameter>.update.<op>``), and the persistent storages each
        #: parameter's ops read or write.
        self.opt_spans: list[tuple[str, int, int]] = []
        self.opt_needs: list[tuple[int, ...]] = []
        for i in range(self.optimizer_start, self.n_ops):
            param = ops[i]["name"].partition(".update.")[0]
            if self.opt_spans and self.opt_spans[-1][0] == param:
                self.opt_spans[-1] = (param, self.opt_spans[-1][1], i)
            else:
                self.opt_spans.append((param, i, i))
        for _, first, last in self.opt_spans:
            roots = {r for i in range(first, last + 1) for r in self.op_roots[i] if self.kind[r] in PERSISTENT}
            self.opt_needs.append(tuple(sorted(roots)))
        #: Storages the plan recomputes, and the producer of each root.
        self.recomputed = {e.storage for e in self.events if e.kind == "recompute"}
        self.producer: dict[int, int] = {}
        for i, op in enumerate(ops):
            for t in op["outputs"]:
                self.producer.setdefault(t, i)
        self._node_span = {
            i: (span[0], span[1])
            for i, op in enumerate(ops)
            if (node := op.get("attrs", {}).get(NODE_ATTR)) is not None and (span := spans.get(node))
        }

    def written_after_producer(self, storage: int) -> str | None:
        """The first op after ``storage``'s producer that writes it in place
        (re-running the producer alone would not rebuild that value), by
        label; None when none does."""
        made = self.producer.get(storage)
        if made is None:
            return None
        for i in range(made + 1, self.backward_start):
            op = self.plan.ops[i]
            for a in op.get("aliases", []):
                if a["kind"] == "in_place" and self.root[op["inputs"][a["input"]]] == storage:
                    return self.plan.op_label(i)
        return None

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

    def predicted_saved_curve(self, min_bytes: int = 0) -> list[int]:
        """The plan's prediction of the resident saved bytes after each op of
        the forward and backward passes (index ``k``: after op ``k`` and the
        events due then, those before op ``k + 1`` included).

        A saved storage (:meth:`saved_storages`) counts from its producing op
        until its last backward read, except while the plan has it off the
        device: from the event that swaps it out (or releases it for a
        recomputation) to the one that swaps it back in (or recomputes it).
        Event delays are not modelled: the hook fires an event as soon as
        its op (and autograd's saving of its tensors) is done. Only storages
        of at least ``min_bytes`` move, as in the hook.
        """
        saved = self.saved_storages()
        on_host: set[int] = set()
        starts: dict[int, list[int]] = {}
        for r, (p, _) in saved.items():
            starts.setdefault(p, []).append(r)
        pending = sorted((e for e in self.events if self.bytes[e.storage] >= min_bytes), key=lambda e: (e.due, e.order))
        i = 0
        live: set[int] = set()
        curve = []
        for k in range(self.optimizer_start):
            live.update(starts.get(k, []))
            while i < len(pending) and pending[i].due <= k + 1:
                self._apply(pending[i], on_host)
                i += 1
            live = {r for r in live if saved[r][1] > k}
            curve.append(sum(self.bytes[r] for r in live if r not in on_host))
        return curve

    def _apply(self, ev: Event, on_host: set[int]) -> None:
        """``on_host``: the storages off the device after ``ev`` (on the host,
        or released for a recomputation)."""
        if ev.kind == "swap_out" or (ev.kind == "release" and ev.storage in self.recomputed):
            on_host.add(ev.storage)
        elif ev.kind in ("swap_in", "recompute"):
            on_host.discard(ev.storage)

    def persistent_roots(self) -> list[int]:
        """The persistent storages the hook holds (parameters, buffers and
        optimizer state, host scalars such as Adam's step left out)."""
        return [
            r
            for r in sorted(set(self.root))
            if self.kind[r] in PERSISTENT and self.plan.tensors[r]["shape"] != [] and self.names[r]
        ]

    def predicted_managed_curve(self, min_bytes: int = 0) -> list[int]:
        """The plan's prediction of the bytes the hook holds on the device
        after each op of the whole iteration: the resident saved bytes
        (:meth:`saved_storages`) plus the persistent storages
        (:meth:`persistent_roots`), minus what the plan's events have on the
        host then (or released for a recomputation). Only storages of at
        least ``min_bytes`` move, as in the hook."""
        saved = self.saved_storages()
        persistent = self.persistent_roots()

        def moves(storage: int) -> bool:
            return self.bytes[storage] >= min_bytes

        off: set[int] = {s for s in self.start_on_host if moves(s)}
        starts: dict[int, list[int]] = {}
        for r, (p, _) in saved.items():
            starts.setdefault(p, []).append(r)
        pending = sorted((e for e in self.events if moves(e.storage)), key=lambda e: (e.due, e.order))
        i = 0
        live: set[int] = set()
        curve = []
        for k in range(self.n_ops):
            live.update(starts.get(k, []))
            while i < len(pending) and pending[i].due <= k + 1:
                ev = pending[i]
                if ev.kind == "swap_out" or (ev.kind == "release" and ev.storage in self.recomputed):
                    off.add(ev.storage)
                elif ev.kind in ("swap_in", "recompute"):
                    off.discard(ev.storage)
                i += 1
            live = {r for r in live if saved[r][1] > k}
            held = sum(self.bytes[r] for r in live if r not in off)
            curve.append(held + sum(self.bytes[r] for r in persistent if r not in off))
        return curve

    def vanilla_saved_curve(self) -> list[int]:
        """The same curve with no event applied (every saved tensor resident)."""
        saved = self.saved_storages()
        return [sum(self.bytes[r] for r, (p, last) in saved.items() if p <= k < last) for k in range(self.optimizer_start)]
