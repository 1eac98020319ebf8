//! The worker runtime: drives the executor over its copy engine (host or
//! CUDA, see `copies`) with real tensors. The executor says which op runs next and hands out
//! allocations and frees as effects; the runtime holds the tensors of the
//! storages on the "device", tells the engine of each storage's bytes (so a
//! swap-out finds them), re-derives views from a storage that came back
//! from the host (same size, stride and offset), drops a storage's tensors
//! when it is freed, runs recomputations through the kernels, and counts
//! resident device bytes against the `--memory-mb` budget: an allocation
//! past it is an out-of-memory error naming the op, as a GPU's would be.
//!
//! Workers that share one device share its budget through a ledger
//! (`ledger`, [`WorkerConfig::ledger`]): each publishes what it holds, and
//! before every executor call that may allocate it claims the room the
//! others leave and gives it to the executor's guard as its limit, as the
//! simulator does for its jobs. An op over that limit waits for the others
//! to free memory, and evicts its own storages only when waiting does not
//! help (the deadlock breaker, [`BREAK_AFTER`]).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tch::Tensor;
use tensile_executor::{Effect, ExecError, Executor, Next};
use tensile_graph::{Graph, Liveness, OpId, StorageId, TensorId};
use tensile_planner::{Event, GateClock, Plan};
use tensile_proto::clock::monotonic_ns;
use tensile_swap_executor::{CudaOpClock, HostConfig, Payload};

use crate::base::BaseMeter;
use crate::copies::{Copies, Engine};
use crate::host_kernels::{self, HostLayouts, HostOps};
use crate::ledger::{Ledger, SlotState};
use crate::report::IterationReport;

use crate::error::WorkerError;
use crate::payload::{Flat, Layout};

/// No plan: every storage released after its last use, as PyTorch frees
/// it (`--vanilla`).
pub fn vanilla_plan(live: &Liveness) -> Plan {
    Plan {
        events: Event::releases_after_last_use(live),
        ..Plan::default()
    }
}

/// Runs one op's kernel: inputs in `op.inputs` order, outputs in
/// `op.outputs` order (an in-place output shares its input's memory, a
/// view is a view).
pub trait Kernels {
    fn run(&mut self, op: OpId, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String>;
}

/// How long a worker on a ledger sleeps before it looks again for memory
/// that the others free: short next to an op, long next to reading the
/// ledger (a few `pread`s).
pub const POLL: Duration = Duration::from_millis(1);

/// The deadlock breaker: how long a worker on a ledger waits for the others
/// to free memory before its guard evicts its own storages instead (they
/// may be waiting for it). Waiting first costs no copies the plans did not
/// count, and a running job frees memory within milliseconds (a release
/// after an op, a swap-out ending); 100 ms is past that, and short next to
/// an iteration.
pub const BREAK_AFTER: Duration = Duration::from_millis(100);

/// When every other worker on the ledger waits too, the youngest waiting
/// worker evicts after this instead of [`BREAK_AFTER`]: the states are as of
/// each worker's last look (every [`POLL`]), and a claim in flight makes a
/// worker look full for microseconds, so a few polls tell a wait of all
/// for all from a moment's.
pub const ALL_WAIT_GRACE: Duration = Duration::from_millis(5);

/// When every worker on the ledger has evicted all it can and still waits
/// (each op's own working set no longer fits beside the others'), the
/// youngest fails with the executor's no-memory error after this, so that
/// the others go on; a few polls, as for [`ALL_WAIT_GRACE`].
pub const STUCK_AFTER: Duration = Duration::from_millis(200);

/// How the worker runs.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerConfig {
    pub iterations: usize,
    /// Device memory the job may use; `None`: no limit.
    pub memory_budget_bytes: Option<u64>,
    /// The pace (host engine only), pool cap and faults of the copies.
    pub host: HostConfig,
    /// Which copy engine carries out the swaps.
    pub engine: Engine,
    /// Hold `memory_budget_bytes` with the executor's guard (a planned run):
    /// an allocation past it waits for the job's own frees or evicts what
    /// the job uses last instead of failing, as a GPU's out-of-memory
    /// would (vanilla's behaviour, without the guard).
    pub guard: bool,
    /// A memory ledger directory shared with the other workers of the
    /// device: `memory_budget_bytes` (required) is then the budget of all
    /// of them together, each holding at most what the others leave. Under
    /// the guard an op waits for the others to free memory (evicting its
    /// own only to break a wait of all for all, see [`BREAK_AFTER`]);
    /// without it an allocation past what the others leave is out of
    /// memory, as on a shared GPU.
    pub ledger: Option<PathBuf>,
}

