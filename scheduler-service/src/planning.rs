//! The planning task: the one owner of the re-planner and of admission
//! (TGI's block-allocator pattern). Handlers send it [`Command`]s. A joint
//! plan of all admitted jobs runs on a blocking thread, capped by the
//! planner's own deadline (`plan_cap`); while it runs the task keeps
//! taking commands: registrations are admitted at once and a newly
//! admitted job gets a fast first plan (planned alone, against the memory
//! the others' published plans leave), published at once; reports,
//! departures and budget changes wait and are coalesced into the next
//! joint plan, which supersedes the fast plans. Published plans never add
//! up past the budget because of a fast plan: a fast plan is published only
//! if it fits beside the others' published peaks, and of a joint plan made
//! without a fast-planned job only the plans that fit beside it go out
//! (those that lower a job's peak first); the next joint plan, which
//! includes every job, follows at once. (A joint plan that is over the
//! budget by itself, with an `OverBudget` diagnostic, is published whole
//! when no fast plan ran meanwhile: admission holds the lower bounds, not what the planner
//! reaches within its cap.)
//! Each job's newest plan goes out through its watch channel.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensile_graph::Graph;
use tensile_planner::{
    Diagnostic, DiagnosticKind, Gate, JobId, JobInput, JobSettings, Measurements, MultiPlan, Plan,
    PlannerConfig, ReplanError, ReplanReason, Replanner,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::base::{Base, BaseSource};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::state::{Job, JobState, Shared, Update};
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
        /// The report's measured base (0: not measured).
        base_bytes: u64,
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
    /// Its largest working set plus its base.
    pub lower_bound: u64,
    /// The base in `settings`, and where it came from.
    pub base: Base,
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
    /// Its lower bound less its base: the largest working set.
    working_set: u64,
    /// The base it is planned with, and the measurements that may replace
    /// it.
    base: Base,
    fingerprint: String,
    /// Σ estimates when the last plan was made.
    at_plan: f64,
    /// Measurements folded in since the store last saw this job.
    unsaved: bool,
}

/// A newly admitted job, for its fast first plan.
#[derive(Debug)]
struct Fresh {
    id: u64,
    graph: Arc<Graph>,
    latencies: Vec<u64>,
    settings: JobSettings,
    lower_bound: u64,
}

type Planned = (Replanner, Result<Option<MultiPlan>, ReplanError>);

/// The joint plan running on a blocking thread.
#[derive(Debug)]
struct Flight {
    handle: JoinHandle<Planned>,
    ids: Vec<u64>,
    started: Instant,
}

