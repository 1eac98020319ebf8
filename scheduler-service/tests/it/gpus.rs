//! The real binary serving two (simulated) GPUs: a socket each, gpus.json,
//! jobs, budgets and metrics per GPU, and a shutdown that removes what it
//! made.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tensile_proto::endpoint::GpusFile;
use tensile_proto::pb;

use crate::util::*;

const BUDGET_MB: u64 = 900;

/// `--gpus 0,1` on a machine whose nvidia-smi is out of reach (an empty
/// PATH), so that both GPUs are simulated wherever the test runs.
fn start(dir: &Path, metrics_port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_tensile-scheduler"))
        .args(["--gpus", "0,1", "--device", "a6000"])
        .args(["--latency-models", "roofline", "--state", "none"])
        .arg(format!("--budget-mb={BUDGET_MB}"))
        .arg(format!("--socket-dir={}", dir.display()))
        .arg(format!("--metrics-listen=127.0.0.1:{metrics_port}"))
        .env("PATH", "/nonexistent")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// gpus.json, once the scheduler has written it (within 30 s).
async fn manifest(dir: &Path, child: &mut Child) -> GpusFile {
    for _ in 0..600 {
        if let Some(f) = GpusFile::read(dir).unwrap() {
            return f;
        }
        assert!(child.try_wait().unwrap().is_none(), "the scheduler exited");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no gpus.json in {} within 30 s", dir.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_serves_each_gpu_on_its_own_socket() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = start(dir.path(), port);
    let file = manifest(dir.path(), &mut child).await;
    let listed: Vec<_> = file
        .gpus
        .iter()
        .map(|g| (g.index, g.uuid.as_str(), g.socket.as_str(), g.budget_bytes))
        .collect();
    let budget = BUDGET_MB * 1_000_000;
    assert_eq!(
        listed,
        [
            (0, "sim-0", "gpu0.sock", budget),
            (1, "sim-1", "gpu1.sock", budget)
        ]
    );
    assert!(file.gpus.iter().all(|g| g.name == "simulated a6000"));
    let address = |i: usize| format!("unix:{}", dir.path().join(&file.gpus[i].socket).display());
    let mut gpu0 = connect(&address(0)).await;
    let mut gpu1 = connect(&address(1)).await;

    // A job on GPU 1 is GPU 1's only.
    let g = mlp(128);
    let r = register(&mut gpu1, "on-gpu1", &g).await;
    let mut plans = subscribe(&mut gpu1, &r).await;
    next_plan(&mut plans).await;
    gpu1.report_latencies(report(&r, g.ops().len(), 1e-3))
        .await
        .unwrap();
    let (s0, s1) = (status(&mut gpu0).await, status(&mut gpu1).await);
    assert!(s0.jobs.is_empty(), "{s0:?}");
    assert_eq!(
        s1.jobs.iter().map(|j| j.name.as_str()).collect::<Vec<_>>(),
        ["on-gpu1"]
    );
    // GPU 0 does not know GPU 1's job, even by its id.
    let err = gpu0
        .get_status(pb::GetStatusRequest { job_id: r.job_id })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);

    // Budgets are each GPU's own.
    gpu0.set_memory_budget(pb::SetMemoryBudgetRequest {
        budget_bytes: 500_000_000,
        admin_token: String::new(),
    })
    .await
    .unwrap();
    let (s0, s1) = (status(&mut gpu0).await, status(&mut gpu1).await);
    assert_eq!(s0.memory.unwrap().budget_bytes, 500_000_000);
    assert_eq!(s1.memory.unwrap().budget_bytes, budget);
    // gpus.json follows.
    let file = GpusFile::read(dir.path()).unwrap().unwrap();
    assert_eq!(
        file.gpus.iter().map(|g| g.budget_bytes).collect::<Vec<_>>(),
        [500_000_000, budget]
    );

    // One metrics endpoint, a series per GPU.
    let body = scrape(port).await;
    for line in [
        "tensile_scheduler_budget_bytes{gpu=\"0\"} 500000000".to_string(),
        format!("tensile_scheduler_budget_bytes{{gpu=\"1\"}} {budget}"),
        "tensile_scheduler_reports_total{gpu=\"0\"} 0".to_string(),
        "tensile_scheduler_reports_total{gpu=\"1\"} 1".to_string(),
        "tensile_scheduler_replans_total{gpu=\"0\",reason=\"budget\"} 1".to_string(),
        "tensile_scheduler_replans_total{gpu=\"1\",reason=\"first_measurements\"} 1".to_string(),
    ] {
        assert!(body.lines().any(|l| l == line), "no {line:?} in\n{body}");
    }
    // Every series says its GPU but the heap's (the process's), and both
    // GPUs have each metric.
    let samples = metric_samples(&body);
    assert!(samples.len() > 20, "{body}");
    assert!(
        samples
            .iter()
            .all(|l| l.contains("gpu=\"") || l.starts_with("tensile_scheduler_heap_")),
        "{body}"
    );
    for gpu in ["gpu=\"0\"", "gpu=\"1\""] {
        let mut names: Vec<&str> = samples
            .iter()
            .filter(|l| l.contains(gpu))
            .filter_map(|l| l.split('{').next())
            .collect();
        names.dedup();
        assert!(names.len() >= 17, "{gpu}: {names:?}");
    }
    // Each metric is one family (one TYPE line), whatever the GPUs.
    assert_eq!(
        body.matches("# TYPE tensile_scheduler_reports counter")
            .count(),
        1,
        "{body}"
    );

    // SIGTERM: a clean exit that removes the sockets and gpus.json.
    drop((gpu0, gpu1, plans));
    let status = Command::new("kill")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
    let exit = child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
    for name in ["gpu0.sock", "gpu1.sock", "gpus.json"] {
        assert!(!dir.path().join(name).exists(), "{name} is left");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_and_listen_together_are_refused_by_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_tensile-scheduler"))
        .args(["--gpus", "0,1", "--listen", "unix:/tmp/never.sock"])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--listen") && err.contains("--gpus") && err.contains("cannot go together"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_device_scheduler_clears_a_dead_gpus_json() {
    let dir = tempfile::tempdir().unwrap();
    let stale = r#"{"gpus": [{"index": 0, "uuid": "sim-0", "name": "x", "memory_bytes": 1, "budget_bytes": 1, "socket": "gpu0.sock"}]}"#;
    std::fs::write(dir.path().join("gpus.json"), stale).unwrap();
    let s = run_on(dir.path()).await;
    let mut cleared = false;
    for _ in 0..200 {
        cleared = !dir.path().join("gpus.json").exists();
        if cleared {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(cleared, "the dead gpus.json is still there");
    s.stop().await;
}

/// A single-device scheduler on `dir/scheduler.sock`.
async fn run_on(dir: &Path) -> Server {
    use tensile_scheduler::{ListenAddr, Listener};
    let l = Listener::bind(&ListenAddr::Unix(dir.join("scheduler.sock")))
        .await
        .unwrap();
    start_listener(l, config()).await
}