/// One job's run: the executor, the kernels and the device tensors.
pub struct Worker<'g, K> {
    graph: &'g Graph,
    live: &'g Liveness,
    exec: Executor<'g, Copies>,
    kernels: K,
    epoch: Instant,
    /// Wall-clock time of `epoch`, ns since the Unix epoch.
    epoch_unix_ns: u64,
    /// (ns since `epoch`, resident device bytes) at every change, when on.
    memory_log: Option<Vec<(u64, u64)>>,
    budget: Option<u64>,
    /// Device tensors by tensor id.
    table: Vec<Option<Tensor>>,
    layout: Vec<Option<Layout>>,
    tensors_of: Vec<Vec<TensorId>>,
    /// Initial values by tensor id: inputs are copied in every iteration,
    /// persistent tensors taken once.
    initial: Vec<Option<Tensor>>,
    /// Persistent storage installed once; inputs installed this iteration.
    installed: Vec<bool>,
    /// Storages whose initial buffer the engine holds before the executor
    /// allocates them (see `preinstall`): the only ones it may hold a
    /// buffer for at their allocation.
    preinstalled: Vec<bool>,
    iterations: usize,
    /// Bytes held for each storage (0: not on the device).
    resident: Vec<u64>,
    /// Bytes of each storage's buffer as last measured.
    measured: Vec<Option<u64>>,
    mem: u64,
    peak: u64,
    /// The op that effects are charged to (for out-of-memory errors).
    at_op: OpId,
    /// Time inside the kernels this iteration.
    kernel_ns: u64,
    /// Hold `budget` with the executor's guard.
    guard: bool,
    /// The CUDA device whose allocator statistics the reports carry.
    cuda: Option<usize>,
    /// Times each op on the CUDA device with events (a launch returns
    /// before the kernel runs, so the wall clock would time launches).
    op_clock: Option<CudaOpClock>,
    /// The memory ledger shared with the other workers of the device.
    ledger: Option<Ledger>,
    /// The most bytes the job may hold now: the budget, or with a ledger
    /// the room claimed last.
    room: Option<u64>,
    /// What the others on the ledger held at the last claim.
    others_bytes: u64,
    /// Whether the executor's limit may rise (others on the ledger run) at
    /// the last claim.
    may_rise: bool,
    /// The deadlock breaker is on: the guard evicts rather than waits.
    breaking: bool,
    /// What the job told the ledger it does, last.
    state: SlotState,
    /// Since when the job waits for memory others hold; since when all the
    /// others wait too; since when all are stuck.
    memory_wait_since: Option<Instant>,
    all_wait_since: Option<Instant>,
    stuck_since: Option<Instant>,
    /// The slots of the plan's gate, for a coordinated job.
    gate: Option<GateClock>,
    /// The next iteration has not waited for its gate yet.
    before_iteration: bool,
    /// This iteration's wait for its gate, and its start on the host's
    /// monotonic clock.
    gate_wait_ns: u64,
    started_monotonic_ns: u64,
    /// The layouts host ops view their host bytes with (`None`: the graph
    /// has no host ops), and whether their kernels are installed.
    host_layouts: Option<HostLayouts>,
    host_kernels: bool,
    /// The process's base meter and this job's number in it.
    base: Option<(Arc<BaseMeter>, usize)>,
}

impl<K> std::fmt::Debug for Worker<'_, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("graph", &self.graph.name())
            .field("mem", &self.mem)
            .field("peak", &self.peak)
            .finish()
    }
}

