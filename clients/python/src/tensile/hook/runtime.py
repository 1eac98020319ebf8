"""The hook at work: Python only where the plan acts.

One training iteration runs from the model's forward call to the end of
``optimizer.step()``. The hook runs no Python per ATen op. It runs at the
points where Python runs anyway or where the plan needs it
(:mod:`tensile.hook.points`): the model's forward pre-hook (the iteration's
start, and its gate), the saved-tensor hooks (pack when autograd saves a
tensor, unpack when the backward pass takes it back), a forward pre-hook on
each module that holds a parameter or buffer, one point per chunk of the
optimizer's update, and the step's end. There it fires the plan's events,
in batches, and fetches what the next kernels need.

*Checked steps.* The first iteration is checked op by op: the
:class:`Applier`, a ``TorchDispatchMode`` for that step only, counts the
ATen ops the tracer counts, checks each against the graph's op at that
index (the same op, in the form traced or another form of it that
:mod:`tensile.hook.forms` lists, and the same output shapes), tags each
output with its graph tensor id, fires events at op boundaries, and records
the points with the op count at each. From that record every event is
placed on a point (:func:`tensile.hook.points.place`), and the next steps
run unchecked, each saved tensor compared with the record's (shape and
dtype: the step's fingerprint). A step that differs runs unplanned from
where it differs (a smaller last batch), said once, and the step after it
is checked again, which stops with :class:`PlanMismatchError` naming the op
if the model is not the one the plan was made for. A few ops the graph does
not have (a metric computed before ``backward()``, a wrapper's bookkeeping)
are stepped over in a checked step and counted; ``check="ops"`` checks every
step (for debugging).

* Saved tensors: pack gives autograd a handle for each planned activation
  storage (a :class:`Residence` keyed by the plan's storage id), which the
  plan's events move to the host and back or drop and rebuild; unpack
  returns the saved tensor, fetching or rebuilding it on demand (counted as
  late) when its event has not run.
* Parameters, buffers and optimizer state the plan moves are moved by
  pointing the tensor object's ``.data`` at the host copy and back, so the
  module and the optimizer keep their objects; a module's pre-hook, an
  unpack or an optimizer chunk brings them back before use.
* The optimizer's update runs as chunks of its parameter groups (the
  per-tensor update of each parameter depends only on that parameter), so
  the plan's moves of optimizer state happen between chunks.
* Recomputation: the producer of a storage the plan recomputes is recorded
  in the checked step; the storage is dropped at the plan's release and its
  producer re-run at the plan's recompute (or when it is unpacked), from
  the saved inputs, as checkpointing does.

The first ``optimizer.step()`` of a fresh optimizer creates its state, ops
the traced (later) iteration does not have: that step's optimizer ops are
neither checked nor planned. Ops between the end of the backward pass and
``optimizer.step()`` (gradient clipping) run unplanned and are counted.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tensile import _core
from tensile.hook import forms
from tensile.hook.base import process_device_bytes
from tensile.hook.gate import Gate, GateClock, gate_of, pace_of
from tensile.hook.points import CHUNK, END, KIND_NAMES, MODULE, NONE, PACK, START, UNPACK, Record, chunks_of, place
from tensile.hook.schedule import PERSISTENT, Event, Schedule
from tensile.hook.store import MIN_MOVE_BYTES, Residence, engine_for, view_of
from tensile.hook.timing import CudaOpTimer, Timed
from tensile.planning import Plan

if TYPE_CHECKING:
    from tensile.hook.session import Session

log = logging.getLogger("tensile.hook")

_UNCOUNTED = ("aten::_local_scalar_dense",)
_DETACH = ("aten::detach", "default")
#: Consecutive ops the graph does not have that a checked step steps over
#: in the forward and backward passes (a metric, a wrapper's copies); more
#: means the model is not the one the plan was made for.
MAX_EXTRA_OPS = 16
#: The most chunks the optimizer's update is split into (each one update
#: call: tens of microseconds of the host's time).
MAX_CHUNKS = 32
#: Optimizer classes whose update is per tensor when ``foreach`` and
#: ``fused`` are off, so that updating their parameter groups in chunks
#: gives the same values.
PER_TENSOR_OPTIMIZERS = ("SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSprop", "NAdam", "RAdam", "ASGD", "Rprop")

#: Steps after which the process's memory outside its tensors is measured
#: (the allocator has grown to its steady size by then).
BASE_AFTER_STEPS = 3

#: How a step runs: checked op by op, on the recorded points, or unplanned.
CHECKED, FAST, OFF = "checked", "fast", "off"


class PlanMismatchError(RuntimeError):
    """The training step does not run the ops the plan was made for."""


class PlanApplyError(RuntimeError):
    """The plan cannot be applied to this model and optimizer."""


class BudgetError(RuntimeError):
    """A saved tensor does not fit under ``budget_mb`` even with every saved
    tensor that can move on the host: the budget is below what one op needs."""


@dataclasses.dataclass
class IterationStats:
    """What the hook did in one iteration."""

    #: How the step ran: ``checked`` (op by op), ``fast`` (on the recorded
    #: points) or ``off`` (unplanned from the point it differed).
    mode: str = CHECKED
    ops: int = 0
    swap_outs: int = 0
    swap_ins: int = 0
    #: Storages dropped for a planned recomputation, and rebuilt.
    released: int = 0
    recomputed: int = 0
    #: Fetches and rebuilds on demand: a storage needed while the plan
    #: still had it on the host (or dropped).
    late: int = 0
    #: The storages fetched on demand, by name, in order.
    late_storages: list[str] = dataclasses.field(default_factory=list)
    #: Kept for the report's shape: prefetches the checked step moved (the
    #: points place every prefetch before its use; always 0).
    retimed: int = 0
    #: Of the late fetches: storages the plan prefetches (by id), the count
    #: of those it has no prefetch for, and the time spent fetching.
    late_prefetches: list[int] = dataclasses.field(default_factory=list)
    passive_swaps: int = 0
    stall_ns: int = 0
    #: Events with nothing to act on (a storage autograd did not save,
    #: releases left to autograd, storages too small to move, gradients).
    skipped: int = 0
    #: Swap-outs whose event came before autograd saved the storage, done
    #: once it was saved.
    deferred_swap_outs: int = 0
    #: Ops eager ran in another form than the traced one (checked steps).
    other_forms: dict[str, int] = dataclasses.field(default_factory=dict)
    #: The optimizer step was the state-creating first one (not checked).
    initializing: bool = False
    #: Ops the graph does not have, run as they are (checked steps): between
    #: the backward pass and ``optimizer.step()`` (gradient clipping), or
    #: stepped over (a metric before ``backward()``).
    untraced_ops: int = 0
    #: Resident saved bytes at each point (checked steps: after each op).
    saved_curve: list[int] = dataclasses.field(default_factory=list)
    #: Measured latency of each graph op in ns, by op id (checked steps): on
    #: the CPU the call's own time; on CUDA the time between timing events
    #: recorded around the call, read at the step's end.
    op_ns: dict[int, int] = dataclasses.field(default_factory=dict)
    #: The plan the iteration ran: its scheduler job id (0 for the plan
    #: given to ``tensile.apply``) and version.
    plan_job: int = 0
    plan_version: int = 0
    #: When the iteration started (``time.monotonic_ns()``, after its gate),
    #: how long its gate held it, and how long the plan's pace held it back.
    start_ns: int = 0
    gate_wait_ns: int = 0
    paced_ns: int = 0
    #: The memory guard (``budget_mb``): saved storages it moved to the host
    #: to make room, and prefetches it held back for want of room.
    guard_evictions: int = 0
    held_back: int = 0
    #: The most resident saved bytes at any moment.
    max_saved_bytes: int = 0
    #: The most bytes the hook held on the device at a point: resident saved
    #: bytes plus the parameters, buffers and optimizer state it holds.
    max_managed_bytes: int = 0
    #: Calls into the hook's Python this step: packs, unpacks, module
    #: pre-hooks, optimizer chunks and the step's start and end.
    calls: int = 0
    #: Saved tensors (packs) and event batches this step.
    packs: int = 0
    batches: int = 0
    #: Bytes the copy engine copied this step, both directions.
    copied_bytes: int = 0
    #: Where a step that differed from the plan's record did (one line).
    diverged: str = ""
    #: The device memory peak the step reports: on CUDA the caching
    #: allocator's peak of allocated bytes so far (every tensor of the
    #: process); on the CPU, where there is no allocator statistic, the most
    #: bytes the hook held (``max_managed_bytes``).
    device_peak_bytes: int = 0
    #: The op latencies the step reports to a scheduler: its own when it
    #: timed every op, else those of the last step before it that did.
    reported_ns: dict[int, int] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def peak_saved_bytes(self) -> int:
        """The most resident saved bytes at any moment of the step."""
        return max(max(self.saved_curve, default=0), self.max_saved_bytes)


class _Handle:
    """What autograd holds instead of a saved tensor the plan names."""

    __slots__ = ("applier", "res", "tensor", "meta", "point", "__weakref__")

    def __init__(self, applier: Applier, res: Residence, tensor: torch.Tensor, point: int) -> None:
        self.applier, self.res, self.tensor, self.meta, self.point = applier, res, tensor, None, point

    def __del__(self) -> None:
        if self.res.obj is None:
            self.applier._handle_gone(self.res, self)


class _Ref:
    """An argument of a recorded producer: a planned tensor by its storage."""

    __slots__ = ("storage", "meta", "persistent")

    def __init__(self, storage: int, meta: tuple[Any, ...], persistent: bool) -> None:
        self.storage, self.meta, self.persistent = storage, meta, persistent


class _Quiet:
    """The hook's own work: under its lock, and not counted as the user's
    ops by its dispatch mode (a checked step's)."""

    __slots__ = ("a",)

    def __init__(self, applier: Applier) -> None:
        self.a = applier

    def __enter__(self) -> None:
        a = self.a
        a.lock.acquire()
        a.busy += 1

    def __exit__(self, *exc: Any) -> None:
        a = self.a
        a.busy -= 1
        a.lock.release()


class Applier(TorchDispatchMode):
    """Applies one plan to the iterations run while it is active."""

    def __init__(
        self,
        plan: Plan,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        copies_complete_after: int = 0,
        budget_bytes: int | None = None,
        *,
        check: Literal["step", "ops"] = "step",
        copies: Literal["thread", "sync"] = "thread",
        min_move_bytes: int = MIN_MOVE_BYTES,
    ) -> None:
        super().__init__()
        if check not in ("step", "ops"):
            raise PlanApplyError(f"check must be 'step' or 'ops', not {check!r}")
        if budget_bytes is not None and (isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 1):
            raise PlanApplyError(f"budget_bytes must be a positive whole number of bytes, got {budget_bytes!r}")
        _refuse_compiled(model)
        #: A DistributedDataParallel's module is what the plan was made for;
        #: the wrapper broadcasts the buffers before each forward, so they
        #: never start an iteration on the host.
        model, self.distributed = _unwrap(model)
        self.check_ops = check == "ops"
        self.min_move_bytes = min_move_bytes
        self.s = Schedule(plan)
        gate, self.pace = _timing_of(plan, self.s.n_ops)
        #: Where the next iteration may start (None: the plan has no gate).
        self.gate_clock = None if gate is None else GateClock(gate)
        #: The most resident saved bytes the hook may hold (None: no limit).
        self.budget_bytes = budget_bytes
        self.plan, self.model, self.optimizer = plan, model, optimizer
        self.device = _device_of(model)
        _check_per_tensor(optimizer, self.device)
        try:
            self.engine = engine_for(self.device, copies_complete_after, copies)
        except ValueError as e:
            raise PlanApplyError(str(e)) from None
        self.measure = self.device.type == "cpu"
        #: Times ops on CUDA in checked steps (None on the CPU, which times
        #: the call itself); set it to None to time nothing.
        self.timer: CudaOpTimer | None = CudaOpTimer(self.device) if self.device.type == "cuda" else None
        self.lock = threading.RLock()
        self.quiet = _Quiet(self)
        #: Inside the hook's own work (its ops are not the user's), inside
        #: the dispatch mode's handler, and a pop of the mode owed (it cannot
        #: pop itself from its own handler).
        self.busy = 0
        self.dispatching = False
        self.exit_due = False
        self.by_name = {
            t["name"]: t["id"] for t in plan.tensors if t["kind"] in PERSISTENT and self.s.root[t["id"]] == t["id"]
        }
        self.persist: dict[int, Residence] = {}
        self.acts: dict[int, Residence] = {}
        #: Chain intermediates a recomputation rebuilt that autograd did not
        #: save (held until the plan releases them or the step ends).
        self.rebuilt: dict[int, torch.UntypedStorage] = {}
        #: Activation storages the plan has on the host now, and those
        #: autograd saved while it had them there (moved at the next point).
        self.planned_host: set[int] = set()
        self.overdue: list[Residence] = []
        self.resident = 0
        self.persist_resident = 0
        #: Prefetches the guard held back, in the order they fired, and the
        #: storages it moved or held this iteration.
        self.deferred: list[Event] = []
        self.guarded: set[int] = set()
        self.iter_start_ns = 0
        self.inflight: set[Residence] = set()
        #: Checked steps: graph ops done, the op whose events are pending,
        #: consecutive ops stepped over.
        self.k = 0
        self.pending: int | None = None
        self.extra_run = 0
        self.first_extra: str | None = None
        self.in_iter = False
        self.mode = CHECKED
        self.entered = False  # the dispatch mode is pushed (a checked step)
        self.broken: str | None = None
        self.in_step = False  # inside optimizer.step()
        self.fresh_step = False
        self.stats: list[IterationStats] = []
        #: The plan's ``after`` events for checked steps.
        self.after = {k: list(evs) for k, evs in self.s.after.items()}
        #: (scheduler job id, version) of the plan in use; job 0: the plan
        #: given to ``tensile.apply``.
        self.plan_id = (0, int(plan.plan.get("version", 0)))
        #: The scheduler session (``tensile.apply(..., server=...)``), if any.
        self.session: Session | None = None
        #: The points of the last checked step and the events placed on them.
        self.record: Record | None = None
        self.building: Record | None = None
        self.kinds: list[int] = []
        self.keys: list[Any] = []
        self.storages: list[int] = []
        self.clocks: list[int] = []
        self.fire_at: list[list[Event]] = []
        #: Per module and per optimizer chunk, the persistent storages it needs.
        self.module_res: list[list[Residence]] = []
        self.chunk_res: list[list[Residence]] = []
        self.need_points: dict[int, list[int]] = {}
        self.point = 0
        self.recheck = False
        #: Recorded producers of the storages the plan recomputes.
        self.recipes: dict[int, tuple[Any, tuple[Any, ...], dict[str, Any]]] = {}
        self.refused_recomputes = self._refused_recomputes(self.s)
        #: Said once each: the ways a step differed.
        self.said: set[str] = set()
        #: Op latencies of the last fully timed step (for the scheduler).
        self.last_op_ns: dict[int, int] = {}
        #: The process's device memory outside its tensors, measured on CUDA
        #: after the first steps and again after each plan switch (None: not
        #: measured); the step at whose start the next measuring step begins,
        #: and, during that step, the most its tensors held at a point.
        self.base_bytes: int | None = None
        self.base_at: int | None = BASE_AFTER_STEPS - 1 if self.device.type == "cuda" else None
        self.window_peak: int | None = None
        #: Parameters with optimizer state when it was last registered.
        self.state_count = -1
        self._register_module_tensors()
        #: The model's own parameters and buffers (not its submodules'),
        #: needed when the iteration starts.
        self.root_needs: tuple[int, ...] = ()
        self.modules = self._owning_modules()
        self.chunks: list[tuple[int, list[tuple[int, list[nn.Parameter]]]]] = []
        self.chunk_needs: list[tuple[int, tuple[int, ...]]] = []
        self.split_groups: list[dict[str, Any]] | None = None
        self.saved_groups: list[dict[str, Any]] | None = None
        self.chunking = self._chunkable()
        self._plan_chunks()

    # -- setup -----------------------------------------------------------

    def _register_module_tensors(self) -> None:
        graph_params = {n for n, tid in self.by_name.items() if self.s.kind[tid] == "parameter"}
        model_params = {n for n, p in self.model.named_parameters() if p.requires_grad}
        if graph_params != model_params:
            extra = sorted(model_params - graph_params)
            missing = sorted(graph_params - model_params)
            what = f"has parameter {extra[0]!r} the plan does not" if extra else f"lacks parameter {missing[0]!r}"
            raise PlanApplyError(f"the model {what}: it is not the model the plan was made for (plan it again)")
        for n, t in [*self.model.named_parameters(), *self.model.named_buffers()]:
            self._register(n, t)

    def _register(self, name: str, t: torch.Tensor) -> None:
        tid = self.by_name.get(name)
        if tid is None or tid in self.persist:
            return
        want = self.plan.tensors[tid]
        if t.dim() == 0:
            return  # host scalars (Adam's step): read through .item() between ops, not worth moving
        if list(t.shape) != want["shape"]:
            raise PlanApplyError(f"{name!r} has shape {list(t.shape)}, the plan's has {want['shape']} (plan it again)")
        storage = t.untyped_storage()
        res = Residence(tid, name, t.device, storage.nbytes())
        res.dev = storage
        res.obj = t
        res.meta = (t.dtype, t.storage_offset(), t.size(), t.stride())
        t._tensile_res = res
        t._tensile_tid = tid
        self.persist[tid] = res
        self.persist_resident += res.nbytes

    def register_optimizer_state(self) -> None:
        self.state_count = len(self.optimizer.state)
        names = {id(p): n for n, p in self.model.named_parameters()}
        for p, state in self.optimizer.state.items():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device == self.device and id(p) in names:
                    self._register(f"{names[id(p)]}.{key}", value)
        if self.record is not None:
            self._place()  # the points' lists of what can move name the new storages too

    def _owning_modules(self) -> list[tuple[nn.Module, tuple[int, ...]]]:
        """Each module that holds a planned parameter or buffer itself, with
        those storages: its forward pre-hook is where they must be on the
        device."""
        out = []
        for prefix, module in self.model.named_modules():
            own = [
                self.by_name[f"{prefix}.{n}" if prefix else n]
                for n, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
                if (f"{prefix}.{n}" if prefix else n) in self.by_name
            ]
            if own and module is not self.model:
                out.append((module, tuple(sorted(own))))
            elif own:
                self.root_needs = tuple(sorted(own))
        return out

    def _chunkable(self) -> bool:
        opt = self.optimizer
        return (
            type(opt).__name__ in PER_TENSOR_OPTIMIZERS
            and hasattr(opt, "_init_group")
            and not any(g.get("capturable") or g.get("differentiable") for g in opt.param_groups)
        )

    def _plan_chunks(self) -> None:
        """Splits the optimizer's update into chunks where the plan moves
        persistent storages in it (``points.chunks_of``)."""
        self.chunks, self.chunk_needs = [], []
        if not self.chunking or not self.s.opt_spans:
            return
        params = dict(self.model.named_parameters())
        group_of = {id(p): i for i, g in enumerate(self.optimizer.param_groups) for p in g["params"]}
        spans, moved, objs = [], [], []
        moving = {e.storage for e in self.s.events if self.s.optimizer_start <= e.due <= self.s.n_ops} | set(self.s.start_on_host)
        for (name, first, last), needs in zip(self.s.opt_spans, self.s.opt_needs):
            p = params.get(name)
            if p is None or id(p) not in group_of:
                self.chunks, self.chunk_needs = [], []
                return  # the update's ops are not the parameters' (not per tensor): run it whole
            spans.append((group_of[id(p)], first, last))
            moved.append(sum(self.s.bytes[r] for r in needs if r in moving and self.s.bytes[r] >= self.min_move_bytes))
            objs.append(p)
        order = [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]
        if [id(p) for p in objs] != [id(p) for p in order if id(p) in {id(o) for o in objs}]:
            return  # not in the update's order: run it whole
        for a, b in chunks_of(spans, moved, MAX_CHUNKS):
            needs = tuple(sorted({r for i in range(a, b) for r in self.s.opt_needs[i]}))
            self.chunk_needs.append((spans[a][1], needs))
            self.chunks.append((spans[a][0], objs[a:b]))
        if len(self.chunks) <= len({g for g, _, _ in spans}) and not moved or sum(moved) == 0:
            self.chunks, self.chunk_needs = [], []  # nothing moves in the update: run it whole

    def _refused_recomputes(self, s: Schedule) -> set[int]:
        """The storages the plan recomputes that eager PyTorch cannot
        rebuild here (said once, before training): they stay on the device."""
        refused: dict[int, str] = {}
        saved = set(s.saved_storages())
        for sid in sorted(s.recomputed):
            writer = s.written_after_producer(sid)
            op = s.producer.get(sid)
            if writer is not None:
                refused[sid] = f"{writer} writes it in place after its producer"
            elif op is None:
                refused[sid] = "it has no producer"
            else:
                for t in self.plan.ops[op]["inputs"]:
                    r = s.root[t]
                    if s.kind[r] not in PERSISTENT and r not in saved and r not in s.recomputed:
                        refused[sid] = f"its producer's input {s.names[r]!r} is not saved by autograd"
                        break
        if refused:
            sid, why = next(iter(refused.items()))
            log.warning(
                "tensile: the plan recomputes %d storages that eager PyTorch cannot rebuild here (%r: %s); "
                "they stay on the device",
                len(refused),
                s.names[sid],
                why,
            )
        return set(refused)

    def start(self) -> None:
        """Entering ``apply``: the plan's ``start_on_host`` storages go to the host."""
        self.register_optimizer_state()
        with self.quiet:
            self._park_start_on_host()

    def finish(self) -> None:
        """Leaving ``apply``: every persistent tensor back on the device."""
        with self.quiet:
            self._leave_iteration()
            for res in list(self.inflight):
                self._settle(res, wait=True)
            off = [r for r in self.persist.values() if not r.on_device]
            if off:
                self._persist_in(off)
            for res in self.persist.values():
                self._settle(res, wait=True)
                self._point_obj_at_device(res)
                obj = res.obj
                for attr in ("_tensile_res", "_tensile_tid"):
                    if hasattr(obj, attr):
                        delattr(obj, attr)
            self.engine.close()

    def _leave_iteration(self) -> None:
        """Ends an iteration that did not reach its step's end (an error):
        the dispatch mode off, the optimizer's groups restored."""
        self._exit_mode()
        self._restore_groups()
        self.in_iter = False

    # -- iteration boundaries (module and optimizer hooks) ---------------

    def forward_pre_hook(self, module: nn.Module, args: Any) -> None:
        if self.broken is not None:
            raise PlanApplyError(f"the plan no longer applies ({self.broken}); leave the tensile.apply block")
        if self.in_iter or not torch.is_grad_enabled() or not module.training:
            return  # evaluation passes are not training iterations
        if self.entered or self.exit_due or self.split_groups is not None:
            self._leave_iteration()  # the last one ended in an error
        if not self.stats and self.session is not None:
            self._await_admission(self.session)
        waited = self._wait_for_gate()
        if self.timer is not None:
            self.timer.clear()
        self.iter_start_ns = time.monotonic_ns()
        n = len(self.stats)
        if self.base_at == n:
            self.base_at, self.window_peak = None, 0  # this step measures the base
        # The second step is checked too, and timed, when a scheduler takes
        # its latencies or the plan is coordinated with other jobs.
        timed = n == 1 and (self.session is not None or self.gate_clock is not None or bool(self.pace))
        if self.record is None or self.recheck or self.check_ops or timed:
            self.mode = CHECKED
        else:
            self.mode = FAST
        self.in_iter, self.k, self.pending, self.in_step, self.fresh_step = True, 0, None, False, False
        self.extra_run, self.first_extra = 0, None
        self.acts, self.resident, self.rebuilt = {}, 0, {}
        self.planned_host, self.overdue = set(), []
        self.deferred, self.guarded = [], set()
        self.point = 0
        self.stats.append(
            IterationStats(
                mode=self.mode,
                plan_job=self.plan_id[0],
                plan_version=self.plan_id[1],
                start_ns=self.iter_start_ns,
                gate_wait_ns=waited,
                calls=1,
            )
        )
        with self.quiet:
            if self.mode == CHECKED:
                self.building = Record()
                self.building.add(START, 0, needs=self.root_needs)
                self._fire_now(self.s.at_start)
                self.entered = True
                self.__enter__()
            else:
                self.point = 1
                self._fire_now(self.fire_at[0])
            for sid in self.root_needs:
                self._persist_ready(self.persist[sid])

    def _await_admission(self, session: Session) -> None:
        """The first step of a block with a scheduler: a job the scheduler
        queued (the others leave its budget no room) waits here until it is
        admitted, saying why every 30 s, and then trains on the scheduler's
        plan, never on one the scheduler has not admitted. A scheduler that
        does not answer within 5 s, or is lost while the job waits, is not
        waited for: training goes on with the plan given (the session
        warns)."""
        started = time.monotonic()
        while session.job is None and session.last_error is None and time.monotonic() - started < 5.0:
            time.sleep(0.01)
        job = session.job
        if job is None:
            return
        said_at = 0.0
        while session.state == "JOB_STATE_QUEUED" and session.last_error is None:
            waited = time.monotonic() - started
            if waited >= said_at:
                reason = session.job.reason if session.job is not None else ""
                log.warning(
                    "tensile: the scheduler queued job %d (%s): its first step waits until it is admitted "
                    "(%.0f s so far; leave the block to give up)",
                    job.id,
                    reason or "no room in its budget",
                    waited,
                )
                said_at = waited + 30.0
            if session.wait_for_plan(1.0, other_than=(0, 0)) is not None:
                break
        if session.state in ("JOB_STATE_ACTIVE", "JOB_STATE_PLANNING"):
            session.wait_for_plan(5.0, other_than=(0, 0))
        pushed = session.take_plan()
        if pushed is not None:
            self._adopt(pushed)
        waited = time.monotonic() - started
        if waited > 1.0:
            log.warning("tensile: job %d admitted after %.1f s; training starts", job.id, waited)

    def _adopt(self, pushed: Any) -> None:
        """A plan the scheduler pushed, applied from the next step on (said
        when it does not meet the scheduler's budget)."""
        try:
            self.use_plan(pushed.plan, job_id=pushed.job_id)
        except (PlanApplyError, PlanMismatchError) as e:
            log.warning("tensile: plan version %d of job %d refused: %s", pushed.version, pushed.job_id, e)
            return
        for d in pushed.plan.plan.get("diagnostics", []):
            if d.get("kind") == "over_budget":
                log.warning("tensile: the scheduler's plan version %d for job %d: %s", pushed.version, pushed.job_id, d.get("message", ""))

    def _wait_for_gate(self) -> int:
        """Holds an iteration ready now until its gate's slot; returns the ns waited."""
        clock = self.gate_clock
        if clock is None:
            return 0
        ready = time.monotonic_ns()
        start = clock.start_at(ready)
        if start <= ready:
            return 0
        _sleep_until(start)
        return time.monotonic_ns() - ready

    def module_pre_hook(self, index: int) -> Any:
        """The forward pre-hook of the ``index``-th module holding planned
        parameters or buffers: they must be on the device now."""

        def hook(module: nn.Module, args: Any) -> None:
            if not self.in_iter:
                return
            stats = self.stats[-1]
            stats.calls += 1
            needs = self.modules[index][1]
            with self.quiet:
                if self.mode == FAST and not self._at(MODULE, index):
                    return
                if self.mode == CHECKED:
                    self._flush()
                    if self.building is not None:
                        self.building.add(MODULE, self.k, key=index, needs=needs)
                    for sid in needs:
                        res = self.persist.get(sid)
                        if res is not None:
                            self._persist_ready(res)
                else:
                    for res in self.module_res[index]:
                        if res.copy is not None or res.dev is None or not res.obj_on_dev:
                            self._persist_ready(res)

        return hook

    def step_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.in_iter:
            return
        self.in_step = True
        stats = self.stats[-1]
        stats.calls += 1
        fresh = self.s.has_optimizer_state and any(
            len(self.optimizer.state.get(p, {})) == 0 for g in self.optimizer.param_groups for p in g["params"]
        )
        with self.quiet:
            if self.mode == CHECKED:
                self._flush()
                if self.k != self.s.optimizer_start:
                    raise self._fail(self._mismatch(self.k, "optimizer.step()"))
                if fresh:
                    # An optimizer with state (Adam's moments) creates it in
                    # its first step, ops the graph does not have.
                    self.fresh_step = True
                    stats.initializing = True
                    self._fetch_all()
                    self._exit_mode()
            elif self.mode == FAST and self.chunks and not fresh:
                self._split_groups()
            else:
                self._fetch_all()

    def _fetch_all(self) -> None:
        """Every persistent storage on the device (an update run whole)."""
        off = [r for r in self.persist.values() if not r.on_device and r.copy is None and r.host is not None]
        if off:
            self._persist_in(off)
        for res in self.persist.values():
            self._persist_ready(res)

    def _split_groups(self) -> None:
        """The optimizer's groups, split into this plan's chunks for this
        step's update; a wrapper of ``_init_group`` marks each chunk's start."""
        opt = self.optimizer
        self.saved_groups = list(opt.param_groups)
        split = []
        for gi, params in self.chunks:
            group = dict(self.saved_groups[gi])
            group["params"] = params
            split.append(group)
        self.split_groups = split
        first = {id(g): i for i, g in enumerate(split)}
        inner = type(opt)._init_group

        def init_group(group: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            i = first.get(id(group))
            if i is not None and self.in_iter:
                self._chunk(i)
            return inner(opt, group, *args, **kwargs)

        opt._init_group = init_group  # type: ignore[method-assign]
        opt.param_groups = split

    def _restore_groups(self) -> None:
        if self.split_groups is None:
            return
        opt = self.optimizer
        opt.param_groups = self.saved_groups  # type: ignore[assignment]
        for group, (gi, _) in zip(self.split_groups, self.chunks):
            original = self.saved_groups[gi]  # type: ignore[index]
            for key, value in group.items():
                if key != "params" and original.get(key) is not value:
                    original[key] = value  # an optimizer that writes its group
        if "_init_group" in opt.__dict__:
            del opt._init_group
        self.split_groups = self.saved_groups = None

    def _chunk(self, i: int) -> None:
        """The start of the optimizer's ``i``-th chunk."""
        stats = self.stats[-1]
        stats.calls += 1
        with self.quiet:
            if self.mode == FAST and not self._at(CHUNK, i):
                return
            for res in self.chunk_res[i]:
                if res.copy is not None or res.dev is None or not res.obj_on_dev:
                    self._persist_ready(res)

    def step_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.in_iter:
            return
        stats = self.stats[-1]
        stats.calls += 1
        with self.quiet:
            self._restore_groups()
            if len(self.optimizer.state) != self.state_count:
                self.register_optimizer_state()  # the first step with state made it
            if self.mode == CHECKED:
                if not self.fresh_step:
                    self._flush()
                    if self.k != self.s.n_ops:
                        raise self._fail(self._mismatch(self.k, "nothing more (the step ended)"))
                self._exit_mode()
                self._fire_now([ev for k in range(self.k, self.s.n_ops) for ev in self.s.before.get(k, [])])
                self._end_checked()
            elif self.mode == FAST:
                self._at(END, None)
            self._park_start_on_host()
            self._swap_out_overdue()
            if self.timer is not None and stats.mode == CHECKED:
                stats.op_ns.update(self.timer.resolve())
            if len(stats.op_ns) == self.s.n_ops:
                self.last_op_ns = dict(stats.op_ns)
            stats.reported_ns = self.last_op_ns
            stats.device_peak_bytes = (
                torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else stats.max_managed_bytes
            )
            if self.window_peak is not None:
                self._measure_base()
            self._sample()
        stats.ops = self.k if stats.mode == CHECKED else self.s.n_ops if stats.mode == FAST else 0
        stats.batches = self.engine.batches - getattr(self, "_batches_before", 0)
        self._batches_before = self.engine.batches
        stats.copied_bytes = self.engine.copied_bytes - getattr(self, "_copied_before", 0)
        self._copied_before = self.engine.copied_bytes
        self.in_iter = False
        if self.session is not None:
            self._report_and_switch(self.session)

    def _measure_base(self) -> None:
        """At the end of a measuring step on CUDA: the process's device
        memory outside its tensors (``tensile.hook.base``: what the driver
        counts for the process less the most its tensors held at the step's
        points), reported from now on; said once when it cannot be measured
        (the scheduler then plans its profile's figure)."""
        peak, self.window_peak = self.window_peak, None
        used, why = process_device_bytes(self.device)
        if used is None:
            if self.base_bytes is None and "base" not in self.said:
                self.said.add("base")
                log.warning(
                    "tensile: this process's device memory outside its tensors cannot be measured (%s); the "
                    "scheduler plans its device profile's figure",
                    why,
                )
            return
        self.base_bytes = max(0, used - max(peak or 0, torch.cuda.memory_allocated(self.device)))

    def _measure_base_after(self, steps: int) -> None:
        """Measures the base again ``steps`` steps from now, after the
        allocator gives back the blocks it cached (a plan's switch: blocks an
        earlier, larger plan reserved would count as base, and a scheduler
        planning with that figure would shrink the plan, which would grow
        the slack it measures next)."""
        if self.device.type != "cuda":
            return
        torch.cuda.empty_cache()
        self.base_at = len(self.stats) + steps

    def _exit_mode(self) -> None:
        """Pops the dispatch mode (a checked step is over), or owes it when
        called from the mode's own handler."""
        if self.entered:
            self.entered = False
            self.exit_due = True
        if self.exit_due and not self.dispatching:
            self.exit_due = False
            self.__exit__(None, None, None)

    def _end_checked(self) -> None:
        """After a checked step: its points become the record later steps
        run on (``points.place`` puts the plan's events on them)."""
        rec, self.building = self.building, None
        if rec is None or self.stats[-1].diverged:
            return
        self.record = rec
        self.recheck = False
        self._place()

    def _place(self) -> None:
        """Places the plan's events on the record's points."""
        assert self.record is not None
        rec = self.record.ended(self.chunk_needs, self.s.n_ops)
        skip = {s for s in range(len(self.s.bytes)) if self.s.bytes[s] < self.min_move_bytes} | self.refused_recomputes
        skip |= {s for s in range(len(self.s.kind)) if self.s.kind[s] == "gradient"}
        events = [e for e in self.s.events if e.kind != "release" or e.storage in self.s.recomputed]
        self.fire_at = place(events, rec, skip=skip, out_at_start=self._parked())
        self.kinds, self.keys, self.storages, self.clocks = rec.kinds, rec.keys, rec.storages, rec.clocks
        # Each module's and chunk's persistent storages, looked up once.
        self.module_res = [[self.persist[s] for s in needs if s in self.persist] for _, needs in self.modules]
        self.chunk_res = [[self.persist[s] for s in needs if s in self.persist] for _, needs in self.chunk_needs]
        self.need_points = {}
        for p, (kind, needs) in enumerate(zip(rec.kinds, rec.needs)):
            for sid in needs:
                self.need_points.setdefault(sid, []).append(p)
            if kind == UNPACK and rec.storages[p] != NONE:
                self.need_points.setdefault(rec.storages[p], []).append(p)

    def _at(self, kind: int, key: Any) -> bool:
        """A fast step reaches its next point: checks it is the recorded one
        (kind and key) and fires its events. False when the step has
        differed from the record (the rest of it then runs unplanned)."""
        p = self.point
        if p >= len(self.kinds) or self.kinds[p] != kind or (key is not None and self.keys[p] != key):
            self._diverge(p, kind, key)
            return False
        self.point = p + 1
        if self.pace:
            self._keep_pace(p)
        if self.inflight:
            self._poll()  # what has landed frees its bytes before anything new comes
        evs = self.fire_at[p]
        if evs or self.overdue or self.deferred:
            self._fire_now(evs)
        self._sample()
        return True

    def _keep_pace(self, p: int) -> None:
        """A coordinated plan's pace at point ``p``: nothing after it starts
        before the planned start of the op its clock names."""
        k = min(self.clocks[p], len(self.pace) - 1)
        due = self.iter_start_ns + self.pace[k]
        now = time.monotonic_ns()
        if due > now:
            _sleep_until(due)
            self.stats[-1].paced_ns += time.monotonic_ns() - now

    def _diverge(self, p: int, kind: int, key: Any) -> None:
        """The step is not the recorded one from point ``p``: the rest of it
        runs unplanned, and the next step is checked again."""
        want = f"{KIND_NAMES[self.kinds[p]]} {self.keys[p]!r}" if p < len(self.kinds) else "the end of the record"
        got = f"{KIND_NAMES[kind]} {key!r}"
        why = f"point {p}: the plan's record has {want}, the step reached {got}"
        stats = self.stats[-1]
        stats.mode = OFF
        stats.diverged = why
        self.mode = OFF
        self.recheck = True
        # Storages the plan had on the host come back (nothing fetches them
        # on a schedule any more).
        back = [r for r in self.persist.values() if not r.on_device and r.copy is None and r.host is not None]
        if back:
            self._persist_in(back)
        first = why.split(":")[0] if kind != PACK else f"shape {key!r}"
        if first not in self.said:
            self.said.add(first)
            log.warning(
                "tensile: step %d differs from the plan's (%s); it runs unplanned from there and the next step is "
                "checked op by op. A smaller last batch does this: pass drop_last=True to the DataLoader, or plan "
                "for that batch too",
                len(self.stats) - 1,
                why,
            )

    def _report_and_switch(self, session: Session) -> None:
        """The step boundary with a scheduler: the step's report goes to the
        session's queue, and a newer plan, if one arrived, is applied now."""
        pushed = session.iteration_done(self.measurements(-1))
        if pushed is not None:
            self._adopt(pushed)

    def use_plan(self, plan: Plan, *, job_id: int = 0) -> None:
        """Switches to ``plan`` from the next iteration on. Only between
        iterations (never inside one), and only a plan of the same graph: a
        plan whose op sequence differs is refused with
        :class:`PlanMismatchError` naming the first differing op. Persistent
        tensors the old plan kept on the host across iterations and the new
        one does not come back to the device now; the new plan's go to the
        host."""
        if not isinstance(plan, Plan):
            raise PlanApplyError(f"plan is a {type(plan).__name__}, not a tensile Plan")
        if self.in_iter:
            raise PlanApplyError("a plan is switched between iterations, not inside one (after optimizer.step())")
        diff = _graph_difference(self.plan, plan)
        if diff is not None:
            raise PlanMismatchError(f"the new plan is not for the graph being applied ({self.plan.graph['name']!r}): {diff}")
        s = Schedule(plan)
        gate, pace = _timing_of(plan, s.n_ops, "the new plan")
        with self.quiet:
            for res in list(self.inflight):
                self._settle(res, wait=True)
            keep = set(s.start_on_host)
            back = [r for sid, r in self.persist.items() if sid not in keep and not r.on_device]
            if back:
                self._persist_in(back)
                for r in back:
                    self._settle(r, wait=True)
                    self._point_obj_at_device(r)
            self.s, self.plan = s, plan
            self.after = {k: list(evs) for k, evs in s.after.items()}
            self.refused_recomputes = self._refused_recomputes(s)
            self._plan_chunks()
            if self.record is not None:
                self._place()
            self._park_start_on_host()
        self.plan_id = (job_id, int(plan.plan.get("version", 0)))
        self._measure_base_after(BASE_AFTER_STEPS)
        # As the simulator takes a plan: the same gate keeps its slots,
        # another one places them afresh, none runs free.
        self.pace = pace
        if gate is None or self.gate_clock is None:
            self.gate_clock = None if gate is None else GateClock(gate)
        else:
            self.gate_clock.set_gate(gate)

    def _parked(self) -> list[int]:
        """The storages the plan starts iterations with on the host that the
        hook parks there (a DistributedDataParallel's buffers excepted)."""
        return [sid for sid in self.s.start_on_host if not (self.distributed and self.s.kind[sid] == "buffer")]

    def _park_start_on_host(self) -> None:
        out = [
            r
            for sid in self._parked()
            if (r := self.persist.get(sid)) is not None and r.on_device and r.copy is None and r.nbytes >= self.min_move_bytes
        ]
        if out:
            self._persist_out(out)

    # -- the dispatch mode (checked steps) --------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.busy or not self.in_iter or self.mode != CHECKED:
            return func(*args, **kwargs)
        self.dispatching = True
        try:
            return self._dispatch(func, args, kwargs)
        finally:
            self.dispatching = False

    def _dispatch(self, func: Any, args: Any, kwargs: Any) -> Any:
        flat = _tensors(kwargs, _tensors(args, [])) if kwargs else _tensors(args, [])
        with self.lock:
            self._flush()
            self._fetch_persistent(flat)
            if self.k == self.s.optimizer_start and not self.in_step:
                # Between the end of the backward pass and optimizer.step():
                # the user's own ops (gradient clipping, scaling), not traced.
                self.stats[-1].untraced_ops += 1
                return func(*args, **kwargs)
            self._skip_saved_detaches(func)
            k = self.k
            if k < self.s.n_ops:
                self._fire_now(self.s.before.get(k, []))
        if k < len(self.pace):
            # A coordinated plan's pace: no op starts before its planned
            # time in the iteration.
            due = self.iter_start_ns + self.pace[k]
            now = time.monotonic_ns()
            if due > now:
                _sleep_until(due)
                self.stats[-1].paced_ns += time.monotonic_ns() - now
        timer = self.timer
        timed = timer.begin() if timer is not None else None
        started = time.perf_counter_ns()
        out = func(*args, **kwargs)
        elapsed = time.perf_counter_ns() - started
        if timer is not None and timed is not None:
            timer.end(timed)
        outs = _tensors(out, []) if isinstance(out, (torch.Tensor, list, tuple)) else []
        if not _counted(func, flat, outs):
            self._untimed(timed)
            return out
        if (func._schema.name, func._overloadname) == _DETACH and not self._traced_detach(k, outs):
            # A detach the trace does not have (autograd's, around saved
            # tensors): a view, so it takes its input's storage and no index.
            self._untimed(timed)
            tid = getattr(args[0], "_tensile_tid", None)
            if tid is not None:
                out._tensile_tid = tid
            return out
        verdict = self._check(k, func, outs)
        if verdict != "ok":
            self._untimed(timed)
            return out
        self.extra_run = 0
        if self.measure:
            self.stats[-1].op_ns[k] = elapsed
        elif timer is not None and timed is not None:
            timer.keep(k, timed)
        if k < self.s.backward_start:
            # Only the forward's tensors are ever saved for the backward. An
            # op run in another form may return a persistent tensor it
            # traced as a new one: that tensor keeps its own id.
            for t, tid in zip(outs, self.plan.ops[k]["outputs"]):
                if getattr(t, "_tensile_res", None) is None:
                    t._tensile_tid = tid
            root = self.s.root[self.plan.ops[k]["outputs"][0]] if self.plan.ops[k]["outputs"] else None
            if root is not None and root in self.s.recomputed and root not in self.refused_recomputes:
                self._record_recipe(root, func, args, kwargs)
        self.k = k + 1
        self.pending = k
        return out

    def _untimed(self, timed: Timed | None) -> None:
        if timed is not None and self.timer is not None:
            self.timer.drop(timed)

    def _traced_detach(self, k: int, outs: list[torch.Tensor]) -> bool:
        """Whether a detach eager ran is the graph's op ``k``: a detach of
        the same shape (autograd detaches saved tensors on its own, and which
        ones depends on the saved-tensor hooks, which the trace has none of)."""
        if k >= self.s.n_ops or self.s.op_keys[k] != _DETACH:
            return False
        want = [self.plan.tensors[t]["shape"] for t in self.plan.ops[k]["outputs"]]
        return want == [list(t.shape) for t in outs]

    def _skip_saved_detaches(self, func: Any) -> None:
        """Steps over the graph's ``detach`` ops that this run does not have
        (with saved-tensor hooks installed autograd runs none): a detach is
        a view (no bytes), so its events fire here."""
        name = func._schema.name
        if name == "aten::detach" or name.startswith("profiler::") or name in _UNCOUNTED:
            return
        while self.k < self.s.n_ops and self.s.op_keys[self.k] == _DETACH:
            if self.measure or self.timer is not None:
                self.stats[-1].op_ns[self.k] = 0  # not run at all
            self.pending = self.k
            self.k += 1
            self._flush()

    def _check(self, k: int, func: Any, outs: list[torch.Tensor]) -> str:
        """``ok`` when the call is graph op ``k``; ``extra`` when it is an op
        the graph does not have, stepped over; raises when the model is not
        the one the plan was made for. A call with other output shapes than
        op ``k``'s stops the plan for the rest of the step."""
        name = func._schema.name
        key = (name, func._overloadname)
        stats = self.stats[-1]
        traced = self.s.op_keys[k] if k < self.s.n_ops else None
        form = None
        if traced is not None and key != traced:
            form = forms.form_of(traced, key)
        differs = traced is not None and any(
            list(t.shape) != self.plan.tensors[tid]["shape"] for t, tid in zip(outs, self.plan.ops[k]["outputs"])
        )
        if traced is None or (key != traced and form is None) or (differs and self.extra_run > 0):
            # An op the graph does not have here (or, after such ops, the
            # graph's op with other shapes: the run is not aligned with it).
            if self.first_extra is None:
                self.first_extra = self._mismatch(k, _label(key)) if traced is not None else (
                    f"op {k}: the plan's graph has {self.s.n_ops} ops, the model ran one more, {_label(key)}"
                )
            self.extra_run += 1
            stats.untraced_ops += 1
            if self.extra_run > MAX_EXTRA_OPS or traced is None and self.in_step:
                raise self._fail(self.first_extra)
            return "extra"
        if form is not None:
            stats.other_forms[form] = stats.other_forms.get(form, 0) + 1
        if differs:
            shapes = [list(t.shape) for t in outs]
            want = [self.plan.tensors[tid]["shape"] for tid in self.plan.ops[k]["outputs"]]
            self._shapes_differ(f"op {k} ({self.plan.op_label(k)}) has output shapes {shapes}, the plan's {want}")
            return "off"
        self.first_extra = None
        return "ok"

    def _shapes_differ(self, why: str) -> None:
        """A checked step whose shapes are not the plan's (a smaller last
        batch, another sequence length): the rest of it runs unplanned."""
        stats = self.stats[-1]
        stats.mode = OFF
        stats.diverged = why
        self.mode = OFF
        self._exit_mode()
        back = [r for r in self.persist.values() if not r.on_device and r.copy is None and r.host is not None]
        if back:
            self._persist_in(back)
        key = "shapes " + why.split(" has ")[0]
        if key not in self.said:
            self.said.add(key)
            log.warning(
                "tensile: step %d's shapes are not the plan's (%s); the step runs unplanned. A smaller last batch "
                "does this: pass drop_last=True to the DataLoader, or plan for that shape too",
                len(self.stats) - 1,
                why,
            )

    def _fail(self, message: str) -> PlanMismatchError:
        """Stops applying the plan: later iterations in the block are refused."""
        self.broken = message
        self._leave_iteration()
        return PlanMismatchError(message)

    def _mismatch(self, k: int, got: str) -> str:
        want = self.plan.op_label(k) if k < self.s.n_ops else "the end of the iteration"
        return (
            f"op {k}: the plan expects {want}, the model ran {got}: the model is not the one the plan was made "
            "for (plan it again with tensile.plan)"
        )

    def _flush(self) -> None:
        """Checked steps, at an op boundary: fires the events of the last
        op, settles copies, samples memory."""
        if self.inflight:
            self._poll()
        k, self.pending = self.pending, None
        evs: list[Event] = []
        if k is not None:
            evs = self.after.get(k, [])
        if evs or self.overdue or self.deferred:
            self._fire_now(evs)
        if k is not None and k < self.s.optimizer_start:
            self.stats[-1].saved_curve.append(self.resident)
        if k is not None:
            self._sample()

    def _fetch_persistent(self, flat: list[Any]) -> None:
        for a in flat:
            res = getattr(a, "_tensile_res", None) if isinstance(a, torch.Tensor) else None
            if res is not None:
                with self.quiet:
                    self._persist_ready(res)

    # -- events ----------------------------------------------------------

    def _fire_now(self, evs: list[Event]) -> None:
        """Fires ``evs`` in order, their copies in batches, then the
        swap-outs of storages saved after their event and the prefetches
        the guard held back, where there is room now."""
        s = self.s
        stats = self.stats[-1]
        outs: list[Residence] = []
        ins: list[Residence] = []
        pouts: list[Residence] = []
        pins: list[Residence] = []
        small = self.min_move_bytes
        for ev in evs:
            sid = ev.storage
            kind = ev.kind
            res = self.persist.get(sid)
            if res is not None:
                c = res.copy
                if res.nbytes < small:
                    stats.skipped += 1
                elif kind == "swap_in" and c is not None and c.direction == "out":
                    c.cancelled = True  # wanted back before it left: it stays
                    stats.swap_ins += 1
                elif kind == "swap_out" and res.on_device and res.copy is None and res not in pins:
                    pouts.append(res)
                elif kind == "swap_in" and not res.on_device and res.copy is None and res not in pouts:
                    pins.append(res)
                else:
                    stats.skipped += 1
                continue
            if kind == "swap_out":
                self.planned_host.add(sid)
            elif kind == "swap_in":
                self.planned_host.discard(sid)
            res = self.acts.get(sid)
            if kind == "recompute":
                if outs or ins:
                    self._start(outs, ins)
                    outs, ins = [], []
                self._recompute(sid)
                continue
            if kind == "release":
                if res is not None and sid in s.recomputed and sid not in self.refused_recomputes:
                    self._release(res)
                elif sid in self.rebuilt:
                    del self.rebuilt[sid]
                else:
                    stats.skipped += 1
                continue
            if res is None or res.live == 0 or res.nbytes < small or res.dropped:
                stats.skipped += 1  # not saved by autograd (or freed): nothing to move
            elif kind == "swap_in" and res.copy is not None and res.copy.direction == "out":
                res.copy.cancelled = True  # wanted back before it left: it stays
                stats.swap_ins += 1
            elif kind == "swap_out" and res.on_device and res.copy is None and res not in ins:
                outs.append(res)
            elif kind == "swap_in" and not res.on_device and res not in outs:
                if res.copy is not None:
                    self._settle(res, wait=True)
                if not self._fits(res, sum(r.nbytes for r in ins)):
                    # The guard: held back until there is room, or its consumer fetches it.
                    self.deferred.append(ev)
                    self.guarded.add(res.id)
                    stats.held_back += 1
                    continue
                ins.append(res)
            else:
                stats.skipped += 1
        if self.overdue:
            outs.extend(self._overdue())
        if outs or ins or pouts or pins:
            self._start(outs, ins, pouts, pins)
        if self.deferred:
            self._retry_deferred()

    def _start(
        self, outs: list[Residence], ins: list[Residence], pouts: tuple[Residence, ...] | list[Residence] = (),
        pins: tuple[Residence, ...] | list[Residence] = (),
    ) -> None:
        """Starts the copies of one point: every swap-out in one batch, then
        every swap-in in another (saved activations and persistent storages
        alike)."""
        stats = self.stats[-1] if self.in_iter and self.stats else IterationStats()
        if outs or pouts:
            self.engine.swap_out([*outs, *pouts])
            stats.swap_outs += len(outs) + len(pouts)
            for r in pouts:
                if r.copy is None:
                    # The copy completed at once (a synchronous engine).
                    self._point_obj_at_host(r)
                    self.persist_resident -= r.nbytes
            for r in (*outs, *pouts):
                self._after_copy(r)
        if ins or pins:
            self.engine.swap_in([*ins, *pins])
            stats.swap_ins += len(ins) + len(pins)
            for r in pins:
                self.persist_resident += r.nbytes
                if r.copy is None:
                    self._point_obj_at_device(r)
            for r in (*ins, *pins):
                self._after_copy(r)

    def _overdue(self) -> list[Residence]:
        """The storages autograd saved while the plan had them on the host
        (their swap-out fired before they were saved): to swap out now."""
        overdue, self.overdue = self.overdue, []
        batch = [
            r
            for r in overdue
            if r.id in self.planned_host and r.on_device and r.copy is None and r.live > 0 and not r.dropped
        ]
        self.stats[-1].deferred_swap_outs += len(batch)
        return batch

    def _swap_out_overdue(self) -> None:
        batch = self._overdue()
        if batch:
            self._start(batch, [])

    def _release(self, res: Residence) -> None:
        """Drops a storage the plan recomputes later, if its producer can
        run again from what is held then."""
        if res.live == 0 or res.dropped or not self._rebuildable(res.id, 3):
            self.stats[-1].skipped += 1
            return
        if res.copy is not None:
            self._settle(res, wait=True)
        _drop_views(res)
        res.dev = None
        self.engine.drop_host(res)
        res.dropped = True
        self._recount(res)
        self.stats[-1].released += 1

    # -- copies and residency ----------------------------------------------

    def _after_copy(self, res: Residence) -> None:
        if res.copy is not None:
            self.inflight.add(res)
        self._recount(res)

    def _poll(self) -> None:
        for res in list(self.inflight):
            self._settle(res, wait=False)

    def _settle(self, res: Residence, wait: bool) -> None:
        """Finishes ``res``'s copy when it has completed (waiting for it
        with ``wait``)."""
        c = res.copy
        if c is None:
            self.inflight.discard(res)
            return
        engine = self.engine
        if not engine.complete(c.done, False):
            if not wait:
                return
            engine.waited += 1
            engine.complete(c.done, True)
        out = c.direction == "out"
        res.copy = None
        self.inflight.discard(res)
        if out and c.cancelled:
            engine.drop_host(res)  # wanted back before it left: the device bytes stay
        elif out:
            res.dev = None  # only now: the copy reading it has completed
            if res.obj is not None:
                self._point_obj_at_host(res)
                self.persist_resident -= res.nbytes
            else:
                _drop_views(res)
                if res.live == 0:
                    engine.drop_host(res)
        else:
            if res.obj is not None:
                self._point_obj_at_device(res)
            engine.drop_host(res)  # the copy reading the host buffer has completed
            if res.obj is None and res.live == 0:
                res.dev = None
        self._recount(res)

    def _point_obj_at_device(self, res: Residence) -> None:
        if not res.obj_on_dev and res.obj is not None and res.dev is not None:
            res.obj.data = view_of(res.dev, *res.meta)
            res.obj_on_dev = True

    def _point_obj_at_host(self, res: Residence) -> None:
        """A persistent storage's object points at its host copy (its device
        bytes are gone)."""
        res.obj.data = view_of(res.host.untyped_storage(), *res.meta)  # type: ignore[union-attr]
        res.obj_on_dev = False

    def _persist_out(self, batch: list[Residence]) -> None:
        self._start([], [], batch, ())

    def _persist_in(self, batch: list[Residence]) -> None:
        """Starts bringing persistent storages back; their objects point at
        the device bytes once the copy has completed (until then they keep
        pointing at the valid host copy)."""
        self._start([], [], (), batch)

    def _persist_ready(self, res: Residence) -> None:
        """A persistent storage about to be read or written: no swap-out of
        it in flight (its copy must not miss a write), on the device, its
        object pointing there, its swap-in ordered before the use."""
        c = res.copy
        if c is not None and c.direction == "out":
            # Read or written now: it stays, and the host copy under way is
            # dropped once complete (a write cannot make it stale then).
            c.cancelled = True
        if not res.on_device:
            started = time.perf_counter_ns()
            self._persist_in([res])
            self._settle(res, wait=True)
            self._count_late(res, time.perf_counter_ns() - started)
        self._ready(res)
        self._point_obj_at_device(res)

    def _ready(self, res: Residence) -> None:
        """Orders the next use of ``res`` after its swap-in: on CUDA the
        compute stream waits for the copy's event; on the CPU the host waits
        for the copy thread."""
        c = res.copy
        if c is not None and c.direction == "in":
            if self.device.type == "cuda":
                self.engine.before_use(res)
            else:
                self._settle(res, wait=True)

    def _recount(self, res: Residence) -> None:
        """Keeps ``resident``: activation storages held on the device with a live handle."""
        if res.obj is not None:
            return
        should = res.dev is not None and res.live > 0
        if should != res.counted:
            res.counted = should
            if self.acts.get(res.id) is res:  # a storage of an earlier iteration counts no more
                self.resident += res.nbytes if should else -res.nbytes
                if should and self.in_iter and self.stats:
                    stats = self.stats[-1]
                    if self.resident > stats.max_saved_bytes:
                        stats.max_saved_bytes = self.resident

    def _sample(self) -> None:
        stats = self.stats[-1]
        held = self.resident + self.persist_resident
        if held > stats.max_managed_bytes:
            stats.max_managed_bytes = held
        if self.mode != CHECKED:
            stats.saved_curve.append(self.resident)
        if self.window_peak is not None:
            self.window_peak = max(self.window_peak, torch.cuda.memory_allocated(self.device))

    # -- saved tensors -----------------------------------------------------

    def pack(self, t: torch.Tensor) -> Any:
        if self.exit_due:
            with self.quiet:
                self._exit_mode()
        if not self.in_iter or self.mode == OFF:
            return t.detach() if t.grad_fn is not None else t
        if self.mode == FAST:
            p = self.point
            key = self.keys[p] if p < len(self.keys) else None
            if key is None or self.kinds[p] != PACK or key[0] != t.shape or key[1] != t.dtype:
                with self.quiet:
                    self._diverge(p, PACK, (tuple(t.shape), t.dtype))
                return t.detach() if t.grad_fn is not None else t
            stats = self.stats[-1]
            stats.calls += 1
            stats.packs += 1
            self.point = p + 1
            if self.pace:
                self._keep_pace(p)
            evs = self.fire_at[p]
            sid = self.storages[p]
            if not evs and sid == NONE and not self.overdue:
                return t.detach() if t.grad_fn is not None else t
            with self.quiet:
                if evs or self.overdue or self.deferred:
                    self._fire_now(evs)
                if sid == NONE:
                    return t.detach() if t.grad_fn is not None else t
                return self._hold(t, sid, p)
        with self.quiet:
            return self._pack_checked(t)

    def _pack_checked(self, t: torch.Tensor) -> Any:
        stats = self.stats[-1]
        stats.calls += 1
        stats.packs += 1
        self._flush()
        rec = self.building
        sid = NONE
        res = getattr(t, "_tensile_res", None)
        if res is not None:
            sid = res.id
        else:
            tid = getattr(t, "_tensile_tid", None)
            if tid is not None and t.device == self.device:
                root = self.s.root[tid]
                if self.s.kind[root] == "activation" or root in self.persist:
                    sid = root
            elif tid is None and t.grad_fn is not None and self.k < self.s.backward_start and self.mode == CHECKED:
                # Autograd saves a tensor an op outside the plan's graph made:
                # that op is part of the model (a metric saves nothing).
                raise self._fail(
                    self.first_extra
                    or f"op {self.k}: the model saves a tensor of shape {list(t.shape)} made by an op the plan does "
                    "not have: the model is not the one the plan was made for (plan it again with tensile.plan)"
                )
        if sid != NONE and self.s.bytes[sid] < self.min_move_bytes:
            sid = NONE  # never moved: autograd keeps it as it is
        p = len(rec) if rec is not None else -1
        if rec is not None:
            rec.add(PACK, self.k, sid, (t.shape, t.dtype))
        if sid == NONE:
            return t.detach() if t.grad_fn is not None else t
        return self._hold(t, sid, p)

    def _hold(self, t: torch.Tensor, sid: int, p: int) -> Any:
        """The handle of a saved tensor whose storage the plan names."""
        res = self.persist.get(sid)
        if res is not None:
            if t is res.obj:
                return _Handle(self, res, t, p)  # the parameter object itself
            # A view of it (a linear layer saves its weight transposed):
            # kept as a view to rebuild over wherever its bytes are then,
            # so that it does not hold the device bytes the plan moves.
            h = _Handle(self, res, None, p)  # type: ignore[arg-type]
            h.meta = (t.dtype, t.storage_offset(), t.size(), t.stride())
            return h
        storage = t.untyped_storage()
        res = self.acts.get(sid)
        if res is not None and res.dev is not None and res.dev._cdata != storage._cdata:
            return t.detach() if t.grad_fn is not None else t  # eager and traced storages disagree: not managed
        if res is None:
            res = Residence(sid, self.s.names[sid], t.device, storage.nbytes())
            self._make_room(res, "saving")
            res.dev = storage
            self.acts[sid] = res
        elif res.dev is None and res.copy is None:
            self._make_room(res, "saving")
            res.dev = storage  # saved again after a swap-out or a release: it is still on the device
            res.dropped = False
            self.engine.drop_host(res)
        elif res.live == 0:
            self._make_room(res, "saving")
        h = _Handle(self, res, t.detach() if t.grad_fn is not None else t, p)
        res.live += 1
        res.handles.append(weakref.ref(h))
        self._recount(res)
        if sid in self.planned_host:
            self.overdue.append(res)  # moved at the next point
        return h

    def unpack(self, h: Any) -> torch.Tensor:
        if h.__class__ is not _Handle:
            if self.in_iter and self.mode != OFF:
                self._unpack_point(NONE, h)
            return h
        if self.in_iter and self.mode != OFF:
            self._unpack_point(h.point, h)
        res = h.res
        if res.obj is not None:
            if res.dev is None or res.copy is not None or not res.obj_on_dev:
                with self.quiet:
                    self._persist_ready(res)
            if h.tensor is not None:
                return h.tensor  # the parameter object, pointing at the device bytes
            return view_of(res.dev, *h.meta)  # type: ignore[arg-type]  # a view of it autograd saved
        tensor = h.tensor
        c = res.copy
        if tensor is not None and (c is None or c.direction == "out"):
            if c is not None:
                c.cancelled = True  # needed now: its bytes stay on the device
            return tensor
        with self.quiet:
            if not res.on_device:
                started = time.perf_counter_ns()
                if res.dropped:
                    self._recompute(res.id)
                else:
                    self._make_room(res, "fetching")
                    self.engine.swap_in([res])
                    self._after_copy(res)
                    self._settle(res, wait=True)
                if self.stats and self.in_iter:
                    self._count_late(res, time.perf_counter_ns() - started)
            self._ready(res)
            if h.tensor is None:
                assert res.dev is not None and h.meta is not None
                h.tensor = view_of(res.dev, *h.meta)
            return h.tensor

    def _unpack_point(self, p: int, h: Any) -> None:
        if self.mode == FAST:
            self.stats[-1].calls += 1
            q = self.point
            if q < len(self.kinds) and self.kinds[q] == UNPACK and self.keys[q] == p:
                self.point = q + 1
                if self.pace:
                    self._keep_pace(q)
                evs = self.fire_at[q]
                if evs or self.overdue or self.deferred or self.inflight:
                    with self.quiet:
                        if self.inflight:
                            self._poll()
                        self._fire_now(evs)
                self.stats[-1].saved_curve.append(self.resident)
                if self.window_peak is not None:
                    self.window_peak = max(self.window_peak, torch.cuda.memory_allocated(self.device))
                return
            with self.quiet:
                self._diverge(q, UNPACK, p)
            return
        self.stats[-1].calls += 1
        with self.quiet:
            self._flush()
            rec = self.building
            if rec is not None:
                storage = h.res.id if h.__class__ is _Handle else NONE
                rec.add(UNPACK, self.k, storage, p)

    def _count_late(self, res: Residence, waited_ns: int) -> None:
        if not (self.in_iter and self.stats):
            return
        stats = self.stats[-1]
        stats.late += 1
        stats.late_storages.append(res.name)
        stats.stall_ns += waited_ns
        if res.id in self.s.prefetched and res.id not in self.guarded:
            stats.late_prefetches.append(res.id)
        else:
            stats.passive_swaps += 1

    def _handle_gone(self, res: Residence, h: _Handle) -> None:
        with self.lock:
            res.live -= 1
            res.handles = [r for r in res.handles if (x := r()) is not None and x is not h]
            if res.live == 0:
                if res.copy is None:
                    res.dev = None
                    self.engine.drop_host(res)
                self._recount(res)

    # -- recomputation ------------------------------------------------------

    def _record_recipe(self, root: int, func: Any, args: Any, kwargs: Any) -> None:
        """Keeps how op ``func`` produced ``root``: its arguments, planned
        tensors by storage and view, constants as they are."""

        def ref(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                res = getattr(x, "_tensile_res", None)
                meta = (x.dtype, x.storage_offset(), x.size(), x.stride())
                if res is not None:
                    return _Ref(res.id, meta, True)
                tid = getattr(x, "_tensile_tid", None)
                if tid is not None:
                    return _Ref(self.s.root[tid], meta, False)
                return x  # a constant
            if isinstance(x, (list, tuple)):
                return type(x)(ref(v) for v in x)
            return x

        self.recipes[root] = (func, ref(tuple(args)), {k: ref(v) for k, v in kwargs.items()})

    def _rebuildable(self, sid: int, depth: int) -> bool:
        recipe = self.recipes.get(sid)
        if recipe is None or depth <= 0:
            return False
        func, args, kwargs = recipe

        def ok(x: Any) -> bool:
            if isinstance(x, _Ref):
                if x.persistent:
                    return True
                res = self.acts.get(x.storage)
                if res is not None and res.live > 0 and (not res.dropped or self._rebuildable(x.storage, depth - 1)):
                    return True
                return x.storage in self.rebuilt or (x.storage != sid and self._rebuildable(x.storage, depth - 1))
            if isinstance(x, (list, tuple)):
                return all(ok(v) for v in x)
            return True

        return ok(args) and all(ok(v) for v in kwargs.values())

    def _recompute(self, sid: int, depth: int = 3) -> None:
        """Re-runs the recorded producer of ``sid`` from the storages held
        now (fetching or rebuilding them first)."""
        res = self.acts.get(sid)
        if (res is not None and res.on_device) or sid in self.rebuilt:
            return
        recipe = self.recipes.get(sid)
        if recipe is None or depth <= 0:
            if res is not None and res.dropped:
                raise PlanApplyError(f"the hook dropped {self.s.names[sid]!r} and cannot rebuild it (no producer recorded)")
            return
        func, args, kwargs = recipe

        def value(x: Any) -> Any:
            if isinstance(x, _Ref):
                if x.persistent:
                    r = self.persist[x.storage]
                    self._persist_ready(r)
                    return view_of(r.dev, *x.meta)  # type: ignore[arg-type]
                r = self.acts.get(x.storage)
                if r is not None and r.live > 0:
                    if r.dropped:
                        self._recompute(x.storage, depth - 1)
                    elif not r.on_device or r.copy is not None:
                        if r.copy is not None and r.copy.direction == "out":
                            self._settle(r, wait=True)
                        if not r.on_device:
                            self.engine.swap_in([r])
                            self._after_copy(r)
                        self._settle(r, wait=True)
                    return view_of(r.dev, *x.meta)  # type: ignore[arg-type]
                st = self.rebuilt.get(x.storage)
                if st is None:
                    self._recompute(x.storage, depth - 1)
                    st = self.rebuilt.get(x.storage)
                if st is None:
                    raise PlanApplyError(f"cannot rebuild {self.s.names[sid]!r}: its input {self.s.names[x.storage]!r} is gone")
                return view_of(st, *x.meta)
            if isinstance(x, (list, tuple)):
                return type(x)(value(v) for v in x)
            return x

        with torch.no_grad():
            out = func(*value(args), **{k: value(v) for k, v in kwargs.items()})
        first = out if isinstance(out, torch.Tensor) else _tensors(out, [])[0]
        storage = first.untyped_storage()
        stats = self.stats[-1]
        stats.recomputed += 1
        if res is None or res.live == 0:
            self.rebuilt[sid] = storage
            return
        if storage.nbytes() != res.nbytes:
            raise PlanApplyError(
                f"rebuilding {res.name!r} gave {storage.nbytes()} bytes, the saved storage had {res.nbytes}"
            )
        res.dev = storage
        res.dropped = False
        self._recount(res)

    # -- the memory guard (budget_bytes) ----------------------------------

    def _fits(self, res: Residence, pending: int = 0) -> bool:
        """Whether holding ``res`` on the device (besides ``pending`` bytes
        about to come) keeps the resident saved bytes within the budget."""
        return self.budget_bytes is None or res.counted or self.resident + pending + res.nbytes <= self.budget_bytes

    def _retry_deferred(self) -> None:
        held, self.deferred = self.deferred, []
        start = []
        for ev in held:
            res = self.acts.get(ev.storage)
            if res is None or res.live == 0 or res.on_device or ev.storage in self.planned_host:
                continue
            if not self._fits(res, sum(r.nbytes for r in start)):
                self.deferred.append(ev)
                continue
            start.append(res)
        if start:
            self.engine.swap_in(start)
            for r in start:
                self._after_copy(r)
            self.stats[-1].swap_ins += len(start)

    def _make_room(self, res: Residence, what: str) -> None:
        """Before ``res`` becomes resident: when that would take the
        resident saved bytes over the budget, finishes the copies in flight,
        then moves resident saved storages to the host, the one used again
        last first, never one in use now. Raises :class:`BudgetError` when
        nothing more can move."""
        budget = self.budget_bytes
        if budget is None or res.counted or self.resident + res.nbytes <= budget:
            return
        for other in [r for r in self.inflight if r.obj is None and r is not res]:
            self._settle(other, wait=True)
        in_use = self._in_use() | {res.id}
        movable = {r.id: r for r in self.acts.values() if r.counted and r.copy is None and r.id not in in_use}
        # The executor's rule (tensile_planner::guard): the one used again last first.
        order = _core.guard_victims(
            [(sid, r.nbytes, self._next_use(sid)) for sid, r in movable.items()], self.resident, res.nbytes, budget
        )
        for sid in order:
            victim = movable[sid]
            self.engine.swap_out([victim])
            self._after_copy(victim)
            self._settle(victim, wait=True)
            self.guarded.add(victim.id)
            if self.stats:
                self.stats[-1].guard_evictions += 1
        if self.resident + res.nbytes > budget:
            where = f"at point {self.point}" if self.mode == FAST else (
                f"before op {self.k} ({self.plan.op_label(self.k)})" if self.k < self.s.n_ops else "after the last op"
            )
            message = (
                f"{where}: {what} {res.name!r} needs {res.nbytes} bytes, and {self.resident} bytes of saved "
                f"activations stay resident with every other one moved to the host (this op and its autograd "
                f"node use them): {self.resident + res.nbytes} bytes is over the budget of {budget} bytes "
                f"(budget_mb={budget / 1e6:g}), below what one op needs: give a larger budget_mb"
            )
            self.broken = message
            self._leave_iteration()
            raise BudgetError(message)

    def _next_use(self, sid: int) -> int:
        """When ``sid`` is needed next: the next point needing it in a fast
        step, the next backward op reading it in a checked one (past the end
        when never)."""
        if self.mode == FAST:
            pts = self.need_points.get(sid, [])
            i = bisect.bisect_left(pts, self.point)
            return pts[i] if i < len(pts) else len(self.kinds)
        reads = self.s.backward_reads.get(sid, [])
        i = bisect.bisect_left(reads, self.k)
        return reads[i] if i < len(reads) else self.s.n_ops

    def _in_use(self) -> set[int]:
        """The saved storages the guard must not move now: in a checked step
        those of the op that ran last and the op about to run (in the
        backward pass, of their whole autograd nodes); in a fast step those
        of the current point's node. In the backward pass also those no
        later op reads (their node is running)."""
        used: set[int] = set()
        if self.mode == FAST:
            # The points of the current op and the next (an autograd node
            # unpacks all its saved tensors before its first op): those
            # with their clocks.
            n = len(self.kinds)
            for q in (self.point - 1, self.point):
                if not 0 <= q < n:
                    continue
                clock = self.clocks[q]
                r = q
                while r >= 0 and self.clocks[r] == clock:
                    used.add(self.storages[r])
                    r -= 1
                r = q + 1
                while r < n and self.clocks[r] == clock:
                    used.add(self.storages[r])
                    r += 1
            used.discard(NONE)
            used.update(sid for sid in self.acts if self._next_use(sid) >= len(self.kinds))
            return used
        k, s = self.k, self.s
        ops: set[int] = set()
        for i in (k - 1, k):
            if 0 <= i < s.backward_start:
                ops.add(i)
            elif s.backward_start <= i < s.optimizer_start:
                first, last = s.node_span(i)
                ops.update(range(first, last + 1))
        used = set().union(*(s.op_roots[i] for i in ops)) if ops else set()
        if k >= s.backward_start:
            used.update(sid for sid in self.acts if self._next_use(sid) >= s.n_ops)
        return used

    # -- measurements ----------------------------------------------------

    def measurements(self, index: int = -1) -> dict[str, Any]:
        """One iteration's measurements in the shape of the scheduler's
        ``ReportLatenciesRequest``: ``op_latency_s`` (by op id, from the step
        itself or the last step before it that timed every op: a checked step
        after the optimizer's first; empty before one), ``stall_s``, ``late_prefetches``,
        ``passive_swaps``, ``peak_bytes`` (``stats.device_peak_bytes``) and
        ``base_bytes`` (on CUDA, from the third step on, the process's device
        memory outside its tensors, ``tensile.hook.base``; ``None``: not
        measured)."""
        stats = self.stats[index]
        timed = stats.reported_ns
        complete = len(timed) == self.s.n_ops
        return {
            "iteration": len(self.stats) + index if index < 0 else index,
            "plan_version": stats.plan_version,
            "op_latency_s": [timed[k] / 1e9 for k in range(self.s.n_ops)] if complete else [],
            "stall_s": stats.stall_ns / 1e9,
            "late_prefetches": list(stats.late_prefetches),
            "passive_swaps": stats.passive_swaps,
            "peak_bytes": stats.device_peak_bytes,
            "base_bytes": self.base_bytes,
        }


_KINDS: dict[Any, tuple[bool, bool]] = {}


def _drop_views(res: Residence) -> None:
    """The handles of ``res`` let go of their device views (keeping how to
    rebuild them): its device bytes are leaving."""
    for ref in res.handles:
        h = ref()
        if h is not None and h.tensor is not None:
            t = h.tensor
            h.meta = (t.dtype, t.storage_offset(), t.size(), t.stride())
            h.tensor = None


def _counted(func: Any, tensor_args: list[torch.Tensor], outs: list[torch.Tensor]) -> bool:
    """Whether the tracer's converter made an op of this call (see convert.py):
    one with a tensor output, or writing a tensor argument in place."""
    kind = _KINDS.get(func)
    if kind is None:
        name = func._schema.name
        skipped = name.startswith("profiler::") or name in _UNCOUNTED
        writes = any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
        kind = _KINDS[func] = (skipped, writes)
    skipped, writes = kind
    return not skipped and (bool(outs) or (writes and bool(tensor_args)))


def _tensors(x: Any, found: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors of an ATen call's arguments or results, in order."""
    if isinstance(x, torch.Tensor):
        found.append(x)
        return found
    for v in x.values() if isinstance(x, dict) else x:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)) and v and not isinstance(v[0], (int, float, bool)):
            found.extend(w for w in v if isinstance(w, torch.Tensor))
    return found


def _check_per_tensor(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """The plan's optimizer ops are per-tensor updates; PyTorch picks its
    multi-tensor (``foreach``) kernels by default on CUDA, and ``fused`` on
    request, which run other ops."""
    for i, g in enumerate(optimizer.param_groups):
        if g.get("fused") or g.get("foreach") or (g.get("foreach", False) is None and device.type == "cuda"):
            flag = "fused" if g.get("fused") else "foreach"
            raise PlanApplyError(
                f"optimizer group {i} runs {flag} (multi-tensor) updates on {device.type}, the plan per-tensor "
                f"ones: construct {type(optimizer).__name__} with foreach=False"
            )


def _unwrap(model: nn.Module) -> tuple[nn.Module, bool]:
    """The module a plan applies to: a DistributedDataParallel's own module
    (the plan was traced from it; the wrapper's all-reduces run in the
    backward pass, which the hook leaves alone), and whether it was one.
    DataParallel, which copies the module to every GPU at every step, is
    refused."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return model.module, True
    if isinstance(model, DataParallel):
        raise PlanApplyError(
            "the model is a DataParallel, which copies the module to every GPU at every step: use "
            "DistributedDataParallel (one process per GPU) and apply the plan in each process"
        )
    return model, False


def _refuse_compiled(model: nn.Module) -> None:
    """A model under ``torch.compile`` saves its tensors inside the compiled
    graph, where the hook's points are not: refused before training."""
    compiled = type(model).__name__ == "OptimizedModule" or getattr(model, "_compiled_call_impl", None) is not None
    if compiled:
        raise PlanApplyError(
            "the model runs under torch.compile, whose compiled graph saves its tensors where tensile.apply cannot "
            "act: apply the plan to the eager model (torch.compile's own activation_memory_budget plans a compiled one)"
        )


def _timing_of(plan: Plan, n_ops: int, what: str = "the plan") -> tuple[Gate | None, list[int]]:
    """A plan's gate and pace (``tensile.hook.gate``), checked."""
    try:
        return gate_of(plan.plan), pace_of(plan.plan, n_ops)
    except ValueError as e:
        raise PlanApplyError(f"{what}'s {e}") from None


def _sleep_until(deadline_ns: int) -> None:
    while (left := deadline_ns - time.monotonic_ns()) > 0:
        time.sleep(left / 1e9)


def _graph_difference(a: Plan, b: Plan) -> str | None:
    """The first difference between the graphs of two plans (op kinds and
    output shapes, in order), or None when the same ops run."""
    ka, kb = Schedule.op_keys_of(a), Schedule.op_keys_of(b)
    for k, (x, y) in enumerate(zip(ka, kb)):
        if x != y:
            return f"op {k} is {a.op_label(k)} in the applied graph, {b.op_label(k)} in the new plan's"
        shapes_a = [a.tensors[t]["shape"] for t in a.ops[k]["outputs"]]
        shapes_b = [b.tensors[t]["shape"] for t in b.ops[k]["outputs"]]
        if shapes_a != shapes_b:
            return f"op {k} ({a.op_label(k)}) has output shapes {shapes_a} in the applied graph, {shapes_b} in the new plan's"
    if len(ka) != len(kb):
        return f"the applied graph has {len(ka)} ops, the new plan's {len(kb)}"
    if len(a.tensors) != len(b.tensors):
        return f"the applied graph has {len(a.tensors)} tensors, the new plan's {len(b.tensors)}"
    return None


def _label(key: tuple[str, str]) -> str:
    return key[0] if key[1] == "default" else f"{key[0]}.{key[1]}"


def _device_of(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    raise PlanApplyError(f"{type(model).__name__} has no parameters")
