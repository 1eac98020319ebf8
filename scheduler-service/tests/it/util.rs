//! Helpers: a scheduler on a real socket, a connected client, small graphs.

use std::sync::Arc;
use std::time::Duration;

use tensile_graph::builder::{Builder, Optimizer};
use tensile_graph::{DType, Graph};
use tensile_latency_model::DeviceProfile;
use tensile_proto::convert::graph_to_proto;
use tensile_proto::pb;
use tensile_proto::pb::memory_scheduler_client::MemorySchedulerClient;
use tensile_scheduler::coldstart::ModelsSpec;
use tensile_scheduler::{Config, ListenAddr, Listener, run};
use tokio::sync::oneshot;
use tonic::transport::Channel;

pub(crate) type Client = MemorySchedulerClient<Channel>;

/// A running scheduler; dropping it shuts it down.
pub(crate) struct Server {
    pub(crate) address: String,
    stop: Option<oneshot::Sender<()>>,
    pub(crate) done: Option<tokio::task::JoinHandle<()>>,
    pub(crate) _dir: Option<tempfile::TempDir>,
}

impl Server {
    pub(crate) async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(d) = self.done.take() {
            d.await.unwrap();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

pub(crate) fn config() -> Config {
    let mut c = Config::new(DeviceProfile::builtin("a6000").unwrap());
    c.models = ModelsSpec::Roofline;
    c.shutdown_deadline = Duration::from_secs(2);
    c
}

/// A scheduler on 127.0.0.1:0.
pub(crate) async fn tcp(config: Config) -> Server {
    let l = Listener::bind(&ListenAddr::parse("127.0.0.1:0").unwrap())
        .await
        .unwrap();
    start(l, config, None).await
}

/// A scheduler on a Unix socket in a temp dir.
pub(crate) async fn unix(config: Config) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/scheduler.sock");
    let l = Listener::bind(&ListenAddr::Unix(path)).await.unwrap();
    start(l, config, Some(dir)).await
}

/// A scheduler on a listener bound by the caller.
pub(crate) async fn start_listener(l: Listener, config: Config) -> Server {
    start(l, config, None).await
}

async fn start(l: Listener, config: Config, dir: Option<tempfile::TempDir>) -> Server {
    let address = l.address();
    let (tx, rx) = oneshot::channel();
    let done = tokio::spawn(async move {
        run(vec![l], config, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    Server {
        address,
        stop: Some(tx),
        done: Some(done),
        _dir: dir,
    }
}

pub(crate) async fn connect(address: &str) -> Client {
    let uri = tensile_proto::endpoint::client_uri(Some(address));
    let ch = tonic::transport::Endpoint::from_shared(uri)
        .unwrap()
        .connect()
        .await
        .unwrap();
    MemorySchedulerClient::new(ch)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX)
}

/// A small MLP of `width`: ops run in microseconds, plans in milliseconds.
pub(crate) fn mlp(width: u64) -> Arc<Graph> {
    let mut b = Builder::new("mlp");
    let x = b.input("x", vec![512, width], DType::F32);
    let y = b.input("y", vec![512], DType::I64);
    let h = b.linear("fc1", x, width, false);
    let h = b.relu("act1", h);
    let h = b.linear("fc2", h, width, false);
    let h = b.relu("act2", h);
    let logits = b.linear("head", h, 10, false);
    let loss = b.cross_entropy("loss", logits, y);
    Arc::new(b.finish(loss, Optimizer::adam()).unwrap())
}

pub(crate) fn register_req(name: &str, g: &Graph) -> pb::RegisterJobRequest {
    pb::RegisterJobRequest {
        name: name.into(),
        graph: Some(graph_to_proto(g)),
        settings: None,
        op_latency_s: Vec::new(),
        process: String::new(),
    }
}

pub(crate) async fn register(c: &mut Client, name: &str, g: &Graph) -> pb::RegisterJobResponse {
    c.register_job(register_req(name, g))
        .await
        .unwrap()
        .into_inner()
}

pub(crate) async fn subscribe(
    c: &mut Client,
    r: &pb::RegisterJobResponse,
) -> tonic::Streaming<pb::PlanUpdate> {
    c.subscribe_plans(pb::SubscribePlansRequest {
        job_id: r.job_id,
        token: r.token.clone(),
        after_version: 0,
    })
    .await
    .unwrap()
    .into_inner()
}

/// Asserts that the scheduler's health service on `ch` says it serves.
pub(crate) async fn assert_serving(ch: tonic::transport::Channel) {
    let r = tonic_health::pb::health_client::HealthClient::new(ch)
        .check(tonic_health::pb::HealthCheckRequest {
            service: "tensile.v1.MemoryScheduler".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

/// The status of every job.
pub(crate) async fn status(c: &mut Client) -> pb::GetStatusResponse {
    c.get_status(pb::GetStatusRequest { job_id: 0 })
        .await
        .unwrap()
        .into_inner()
}

/// The next update that carries a plan, within 30 s.
pub(crate) async fn next_plan(s: &mut tonic::Streaming<pb::PlanUpdate>) -> pb::Plan {
    loop {
        let u = tokio::time::timeout(Duration::from_secs(30), s.message())
            .await
            .expect("a plan within 30 s")
            .unwrap()
            .expect("the stream is open");
        if let Some(p) = u.plan {
            assert_eq!(u.state, pb::JobState::Active as i32);
            return p;
        }
    }
}

pub(crate) fn report(
    r: &pb::RegisterJobResponse,
    ops: usize,
    each_s: f64,
) -> pb::ReportLatenciesRequest {
    pb::ReportLatenciesRequest {
        job_id: r.job_id,
        token: r.token.clone(),
        iteration: 0,
        plan_version: 1,
        op_latency_s: vec![each_s; ops],
        stall_s: 0.0,
        late_prefetches: Vec::new(),
        passive_swaps: 0,
        peak_bytes: 1234,
        base_bytes: 0,
    }
}

/// The metrics endpoint's page, fetched over plain HTTP/1.0.
pub(crate) async fn scrape(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).await.unwrap();
    body
}

/// The sample lines of a metrics page (not the comments, not the HTTP
/// header), series and value as written.
pub(crate) fn metric_samples(page: &str) -> Vec<&str> {
    page.lines()
        .filter(|l| l.starts_with("tensile_scheduler_"))
        .collect()
}