impl<'g, K: Kernels> Worker<'g, K> {
    /// A worker for `graph` under `plan`, with the initial values of every
    /// initial tensor (inputs, parameters, buffers, optimizer state).
    pub fn new(
        graph: &'g Graph,
        live: &'g Liveness,
        plan: &Plan,
        kernels: K,
        initial: Vec<(TensorId, Tensor)>,
        config: WorkerConfig,
    ) -> Result<Worker<'g, K>, WorkerError> {
        let epoch = Instant::now();
        let ledger = match (&config.ledger, config.memory_budget_bytes) {
            (Some(dir), Some(_)) => Some(Ledger::open(dir)?),
            (Some(dir), None) => return Err(WorkerError::LedgerWithoutBudget(dir.clone())),
            (None, _) => None,
        };
        let engine = Copies::new(config.engine, config.host, epoch)?;
        let mut exec = Executor::new(graph, live, plan, engine, config.iterations);
        if config.guard {
            exec.set_limit(config.memory_budget_bytes);
        }
        let n = graph.tensors().len();
        let mut tensors_of = vec![Vec::new(); live.storages.len()];
        for t in graph.tensors() {
            tensors_of[live.storage_of[t.id.index()].index()].push(t.id);
        }
        let mut init: Vec<Option<Tensor>> = (0..n).map(|_| None).collect();
        for (t, v) in initial {
            if let Some(slot) = init.get_mut(t.index()) {
                *slot = Some(v);
            }
        }
        let mut w = Worker {
            graph,
            live,
            exec,
            kernels,
            epoch,
            epoch_unix_ns: unix_ns_at(epoch),
            memory_log: None,
            budget: config.memory_budget_bytes,
            table: (0..n).map(|_| None).collect(),
            layout: vec![None; n],
            tensors_of,
            initial: init,
            installed: vec![false; live.storages.len()],
            preinstalled: vec![false; live.storages.len()],
            iterations: config.iterations,
            resident: vec![0; live.storages.len()],
            measured: vec![None; live.storages.len()],
            mem: 0,
            peak: 0,
            at_op: OpId(0),
            kernel_ns: 0,
            guard: config.guard,
            cuda: match config.engine {
                Engine::Cuda { ordinal } => Some(ordinal),
                Engine::Host => None,
            },
            op_clock: match config.engine {
                Engine::Cuda { ordinal } => CudaOpClock::new(ordinal)
                    .map_err(|why| eprintln!("tensile-worker: {}", clock_off(&why)))
                    .ok(),
                Engine::Host => None,
            },
            ledger,
            room: config.memory_budget_bytes,
            others_bytes: 0,
            may_rise: false,
            breaking: false,
            state: SlotState::Running,
            memory_wait_since: None,
            all_wait_since: None,
            stuck_since: None,
            gate: plan.gate.map(GateClock::new),
            before_iteration: true,
            gate_wait_ns: 0,
            started_monotonic_ns: 0,
            host_layouts: HostLayouts::new(graph),
            host_kernels: false,
            base: None,
        };
        // What host ops update is current on the host: in the pool now, and
        // on the device too where device ops read it (unless the plan starts
        // it on the host); their state (host only) never on the device.
        for (i, st) in live.storages.iter().enumerate() {
            let s = StorageId(i as u32);
            if !st.host_master || w.installed[i] {
                continue;
            }
            let flat = w.install_initial(s, false)?;
            w.exec
                .engine_mut()
                .put_host(s, &flat)
                .map_err(|why| w.tensor_error(st.root, why))?;
            let starts_on_host = plan
                .start_on_host
                .iter()
                .any(|t| live.storage_of[t.index()] == s);
            if st.host_only || starts_on_host {
                for &u in &w.tensors_of[i] {
                    w.table[u.index()] = None;
                }
            } else {
                w.measured[i] = Some(flat.byte_len() as u64);
                w.exec.engine_mut().set_device(s, flat);
                w.preinstalled[i] = true;
            }
            w.installed[i] = true;
        }
        // Persistent storage that starts on the host goes to the pool now.
        for &t in &plan.start_on_host {
            let s = live.storage_of[t.index()];
            if w.installed[s.index()] {
                continue;
            }
            let flat = w.install_initial(s, false)?;
            w.exec
                .engine_mut()
                .put_host(s, &flat)
                .map_err(|why| w.tensor_error(t, why))?;
            // Not on the device: its tensors come back with its prefetch.
            for &u in &w.tensors_of[s.index()] {
                w.table[u.index()] = None;
            }
            w.installed[s.index()] = true;
        }
        w.preinstall()?;
        Ok(w)
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn tensor_error(&self, t: TensorId, why: String) -> WorkerError {
        WorkerError::Tensor {
            tensor: t.0,
            name: self.graph.tensor(t).name.clone(),
            why,
        }
    }

    /// Puts the initial tensors of storage `s` in the table (a copy for
    /// inputs, used again every iteration); its flat tensor.
    fn install_initial(&mut self, s: StorageId, copy: bool) -> Result<Flat, WorkerError> {
        let root = self.live.storages[s.index()].root;
        let take = |w: &mut Self, t: TensorId| -> Result<Tensor, WorkerError> {
            let v = if copy {
                w.initial[t.index()].as_ref().map(Tensor::copy)
            } else {
                w.initial[t.index()].take()
            };
            v.ok_or_else(|| w.tensor_error(t, "no initial value was given".into()))
        };
        let r = take(self, root)?;
        let flat = Flat::over(&r).map_err(|why| self.tensor_error(root, why))?;
        self.record(root, r, &flat)?;
        for i in 0..self.tensors_of[s.index()].len() {
            let t = self.tensors_of[s.index()][i];
            if t != root && self.graph.producer(t).is_none() {
                let v = take(self, t)?;
                self.record(t, v, &flat)?;
            }
        }
        Ok(flat)
    }

