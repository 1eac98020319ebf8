//! The job table shared by the RPC handlers, the planning task and the
//! lease reaper: per job its graph, token hash, state, lease and the newest
//! plan in a `tokio::sync::watch` (a slow subscriber blocks nobody and
//! always sees the newest). A std `Mutex`: every critical section is short
//! and none spans an `.await` (mini-redis `db.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tensile_graph::Graph;
use tensile_planner::{Diagnostic, Plan, Prediction};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::base::BaseSource;
use crate::error::Error;
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
    /// How the newest joint plan shares the device (`free`, `gated`,
    /// `turns`), and why it took that layout.
    pub layout: &'static str,
    pub layout_note: String,
    /// Diagnostics with the service's job ids.
    pub diagnostics: Vec<(u64, Diagnostic)>,
}

#[derive(Debug)]
pub struct Shared {
    jobs: Mutex<HashMap<u64, Job>>,
    memory: Mutex<Memory>,
    /// Job ids, shared by the GPUs of one scheduler so that an id names
    /// one job on the node.
    next_id: Arc<AtomicU64>,
}

impl Shared {
    pub fn new(budget_bytes: u64) -> Shared {
        Shared::sharing_ids(budget_bytes, Arc::new(AtomicU64::new(1)))
    }

    /// A table whose jobs take their ids from `ids` (which starts at 1).
    pub fn sharing_ids(budget_bytes: u64, ids: Arc<AtomicU64>) -> Shared {
        Shared {
            jobs: Mutex::new(HashMap::new()),
            memory: Mutex::new(Memory {
                budget_bytes,
                ..Memory::default()
            }),
            next_id: ids,
        }
    }

    /// The job table. A panic while holding it cannot leave a half-made
    /// entry (inserts and removals are single calls), so a poisoned lock
    /// is taken over rather than spreading the panic.
    pub fn jobs(&self) -> MutexGuard<'_, HashMap<u64, Job>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
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
        let mut jobs = self.jobs();
        let job = jobs.get_mut(&id).ok_or(Error::UnknownJob(id))?;
        check_token(id, job, token)?;
        f(job)
    }

    /// Removes job `id`, telling its subscribers why; its watch closes
    /// when the entry drops, which ends their streams.
    pub fn remove(&self, id: u64, why: &str) -> Option<Job> {
        let job = self.jobs().remove(&id)?;
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
