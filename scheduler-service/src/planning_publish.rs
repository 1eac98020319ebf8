//! The planning task's publication of plans (a child of `planning.rs`):
//! the ledger of the plans in force, which plans of a joint plan go out and
//! in what order so that the plans in force never add up past the budget,
//! the jobs' watch channels, and a job sent back to the queue when its first
//! plan cannot go out; the budget they are held to, written in one place.

use std::sync::Arc;

use tensile_planner::{Diagnostic, DiagnosticKind, JobId, MultiPlan, Plan};
use tracing::{info, warn};

use super::Planner;
use crate::node::Manifest;
use crate::state::{JobState, Update};

impl Planner {
    /// This GPU's planner, which keeps its budget in `manifest` (the node's
    /// gpus.json) as GPU `index`'s.
    pub(crate) fn keeping_manifest(mut self, index: u32, manifest: Arc<Manifest>) -> Planner {
        self.manifest = Some((index, manifest));
        self
    }

    /// The budget is now `budget` (none: no limit): the one place it is
    /// written, for the task itself, the re-planner's configuration, the
    /// status the handlers read, the metric and, on a node, gpus.json.
    /// (gpus.json is on disk only from when every socket listens: before,
    /// the new budget is kept for its first writing.)
    pub(super) fn set_budget(&mut self, budget: Option<u64>) {
        self.budget = budget.unwrap_or(u64::MAX);
        let mut config = *self.replanner.config();
        if config.budget_bytes != budget {
            config.budget_bytes = budget;
            self.replanner.set_config(config);
        }
        self.shared.memory().budget_bytes = self.budget;
        self.metrics
            .budget_bytes
            .set(i64::try_from(self.budget).unwrap_or(i64::MAX));
        if let Some((index, manifest)) = &self.manifest
            && let Err(e) = manifest.set_budget(*index, self.budget)
        {
            // A small file written whole: on this task, so that writes
            // keep the order of the changes and the RPC's reply comes
            // after the file says the new budget.
            warn!("the budget is set, but gpus.json still says the old one: {e}");
        }
    }

    /// Puts admitted job `id`, which has no plan in force, back in the
    /// queue at its place, needing `reached` bytes (the peak the planner
    /// reached for it), and admits again.
    pub(super) fn requeue(&mut self, id: u64, reached: u64) {
        let Some(a) = self.admitted.remove(&id) else {
            return;
        };
        let _ = self.replanner.remove_job(JobId(id));
        self.late.retain(|j| j.id != id);
        self.leave_process(id, false);
        self.fresh.retain(|j| j.id != id);
        let mut job = a.job;
        if let Some(ns) = self.replanner_estimates_or(id, &job.latencies) {
            job.latencies = ns;
        }
        job.base = a.base;
        job.settings.base_bytes = job.base.bytes();
        job.lower_bound = a.lower_bound;
        info!(
            job = id,
            reached,
            budget = self.budget,
            "the job's first plan does not fit beside the plans in force; it waits in the queue"
        );
        self.reached.insert(id, reached.max(job.lower_bound));
        self.queue.push((a.seq, job));
        self.admit();
    }

    /// The re-planner's learned latencies of job `id`, if it has any other
    /// than `given`.
    pub(super) fn replanner_estimates_or(&self, id: u64, given: &[u64]) -> Option<Vec<u64>> {
        self.replanner
            .estimates(JobId(id))
            .filter(|ns| ns.as_slice() != given)
    }

