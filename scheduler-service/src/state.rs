//! The job table shared by the RPC handlers, the planning task and the
//! lease reaper: per job its graph, token hash, state, lease and the newest
//! plan in a `tokio::sync::watch` (a slow subscriber blocks nobody and
//! always sees the newest).
//!
//! A `DashMap`: a job's entry is locked with its shard alone, so one job's
//! report, heartbeat, token check or subscription does not wait for
//! another's, nor for a status read or the planning task walking the table.
//! The table is reached only through the closures of [`Shared`]'s methods:
//! no shard guard leaves this module, so none is ever held across an
//! `.await`, and a closure must not touch the table again (a shard's lock is
//! not reentrant).
//!
//! Nothing needs all jobs at one instant from this table. Admission, the
//! budget ledger (what each admitted job holds) and the plans in force are
//! the planning task's own state (planning.rs), and it is the only task
//! that publishes plans, so its reads of the jobs' plans are consistent
//! with its own writes. Walks of the whole table (status, the lease
//! reaper's scan, the state counts) go shard by shard: each job as it is
//! then, as one status reply always was (plans go out job by job).
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dashmap::DashMap;

use tensile_graph::Graph;
use tensile_planner::{Diagnostic, Plan, Prediction};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::base::BaseSource;
use crate::error::Error;
use crate::metrics::TableWaits;
use crate::token::TokenHash;

/// A job's state, as the contract's `JobState`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for memory; why.
    Queued(String),
    /// Admitted; its first plan is being made.
    Planning,
    Active,
    /// Gone; why (unregistered, lease lapsed, shutdown).
    Done(String),
}

/// What a job's subscribers see: its state and newest plan.
#[derive(Debug, Clone)]
pub struct Update {
    pub state: JobState,
    /// The newest plan (its version is the job's plan version).
    pub plan: Option<Arc<Plan>>,
    pub diagnostics: Arc<Vec<Diagnostic>>,
}

/// One registered job.
#[derive(Debug)]
pub struct Job {
    pub name: String,
    pub graph: Arc<Graph>,
    pub fingerprint: String,
    pub token: TokenHash,
    pub priority: i32,
    /// The smallest footprint of any plan of the job (its largest working
    /// set plus its base): what admission counts.
    pub lower_bound: u64,
    /// The base the job is planned with, and where it came from.
    pub base_bytes: u64,
    pub base_source: BaseSource,
    /// The process it registered in ("": none), and the job of that
    /// process whose plans count the process's base (0: none admitted).
    pub process: String,
    pub base_job: u64,
    pub latency_source: &'static str,
    pub lease_until: Instant,
    /// Open plan streams (for status and logs: an open stream does not
    /// hold the lease; reports, heartbeats and subscribing renew it).
    pub subscribers: usize,
    pub updates: watch::Sender<Update>,
    pub iterations: u64,
    pub reported_peak: u64,
    /// The base of the last report that measured one (0: none yet).
    pub reported_base: u64,
    /// The plan version of the job's last report: a report on another is
    /// the first iteration on a new plan.
    pub reported_version: Option<u64>,
    pub span: tracing::Span,
}

impl Job {
    pub fn state(&self) -> JobState {
        self.updates.borrow().state.clone()
    }

    pub fn version(&self) -> u64 {
        self.updates.borrow().plan.as_ref().map_or(0, |p| p.version)
    }

    pub fn prediction(&self) -> Option<Prediction> {
        self.updates
            .borrow()
            .plan
            .as_ref()
            .map(|p| p.prediction.clone())
    }
}

/// The memory picture of the newest plan.
#[derive(Debug, Clone, Default)]
pub struct Memory {
    pub budget_bytes: u64,
    pub sum_of_peaks_bytes: u64,
    pub aligned_peak_bytes: u64,
    pub vanilla_sum_of_peaks_bytes: u64,
    /// What the plans in force hold (the planning task's ledger).
    pub published_bytes: u64,
    /// How the newest joint plan shares the device (`free`, `gated`,
    /// `turns`), and why it took that layout.
    pub layout: &'static str,
    pub layout_note: String,
    /// Diagnostics with the service's job ids.
    pub diagnostics: Vec<(u64, Diagnostic)>,
}

#[derive(Debug)]
pub struct Shared {
    jobs: DashMap<u64, Job>,
    memory: Mutex<Memory>,
    /// Job ids, shared by the GPUs of one scheduler so that an id names
    /// one job on the node.
    next_id: Arc<AtomicU64>,
    /// How long each access waited for the table.
    waits: TableWaits,
}

