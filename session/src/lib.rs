//! A job's side of the scheduler: register the job, keep its plan stream
//! open, report every iteration, renew the lease, and survive the
//! scheduler going away. The one implementation of the session protocol:
//! the worker (`tensile-worker`) and the Python hook (`tensile._core.Session`
//! under `tensile.hook.session`) both run it, and
//! `tests/python/test_session_conformance.py` checks it through both.
//!
//! The training loop is synchronous and never waits on the network: a
//! background thread runs a small tokio runtime that owns the connection.
//! The loop hands each iteration's [`Report`] to it over a channel and, at
//! the iteration boundary, takes the newest plan if one arrived
//! ([`Session::iteration_done`]). When the scheduler vanishes the loop goes
//! on with the plan it has while the background thread reconnects with
//! backoff and registers the job again (plan versions start over, and a
//! restarted scheduler numbers its jobs from 1 again, so a plan is
//! identified by the session's registration count and its version).
//!
//! What a failed call means: a registration refused as INVALID_ARGUMENT,
//! RESOURCE_EXHAUSTED or UNIMPLEMENTED will be refused again, so the
//! session gives up and the loop trains on without the scheduler;
//! NOT_FOUND or PERMISSION_DENIED means the scheduler no longer has the
//! job, which registers again; a report refused as FAILED_PRECONDITION (not
//! taken, the job being queued) or INVALID_ARGUMENT is skipped; anything
//! else loses the registration, which leaves the scheduler (best effort)
//! before it registers again, so that no queued ghost waits for its lease
//! to lapse. The backoff starts over after every registration that
//! succeeded. A plan pushed is checked against the graph (ids, names, the
//! plan file's rules; no recomputation for a job registered with it off)
//! and refused, never applied, when it fails.
//!
//! What the user should know goes to the [`LogSink`] the driver gives: one
//! warning per outage (the first reason; the retries' at debug level), one
//! when the job is registered again, one when it is queued, one per plan
//! refused.
//!
//! # Layout
//! - `lib.rs`: [`Session`], the loop's handle, and the values it trades
//!   ([`SessionConfig`], [`Report`], [`PushedPlan`], [`Status`]).
//! - `connection`: the background task: registrations, the plan stream,
//!   reports and heartbeats, reconnection.
//! - `failure`: what a failed call means ([`code_name`] names its code).
//! - `log`: [`LogSink`] and [`Level`].

mod connection;
mod failure;
mod log;

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tensile_graph::Graph;
use tensile_planner::{Diagnostic, Plan};
use tensile_proto::pb;
use tokio::sync::mpsc;

pub use failure::code_name;
pub use log::{Level, LogSink};

/// How the job meets its scheduler.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// `unix:PATH`, an absolute path, `HOST:PORT`, or `None` for the
    /// scheduler clients find by default (`TENSILE_SERVER`, else the
    /// socket of this job's GPU in gpus.json, else the default socket;
    /// looked up again at every connection).
    pub server: Option<String>,
    /// The job's CUDA ordinal (0 on the CPU), which picks its GPU's socket
    /// in gpus.json (through `CUDA_VISIBLE_DEVICES`).
    pub device_ordinal: u32,
    /// The job's name in the scheduler's status.
    pub name: String,
    pub priority: i32,
    /// Whether the scheduler may plan recomputations (`None`: its
    /// default). A job registered with `Some(false)` also refuses a plan
    /// that recomputes.
    pub allow_recompute: Option<bool>,
    /// Device bytes the process holds outside the job's storages (CUDA
    /// context, handles, allocator slack); `None`: the scheduler's device
    /// profile says. A base the reports measure ([`Report::base_bytes`])
    /// replaces it at the scheduler when the two differ materially.
    pub base_bytes: Option<u64>,
    /// The process the job runs in, a key the process's jobs share and no
    /// other process uses (`RegisterJobRequest.process`): the scheduler
    /// counts the process's base once for all its jobs. With one, `base_bytes`
    /// and the reports' [`Report::base_bytes`] are the whole process's.
    /// `None`: a process of its own.
    pub process: Option<String>,
    /// Longest pause between reconnection attempts.
    pub max_backoff: Duration,
    /// Longest wait for the answer to one unary call (`None`: no limit;
    /// the connection's keepalive still finds a dead peer).
    pub call_timeout: Option<Duration>,
    /// TLS for a TCP scheduler (`tensile_proto::tls`: a CA makes
    /// `HOST:PORT` TLS; `https://` needs one); drivers load it from their
    /// flags or from `TENSILE_TLS_CA`, `TENSILE_TLS_CERT`,
    /// `TENSILE_TLS_KEY`.
    pub tls: Option<tensile_proto::tls::ClientTls>,
    /// Where the session's messages go.
    pub log: LogSink,
}

