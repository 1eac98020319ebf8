//! The tonic service: every RPC of `tensile.v1.MemoryScheduler`. Handlers
//! check input and tokens, touch the job table briefly, and leave planning
//! to the planning task; errors are [`Error`]s, mapped to a status in one
//! place (`error.rs`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant as StdInstant;

use prost::Message;
use subtle::ConstantTimeEq;
use tensile_graph::{Graph, GraphError, Liveness, TensorId};
use tensile_latency_model::{CopyQueue, DeviceProfile, estimate_latencies};
use tensile_planner::{JobInput, JobSettings, Measurements, PlannerConfig};
use tensile_proto::convert::{
    diagnostic_to_proto, gate_to_proto, graph_from_proto, plan_to_proto, prediction_to_proto,
};
use tensile_proto::pb;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_stream::Stream;
use tokio_stream::wrappers::WatchStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::{Request, Response, Status};
use tracing::{info, info_span};

use crate::base::{Base, BaseSource};
use crate::bounds;
use crate::coldstart::{ColdStart, SOURCE_MEASURED, SOURCE_STORE};
use crate::config::Config;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::planning::{Command, NewJob};
use crate::state::{Job, JobState, Shared, Update};
use crate::store::{Store, fingerprint};
use crate::token::new_token;

/// The service; clones share everything.
#[derive(Debug, Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Command>,
    config: Config,
    cold: Arc<ColdStart>,
    store: Option<Arc<Store>>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
}

impl Service {
    /// The service of one planning domain: the single device, or a GPU of
    /// the node.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shared: Arc<Shared>,
        tx: mpsc::Sender<Command>,
        config: Config,
        cold: Arc<ColdStart>,
        store: Option<Arc<Store>>,
        metrics: Arc<Metrics>,
        cancel: CancellationToken,
    ) -> Service {
        Service {
            inner: Arc::new(Inner {
                shared,
                tx,
                config,
                cold,
                store,
                metrics,
                cancel,
            }),
        }
    }

    async fn send(&self, cmd: Command) -> Result<(), Error> {
        self.inner
            .tx
            .send(cmd)
            .await
            .map_err(|_| Error::ShuttingDown)
    }

    fn lease_until(&self) -> Instant {
        Instant::now() + self.inner.config.lease
    }
}

/// A graph off the wire: size first, then decoded and validated (on a
/// blocking thread: validation of a big graph takes milliseconds).
async fn graph_in(graph: Option<pb::Graph>, config: &Config, what: &str) -> Result<Graph, Error> {
    let graph = graph.ok_or_else(|| Error::InvalidArgument(format!("{what}.graph is missing")))?;
    let bytes = graph.encoded_len() as u64;
    let limits = config.limits.clone();
    if bytes > limits.max_input_bytes {
        return Err(Error::GraphTooLarge(GraphError::InputTooLarge {
            bytes,
            limit: limits.max_input_bytes,
        }));
    }
    tokio::task::spawn_blocking(move || graph_from_proto(graph, &limits).map_err(Error::from_graph))
        .await
        .map_err(|e| Error::Planning(format!("graph validation panicked: {e}")))?
}

/// The contract's job settings as the planner's, with the priority and
/// where the base came from.
fn settings_in(
    s: Option<pb::JobSettings>,
    device: &DeviceProfile,
) -> Result<(JobSettings, i32, BaseSource), Error> {
    let s = s.unwrap_or_default();
    let rate = if s.max_swap_rate == 0.0 {
        1.0
    } else {
        s.max_swap_rate
    };
    if !(rate > 0.0 && rate <= 1.0) {
        return Err(Error::InvalidArgument(format!(
            "settings.max_swap_rate is {}: it must be in (0, 1] (0: the default, 1)",
            s.max_swap_rate
        )));
    }
    let (base_bytes, base) = if s.base_bytes == 0 {
        (device.base_bytes, BaseSource::Profile)
    } else {
        (
            bounds::bytes("settings.base_bytes", s.base_bytes)?,
            BaseSource::Registered,
        )
    };
    let settings = JobSettings {
        max_swap_rate: rate,
        base_bytes,
        recompute: s.allow_recompute.unwrap_or(true),
        ..JobSettings::default()
    };
    Ok((settings, s.priority, base))
}