impl Shared {
    pub fn new(budget_bytes: u64) -> Shared {
        Shared::sharing_ids(budget_bytes, Arc::new(AtomicU64::new(1)))
    }

    /// A table whose jobs take their ids from `ids` (which starts at 1).
    pub fn sharing_ids(budget_bytes: u64, ids: Arc<AtomicU64>) -> Shared {
        Shared {
            jobs: DashMap::new(),
            memory: Mutex::new(Memory {
                budget_bytes,
                ..Memory::default()
            }),
            next_id: ids,
            waits: TableWaits::default(),
        }
    }

    /// This table, observing its waits in `waits` (the metrics').
    pub fn timing_waits(mut self, waits: TableWaits) -> Shared {
        self.waits = waits;
        self
    }

    /// Job `id`'s entry, locked (its shard: other shards' jobs go on),
    /// for `f`; the wait is observed.
    fn entry<T>(&self, id: u64, f: impl FnOnce(&mut Job) -> T) -> Option<T> {
        let t = std::time::Instant::now();
        let mut job = self.jobs.get_mut(&id);
        self.waits.job.observe(t.elapsed().as_secs_f64());
        job.as_deref_mut().map(f)
    }

    /// `f` on job `id` (`None`: no such job).
    pub fn job<T>(&self, id: u64, f: impl FnOnce(&Job) -> T) -> Option<T> {
        self.entry(id, |j| f(j))
    }

    /// `f` on job `id`, mutably (`None`: no such job).
    pub fn job_mut<T>(&self, id: u64, f: impl FnOnce(&mut Job) -> T) -> Option<T> {
        self.entry(id, f)
    }

    pub fn contains(&self, id: u64) -> bool {
        self.job(id, |_| ()).is_some()
    }

    pub fn insert(&self, id: u64, job: Job) {
        let t = std::time::Instant::now();
        // Ids are never reused: nothing is replaced.
        let old = self.jobs.insert(id, job);
        self.waits.job.observe(t.elapsed().as_secs_f64());
        drop(old);
    }

    /// `f` on every job, shard by shard (each job as it is when its shard
    /// is read), keeping what it returns; in no particular order. The
    /// time spent stepping the walk (waits for the shards' locks, and the
    /// steps themselves) counts as one wait.
    pub fn each<T>(&self, mut f: impl FnMut(u64, &Job) -> Option<T>) -> Vec<T> {
        let mut out = Vec::new();
        let mut waited = Duration::ZERO;
        let mut it = self.jobs.iter();
        loop {
            let t = std::time::Instant::now();
            let next = it.next();
            waited += t.elapsed();
            let Some(r) = next else { break };
            if let Some(x) = f(*r.key(), r.value()) {
                out.push(x);
            }
        }
        self.waits.walk.observe(waited.as_secs_f64());
        out
    }

    /// The jobs whose lease lapsed by `now`.
    pub fn lapsed(&self, now: Instant) -> Vec<u64> {
        // An open plan stream does not hold the lease: a hung worker keeps
        // its connection (its kernel answers TCP, and a runtime thread may
        // still answer HTTP/2 pings) but sends no heartbeats or reports
        // (the lease is what sees a hung worker).
        self.each(|id, j| (j.lease_until <= now).then_some(id))
    }

    pub fn memory(&self) -> MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Runs `f` on job `id` after checking `token`.
    pub fn with_job<T>(
        &self,
        id: u64,
        token: &str,
        f: impl FnOnce(&mut Job) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.entry(id, |job| {
            check_token(id, job, token)?;
            f(job)
        })
        .ok_or(Error::UnknownJob(id))?
    }

    /// Removes job `id`, telling its subscribers why; its watch closes
    /// when the entry drops, which ends their streams.
    pub fn remove(&self, id: u64, why: &str) -> Option<Job> {
        self.remove_if(id, |_| true, why)
    }

    /// [`Shared::remove`] if `still(job)` holds when its entry is locked
    /// (a lease renewed since the reaper's scan keeps the job).
    pub fn remove_if(&self, id: u64, still: impl FnOnce(&Job) -> bool, why: &str) -> Option<Job> {
        let t = std::time::Instant::now();
        let removed = self.jobs.remove_if(&id, |_, j| still(j));
        self.waits.job.observe(t.elapsed().as_secs_f64());
        let (_, job) = removed?;
        job.updates
            .send_modify(|u| u.state = JobState::Done(why.to_string()));
        Some(job)
    }
}

pub fn check_token(id: u64, job: &Job, token: &str) -> Result<(), Error> {
    if token.is_empty() {
        return Err(Error::MissingToken(id));
    }
    if !job.token.matches(token) {
        return Err(Error::WrongToken(id));
    }
    Ok(())
}
