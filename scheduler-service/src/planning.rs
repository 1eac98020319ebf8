//! The planning task: the one owner of the re-planner and of admission
//! (TGI's block-allocator pattern). Handlers send it [`Command`]s. A joint
//! plan of all admitted jobs runs on a blocking thread, bounded by the
//! planner's own work bound (`plan_max_moves`, moves tried; the wall-clock
//! `plan_cap` only as a logged safety net); while it runs the task keeps
//! taking commands: registrations are admitted at once and a newly
//! admitted job gets a fast first plan (planned alone, against the memory
//! the others' published plans leave), published at once; reports,
//! departures and budget changes wait and are coalesced into the next
//! joint plan, which supersedes the fast plans.
//!
//! The plans in force (published to their jobs) never add up past the
//! budget. The task keeps them in a ledger (`in_force`: each job's
//! published peak; a gated set by its aligned peak), checked at every
//! publication and shown as `published_bytes` and
//! `max_published_over_budget_bytes`. A fast plan goes out only if it fits
//! beside the plans in force. A gated joint plan goes out whole or not at
//! all. Of a joint plan without gates, smallest rise first, the plans go
//! out that keep the ledger within the budget after each (a plan that
//! lowers its job's peak but takes it off a gated set may not: the set's
//! other jobs keep their gates and may hold as much without it); the
//! others are withheld (`plans_withheld`): their jobs keep the plans in
//! force. When the joint plan left out jobs on fast plans, the next one,
//! of every job, follows at once; when it had every job and still does not
//! fit (capped, or nothing more to swap), a job left with no plan at all
//! goes back to the queue, needing the peak the planner reached for it.
//! Admission holds for each admitted job its lower bound or, once a joint
//! plan over the budget shows the planner gets it no lower, that peak.
//! (A budget set below the plans in force leaves them over it until the
//! re-plan it causes goes out; the ledger counts that excess too.)
//! Each job's newest plan goes out through its watch channel.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensile_graph::Graph;
use tensile_planner::{
    Diagnostic, DiagnosticKind, Gate, JobId, JobInput, JobSettings, Measurements, MultiPlan,
    PlannerConfig, ReplanError, ReplanReason, Replanner,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::base::{Base, BaseSource};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::node::Manifest;
use crate::state::{Job, JobState, Shared};
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
#[derive(Debug, Clone)]
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
    /// The process it runs in (`RegisterJobRequest.process`), whose base
    /// the process's jobs count once ([`process`]); `None`: its own.
    pub process: Option<String>,
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
    /// What admission holds for it: its lower bound, or, if more, the peak
    /// the planner reached for it in a joint plan over the budget (its
    /// share of the aligned peak for gated plans), until a joint plan under
    /// the budget plans it lower.
    need: u64,
    /// What it was admitted as (its latencies and base as then), to queue
    /// it again if its first plan does not fit.
    job: NewJob,
    /// Its place in the queue.
    seq: u64,
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

/// How long a fast first plan may search, at most (a safety net: its
/// work bound is [`crate::config::FAST_SHARE`] of the joint plan's).
const FAST_CAP: Duration = Duration::from_millis(250);

/// The task's state.
#[derive(Debug)]
pub struct Planner {
    shared: Arc<Shared>,
    replanner: Replanner,
    queue: Vec<(u64, NewJob)>,
    admitted: BTreeMap<u64, Admitted>,
    /// The budget (`u64::MAX`: none); written by [`Planner::set_budget`]
    /// alone.
    budget: u64,
    /// On a node: this GPU's index and the gpus.json its budget is kept in.
    manifest: Option<(u32, Arc<Manifest>)>,
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
    /// The plans in force: the planned peak of each job's published plan.
    in_force: BTreeMap<u64, u64>,
    /// The jobs whose gated plans went out together and still run them,
    /// with the set's aligned peak: they hold that much at most, not the
    /// sum of their peaks. One leaving, or given a plan without that gate,
    /// leaves the set; the others keep their gates and hold the set's
    /// aligned peak or their own peaks added up, whichever is less
    /// ([`Planner::gated_holds`]).
    gated_in_force: Option<(Vec<u64>, u64)>,
    /// Queued jobs whose plan did not fit: the peak the planner reached for
    /// them, which admission waits to have room for.
    reached: BTreeMap<u64, u64>,
    /// The largest excess of the plans in force over the budget after any
    /// publication.
    max_over: u64,
    /// The processes of jobs registered with a process key, whose base
    /// one admitted job of each counts ([`process`]).
    processes: process::Processes,
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
        let budget = config.budget_bytes;
        let mut planner = Planner {
            shared,
            replanner,
            queue: Vec::new(),
            admitted: BTreeMap::new(),
            budget: u64::MAX,
            manifest: None,
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
            in_force: BTreeMap::new(),
            gated_in_force: None,
            reached: BTreeMap::new(),
            max_over: 0,
            processes: process::Processes::default(),
        };
        planner.set_budget(budget);
        planner
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
                self.join_process(&job);
                self.seq += 1;
                self.queue.push((self.seq, job));
                !self.admit().is_empty()
            }
            Command::Remove(id) => {
                self.out_of_force(id);
                self.reached.remove(&id);
                if self.admitted.contains_key(&id) {
                    self.save_blocking(id);
                    self.admitted.remove(&id);
                    let _ = self.replanner.remove_job(JobId(id));
                    self.leave_process(id, true);
                    self.metrics.reason("departure");
                    self.admit();
                    self.note_in_force();
                    true
                } else {
                    self.queue.retain(|(_, j)| j.id != id);
                    self.forget_queued(id);
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
                self.set_budget(Some(bytes));
                // A budget set, even the one in force, re-plans from
                // scratch (a changed configuration: the re-planner starts
                // over).
                self.replanner.set_config(*self.replanner.config());
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
        let version = self.shared.job(id, Job::version).unwrap_or(0);
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
        // A job of a process with a key: the process's base, planned with
        // the job that carries it.
        let (id, base) = if self.in_process(id) {
            match self.observe_process_base(id, measured) {
                Some((carrier, bytes)) => (carrier, Base::new(bytes, BaseSource::Measured)),
                None => return false,
            }
        } else {
            let Some(adm) = self.admitted.get(&id) else {
                return false;
            };
            let mut base = adm.base.clone();
            match base.observe(measured) {
                Some(_) => (id, base),
                None => {
                    // The falls seen so far are kept.
                    if let Some(adm) = self.admitted.get_mut(&id) {
                        adm.base = base;
                    }
                    return false;
                }
            }
        };
        let was = self.admitted.get(&id).map_or(0, |a| a.base.bytes());
        let bytes = base.bytes();
        if !self.plan_base(id, base) {
            return false;
        }
        info!(
            job = id,
            was,
            base_bytes = bytes,
            "the job's measured base replaces the one it was planned with; re-planning"
        );
        self.metrics.reason("base");
        self.admit();
        let held = self.reserved();
        if held > self.budget {
            warn!(
                held,
                budget = self.budget,
                "with the measured bases the admitted jobs' lower bounds exceed the budget; the plans will say OVER_BUDGET"
            );
        }
        true
    }

    /// What admission holds for the admitted jobs: what the planner
    /// reaches for each (not only its lower bound), so that a job is
    /// admitted only when a joint plan can make room for it; the plans in
    /// force may hold more (planned with room to spare) until the joint
    /// plan with it lowers them.
    fn reserved(&self) -> u64 {
        self.admitted
            .values()
            .map(|a| a.need.max(a.lower_bound))
            .fold(0, u64::saturating_add)
    }

    /// What the admitted jobs but `except` hold now: the plans in force (a
    /// gated set by its aligned peak) and, for each job without one, its
    /// need; each at least its lower bound (a measured base may have raised
    /// it past its plan's peak). A fast plan gets the rest.
    fn held(&self, except: Option<u64>) -> u64 {
        let gated = self.gated_in_force.as_ref();
        let mut held = self.gated_holds();
        for (&id, a) in &self.admitted {
            if Some(id) == except || gated.is_some_and(|(ids, _)| ids.contains(&id)) {
                continue;
            }
            let holds = self.in_force.get(&id).copied().unwrap_or(a.need);
            held = held.saturating_add(holds.max(a.lower_bound));
        }
        held
    }

    /// What a queued job waits to have room for.
    fn need(&self, job: &NewJob) -> u64 {
        self.reached
            .get(&job.id)
            .copied()
            .unwrap_or(0)
            .max(job.lower_bound)
    }

    /// Admits queued jobs in order (priority, then arrival) while the head
    /// fits beside what the admitted jobs hold ([`Planner::held`]); says
    /// why the others wait. Returns the jobs whose state changed.
    fn admit(&mut self) -> Vec<u64> {
        self.queue
            .sort_by_key(|(seq, j)| (Reverse(j.priority), *seq));
        let mut changed = Vec::new();
        let mut held = self.reserved();
        // Each queued job counted with its process's base or none
        // ([`Planner::carry`]).
        for (_, job) in &mut self.queue {
            Planner::carry(&self.processes, &self.shared, job);
        }
        while let Some((_, head)) = self.queue.first_mut() {
            // Again: the job admitted before it may carry its process's
            // base now.
            Planner::carry(&self.processes, &self.shared, head);
            let Some((_, head)) = self.queue.first() else {
                break;
            };
            let need = self.need(head);
            if held.saturating_add(need) > self.budget {
                break;
            }
            let (seq, job) = self.queue.remove(0);
            let id = job.id;
            self.reached.remove(&id);
            let fresh = Fresh {
                id,
                graph: job.graph.clone(),
                latencies: job.latencies.clone(),
                settings: job.settings,
                lower_bound: job.lower_bound,
            };
            let admitted = Admitted {
                lower_bound: job.lower_bound,
                need,
                job: job.clone(),
                seq,
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
                    held = held.saturating_add(need);
                    self.admitted.insert(id, admitted);
                    self.admitted_in_process(id);
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
        // As the jobs admitted meanwhile left them.
        for (_, job) in &mut self.queue {
            Planner::carry(&self.processes, &self.shared, job);
        }
        let queue: Vec<(u64, u64, Option<u64>)> = self
            .queue
            .iter()
            .map(|(_, j)| (j.id, j.lower_bound, self.reached.get(&j.id).copied()))
            .collect();
        for (ahead, (id, lb, reached)) in queue.into_iter().enumerate() {
            // In MB (10^6 bytes), the unit of --budget-mb and of
            // `tensilectl status`.
            let mb = tensile_cli::format_mb;
            let need = reached.unwrap_or(0).max(lb);
            let what = match reached {
                Some(r) if r > lb => format!(
                    "needs {} (the peak the planner reached for it; its largest working set plus base is {})",
                    mb(r),
                    mb(lb)
                ),
                _ => format!(
                    "needs at least {} (its largest working set plus base)",
                    mb(lb)
                ),
            };
            let mut reason = format!(
                "{what}; {} of the {} budget are free beside {} admitted jobs: {} short",
                mb(free),
                mb(self.budget),
                self.admitted.len(),
                mb(need.saturating_sub(free))
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
        self.shared
            .job(id, |job| {
                let mut kind_changed = false;
                job.updates.send_if_modified(|u| {
                    if u.state == state {
                        return false;
                    }
                    kind_changed =
                        std::mem::discriminant(&u.state) != std::mem::discriminant(&state);
                    u.state = state;
                    true
                });
                kind_changed
            })
            .unwrap_or(false)
    }

    fn count_states(&self) {
        let mut counts: BTreeMap<&str, i64> =
            [("queued", 0), ("planning", 0), ("active", 0)].into();
        let states = self.shared.each(|_, j| match j.state() {
            JobState::Queued(_) => Some("queued"),
            JobState::Planning => Some("planning"),
            JobState::Active => Some("active"),
            JobState::Done(_) => None,
        });
        for k in states {
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
        let Some(mp) = mp else { return due };
        if mp.profile.capped {
            self.metrics.planning_capped.inc();
            if mp.profile.time_capped {
                warn!(
                    jobs = f.ids.len(),
                    cap_s = self.cap.as_secs_f64(),
                    moves = mp.profile.moves_tried,
                    max_moves = ?self.replanner.config().max_moves,
                    "planning stopped at its wall-clock safety net before its work bound: this plan depends on how busy the machine was; the plans hold the moves made until then"
                );
            } else {
                info!(
                    jobs = f.ids.len(),
                    moves = mp.profile.moves_tried,
                    "planning stopped at its work bound; the plans hold the moves made until then"
                );
            }
        }
        // Published plans never add up past the budget: a gated plan goes
        // out whole if it fits beside the plans in force of the jobs it
        // does not cover (fast plans made meanwhile), else not at all; of
        // a plan without gates, those that keep the ledger within the
        // budget after each, smallest rise first ([`Planner::what_fits`]). When
        // jobs ran fast plans beside it, the next joint plan, of every job,
        // follows at once; when it covered every job and does not fit by
        // itself (capped, or nothing more to swap), the jobs keep the plans
        // in force, and those that have none wait in the queue for the
        // peak the planner reached for them.
        let covers_all = self.admitted.keys().all(|id| f.ids.contains(id));
        let gated = mp.cycle_ns > 0;
        let order: Vec<usize> = if gated {
            let beside: u64 = self
                .admitted
                .keys()
                .filter(|id| !f.ids.contains(id))
                .map(|id| self.in_force.get(id).copied().unwrap_or(0))
                .sum();
            if mp.aligned_peak_bytes.saturating_add(beside) > self.budget {
                debug!(
                    jobs = f.ids.len(),
                    aligned = mp.aligned_peak_bytes,
                    beside,
                    budget = self.budget,
                    "a gated joint plan does not fit beside the plans in force; none of it goes out"
                );
                Vec::new()
            } else {
                (0..f.ids.len()).collect()
            }
        } else {
            self.what_fits(&f.ids, &mp)
        };
        if order.len() < f.ids.len() {
            self.metrics
                .plans_withheld
                .inc_by((f.ids.len() - order.len()) as u64);
            if covers_all {
                warn!(
                    jobs = f.ids.len(),
                    withheld = f.ids.len() - order.len(),
                    sum_of_peaks = mp.sum_of_peaks_bytes,
                    aligned = mp.aligned_peak_bytes,
                    budget = self.budget,
                    capped = mp.profile.capped,
                    "a joint plan of every job does not fit the budget; the plans that would go past it are withheld"
                );
            } else {
                debug!(
                    jobs = f.ids.len(),
                    withheld = f.ids.len() - order.len(),
                    "a joint plan does not fit beside the fast plans made meanwhile; publishing what fits, re-planning"
                );
                due = true;
            }
        }
        // What admission holds for each job: a joint plan over the budget
        // says how low the planner got each job (its share of the aligned
        // peak for gated plans), which admission holds from now on; one
        // under the budget says each can be planned at its peak at least.
        let over = if gated {
            mp.aligned_peak_bytes > self.budget
        } else {
            mp.sum_of_peaks_bytes > self.budget
        };
        let share = if gated && mp.sum_of_peaks_bytes > 0 {
            (mp.aligned_peak_bytes as f64 / mp.sum_of_peaks_bytes as f64).min(1.0)
        } else {
            1.0
        };
        for (id, p) in f.ids.iter().zip(&mp.plans) {
            if let Some(a) = self.admitted.get_mut(id) {
                let reached = (p.prediction.planned_peak_bytes as f64 * share) as u64;
                let need = if over { reached } else { a.need.min(reached) };
                a.need = need.max(a.lower_bound);
            }
        }
        // Jobs of this plan left with no plan in force, when no joint plan
        // follows: back to the queue, needing what the planner reached.
        let requeue: Vec<(u64, u64)> = if covers_all {
            f.ids
                .iter()
                .zip(&mp.plans)
                .enumerate()
                .filter(|(k, (id, _))| {
                    !order.contains(k)
                        && !self.in_force.contains_key(id)
                        && self.admitted.contains_key(id)
                })
                .map(|(_, (&id, p))| (id, p.prediction.planned_peak_bytes))
                .collect()
        } else {
            Vec::new()
        };
        debug!(
            jobs = f.ids.len(),
            ms = elapsed.as_secs_f64() * 1e3,
            rounds = mp.rounds,
            profile = ?mp.profile,
            "planned"
        );
        self.publish(&f.ids, mp, &order);
        for (id, reached) in requeue {
            self.requeue(id, reached);
        }
        // What the admitted jobs need may have fallen: queued jobs may fit
        // (and need a joint plan).
        due |= !self.admit().is_empty();
        due
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
            let held = self.held(Some(job.id));
            let room = self.budget.saturating_sub(held);
            if room < job.lower_bound {
                continue;
            }
            let mut config = *self.replanner.config();
            config.budget_bytes = Some(room);
            config.time_cap = Some(self.cap.min(FAST_CAP));
            config.max_moves = config
                .max_moves
                .map(|m| ((m as f64 * crate::config::FAST_SHARE) as u64).max(1));
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
            self.publish_one(job.id, mp.plans.remove(0), mp.diagnostics, false);
            self.note_in_force();
            self.count_states();
            // Status shows what runs: the others' plans and this one.
            self.show_sum_of_peaks(held.saturating_add(mp.sum_of_peaks_bytes));
        }
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

#[path = "planning_publish.rs"]
mod publish;

#[path = "planning_process.rs"]
mod process;

#[cfg(test)]
#[path = "planning_tests.rs"]
mod tests;
