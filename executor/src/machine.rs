//! The executor of one job as a state machine that owns no clock
//! and no copies: its driver tells it the time, runs the kernels it asks
//! for, and owns the copy engine it carries out swaps on (virtual time in
//! the simulator, real copies in the worker). It runs ops in order, fires
//! plan events after their trigger ops through the Execution Queue, waits
//! for late prefetches, swaps in passively when nothing was planned, and
//! never frees a storage while a copy of it is in flight. Allocations and
//! frees are handed to the driver as [`Effect`]s: the simulator counts
//! bytes, the worker holds tensors.
//!
//! Memory changes only at op boundaries, frees before allocations, which is
//! exactly the model the planner predicts with: with exact latencies the
//! measured peak equals the predicted one.

use tensile_graph::{Graph, Liveness, OpId, StorageId, TensorId};
use tensile_planner::{Event, EventKind, Plan, Trigger};
use tensile_swap_executor::{CopyEngine, Dir, ExecutionQueue};

use crate::guard::Room;
use crate::host_ops::HostInFlight;
use crate::interface::{Effect, ExecError, ExecOptions, IterationStats, Next};
use crate::schedule::{Schedule, uses};
use crate::state::{Device, Host, InFlight, Slot, Wake};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Start,
    Before,
    Running { op: OpId, recompute: bool },
    End,
}

/// One job's executor over the copy engine `C`.
#[derive(Debug)]
pub struct Executor<'g, C> {
    pub(crate) graph: &'g Graph,
    pub(crate) live: &'g Liveness,
    pub(crate) schedule: Schedule,
    pub(crate) options: ExecOptions,
    next_plan: Option<Plan>,
    plan_version: u64,
    iterations: usize,
    pub(crate) iteration: usize,
    phase: Phase,
    pub(crate) pc: usize,
    pub(crate) before_idx: usize,
    pub(crate) slots: Vec<Slot>,
    pub(crate) mem: u64,
    base_bytes: u64,
    pub(crate) engine: C,
    /// Storages with a copy in flight, looked at when the engine is polled.
    pub(crate) flying: Vec<StorageId>,
    /// Copies no storage waits for, forgotten once they have ended.
    pub(crate) retired: Vec<InFlight>,
    /// Swap events waiting for their delay.
    pub(crate) queue: ExecutionQueue<Event>,
    /// Swap-outs due while their storage's prefetch, of unknown end, was in
    /// flight: (fire time, storage).
    pub(crate) deferred_outs: Vec<(u64, StorageId)>,
    kernel_start: u64,
    /// Late prefetches the next kernel waits on: (storage, since when).
    late_since: Vec<(StorageId, u64)>,
    /// Since when the executor waits for a copy whose end it did not know.
    waiting_since: Option<u64>,
    /// The same, at the end of an iteration whose host ops run on.
    pub(crate) host_since: Option<u64>,
    pub(crate) cur: IterationStats,
    done: Vec<IterationStats>,
    effects: Vec<Effect>,
    /// When each storage was last allocated or used by an op, for the
    /// passive eviction's least-recently-used order.
    pub(crate) last_use: Vec<u64>,
    /// The storage the running recompute restores.
    recompute_target: Option<StorageId>,
    /// The most device memory the job may hold now (see
    /// [`Executor::set_limit`]).
    pub(crate) limit: Option<u64>,
    /// Prefetches that fired while the limit had no room for them: started
    /// at a later boundary once it has, or fetched by their op.
    pub(crate) deferred_ins: Vec<Event>,
    /// Since when the executor waits for memory under its limit.
    pub(crate) memory_since: Option<u64>,
    /// What waits for memory: (op, bytes needed, limit).
    pub(crate) blocked: Option<(OpId, u64, u64)>,
    pub(crate) limit_may_rise: bool,
    /// Per storage, the ops that read or write it, in order.
    pub(crate) uses: Vec<Vec<u32>>,
    /// Host ops on the engine's host, in submission order.
    pub(crate) host_runs: Vec<HostInFlight>,
    /// Host runs to submit again (an input's swap-out failed).
    pub(crate) host_retry: Vec<OpId>,
    /// Prefetches due while a host run was still rewriting their storage:
    /// their buffers exist; their copies start once it has ended.
    pub(crate) parked_ins: Vec<Event>,
    /// A host run failed: the next step says so.
    pub(crate) host_error: Option<ExecError>,
}

