"""The hook at work: a dispatch mode, saved-tensor hooks and optimizer hooks.

One training iteration runs from the model's forward call to the end of
``optimizer.step()``. Inside it:

* :class:`Applier` (a ``TorchDispatchMode``) counts the ATen ops the tracer
  counts (every op with a tensor output or a tensor argument written in
  place; profiler marks and ``_local_scalar_dense`` excepted), checks each
  against the graph's op at that index (the same op, in the form traced or
  another form of it that :mod:`tensile.hook.forms` lists, and the same
  output shapes) and stops with :class:`PlanMismatchError` at the first
  difference. It tags
  each output with its graph tensor id, fires the ``after`` events of op
  ``k`` when the next op begins (by then autograd has saved op ``k``'s
  tensors), and fetches on demand any planned persistent tensor that an op
  needs while it is on the host.
* ``saved_tensors_hooks``: pack gives autograd a handle instead of the
  tensor. Activation storages are held by a :class:`Residence` keyed by the
  plan's storage id, which the plan's events move to the host and back;
  unpack rebuilds the saved view over the device bytes, fetching them on
  demand (counted as late) when the plan's prefetch has not run.
* Parameters, buffers and optimizer state that the plan swaps (within the
  iteration or across it, ``start_on_host``) are moved by pointing the
  tensor object's ``.data`` at the host copy and back, so the module and the
  optimizer keep their objects.
* A plan the scheduler coordinates with other jobs holds each iteration
  until its gate's slot (:mod:`tensile.hook.gate`) and each op until its
  planned start (the pace). With a budget (``budget_bytes``) a guard keeps
  the resident saved bytes within it: prefetches wait for room, and a save
  or a fetch on demand first moves other saved storages to the host.

The first ``optimizer.step()`` of a fresh optimizer creates its state, ops
the traced (later) iteration does not have: that step's optimizer ops are
neither checked nor planned, and the state is planned from the next
iteration on. Ops between the end of the backward pass and
``optimizer.step()`` (gradient clipping) are the user's, not the graph's:
they run unplanned and are counted.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from tensile.hook import forms
from tensile.hook.gate import Gate, GateClock, gate_of, pace_of
from tensile.hook.schedule import PERSISTENT, Event, Schedule
from tensile.hook.store import Residence, engine_for, view_of
from tensile.hook.timing import CudaOpTimer, Timed
from tensile.planning import Plan

if TYPE_CHECKING:
    from tensile.hook.session import Session

log = logging.getLogger("tensile.hook")

_UNCOUNTED = ("aten::_local_scalar_dense",)
_DETACH = ("aten::detach", "default")


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

    ops: int = 0
    swap_outs: int = 0
    swap_ins: int = 0
    #: Fetches on demand: a storage needed while the plan still had it on the host.
    late: int = 0
    #: The storages fetched on demand, by name, in order.
    late_storages: list[str] = dataclasses.field(default_factory=list)
    #: Prefetches moved earlier for the next iterations (see ``Applier._retime``).
    retimed: int = 0
    #: Of the late fetches: storages the plan prefetches (by id), the count
    #: of those it has no prefetch for, and the time spent fetching.
    late_prefetches: list[int] = dataclasses.field(default_factory=list)
    passive_swaps: int = 0
    stall_ns: int = 0
    #: Events with nothing to act on (a storage autograd did not save, releases).
    skipped: int = 0
    #: Swap-outs whose trigger came before autograd saved the storage (the
    #: plan places them after the producing op; autograd saves a tensor when
    #: the op that needs it runs, often later), done once it was saved.
    deferred_swap_outs: int = 0
    #: Ops eager ran in another form than the traced one (``lift_fresh`` for
    #: ``lift_fresh_copy``...), by form name (:data:`tensile.hook.forms.FORMS`).
    other_forms: dict[str, int] = dataclasses.field(default_factory=dict)
    #: The optimizer step was the state-creating first one (not checked).
    initializing: bool = False
    #: Ops run between the backward pass and ``optimizer.step()`` (gradient
    #: clipping, scaling): not in the graph, run as they are.
    untraced_ops: int = 0
    #: Resident saved bytes after each op of the forward and backward passes.
    saved_curve: list[int] = dataclasses.field(default_factory=list)
    #: Measured latency of each graph op in ns, by op id, for a scheduler's
    #: re-planning: on the CPU the call's own time (the call is the run); on
    #: CUDA, whose kernels run asynchronously, the time between timing
    #: events recorded around the call on the current stream, read at the
    #: step's end (:mod:`tensile.hook.timing`).
    op_ns: dict[int, int] = dataclasses.field(default_factory=dict)
    #: The plan the iteration ran: its scheduler job id (0 for the plan
    #: given to ``tensile.apply``) and version.
    plan_job: int = 0
    plan_version: int = 0
    #: When the iteration started (``time.monotonic_ns()``, after its gate),
    #: how long its gate held it, and how long the plan's pace held its ops
    #: back (neither is a stall: the plan's time line has them).
    start_ns: int = 0
    gate_wait_ns: int = 0
    paced_ns: int = 0
    #: The memory guard (``budget_mb``): saved storages it moved to the host
    #: to make room, and prefetches it held back for want of room.
    guard_evictions: int = 0
    held_back: int = 0
    #: The most resident saved bytes at any moment (every change, where
    #: ``saved_curve`` samples after each op).
    max_saved_bytes: int = 0

    @property
    def peak_saved_bytes(self) -> int:
        return max(self.saved_curve, default=0)


class _Saved:
    """What autograd holds instead of a saved tensor."""

    __slots__ = ("applier", "res", "tensor", "meta")

    def __init__(self, applier: Applier, res: Residence | None, tensor: torch.Tensor | None, meta: Any) -> None:
        self.applier, self.res, self.tensor, self.meta = applier, res, tensor, meta

    def __del__(self) -> None:
        if self.res is not None:
            self.applier._handle_gone(self.res)


class Applier(TorchDispatchMode):
    """Applies one plan to the iterations run while it is active."""

    def __init__(
        self,
        plan: Plan,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        copies_complete_after: int = 0,
        budget_bytes: int | None = None,
    ) -> None:
        super().__init__()
        self.s = Schedule(plan)
        if self.s.recomputes:
            e = self.s.recomputes[0]
            raise PlanApplyError(
                f"the plan recomputes {e['tensor_name']!r} (and {len(self.s.recomputes) - 1} more): "
                "recomputation is not applied in eager mode; plan without a budget or with recomputation off"
            )
        gate, self.pace = _timing_of(plan, self.s.n_ops)
        #: Where the next iteration may start (None: the plan has no gate).
        self.gate_clock = None if gate is None else GateClock(gate)
        if budget_bytes is not None and (isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 1):
            raise PlanApplyError(f"budget_bytes must be a positive whole number of bytes, got {budget_bytes!r}")
        #: The most resident saved bytes the hook may hold (None: no limit).
        self.budget_bytes = budget_bytes
        self.plan, self.model, self.optimizer = plan, model, optimizer
        self.device = _device_of(model)
        _check_per_tensor(optimizer, self.device)
        self.engine = engine_for(self.device, copies_complete_after)
        self.measure = self.device.type == "cpu"
        #: Times ops on CUDA (None on the CPU, which times the call itself);
        #: set it to None to time nothing (reports then carry no latencies).
        self.timer: CudaOpTimer | None = CudaOpTimer(self.device) if self.device.type == "cuda" else None
        self.lock = threading.RLock()
        self.by_name = {
            t["name"]: t["id"] for t in plan.tensors if t["kind"] in PERSISTENT and self.s.root[t["id"]] == t["id"]
        }
        self.persist: dict[int, Residence] = {}
        self.acts: dict[int, Residence] = {}
        #: Activation storages the plan has on the host now (its events so
        #: far this iteration, acted on or not), and those saved while there.
        self.planned_host: set[int] = set()
        self.overdue: list[Residence] = []
        self.resident = 0
        #: Prefetches the guard held back, in the order they fired, and the
        #: storages it moved or held this iteration (never retimed).
        self.deferred: list[Event] = []
        self.guarded: set[int] = set()
        self.iter_start_ns = 0
        self.inflight: set[Residence] = set()
        self.k = 0
        self.pending: int | None = None
        self.in_iter = False
        self.checking = False
        self.broken: str | None = None
        self.in_step = False  # inside optimizer.step()
        self.stats: list[IterationStats] = []
        #: The plan's ``after`` events, some moved earlier (see ``_retime``).
        self.after = {k: list(evs) for k, evs in self.s.after.items()}
        #: (scheduler job id, version) of the plan in use; job 0: the plan
        #: given to ``tensile.apply``.
        self.plan_id = (0, int(plan.plan.get("version", 0)))
        #: The scheduler session (``tensile.apply(..., server=...)``), if any.
        self.session: Session | None = None
        self._register_module_tensors()

    # -- setup -----------------------------------------------------------

    def _register_module_tensors(self) -> None:
        graph_params = {n for n, tid in self.by_name.items() if self.s.kind[tid] == "parameter"}
        model_params = {n for n, p in self.model.named_parameters() if p.requires_grad}
        if graph_params != model_params:
            extra = sorted(model_params - graph_params)
            missing = sorted(graph_params - model_params)
            what = f"has parameter {extra[0]!r} the plan does not" if extra else f"lacks parameter {missing[0]!r}"
            raise PlanApplyError(f"the model {what}: it is not the model the plan was made for")
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
            raise PlanApplyError(f"{name!r} has shape {list(t.shape)}, the plan's has {want['shape']}")
        storage = t.untyped_storage()
        res = Residence(tid, name, t.device, storage.nbytes())
        res.dev = storage
        res.obj = t
        res.meta = (t.dtype, t.storage_offset(), t.size(), t.stride())
        t._tensile_res = res
        t._tensile_tid = tid
        self.persist[tid] = res

    def register_optimizer_state(self) -> None:
        names = {id(p): n for n, p in self.model.named_parameters()}
        for p, state in self.optimizer.state.items():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device == self.device and id(p) in names:
                    self._register(f"{names[id(p)]}.{key}", value)

    def start(self) -> None:
        """Entering ``apply``: the plan's ``start_on_host`` storages go to the host."""
        self.register_optimizer_state()
        with _disable_current_modes():
            self._park_start_on_host()

    def finish(self) -> None:
        """Leaving ``apply``: every persistent tensor back on the device."""
        with _disable_current_modes(), self.lock:
            for res in list(self.inflight):
                self._settle(res, wait=True)
            for res in self.persist.values():
                if not res.on_device:
                    self._persist_in(res)
                self._settle(res, wait=True)
                obj = res.obj
                for attr in ("_tensile_res", "_tensile_tid"):
                    if hasattr(obj, attr):
                        delattr(obj, attr)

    # -- iteration boundaries (module and optimizer hooks) ---------------

    def forward_pre_hook(self, module: nn.Module, args: Any) -> None:
        if self.broken is not None:
            raise PlanApplyError(f"the plan no longer applies ({self.broken}); leave the tensile.apply block")
        if self.in_iter or not torch.is_grad_enabled() or not module.training:
            return  # evaluation passes are not training iterations
        waited = self._wait_for_gate()
        if self.timer is not None:
            self.timer.clear()  # what an iteration that did not finish kept
        self.iter_start_ns = time.monotonic_ns()
        self.in_iter, self.checking, self.k, self.pending, self.in_step = True, True, 0, None, False
        self.acts, self.resident = {}, 0
        self.planned_host, self.overdue = set(), []
        self.deferred, self.guarded = [], set()
        self.stats.append(
            IterationStats(
                plan_job=self.plan_id[0], plan_version=self.plan_id[1], start_ns=self.iter_start_ns, gate_wait_ns=waited
            )
        )
        with _disable_current_modes():
            for ev in self.s.at_start:
                self._fire(ev)

    def _wait_for_gate(self) -> int:
        """Holds an iteration ready now until its gate's slot (``GateClock``:
        at once when the slot has passed); returns the ns waited."""
        clock = self.gate_clock
        if clock is None:
            return 0
        ready = time.monotonic_ns()
        start = clock.start_at(ready)
        if start <= ready:
            return 0  # its slot has passed: it starts at once
        _sleep_until(start)
        return time.monotonic_ns() - ready

    def step_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.in_iter:
            return
        self.in_step = True
        with _disable_current_modes():
            self._flush()
        if self.k != self.s.optimizer_start:
            raise self._fail(self._mismatch(self.k, "optimizer.step()"))
        # An optimizer with state (Adam's moments, SGD's momentum) creates it
        # in its first step; one without (plain SGD) runs the traced ops.
        fresh = self.s.has_optimizer_state and any(
            len(self.optimizer.state.get(p, {})) == 0 for g in self.optimizer.param_groups for p in g["params"]
        )
        if fresh:
            self.checking = False
            self.stats[-1].initializing = True

    def step_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.in_iter:
            return
        with _disable_current_modes():
            if self.checking:
                self._flush()
                if self.k != self.s.n_ops:
                    raise self._fail(self._mismatch(self.k, "nothing more (the step ended)"))
            self.register_optimizer_state()
            self._park_start_on_host()
            if self.timer is not None:
                self.stats[-1].op_ns.update(self.timer.resolve())  # one synchronize per step
        self.stats[-1].ops = self.k if self.checking else self.s.optimizer_start
        self.in_iter = False
        if self.session is not None:
            self._report_and_switch(self.session)

    def _report_and_switch(self, session: Session) -> None:
        """The step boundary with a scheduler: the step's report goes to the
        session's queue, and a newer plan, if one arrived, is applied now."""
        pushed = session.iteration_done(self.measurements(-1))
        if pushed is None:
            return
        try:
            self.use_plan(pushed.plan, job_id=pushed.job_id)
        except (PlanApplyError, PlanMismatchError) as e:
            log.warning("tensile: plan version %d of job %d refused: %s", pushed.version, pushed.job_id, e)

    def use_plan(self, plan: Plan, *, job_id: int = 0) -> None:
        """Switches to ``plan`` from the next iteration on. Only between
        iterations (never inside one), and only a plan of the same graph: a
        plan whose op sequence differs is refused with
        :class:`PlanMismatchError` naming the first differing op, one that
        recomputes with :class:`PlanApplyError`. Persistent tensors the old
        plan kept on the host across iterations and the new one does not
        come back to the device now; the new plan's go to the host."""
        if not isinstance(plan, Plan):
            raise PlanApplyError(f"plan is a {type(plan).__name__}, not a tensile Plan")
        if self.in_iter:
            raise PlanApplyError("a plan is switched between iterations, not inside one (after optimizer.step())")
        diff = _graph_difference(self.plan, plan)
        if diff is not None:
            raise PlanMismatchError(f"the new plan is not for the graph being applied ({self.plan.graph['name']!r}): {diff}")
        s = Schedule(plan)
        if s.recomputes:
            raise PlanApplyError(
                f"the new plan recomputes {s.recomputes[0]['tensor_name']!r}: recomputation is not applied in eager mode"
            )
        gate, pace = _timing_of(plan, s.n_ops, "the new plan")
        with _disable_current_modes(), self.lock:
            for res in list(self.inflight):
                self._settle(res, wait=True)
            keep = set(s.start_on_host)
            for sid, res in self.persist.items():
                if sid not in keep and not res.on_device:
                    self._persist_in(res)
                    self._settle(res, wait=True)
            self.s, self.plan = s, plan
            self.after = {k: list(evs) for k, evs in s.after.items()}
            self._park_start_on_host()
        self.plan_id = (job_id, int(plan.plan.get("version", 0)))
        # As the simulator takes a plan: the same gate keeps its slots,
        # another one places them afresh, none runs free.
        self.pace = pace
        if gate is None or self.gate_clock is None:
            self.gate_clock = None if gate is None else GateClock(gate)
        else:
            self.gate_clock.set_gate(gate)

    def _park_start_on_host(self) -> None:
        for sid in self.s.start_on_host:
            res = self.persist.get(sid)
            if res is not None and res.on_device and res.copy is None:
                self._persist_out(res)

    # -- the dispatch mode -----------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if not self.in_iter:
            return func(*args, **kwargs)
        flat = _tensors(kwargs, _tensors(args, [])) if kwargs else _tensors(args, [])
        with self.lock:
            if self.checking:
                self._flush()
            self._fetch_persistent(flat)
            if self.checking and self.k == self.s.optimizer_start and not self.in_step:
                # Between the end of the backward pass and optimizer.step():
                # the user's own ops (gradient clipping, scaling), not traced.
                self.stats[-1].untraced_ops += 1
                return func(*args, **kwargs)
            if self.checking:
                self._skip_saved_detaches(func)
            k = self.k
            if self.checking and k < self.s.n_ops:
                for ev in self.s.before.get(k, []):
                    self._fire(ev)
        if self.checking and k < len(self.pace):
            # A coordinated plan's pace: no op starts before its planned
            # time in the iteration (outside the lock: autograd's threads
            # may pack and free meanwhile).
            due = self.iter_start_ns + self.pace[k]
            now = time.monotonic_ns()
            if due > now:
                _sleep_until(due)
                self.stats[-1].paced_ns += time.monotonic_ns() - now
        timer = self.timer if self.checking else None
        timed = timer.begin() if timer is not None else None
        started = time.perf_counter_ns()
        out = func(*args, **kwargs)
        elapsed = time.perf_counter_ns() - started
        if timer is not None and timed is not None:
            timer.end(timed)
        outs = _tensors(out, []) if isinstance(out, (torch.Tensor, list, tuple)) else []
        if not self.checking or not _counted(func, flat, outs):
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
        try:
            self._check(k, func, outs)
        except PlanMismatchError:
            self._untimed(timed)
            raise
        if self.measure:
            self.stats[-1].op_ns[k] = elapsed
        elif timer is not None and timed is not None:
            timer.keep(k, timed)
        if k < self.s.backward_start:
            # Only the forward's tensors are ever saved for the backward. An
            # op run in another form may return a persistent tensor it
            # traced as a new one (in place for out of place): that tensor
            # keeps its own id.
            for t, tid in zip(outs, self.plan.ops[k]["outputs"]):
                if getattr(t, "_tensile_res", None) is None:
                    t._tensile_tid = tid
        self.k = k + 1
        self.pending = k
        return out

    def _untimed(self, timed: Timed | None) -> None:
        """A call that is not a graph op: its timing events go back."""
        if timed is not None and self.timer is not None:
            self.timer.drop(timed)

    def _traced_detach(self, k: int, outs: list[torch.Tensor]) -> bool:
        """Whether a detach eager ran is the graph's op ``k``: a detach of
        the same shape. Autograd detaches saved tensors when it saves or
        unpacks them, and which ones depends on the saved-tensor hooks (the
        trace has none) and on whether a tensor is a node's own output, so a
        detach of another shape where the graph has one is one of those."""
        if k >= self.s.n_ops or self.s.op_keys[k] != _DETACH:
            return False
        want = [self.plan.tensors[t]["shape"] for t in self.plan.ops[k]["outputs"]]
        return want == [list(t.shape) for t in outs]

    def _skip_saved_detaches(self, func: Any) -> None:
        """Steps over the graph's ``detach`` ops that this run does not have.

        Autograd detaches an op's output when it saves it, and the tracer
        records that ``aten::detach``; with saved-tensor hooks installed,
        autograd hands the output to the pack hook instead and runs no
        detach. A detach is a view (no bytes), so its events fire here."""
        name = func._schema.name
        if name == "aten::detach" or name.startswith("profiler::") or name in _UNCOUNTED:
            return
        while self.k < self.s.n_ops and self.s.op_keys[self.k] == _DETACH:
            if self.measure or self.timer is not None:
                self.stats[-1].op_ns[self.k] = 0  # not run at all
            self.pending = self.k
            self.k += 1
            self._flush()

    def _check(self, k: int, func: Any, outs: list[torch.Tensor]) -> None:
        name = func._schema.name
        key = (name, func._overloadname)
        if k >= self.s.n_ops:
            raise self._fail(
                f"op {k}: the plan's graph has {self.s.n_ops} ops, the model ran one more, {_label(key)}"
            )
        traced = self.s.op_keys[k]
        if key != traced:
            form = forms.form_of(traced, key)
            if form is None:
                raise self._fail(self._mismatch(k, _label(key)))
            counts = self.stats[-1].other_forms
            counts[form] = counts.get(form, 0) + 1
        for t, tid in zip(outs, self.plan.ops[k]["outputs"]):
            want = self.plan.tensors[tid]["shape"]
            if list(t.shape) != want:
                raise self._fail(
                    f"op {k}: the plan expects {self.plan.op_label(k)} with an output of shape {want}, "
                    f"the model's has shape {list(t.shape)} (shapes must not change after tracing)"
                )

    def _fail(self, message: str) -> PlanMismatchError:
        """Stops applying the plan: later iterations in the block are refused."""
        self.in_iter = False
        self.broken = message
        return PlanMismatchError(message)

    def _mismatch(self, k: int, got: str) -> str:
        want = self.plan.op_label(k) if k < self.s.n_ops else "the end of the iteration"
        return f"op {k}: the plan expects {want}, the model ran {got}: the model is not the one the plan was made for"

    def _flush(self) -> None:
        """Fires the events of the last op, settles copies, starts the
        prefetches the guard held back where there is room now, samples
        memory."""
        if self.inflight:
            for res in list(self.inflight):
                self._settle(res, wait=False)
        k, self.pending = self.pending, None
        if k is not None:
            for ev in self.after.get(k, []):
                self._fire(ev)
            if self.overdue:
                self._swap_out_overdue()
        if self.deferred:
            self._retry_deferred()
        if k is not None and k < self.s.optimizer_start:
            self.stats[-1].saved_curve.append(self.resident)

    # -- events ----------------------------------------------------------

    def _fire(self, ev: Event) -> None:
        stats = self.stats[-1]
        res = self.persist.get(ev.storage)
        if res is not None:
            if ev.kind == "swap_out" and res.on_device and res.copy is None:
                self._persist_out(res)
                stats.swap_outs += 1
            elif ev.kind == "swap_in" and not res.on_device:
                self._persist_in(res)
                stats.swap_ins += 1
            else:
                stats.skipped += 1
            return
        if ev.kind == "swap_out":
            self.planned_host.add(ev.storage)
        elif ev.kind == "swap_in":
            self.planned_host.discard(ev.storage)
        res = self.acts.get(ev.storage)
        if res is None or res.live == 0:
            stats.skipped += 1  # not saved by autograd (or already freed): nothing to move
        elif ev.kind == "swap_out" and res.on_device and res.copy is None:
            self.engine.swap_out(res)
            self._after_copy(res)
            stats.swap_outs += 1
        elif ev.kind == "swap_in" and not res.on_device:
            self._settle(res, wait=True)
            if not self._fits(res):
                # The guard: held back until there is room, or its consumer fetches it.
                self.deferred.append(ev)
                self.guarded.add(res.id)
                stats.held_back += 1
                return
            self.engine.swap_in(res)
            self._after_copy(res)
            stats.swap_ins += 1
        else:
            stats.skipped += 1

    # -- the memory guard (budget_bytes) ----------------------------------

    def _fits(self, res: Residence) -> bool:
        """Whether holding ``res`` on the device keeps the resident saved
        bytes within the budget."""
        return self.budget_bytes is None or res.counted or self.resident + res.nbytes <= self.budget_bytes

    def _retry_deferred(self) -> None:
        """Starts the prefetches the guard held back, in the order they
        fired, where there is room now; drops those whose storage is back
        (its consumer fetched it) or no longer saved."""
        held, self.deferred = self.deferred, []
        for ev in held:
            res = self.acts.get(ev.storage)
            if res is None or res.live == 0 or res.on_device or ev.storage in self.planned_host:
                continue
            if not self._fits(res):
                self.deferred.append(ev)
                continue
            self.engine.swap_in(res)
            self._after_copy(res)
            self.stats[-1].swap_ins += 1

    def _make_room(self, res: Residence, what: str) -> None:
        """Before ``res`` becomes resident (saved, or fetched on demand):
        when that would take the resident saved bytes over the budget,
        finishes the copies in flight (a swap-out frees its bytes once
        done), then moves resident saved storages to the host, the one
        used again last first, synchronously, never one the op at hand or
        its autograd node uses. Raises :class:`BudgetError` when nothing
        more can move."""
        budget = self.budget_bytes
        if budget is None or res.counted or self.resident + res.nbytes <= budget:
            return
        for other in [r for r in self.inflight if r.obj is None and r is not res]:
            self._settle(other, wait=True)
        in_use = self._in_use() | {res.id}
        victims = sorted(
            (r for r in self.acts.values() if r.counted and r.copy is None and r.id not in in_use),
            key=lambda r: (self._next_use(r.id), r.id),
            reverse=True,
        )
        for victim in victims:
            if self.resident + res.nbytes <= budget:
                break
            self.engine.swap_out(victim)
            self._after_copy(victim)
            self._settle(victim, wait=True)
            self.guarded.add(victim.id)
            if self.stats:
                self.stats[-1].guard_evictions += 1
        if self.resident + res.nbytes > budget:
            k = self.k
            where = f"before op {k} ({self.plan.op_label(k)})" if k < self.s.n_ops else "after the last op"
            message = (
                f"{where}: {what} {res.name!r} needs {res.nbytes} bytes, and {self.resident} bytes of saved "
                f"activations stay resident with every other one moved to the host (this op and its autograd "
                f"node use them): {self.resident + res.nbytes} bytes is over the budget of {budget} bytes "
                f"(budget_mb={budget / 1e6:g}), below what one op needs"
            )
            self.in_iter = False
            self.broken = message
            raise BudgetError(message)

    def _next_use(self, sid: int) -> int:
        """The next backward op from the current one that reads ``sid``
        (past the last op when none does)."""
        reads = self.s.backward_reads.get(sid, [])
        i = bisect.bisect_left(reads, self.k)
        return reads[i] if i < len(reads) else self.s.n_ops

    def _in_use(self) -> set[int]:
        """The saved storages the guard must not move now: those of the op
        that ran last and the op about to run (in the backward pass, of
        their whole autograd nodes, whose saved tensors autograd unpacks
        before the node's first op), and in the backward pass those no
        backward op reads any more (their node is running)."""
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

    def _swap_out_overdue(self) -> None:
        """Swaps out the storages autograd saved while the plan had them on
        the host: their swap-out fired before they were saved (and found
        nothing to move), or they were saved again after it."""
        overdue, self.overdue = self.overdue, []
        for res in overdue:
            if res.id in self.planned_host and res.on_device and res.copy is None and res.live > 0:
                self.engine.swap_out(res)
                self._after_copy(res)
                self.stats[-1].deferred_swap_outs += 1

    def _after_copy(self, res: Residence) -> None:
        if res.copy is not None:
            self.inflight.add(res)
        self._recount(res)

    def _settle(self, res: Residence, wait: bool) -> None:
        if self.engine.settle(res, wait):
            self.inflight.discard(res)
            obj = res.obj
            if obj is not None and res.dev is None and res.host is not None:
                obj.data = view_of(res.host.untyped_storage(), *res.meta)
            if obj is None and res.live == 0:
                res.dev = None
                self.engine.drop_host(res)
            self._recount(res)

    def _persist_out(self, res: Residence) -> None:
        self.engine.swap_out(res)
        self._after_copy(res)
        self._settle(res, wait=False)

    def _persist_in(self, res: Residence) -> None:
        self._settle(res, wait=True)
        self.engine.swap_in(res)
        assert res.dev is not None
        res.obj.data = view_of(res.dev, *res.meta)
        self._after_copy(res)

    def _fetch_persistent(self, flat: list[Any]) -> None:
        for a in flat:
            res = getattr(a, "_tensile_res", None) if isinstance(a, torch.Tensor) else None
            if res is None:
                continue
            if res.copy is not None and res.copy.direction == "out":
                # The op may write it: its swap-out must not finish with stale bytes.
                with _disable_current_modes():
                    self._settle(res, wait=True)
            if not res.on_device:
                started = time.perf_counter_ns()
                with _disable_current_modes():
                    self._persist_in(res)
                    self._settle(res, wait=True)
                self._count_late(res, time.perf_counter_ns() - started)
            self.engine.before_use(res)

    # -- saved tensors -----------------------------------------------------

    def pack(self, t: torch.Tensor) -> _Saved:
        with _disable_current_modes(), self.lock:
            held = t if t.grad_fn is None else t.detach()
            tid = getattr(t, "_tensile_tid", None)
            if not self.in_iter or tid is None:
                return _Saved(self, None, held, None)
            sid = self.s.root[tid]
            if self.s.kind[sid] != "activation" or t.device != self.device:
                return _Saved(self, None, held, None)
            storage = t.untyped_storage()
            res = self.acts.get(sid)
            if res is not None and res.dev is not None and not _same_storage(res.dev, storage):
                return _Saved(self, None, held, None)  # eager and traced storages disagree: not managed
            if res is None:
                res = Residence(sid, self.s.names[sid], t.device, storage.nbytes())
                self._make_room(res, "saving")
                res.dev = storage
                self.acts[sid] = res
            elif res.dev is None and res.copy is None:
                self._make_room(res, "saving")
                res.dev = storage  # saved again after a swap-out: it is still on the device
                self.engine.drop_host(res)
            elif res.live == 0:
                self._make_room(res, "saving")
            res.live += 1
            self._recount(res)
            if sid in self.planned_host and self.in_iter:
                self.overdue.append(res)  # moved at the next op boundary
            return _Saved(self, res, None, (t.dtype, t.storage_offset(), t.size(), t.stride()))

    def unpack(self, h: _Saved) -> torch.Tensor:
        if h.res is None:
            return h.tensor  # type: ignore[return-value]
        with _disable_current_modes(), self.lock:
            res = h.res
            if self.in_iter and self.checking:
                self._flush()  # a boundary between ops: the last op's prefetches are due
            if res.copy is not None and res.copy.direction == "out":
                self._settle(res, wait=True)
            if not res.on_device:
                started = time.perf_counter_ns()
                self._make_room(res, "fetching")
                self.engine.swap_in(res)
                self._after_copy(res)
                self._settle(res, wait=True)
                if self.stats:
                    self._count_late(res, time.perf_counter_ns() - started)
                    if self.in_iter and self.checking and res.id not in self.guarded:
                        self._retime(res.id)
            self.engine.before_use(res)
            assert res.dev is not None
            return view_of(res.dev, *h.meta)

    def _count_late(self, res: Residence, waited_ns: int) -> None:
        stats = self.stats[-1]
        stats.late += 1
        stats.late_storages.append(res.name)
        stats.stall_ns += waited_ns
        if res.id in self.s.prefetched and res.id not in self.guarded:
            stats.late_prefetches.append(res.id)
        else:
            # No prefetch planned, or the guard moved it or held its
            # prefetch back (as the Rust executor counts it: a passive swap).
            stats.passive_swaps += 1

    def measurements(self, index: int = -1) -> dict[str, Any]:
        """One iteration's measurements in the shape of the scheduler's
        ``ReportLatenciesRequest`` (``proto/tensile/v1/tensile.proto``):
        ``op_latency_s`` (by op id; empty unless every op was timed, which
        needs a checked optimizer step, and on CUDA the op timer), ``stall_s``,
        ``late_prefetches`` (storage ids whose planned prefetch came late),
        ``passive_swaps`` and ``peak_bytes`` (the resident saved bytes' peak:
        the hook does not see the rest of the memory)."""
        stats = self.stats[index]
        complete = len(stats.op_ns) == self.s.n_ops
        return {
            "iteration": len(self.stats) + index if index < 0 else index,
            "plan_version": stats.plan_version,
            "op_latency_s": [stats.op_ns[k] / 1e9 for k in range(self.s.n_ops)] if complete else [],
            "stall_s": stats.stall_ns / 1e9,
            "late_prefetches": list(stats.late_prefetches),
            "passive_swaps": stats.passive_swaps,
            "peak_bytes": stats.peak_saved_bytes,
        }

    def _retime(self, sid: int) -> None:
        """Moves a prefetch that came too late to just before this node.

        Autograd unpacks all of a node's saved tensors before the node's
        first op, while the plan places a prefetch before the first op that
        reads the storage, which may be inside that node. The first
        iteration that finds such a prefetch still pending here moves it to
        the op that ended last, so later iterations issue it in time."""
        here = self.k - 1
        for t in sorted(k for k in self.after if k > here):
            for ev in self.after[t]:
                if ev.storage == sid and ev.kind == "swap_in":
                    self.after[t].remove(ev)
                    self.after.setdefault(here, []).append(ev)
                    self.stats[-1].retimed += 1
                    return

    def _handle_gone(self, res: Residence) -> None:
        with self.lock:
            res.live -= 1
            if res.live == 0:
                if res.copy is None:
                    res.dev = None
                    self.engine.drop_host(res)
                self._recount(res)

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
                    stats.max_saved_bytes = max(stats.max_saved_bytes, self.resident)


_KINDS: dict[Any, tuple[bool, bool]] = {}


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
    """The tensors of an ATen call's arguments or results, in order: a
    tensor, or a tuple, list or dict of tensors and of lists of tensors
    (``Tensor[]``, ``Tensor?[]``), the only nesting ATen schemas have."""
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


def _timing_of(plan: Plan, n_ops: int, what: str = "the plan") -> tuple[Gate | None, list[int]]:
    """A plan's gate and pace (``tensile.hook.gate``), checked."""
    try:
        return gate_of(plan.plan), pace_of(plan.plan, n_ops)
    except ValueError as e:
        raise PlanApplyError(f"{what}'s {e}") from None


def _sleep_until(deadline_ns: int) -> None:
    """Sleeps until ``time.monotonic_ns()`` reaches ``deadline_ns``."""
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


def _same_storage(a: torch.UntypedStorage, b: torch.UntypedStorage) -> bool:
    # Both storages are alive here, so equal StorageImpl addresses mean the
    # same storage; the address is compared, never kept as a key.
    return a._cdata == b._cdata


def _device_of(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    raise PlanApplyError(f"{type(model).__name__} has no parameters")
