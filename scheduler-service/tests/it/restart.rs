//! The real binary killed with SIGKILL and restarted: the store is intact
//! and a re-registered job starts from its learned latencies.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tensile_proto::pb;

use crate::util::*;

fn start(dir: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_tensile-scheduler"))
        .args(["--device", "a6000", "--latency-models", "roofline"])
        .arg(format!("--listen=unix:{}", dir.join("s.sock").display()))
        .arg(format!("--state={}", dir.join("state").display()))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

async fn connect_retry(address: &str) -> Client {
    let uri = tensile_proto::endpoint::client_uri(Some(address));
    for _ in 0..200 {
        if let Ok(ch) = tonic::transport::Endpoint::from_shared(uri.clone())
            .unwrap()
            .connect()
            .await
        {
            return pb::memory_scheduler_client::MemorySchedulerClient::new(ch);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the scheduler did not come up at {address}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_registered_again_after_sigkill_starts_warm() {
    let dir = tempfile::tempdir().unwrap();
    let address = format!("unix:{}", dir.path().join("s.sock").display());
    let g = mlp(128);
    let mut child = start(dir.path());
    let mut c = connect_retry(&address).await;
    let r = register(&mut c, "warm", &g).await;
    let mut plans = subscribe(&mut c, &r).await;
    next_plan(&mut plans).await;
    let a = c
        .report_latencies(report(&r, g.ops().len(), 2e-3))
        .await
        .unwrap()
        .into_inner();
    assert!(a.replanned);
    // Published after the store has the latencies.
    assert_eq!(next_plan(&mut plans).await.version, 2);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let mut child = start(dir.path());
    let mut c = connect_retry(&address).await;
    let r = register(&mut c, "warm again", &g).await;
    let st = c
        .get_status(pb::GetStatusRequest { job_id: r.job_id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.jobs[0].latency_source, "store");
    let mut plans = subscribe(&mut c, &r).await;
    let p = next_plan(&mut plans).await;
    // Planned from 2 ms per op (EWMA weight 0.9 over the roofline).
    let predicted = p.prediction.unwrap().vanilla_iteration_s;
    assert!(predicted > 0.9 * 2e-3 * g.ops().len() as f64, "{predicted}");
    // SIGTERM: a clean exit that removes the socket.
    Command::new("kill")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!dir.path().join("s.sock").exists());
}
