//! The planning task: the one owner of the re-planner and of admission
//! (TGI's block-allocator pattern). Handlers send it [`Command`]s; what
//! arrives while it plans is applied afterwards and coalesced into one
//! re-plan; planning runs on a blocking thread, with a time cap after
//! which jobs still waiting for their first plan get one without moves;
//! each job's newest plan goes out through its watch channel.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensile_graph::Graph;
use tensile_planner::{
    Diagnostic, DiagnosticKind, JobId, JobInput, JobSettings, Measurements, MultiPlan, Plan,
    PlannerConfig, ReplanError, ReplanReason, Replanner,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::error::Error;
use crate::metrics::Metrics;
use crate::state::{JobState, Shared, Update};
use crate::store::Store;

/// What handlers ask of the planning task.
#[derive(Debug)]
pub enum Command {
    Add(NewJob),
    /// The job left the table (unregistered, lease lapsed).
    Remove(u64),
    Report {
        id: u64,
        measured: Measurements,
        reply: oneshot::Sender<Result<ReportOutcome, Error>>,
    },
    Budget {
        bytes: u64,
        /// Jobs whose state changed.
        reply: oneshot::Sender<Vec<u64>>,
    },
}

/// A registered job, for admission and planning.
#[derive(Debug)]
pub struct NewJob {
    pub id: u64,
    pub graph: Arc<Graph>,
    pub latencies: Vec<u64>,
    pub settings: JobSettings,
    pub priority: i32,
    pub lower_bound: u64,
    pub fingerprint: String,
}

/// The answer to a report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReportOutcome {
    pub change_rate: f64,
    pub replanned: bool,
    pub plan_version: u64,
}

#[derive(Debug)]
struct Admitted {
    lower_bound: u64,
    fingerprint: String,
    /// Σ estimates when the last plan was made.
    at_plan: f64,
    /// Measurements folded in since the store last saw this job.
    unsaved: bool,
}

/// The task's state.
#[derive(Debug)]
pub struct Planner {
    shared: Arc<Shared>,
    replanner: Replanner,
    queue: Vec<(u64, NewJob)>,
    admitted: BTreeMap<u64, Admitted>,
    budget: u64,
    cap: Duration,
    store: Option<Arc<Store>>,
    device: String,
    metrics: Arc<Metrics>,
    seq: u64,
}

