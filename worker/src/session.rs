//! The worker's side of the scheduler: register the job, keep its plan
//! stream open, report every iteration, renew the lease, and survive the
//! scheduler going away.
//!
//! The training loop is synchronous and never waits on the network: a
//! background thread runs a small tokio runtime that owns the connection.
//! The loop hands each iteration's report to it over a channel and, at the
//! iteration boundary, takes the newest plan if one arrived
//! ([`Session::iteration_done`]). When the scheduler vanishes the loop goes
//! on with the plan it has while the background thread reconnects with
//! backoff and registers the job again (plan versions start over, and a
//! restarted scheduler numbers its jobs from 1 again, so a plan is
//! identified by the session's registration count and its version).
//!
//! What a failed call means (the hook's session, `tensile/hook/session.py`,
//! does the same): a registration refused as INVALID_ARGUMENT,
//! RESOURCE_EXHAUSTED or UNIMPLEMENTED will be refused again, so the
//! session gives up and the loop trains on without the scheduler; NOT_FOUND
//! or PERMISSION_DENIED means the scheduler no longer has the job, which
//! registers again; a report refused as FAILED_PRECONDITION (not taken, the
//! job being queued) or INVALID_ARGUMENT is skipped; anything else loses
//! the registration, which leaves the scheduler (best effort) before it
//! registers again, so that no queued ghost waits for its lease to lapse.
//! The backoff starts over after every registration that succeeded.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tensile_graph::Graph;
use tensile_planner::Plan;
use tensile_proto::pb;
use tensile_proto::pb::memory_scheduler_client::MemorySchedulerClient;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

use crate::report::IterationReport;

/// How the worker meets its scheduler.
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
    pub allow_recompute: Option<bool>,
    /// Device bytes the process holds outside the job's storages (CUDA
    /// context, handles, allocator slack); `None`: the scheduler's device
    /// profile says.
    pub base_bytes: Option<u64>,
    /// Longest pause between reconnection attempts.
    pub max_backoff: Duration,
}

/// A plan the scheduler pushed, as the worker applies it.
#[derive(Debug, Clone)]
pub struct PushedPlan {
    pub job_id: u64,
    /// Which registration of this session pushed it (1, 2, ...).
    pub registration: u64,
    pub version: u64,
    pub plan: Plan,
}

impl PushedPlan {
    /// What identifies the plan across registrations.
    fn key(&self) -> (u64, u64) {
        (self.registration, self.version)
    }
}

/// What the background thread shares with the training loop.
#[derive(Debug, Default)]
struct Shared {
    /// The newest plan received (of the current registration).
    newest: Option<PushedPlan>,
    /// (registration, version) of the plan the loop runs.
    applied: Option<(u64, u64)>,
    /// The current registration's job id, if any.
    job_id: Option<u64>,
    /// How many registrations succeeded so far.
    registrations: u64,
    /// The job's state as last heard (QUEUED, PLANNING, ACTIVE), and why.
    state: i32,
    reason: String,
    /// The last connection or call error, for the log.
    last_error: Option<String>,
    /// Why the session gave up on the scheduler, if it did.
    gave_up: Option<String>,
}

/// One iteration as the scheduler hears it.
#[derive(Debug, Clone)]
struct Report {
    iteration: u64,
    op_latency_s: Vec<f64>,
    stall_s: f64,
    late_prefetches: Vec<u32>,
    passive_swaps: u32,
    peak_bytes: u64,
}