    /// Which plans of a joint plan without gates go out, in the order
    /// they go out, so that the plans in force never add up past the
    /// budget, counted as the ledger counts them
    /// ([`Planner::in_force_bytes`]) after each: in rounds, smallest rise
    /// of its job's peak first, each plan that keeps the count within the
    /// budget (or, past it after a budget cut, does not raise it). A plan
    /// that lowers its job's peak may still raise the count: its job
    /// leaves a gated set, whose other jobs, still on their gates, may
    /// hold as much as before without it; such a plan waits for a later
    /// round, once others of the set have left it, or is withheld.
    pub(super) fn what_fits(&self, ids: &[u64], mp: &MultiPlan) -> Vec<usize> {
        let now = |id: &u64| self.in_force.get(id).copied().unwrap_or(0);
        let (mut gated, aligned): (Vec<u64>, u64) =
            self.gated_in_force.clone().unwrap_or((Vec::new(), 0));
        // The ledger, kept as it would stand: the peaks of the plans
        // outside the gated set, and of those in it.
        let mut free: u64 = self
            .in_force
            .iter()
            .filter(|(id, _)| !gated.contains(id))
            .map(|(_, &peak)| peak)
            .fold(0, u64::saturating_add);
        let mut in_gates: u64 = gated.iter().map(now).fold(0, u64::saturating_add);
        let mut rises: Vec<(i128, usize)> = ids
            .iter()
            .zip(&mp.plans)
            .enumerate()
            .map(|(k, (id, p))| {
                (
                    i128::from(p.prediction.planned_peak_bytes) - i128::from(now(id)),
                    k,
                )
            })
            .collect();
        rises.sort();
        let mut order = Vec::new();
        loop {
            let went = order.len();
            let mut left = Vec::new();
            for (rise, k) in rises {
                let (Some(id), Some(p)) = (ids.get(k), mp.plans.get(k)) else {
                    continue;
                };
                let current = free.saturating_add(aligned.min(in_gates));
                let (new, was) = (p.prediction.planned_peak_bytes, now(id));
                let (f, g) = if gated.contains(id) {
                    (free.saturating_add(new), in_gates.saturating_sub(was))
                } else {
                    (free.saturating_sub(was).saturating_add(new), in_gates)
                };
                if f.saturating_add(aligned.min(g)) <= self.budget.max(current) {
                    order.push(k);
                    (free, in_gates) = (f, g);
                    gated.retain(|g| g != id);
                } else {
                    left.push((rise, k));
                }
            }
            // Another round while the last one let plans out and some wait.
            if left.is_empty() || order.len() == went {
                break;
            }
            rises = left;
        }
        order
    }

    /// The sum of the planned peaks of what runs now, for status and the
    /// metrics.
    pub(super) fn show_sum_of_peaks(&self, sum: u64) {
        self.shared.memory().sum_of_peaks_bytes = sum;
        self.metrics
            .sum_of_peaks_bytes
            .set(i64::try_from(sum).unwrap_or(i64::MAX));
    }

    /// What the plans in force hold: the jobs still on a gated set's
    /// plans by [`Planner::gated_holds`], every other plan by its peak.
    pub(super) fn in_force_bytes(&self) -> u64 {
        match &self.gated_in_force {
            Some((gated, _)) => self
                .in_force
                .iter()
                .filter(|(id, _)| !gated.contains(id))
                .map(|(_, &peak)| peak)
                .fold(self.gated_holds(), u64::saturating_add),
            None => self.in_force_sum(),
        }
    }

    /// What the jobs still on the gated set's plans hold together: their
    /// aligned peak, or their peaks added up where that is less (jobs of
    /// the set that left it or run other plans now: those still on their
    /// gates keep their phases, so they hold no more than the set did).
    pub(super) fn gated_holds(&self) -> u64 {
        self.gated_in_force.as_ref().map_or(0, |(gated, aligned)| {
            gated
                .iter()
                .map(|id| self.in_force.get(id).copied().unwrap_or(0))
                .fold(0, u64::saturating_add)
                .min(*aligned)
        })
    }

    /// The plans in force's peaks added up, gated or not.
    fn in_force_sum(&self) -> u64 {
        self.in_force.values().copied().fold(0, u64::saturating_add)
    }

    /// Job `id` runs no plan any more (it left, or went back to the queue).
    pub(super) fn out_of_force(&mut self, id: u64) {
        self.in_force.remove(&id);
        self.leave_gates(id);
    }

    /// Job `id` runs no plan of the gated set any more.
    fn leave_gates(&mut self, id: u64) {
        if let Some((gated, _)) = &mut self.gated_in_force {
            gated.retain(|&g| g != id);
            if gated.is_empty() {
                self.gated_in_force = None;
            }
        }
    }

    /// Records what the plans in force hold now: the metrics' gauge and
    /// the largest excess over the budget.
    pub(super) fn note_in_force(&mut self) {
        let bytes = self.in_force_bytes();
        self.max_over = self.max_over.max(bytes.saturating_sub(self.budget));
        self.shared.memory().published_bytes = bytes;
        self.metrics
            .published_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.metrics
            .max_published_over_budget_bytes
            .set(i64::try_from(self.max_over).unwrap_or(i64::MAX));
    }