    /// This iteration's op times on the CUDA device (empty without a
    /// clock): the reports carry them instead of the wall clock's.
    fn device_op_ns(&mut self) -> Vec<Option<u64>> {
        let n = self.graph.ops().len();
        match self.op_clock.as_mut().map(|c| c.take(n)) {
            Some(Ok(t)) => t,
            Some(Err(why)) => {
                self.stop_clock(&why);
                Vec::new()
            }
            None => Vec::new(),
        }
    }

    /// The CUDA clock failed: op times fall back to the wall clock.
    fn stop_clock(&mut self, why: &str) {
        eprintln!("tensile-worker: {}", clock_off(why));
        self.op_clock = None;
    }

    fn record(&mut self, t: TensorId, v: Tensor, flat: &Flat) -> Result<(), WorkerError> {
        let l = flat
            .layout_of(&v)
            .map_err(|why| self.tensor_error(t, why))?;
        self.set_layout(t, l);
        self.table[t.index()] = Some(v);
        Ok(())
    }

    /// Tensor `t` lies at `l` in its storage (host ops learn it too).
    fn set_layout(&mut self, t: TensorId, l: Layout) {
        if let Some(h) = &self.host_layouts {
            h.note(t, &l);
        }
        self.layout[t.index()] = Some(l);
    }

    /// Runs the graph's host ops through `kernels` (CPU tensors over the
    /// host copy engine's buffers, on its host thread; see
    /// `host_kernels`). A graph with host ops needs them before
    /// [`Worker::run`]; one without ignores them.
    pub fn set_host_kernels(&mut self, kernels: impl Kernels + Send + 'static) {
        if let Some(layouts) = self.host_layouts.clone() {
            let ops = HostOps::new(self.graph, self.live, kernels, layouts);
            self.exec.engine_mut().set_host_kernel(ops);
            self.host_kernels = true;
        }
    }

    /// Measures the process's base with `meter` ([`BaseMeter`]), as its
    /// job number `job`: the meter learns what this job's storages hold,
    /// and every report from now on carries the process's base once
    /// measured, the whole of it (`IterationReport::base_bytes`; the
    /// scheduler counts it once for the jobs of the process).
    pub fn set_base_meter(&mut self, meter: Arc<BaseMeter>, job: usize) {
        meter.grew(self.mem);
        if let Some((old, job)) = self.base.replace((meter, job)) {
            old.left(job, self.mem);
        }
    }

    /// The device buffer of `s` now holds `bytes` (measured).
    fn hold(&mut self, s: StorageId, bytes: u64) {
        let was = self.resident[s.index()];
        if let Some((m, _)) = &self.base {
            if bytes >= was {
                m.grew(bytes - was);
            } else {
                m.shrank(was - bytes);
            }
        }
        self.mem = self.mem - self.resident[s.index()] + bytes;
        self.resident[s.index()] = bytes;
        self.measured[s.index()] = Some(bytes);
        self.peak = self.peak.max(self.mem);
        self.log_memory();
    }

    fn log_memory(&mut self) {
        let now = self.now();
        if let Some(log) = &mut self.memory_log {
            log.push((now, self.mem));
        }
    }

    /// Records resident device bytes at every change from now on (for a
    /// plot of memory over time); [`Worker::take_memory_log`] drains it.
    pub fn record_memory(&mut self) {
        self.memory_log.get_or_insert_with(Vec::new);
    }

    /// The memory changes recorded since the last call, as (ns since the
    /// Unix epoch, resident device bytes).
    pub fn take_memory_log(&mut self) -> Vec<(u64, u64)> {
        let base = self.epoch_unix_ns;
        self.memory_log
            .as_mut()
            .map(|log| log.drain(..).map(|(t, b)| (base + t, b)).collect())
            .unwrap_or_default()
    }

    fn apply_effects(&mut self) -> Result<(), WorkerError> {
        for e in self.exec.take_effects() {
            match e {
                Effect::Alloc(s) => self.alloc(s)?,
                Effect::Free(s) => self.free(s),
            }
        }
        Ok(())
    }

