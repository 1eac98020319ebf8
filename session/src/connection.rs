//! The background task: one registration after another (register,
//! subscribe, report and heartbeat until the scheduler is lost), with
//! backoff between them, until the training loop ends.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tensile_graph::Graph;
use tensile_planner::{EventKind, Plan};
use tensile_proto::convert::{diagnostic_from_proto, plan_from_proto};
use tensile_proto::pb;
use tensile_proto::pb::memory_scheduler_client::MemorySchedulerClient;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::failure::{Call, Failure, classify, describe};
use crate::{Inner, Level, PushedPlan, Registration, Report, SessionConfig};

/// The first pause before registering again; it doubles up to the
/// configuration's `max_backoff` and starts over after a registration.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// How long a registration that is lost may take to leave.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(1);
/// The reason given for a queued job when the scheduler gives none.
const NO_ROOM: &str = "it does not fit beside the other jobs yet";

/// The background task's state.
pub(crate) struct Connection {
    graph: Arc<Graph>,
    config: SessionConfig,
    inner: Arc<Inner>,
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

fn lost(why: String) -> Ended {
    Ended::Lost {
        why,
        registered: true,
        gone: false,
    }
}

impl Connection {
    pub(crate) fn new(graph: Arc<Graph>, config: SessionConfig, inner: Arc<Inner>) -> Connection {
        Connection {
            graph,
            config,
            inner,
            last_measured: Vec::new(),
        }
    }

    fn say(&self, level: Level, message: &str) {
        self.config.log.say(level, message);
    }

    pub(crate) async fn run(mut self, mut reports: mpsc::UnboundedReceiver<Report>) {
        let mut backoff = FIRST_BACKOFF;
        loop {
            let ended = self.registration(&mut reports).await;
            self.inner.update(|s| {
                s.status.registration = None;
                s.status.state = 0;
                s.status.reason.clear();
            });
            match ended {
                Ended::Done => return,
                Ended::Fatal(why) => {
                    self.inner.update(|s| {
                        s.status.last_error = Some(why.clone());
                        s.status.gave_up = Some(why.clone());
                    });
                    self.say(
                        Level::Warning,
                        &format!(
                            "{why}; training goes on with the plan it has, without the scheduler"
                        ),
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
                    let first = self.inner.update(|s| {
                        s.status.last_error = Some(why.clone());
                        !std::mem::replace(&mut s.outage, true)
                    });
                    if first {
                        let then = "training goes on with the plan it has, reconnecting";
                        self.say(Level::Warning, &format!("{why}; {then}"));
                    } else {
                        self.say(Level::Debug, &why);
                    }
                    if self.pause(backoff, &mut reports).await {
                        return;
                    }
                    backoff = (backoff * 2).min(self.config.max_backoff);
                }
            }
        }
    }

    /// Waits `pause` keeping the latencies of the reports made meanwhile
    /// (they are not sent: the next registration carries the newest);
    /// true when the loop ended.
    async fn pause(
        &mut self,
        pause: Duration,
        reports: &mut mpsc::UnboundedReceiver<Report>,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + pause;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return false,
                r = reports.recv() => match r {
                    Some(r) => self.last_measured = r.op_latency_s,
                    None => return true,
                },
            }
        }
    }