/// The connection to the scheduler, run by a background thread.
#[derive(Debug)]
pub struct Session {
    shared: Arc<Mutex<Shared>>,
    reports: mpsc::UnboundedSender<Report>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic while holding the lock cannot leave Shared half-updated in a
    // way that matters (every field is replaced whole): go on.
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

impl Session {
    /// Starts the background thread, which connects and registers `graph`.
    pub fn start(graph: Arc<Graph>, config: SessionConfig) -> std::io::Result<Session> {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (tx, rx) = mpsc::unbounded_channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let task = Connection {
            graph,
            config,
            shared: shared.clone(),
            last_measured: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name("scheduler-session".into())
            .spawn(move || runtime.block_on(task.run(rx)))?;
        Ok(Session {
            shared,
            reports: tx,
            thread: Some(thread),
        })
    }

    /// Blocks until the scheduler has pushed a plan (the job is admitted
    /// and planned), logging why it waits; `None` after `timeout`.
    pub fn wait_for_plan(&self, timeout: Duration) -> Option<PushedPlan> {
        let deadline = std::time::Instant::now() + timeout;
        let mut said = String::new();
        loop {
            {
                let s = lock(&self.shared);
                if let Some(p) = &s.newest {
                    return Some(p.clone());
                }
                if s.gave_up.is_some() {
                    return None;
                }
                let now = match (&s.job_id, &s.last_error) {
                    (None, Some(e)) => format!("waiting for the scheduler: {e}"),
                    (None, None) => "registering with the scheduler".to_string(),
                    (Some(id), _) => {
                        let state = pb::JobState::try_from(s.state)
                            .map(|k| k.as_str_name())
                            .unwrap_or("UNKNOWN");
                        format!("job {id} is {state} {}", s.reason)
                    }
                };
                if now != said {
                    eprintln!("{}", now.trim_end());
                    said = now;
                }
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Why the session gave up on the scheduler (a registration it will
    /// refuse again), if it did.
    pub fn gave_up(&self) -> Option<String> {
        lock(&self.shared).gave_up.clone()
    }

    /// Marks `plan` as the one the loop runs.
    pub fn applied(&self, plan: &PushedPlan) {
        lock(&self.shared).applied = Some(plan.key());
    }

    /// Reports the iteration and returns the plan to switch to, if a newer
    /// one than the one running has arrived. Never blocks on the network.
    pub fn iteration_done(&self, graph: &Graph, r: &IterationReport) -> Option<PushedPlan> {
        let report = Report {
            iteration: r.iteration as u64,
            op_latency_s: r.op_ns.iter().map(|&ns| ns as f64 * 1e-9).collect(),
            stall_s: r.stall_ns as f64 * 1e-9,
            late_prefetches: r.late_prefetch_tensors.iter().map(|t| t.0).collect(),
            passive_swaps: u32::try_from(r.passive_swaps).unwrap_or(u32::MAX),
            peak_bytes: r.measured_peak_bytes,
        };
        debug_assert_eq!(report.op_latency_s.len(), graph.ops().len());
        // The background thread may be gone only if it panicked; the loop
        // then trains on without reports.
        let _ = self.reports.send(report);
        let mut s = lock(&self.shared);
        let newest = s.newest.clone()?;
        if s.applied == Some(newest.key()) {
            return None;
        }
        s.applied = Some(newest.key());
        Some(newest)
    }

    /// Ends the session: the job unregisters (when connected) and the
    /// background thread stops. Waits at most `timeout` for that.
    pub fn finish(mut self, timeout: Duration) {
        let (tx, _) = mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.reports, tx));
        if let Some(thread) = self.thread.take() {
            let deadline = std::time::Instant::now() + timeout;
            while !thread.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
    }
}

/// The background task's state.
struct Connection {
    graph: Arc<Graph>,
    config: SessionConfig,
    shared: Arc<Mutex<Shared>>,
    /// The last measured latencies: a re-registration starts from them.
    last_measured: Vec<f64>,
}

/// Why a registration ended.
enum Ended {
    /// The scheduler is unreachable or dropped the job: register again
    /// (`registered`: this registration had succeeded; `gone`: the
    /// scheduler no longer has the job, so there is nothing to leave).
    Lost {
        why: String,
        registered: bool,
        gone: bool,
    },
    /// The scheduler refused the job in a way it will again: give up.
    Fatal(String),
    /// The training loop is gone: stop.
    Done,
}

/// The calls whose failures the session tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Register,
    Report,
    Other,
}

/// What a failed call means for the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// The request will be refused again: give up on the scheduler.
    Fatal,
    /// The scheduler no longer has the job: register again.
    Gone,
    /// This report was not taken: go on.
    Skip,
    /// The registration is lost: leave, then register again.
    Lost,
}

fn classify(call: Call, code: tonic::Code) -> Failure {
    use tonic::Code;
    match (call, code) {
        (Call::Register, Code::InvalidArgument | Code::ResourceExhausted | Code::Unimplemented) => {
            Failure::Fatal
        }
        (Call::Report | Call::Other, Code::NotFound | Code::PermissionDenied) => Failure::Gone,
        (Call::Report, Code::FailedPrecondition | Code::InvalidArgument) => Failure::Skip,
        _ => Failure::Lost,
    }
}

fn lost(why: String) -> Ended {
    Ended::Lost {
        why,
        registered: true,
        gone: false,
    }
}

impl Connection {
    async fn run(mut self, mut reports: mpsc::UnboundedReceiver<Report>) {
        const FIRST_BACKOFF: Duration = Duration::from_millis(100);
        let mut backoff = FIRST_BACKOFF;
        loop {
            match self.registration(&mut reports).await {
                Ended::Done => return,
                Ended::Fatal(why) => {
                    {
                        let mut s = lock(&self.shared);
                        s.job_id = None;
                        s.last_error = Some(why.clone());
                        s.gave_up = Some(why.clone());
                    }
                    eprintln!(
                        "scheduler: {why}; training goes on with the plan it has, without the scheduler"
                    );
                    // The loop's reports go nowhere until it ends.
                    while reports.recv().await.is_some() {}
                    return;
                }
                Ended::Lost {
                    why, registered, ..
                } => {
                    if registered {
                        backoff = FIRST_BACKOFF;
                    }
                    let first = {
                        let mut s = lock(&self.shared);
                        let first = s.last_error.as_deref() != Some(why.as_str());
                        s.job_id = None;
                        s.last_error = Some(why.clone());
                        first
                    };
                    if first {
                        eprintln!(
                            "scheduler: {why}; training goes on with the plan it has, reconnecting"
                        );
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.config.max_backoff);
                }
            }
            // Reports made while disconnected are dropped (the scheduler
            // wants the newest measurements, which the next registration
            // carries), but the loop's end is not.
            loop {
                match reports.try_recv() {
                    Ok(r) => self.last_measured = r.op_latency_s,
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => return,
                }
            }
        }
    }

    async fn connect(&self) -> Result<MemorySchedulerClient<Channel>, String> {
        let server = tensile_proto::endpoint::resolve_server(
            self.config.server.as_deref(),
            self.config.device_ordinal,
        )
        .map_err(|e| e.to_string())?;
        let uri = tensile_proto::endpoint::client_uri(Some(&server));
        let channel = Endpoint::from_shared(uri.clone())
            .map_err(|e| format!("bad scheduler address {uri}: {e}"))?
            .connect_timeout(Duration::from_secs(2))
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| format!("cannot reach {uri}: {e}"))?;
        Ok(MemorySchedulerClient::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX))
    }