impl Planner {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shared: Arc<Shared>,
        config: PlannerConfig,
        threshold: f64,
        weight: f64,
        cap: Duration,
        store: Option<Arc<Store>>,
        device: String,
        metrics: Arc<Metrics>,
    ) -> Planner {
        let mut replanner = Replanner::new(config);
        replanner.threshold = threshold;
        replanner.weight = weight;
        let budget = config.budget_bytes.unwrap_or(u64::MAX);
        metrics
            .budget_bytes
            .set(i64::try_from(budget).unwrap_or(i64::MAX));
        Planner {
            shared,
            replanner,
            queue: Vec::new(),
            admitted: BTreeMap::new(),
            budget,
            cap,
            store,
            device,
            metrics,
            seq: 0,
        }
    }

    /// Runs until `cancel` or until every sender is gone; then saves what
    /// was learned.
    pub async fn run(mut self, mut rx: mpsc::Receiver<Command>, cancel: CancellationToken) {
        loop {
            let cmd = tokio::select! {
                c = rx.recv() => c,
                () = cancel.cancelled() => None,
            };
            let Some(cmd) = cmd else { break };
            let mut dirty = self.apply(cmd);
            // Coalesce: everything that arrived meanwhile makes one plan.
            while let Ok(cmd) = rx.try_recv() {
                dirty |= self.apply(cmd);
            }
            if dirty {
                self.plan().await;
            }
        }
        let ids: Vec<u64> = self.admitted.keys().copied().collect();
        self.save(&ids).await;
        debug!("planning task done");
    }

    /// Applies one command; true when a re-plan is due.
    fn apply(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Add(job) => {
                self.seq += 1;
                self.queue.push((self.seq, job));
                !self.admit().is_empty()
            }
            Command::Remove(id) => {
                if self.admitted.contains_key(&id) {
                    self.save_blocking(id);
                    self.admitted.remove(&id);
                    let _ = self.replanner.remove_job(JobId(id));
                    self.metrics.reason("departure");
                    self.admit();
                    true
                } else {
                    self.queue.retain(|(_, j)| j.id != id);
                    self.admit();
                    false
                }
            }
            Command::Report {
                id,
                measured,
                reply,
            } => {
                let (answer, due) = self.report(id, &measured);
                let _ = reply.send(answer);
                due
            }
            Command::Budget { bytes, reply } => {
                self.budget = bytes;
                let mut config = *self.replanner.config();
                config.budget_bytes = Some(bytes);
                self.replanner.set_config(config);
                self.shared.memory().budget_bytes = bytes;
                self.metrics
                    .budget_bytes
                    .set(i64::try_from(bytes).unwrap_or(i64::MAX));
                let changed = self.admit();
                let _ = reply.send(changed);
                self.metrics.reason("budget");
                true
            }
        }
    }

    fn report(&mut self, id: u64, m: &Measurements) -> (Result<ReportOutcome, Error>, bool) {
        let version = self.shared.jobs().get(&id).map_or(0, |j| j.version());
        let Some(adm) = self.admitted.get_mut(&id) else {
            return (
                Err(Error::WrongState {
                    job: id,
                    what: "it is queued (not admitted): there is no plan to report on".into(),
                }),
                false,
            );
        };
        match self.replanner.observe(JobId(id), m) {
            Ok(reason) => {
                adm.unsaved = true;
                let now: f64 = m.op_ns.iter().map(|&x| x as f64).sum();
                let base = adm.at_plan.max(1.0);
                let change_rate = (now - base).abs() / base;
                if let Some(r) = reason {
                    self.metrics.reason(match r {
                        ReplanReason::FirstMeasurements => "first_measurements",
                        ReplanReason::Drift => "drift",
                        ReplanReason::LatePrefetch => "late_prefetch",
                    });
                }
                (
                    Ok(ReportOutcome {
                        change_rate,
                        replanned: reason.is_some(),
                        plan_version: version,
                    }),
                    reason.is_some(),
                )
            }
            Err(e @ ReplanError::UnknownJob(_)) => (Err(Error::Planning(e.to_string())), false),
            Err(e) => (Err(Error::InvalidArgument(e.to_string())), false),
        }
    }

    /// Admits queued jobs in order (priority, then arrival) while the head
    /// fits; says why the others wait. Returns the jobs whose state changed.
    fn admit(&mut self) -> Vec<u64> {
        self.queue
            .sort_by_key(|(seq, j)| (Reverse(j.priority), *seq));
        let mut changed = Vec::new();
        let mut held: u64 = self.admitted.values().map(|a| a.lower_bound).sum();
        while let Some((_, head)) = self.queue.first() {
            if held.saturating_add(head.lower_bound) > self.budget {
                break;
            }
            let (_, job) = self.queue.remove(0);
            let id = job.id;
            match self
                .replanner
                .add_job(JobId(id), job.graph.clone(), &job.latencies, job.settings)
            {
                Ok(()) => {
                    held += job.lower_bound;
                    self.admitted.insert(
                        id,
                        Admitted {
                            lower_bound: job.lower_bound,
                            fingerprint: job.fingerprint,
                            at_plan: job.latencies.iter().map(|&x| x as f64).sum(),
                            unsaved: false,
                        },
                    );
                    if self.set_state(id, JobState::Planning) {
                        changed.push(id);
                    }
                }
                Err(e) => {
                    warn!(job = id, "cannot plan: {e}");
                    self.shared.remove(id, &format!("cannot plan: {e}"));
                }
            }
        }
        let free = self.budget.saturating_sub(held);
        let queue: Vec<(u64, u64)> = self
            .queue
            .iter()
            .map(|(_, j)| (j.id, j.lower_bound))
            .collect();
        for (ahead, (id, lb)) in queue.into_iter().enumerate() {
            let mut reason = format!(
                "needs at least {lb} bytes (its largest working set plus base); {free} of the budget of {} bytes are free beside {} admitted jobs: {} bytes short",
                self.budget,
                self.admitted.len(),
                lb.saturating_sub(free)
            );
            if ahead > 0 {
                reason += &format!("; {ahead} queued ahead of it");
            }
            if self.set_state(id, JobState::Queued(reason)) {
                changed.push(id);
            }
        }
        self.count_states();
        changed
    }

    /// Sets a job's state; true when its kind changed.
    fn set_state(&self, id: u64, state: JobState) -> bool {
        let jobs = self.shared.jobs();
        let Some(job) = jobs.get(&id) else {
            return false;
        };
        let mut kind_changed = false;
        job.updates.send_if_modified(|u| {
            if u.state == state {
                return false;
            }
            kind_changed = std::mem::discriminant(&u.state) != std::mem::discriminant(&state);
            u.state = state;
            true
        });
        kind_changed
    }

    fn count_states(&self) {
        let jobs = self.shared.jobs();
        let mut counts: BTreeMap<&str, i64> =
            [("queued", 0), ("planning", 0), ("active", 0)].into();
        for j in jobs.values() {
            let k = match j.state() {
                JobState::Queued(_) => "queued",
                JobState::Planning => "planning",
                JobState::Active => "active",
                JobState::Done(_) => continue,
            };
            *counts.entry(k).or_default() += 1;
        }
        for (state, n) in counts {
            self.metrics
                .jobs
                .get_or_create(&crate::metrics::StateLabel {
                    state: state.to_string(),
                })
                .set(n);
        }
        self.metrics.queue_length.set(self.queue.len() as i64);
    }

    /// Plans every admitted job and publishes the plans.
    async fn plan(&mut self) {
        let ids: Vec<u64> = self.admitted.keys().copied().collect();
        if ids.is_empty() {
            let mut mem = self.shared.memory();
            mem.sum_of_peaks_bytes = 0;
            mem.aligned_peak_bytes = 0;
            mem.vanilla_sum_of_peaks_bytes = 0;
            mem.diagnostics.clear();
            return;
        }
        let unsaved: Vec<u64> = self
            .admitted
            .iter()
            .filter(|(_, a)| a.unsaved)
            .map(|(&id, _)| id)
            .collect();
        self.save(&unsaved).await;
        // A clone: if the planner panics, the task keeps its state.
        let mut r = self.replanner.clone();
        let started = Instant::now();
        let mut handle = tokio::task::spawn_blocking(move || {
            let out = r.plan_all();
            (r, out)
        });
        let mut capped = false;
        let joined = match tokio::time::timeout(self.cap, &mut handle).await {
            Ok(j) => j,
            Err(_) => {
                capped = true;
                self.metrics.planning_capped.inc();
                warn!(
                    jobs = ids.len(),
                    cap_s = self.cap.as_secs_f64(),
                    "planning is past its time cap; jobs without a plan get one without moves"
                );
                self.fallback_plans().await;
                handle.await
            }
        };
        let elapsed = started.elapsed();
        self.metrics.planning_seconds.observe(elapsed.as_secs_f64());
        match joined {
            Ok((r, Ok(mut mp))) => {
                self.replanner = r;
                if capped {
                    mp.diagnostics.push(Diagnostic {
                        job: 0,
                        kind: DiagnosticKind::PlanningCapped,
                        tensor: None,
                        message: format!(
                            "planning took {:.2} s, past the cap of {:.2} s; plans without moves were sent meanwhile",
                            elapsed.as_secs_f64(),
                            self.cap.as_secs_f64()
                        ),
                    });
                }
                debug!(
                    jobs = ids.len(),
                    ms = elapsed.as_secs_f64() * 1e3,
                    "planned"
                );
                self.publish(&ids, mp);
            }
            Ok((_, Err(e))) => error!("planning failed: {e}"),
            Err(e) => error!("the planner panicked; the previous plans stay: {e}"),
        }
    }

    /// Plans without moves (releases after last use only) for the jobs
    /// still waiting for their first plan: valid, and fast.
    async fn fallback_plans(&mut self) {
        let waiting: Vec<(u64, Arc<Graph>, Vec<u64>)> = {
            let jobs = self.shared.jobs();
            self.admitted
                .keys()
                .filter_map(|&id| {
                    let j = jobs.get(&id)?;
                    (j.state() == JobState::Planning).then(|| {
                        let est = self.replanner.estimates(JobId(id)).unwrap_or_default();
                        (id, j.graph.clone(), est)
                    })
                })
                .collect()
        };
        if waiting.is_empty() {
            return;
        }
        let config = *self.replanner.config();
        let done = tokio::task::spawn_blocking(move || {
            waiting
                .into_iter()
                .filter_map(|(id, g, est)| {
                    let settings = JobSettings {
                        swap: false,
                        recompute: false,
                        across_iteration: false,
                        ..JobSettings::default()
                    };
                    let mut c = config;
                    c.budget_bytes = None;
                    let mp = tensile_planner::plan(&[JobInput::new(&g, est, settings)], &c).ok()?;
                    Some((id, mp))
                })
                .collect::<Vec<_>>()
        })
        .await;
        for (id, mut mp) in done.unwrap_or_default() {
            mp.diagnostics.push(Diagnostic {
                job: 0,
                kind: DiagnosticKind::PlanningCapped,
                tensor: None,
                message: "planning all jobs is past its time cap: this plan makes no moves; the full plan follows".into(),
            });
            self.publish_one(id, mp.plans.remove(0), mp.diagnostics);
        }
    }

    fn publish_one(&self, id: u64, mut plan: Plan, diagnostics: Vec<Diagnostic>) {
        let jobs = self.shared.jobs();
        if let Some(job) = jobs.get(&id) {
            plan.version = job.version() + 1;
            job.updates.send_replace(Update {
                state: JobState::Active,
                plan: Some(Arc::new(plan)),
                diagnostics: Arc::new(diagnostics),
            });
            self.metrics.plans_published.inc();
        }
    }

    fn publish(&mut self, ids: &[u64], mp: MultiPlan) {
        let global = |d: &Diagnostic| {
            matches!(
                d.kind,
                DiagnosticKind::OverBudget | DiagnosticKind::PlanningCapped
            )
        };
        for (k, (&id, plan)) in ids.iter().zip(mp.plans).enumerate() {
            let diags: Vec<Diagnostic> = mp
                .diagnostics
                .iter()
                .filter(|d| d.job == k || global(d))
                .cloned()
                .collect();
            self.publish_one(id, plan, diags);
            if let (Some(a), Some(est)) = (
                self.admitted.get_mut(&id),
                self.replanner.estimates(JobId(id)),
            ) {
                a.at_plan = est.iter().map(|&x| x as f64).sum();
            }
        }
        let mut mem = self.shared.memory();
        mem.sum_of_peaks_bytes = mp.sum_of_peaks_bytes;
        mem.aligned_peak_bytes = mp.aligned_peak_bytes;
        mem.vanilla_sum_of_peaks_bytes = mp.vanilla_sum_of_peaks_bytes;
        mem.diagnostics = mp
            .diagnostics
            .iter()
            .map(|d| (ids.get(d.job).copied().unwrap_or(0), d.clone()))
            .collect();
        drop(mem);
        self.metrics
            .sum_of_peaks_bytes
            .set(i64::try_from(mp.sum_of_peaks_bytes).unwrap_or(i64::MAX));
        self.count_states();
        info!(
            jobs = ids.len(),
            sum_of_peaks = mp.sum_of_peaks_bytes,
            "plans published"
        );
    }

    /// Writes the learned latencies of `ids` to the store (blocking
    /// thread), so that a re-plan's publication implies they are on disk.
    async fn save(&mut self, ids: &[u64]) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let rows: Vec<(String, Vec<u64>)> = ids
            .iter()
            .filter_map(|&id| {
                let a = self.admitted.get_mut(&id)?;
                a.unsaved = false;
                Some((a.fingerprint.clone(), self.replanner.estimates(JobId(id))?))
            })
            .collect();
        if rows.is_empty() {
            return;
        }
        let device = self.device.clone();
        let res = tokio::task::spawn_blocking(move || {
            for (f, ns) in rows {
                store.save(&f, &device, &ns)?;
            }
            Ok::<_, crate::store::StoreError>(())
        })
        .await;
        match res {
            Ok(Ok(())) => {}
            Ok(Err(e)) => error!("cannot save learned latencies: {e}"),
            Err(e) => error!("saving learned latencies panicked: {e}"),
        }
    }

    /// Saves one departing job right away (a single short write).
    fn save_blocking(&mut self, id: u64) {
        let (Some(store), Some(a)) = (self.store.clone(), self.admitted.get_mut(&id)) else {
            return;
        };
        if !a.unsaved {
            return;
        }
        a.unsaved = false;
        if let Some(ns) = self.replanner.estimates(JobId(id))
            && let Err(e) = store.save(&a.fingerprint, &self.device, &ns)
        {
            error!("cannot save learned latencies: {e}");
        }
    }
}