    /// A unary call, within the configuration's call timeout.
    async fn call<T>(
        &self,
        f: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        let Some(limit) = self.config.call_timeout else {
            return f.await.map(tonic::Response::into_inner);
        };
        match tokio::time::timeout(limit, f).await {
            Ok(r) => r.map(tonic::Response::into_inner),
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {:.1} s",
                limit.as_secs_f64()
            ))),
        }
    }

    /// A client of the scheduler, and its address.
    async fn connect(&self) -> Result<(MemorySchedulerClient<Channel>, String), String> {
        let server = tensile_proto::endpoint::resolve_server(
            self.config.server.as_deref(),
            self.config.device_ordinal,
        )
        .map_err(|e| e.to_string())?;
        let tls = self.config.tls.as_ref();
        let (endpoint, _) =
            tensile_proto::tls::endpoint(&server, tls).map_err(|e| e.to_string())?;
        let channel = endpoint
            .connect_timeout(Duration::from_secs(2))
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| tensile_proto::endpoint::unreachable(&server, &e, tls))?;
        let client = MemorySchedulerClient::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        Ok((client, server))
    }

    /// Why a TLS scheduler refused this client, when the first call on a
    /// connection failed for want of a connection: a scheduler that wants
    /// a client certificate says so only after the handshake, which the
    /// gRPC client reads as a closed connection (`tensile_proto::tls::probe`).
    async fn refused_by_tls(&self, server: &str, s: &tonic::Status) -> Option<String> {
        let Some(tls) = self.config.tls.clone() else {
            return tensile_proto::tls::plaintext_hint(server, s);
        };
        if !matches!(
            s.code(),
            tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Unavailable
        ) {
            return None;
        }
        let server = server.to_string();
        tokio::task::spawn_blocking(move || tensile_proto::tls::probe(&server, &tls))
            .await
            .ok()
            .flatten()
    }

    /// One registration: register, subscribe, report and heartbeat until
    /// the scheduler is lost or the loop ends.
    async fn registration(&mut self, reports: &mut mpsc::UnboundedReceiver<Report>) -> Ended {
        let (mut client, server) = match self.connect().await {
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
            process: self.config.process.clone().unwrap_or_default(),
        };
        let job = match self.call(client.register_job(request)).await {
            Ok(r) => r,
            Err(s) => {
                let mut why = describe("RegisterJob", &s);
                if let Some(tls) = self.refused_by_tls(&server, &s).await {
                    why = format!("RegisterJob: {tls}");
                }
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
        let (registration, back) = self.inner.update(|s| {
            s.status.registration = Some(Registration {
                job_id: job.job_id,
                token: job.token.clone(),
                state: job.state,
                reason: job.reason.clone(),
                lease_s: job.lease_s,
            });
            s.status.state = job.state;
            s.status.reason = job.reason.clone();
            s.status.last_error = None;
            s.status.registrations += 1;
            (
                s.status.registrations,
                std::mem::replace(&mut s.outage, false),
            )
        });
        let state = pb::JobState::try_from(job.state).map_or("UNKNOWN", |k| k.as_str_name());
        let (level, again) = if back {
            (Level::Warning, " (reconnected)")
        } else {
            (Level::Info, "")
        };
        self.say(
            level,
            &format!(
                "registered as job {} ({state}) at {server}{again}",
                job.job_id
            ),
        );
        if job.state == pb::JobState::Queued as i32 {
            self.queued(job.job_id, &job.reason);
        }
        let ended = self.serve(&mut client, &job, registration, reports).await;
        if let Ended::Lost { gone: false, .. } = &ended {
            // Lost while the scheduler may still hold the job: leave rather
            // than linger (or wait in its queue) until the lease lapses.
            // Best effort, and brief: it is often unreachable.
            let request = pb::UnregisterJobRequest {
                job_id: job.job_id,
                token: job.token.clone(),
            };
            let _ = tokio::time::timeout(LEAVE_TIMEOUT, client.unregister_job(request)).await;
        }
        ended
    }

    fn queued(&self, job_id: u64, reason: &str) {
        let reason = if reason.is_empty() { NO_ROOM } else { reason };
        // Info: what the job does meanwhile is its caller's to say (the
        // worker and the hook wait for admission and say so themselves).
        self.say(Level::Info, &format!("job {job_id} is queued ({reason})"));
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
        let lease = Duration::from_secs_f64(if job.lease_s > 0.0 { job.lease_s } else { 10.0 });
        let subscribe = pb::SubscribePlansRequest {
            job_id: job.job_id,
            token: job.token.clone(),
            after_version: 0,
        };
        let mut stream = match self.call(client.subscribe_plans(subscribe)).await {
            Ok(s) => s,
            Err(s) => return failed(Call::Other, "SubscribePlans", job.job_id, &s),
        };
        let mut heartbeat = tokio::time::interval(lease / 3);
        let mut plan_version = 0;
        loop {
            tokio::select! {
                update = stream.message() => match update {
                    Ok(Some(u)) => match self.take_update(job.job_id, registration, u) {
                        Ok(Some(v)) => plan_version = v,
                        Ok(None) => {}
                        Err(ended) => return ended,
                    },
                    Ok(None) => return lost("the plan stream ended".into()),
                    Err(s) => return failed(Call::Other, "plan stream", job.job_id, &s),
                },
                report = reports.recv() => {
                    let Some(r) = report else {
                        // Training is over: leave now rather than when the
                        // lease lapses, so the others are re-planned at once.
                        let request = pb::UnregisterJobRequest { job_id: job.job_id, token: job.token.clone() };
                        match self.call(client.unregister_job(request)).await {
                            Ok(_) => self.say(Level::Info, &format!("unregistered job {}", job.job_id)),
                            Err(s) => self.say(Level::Warning, &describe("UnregisterJob", &s)),
                        }
                        return Ended::Done;
                    };
                    self.last_measured = r.op_latency_s.clone();
                    if self.inner.lock().status.state == pb::JobState::Queued as i32 {
                        // Not admitted: no plan to report on (the latencies
                        // are kept for the next registration).
                        continue;
                    }
                    let request = report_request(job, plan_version, r);
                    match self.call(client.report_latencies(request)).await {
                        Ok(_) => self.inner.update(|s| s.status.reports_sent += 1),
                        Err(s) => match classify(Call::Report, s.code()) {
                            Failure::Skip if s.code() == tonic::Code::InvalidArgument => {
                                self.say(Level::Warning, &format!("report refused: {}", s.message()));
                            }
                            Failure::Skip => {
                                self.say(Level::Debug, &format!("report not taken: {}", s.message()));
                            }
                            _ => return failed(Call::Report, "ReportLatencies", job.job_id, &s),
                        },
                    }
                }
                _ = heartbeat.tick() => {
                    let request = pb::HeartbeatRequest { job_id: job.job_id, token: job.token.clone() };
                    if let Err(s) = self.call(client.heartbeat(request)).await {
                        return failed(Call::Other, "Heartbeat", job.job_id, &s);
                    }
                }
            }
        }
    }

    /// Takes a plan update: the job's state, and a pushed plan kept as the
    /// newest (its version returned) or refused. A job the scheduler
    /// removed ends the registration.
    fn take_update(
        &self,
        job_id: u64,
        registration: u64,
        u: pb::PlanUpdate,
    ) -> Result<Option<u64>, Ended> {
        let was = self.inner.update(|s| {
            let was = s.status.state;
            s.status.state = u.state;
            was
        });
        let queued = pb::JobState::Queued as i32;
        if u.state == pb::JobState::Done as i32 {
            return Err(Ended::Lost {
                why: format!("job {job_id} is no longer registered (the scheduler removed it)"),
                registered: true,
                gone: true,
            });
        }
        if u.state == queued && was != queued {
            let reasons: Vec<&str> = u.diagnostics.iter().map(|d| d.message.as_str()).collect();
            self.queued(job_id, &reasons.join("; "));
        }
        let Some(plan) = u.plan else {
            return Ok(None);
        };
        let version = plan.version;
        match self.check(&plan) {
            Ok(p) => {
                let diagnostics = u
                    .diagnostics
                    .iter()
                    .filter_map(|d| diagnostic_from_proto(d, 0).ok())
                    .map(|mut d| {
                        // A tensor the graph lacks is dropped, not trusted.
                        d.tensor = d.tensor.filter(|t| t.index() < self.graph.tensors().len());
                        d
                    })
                    .collect();
                self.inner.update(|s| {
                    s.newest = Some(PushedPlan {
                        job_id,
                        registration,
                        version,
                        plan: p,
                        diagnostics,
                    });
                    s.status.received.push((job_id, version));
                });
                self.say(
                    Level::Info,
                    &format!("job {job_id}: plan version {version} received"),
                );
                Ok(Some(version))
            }
            Err(why) => {
                // A plan that does not fit the graph is never applied.
                let message = format!("plan version {version} refused: {why}");
                self.inner
                    .update(|s| s.status.refused.push(message.clone()));
                self.say(
                    Level::Warning,
                    &format!("{message}; keeping the plan in use"),
                );
                Ok(None)
            }
        }
    }

    /// A pushed plan as the planner's, checked against the graph: ids in
    /// range, the plan file's rules, and no recomputation for a job that
    /// registered with it off.
    fn check(&self, plan: &pb::Plan) -> Result<Plan, String> {
        let p = plan_from_proto(plan, &self.graph).map_err(|e| e.to_string())?;
        if self.config.allow_recompute == Some(false)
            && let Some(e) = p.events.iter().find(|e| e.kind == EventKind::Recompute)
        {
            return Err(format!(
                "it recomputes tensor {} {:?}, but the job registered with recomputation off",
                e.tensor.0,
                self.graph.tensor(e.tensor).name
            ));
        }
        tensile_proto::plan_json::check_plan(&p, &self.graph).map_err(|e| e.to_string())?;
        Ok(p)
    }
}

/// A failed call as the end of the registration (never `Skip`: the caller
/// goes on then).
fn failed(call: Call, what: &str, job_id: u64, s: &tonic::Status) -> Ended {
    let detail = describe(what, s);
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

/// The iteration's report on the wire, for the registration `job` and the
/// plan version it ran.
pub(crate) fn report_request(
    job: &pb::RegisterJobResponse,
    plan_version: u64,
    r: Report,
) -> pb::ReportLatenciesRequest {
    pb::ReportLatenciesRequest {
        job_id: job.job_id,
        token: job.token.clone(),
        iteration: r.iteration,
        plan_version,
        op_latency_s: r.op_latency_s,
        stall_s: r.stall_s,
        late_prefetches: r.late_prefetches,
        passive_swaps: r.passive_swaps,
        peak_bytes: r.peak_bytes,
        base_bytes: r.base_bytes,
    }
}

#[cfg(test)]
pub(crate) fn failed_for_tests(
    call: Call,
    what: &str,
    job_id: u64,
    s: &tonic::Status,
) -> (String, bool) {
    match failed(call, what, job_id, s) {
        Ended::Lost { why, gone, .. } => (why, gone),
        Ended::Fatal(why) => (why, false),
        Ended::Done => (String::new(), false),
    }
}
