//! Capuchin (Peng et al., ASPLOS 2020) on our executor, per job and under
//! each job's own memory budget.
//!
//! - Iteration 1, passive mode: no plan beyond freeing after last use; the
//!   executor evicts least-recently-used tensors to the host when an
//!   allocation would go over the budget and fetches them back on demand
//!   (`ExecOptions::evict_budget_bytes`), while the op latencies are
//!   measured (Capuchin's tensor access tracking).
//! - After it, from the measured latencies: the hybrid policy
//!   (`policy`): swaps by free time where they can be hidden, otherwise
//!   recomputation by MSPS or a swap fetched on demand, whichever costs
//!   less time, until the predicted peak is within the budget (`timeline`
//!   predicts memory and copies by the executor's own rules). Every job is
//!   planned alone (Capuchin has no view of other jobs), on its part of the
//!   link as the copy model defines it.
//! - Later iterations: a swap-in that arrived late moves earlier (its lead
//!   grows by 5% per miss) and the job gets the updated plan. The plan
//!   itself is not made again: Capuchin decides once, from its one
//!   observation.
//! - The passive eviction stays on in every iteration as the safety net for
//!   whatever the plan does not bring under the budget.
//!
//! What it does not do, unlike ours: swap parameters, gradients or
//! optimizer state (only saved activations are candidates), swap across the
//! iteration boundary, or plan the jobs' copies together.

mod policy;
mod timeline;

use tensile_executor::sim::Replanner;
use tensile_executor::{ExecOptions, IterationStats};
use tensile_graph::{Graph, Liveness, StorageId};
use tensile_planner::{CopyModel, Event, EventKind, Plan, Trigger};

use crate::common;
use timeline::{Choices, JobModel, predict};

/// What Capuchin decided for one job, for reports and tests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CapuchinJob {
    /// The job's budget, bytes (base included).
    pub budget_bytes: u64,
    /// Bytes the passive iteration evicted (what it found missing).
    pub evicted_bytes: u64,
    /// The peak predicted with no plan, from the measured latencies.
    pub unplanned_peak_bytes: u64,
    /// The peak predicted under the plan.
    pub predicted_peak_bytes: u64,
    /// Swaps whose swap-in is hidden before the access.
    pub swaps: usize,
    /// Swaps that could not be hidden: fetched on demand, the op waiting.
    pub fetches: usize,
    pub recomputes: usize,
    /// Swap-ins moved earlier by the late-prefetch feedback, in all.
    pub feedback_moves: usize,
}

#[derive(Debug)]
struct JobState<'g> {
    model: Option<JobModel<'g>>,
    choices: Choices,
    version: u64,
    report: CapuchinJob,
}

/// Capuchin's planner over the simulator's iterations: one per run, for
/// all jobs, each job with its own memory budget.
#[derive(Debug)]
pub struct Capuchin<'g> {
    graphs: Vec<&'g Graph>,
    lives: Vec<&'g Liveness>,
    budgets: Vec<u64>,
    copy: CopyModel,
    jobs: Vec<JobState<'g>>,
}