    /// One registration: register, subscribe, report and heartbeat until
    /// the scheduler is lost or the loop ends.
    async fn registration(&mut self, reports: &mut mpsc::UnboundedReceiver<Report>) -> Ended {
        let mut client = match self.connect().await {
            Ok(c) => c,
            Err(why) => {
                return Ended::Lost {
                    why,
                    registered: false,
                    gone: false,
                };
            }
        };
        let settings = pb::JobSettings {
            priority: self.config.priority,
            allow_recompute: self.config.allow_recompute,
            base_bytes: self.config.base_bytes.unwrap_or(0),
            ..Default::default()
        };
        let request = pb::RegisterJobRequest {
            name: self.config.name.clone(),
            graph: Some(tensile_proto::convert::graph_to_proto(&self.graph)),
            settings: Some(settings),
            op_latency_s: self.last_measured.clone(),
        };
        let job = match client.register_job(request).await {
            Ok(r) => r.into_inner(),
            Err(s) => {
                let why = format!("RegisterJob: {}: {}", code_name(s.code()), s.message());
                return match classify(Call::Register, s.code()) {
                    Failure::Fatal => Ended::Fatal(why),
                    _ => Ended::Lost {
                        why,
                        registered: false,
                        gone: false,
                    },
                };
            }
        };
        let registration = {
            let mut s = lock(&self.shared);
            s.job_id = Some(job.job_id);
            s.state = job.state;
            s.reason = job.reason.clone();
            s.last_error = None;
            s.registrations += 1;
            s.registrations
        };
        let ended = self.serve(&mut client, &job, registration, reports).await;
        if let Ended::Lost { gone: false, .. } = &ended {
            // Lost while the scheduler may still hold the job: leave rather
            // than linger (or wait in its queue) until the lease lapses.
            // Best effort, and brief: it is often unreachable.
            let request = pb::UnregisterJobRequest {
                job_id: job.job_id,
                token: job.token.clone(),
            };
            let _ =
                tokio::time::timeout(Duration::from_secs(1), client.unregister_job(request)).await;
        }
        ended
    }