    fn alloc(&mut self, s: StorageId) -> Result<(), WorkerError> {
        let st = &self.live.storages[s.index()];
        // The engine holds a device buffer only for storage the executor
        // has on the device, or whose initial values wait for their
        // allocation: one held for a storage allocated only now came from
        // a copy that landed in no buffer (the executor once submitted
        // such prefetches), and is memory nobody counts; a kernel would
        // then measure its output against it.
        let preinstalled = std::mem::take(&mut self.preinstalled[s.index()]);
        if !preinstalled && self.exec.engine().device(s).is_some() {
            let why = format!(
                "the copy engine holds a device buffer for storage {} before the executor allocates it, at op {} ({}): {}",
                s.0,
                self.at_op.0,
                self.graph.op(self.at_op).name,
                self.exec.whereabouts(s)
            );
            return Err(self.tensor_error(st.root, why));
        }
        let bytes = self.measured[s.index()].unwrap_or(st.bytes);
        // Under the guard the executor keeps to its limit (the room, less
        // what measured sizes exceed the graph's): only the whole budget is
        // checked here, as without a ledger. Without it, the room is the
        // check; a claim made at the same moment as another's may have
        // found none for a moment, so a few more are tried first.
        let mut tries = 0;
        while !self.guard
            && self.ledger.is_some()
            && self.room.is_some_and(|r| self.mem + bytes > r)
            && tries < 5
        {
            std::thread::sleep(POLL);
            self.claim()?;
            tries += 1;
        }
        let limit = if self.guard { self.budget } else { self.room };
        if let (Some(limit), Some(budget)) = (limit, self.budget)
            && self.mem + bytes > limit
        {
            let op = self.graph.op(self.at_op);
            return Err(WorkerError::OutOfMemory {
                op: op.id.0,
                name: op.name.clone(),
                tensor: self.graph.tensor(st.root).name.clone(),
                bytes,
                in_use: self.mem,
                budget,
                others: self.others_bytes,
            });
        }
        // Initial storage already holds its values (see `preinstall`); any
        // other allocation is filled by a kernel or a copy.
        self.hold(s, bytes);
        Ok(())
    }

    /// Puts the values of the initial storage the executor allocates when
    /// the next iteration begins on the device: persistent storage once
    /// (unless it starts on the host), inputs every iteration. Done before
    /// the step that begins the iteration, since that step may already
    /// copy them out (a swap-out at the iteration's start); their bytes
    /// count from their `Alloc`.
    fn preinstall(&mut self) -> Result<(), WorkerError> {
        for (i, st) in self.live.storages.iter().enumerate() {
            let s = StorageId(i as u32);
            if st.born.is_some() || self.installed[i] {
                continue;
            }
            let flat = self.install_initial(s, !st.persistent)?;
            self.measured[i] = Some(flat.byte_len() as u64);
            self.exec.engine_mut().set_device(s, flat);
            self.preinstalled[i] = true;
            self.installed[i] = true;
        }
        Ok(())
    }

    fn free(&mut self, s: StorageId) {
        // The engine let go of the storage's buffer when the executor freed
        // it (in order with the copies it submitted after).
        for &t in &self.tensors_of[s.index()] {
            self.table[t.index()] = None;
        }
        if let Some((m, _)) = &self.base {
            m.shrank(self.resident[s.index()]);
        }
        self.mem -= self.resident[s.index()];
        self.resident[s.index()] = 0;
        self.log_memory();
    }

    /// The tensor `t`, re-derived from its storage if it came back from
    /// the host.
    fn input(&mut self, t: TensorId) -> Result<(), WorkerError> {
        if self.table[t.index()].is_some() {
            return Ok(());
        }
        let s = self.live.storage_of[t.index()];
        let Some(layout) = &self.layout[t.index()] else {
            return Err(self.tensor_error(t, "read before it was ever produced".into()));
        };
        let Some(flat) = self.exec.engine().device(s) else {
            let why = format!(
                "its storage is not on the device ({})",
                self.exec.whereabouts(s)
            );
            return Err(self.tensor_error(t, why));
        };
        let v = flat
            .derive(layout)
            .map_err(|why| self.tensor_error(t, why))?;
        self.table[t.index()] = Some(v);
        Ok(())
    }

