//! The executor of one job (SPEC §6) as a state machine over virtual time:
//! it runs ops in order, fires plan events after their trigger ops, waits
//! for late prefetches, swaps in passively when nothing was planned, and
//! never frees a storage while a copy of it is in flight.
//!
//! Memory changes only at op boundaries, frees before allocations, which is
//! exactly the model the planner predicts with: with exact latencies the
//! measured peak equals the predicted one.

use tensile_graph::{Graph, Liveness, OpId, StorageId, TensorId};
use tensile_planner::{Event, EventKind, Plan, Trigger};

use crate::copy::{Channels, Dir};

/// What the executor asks of its driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Run `op`'s kernel now; call [`Executor::kernel_done`] when it ends.
    Kernel { op: OpId },
    /// Nothing to do before this time; call [`Executor::step`] then.
    WaitUntil(u64),
    /// An iteration has just ended; call [`Executor::step`] again at the
    /// same time. A plan handed over now (after looking at the finished
    /// iteration's measurements) applies to the very next iteration.
    IterationDone,
    /// All iterations are done.
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    #[error("op {op} ({name}) needs tensor {tensor} but the plan dropped it with no host copy")]
    Lost { op: u32, name: String, tensor: u32 },
}

/// How the executor runs copies and memory, beyond what the plan says. The
/// defaults are TENSILE's executor; the other settings model baselines
/// (SPEC §10) in the same state machine.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExecOptions {
    /// The compute stream waits for every swap-out to end before it runs
    /// the next op (PyTorch's `save_on_cpu`: a synchronous copy to host).
    pub sync_swap_out: bool,
    /// At most this many swap-outs in flight when an op starts: when the
    /// events after an op leave more in flight, the next op first waits for
    /// the oldest to end (torchtune's OffloadActivations keeps a small stash
    /// of tensors in flight). The extra copies are queued at once: the copy
    /// lane is FIFO, so queueing them early moves no copy, only compute
    /// waits.
    pub max_swap_outs_in_flight: Option<usize>,
    /// Capuchin's passive mode: when an allocation would take the job's
    /// memory over this, evict resident non-persistent storages that the
    /// current op does not use, least recently accessed first, to the host
    /// (the op waits for the copies), and swap them back on demand. A
    /// planned prefetch that would not fit is left to its op to fetch.
    pub evict_budget_bytes: Option<u64>,
}

/// Per-iteration measurements.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IterationStats {
    pub start_ns: u64,
    pub end_ns: u64,
    pub peak_bytes: u64,
    pub stall_ns: u64,
    pub passive_swaps: usize,
    pub swapped_bytes: u64,
    pub recomputed_ops: usize,
    /// Measured latency of every op, indexed by op id (recomputes excluded).
    pub op_ns: Vec<u64>,
    /// Planned prefetches that arrived late: (storage root, how long the
    /// op waited for it).
    pub late_prefetches: Vec<(TensorId, u64)>,
    /// Device memory when the iteration began (base, persistent storage,
    /// inputs), as an allocator reports it before the first op: a planner
    /// that is not told the job's base can derive it from this.
    pub start_bytes: u64,
    /// Passive evictions under [`ExecOptions::evict_budget_bytes`], in
    /// order: (storage root, the op that needed the room). What Capuchin's
    /// passive mode observes besides `op_ns`: which tensors did not fit.
    pub evictions: Vec<(TensorId, OpId)>,
    /// How far the job's memory went over `evict_budget_bytes` at most
    /// (0: the budget held): when evicting everything evictable could not
    /// make room, the op ran anyway.
    pub over_budget_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loc {
    Gone,
    Device,
    Host,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    loc: Loc,
    /// A valid copy of the current data is on the host.
    host_valid: bool,
    /// The device data is there from this time (a swap-in's end).
    ready_at: u64,
    /// A swap-out in flight ends at this time; the buffer is freed at the
    /// first boundary after it.
    out_done: Option<u64>,
    /// Free once no copy is in flight.
    free_pending: bool,
    /// A swap-in came while the swap-out was in flight: keep the buffer.
    keep: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Start,
    Before,
    Running { op: OpId, recompute: bool },
    End,
}

