//! The simulator: N jobs on one virtual GPU, each run by its own
//! [`Executor`] with virtual-time kernels and copy channels. Kernels of
//! different jobs that overlap share the GPU (processor sharing, with a
//! configurable slowdown); with slowdown 0 the jobs do not interfere.
//! Deterministic: no randomness here, and ties break by job index.
//!
//! As the worker does on the host's clock, it holds a gated job's
//! iterations until their slots ([`tensile_planner::GateClock`]), and with
//! a budget it keeps every job under the budget less what the others hold
//! ([`Executor::set_limit`]): a job at that limit waits until another
//! frees memory.

use tensile_graph::{Graph, Liveness};
use tensile_planner::{CopyModel, Gate, GateClock, JobId, Plan, ReplanError};

pub use tensile_planner::{FixedPlans, Replan};
use tensile_swap_executor::VirtualCopies;

use crate::interface::{Effect, ExecError, ExecOptions, IterationStats, Next};
use crate::machine::Executor;

#[derive(Debug)]
pub struct SimJob<'g> {
    pub graph: &'g Graph,
    pub live: &'g Liveness,
    pub plan: Plan,
    /// The true kernel time of every op at full speed, ns.
    pub true_ns: Vec<u64>,
    /// When the job starts.
    pub start_ns: u64,
    /// How the job's executor runs copies (defaults: TENSILE's).
    pub options: ExecOptions,
}