    /// A registration from its job onwards: subscribe, then report and
    /// heartbeat until the scheduler is lost or the loop ends.
    async fn serve(
        &mut self,
        client: &mut MemorySchedulerClient<Channel>,
        job: &pb::RegisterJobResponse,
        registration: u64,
        reports: &mut mpsc::UnboundedReceiver<Report>,
    ) -> Ended {
        eprintln!(
            "scheduler: registered as job {} ({})",
            job.job_id,
            pb::JobState::try_from(job.state).map_or("UNKNOWN", |k| k.as_str_name())
        );
        let lease = Duration::from_secs_f64(if job.lease_s > 0.0 { job.lease_s } else { 10.0 });
        let stream = client
            .subscribe_plans(pb::SubscribePlansRequest {
                job_id: job.job_id,
                token: job.token.clone(),
                after_version: 0,
            })
            .await;
        let mut stream = match stream {
            Ok(s) => s.into_inner(),
            Err(s) => return failed(Call::Other, "SubscribePlans", job.job_id, &s),
        };
        let mut heartbeat = tokio::time::interval(lease / 3);
        let mut plan_version = 0;
        loop {
            tokio::select! {
                update = stream.message() => match update {
                    Ok(Some(u)) => {
                        if let Some(v) = self.take_update(job.job_id, registration, u) {
                            plan_version = v;
                        }
                    }
                    Ok(None) => return lost("the plan stream ended".into()),
                    Err(s) => return failed(Call::Other, "plan stream", job.job_id, &s),
                },
                report = reports.recv() => {
                    let Some(r) = report else {
                        // Training is over: leave now rather than when the
                        // lease lapses, so the others are re-planned at once.
                        let request = pb::UnregisterJobRequest { job_id: job.job_id, token: job.token.clone() };
                        if let Err(s) = client.unregister_job(request).await {
                            eprintln!("scheduler: UnregisterJob: {}", s.message());
                        }
                        return Ended::Done;
                    };
                    self.last_measured = r.op_latency_s.clone();
                    if lock(&self.shared).state == pb::JobState::Queued as i32 {
                        // Not admitted: no plan to report on (the latencies
                        // are kept for the next registration).
                        continue;
                    }
                    let request = pb::ReportLatenciesRequest {
                        job_id: job.job_id,
                        token: job.token.clone(),
                        iteration: r.iteration,
                        plan_version,
                        op_latency_s: r.op_latency_s,
                        stall_s: r.stall_s,
                        late_prefetches: r.late_prefetches,
                        passive_swaps: r.passive_swaps,
                        peak_bytes: r.peak_bytes,
                    };
                    if let Err(s) = client.report_latencies(request).await {
                        if classify(Call::Report, s.code()) != Failure::Skip {
                            return failed(Call::Report, "ReportLatencies", job.job_id, &s);
                        }
                        if s.code() == tonic::Code::InvalidArgument {
                            eprintln!("scheduler: report refused: {}", s.message());
                        }
                    }
                }
                _ = heartbeat.tick() => {
                    let request = pb::HeartbeatRequest { job_id: job.job_id, token: job.token.clone() };
                    if let Err(s) = client.heartbeat(request).await {
                        return failed(Call::Other, "Heartbeat", job.job_id, &s);
                    }
                }
            }
        }
    }