    fn run_kernel(&mut self, op: OpId) -> Result<(), WorkerError> {
        let graph = self.graph;
        let o = graph.op(op);
        for &t in &o.inputs {
            self.input(t)?;
        }
        if let Some(Err(why)) = self.op_clock.as_mut().map(|c| c.begin(op.index())) {
            self.stop_clock(&why);
        }
        let inputs: Vec<&Tensor> = o
            .inputs
            .iter()
            .filter_map(|t| self.table[t.index()].as_ref())
            .collect();
        let kernel_error = |why: String| WorkerError::Kernel {
            op: op.0,
            name: o.name.clone(),
            why,
        };
        let t0 = Instant::now();
        let outs = self.kernels.run(op, &inputs).map_err(kernel_error);
        self.kernel_ns += t0.elapsed().as_nanos() as u64;
        if let Some(Err(why)) = self.op_clock.as_mut().map(CudaOpClock::end) {
            self.stop_clock(&why);
        }
        let outs = outs?;
        if outs.len() != o.outputs.len() {
            return Err(kernel_error(format!(
                "{} outputs, the graph has {}",
                outs.len(),
                o.outputs.len()
            )));
        }
        let target = match self.exec.running() {
            Some((_, true)) => self.exec.recompute_target(),
            _ => None,
        };
        for (&t, v) in o.outputs.iter().zip(outs) {
            let s = self.live.storage_of[t.index()];
            if target.is_some_and(|r| r != s) {
                continue;
            }
            // An output that is its storage's root starts the storage
            // afresh: a buffer still held for it (a swap-out that failed
            // and kept the only copy, say) is stale and gives way. Any
            // other output is a view of, or an in-place write into, the
            // buffer its storage already has.
            let fresh = graph.storage_root(t) == t;
            if fresh || self.exec.engine().device(s).is_none() {
                let flat = Flat::over(&v).map_err(|why| self.tensor_error(t, why))?;
                let bytes = flat.byte_len() as u64;
                self.exec.engine_mut().set_device(s, flat);
                self.hold(s, bytes);
            }
            let l = match self.exec.engine().device(s) {
                Some(flat) => flat.layout_of(&v),
                None => Err("its storage has no device buffer".into()),
            }
            .map_err(|why| self.tensor_error(t, why))?;
            self.set_layout(t, l);
            self.table[t.index()] = Some(v);
        }
        Ok(())
    }

    /// Runs every iteration; `on_iteration` sees each one's report and may
    /// hand over a new plan, which applies from the very next iteration.
    pub fn run(
        &mut self,
        mut on_iteration: impl FnMut(&IterationReport) -> Option<Plan>,
    ) -> Result<Vec<IterationReport>, WorkerError> {
        if self.host_layouts.is_some() && !self.host_kernels {
            host_kernels::no_kernels(self.graph)?;
        }
        let mut reports = Vec::new();
        loop {
            if std::mem::take(&mut self.before_iteration) {
                self.wait_for_gate();
            }
            self.claim()?;
            let now = self.now();
            let next = self.exec.step(now)?;
            if let Next::Kernel { op } = next {
                self.at_op = op;
            }
            self.apply_effects()?;
            let state = match next {
                // The guard could evict and still found no room.
                Next::WaitForMemory if !self.may_rise => SlotState::Stuck,
                Next::WaitForMemory => SlotState::Waiting,
                _ => SlotState::Running,
            };
            self.settle(state)?;
            match next {
                Next::Kernel { op } => {
                    self.memory_wait_since = None;
                    self.all_wait_since = None;
                    self.stuck_since = None;
                    self.breaking = false;
                    self.run_kernel(op)?;
                    // Its end may start prefetches: room for them first.
                    self.claim()?;
                    let now = self.now();
                    self.exec.kernel_done(now);
                    self.apply_effects()?;
                    // No settling here: the next step's claim comes at once
                    // (a claim standing over what the job holds only makes
                    // the others more careful), and settles after the step.
                }
                Next::WaitUntil(t) => {
                    let now = self.now();
                    if t > now {
                        let left = Duration::from_nanos(t - now);
                        if !self.exec.engine_mut().wait(left) {
                            std::thread::sleep(Duration::from_nanos(t.saturating_sub(self.now())));
                        }
                    }
                }
                Next::WaitForCopy => {
                    self.exec.engine_mut().wait(Duration::from_millis(100));
                }
                // Others on the ledger free memory; without one, nothing
                // else will.
                Next::WaitForMemory if self.ledger.is_some() => self.wait_for_others(state)?,
                Next::WaitForMemory => return Err(self.no_memory()),
                Next::IterationDone => {
                    let i = reports.len();
                    let device_ns = self.device_op_ns();
                    let Some(stats) = self.exec.iterations_done().last() else {
                        continue;
                    };
                    let mut r = IterationReport::new(i, stats, self.peak, self.kernel_ns);
                    for (slot, t) in r.op_ns.iter_mut().zip(device_ns) {
                        if let Some(t) = t {
                            *slot = t;
                        }
                    }
                    r.memory = self.take_memory_log();
                    r.allocator_peak_bytes = self.allocator_peak();
                    r.base_bytes = self
                        .base
                        .as_ref()
                        .and_then(|(m, job)| m.iteration_done(*job));
                    r.gate_wait_ns = self.gate_wait_ns;
                    r.start_monotonic_ns = self.started_monotonic_ns;
                    if let Some(c) = &self.gate {
                        r.gate_period_ns = c.gate().period_ns;
                        r.gate_phase_ns = c.gate().phase_ns;
                    }
                    self.kernel_ns = 0;
                    self.before_iteration = true;
                    if let Some(plan) = on_iteration(&r) {
                        // Persistent storage the new plan starts on the
                        // host is copied out by the executor at the
                        // boundary; storage it no longer wants there is
                        // fetched on first use. A new gate places its slots
                        // at the next start.
                        match (plan.gate, &mut self.gate) {
                            (Some(g), Some(c)) => c.set_gate(g),
                            (g, c) => *c = g.map(GateClock::new),
                        }
                        self.exec.set_plan(plan);
                        if let Some((m, job)) = &self.base {
                            m.plan_switched(*job);
                        }
                    }
                    reports.push(r);
                    self.peak = self.mem;
                    for (k, st) in self.live.storages.iter().enumerate() {
                        if !st.persistent && st.born.is_none() {
                            self.installed[k] = false;
                        }
                    }
                    if reports.len() < self.iterations {
                        self.preinstall()?;
                    }
                }
                Next::Done => break,
            }
        }
        Ok(reports)
    }

