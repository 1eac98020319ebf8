//! `run`: binds nothing itself (listeners come bound, so tests can use
//! port 0), starts the planning task, the lease reaper and the metrics
//! endpoint, serves the scheduler with gRPC health and reflection on every
//! listener (TCP ones with TLS when configured), and shuts down in order: streams end, connections drain
//! within the deadline, the store is flushed, socket files are removed.
//! A scheduler serving several GPUs (`crate::node`) runs one planning
//! domain per GPU through the same code ([`run_domains`]).

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tensile_proto::pb::memory_scheduler_server::MemorySchedulerServer;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tracing::{Instrument, error, info, warn};

use crate::coldstart::ColdStart;
use crate::config::{Config, ListenAddr};
use crate::error::ConfigError;
use crate::metrics::{Metrics, MetricsRegistry};
use crate::node::Manifest;
use crate::planning::{Command, Planner};
use crate::service::Service;
use crate::state::Shared;
use crate::store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("invalid configuration: {0}")]
    Invalid(#[from] ConfigError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("reflection service: {0}")]
    Reflection(String),
}

/// A bound listener.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    /// The socket file is removed at shutdown.
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Binds `addr`. A Unix socket's directory is created with mode 0700
    /// (and set to it when it is the default one); a stale socket file
    /// nobody listens on is replaced, a live one is an error.
    pub async fn bind(addr: &ListenAddr) -> Result<Listener, RunError> {
        Listener::bind_with_mode(addr, None).await
    }

    /// [`Listener::bind`], then a Unix socket's mode set to `mode` (octal
    /// permission bits; `tensile-scheduler --socket-mode`) before anyone is
    /// told where it is. A TCP address has no mode: `mode` is ignored.
    pub async fn bind_with_mode(
        addr: &ListenAddr,
        mode: Option<u32>,
    ) -> Result<Listener, RunError> {
        let io = |what: String| move |source| RunError::Io { what, source };
        match addr {
            ListenAddr::Tcp(a) => Ok(Listener::Tcp(
                TcpListener::bind(a)
                    .await
                    .map_err(io(format!("listen on {a}")))?,
            )),
            ListenAddr::Unix(path) => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    make_private_dir(dir)?;
                }
                if path.exists() {
                    if tokio::net::UnixStream::connect(path).await.is_ok() {
                        return Err(RunError::Config(format!(
                            "{}: a scheduler is already listening there",
                            path.display()
                        )));
                    }
                    std::fs::remove_file(path)
                        .map_err(io(format!("remove stale socket {}", path.display())))?;
                }
                let l = UnixListener::bind(path)
                    .map_err(io(format!("listen on {}", path.display())))?;
                if let Some(mode) = mode {
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                        .map_err(io(format!("set mode {mode:04o} on {}", path.display())))?;
                }
                Ok(Listener::Unix(l, path.clone()))
            }
        }
    }

    /// Where clients reach it: `unix:PATH` or `IP:PORT`.
    pub fn address(&self) -> String {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map_or_else(|e| format!("tcp (unknown: {e})"), |a| a.to_string()),
            Listener::Unix(_, p) => format!("unix:{}", p.display()),
        }
    }
}

/// Creates `dir` (mode 0700) if it is missing; one we did not create keeps
/// its mode unless it is the default socket directory.
fn make_private_dir(dir: &Path) -> Result<(), RunError> {
    let io = |source| RunError::Io {
        what: format!("socket directory {}", dir.display()),
        source,
    };
    let created = !dir.exists();
    std::fs::create_dir_all(dir).map_err(io)?;
    if created || dir == tensile_proto::endpoint::default_socket_dir() {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
    }
    Ok(())
}

/// Serves one device on `listeners` until `shutdown` completes, then shuts
/// down within the configured deadline.
pub async fn run(
    listeners: Vec<Listener>,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    if listeners.is_empty() {
        return Err(RunError::Config("no listener".into()));
    }
    for l in &listeners {
        if let Listener::Unix(_, path) = l
            && let Some(dir) = path.parent()
        {
            crate::node::clear_stale_manifest(dir).await?;
        }
    }
    let domain = Domain {
        gpu: None,
        listeners,
        device: config.device.clone(),
        budget_bytes: config.budget_bytes,
    };
    run_domains(vec![domain], config, None, shutdown).await
}

/// One planning domain: the single device, or one GPU of the node. Each
/// has its own jobs, planning task, lease reaper, budget and status.
#[derive(Debug)]
pub(crate) struct Domain {
    /// The node's index of the GPU; `None`: the single device.
    pub(crate) gpu: Option<u32>,
    pub(crate) listeners: Vec<Listener>,
    pub(crate) device: tensile_latency_model::DeviceProfile,
    pub(crate) budget_bytes: u64,
}

/// What the domains of one scheduler share: cancellation, the tasks and
/// servers to stop, the sockets to remove.
struct Running {
    cancel: CancellationToken,
    tasks: JoinSet<()>,
    servers: JoinSet<Result<(), String>>,
    plannings: Vec<tokio::task::JoinHandle<()>>,
    sockets: Vec<PathBuf>,
}