impl<'g> Capuchin<'g> {
    /// `budgets`: each job's memory budget, bytes (base included). `copy`:
    /// the link, as the simulator runs it.
    pub fn new(
        graphs: Vec<&'g Graph>,
        lives: Vec<&'g Liveness>,
        budgets: Vec<u64>,
        copy: CopyModel,
    ) -> Capuchin<'g> {
        let jobs = budgets
            .iter()
            .map(|&b| JobState {
                model: None,
                choices: Choices::default(),
                version: 1,
                report: CapuchinJob {
                    budget_bytes: b,
                    ..CapuchinJob::default()
                },
            })
            .collect();
        Capuchin {
            graphs,
            lives,
            budgets,
            copy,
            jobs,
        }
    }

    /// The plans of the first (passive) iteration.
    pub fn initial_plans(&self) -> Vec<Plan> {
        self.lives
            .iter()
            .map(|l| Plan {
                version: 1,
                ..common::vanilla(l)
            })
            .collect()
    }

    /// How job `job`'s executor runs: with the passive eviction under the
    /// job's budget, in every iteration.
    pub fn exec_options(&self, job: usize) -> ExecOptions {
        ExecOptions {
            evict_budget_bytes: self.budgets.get(job).copied(),
            ..ExecOptions::default()
        }
    }

    /// What was decided for job `job` so far.
    pub fn job(&self, job: usize) -> Option<&CapuchinJob> {
        self.jobs.get(job).map(|j| &j.report)
    }

    /// The job's part of the link: the simulator splits it equally when the
    /// copy model says the jobs share it.
    fn share(&self) -> f64 {
        if self.copy.shared_by_jobs {
            1.0 / self.graphs.len().max(1) as f64
        } else {
            1.0
        }
    }

    /// Plans job `job` from its passive iteration.
    fn plan_first(&mut self, job: usize, stats: &IterationStats) -> Option<Plan> {
        let (graph, live) = (*self.graphs.get(job)?, *self.lives.get(job)?);
        if stats.op_ns.len() != graph.ops().len() {
            return None;
        }
        let share = self.share();
        let model = JobModel::new(
            graph,
            live,
            stats.op_ns.clone(),
            stats.start_bytes,
            self.copy,
            share,
        );
        let st = self.jobs.get_mut(job)?;
        let budget = st.report.budget_bytes;
        st.choices = policy::select(&model, budget);
        st.report.evicted_bytes = stats
            .evictions
            .iter()
            .map(|&(t, _)| live.storage(t).bytes)
            .sum();
        st.report.unplanned_peak_bytes = predict(&model, &Choices::default()).peak;
        st.report.swaps = st.choices.swaps.len();
        st.report.recomputes = st.choices.recomputes.len();
        st.report.fetches = st.choices.fetches.len();
        st.model = Some(model);
        Some(self.emit(job))
    }

    /// A new version of job `job`'s plan, to hand out.
    fn emit(&mut self, job: usize) -> Plan {
        let st = &mut self.jobs[job];
        st.version += 1;
        let plan = self.plan(job).unwrap_or_default();
        self.jobs[job].report.predicted_peak_bytes = plan.prediction.planned_peak_bytes;
        plan
    }

    /// Job `job`'s current plan: the passive iteration's until it has been
    /// measured.
    pub fn plan(&self, job: usize) -> Option<Plan> {
        let live = *self.lives.get(job)?;
        let st = self.jobs.get(job)?;
        let Some(m) = &st.model else {
            return Some(Plan {
                version: st.version,
                ..common::vanilla(live)
            });
        };
        let c = &st.choices;
        let root = |s: StorageId| live.storages[s.index()].root;
        let mut events = Event::releases_after_last_use(live);
        // Swap-outs, then those fetched on demand, then swap-ins: the order
        // the prediction queues them in after the same op.
        for w in &c.swaps {
            events.push(Event {
                trigger: Trigger::After(w.after),
                delay_ns: w.out_delay,
                kind: EventKind::SwapOut,
                tensor: root(w.s),
            });
        }
        for f in &c.fetches {
            events.push(Event {
                trigger: Trigger::After(f.after),
                delay_ns: f.out_delay,
                kind: EventKind::SwapOut,
                tensor: root(f.s),
            });
        }
        for w in &c.swaps {
            events.push(Event {
                trigger: Trigger::After(w.in_after),
                delay_ns: 0,
                kind: EventKind::SwapIn,
                tensor: root(w.s),
            });
        }
        for r in &c.recomputes {
            events.push(Event {
                trigger: Trigger::After(r.after),
                delay_ns: 0,
                kind: EventKind::Release,
                tensor: root(r.s),
            });
            events.push(Event {
                trigger: Trigger::Before(r.before),
                delay_ns: 0,
                kind: EventKind::Recompute,
                tensor: root(r.s),
            });
        }
        let pr = predict(m, c);
        let vanilla = predict(m, &Choices::default());
        let mut plan = common::assemble(events);
        plan.version = st.version;
        let p = &mut plan.prediction;
        p.vanilla_peak_bytes = vanilla.peak;
        p.vanilla_time_ns = vanilla.time_ns;
        p.planned_peak_bytes = pr.peak;
        p.planned_time_ns = pr.time_ns;
        p.swap_outs = c.swaps.len() + c.fetches.len();
        p.swap_ins = c.swaps.len();
        p.swapped_bytes = c
            .swaps
            .iter()
            .map(|w| w.s)
            .chain(c.fetches.iter().map(|f| f.s))
            .map(|s| m.bytes(s))
            .sum();
        p.recomputed_ops = c.recomputes.len();
        Some(plan)
    }
}

impl Replanner for Capuchin<'_> {
    fn after_iteration(&mut self, job: usize, stats: &IterationStats) -> Vec<(usize, Plan)> {
        let Some(st) = self.jobs.get_mut(job) else {
            return Vec::new();
        };
        let Some(m) = &st.model else {
            return self
                .plan_first(job, stats)
                .map(|p| vec![(job, p)])
                .unwrap_or_default();
        };
        let live = self.lives[job];
        let mut late: Vec<StorageId> = stats
            .late_prefetches
            .iter()
            .map(|&(t, _)| live.storage_of[t.index()])
            .collect();
        late.sort_unstable();
        late.dedup();
        if late.is_empty() {
            return Vec::new();
        }
        let moved = policy::feedback(m, &mut st.choices, &late);
        if moved == 0 {
            return Vec::new();
        }
        st.report.feedback_moves += moved;
        vec![(job, self.emit(job))]
    }
}