pub fn state_to_proto(s: &JobState) -> (pb::JobState, String) {
    match s {
        JobState::Queued(why) => (pb::JobState::Queued, why.clone()),
        JobState::Planning => (pb::JobState::Planning, String::new()),
        JobState::Active => (pb::JobState::Active, String::new()),
        JobState::Done(why) => (pb::JobState::Done, why.clone()),
    }
}

fn update_to_proto(u: &Update, job: u64) -> pb::PlanUpdate {
    pb::PlanUpdate {
        state: state_to_proto(&u.state).0 as i32,
        plan: match u.state {
            JobState::Active => u.plan.as_ref().map(|p| plan_to_proto(p, job)),
            _ => None,
        },
        diagnostics: u
            .diagnostics
            .iter()
            .map(|d| diagnostic_to_proto(d, job))
            .collect(),
    }
}

fn job_status(id: u64, j: &Job) -> pb::JobStatus {
    let (state, reason) = state_to_proto(&j.state());
    // The newest plan, read once: its version, prediction and gate.
    let plan = j.updates.borrow().plan.clone();
    pb::JobStatus {
        job_id: id,
        name: j.name.clone(),
        state: state as i32,
        reason,
        plan_version: plan.as_ref().map_or(0, |p| p.version),
        ops: u32::try_from(j.graph.ops().len()).unwrap_or(u32::MAX),
        tensors: u32::try_from(j.graph.tensors().len()).unwrap_or(u32::MAX),
        iterations_reported: j.iterations,
        prediction: plan.as_ref().map(|p| prediction_to_proto(&p.prediction)),
        reported_peak_bytes: j.reported_peak,
        priority: j.priority,
        latency_source: j.latency_source.to_string(),
        lower_bound_bytes: j.lower_bound,
        base_bytes: j.base_bytes,
        base_source: j.base_source.name().to_string(),
        reported_base_bytes: j.reported_base,
        gate: plan.as_ref().and_then(|p| p.gate).map(gate_to_proto),
        process: j.process.clone(),
        base_job: j.base_job,
    }
}

/// Keeps a job's subscriber count; when the stream goes (the client left,
/// the job ended, shutdown), the lease starts running from now.
#[derive(Debug)]
struct SubscriberGuard {
    shared: Arc<Shared>,
    job: u64,
    lease: std::time::Duration,
}

impl Drop for SubscriberGuard {
    fn drop(&mut self) {
        self.shared.job_mut(self.job, |j| {
            j.subscribers = j.subscribers.saturating_sub(1);
            j.lease_until = Instant::now() + self.lease;
        });
    }
}

/// A job's plan stream: its watch, newest first; ends after a DONE
/// update, when the job's entry goes, or at shutdown.
pub struct PlanStream {
    inner: WatchStream<Update>,
    after: u64,
    job: u64,
    done: bool,
    cancel: Pin<Box<WaitForCancellationFutureOwned>>,
    _guard: SubscriberGuard,
}

impl std::fmt::Debug for PlanStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanStream")
            .field("job", &self.job)
            .finish()
    }
}

impl Stream for PlanStream {
    type Item = Result<pb::PlanUpdate, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if this.cancel.as_mut().poll(cx).is_ready() {
            this.done = true;
            return Poll::Ready(None);
        }
        loop {
            let Some(u) = ready!(Pin::new(&mut this.inner).poll_next(cx)) else {
                this.done = true;
                return Poll::Ready(None);
            };
            match &u.state {
                JobState::Done(_) => {
                    this.done = true;
                    return Poll::Ready(Some(Ok(update_to_proto(&u, this.job))));
                }
                JobState::Active if u.plan.as_ref().map_or(0, |p| p.version) <= this.after => {}
                _ => return Poll::Ready(Some(Ok(update_to_proto(&u, this.job)))),
            }
        }
    }
}