/// Serves `domains` until `shutdown`: they share the latency store, the
/// cold-start models, job ids and one metrics registry and endpoint (each
/// domain's series labelled with its GPU, the single device's unlabelled); `manifest`
/// (gpus.json) is written once every socket listens and removed first at
/// shutdown.
pub(crate) async fn run_domains(
    domains: Vec<Domain>,
    config: Config,
    manifest: Option<Arc<Manifest>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    config.validate()?;
    if domains.is_empty() {
        return Err(RunError::Config("nothing to serve".into()));
    }
    let store = match &config.state_dir {
        Some(dir) => Some(Arc::new(Store::open(dir)?)),
        None => None,
    };
    let (device, models) = (config.device.clone(), config.models.clone());
    let cold = tokio::task::spawn_blocking(move || ColdStart::load(&device, &models))
        .await
        .map_err(|e| RunError::Config(format!("loading the latency models panicked: {e}")))?;
    info!(
        device = %config.device.name,
        lease_s = config.lease.as_secs_f64(),
        cold_start = %cold.description,
        store = ?config.state_dir,
        domains = domains.len(),
        "scheduler starting"
    );
    let cold = Arc::new(cold);
    let metrics = MetricsRegistry::new();
    let ids = Arc::new(AtomicU64::new(1));
    let mut running = Running {
        cancel: CancellationToken::new(),
        tasks: JoinSet::new(),
        servers: JoinSet::new(),
        plannings: Vec::new(),
        sockets: Vec::new(),
    };
    for domain in domains {
        let mut own = config.clone();
        own.device = domain.device.clone();
        own.budget_bytes = domain.budget_bytes;
        own.validate()
            .map_err(|e| RunError::Config(format!("{}: {e}", domain_name(domain.gpu))))?;
        let gpu = domain.gpu.zip(manifest.clone());
        let domain_metrics = metrics.domain(domain.gpu);
        start_domain(
            domain,
            domain_metrics,
            own,
            &mut running,
            Common {
                cold: cold.clone(),
                store: store.clone(),
                ids: ids.clone(),
                gpu,
            },
        )
        .await?;
    }
    if let Some(addr) = config.metrics_listen {
        let l = crate::metrics::bind(addr)
            .await
            .map_err(|source| RunError::Io {
                what: format!("metrics on {addr}"),
                source,
            })?;
        info!("metrics on http://{addr}/metrics");
        let c = running.cancel.clone();
        let registry = metrics.registry();
        running.tasks.spawn(async move {
            if let Err(e) = crate::metrics::serve(l, registry, c).await {
                error!("metrics endpoint: {e}");
            }
        });
    }
    if let Some(m) = &manifest {
        let m = m.clone();
        tokio::task::spawn_blocking(move || m.write())
            .await
            .map_err(|e| RunError::Config(format!("writing gpus.json panicked: {e}")))??;
    }

    let Running {
        cancel,
        mut tasks,
        mut servers,
        plannings,
        sockets,
    } = running;
    tokio::select! {
        () = shutdown => info!("shutting down"),
        Some(r) = servers.join_next() => error!("a listener stopped: {r:?}; shutting down"),
    }
    // New clients must not find sockets about to go.
    if let Some(m) = &manifest {
        m.remove();
    }
    // Ending every plan stream first: tonic waits for open streams forever.
    cancel.cancel();
    let deadline = Instant::now() + config.shutdown_deadline;
    let drained = tokio::time::timeout_at(deadline, async {
        while servers.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(
            deadline_s = config.shutdown_deadline.as_secs_f64(),
            "connections still open at the shutdown deadline; closing them"
        );
        servers.abort_all();
    }
    for planning in plannings {
        if tokio::time::timeout_at(deadline, planning).await.is_err() {
            warn!("a planning task did not finish by the deadline");
        }
    }
    tasks.abort_all();
    if let Some(s) = store {
        let flushed = tokio::task::spawn_blocking(move || s.flush()).await;
        if let Ok(Err(e)) = flushed {
            error!("flushing the store: {e}");
        }
    }
    for path in sockets {
        let _ = std::fs::remove_file(path);
    }
    info!("scheduler stopped");
    Ok(())
}

/// What a domain is given besides its own configuration.
struct Common {
    cold: Arc<ColdStart>,
    store: Option<Arc<Store>>,
    ids: Arc<AtomicU64>,
    /// The GPU's index and the manifest its budget is kept in (by the
    /// domain's planning task).
    gpu: Option<(u32, Arc<Manifest>)>,
}

fn domain_name(gpu: Option<u32>) -> String {
    gpu.map_or_else(|| "the device".to_string(), |i| format!("GPU {i}"))
}

/// Starts a domain's planning task, lease reaper and servers.
async fn start_domain(
    domain: Domain,
    metrics: Metrics,
    config: Config,
    running: &mut Running,
    common: Common,
) -> Result<(), RunError> {
    let span = match domain.gpu {
        Some(i) => tracing::info_span!("gpu", index = i),
        None => tracing::Span::none(),
    };
    span.in_scope(|| {
        info!(
            device = %config.device.name,
            memory_bytes = config.device.memory_bytes,
            budget_bytes = config.budget_bytes,
            "planning domain"
        )
    });
    let metrics = Arc::new(metrics);
    let shared = Arc::new(
        Shared::sharing_ids(config.budget_bytes, common.ids)
            .timing_waits(metrics.table_wait_seconds.clone()),
    );
    let cancel = running.cancel.clone();
    let (tx, rx) = mpsc::channel(4096);
    let mut pc = tensile_plan_job::planner_config(&config.device, Some(config.budget_bytes), false);
    pc.coordinate = config.gates;
    pc.gate_slack = config.gate_slack;
    pc.recompute_first = config.recompute_first;
    pc.max_moves = Some(config.plan_max_moves);
    let mut planner = Planner::new(
        shared.clone(),
        pc,
        config.replan_threshold,
        config.ewma_weight,
        config.plan_cap,
        common.store.clone(),
        config.device.name.clone(),
        metrics.clone(),
    );
    if let Some((index, manifest)) = common.gpu {
        planner = planner.keeping_manifest(index, manifest);
    }
    running.plannings.push(tokio::spawn(
        planner.run(rx, cancel.clone()).instrument(span.clone()),
    ));
    running.tasks.spawn(
        reap_leases(
            shared.clone(),
            tx.clone(),
            metrics.clone(),
            config.lease,
            cancel.clone(),
        )
        .instrument(span.clone()),
    );
    let service = Service::new(
        shared,
        tx,
        config.clone(),
        common.cold,
        common.store,
        metrics,
        cancel.clone(),
    );
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<MemorySchedulerServer<Service>>().await;
    let max = config.max_message_bytes();
    let keepalive = Some(config.lease / 2);
    for listener in domain.listeners {
        let address = listener.address();
        // Reflection in both versions: v1, and v1alpha, which many
        // clients still ask for first (grpcurl before 1.9, grpcio-reflection,
        // Postman).
        // Each lists both, as both are served.
        let reflecting = || {
            tonic_reflection::server::Builder::configure()
                .include_reflection_service(false)
                .register_encoded_file_descriptor_set(tensile_proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(
                    tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
                )
        };
        let reflection = reflecting()
            .build_v1()
            .map_err(|e| RunError::Reflection(e.to_string()))?;
        let reflection_v1alpha = reflecting()
            .build_v1alpha()
            .map_err(|e| RunError::Reflection(e.to_string()))?;
        let mut server = Server::builder();
        if let (Listener::Tcp(_), Some(tls)) = (&listener, &config.tls) {
            server = server
                .tls_config(tls.config.clone())
                .map_err(|e| RunError::Config(format!("TLS on {address}: {e}")))?;
        }
        let router = server
            .http2_keepalive_interval(keepalive)
            .http2_keepalive_timeout(keepalive)
            .add_service(health_service.clone())
            .add_service(reflection)
            .add_service(reflection_v1alpha)
            .add_service(
                MemorySchedulerServer::new(service.clone())
                    .max_decoding_message_size(max)
                    .max_encoding_message_size(max),
            );
        let stop = cancel.clone().cancelled_owned();
        let secured = match (&listener, &config.tls) {
            (Listener::Tcp(_), Some(t)) if t.files.client_ca.is_some() => " (mutual TLS)",
            (Listener::Tcp(_), Some(_)) => " (TLS)",
            _ => "",
        };
        span.in_scope(|| info!("listening on {address}{secured}"));
        match listener {
            Listener::Tcp(l) => {
                running.servers.spawn(async move {
                    router
                        .serve_with_incoming_shutdown(TcpIncoming::from(l), stop)
                        .await
                        .map_err(|e| format!("{address}: {e}"))
                });
            }
            Listener::Unix(l, path) => {
                running.sockets.push(path);
                running.servers.spawn(async move {
                    router
                        .serve_with_incoming_shutdown(UnixListenerStream::new(l), stop)
                        .await
                        .map_err(|e| format!("{address}: {e}"))
                });
            }
        }
    }
    Ok(())
}

/// Removes jobs whose lease lapsed (no open plan stream, no report or
/// heartbeat within the lease) and has the others re-planned.
async fn reap_leases(
    shared: Arc<Shared>,
    tx: mpsc::Sender<Command>,
    metrics: Arc<Metrics>,
    lease: std::time::Duration,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval((lease / 4).max(std::time::Duration::from_millis(25)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = cancel.cancelled() => return,
        }
        let now = Instant::now();
        let lapsed = shared.lapsed(now);
        for id in lapsed {
            if let Some(job) = shared.remove_if(id, |j| j.lease_until <= now, "its lease lapsed") {
                job.span.in_scope(|| warn!("lease lapsed; job removed"));
                metrics.leases_lapsed.inc();
                if tx.send(Command::Remove(id)).await.is_err() {
                    return;
                }
            }
        }
    }
}