    /// Stores a pushed plan as the newest; returns its version.
    fn take_update(&self, job_id: u64, registration: u64, u: pb::PlanUpdate) -> Option<u64> {
        let mut s = lock(&self.shared);
        s.state = u.state;
        let plan = u.plan?;
        match tensile_proto::convert::plan_from_proto(&plan, &self.graph) {
            Ok(p) => {
                s.newest = Some(PushedPlan {
                    job_id,
                    registration,
                    version: plan.version,
                    plan: p,
                });
                Some(plan.version)
            }
            Err(e) => {
                // A plan that does not fit the graph is never applied.
                eprintln!("scheduler: plan version {} refused: {e}", plan.version);
                None
            }
        }
    }
}

/// A failed call as the end of the registration (never `Skip`: the caller
/// goes on then).
fn failed(call: Call, what: &str, job_id: u64, s: &tonic::Status) -> Ended {
    let detail = format!("{what}: {}: {}", code_name(s.code()), s.message());
    match classify(call, s.code()) {
        Failure::Gone => Ended::Lost {
            why: format!("job {job_id} is no longer registered ({detail})"),
            registered: true,
            gone: true,
        },
        Failure::Fatal => Ended::Fatal(detail),
        Failure::Skip | Failure::Lost => lost(detail),
    }
}

fn code_name(c: tonic::Code) -> String {
    format!("{c:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_graph::DType;
    use tensile_graph::builder::{Builder, Optimizer};
    use tonic::Code;

    #[test]
    fn failures_mean_what_the_hook_takes_them_to_mean() {
        for c in [
            Code::InvalidArgument,
            Code::ResourceExhausted,
            Code::Unimplemented,
        ] {
            assert_eq!(classify(Call::Register, c), Failure::Fatal, "{c:?}");
        }
        for c in [Code::Unavailable, Code::DeadlineExceeded, Code::Internal] {
            assert_eq!(classify(Call::Register, c), Failure::Lost, "{c:?}");
            assert_eq!(classify(Call::Report, c), Failure::Lost, "{c:?}");
        }
        for c in [Code::NotFound, Code::PermissionDenied] {
            assert_eq!(classify(Call::Report, c), Failure::Gone, "{c:?}");
            assert_eq!(classify(Call::Other, c), Failure::Gone, "{c:?}");
        }
        for c in [Code::FailedPrecondition, Code::InvalidArgument] {
            assert_eq!(classify(Call::Report, c), Failure::Skip, "{c:?}");
        }
        let gone = failed(
            Call::Report,
            "ReportLatencies",
            7,
            &tonic::Status::not_found("no job 7"),
        );
        assert!(
            matches!(gone, Ended::Lost { why, gone: true, .. } if why.starts_with("job 7 is no longer"))
        );
    }

    fn plan(registration: u64, version: u64) -> PushedPlan {
        PushedPlan {
            job_id: 1,
            registration,
            version,
            plan: Plan::default(),
        }
    }

    #[test]
    fn a_restarted_schedulers_first_plan_is_new_though_its_job_id_and_version_are_not() {
        let mut b = Builder::new("tiny");
        let x = b.input("x", vec![4, 8], DType::F32);
        let y = b.input("y", vec![4], DType::I64);
        let h = b.linear("fc", x, 2, false);
        let loss = b.cross_entropy("loss", h, y);
        let g = b.finish(loss, Optimizer::adam()).expect("a valid graph");
        let report = IterationReport {
            op_ns: vec![0; g.ops().len()],
            ..IterationReport::default()
        };
        let (tx, _rx) = mpsc::unbounded_channel();
        let session = Session {
            shared: Arc::new(Mutex::new(Shared::default())),
            reports: tx,
            thread: None,
        };
        session.applied(&plan(1, 1));
        // The same registration's plan again: nothing new.
        lock(&session.shared).newest = Some(plan(1, 1));
        assert!(session.iteration_done(&g, &report).is_none());
        // The scheduler restarted: job 1 again, version 1 again, but a new
        // registration of this session. The loop must switch to it.
        lock(&session.shared).newest = Some(plan(2, 1));
        let got = session
            .iteration_done(&g, &report)
            .expect("the new registration's plan");
        assert_eq!(got.key(), (2, 1));
        assert!(session.iteration_done(&g, &report).is_none());
    }
}