/// How long a fast first plan may search, at most.
const FAST_CAP: Duration = Duration::from_millis(25);

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
    /// A joint plan is running on a clone of the re-planner: admitted jobs
    /// join the re-planner when it is back.
    in_flight: bool,
    /// Admitted while a joint plan ran; not in the re-planner yet.
    late: Vec<NewJob>,
    /// Admitted since the last fast planning: each gets a fast first plan.
    fresh: Vec<Fresh>,
    /// Test hook: every joint plan first sleeps this long.
    pub(crate) slow_joint_plans: Option<Duration>,
    /// The gate of the last gated plan published (any job's: they share
    /// epoch and period), whose cycle a new joint plan's epoch keeps.
    gate: Option<Gate>,
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
        let mut config = config;
        config.time_cap = Some(cap);
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
            in_flight: false,
            late: Vec::new(),
            fresh: Vec::new(),
            slow_joint_plans: None,
            gate: None,
        }
    }

    /// Runs until `cancel` or until every sender is gone; then saves what
    /// was learned.
    pub async fn run(mut self, mut rx: mpsc::Receiver<Command>, cancel: CancellationToken) {
        let mut flight: Option<Flight> = None;
        // Commands that wait for the joint plan in flight.
        let mut deferred: Vec<Command> = Vec::new();
        let mut dirty = false;
        loop {
            tokio::select! {
                c = rx.recv() => {
                    let Some(cmd) = c else { break };
                    if flight.is_some() {
                        match cmd {
                            Command::Add(job) => dirty |= self.apply(Command::Add(job)),
                            other => deferred.push(other),
                        }
                    } else {
                        dirty |= self.apply(cmd);
                    }
                }
                joined = async {
                    match flight.as_mut() {
                        Some(f) => (&mut f.handle).await,
                        None => std::future::pending().await,
                    }
                } => {
                    if let Some(f) = flight.take() {
                        dirty |= self.land(f, joined);
                    }
                    for cmd in deferred.drain(..) {
                        dirty |= self.apply(cmd);
                    }
                }
                () = cancel.cancelled() => break,
            }
            // Coalesce: everything that arrived meanwhile makes one plan.
            while let Ok(cmd) = rx.try_recv() {
                if flight.is_some() && !matches!(cmd, Command::Add(_)) {
                    deferred.push(cmd);
                } else {
                    dirty |= self.apply(cmd);
                }
            }
            self.fast_plans().await;
            if dirty && flight.is_none() {
                dirty = false;
                flight = self.launch().await;
            }
        }
        if let Some(f) = flight.take()
            && let Ok(planned) = f.handle.await
        {
            self.replanner = planned.0;
            self.in_flight = false;
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
                base_bytes,
                reply,
            } => {
                let (answer, due) = self.report(id, &measured, base_bytes);
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

    fn report(
        &mut self,
        id: u64,
        m: &Measurements,
        base_bytes: u64,
    ) -> (Result<ReportOutcome, Error>, bool) {
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
                    debug!(job = id, reason = ?r, "a re-plan is due");
                    self.metrics.reason(match r {
                        ReplanReason::FirstMeasurements => "first_measurements",
                        ReplanReason::Drift => "drift",
                        ReplanReason::LatePrefetch => "late_prefetch",
                        ReplanReason::FreeMissed => "free_missed",
                        ReplanReason::ShorterMissed => "shorter_missed",
                        ReplanReason::Stretch => "stretch",
                        ReplanReason::Compress => "compress",
                    });
                }
                let due = self.rebase(id, base_bytes) || reason.is_some();
                (
                    Ok(ReportOutcome {
                        change_rate,
                        replanned: due,
                        plan_version: version,
                    }),
                    due,
                )
            }
            Err(e @ ReplanError::UnknownJob(_)) => (Err(Error::Planning(e.to_string())), false),
            Err(e) => (Err(Error::InvalidArgument(e.to_string())), false),
        }
    }

    /// Folds a report's measured base into job `id`'s ([`Base::observe`]);
    /// when it is to be planned with, makes it the job's base in the
    /// re-planner, its lower bound and its status, and admits again
    /// (queued jobs may fit now, or need more). True when a re-plan is due.
    fn rebase(&mut self, id: u64, measured: u64) -> bool {
        let Some(adm) = self.admitted.get_mut(&id) else {
            return false;
        };
        let was = adm.base.bytes();
        let Some(bytes) = adm.base.observe(measured) else {
            return false;
        };
        if let Err(e) = self.replanner.set_base_bytes(JobId(id), bytes) {
            warn!(job = id, "cannot plan the measured base: {e}");
            return false;
        }
        adm.lower_bound = adm.working_set.saturating_add(bytes);
        let lower_bound = adm.lower_bound;
        if let Some(j) = self.shared.jobs().get_mut(&id) {
            j.base_bytes = bytes;
            j.base_source = BaseSource::Measured;
            j.lower_bound = lower_bound;
        }
        info!(
            job = id,
            was,
            base_bytes = bytes,
            "the job's measured base replaces the one it was planned with; re-planning"
        );
        self.metrics.reason("base");
        self.admit();
        let held: u64 = self.admitted.values().map(|a| a.lower_bound).sum();
        if held > self.budget {
            warn!(
                held,
                budget = self.budget,
                "with the measured bases the admitted jobs' lower bounds exceed the budget; the plans will say OVER_BUDGET"
            );
        }
        true
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
            let fresh = Fresh {
                id,
                graph: job.graph.clone(),
                latencies: job.latencies.clone(),
                settings: job.settings,
                lower_bound: job.lower_bound,
            };
            let admitted = Admitted {
                lower_bound: job.lower_bound,
                working_set: job.lower_bound.saturating_sub(job.base.bytes()),
                base: job.base.clone(),
                fingerprint: job.fingerprint.clone(),
                at_plan: job.latencies.iter().map(|&x| x as f64).sum(),
                unsaved: false,
            };
            let joined = if self.in_flight {
                self.late.push(job);
                Ok(())
            } else {
                self.replanner
                    .add_job(JobId(id), job.graph, &job.latencies, job.settings)
            };
            match joined {
                Ok(()) => {
                    held += fresh.lower_bound;
                    self.admitted.insert(id, admitted);
                    self.fresh.push(fresh);
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
            self.metrics.set_jobs(state, n);
        }
        self.metrics.queue_length.set(self.queue.len() as i64);
    }

    /// Starts a joint plan of every admitted job on a blocking thread.
    async fn launch(&mut self) -> Option<Flight> {
        let ids: Vec<u64> = self.admitted.keys().copied().collect();
        if ids.is_empty() {
            let mut mem = self.shared.memory();
            mem.sum_of_peaks_bytes = 0;
            mem.aligned_peak_bytes = 0;
            mem.vanilla_sum_of_peaks_bytes = 0;
            mem.diagnostics.clear();
            return None;
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
        let slow = self.slow_joint_plans;
        let handle = tokio::task::spawn_blocking(move || {
            if let Some(d) = slow {
                std::thread::sleep(d);
            }
            let out = r.plan_due();
            (r, out)
        });
        self.in_flight = true;
        Some(Flight {
            handle,
            ids,
            started: Instant::now(),
        })
    }

    /// Takes a joint plan back: the re-planner it ran on, then the jobs
    /// admitted meanwhile; publishes the plans if they fit beside the fast
    /// plans published meanwhile. True when another joint plan is due.
    fn land(&mut self, f: Flight, joined: Result<Planned, tokio::task::JoinError>) -> bool {
        let elapsed = f.started.elapsed();
        self.metrics.planning_seconds.observe(elapsed.as_secs_f64());
        self.in_flight = false;
        let mut due = false;
        let mp = match joined {
            Ok((r, Ok(mp))) => {
                self.replanner = r;
                if mp.is_none() {
                    debug!(
                        jobs = f.ids.len(),
                        "the gated jobs keep their pace and the new plan would not shorten their period: the current plans stay"
                    );
                }
                mp
            }
            Ok((_, Err(e))) => {
                error!("planning failed: {e}");
                None
            }
            Err(e) => {
                error!("the planner panicked; the previous plans stay: {e}");
                None
            }
        };
        for job in std::mem::take(&mut self.late) {
            let id = job.id;
            if !self.admitted.contains_key(&id) {
                continue;
            }
            due = true;
            if let Err(e) =
                self.replanner
                    .add_job(JobId(id), job.graph, &job.latencies, job.settings)
            {
                warn!(job = id, "cannot plan: {e}");
                self.admitted.remove(&id);
                self.shared.remove(id, &format!("cannot plan: {e}"));
            }
        }
        let Some(mut mp) = mp else { return due };
        if mp.profile.capped {
            self.metrics.planning_capped.inc();
            warn!(
                jobs = f.ids.len(),
                cap_s = self.cap.as_secs_f64(),
                "planning stopped at its time cap; the plans hold the moves made until then"
            );
        }
        // The peaks of the jobs this plan does not cover but that run a
        // (fast) plan: this plan goes out only if it fits beside them.
        let beside: u64 = {
            let jobs = self.shared.jobs();
            self.admitted
                .keys()
                .filter(|id| !f.ids.contains(id))
                .filter_map(|id| jobs.get(id)?.prediction())
                .map(|p| p.planned_peak_bytes)
                .sum()
        };
        let gated = mp.cycle_ns > 0;
        let keep = if gated
            && beside > 0
            && mp.aligned_peak_bytes.saturating_add(beside) > self.budget
        {
            // Gated plans interleave only together: all or none go out.
            debug!(
                jobs = f.ids.len(),
                aligned = mp.aligned_peak_bytes,
                beside,
                "a gated joint plan does not fit beside the fast plans made meanwhile; re-planning"
            );
            due = true;
            vec![false; f.ids.len()]
        } else if !gated && beside > 0 && mp.sum_of_peaks_bytes.saturating_add(beside) > self.budget
        {
            debug!(
                jobs = f.ids.len(),
                sum_of_peaks = mp.sum_of_peaks_bytes,
                beside,
                "a joint plan does not fit beside the fast plans made meanwhile; publishing what fits, re-planning"
            );
            due = true;
            self.what_fits(&f.ids, &mp)
        } else {
            vec![true; f.ids.len()]
        };
        debug!(
            jobs = f.ids.len(),
            ms = elapsed.as_secs_f64() * 1e3,
            rounds = mp.rounds,
            profile = ?mp.profile,
            "planned"
        );
        if mp.profile.capped {
            for d in &mut mp.diagnostics {
                if d.kind == DiagnosticKind::PlanningCapped {
                    d.message = format!(
                        "planning stopped at its time cap of {:.2} s: {}",
                        self.cap.as_secs_f64(),
                        d.message
                    );
                }
            }
        }
        self.publish(&f.ids, mp, &keep);
        due
    }

    /// Which plans of a joint plan can go out beside the plans published
    /// meanwhile without raising the published peaks past the budget: every
    /// plan that lowers its job's peak, then, smallest rise first, those
    /// that still fit.
    fn what_fits(&self, ids: &[u64], mp: &MultiPlan) -> Vec<bool> {
        let jobs = self.shared.jobs();
        let now = |id: &u64| {
            jobs.get(id)
                .and_then(Job::prediction)
                .map_or(0, |p| p.planned_peak_bytes)
        };
        let mut total: u64 = self.admitted.keys().map(now).sum();
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
        let mut keep = vec![false; ids.len()];
        for (rise, k) in rises {
            let next = (i128::from(total) + rise).max(0) as u64;
            if rise <= 0 || next <= self.budget {
                keep[k] = true;
                total = next;
            }
        }
        keep
    }

    /// Fast first plans for the jobs admitted since the last call: each
    /// planned alone (its share of the link as in a joint plan, a short
    /// time cap) against the budget less what the other admitted jobs
    /// hold (their published plans' peaks, or their lower bounds while
    /// they have none), and published at once if it fits. A job that is
    /// alone, or whose plan does not fit, waits for the joint plan.
    async fn fast_plans(&mut self) {
        let fresh = std::mem::take(&mut self.fresh);
        if fresh.is_empty() || (self.admitted.len() <= 1 && !self.in_flight) {
            return;
        }
        for job in fresh {
            if !self.admitted.contains_key(&job.id) {
                continue;
            }
            let held: u64 = {
                let jobs = self.shared.jobs();
                self.admitted
                    .iter()
                    .filter(|(id, _)| **id != job.id)
                    .map(|(id, a)| {
                        jobs.get(id)
                            .and_then(Job::prediction)
                            .map_or(a.lower_bound, |p| p.planned_peak_bytes)
                    })
                    .sum()
            };
            let room = self.budget.saturating_sub(held);
            if room < job.lower_bound {
                continue;
            }
            let mut config = *self.replanner.config();
            config.budget_bytes = Some(room);
            config.time_cap = Some(self.cap.min(FAST_CAP));
            if config.copy.shared_by_jobs {
                let n = self.admitted.len() as f64;
                config.copy.h2d_bytes_per_s /= n;
                config.copy.d2h_bytes_per_s /= n;
            }
            let started = Instant::now();
            let planned = tokio::task::spawn_blocking(move || {
                let input = JobInput::new(&job.graph, job.latencies.clone(), job.settings);
                tensile_planner::plan(&[input], &config)
            })
            .await;
            let mut mp = match planned {
                Ok(Ok(mp)) => mp,
                Ok(Err(e)) => {
                    warn!(job = job.id, "fast plan failed: {e}");
                    continue;
                }
                Err(e) => {
                    error!(job = job.id, "fast plan panicked: {e}");
                    continue;
                }
            };
            if mp.sum_of_peaks_bytes > room || mp.plans.is_empty() {
                debug!(
                    job = job.id,
                    peak = mp.sum_of_peaks_bytes,
                    room,
                    "the fast plan does not fit; the job waits for the joint plan"
                );
                continue;
            }
            debug!(
                job = job.id,
                ms = started.elapsed().as_secs_f64() * 1e3,
                "fast first plan"
            );
            mp.diagnostics.push(Diagnostic {
                job: 0,
                kind: DiagnosticKind::PlanningCapped,
                tensor: None,
                message: "a fast first plan, made for this job alone in the memory the others leave; the joint plan follows".into(),
            });
            self.publish_one(job.id, mp.plans.remove(0), mp.diagnostics);
            self.count_states();
            // Status shows what runs: the others' plans and this one.
            self.show_sum_of_peaks(held.saturating_add(mp.sum_of_peaks_bytes));
        }
    }

    /// The sum of the planned peaks of what runs now, for status and the
    /// metrics.
    fn show_sum_of_peaks(&self, sum: u64) {
        self.shared.memory().sum_of_peaks_bytes = sum;
        self.metrics
            .sum_of_peaks_bytes
            .set(i64::try_from(sum).unwrap_or(i64::MAX));
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

    fn publish(&mut self, ids: &[u64], mut mp: MultiPlan, keep: &[bool]) {
        if keep.iter().all(|k| !k) {
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
        for (k, (&id, plan)) in ids.iter().zip(mp.plans).enumerate() {
            if !keep[k] {
                continue;
            }
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
        // What runs now: this plan's jobs and any fast plans beside them.
        let sum_of_peaks: u64 = {
            let jobs = self.shared.jobs();
            self.admitted
                .keys()
                .filter_map(|id| jobs.get(id)?.prediction())
                .map(|p| p.planned_peak_bytes)
                .sum()
        };
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

#[cfg(test)]
#[path = "planning_tests.rs"]
mod tests;