/// Plan events indexed by where they fire.
#[derive(Debug, Clone, Default)]
struct Schedule {
    at_start: Vec<Event>,
    before: Vec<Vec<Event>>,
    after: Vec<Vec<Event>>,
    start_on_host: Vec<StorageId>,
}

impl Schedule {
    fn new(plan: &Plan, live: &Liveness, n: usize) -> Schedule {
        let mut s = Schedule {
            before: vec![Vec::new(); n],
            after: vec![Vec::new(); n],
            ..Schedule::default()
        };
        for e in &plan.events {
            match e.trigger {
                Trigger::IterationStart => s.at_start.push(*e),
                Trigger::Before(op) => s.before[op.index()].push(*e),
                Trigger::After(op) => s.after[op.index()].push(*e),
            }
        }
        s.start_on_host = plan
            .start_on_host
            .iter()
            .map(|t| live.storage_of[t.index()])
            .collect();
        s
    }
}

#[derive(Debug)]
pub struct Executor<'g> {
    graph: &'g Graph,
    live: &'g Liveness,
    schedule: Schedule,
    options: ExecOptions,
    next_plan: Option<Plan>,
    plan_version: u64,
    iterations: usize,
    iteration: usize,
    phase: Phase,
    pc: usize,
    before_idx: usize,
    slots: Vec<Slot>,
    mem: u64,
    base_bytes: u64,
    chans: Channels,
    /// Swap events waiting for their delay: (fire time, order, event).
    timers: Vec<(u64, u64, Event)>,
    timer_seq: u64,
    kernel_start: u64,
    /// Late prefetches the next kernel waits on: (storage, since when).
    late_since: Vec<(StorageId, u64)>,
    cur: IterationStats,
    done: Vec<IterationStats>,
    /// (time, bytes) at every change, for plots.
    pub trace: Vec<(u64, u64)>,
    /// When each storage was last allocated or used by an op, for the
    /// passive eviction's least-recently-used order.
    last_use: Vec<u64>,
}

impl<'g> Executor<'g> {
    pub fn new(
        graph: &'g Graph,
        live: &'g Liveness,
        plan: &Plan,
        chans: Channels,
        iterations: usize,
    ) -> Executor<'g> {
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
            slots: vec![
                Slot {
                    loc: Loc::Gone,
                    host_valid: false,
                    ready_at: 0,
                    out_done: None,
                    free_pending: false,
                    keep: false,
                };
                live.storages.len()
            ],
            mem: 0,
            base_bytes: 0,
            chans,
            timers: Vec::new(),
            timer_seq: 0,
            kernel_start: 0,
            late_since: Vec::new(),
            cur: IterationStats::default(),
            done: Vec::new(),
            trace: Vec::new(),
            last_use: vec![0; live.storages.len()],
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