impl<'g, C: CopyEngine> Executor<'g, C> {
    pub fn new(
        graph: &'g Graph,
        live: &'g Liveness,
        plan: &Plan,
        engine: C,
        iterations: usize,
    ) -> Executor<'g, C> {
        let n = graph.ops().len();
        Executor {
            graph,
            live,
            schedule: Schedule::new(plan, live, n),
            options: ExecOptions::default(),
            next_plan: None,
            plan_version: plan.version,
            iterations,
            iteration: 0,
            phase: Phase::Start,
            pc: 0,
            before_idx: 0,
            slots: vec![Slot::GONE; live.storages.len()],
            mem: 0,
            base_bytes: 0,
            engine,
            flying: Vec::new(),
            retired: Vec::new(),
            queue: ExecutionQueue::new(),
            deferred_outs: Vec::new(),
            kernel_start: 0,
            late_since: Vec::new(),
            waiting_since: None,
            host_since: None,
            cur: IterationStats::default(),
            done: Vec::new(),
            effects: Vec::new(),
            last_use: vec![0; live.storages.len()],
            recompute_target: None,
            limit: None,
            deferred_ins: Vec::new(),
            memory_since: None,
            blocked: None,
            limit_may_rise: false,
            uses: uses(graph, live),
            host_runs: Vec::new(),
            host_retry: Vec::new(),
            parked_ins: Vec::new(),
            host_error: None,
        }
    }

    /// The most device memory the job may hold from now on (`None`: no
    /// limit), the guard that keeps a run within the budget its plan was
    /// made for whatever the latencies do: an allocation that would pass
    /// it waits for the job's own frees in flight, then evicts resident
    /// storages the op does not touch to the host (least recently used
    /// first; fetched back on demand), then waits for memory to free
    /// elsewhere ([`Next::WaitForMemory`]); a prefetch that would pass it
    /// is held back until there is room (or its op fetches it). The driver
    /// sets it before every call: the simulator from the budget less what
    /// the other jobs hold, the worker from its `--memory-mb`.
    pub fn set_limit(&mut self, limit: Option<u64>) {
        self.limit = limit;
    }

    /// Whether the limit may rise while the job waits (other jobs run and
    /// will free memory): an op over the limit then waits for that before
    /// it evicts anything, since evicting costs copies that the plans did
    /// not count and a job that is off its schedule finds it again by
    /// waiting. False (the default, and the worker's): it evicts at once.
    pub fn set_limit_may_rise(&mut self, may_rise: bool) {
        self.limit_may_rise = may_rise;
    }

    /// The persistent storages the next iteration starts on the host.
    pub(crate) fn starts_on_host(&self) -> Vec<StorageId> {
        match &self.next_plan {
            Some(p) => p
                .start_on_host
                .iter()
                .map(|t| self.live.storage_of[t.index()])
                .collect(),
            None => self.schedule.start_on_host.clone(),
        }
    }

    /// Switches to `plan` at the next iteration boundary.
    pub fn set_plan(&mut self, plan: Plan) {
        self.next_plan = Some(plan);
    }

    /// Sets how copies and memory are run (see [`ExecOptions`]).
    pub fn set_options(&mut self, options: ExecOptions) {
        self.options = options;
    }

    /// The copy engine (the simulator's logs every copy, for checks).
    pub fn engine(&self) -> &C {
        &self.engine
    }

    /// The copy engine, for a driver that tells it of the device buffers
    /// it holds (the worker's host engine).
    pub fn engine_mut(&mut self) -> &mut C {
        &mut self.engine
    }

    /// The kernel asked for by the last [`Next::Kernel`], if it runs now,
    /// and whether it recomputes a dropped tensor (only the recomputed
    /// storage is then taken from its outputs).
    pub fn running(&self) -> Option<(OpId, bool)> {
        match self.phase {
            Phase::Running { op, recompute } => Some((op, recompute)),
            _ => None,
        }
    }

    /// The storage a recompute restores: the one allocated for it.
    pub fn recompute_target(&self) -> Option<StorageId> {
        self.recompute_target
    }

    /// Fixed memory of the job (context, workspaces), held throughout.
    pub fn set_base_bytes(&mut self, bytes: u64) {
        self.mem = self.mem - self.base_bytes + bytes;
        self.base_bytes = bytes;
    }

    pub fn plan_version(&self) -> u64 {
        self.plan_version
    }

    pub fn iterations_done(&self) -> &[IterationStats] {
        &self.done
    }

    /// The allocations and frees since the last call, in order.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// Storages on the device now.
    pub fn resident(&self) -> Vec<StorageId> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].on_device())
            .map(|i| StorageId(i as u32))
            .collect()
    }

    /// Where the executor has storage `s` now (its device buffer and host
    /// copy), in the iteration and plan it is at: for errors that find an
    /// engine's data elsewhere than the executor has it.
    pub fn whereabouts(&self, s: StorageId) -> String {
        let slot = self.slots.get(s.index());
        format!(
            "the executor has storage {} as {slot:?} in iteration {} on plan version {}",
            s.0, self.iteration, self.plan_version
        )
    }

    /// Device memory of the job now (base included).
    pub fn memory_bytes(&self) -> u64 {
        self.mem
    }

    pub(crate) fn bytes(&self, s: StorageId) -> u64 {
        self.live.storages[s.index()].bytes
    }

    pub(crate) fn alloc(&mut self, s: StorageId, now: u64) {
        if !self.slots[s.index()].on_device() {
            self.slots[s.index()].device = Device::Ready { since: now };
            self.mem += self.bytes(s);
            self.cur.peak_bytes = self.cur.peak_bytes.max(self.mem);
            self.last_use[s.index()] = now;
            if let Some(b) = self.options.evict_budget_bytes {
                let over = self.mem.saturating_sub(b);
                self.cur.over_budget_bytes = self.cur.over_budget_bytes.max(over);
            }
            self.effects.push(Effect::Alloc(s));
        }
    }

    pub(crate) fn free(&mut self, s: StorageId) {
        let slot = &mut self.slots[s.index()];
        if slot.on_device() {
            if let Device::Arriving(c) = slot.device {
                self.retire(c);
            }
            let slot = &mut self.slots[s.index()];
            slot.device = Device::Absent;
            slot.release_pending = false;
            slot.out_failed = false;
            self.mem -= self.live.storages[s.index()].bytes;
            self.engine.device_freed(s);
            self.effects.push(Effect::Free(s));
        }
    }

    /// Frees what may be freed at a boundary: finished swap-outs and
    /// pending releases with no copy in flight.
    pub(crate) fn boundary_frees(&mut self, now: u64) {
        for i in 0..self.slots.len() {
            let slot = self.slots[i];
            let s = StorageId(i as u32);
            if let Host::Writing { copy, keep } = slot.host
                && copy.done(now)
            {
                self.engine.forget(copy.id);
                self.slots[i].host = Host::Valid;
                if !keep || slot.device == Device::Invalid {
                    self.free(s);
                }
                continue;
            }
            if slot.release_pending && slot.writing().is_none() && slot.ready(now) {
                self.free(s);
            }
        }
    }

    pub(crate) fn fire(&mut self, e: Event, now: u64) {
        let s = self.live.storage_of[e.tensor.index()];
        match e.kind {
            EventKind::Release => {
                // Ops that ran ahead of the plan can reach a release before
                // the planned start of the swap-out it follows: start that
                // swap-out now, or the release would drop the only copy.
                let live = self.live;
                let queued = self.queue.bring_forward(now, |q| {
                    q.kind == EventKind::SwapOut && live.storage_of[q.tensor.index()] == s
                });
                if queued {
                    self.run_queue(now);
                }
                let slot = self.slots[s.index()];
                let last_use = matches!(e.trigger, Trigger::After(op)
                    if self.live.storages[s.index()].freed_after == Some(op));
                if slot.out_failed && !last_use {
                    // Its swap-out failed: this buffer is the only copy.
                    return;
                }
                if slot.writing().is_some() || (slot.on_device() && !slot.ready(now)) {
                    self.slots[s.index()].release_pending = true;
                } else {
                    self.free(s);
                }
            }
            EventKind::SwapIn => {
                // The buffer exists from the trigger on; the copy waits for
                // its delay.
                if !self.slots[s.index()].on_device() && !self.prefetch_buffer(e, s, now) {
                    return;
                }
                let at = self.fire_at(&e, now);
                self.queue.push(at, e);
            }
            EventKind::SwapOut => {
                let at = self.fire_at(&e, now);
                self.queue.push(at, e);
            }
            EventKind::Recompute => {}
        }
    }

    /// Allocates the buffer that prefetch `e` brings storage `s` (not on
    /// the device) into, waiting for its copy (`Device::Awaiting`); false
    /// when there is no room for it: under Capuchin's budget the prefetch
    /// is dropped (its op fetches the data, making room first), under the
    /// limit it is held back until there is room.
    pub(crate) fn prefetch_buffer(&mut self, e: Event, s: StorageId, now: u64) -> bool {
        let bytes = self.bytes(s);
        if (self.options.evict_budget_bytes).is_some_and(|b| self.mem + bytes > b) {
            return false;
        }
        if self.limit.is_some_and(|l| self.mem + bytes > l) {
            self.deferred_ins.push(e);
            self.cur.held_back += 1;
            return false;
        }
        self.alloc(s, now);
        self.slots[s.index()].device = Device::Awaiting;
        true
    }

    /// When a copy fired at `now` starts: its delay after the trigger, or,
    /// on a paced plan, its planned moment in the iteration once the job
    /// is behind it (a job that fell behind and catches up keeps its
    /// copies on the planned time line rather than late by what it lost).
    fn fire_at(&self, e: &Event, now: u64) -> u64 {
        let late = now + e.delay_ns;
        let Trigger::After(op) = e.trigger else {
            return late;
        };
        let planned_end = match self.schedule.op_start.get(op.index() + 1) {
            Some(&next) => next,
            None => return late,
        };
        let planned = self.cur.start_ns + planned_end + e.delay_ns;
        planned.clamp(now, late)
    }

    /// Makes every input of `op` present, or says when to look again.
    fn inputs_ready(&mut self, op: OpId, now: u64) -> Result<Option<Wake>, ExecError> {
        let graph = self.graph;
        let mut wait = None::<Wake>;
        for &t in &graph.op(op).inputs {
            let s = self.live.storage_of[t.index()];
            let slot = self.slots[s.index()];
            if slot.ready(now) {
                continue;
            }
            match slot.device {
                Device::Awaiting | Device::Arriving(_) => {
                    if !self.late_since.iter().any(|l| l.0 == s) {
                        self.late_since.push((s, now));
                    }
                    if let Device::Arriving(c) = slot.device {
                        let end = Wake::of(c);
                        wait = Some(wait.map_or(end, |w| w.max(end)));
                    } else {
                        // Allocated for a prefetch still in the queue.
                        let pending = Wake::At(self.queue.next_due().unwrap_or(now));
                        wait = Some(wait.map_or(pending, |w| w.min(pending)).max(Wake::At(now)));
                    }
                }
                Device::Absent if slot.host_valid() => {
                    self.alloc(s, now);
                    let copy = self.submit(s, Dir::ToDevice, now);
                    self.slots[s.index()].device = Device::Arriving(copy);
                    self.cur.passive_swaps += 1;
                    let end = Wake::of(copy);
                    wait = Some(wait.map_or(end, |w| w.max(end)));
                }
                Device::Invalid => {
                    // Fetched again once the copy that reads it is done.
                    if let Some(w) = slot.writing() {
                        let end = Wake::of(w);
                        wait = Some(wait.map_or(end, |x| x.max(end)));
                    }
                }
                Device::Absent | Device::Ready { .. } => {
                    return Err(ExecError::Lost {
                        op: op.0,
                        name: graph.op(op).name.clone(),
                        tensor: t.0,
                    });
                }
            }
        }
        Ok(wait)
    }

    /// When the last swap-out in flight of a storage that `op` writes ends.
    fn outputs_copying(&self, op: OpId) -> Option<Wake> {
        self.graph
            .op(op)
            .outputs
            .iter()
            .filter_map(|t| self.slots[self.live.storage_of[t.index()].index()].writing())
            .map(Wake::of)
            .max()
    }

    /// Until when the compute stream waits for swap-outs in flight under
    /// [`ExecOptions::sync_swap_out`] (none may remain) or
    /// [`ExecOptions::max_swap_outs_in_flight`]: the end of the copy that
    /// brings their number down to what is allowed; `None`: go on now.
    fn swap_out_gate(&self, now: u64) -> Option<Wake> {
        let allowed = if self.options.sync_swap_out {
            0
        } else {
            self.options.max_swap_outs_in_flight?
        };
        let mut ends: Vec<Wake> = self
            .slots
            .iter()
            .filter_map(|s| s.writing())
            .map(Wake::of)
            .filter(|&d| d > Wake::At(now))
            .collect();
        let excess = ends.len().checked_sub(allowed.saturating_add(1))?;
        Some(*ends.select_nth_unstable(excess).1)
    }

    /// Waits for the job's own frees in flight to make room: under the
    /// guard's limit the wait counts as a wait for memory too.
    fn wait_for_room(&mut self, w: Wake, now: u64) -> Next {
        if let (Some(_), Wake::At(t)) = (self.limit, w) {
            self.cur.memory_wait_ns += t.saturating_sub(now);
        }
        self.wait(w, now)
    }

    /// Tells the driver to wait, counting the stall.
    pub(crate) fn wait(&mut self, w: Wake, now: u64) -> Next {
        match w {
            Wake::At(t) => {
                self.cur.stall_ns += t.saturating_sub(now);
                Next::WaitUntil(t)
            }
            Wake::Unknown => {
                self.waiting_since.get_or_insert(now);
                Next::WaitForCopy
            }
        }
    }

    /// Advances until the next kernel, wait or the end.
    pub fn step(&mut self, now: u64) -> Result<Next, ExecError> {
        self.refresh(now);
        if let Some(since) = self.waiting_since.take() {
            self.cur.stall_ns += now.saturating_sub(since);
        }
        if let Some(since) = self.host_since.take() {
            self.cur.host_wait_ns += now.saturating_sub(since);
        }
        if let Some(since) = self.memory_since.take() {
            self.cur.stall_ns += now.saturating_sub(since);
            self.cur.memory_wait_ns += now.saturating_sub(since);
        }
        if let Some(err) = self.host_error.take() {
            return Err(err);
        }
        loop {
            self.run_queue(now);
            match self.phase {
                Phase::Start => {
                    if self.iteration == self.iterations {
                        return Ok(Next::Done);
                    }
                    match self.start_room(now) {
                        Room::Go => {}
                        Room::Wait(w) => return Ok(self.wait_for_room(w, now)),
                        Room::Full => return Ok(self.wait_for_memory(now)),
                    }
                    self.begin_iteration(now)?;
                }
                Phase::Before => {
                    if self.pc == self.graph.ops().len() {
                        self.phase = Phase::End;
                        continue;
                    }
                    if self.graph.ops()[self.pc].on_host() {
                        match self.host_op(now)? {
                            Some(next) => return Ok(next),
                            None => continue,
                        }
                    }
                    return self.before_op(now);
                }
                Phase::Running { .. } => return Ok(Next::WaitUntil(now)),
                Phase::End => return Ok(self.end_phase(now)),
            }
        }
    }

    /// Before the op at `pc`: frees, waits, recomputations, then its kernel.
    fn before_op(&mut self, now: u64) -> Result<Next, ExecError> {
        let op = OpId(self.pc as u32);
        self.boundary_frees(now);
        self.retry_deferred(now);
        if let Some(next) = self.pace(now) {
            return Ok(next);
        }
        if let Some(w) = self.swap_out_gate(now) {
            return Ok(self.wait(w, now));
        }
        // Recomputations and their releases, in order.
        while self.before_idx < self.schedule.before[self.pc].len() {
            let e = self.schedule.before[self.pc][self.before_idx];
            let s = self.live.storage_of[e.tensor.index()];
            if e.kind == EventKind::Release {
                self.before_idx += 1;
                self.fire(e, now);
                continue;
            }
            let producer = self.graph.producer(e.tensor);
            let present = self.slots[s.index()].on_device();
            let (Some(p), false) = (producer, present) else {
                self.before_idx += 1;
                continue;
            };
            match self.make_room(p, op, now) {
                Room::Go => {}
                Room::Wait(w) => return Ok(self.wait_for_room(w, now)),
                Room::Full => return Ok(self.wait_for_memory(now)),
            }
            if let Some(w) = self.inputs_ready(p, now)? {
                return Ok(self.wait(w, now));
            }
            self.before_idx += 1;
            self.alloc(s, now);
            self.slots[s.index()].device = Device::Ready { since: now };
            self.start_kernel(now);
            self.recompute_target = Some(s);
            self.cur.recomputed_ops += 1;
            self.phase = Phase::Running {
                op: p,
                recompute: true,
            };
            return Ok(Next::Kernel { op: p });
        }
        match self.make_room(op, op, now) {
            Room::Go => {}
            Room::Wait(w) => return Ok(self.wait_for_room(w, now)),
            Room::Full => return Ok(self.wait_for_memory(now)),
        }
        if let Some(w) = self.inputs_ready(op, now)? {
            return Ok(self.wait(w, now));
        }
        // Never write a storage while a copy of it is in flight.
        if let Some(w) = self.outputs_copying(op) {
            return Ok(self.wait(w, now));
        }
        for i in 0..self.graph.op(op).outputs.len() {
            let t = self.graph.op(op).outputs[i];
            let s = self.live.storage_of[t.index()];
            if self.live.storages[s.index()].host_master {
                // Only a view of it (no device op writes what a host op
                // does): its host copy stays the current one.
                continue;
            }
            self.alloc(s, now);
            if self.slots[s.index()].host_valid() {
                self.engine.discard_host(s);
            }
            let slot = &mut self.slots[s.index()];
            slot.host = Host::None;
            slot.out_failed = false;
            // A release still waiting (for a copy, or for a prefetch that
            // kept the buffer) was for the value this op replaces: the new
            // value has no other copy.
            slot.release_pending = false;
            slot.device = Device::Ready { since: now };
        }
        self.start_kernel(now);
        self.phase = Phase::Running {
            op,
            recompute: false,
        };
        Ok(Next::Kernel { op })
    }

    /// A coordinated plan's pace: never ahead of the planned time line, on
    /// which its copies and the other jobs' memory are timed.
    pub(crate) fn pace(&mut self, now: u64) -> Option<Next> {
        if self.before_idx != 0 {
            return None;
        }
        let due = self.cur.start_ns + self.schedule.op_start.get(self.pc)?;
        if due <= now {
            return None;
        }
        self.cur.paced_ns += due - now;
        Some(Next::WaitUntil(due))
    }

    /// After the last op: waits for the copies the iteration owes, then
    /// ends it.
    fn end_phase(&mut self, now: u64) -> Next {
        // Swap-outs of persistent storage may run on into the next
        // iteration (across-iteration swaps): start those still waiting for
        // their delay now, and wait for none.
        let live = self.live;
        let persistent = |t: TensorId| live.storages[live.storage_of[t.index()].index()].persistent;
        if self.queue.bring_forward(now, |e| {
            e.kind == EventKind::SwapOut && persistent(e.tensor)
        }) {
            self.run_queue(now);
        }
        let last = self
            .queue
            .last_due()
            .map(Wake::At)
            .into_iter()
            .chain(
                self.slots
                    .iter()
                    .zip(&live.storages)
                    .filter(|(_, st)| !st.persistent)
                    .filter_map(|(s, _)| s.writing())
                    .map(Wake::of),
            )
            .chain(self.slots.iter().filter_map(Slot::ready_at))
            .chain((!self.deferred_outs.is_empty()).then_some(Wake::Unknown))
            .chain(self.host_runs_end())
            .max()
            .unwrap_or(Wake::At(now));
        if last > Wake::At(now) {
            if self.cur.host_runs > 0 {
                // The program's own host work and the copies around it,
                // not a stall of the plan.
                return self.wait_for_host(last, now);
            }
            return self.wait(last, now);
        }
        self.boundary_frees(now);
        self.end_iteration(now);
        Next::IterationDone
    }

    /// Notes the start of a kernel and how long it waited for late prefetches.
    fn start_kernel(&mut self, now: u64) {
        self.kernel_start = now;
        for (s, since) in std::mem::take(&mut self.late_since) {
            let root = self.live.storages[s.index()].root;
            self.cur.late_prefetches.push((root, now - since));
        }
    }

    /// The kernel started by the last [`Next::Kernel`] has ended.
    pub fn kernel_done(&mut self, now: u64) {
        let Phase::Running { op, recompute } = self.phase else {
            return;
        };
        self.refresh(now);
        self.phase = Phase::Before;
        self.touch(op, now);
        if recompute {
            return;
        }
        self.cur.op_ns[op.index()] = now - self.kernel_start;
        self.op_ended(op, now);
    }

    /// What happens at the end of `op`: its events fire, the cursor moves
    /// on. Frees before allocations at a boundary, as the planner counts;
    /// copies due by now are on the engine first.
    pub(crate) fn op_ended(&mut self, op: OpId, now: u64) {
        self.run_queue(now);
        let events = std::mem::take(&mut self.schedule.after[op.index()]);
        for e in events.iter().filter(|e| e.kind == EventKind::Release) {
            self.fire(*e, now);
        }
        self.boundary_frees(now);
        self.retry_deferred(now);
        for e in events.iter().filter(|e| e.kind != EventKind::Release) {
            self.fire(*e, now);
        }
        self.schedule.after[op.index()] = events;
        self.pc += 1;
        self.before_idx = 0;
    }

    fn begin_iteration(&mut self, now: u64) -> Result<(), ExecError> {
        let mut switched = false;
        if let Some(p) = self.next_plan.take() {
            switched = p.version != self.plan_version;
            self.plan_version = p.version;
            self.schedule = Schedule::new(&p, self.live, self.graph.ops().len());
        }
        self.cur = IterationStats {
            start_ns: now,
            op_ns: vec![0; self.graph.ops().len()],
            plan_version: self.plan_version,
            switched,
            ..IterationStats::default()
        };
        for (i, st) in self.live.storages.iter().enumerate() {
            let s = StorageId(i as u32);
            let on_host = self.schedule.start_on_host.contains(&s);
            let slot = self.slots[i];
            if st.host_master && self.iteration == 0 {
                // A host op keeps it on the host; device ops read a copy.
                self.slots[i] = Slot {
                    host: Host::Valid,
                    ..Slot::GONE
                };
                if !on_host && !st.host_only {
                    self.alloc(s, now);
                    self.slots[i].device = Device::Ready { since: now };
                }
            } else if st.host_master && on_host && slot.on_device() && slot.ready(now) {
                // A new plan wants it on the host, where it is current.
                self.free(s);
            } else if st.persistent && self.iteration == 0 && on_host {
                self.slots[i] = Slot {
                    host: Host::Valid,
                    ..Slot::GONE
                };
            } else if st.persistent && on_host && slot.on_device() && slot.writing().is_none() {
                // A new plan wants it on the host: copy it out now.
                let copy = self.submit(s, Dir::ToHost, now);
                self.slots[i].host = Host::Writing { copy, keep: false };
                self.cur.passive_swaps += 1;
            } else if st.persistent
                && self.iteration > 0
                && !slot.on_device()
                && !slot.host_valid()
                && slot.writing().is_none()
            {
                // Its values are nowhere: a fresh buffer would train on
                // garbage.
                return Err(ExecError::LostPersistent {
                    tensor: st.root.0,
                    iteration: self.iteration,
                });
            } else if (st.persistent && !slot.on_device() && !slot.host_valid())
                || (!st.persistent && st.born.is_none())
            {
                self.alloc(s, now);
                self.slots[i].device = Device::Ready { since: now };
                if self.slots[i].writing().is_none() {
                    if self.slots[i].host_valid() {
                        self.engine.discard_host(s);
                    }
                    self.slots[i].host = Host::None;
                }
            }
        }
        self.cur.peak_bytes = self.mem;
        self.cur.start_bytes = self.mem;
        self.pc = 0;
        self.before_idx = 0;
        self.phase = Phase::Before;
        for i in 0..self.schedule.at_start.len() {
            let e = self.schedule.at_start[i];
            self.fire(e, now);
        }
        Ok(())
    }

    fn end_iteration(&mut self, now: u64) {
        // Prefetches still held back were fetched by their ops, or are for
        // storage that the iteration no longer needs.
        self.deferred_ins.clear();
        // Non-persistent storage does not outlive its iteration.
        for (i, st) in self.live.storages.iter().enumerate() {
            if !st.persistent {
                if self.slots[i].host_valid() {
                    self.engine.discard_host(StorageId(i as u32));
                    self.slots[i].host = Host::None;
                }
                self.free(StorageId(i as u32));
            }
        }
        self.cur.end_ns = now;
        self.done.push(std::mem::take(&mut self.cur));
        self.iteration += 1;
        self.phase = Phase::Start;
    }
}