#[tonic::async_trait]
impl pb::memory_scheduler_server::MemoryScheduler for Service {
    async fn register_job(
        &self,
        request: Request<pb::RegisterJobRequest>,
    ) -> Result<Response<pb::RegisterJobResponse>, Status> {
        let req = request.into_inner();
        let inner = &self.inner;
        bounds::name(&req.name)?;
        let process = bounds::process(&req.process)?;
        let graph = graph_in(req.graph, &inner.config, "RegisterJobRequest").await?;
        let (settings, priority, base_source) = settings_in(req.settings, &inner.config.device)?;
        let given = if req.op_latency_s.is_empty() {
            None
        } else {
            Some(bounds::latencies_ns(
                &graph,
                &req.op_latency_s,
                "op_latency_s",
            )?)
        };
        let (cold, store, device) = (
            inner.cold.clone(),
            inner.store.clone(),
            inner.config.device.name.clone(),
        );
        let graph = Arc::new(graph);
        let g = graph.clone();
        let (latencies, source, fp, lower_bound) = tokio::task::spawn_blocking(move || {
            let fp = fingerprint(&g);
            let stored = match (&given, &store) {
                (None, Some(s)) => s.load(&fp, &device, g.ops().len())?,
                _ => None,
            };
            let (lat, source) = match (given, stored) {
                (Some(l), _) => (l, SOURCE_MEASURED),
                (None, Some(l)) => (l, SOURCE_STORE),
                (None, None) => cold.predict(&g),
            };
            let lb = Liveness::analyze(&g).largest_working_set(&g) + settings.base_bytes;
            Ok::<_, Error>((lat, source, fp, lb))
        })
        .await
        .map_err(|e| Error::Planning(format!("cold start panicked: {e}")))??;

        let (token, hash) = new_token()
            .map_err(|e| Error::Planning(format!("the OS random generator failed: {e}")))?;
        let id = inner.shared.next_id();
        let span = info_span!("job", id, name = %req.name);
        let (updates, _) = watch::channel(Update {
            state: JobState::Queued("waiting for admission".into()),
            plan: None,
            diagnostics: Arc::default(),
        });
        let mut states = updates.subscribe();
        inner.shared.insert(
            id,
            Job {
                name: req.name.clone(),
                graph: graph.clone(),
                fingerprint: fp.clone(),
                token: hash,
                priority,
                lower_bound,
                base_bytes: settings.base_bytes,
                base_source,
                process: process.clone().unwrap_or_default(),
                base_job: 0,
                latency_source: source,
                lease_until: self.lease_until(),
                subscribers: 0,
                updates,
                iterations: 0,
                reported_peak: 0,
                reported_base: 0,
                reported_version: None,
                span: span.clone(),
            },
        );
        span.in_scope(|| {
            info!(
                ops = graph.ops().len(),
                tensors = graph.tensors().len(),
                latencies = source,
                lower_bound,
                "registered"
            )
        });
        self.send(Command::Add(NewJob {
            id,
            graph,
            latencies,
            settings,
            priority,
            lower_bound,
            base: Base::new(settings.base_bytes, base_source),
            fingerprint: fp,
            process,
        }))
        .await?;
        // Admission happens first thing in the planning task; its verdict
        // (PLANNING or QUEUED) is the answer.
        tokio::select! {
            _ = states.changed() => {}
            () = inner.cancel.cancelled() => return Err(Error::ShuttingDown.into()),
        }
        let (state, reason) = state_to_proto(&states.borrow().state);
        Ok(Response::new(pb::RegisterJobResponse {
            job_id: id,
            token,
            state: state as i32,
            reason,
            lease_s: inner.config.lease.as_secs_f64(),
        }))
    }

    type SubscribePlansStream = PlanStream;