impl<'g> SimJob<'g> {
    /// A job that starts at 0 with TENSILE's executor options.
    pub fn new(graph: &'g Graph, live: &'g Liveness, plan: Plan, true_ns: Vec<u64>) -> SimJob<'g> {
        SimJob {
            graph,
            live,
            plan,
            true_ns,
            start_ns: 0,
            options: ExecOptions::default(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    pub iterations: usize,
    /// Each of k overlapping kernels runs at 1 / (1 + slowdown * (k - 1)).
    pub sharing_slowdown: f64,
    pub copy: CopyModel,
    /// Fixed memory of each job (context, workspaces).
    pub base_bytes: u64,
    /// The device memory all jobs together may hold (`None`: no limit):
    /// each job's limit is this less what the others hold.
    pub budget_bytes: Option<u64>,
    /// All jobs' copies queue on the link's lanes at its full bandwidth,
    /// FIFO across jobs, as coordinated plans place them; otherwise each
    /// job has its own lanes at its share of the bandwidth.
    pub shared_link: bool,
}

impl SimConfig {
    /// `iterations` per job on `copy`, with no slowdown from sharing, no
    /// base, no budget and a link split between the jobs.
    pub fn new(iterations: usize, copy: CopyModel) -> SimConfig {
        SimConfig {
            iterations,
            sharing_slowdown: 0.0,
            copy,
            base_bytes: 0,
            budget_bytes: None,
            shared_link: false,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct JobResult {
    pub iterations: Vec<IterationStats>,
    /// (time, bytes) at every change of this job's memory.
    pub trace: Vec<(u64, u64)>,
    pub error: Option<ExecError>,
    pub last_plan_version: u64,
}

impl JobResult {
    pub fn peak_bytes(&self) -> u64 {
        self.iterations
            .iter()
            .map(|i| i.peak_bytes)
            .max()
            .unwrap_or(0)
    }
    pub fn time_ns(&self) -> u64 {
        match (self.iterations.first(), self.iterations.last()) {
            (Some(a), Some(b)) => b.end_ns - a.start_ns,
            _ => 0,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct SimResult {
    pub jobs: Vec<JobResult>,
    /// The peak of all jobs' memory added up over time.
    pub peak_bytes: u64,
    pub makespan_ns: u64,
    /// Re-plans that failed, with when: the jobs kept their plans.
    pub replan_errors: Vec<(u64, ReplanError)>,
}

enum Run {
    Idle(u64),
    Kernel {
        left: f64,
    },
    /// Waiting for memory under the budget since the other jobs had freed
    /// this many times.
    WaitMemory(u64),
    Done,
}

/// A job's gate as the simulator keeps it: its slots, and whether the next
/// iteration is still to be placed on them.
struct GateState {
    clock: Option<GateClock>,
    before_iteration: bool,
}

/// Runs `jobs` for `config.iterations` iterations each.
pub fn simulate(
    jobs: Vec<SimJob<'_>>,
    config: &SimConfig,
    replanner: &mut dyn Replan,
) -> SimResult {
    let share = if config.copy.shared_by_jobs && !config.shared_link {
        1.0 / jobs.len().max(1) as f64
    } else {
        1.0
    };
    let link = VirtualCopies::new(config.copy, share);
    let mut execs: Vec<Executor<'_, VirtualCopies>> = jobs
        .iter()
        .map(|j| {
            let engine = if config.shared_link {
                link.sharing_lanes()
            } else {
                VirtualCopies::new(config.copy, share)
            };
            let mut e = Executor::new(j.graph, j.live, &j.plan, engine, config.iterations);
            e.set_base_bytes(config.base_bytes);
            e.set_options(j.options);
            e
        })
        .collect();
    let mut runs: Vec<Run> = jobs.iter().map(|j| Run::Idle(j.start_ns)).collect();
    // The simulator holds no tensors: it counts the bytes of what the
    // executors allocate and free, over time.
    let mut memory: Vec<Memory<'_>> = jobs
        .iter()
        .map(|j| Memory {
            bytes: config.base_bytes,
            trace: Vec::new(),
            live: j.live,
        })
        .collect();
    let mut errors: Vec<Option<ExecError>> = vec![None; jobs.len()];
    let mut replan_errors = Vec::new();
    let mut gates: Vec<GateState> = jobs
        .iter()
        .map(|j| GateState {
            clock: j.plan.gate.map(GateClock::new),
            before_iteration: true,
        })
        .collect();
    // How many times any job has freed memory: a job waiting for memory
    // looks again after the next free.
    let mut frees = 0u64;
    // Jobs told to evict rather than wait, to end a wait of all for all.
    let mut must_evict = vec![false; jobs.len()];
    let mut now = 0u64;
    loop {
        for j in 0..jobs.len() {
            if let Run::WaitMemory(seen) = runs[j]
                && seen < frees
            {
                runs[j] = Run::Idle(now);
                must_evict.iter_mut().for_each(|m| *m = false);
            }
            while let Run::Idle(w) = runs[j] {
                if w > now {
                    break;
                }
                if std::mem::take(&mut gates[j].before_iteration)
                    && let Some(clock) = &mut gates[j].clock
                {
                    let slot = clock.start_at(now);
                    if slot > now {
                        runs[j] = Run::Idle(slot);
                        break;
                    }
                }
                let before = execs[j].iterations_done().len();
                set_limit(&mut execs[j], config, &memory, &runs, j);
                if must_evict[j] {
                    execs[j].set_limit_may_rise(false);
                }
                let next = execs[j].step(now);
                if !matches!(next, Ok(Next::WaitForMemory)) {
                    must_evict[j] = false;
                }
                frees += memory[j].apply(execs[j].take_effects(), now);
                if execs[j].iterations_done().len() > before
                    && let Some(stats) = execs[j].iterations_done().last()
                {
                    let measured = stats.measurements();
                    match replanner.after_iteration(JobId(j as u64), &measured) {
                        Ok(plans) => {
                            // One epoch for the new gates: on the cycle of
                            // those in use, or where the anchor job stands.
                            let previous = gates.iter().find_map(|g| g.clock.map(|c| c.gate()));
                            let anchor = replanner.anchor_job().and_then(|a| {
                                plans
                                    .iter()
                                    .find(|(k, _)| *k == a)
                                    .and_then(|(_, p)| p.gate)
                            });
                            let epoch = Gate::epoch_for(previous, anchor, now);
                            for (k, mut plan) in plans {
                                let k = k.0 as usize;
                                if let Some(g) = &mut plan.gate {
                                    g.epoch_ns = epoch;
                                }
                                if let Some(state) = gates.get_mut(k) {
                                    match (plan.gate, &mut state.clock) {
                                        (Some(g), Some(c)) => c.set_gate(g),
                                        (g, c) => *c = g.map(GateClock::new),
                                    }
                                }
                                if let Some(e) = execs.get_mut(k) {
                                    e.set_plan(plan);
                                }
                            }
                        }
                        // The jobs keep their plans, as a service would.
                        Err(e) => replan_errors.push((now, e)),
                    }
                }
                runs[j] = match next {
                    Ok(Next::Kernel { op }) => {
                        let work = jobs[j].true_ns[op.index()];
                        if work == 0 {
                            set_limit(&mut execs[j], config, &memory, &runs, j);
                            execs[j].kernel_done(now);
                            frees += memory[j].apply(execs[j].take_effects(), now);
                            Run::Idle(now)
                        } else {
                            Run::Kernel { left: work as f64 }
                        }
                    }
                    Ok(Next::WaitUntil(t)) => Run::Idle(t.max(now + u64::from(t <= now))),
                    // Virtual time knows every copy's end; a wait for an
                    // unknown one cannot come, but would only look again.
                    Ok(Next::WaitForCopy) => Run::Idle(now + 1),
                    Ok(Next::IterationDone) => {
                        gates[j].before_iteration = true;
                        Run::Idle(now)
                    }
                    Ok(Next::WaitForMemory) => Run::WaitMemory(frees),
                    Ok(Next::Done) => {
                        // Its process ends: its memory is gone.
                        memory[j].bytes = 0;
                        memory[j].trace.push((now, 0));
                        frees += 1;
                        Run::Done
                    }
                    Err(e) => {
                        errors[j] = Some(e);
                        Run::Done
                    }
                };
            }
        }
        let busy = runs
            .iter()
            .filter(|r| matches!(r, Run::Kernel { .. }))
            .count();
        let rate = 1.0 / (1.0 + config.sharing_slowdown * busy.saturating_sub(1) as f64);
        let next = runs
            .iter()
            .filter_map(|r| match r {
                Run::Idle(w) => Some(*w),
                Run::Kernel { left } => Some(now + (left / rate).ceil() as u64),
                Run::WaitMemory(_) | Run::Done => None,
            })
            .min();
        let Some(next) = next else {
            // Every job left waits for memory another holds: one at a time,
            // each is made to free what it can of its own (evict) instead.
            if let Some(j) =
                (0..runs.len()).find(|&j| matches!(runs[j], Run::WaitMemory(_)) && !must_evict[j])
            {
                must_evict[j] = true;
                runs[j] = Run::Idle(now);
                continue;
            }
            // Still nothing: each is stopped with the error that names what
            // it needs.
            for (j, r) in runs.iter_mut().enumerate() {
                if let Run::WaitMemory(_) = r {
                    errors[j] = execs[j].no_memory();
                    *r = Run::Done;
                }
            }
            break;
        };
        let dt = (next - now) as f64 * rate;
        now = next;
        for j in 0..jobs.len() {
            if let Run::Kernel { left } = &mut runs[j] {
                *left -= dt;
                if *left <= 1e-6 {
                    set_limit(&mut execs[j], config, &memory, &runs, j);
                    execs[j].kernel_done(now);
                    frees += memory[j].apply(execs[j].take_effects(), now);
                    runs[j] = Run::Idle(now);
                }
            }
        }
    }
    let jobs: Vec<JobResult> = execs
        .into_iter()
        .zip(errors)
        .zip(memory)
        .map(|((e, error), m)| JobResult {
            iterations: e.iterations_done().to_vec(),
            last_plan_version: e.plan_version(),
            trace: m.trace,
            error,
        })
        .collect();
    let peak_bytes = global_peak(&jobs);
    SimResult {
        jobs,
        peak_bytes,
        makespan_ns: now,
        replan_errors,
    }
}

/// One job's device memory as the simulator counts it.
struct Memory<'g> {
    bytes: u64,
    trace: Vec<(u64, u64)>,
    live: &'g Liveness,
}

impl Memory<'_> {
    /// Carries out the effects; returns how many freed memory.
    fn apply(&mut self, effects: Vec<Effect>, now: u64) -> u64 {
        let mut frees = 0;
        for e in effects {
            match e {
                Effect::Alloc(s) => self.bytes += self.live.storages[s.index()].bytes,
                Effect::Free(s) => {
                    self.bytes -= self.live.storages[s.index()].bytes;
                    frees += 1;
                }
            }
            self.trace.push((now, self.bytes));
        }
        frees
    }
}

/// Sets job `j`'s limit under the budget: the budget less what the other
/// jobs hold now (a finished job holds nothing: its process is gone); it
/// may rise while another job runs.
fn set_limit(
    exec: &mut Executor<'_, VirtualCopies>,
    config: &SimConfig,
    memory: &[Memory<'_>],
    runs: &[Run],
    j: usize,
) {
    exec.set_limit(limit(config, memory, runs, j));
    let running = runs
        .iter()
        .enumerate()
        .any(|(i, r)| i != j && matches!(r, Run::Idle(_) | Run::Kernel { .. }));
    exec.set_limit_may_rise(running);
}

/// Job `j`'s limit under the budget: the budget less what the other jobs
/// hold now (a finished job holds nothing: its process is gone).
fn limit(config: &SimConfig, memory: &[Memory<'_>], runs: &[Run], j: usize) -> Option<u64> {
    let budget = config.budget_bytes?;
    let others: u64 = memory
        .iter()
        .zip(runs)
        .enumerate()
        .filter(|(i, (_, r))| *i != j && !matches!(r, Run::Done))
        .map(|(_, (m, _))| m.bytes)
        .sum();
    Some(budget.saturating_sub(others))
}

/// The peak of the sum of the jobs' traces, taking each job's last value
/// at every instant.
pub fn global_peak(jobs: &[JobResult]) -> u64 {
    let traces: Vec<&[(u64, u64)]> = jobs.iter().map(|r| r.trace.as_slice()).collect();
    crate::trace::joint_peak(&traces)
}