    /// Publishes `plan` to job `id` and records it in force; `gated`: one
    /// of the gated set in `gated_in_force`.
    pub(super) fn publish_one(
        &mut self,
        id: u64,
        mut plan: Plan,
        diagnostics: Vec<Diagnostic>,
        gated: bool,
    ) {
        let peak = plan.prediction.planned_peak_bytes;
        if !gated {
            // The job leaves the gated set; the others keep their gates.
            self.leave_gates(id);
        }
        let sent = self.shared.job(id, |job| {
            if runs_the_same(&job.updates.borrow(), &plan, &diagnostics) {
                return false;
            }
            plan.version = job.version() + 1;
            job.updates.send_replace(Update {
                state: JobState::Active,
                plan: Some(Arc::new(plan)),
                diagnostics: Arc::new(diagnostics),
            });
            true
        });
        if let Some(sent) = sent {
            self.in_force.insert(id, peak);
            if sent {
                self.metrics.plans_published.inc();
            } else {
                self.metrics.plans_unchanged.inc();
            }
        }
    }

    /// Publishes the plans of `mp` at `order` (indices into `ids`), in
    /// that order.
    pub(super) fn publish(&mut self, ids: &[u64], mut mp: MultiPlan, order: &[usize]) {
        if order.is_empty() {
            return;
        }
        // One epoch for the joint plan's gates, on the host's monotonic
        // clock that the workers share: on the cycle of the gates in use,
        // or where the job whose measurements asked for the plans stands.
        if mp.cycle_ns > 0 {
            mp.set_epoch(self.gate, tensile_proto::clock::monotonic_ns());
            if let Some(g) = mp.plans.iter().find_map(|p| p.gate) {
                self.gate = Some(g);
            }
        } else {
            self.gate = None;
        }
        let global = |d: &Diagnostic| {
            matches!(
                d.kind,
                DiagnosticKind::OverBudget | DiagnosticKind::PlanningCapped
            )
        };
        let gated = mp.cycle_ns > 0;
        if gated {
            // All of a gated plan goes out: the set holds its aligned peak.
            self.gated_in_force = Some((ids.to_vec(), mp.aligned_peak_bytes));
        }
        let mut plans: Vec<Option<Plan>> = mp.plans.into_iter().map(Some).collect();
        for &k in order {
            let (Some(&id), Some(plan)) = (ids.get(k), plans.get_mut(k).and_then(Option::take))
            else {
                continue;
            };
            let diags: Vec<Diagnostic> = mp
                .diagnostics
                .iter()
                .filter(|d| d.job == k || global(d))
                .cloned()
                .collect();
            self.publish_one(id, plan, diags, gated);
            self.note_in_force();
            if let (Some(a), Some(est)) = (
                self.admitted.get_mut(&id),
                self.replanner.estimates(JobId(id)),
            ) {
                a.at_plan = est.iter().map(|&x| x as f64).sum();
            }
        }
        // What runs now: this plan's jobs and any fast plans beside them.
        let sum_of_peaks = self.in_force_sum();
        let mut mem = self.shared.memory();
        mem.aligned_peak_bytes = mp.aligned_peak_bytes;
        mem.vanilla_sum_of_peaks_bytes = mp.vanilla_sum_of_peaks_bytes;
        mem.layout = mp.layout.name();
        mem.layout_note = mp.layout_note.clone();
        mem.diagnostics = mp
            .diagnostics
            .iter()
            .map(|d| (ids.get(d.job).copied().unwrap_or(0), d.clone()))
            .collect();
        drop(mem);
        self.show_sum_of_peaks(sum_of_peaks);
        self.count_states();
        info!(jobs = ids.len(), sum_of_peaks, "plans published");
    }
}

/// Whether an active job's plan in force is `plan` in all the worker acts
/// on (its copies and releases, the storages it starts on the host, its
/// gate) and in its peak, with the same diagnostics: then a new version
/// would change nothing it does, and it keeps the one it runs (a plan
/// settles: a job re-planned beside another's report gets no new version
/// unless its own plan changed). Its prediction stays the one it was
/// handed; a gated plan's epoch differs at every joint plan, so gated
/// plans always go out.
fn runs_the_same(update: &Update, plan: &Plan, diagnostics: &[Diagnostic]) -> bool {
    let Some(current) = update.plan.as_deref() else {
        return false;
    };
    update.state == JobState::Active
        && current.events == plan.events
        && current.start_on_host == plan.start_on_host
        && current.gate == plan.gate
        && current.prediction.planned_peak_bytes == plan.prediction.planned_peak_bytes
        && *update.diagnostics == diagnostics
}