    /// The job's copy channels, whose log shows every copy (for checks).
    pub fn channels(&self) -> &Channels {
        &self.chans
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

    /// Storages on the device now.
    pub fn resident(&self) -> Vec<StorageId> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].loc == Loc::Device)
            .map(|i| StorageId(i as u32))
            .collect()
    }

    pub fn memory_bytes(&self) -> u64 {
        self.mem
    }

    fn bytes(&self, s: StorageId) -> u64 {
        self.live.storages[s.index()].bytes
    }

    fn alloc(&mut self, s: StorageId, now: u64) {
        if self.slots[s.index()].loc != Loc::Device {
            self.slots[s.index()].loc = Loc::Device;
            self.mem += self.bytes(s);
            self.cur.peak_bytes = self.cur.peak_bytes.max(self.mem);
            self.last_use[s.index()] = now;
            if let Some(b) = self.options.evict_budget_bytes {
                let over = self.mem.saturating_sub(b);
                self.cur.over_budget_bytes = self.cur.over_budget_bytes.max(over);
            }
            self.trace.push((now, self.mem));
        }
    }

    fn free(&mut self, s: StorageId, now: u64) {
        let slot = &mut self.slots[s.index()];
        if slot.loc == Loc::Device {
            slot.loc = if slot.host_valid {
                Loc::Host
            } else {
                Loc::Gone
            };
            slot.free_pending = false;
            self.mem -= self.live.storages[s.index()].bytes;
            self.trace.push((now, self.mem));
        }
    }

    /// Starts the timers that are due, in fire order, on their channels.
    fn run_timers(&mut self, now: u64) {
        self.timers.sort_by_key(|t| (t.0, t.1));
        let due = self.timers.partition_point(|t| t.0 <= now);
        let fired: Vec<_> = self.timers.drain(..due).collect();
        for (at, _, e) in fired {
            let s = self.live.storage_of[e.tensor.index()];
            let bytes = self.bytes(s);
            match e.kind {
                EventKind::SwapOut => {
                    let slot = self.slots[s.index()];
                    // Copied even when a host copy exists: the plan counted
                    // the copy's time and the buffer until it completes.
                    if slot.loc == Loc::Device {
                        let start = at.max(slot.ready_at);
                        let end = self.chans.submit(Dir::ToHost, bytes, start);
                        self.slots[s.index()].out_done = Some(end);
                        self.cur.swapped_bytes += bytes;
                    }
                }
                EventKind::SwapIn => {
                    let slot = self.slots[s.index()];
                    if slot.out_done.is_some() {
                        self.slots[s.index()].keep = true;
                        continue;
                    }
                    if slot.loc == Loc::Device && slot.ready_at != u64::MAX {
                        continue;
                    }
                    let end = self.chans.submit(Dir::ToDevice, bytes, at);
                    let slot = &mut self.slots[s.index()];
                    slot.ready_at = end;
                    slot.free_pending = false;
                }
                _ => {}
            }
        }
    }

    /// Frees what may be freed at a boundary: finished swap-outs and
    /// pending releases with no copy in flight.
    fn boundary_frees(&mut self, now: u64) {
        for i in 0..self.slots.len() {
            let slot = self.slots[i];
            if let Some(d) = slot.out_done
                && d <= now
            {
                self.slots[i].out_done = None;
                self.slots[i].host_valid = true;
                if !slot.keep {
                    self.free(StorageId(i as u32), now);
                }
                self.slots[i].keep = false;
                continue;
            }
            if slot.free_pending && slot.out_done.is_none() && slot.ready_at <= now {
                self.free(StorageId(i as u32), now);
            }
        }
    }

    fn fire(&mut self, e: Event, now: u64) {
        let s = self.live.storage_of[e.tensor.index()];
        match e.kind {
            EventKind::Release => {
                let slot = self.slots[s.index()];
                if slot.out_done.is_some() || slot.ready_at > now {
                    self.slots[s.index()].free_pending = true;
                } else {
                    self.free(s, now);
                }
            }
            EventKind::SwapIn => {
                // The buffer exists from the trigger on; the copy waits for
                // its delay.
                if self.slots[s.index()].loc != Loc::Device {
                    // Under a budget, a prefetch that does not fit is not
                    // started: its op fetches it, making room first.
                    let bytes = self.bytes(s);
                    if (self.options.evict_budget_bytes).is_some_and(|b| self.mem + bytes > b) {
                        return;
                    }
                    self.alloc(s, now);
                    self.slots[s.index()].ready_at = u64::MAX;
                }
                self.push_timer(now + e.delay_ns, e);
            }
            EventKind::SwapOut => self.push_timer(now + e.delay_ns, e),
            EventKind::Recompute => {}
        }
    }

    fn push_timer(&mut self, at: u64, e: Event) {
        self.timers.push((at, self.timer_seq, e));
        self.timer_seq += 1;
    }

    /// Makes every input of `op` present, or says how long to wait.
    fn inputs_ready(&mut self, op: OpId, now: u64) -> Result<Option<u64>, ExecError> {
        let graph = self.graph;
        let mut wait = None::<u64>;
        for &t in &graph.op(op).inputs {
            let s = self.live.storage_of[t.index()];
            let slot = self.slots[s.index()];
            match slot.loc {
                Loc::Device if slot.ready_at <= now => {}
                Loc::Device => {
                    if !self.late_since.iter().any(|l| l.0 == s) {
                        self.late_since.push((s, now));
                    }
                    if slot.ready_at == u64::MAX {
                        // Allocated for a prefetch whose timer has not run.
                        let pending = self.timers.iter().map(|x| x.0).min().unwrap_or(now);
                        wait = Some(wait.map_or(pending, |w| w.min(pending)).max(now));
                    } else {
                        wait = Some(wait.map_or(slot.ready_at, |w| w.max(slot.ready_at)));
                    }
                }
                Loc::Host => {
                    self.alloc(s, now);
                    let end = self.chans.submit(Dir::ToDevice, self.bytes(s), now);
                    self.slots[s.index()].ready_at = end;
                    self.cur.passive_swaps += 1;
                    wait = Some(wait.map_or(end, |w| w.max(end)));
                }
                Loc::Gone => {
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
    fn outputs_copying(&self, op: OpId) -> Option<u64> {
        self.graph
            .op(op)
            .outputs
            .iter()
            .filter_map(|t| self.slots[self.live.storage_of[t.index()].index()].out_done)
            .max()
    }

    /// Until when the compute stream waits for swap-outs in flight under
    /// [`ExecOptions::sync_swap_out`] (none may remain) or
    /// [`ExecOptions::max_swap_outs_in_flight`]: the end of the copy that
    /// brings their number down to what is allowed; `None`: go on now.
    fn swap_out_gate(&self, now: u64) -> Option<u64> {
        let allowed = if self.options.sync_swap_out {
            0
        } else {
            self.options.max_swap_outs_in_flight?
        };
        let mut ends: Vec<u64> = self
            .slots
            .iter()
            .filter_map(|s| s.out_done)
            .filter(|&d| d > now)
            .collect();
        let excess = ends.len().checked_sub(allowed.saturating_add(1))?;
        Some(*ends.select_nth_unstable(excess).1)
    }

    /// Advances until the next kernel, wait or the end.
    pub fn step(&mut self, now: u64) -> Result<Next, ExecError> {
        loop {
            self.run_timers(now);
            match self.phase {
                Phase::Start => {
                    if self.iteration == self.iterations {
                        return Ok(Next::Done);
                    }
                    self.begin_iteration(now);
                }
                Phase::Before => {
                    let n = self.graph.ops().len();
                    if self.pc == n {
                        self.phase = Phase::End;
                        continue;
                    }
                    let op = OpId(self.pc as u32);
                    self.boundary_frees(now);
                    if let Some(w) = self.swap_out_gate(now) {
                        self.cur.stall_ns += w - now;
                        return Ok(Next::WaitUntil(w));
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
                        let present = self.slots[s.index()].loc == Loc::Device;
                        let (Some(p), false) = (producer, present) else {
                            self.before_idx += 1;
                            continue;
                        };
                        if let Some(w) = self.make_room(p, op, now) {
                            self.cur.stall_ns += w - now;
                            return Ok(Next::WaitUntil(w));
                        }
                        if let Some(w) = self.inputs_ready(p, now)? {
                            self.cur.stall_ns += w - now;
                            return Ok(Next::WaitUntil(w));
                        }
                        self.before_idx += 1;
                        self.alloc(s, now);
                        self.slots[s.index()].ready_at = now;
                        self.start_kernel(now);
                        self.cur.recomputed_ops += 1;
                        self.phase = Phase::Running {
                            op: p,
                            recompute: true,
                        };
                        return Ok(Next::Kernel { op: p });
                    }
                    if let Some(w) = self.make_room(op, op, now) {
                        self.cur.stall_ns += w - now;
                        return Ok(Next::WaitUntil(w));
                    }
                    if let Some(w) = self.inputs_ready(op, now)? {
                        self.cur.stall_ns += w - now;
                        return Ok(Next::WaitUntil(w));
                    }
                    // Never write a storage while a copy of it is in flight.
                    if let Some(w) = self.outputs_copying(op) {
                        self.cur.stall_ns += w - now;
                        return Ok(Next::WaitUntil(w));
                    }
                    for i in 0..self.graph.op(op).outputs.len() {
                        let t = self.graph.op(op).outputs[i];
                        let s = self.live.storage_of[t.index()];
                        self.alloc(s, now);
                        let slot = &mut self.slots[s.index()];
                        slot.host_valid = false;
                        slot.ready_at = now;
                    }
                    self.start_kernel(now);
                    self.phase = Phase::Running {
                        op,
                        recompute: false,
                    };
                    return Ok(Next::Kernel { op });
                }
                Phase::Running { .. } => return Ok(Next::WaitUntil(now)),
                Phase::End => {
                    // Swap-outs of persistent storage may run on into the
                    // next iteration (across-iteration swaps): start those
                    // still waiting for their delay now, and wait for none.
                    let mut early = false;
                    let live = self.live;
                    let persistent =
                        |t: TensorId| live.storages[live.storage_of[t.index()].index()].persistent;
                    for t in &mut self.timers {
                        if t.2.kind == EventKind::SwapOut && persistent(t.2.tensor) {
                            t.0 = t.0.min(now);
                            early = true;
                        }
                    }
                    if early {
                        self.run_timers(now);
                    }
                    let last = self
                        .timers
                        .iter()
                        .map(|t| t.0)
                        .chain(
                            self.slots
                                .iter()
                                .zip(&live.storages)
                                .filter(|(_, st)| !st.persistent)
                                .filter_map(|(s, _)| s.out_done),
                        )
                        .chain(
                            self.slots
                                .iter()
                                .filter(|s| s.loc == Loc::Device && s.ready_at != u64::MAX)
                                .map(|s| s.ready_at),
                        )
                        .max()
                        .unwrap_or(now);
                    if last > now {
                        self.cur.stall_ns += last - now;
                        return Ok(Next::WaitUntil(last));
                    }
                    self.boundary_frees(now);
                    self.end_iteration(now);
                    return Ok(Next::IterationDone);
                }
            }
        }
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
        self.phase = Phase::Before;
        self.touch(op, now);
        if recompute {
            return;
        }
        self.cur.op_ns[op.index()] = now - self.kernel_start;
        // Frees before allocations at a boundary, as the planner counts;
        // copies due by now are on their channels first.
        self.run_timers(now);
        let events = std::mem::take(&mut self.schedule.after[op.index()]);
        for e in events.iter().filter(|e| e.kind == EventKind::Release) {
            self.fire(*e, now);
        }
        self.boundary_frees(now);
        for e in events.iter().filter(|e| e.kind != EventKind::Release) {
            self.fire(*e, now);
        }
        self.schedule.after[op.index()] = events;
        self.pc += 1;
        self.before_idx = 0;
    }

    fn begin_iteration(&mut self, now: u64) {
        if let Some(p) = self.next_plan.take() {
            self.plan_version = p.version;
            self.schedule = Schedule::new(&p, self.live, self.graph.ops().len());
        }
        self.cur = IterationStats {
            start_ns: now,
            op_ns: vec![0; self.graph.ops().len()],
            ..IterationStats::default()
        };
        for (i, st) in self.live.storages.iter().enumerate() {
            let s = StorageId(i as u32);
            let on_host = self.schedule.start_on_host.contains(&s);
            if st.persistent && self.iteration == 0 && on_host {
                self.slots[i].loc = Loc::Host;
                self.slots[i].host_valid = true;
            } else if st.persistent
                && on_host
                && self.slots[i].loc == Loc::Device
                && self.slots[i].out_done.is_none()
            {
                // A new plan wants it on the host: copy it out now.
                let end = self.chans.submit(Dir::ToHost, st.bytes, now);
                self.slots[i].out_done = Some(end);
                self.cur.passive_swaps += 1;
            } else if (st.persistent && self.slots[i].loc == Loc::Gone)
                || (!st.persistent && st.born.is_none())
            {
                self.alloc(s, now);
                self.slots[i].ready_at = now;
                self.slots[i].host_valid = false;
            }
        }
        self.cur.peak_bytes = self.mem;
        self.cur.start_bytes = self.mem;
        self.trace.push((now, self.mem));
        self.pc = 0;
        self.before_idx = 0;
        self.phase = Phase::Before;
        for i in 0..self.schedule.at_start.len() {
            let e = self.schedule.at_start[i];
            self.fire(e, now);
        }
    }

    fn end_iteration(&mut self, now: u64) {
        // Non-persistent storage does not outlive its iteration.
        for (i, st) in self.live.storages.iter().enumerate() {
            if !st.persistent {
                self.slots[i].host_valid = false;
                self.free(StorageId(i as u32), now);
            }
        }
        self.cur.end_ns = now;
        self.done.push(std::mem::take(&mut self.cur));
        self.iteration += 1;
        self.phase = Phase::Start;
    }
}

/// Capuchin's passive mode (`ExecOptions::evict_budget_bytes`).
impl Executor<'_> {
    /// The storages `op` reads or writes, each once.
    fn storages_of(&self, op: OpId) -> Vec<StorageId> {
        let o = self.graph.op(op);
        let mut out: Vec<StorageId> = o
            .inputs
            .iter()
            .chain(&o.outputs)
            .map(|t| self.live.storage_of[t.index()])
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    fn touch(&mut self, op: OpId, now: u64) {
        for s in self.storages_of(op) {
            self.last_use[s.index()] = now;
        }
    }

    /// Before `op` (the op itself, or a recomputation for `current`)
    /// allocates its outputs and the passive swap-ins of its inputs: if that
    /// would take the job over the budget, evicts resident non-persistent
    /// storages that neither op touches, least recently used first, until
    /// what is being freed makes room. A victim with a valid host copy is
    /// dropped at once; any other is copied out first and freed when its
    /// copy ends (never lose data, never free under a copy). Returns when to
    /// look again while frees are in flight; `None` when the op may run:
    /// within the budget, or over it with nothing left to evict or wait for
    /// (a budget below the op's working set must not deadlock).
    fn make_room(&mut self, op: OpId, current: OpId, now: u64) -> Option<u64> {
        let budget = self.options.evict_budget_bytes?;
        let mine = self.storages_of(op);
        let need: u64 = mine
            .iter()
            .filter(|s| self.slots[s.index()].loc != Loc::Device)
            .map(|&s| self.bytes(s))
            .sum();
        if need == 0 || self.mem + need <= budget {
            return None;
        }
        let mut touched = mine;
        touched.extend(self.storages_of(current));
        // Frees already under way: finished swap-outs and releases that
        // wait for a copy (a prefetch whose timer has not run has no end yet).
        let mut freeing = 0u64;
        let mut soonest = None::<u64>;
        for (i, slot) in self.slots.iter().enumerate() {
            let end = match (slot.out_done, slot.free_pending) {
                (Some(d), _) if !slot.keep => Some(d),
                (None, true) if slot.ready_at != u64::MAX => Some(slot.ready_at),
                _ => None,
            };
            if let (Some(end), Loc::Device) = (end, slot.loc) {
                freeing += self.live.storages[i].bytes;
                soonest = Some(soonest.map_or(end, |x| x.min(end)));
            }
        }
        let mut victims: Vec<(u64, StorageId)> = (0..self.slots.len())
            .map(|i| StorageId(i as u32))
            .filter(|s| {
                let slot = &self.slots[s.index()];
                let st = &self.live.storages[s.index()];
                slot.loc == Loc::Device
                    && slot.out_done.is_none()
                    && !slot.free_pending
                    && slot.ready_at <= now
                    && !st.persistent
                    && st.bytes > 0
                    && !touched.contains(s)
            })
            .map(|s| (self.last_use[s.index()], s))
            .collect();
        victims.sort_unstable();
        for (_, s) in victims {
            if self.mem.saturating_sub(freeing) + need <= budget {
                break;
            }
            let bytes = self.bytes(s);
            self.cur
                .evictions
                .push((self.live.storages[s.index()].root, op));
            if self.slots[s.index()].host_valid {
                self.free(s, now);
                continue;
            }
            let end = self.chans.submit(Dir::ToHost, bytes, now);
            self.slots[s.index()].out_done = Some(end);
            self.cur.passive_swaps += 1;
            self.cur.swapped_bytes += bytes;
            freeing += bytes;
            soonest = Some(soonest.map_or(end, |x| x.min(end)));
        }
        if self.mem + need <= budget {
            return None;
        }
        soonest
    }
}