    /// On CUDA, the allocator's peak of allocated bytes since the last call
    /// (which resets it); `None` on the CPU or when the statistics cannot
    /// be read.
    fn allocator_peak(&self) -> Option<u64> {
        let ordinal = self.cuda?;
        let m = tensile_kernels::cuda_memory(ordinal, true).ok()?;
        u64::try_from(m.allocated_peak).ok()
    }

    /// Why the job cannot go on: the executor's no-memory error.
    fn no_memory(&self) -> WorkerError {
        match self.exec.no_memory() {
            Some(e) => e.into(),
            None => WorkerError::Exec(ExecError::NoMemory {
                op: self.at_op.0,
                name: self.graph.op(self.at_op).name.clone(),
                need: 0,
                limit: 0,
            }),
        }
    }

    /// With a ledger, before an executor call that may allocate: claims the
    /// room the others leave under the shared budget and makes it the
    /// executor's limit (less what the job's measured sizes exceed the
    /// graph's, which the executor counts), rising while others run unless
    /// the deadlock breaker is on.
    fn claim(&mut self) -> Result<(), WorkerError> {
        let (Some(ledger), Some(budget)) = (&mut self.ledger, self.budget) else {
            return Ok(());
        };
        let c = ledger.claim(budget, self.state)?;
        self.room = Some(c.room);
        self.others_bytes = c.others.bytes;
        self.may_rise = c.others.live > 0 && !self.breaking;
        if self.guard {
            let excess = self.mem.saturating_sub(self.exec.memory_bytes());
            self.exec.set_limit(Some(c.room.saturating_sub(excess)));
            self.exec.set_limit_may_rise(self.may_rise);
        }
        Ok(())
    }

    /// With a ledger, after the effects of an executor call: publishes what
    /// the job holds now (giving back the rest of its claim) and its state.
    fn settle(&mut self, state: SlotState) -> Result<(), WorkerError> {
        self.state = state;
        if let Some(ledger) = &mut self.ledger {
            ledger.publish(self.mem, state)?;
        }
        Ok(())
    }