/// One iteration as the scheduler hears it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub iteration: u64,
    /// Measured latency of every op of the graph, seconds, by op id. A
    /// report without one per op is not sent.
    pub op_latency_s: Vec<f64>,
    /// Time the iteration waited for copies.
    pub stall_s: f64,
    /// The storages (root tensor ids) whose prefetches came late.
    pub late_prefetches: Vec<u32>,
    pub passive_swaps: u32,
    /// The most device bytes the job's storages held at once.
    pub peak_bytes: u64,
    /// Device bytes the job's process holds outside the job's storages,
    /// as measured in the process (the CUDA context, the libraries'
    /// workspaces, the allocator's slack): the whole process's when the
    /// job registered with [`SessionConfig::process`], else the job's
    /// share; 0: not measured. The scheduler plans
    /// the job with it in place of the base it registered with when the
    /// two differ materially.
    pub base_bytes: u64,
}

/// A plan the scheduler pushed, checked against the graph.
#[derive(Debug, Clone)]
pub struct PushedPlan {
    pub job_id: u64,
    /// Which registration of this session pushed it (1, 2, ...).
    pub registration: u64,
    pub version: u64,
    pub plan: Plan,
    /// The planner's diagnostics that came with it (those of a kind this
    /// side knows).
    pub diagnostics: Vec<Diagnostic>,
}

impl PushedPlan {
    /// What identifies the plan across registrations: (registration,
    /// version). A restarted scheduler hands out job ids from 1 again, so
    /// (job id, version) alone could name two different plans.
    pub fn key(&self) -> (u64, u64) {
        (self.registration, self.version)
    }
}

/// A registration the scheduler accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    pub job_id: u64,
    /// The secret every later call of the job carries.
    pub token: String,
    /// The job's state when it was registered, and why (when queued).
    pub state: i32,
    pub reason: String,
    /// The lease the scheduler gave, seconds.
    pub lease_s: f64,
}

/// Where the session stands, for tools, tests and the Python binding.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Status {
    /// The current registration, if any.
    pub registration: Option<Registration>,
    /// The job's state as last heard (a `tensile.v1.JobState`), and why.
    pub state: i32,
    pub reason: String,
    /// The last connection or call error, cleared by a registration.
    pub last_error: Option<String>,
    /// Why the session gave up on the scheduler, if it did.
    pub gave_up: Option<String>,
    /// How many registrations succeeded so far.
    pub registrations: u64,
    /// Reports the scheduler accepted.
    pub reports_sent: u64,
    /// (job id, version) of every plan received and kept, in order.
    pub received: Vec<(u64, u64)>,
    /// Why each refused plan was refused.
    pub refused: Vec<String>,
}

impl Status {
    /// The state's name: `JOB_STATE_ACTIVE`, `JOB_STATE_QUEUED`, ...
    pub fn state_name(&self) -> &'static str {
        pb::JobState::try_from(self.state).map_or("JOB_STATE_UNSPECIFIED", |s| s.as_str_name())
    }
}

/// What the background thread shares with the training loop.
#[derive(Debug, Default)]
struct Shared {
    status: Status,
    /// The newest plan received (of the current registration).
    newest: Option<PushedPlan>,
    /// (registration, version) of the plan the loop runs.
    applied: Option<(u64, u64)>,
    /// A warning was given for the outage going on.
    outage: bool,
}

/// The shared state and the signal that it changed.
#[derive(Debug, Default)]
struct Inner {
    shared: Mutex<Shared>,
    changed: Condvar,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A panic while holding the lock cannot leave Shared half-updated
        // in a way that matters (every field is replaced whole): go on.
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes the shared state and wakes whoever waits on it.
    fn update<T>(&self, f: impl FnOnce(&mut Shared) -> T) -> T {
        let out = f(&mut self.lock());
        self.changed.notify_all();
        out
    }