    async fn subscribe_plans(
        &self,
        request: Request<pb::SubscribePlansRequest>,
    ) -> Result<Response<PlanStream>, Status> {
        let req = request.into_inner();
        let shared = &self.inner.shared;
        let lease_until = self.lease_until();
        let rx = shared.with_job(req.job_id, &req.token, |job| {
            job.subscribers += 1;
            job.lease_until = lease_until;
            Ok(job.updates.subscribe())
        })?;
        Ok(Response::new(PlanStream {
            inner: WatchStream::new(rx),
            after: req.after_version,
            job: req.job_id,
            done: false,
            cancel: Box::pin(self.inner.cancel.clone().cancelled_owned()),
            _guard: SubscriberGuard {
                shared: shared.clone(),
                job: req.job_id,
                lease: self.inner.config.lease,
            },
        }))
    }

    async fn report_latencies(
        &self,
        request: Request<pb::ReportLatenciesRequest>,
    ) -> Result<Response<pb::ReportLatenciesResponse>, Status> {
        let req = request.into_inner();
        let lease_until = self.lease_until();
        let m = &self.inner.metrics;
        let device_bytes = self.inner.config.device.memory_bytes;
        let shared = &self.inner.shared;
        // The token is checked with the entry locked; the report is checked
        // against the graph with nothing locked (it is O(ops)); then the
        // entry is locked again for the counters.
        let graph = shared.with_job(req.job_id, &req.token, |job| Ok(job.graph.clone()))?;
        let op_ns = bounds::latencies_ns(&graph, &req.op_latency_s, "op_latency_s")?;
        bounds::stall_s(req.stall_s)?;
        bounds::measured_base(req.base_bytes, device_bytes)?;
        let tensors = graph.tensors().len();
        if let Some(&t) = req.late_prefetches.iter().find(|&&t| t as usize >= tensors) {
            return Err(Error::InvalidArgument(format!(
                "late_prefetches names tensor {t}; the graph has {tensors} tensors"
            ))
            .into());
        }
        // The contract reports one stall for the iteration: each late
        // prefetch is charged an equal share of it.
        let n = req.late_prefetches.len().max(1) as f64;
        let wait = (req.stall_s / n * 1e9).round() as u64;
        let late_prefetches = req
            .late_prefetches
            .iter()
            .map(|&t| (graph.storage_root(TensorId(t)), wait))
            .collect();
        // The contract has no iteration time: its ops and its stall are
        // it, less what it waited for its pace (only an early job waits for
        // it, and only a late one matters here).
        let iteration_ns = op_ns
            .iter()
            .sum::<u64>()
            .saturating_add((req.stall_s * 1e9) as u64);
        let switched = shared
            .job_mut(req.job_id, |job| {
                job.lease_until = lease_until;
                job.iterations += 1;
                job.reported_peak = req.peak_bytes;
                if req.base_bytes > 0 {
                    job.reported_base = req.base_bytes;
                }
                job.latency_source = SOURCE_MEASURED;
                job.reported_version
                    .replace(req.plan_version)
                    .is_some_and(|v| v != req.plan_version)
            })
            .ok_or(Error::UnknownJob(req.job_id))?;
        let measured = Measurements {
            op_ns,
            late_prefetches,
            switched,
            iteration_ns,
            ..Measurements::default()
        };
        m.reports.inc();
        m.stall_seconds.inc_by(req.stall_s);
        m.passive_swaps.inc_by(u64::from(req.passive_swaps));
        let (reply, answer) = oneshot::channel();
        self.send(Command::Report {
            id: req.job_id,
            measured,
            base_bytes: req.base_bytes,
            reply,
        })
        .await?;
        let out = answer.await.map_err(|_| Error::ShuttingDown)??;
        Ok(Response::new(pb::ReportLatenciesResponse {
            change_rate: out.change_rate,
            replanned: out.replanned,
            plan_version: out.plan_version,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let req = request.into_inner();
        let lease_until = self.lease_until();
        let (state, version) = self.inner.shared.with_job(req.job_id, &req.token, |job| {
            job.lease_until = lease_until;
            Ok((state_to_proto(&job.state()).0, job.version()))
        })?;
        Ok(Response::new(pb::HeartbeatResponse {
            state: state as i32,
            plan_version: version,
            lease_s: self.inner.config.lease.as_secs_f64(),
        }))
    }

    async fn unregister_job(
        &self,
        request: Request<pb::UnregisterJobRequest>,
    ) -> Result<Response<pb::UnregisterJobResponse>, Status> {
        let req = request.into_inner();
        let shared = &self.inner.shared;
        shared.with_job(req.job_id, &req.token, |_| Ok(()))?;
        if let Some(job) = shared.remove(req.job_id, "unregistered") {
            job.span.in_scope(|| info!("unregistered"));
        }
        self.send(Command::Remove(req.job_id)).await?;
        Ok(Response::new(pb::UnregisterJobResponse {}))
    }

    async fn get_status(
        &self,
        request: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::GetStatusResponse>, Status> {
        let want = request.into_inner().job_id;
        let shared = &self.inner.shared;
        let mut jobs: Vec<pb::JobStatus> = if want == 0 {
            shared.each(|id, j| Some(job_status(id, j)))
        } else {
            vec![
                shared
                    .job(want, |j| job_status(want, j))
                    .ok_or(Error::UnknownJob(want))?,
            ]
        };
        jobs.sort_by_key(|j| j.job_id);
        let mem = shared.memory().clone();
        Ok(Response::new(pb::GetStatusResponse {
            jobs,
            memory: Some(pb::MemoryStatus {
                budget_bytes: mem.budget_bytes,
                device_bytes: self.inner.config.device.memory_bytes,
                sum_of_peaks_bytes: mem.sum_of_peaks_bytes,
                aligned_peak_bytes: mem.aligned_peak_bytes,
                vanilla_sum_of_peaks_bytes: mem.vanilla_sum_of_peaks_bytes,
                layout: mem.layout.to_string(),
                layout_note: mem.layout_note.clone(),
                published_bytes: mem.published_bytes,
            }),
            device: self.inner.config.device.name.clone(),
            diagnostics: mem
                .diagnostics
                .iter()
                .map(|(id, d)| diagnostic_to_proto(d, *id))
                .collect(),
        }))
    }

    async fn set_memory_budget(
        &self,
        request: Request<pb::SetMemoryBudgetRequest>,
    ) -> Result<Response<pb::SetMemoryBudgetResponse>, Status> {
        let req = request.into_inner();
        if let Some(admin) = &self.inner.config.admin_token {
            if req.admin_token.is_empty() {
                return Err(Error::MissingAdminToken.into());
            }
            let same: bool = admin.as_bytes().ct_eq(req.admin_token.as_bytes()).into();
            if !same {
                return Err(Error::WrongAdminToken.into());
            }
        }
        if req.budget_bytes == 0 {
            return Err(Error::InvalidArgument("budget_bytes must be positive".into()).into());
        }
        bounds::bytes("budget_bytes", req.budget_bytes)?;
        let (reply, answer) = oneshot::channel();
        self.send(Command::Budget {
            bytes: req.budget_bytes,
            reply,
        })
        .await?;
        let changed = answer.await.map_err(|_| Error::ShuttingDown)?;
        info!(
            budget_bytes = req.budget_bytes,
            changed = changed.len(),
            "memory budget set"
        );
        let shared = &self.inner.shared;
        Ok(Response::new(pb::SetMemoryBudgetResponse {
            budget_bytes: req.budget_bytes,
            changed: changed
                .iter()
                .filter_map(|&id| shared.job(id, |j| job_status(id, j)))
                .collect(),
        }))
    }

    async fn plan_graph(
        &self,
        request: Request<pb::PlanGraphRequest>,
    ) -> Result<Response<pb::PlanGraphResponse>, Status> {
        let req = request.into_inner();
        let inner = &self.inner;
        let graph = graph_in(req.graph, &inner.config, "PlanGraphRequest").await?;
        let profile = profile_in(req.device, &inner.config.device)?;
        let (settings, ..) = settings_in(req.settings, &profile)?;
        let given = if req.op_latency_s.is_empty() {
            None
        } else {
            Some(bounds::latencies_ns(
                &graph,
                &req.op_latency_s,
                "op_latency_s",
            )?)
        };
        let cold = inner.cold.clone();
        let same_device = profile.name == inner.config.device.name;
        let budget = (req.budget_bytes > 0)
            .then(|| bounds::bytes("budget_bytes", req.budget_bytes))
            .transpose()?;
        let out = tokio::task::spawn_blocking(move || {
            let (lat, source) = match given {
                Some(l) => (l, SOURCE_MEASURED),
                None if same_device => cold.predict(&graph),
                None => (
                    estimate_latencies(&graph, &profile),
                    crate::coldstart::SOURCE_ROOFLINE,
                ),
            };
            let mut config = PlannerConfig::new(tensile_plan_job::copy_model(&profile));
            config.budget_bytes = budget;
            let t = StdInstant::now();
            let mp =
                tensile_planner::plan(&[JobInput::new(&graph, lat.clone(), settings)], &config);
            (mp, lat, source, t.elapsed().as_secs_f64())
        })
        .await
        .map_err(|e| Error::Planning(format!("the planner panicked: {e}")))?;
        let (mp, lat, source, planning_s) = out;
        let mut mp = mp.map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let plan = mp.plans.remove(0);
        Ok(Response::new(pb::PlanGraphResponse {
            plan: Some(plan_to_proto(&plan, 0)),
            diagnostics: mp
                .diagnostics
                .iter()
                .map(|d| diagnostic_to_proto(d, 0))
                .collect(),
            latency_source: vec![source.to_string(); lat.len()],
            op_latency_s: lat.iter().map(|&ns| ns as f64 / 1e9).collect(),
            planning_s,
        }))
    }
}

/// A PlanGraph device: a built-in profile by name (else the scheduler's),
/// with the fields that are set overriding it.
fn profile_in(d: Option<pb::DeviceProfile>, own: &DeviceProfile) -> Result<DeviceProfile, Error> {
    let Some(d) = d else {
        return Ok(own.clone());
    };
    let mut p = if d.name.is_empty() || d.name == own.name {
        own.clone()
    } else if DeviceProfile::builtin_names().contains(&d.name.as_str()) || d.name == "cpu" {
        // By name only (never a path a client names): the built-in GPUs and
        // `cpu`, the profile the shipped CPU latency models were measured on.
        tensile_latency_model::device_profile(&d.name)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?
    } else {
        return Err(Error::InvalidArgument(format!(
            "device {:?} is not a built-in profile ({}, cpu)",
            d.name,
            DeviceProfile::builtin_names().join(", ")
        )));
    };
    if d.memory_bytes > 0 {
        p.memory_bytes = bounds::bytes("device.memory_bytes", d.memory_bytes)?;
    }
    if d.h2d_bytes_per_s != 0.0 {
        p.h2d_bytes_per_s = bounds::rate("device.h2d_bytes_per_s", d.h2d_bytes_per_s)?;
    }
    if d.d2h_bytes_per_s != 0.0 {
        p.d2h_bytes_per_s = bounds::rate("device.d2h_bytes_per_s", d.d2h_bytes_per_s)?;
    }
    if d.copy_latency_s != 0.0 {
        if !(d.copy_latency_s.is_finite()
            && d.copy_latency_s > 0.0
            && d.copy_latency_s <= bounds::MAX_OP_LATENCY_S)
        {
            return Err(Error::InvalidArgument(format!(
                "device.copy_latency_s is {}: it must be finite, in (0, {}] s",
                d.copy_latency_s,
                bounds::MAX_OP_LATENCY_S
            )));
        }
        p.copy_latency_ns = (d.copy_latency_s * 1e9).round() as u64;
    }
    if d.half_duplex {
        p.copy_queue = CopyQueue::HalfDuplex;
    }
    p.validate()
        .map_err(|e| Error::InvalidArgument(format!("device: {e}")))?;
    Ok(p)
}