    /// The job waits for memory that the others on the ledger hold: it
    /// looks again after [`POLL`]. Its guard evicts its own storages
    /// instead (the breaker) once it has waited [`BREAK_AFTER`], or
    /// [`ALL_WAIT_GRACE`] if it is the youngest of workers that all wait.
    /// It fails with the executor's no-memory error when even evicting left
    /// no room and nothing else will free any: the others hold nothing (the
    /// whole budget is too small for the op), or they are all stuck too and
    /// it is the youngest (one job fails rather than all waiting forever).
    fn wait_for_others(&mut self, state: SlotState) -> Result<(), WorkerError> {
        let now = Instant::now();
        let since = *self.memory_wait_since.get_or_insert(now);
        if state == SlotState::Stuck && self.others_bytes == 0 {
            return Err(self.no_memory());
        }
        let Some(ledger) = &mut self.ledger else {
            return Err(self.no_memory());
        };
        let o = ledger.others()?;
        match state {
            SlotState::Waiting => {
                let all_wait = o.running == 0 && o.younger_waiting == 0;
                let all_since = if all_wait {
                    *self.all_wait_since.get_or_insert(now)
                } else {
                    self.all_wait_since = None;
                    now
                };
                if now - since >= BREAK_AFTER || (all_wait && now - all_since >= ALL_WAIT_GRACE) {
                    self.breaking = true;
                }
            }
            SlotState::Stuck => {
                if o.live > 0 && o.stuck == o.live && o.younger == 0 {
                    let stuck = *self.stuck_since.get_or_insert(now);
                    if now - stuck >= STUCK_AFTER {
                        return Err(self.no_memory());
                    }
                } else {
                    self.stuck_since = None;
                }
            }
            SlotState::Running => {}
        }
        std::thread::sleep(POLL);
        Ok(())
    }

    /// Holds the next iteration until its gate's slot, on the host's
    /// monotonic clock (a late iteration starts at once).
    fn wait_for_gate(&mut self) {
        let now = monotonic_ns();
        let start = self.gate.as_mut().map_or(now, |c| c.start_at(now));
        if start > now {
            std::thread::sleep(Duration::from_nanos(start - now));
        }
        self.gate_wait_ns = start.saturating_sub(now);
        self.started_monotonic_ns = start.max(now);
    }

    /// The values of the persistent tensors (parameters, buffers, optimizer
    /// state) now, wherever they are: on the device or in the host pool.
    pub fn persistent_values(&mut self) -> Result<Vec<(TensorId, Tensor)>, WorkerError> {
        self.exec.engine_mut().drain();
        let now = self.now();
        tensile_swap_executor::CopyEngine::poll(self.exec.engine_mut(), now);
        let mut out = Vec::new();
        for t in self.graph.tensors() {
            let s = self.live.storage_of[t.id.index()];
            if !t.kind.is_persistent() || self.live.storages[s.index()].root != t.id {
                continue;
            }
            let Some(layout) = self.layout[t.id.index()].clone() else {
                continue;
            };
            let v = match self.exec.engine().device(s) {
                Some(flat) => flat.derive(&layout),
                None => match self.exec.engine().host_payload(s) {
                    Some(Ok(flat)) => flat.derive(&layout),
                    Some(Err(why)) => Err(why),
                    None => Err("neither on the device nor on the host".into()),
                },
            }
            .map_err(|why| self.tensor_error(t.id, why))?;
            out.push((t.id, v.copy()));
        }
        Ok(out)
    }

    /// Device bytes held now.
    pub fn memory_bytes(&self) -> u64 {
        self.mem
    }

    /// Ends the job: lets go of all its device memory, then of its ledger
    /// slot, in that order (the others on the ledger never grow into
    /// memory it still holds). Returns what the memory log recorded since
    /// the last report, ending with the moment the memory went (0 bytes),
    /// stamped before the slot goes; empty when nothing was recorded.
    pub fn close(mut self) -> Vec<(u64, u64)> {
        let ledger = self.ledger.take();
        let recording = self.memory_log.is_some();
        let mut log = self.take_memory_log();
        drop(self);
        if recording {
            log.push((unix_ns_at(Instant::now()), 0));
        }
        drop(ledger);
        log
    }
}

impl<K> Drop for Worker<'_, K> {
    fn drop(&mut self) {
        // The job's storages go with it: the other jobs of the process
        // measure without them and stop waiting for its iterations.
        if let Some((m, job)) = self.base.take() {
            m.left(job, self.mem);
        }
    }
}

/// `t` as ns since the Unix epoch, through one reading of both clocks per
/// process, so that the memory logs of workers in one process (threads)
/// are on one clock and merge in the order things happened.
fn unix_ns_at(t: Instant) -> u64 {
    static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
    let (at, unix) = *ANCHOR.get_or_init(|| {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        (Instant::now(), unix)
    });
    if t >= at {
        unix.saturating_add((t - at).as_nanos() as u64)
    } else {
        unix.saturating_sub((at - t).as_nanos() as u64)
    }
}

/// Why op latencies on a CUDA device are the wall clock's (launch times).
fn clock_off(why: &str) -> String {
    format!("timing ops with CUDA events failed ({why}): op latencies are launch times")
}