    /// Waits until `ready` gives a value or `timeout` passes.
    fn wait_for<T>(
        &self,
        timeout: Duration,
        mut ready: impl FnMut(&Shared) -> Option<T>,
    ) -> Option<T> {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        loop {
            if let Some(v) = ready(&s) {
                return Some(v);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// The connection to the scheduler, run by a background thread. Every
/// method takes `&self`: the loop, a tool waiting for a plan and the one
/// ending the session may be different threads.
#[derive(Debug)]
pub struct Session {
    inner: Arc<Inner>,
    /// The reports' way to the background thread; `None` once finished
    /// (the thread sees the channel close and unregisters the job).
    reports: Mutex<Option<mpsc::UnboundedSender<Report>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The graph's op count: a report needs one latency per op.
    ops: usize,
    log: LogSink,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The values under these locks are replaced whole: a panic elsewhere
    // cannot leave one half-updated.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Session {
    /// Starts the background thread, which connects and registers `graph`.
    pub fn start(graph: Arc<Graph>, config: SessionConfig) -> std::io::Result<Session> {
        let inner = Arc::new(Inner::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let ops = graph.ops().len();
        let log = config.log.clone();
        let task = connection::Connection::new(graph, config, inner.clone());
        let thread = std::thread::Builder::new()
            .name("scheduler-session".into())
            .spawn(move || runtime.block_on(task.run(rx)))?;
        Ok(Session {
            inner,
            reports: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            ops,
            log,
        })
    }

    /// Blocks until the scheduler has pushed a plan (the job is admitted
    /// and planned), saying why it waits (at [`Level::Info`]); `None` after
    /// `timeout` or once the session gave up.
    pub fn wait_for_plan(&self, timeout: Duration) -> Option<PushedPlan> {
        let mut said = String::new();
        let found = self.inner.wait_for(timeout, |s| {
            if let Some(p) = &s.newest {
                return Some(Some(p.clone()));
            }
            if s.status.gave_up.is_some() {
                return Some(None);
            }
            let now = match (&s.status.registration, &s.status.last_error) {
                (None, Some(e)) => format!("waiting for the scheduler: {e}"),
                (None, None) => "registering with the scheduler".to_string(),
                (Some(r), _) => format!(
                    "job {} is {} {}",
                    r.job_id,
                    s.status.state_name(),
                    s.status.reason
                ),
            };
            if now != said {
                self.log.say(Level::Info, now.trim_end());
                said = now;
            }
            None
        });
        found.flatten()
    }

    /// Blocks until the newest plan received is not `other_than` (a
    /// [`PushedPlan::key`]; `None`: the plan the loop runs), and returns
    /// it; `None` after `timeout`. For tools and tests that want to see a
    /// plan arrive: training never needs to.
    pub fn wait_for_new_plan(
        &self,
        timeout: Duration,
        other_than: Option<(u64, u64)>,
    ) -> Option<PushedPlan> {
        self.inner.wait_for(timeout, |s| {
            let newest = s.newest.as_ref()?;
            let unwanted = other_than.or(s.applied);
            (Some(newest.key()) != unwanted).then(|| newest.clone())
        })
    }

    /// Why the session gave up on the scheduler (a registration it will
    /// refuse again), if it did.
    pub fn gave_up(&self) -> Option<String> {
        self.inner.lock().status.gave_up.clone()
    }

    /// Where the session stands now.
    pub fn status(&self) -> Status {
        self.inner.lock().status.clone()
    }

    /// Marks `plan` as the one the loop runs.
    pub fn applied(&self, plan: &PushedPlan) {
        self.inner.update(|s| s.applied = Some(plan.key()));
    }

    /// Queues the iteration's report (sent only with one latency per op
    /// of the graph) and returns the plan to switch to, if a newer one
    /// than the one running has arrived ([`Session::take_plan`]). Never
    /// blocks on the network.
    pub fn iteration_done(&self, report: Report) -> Option<PushedPlan> {
        if report.op_latency_s.len() == self.ops
            && let Some(tx) = lock(&self.reports).as_ref()
        {
            // The background thread may be gone only if it panicked; the
            // loop then trains on without reports.
            let _ = tx.send(report);
        }
        self.take_plan()
    }

    /// The plan to switch to, if a newer one than the one running has
    /// arrived, marked as the one the loop runs from now; no report.
    pub fn take_plan(&self) -> Option<PushedPlan> {
        self.inner.update(|s| {
            let newest = s.newest.clone()?;
            if s.applied == Some(newest.key()) {
                return None;
            }
            s.applied = Some(newest.key());
            Some(newest)
        })
    }

    /// Ends the session: the job unregisters (when connected) and the
    /// background thread stops. Waits at most `timeout` for that; false
    /// (and a warning) when the thread is left behind. Later calls do
    /// nothing.
    pub fn finish(&self, timeout: Duration) -> bool {
        drop(lock(&self.reports).take());
        let Some(thread) = lock(&self.thread).take() else {
            return true;
        };
        let deadline = Instant::now() + timeout;
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if !thread.is_finished() {
            self.log.say(
                Level::Warning,
                &format!(
                    "the scheduler session did not end within {:.0} s; leaving it behind",
                    timeout.as_secs_f64()
                ),
            );
            return false;
        }
        let _ = thread.join();
        true
    }
}

#[cfg(test)]
mod tests;
