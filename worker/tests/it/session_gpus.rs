//! The worker's session finds its GPU's socket: a scheduler serving two
//! simulated GPUs (the library, in this process, configured as the binary
//! would be by `--gpus 0,1`), and the worker binary, given GPU 1 through
//! `CUDA_VISIBLE_DEVICES` and no `--scheduler`, registers and reports on
//! GPU 1's socket only.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tensile_graph::builder::Optimizer;
use tensile_proto::endpoint::GpusFile;
use tensile_scheduler::cli::{Args, Serve};

use crate::{mlp, timing};

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The metrics as text.
fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics");
    conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .expect("request");
    let mut body = String::new();
    conn.read_to_string(&mut body).expect("response");
    body
}

fn wait_for_gpus_json(dir: &Path) -> GpusFile {
    for _ in 0..600 {
        if let Some(f) = GpusFile::read(dir).expect("a valid gpus.json") {
            return f;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no gpus.json in {} within 30 s", dir.display());
}

#[test]
fn session_of_a_worker_given_gpu_1_registers_on_gpu1_sock() {
    let _t = timing();
    let scratch =
        Scratch(std::env::temp_dir().join(format!("tensile-worker-gpus-{}", std::process::id())));
    let dir = scratch.0.clone();
    std::fs::create_dir_all(&dir).expect("temp dir");
    let port = free_port();
    let resolved = Args {
        gpus: Some("0,1".into()),
        socket_dir: Some(dir.clone()),
        device: Some("a6000".into()),
        budget_mb: Some(tensile_cli::Mb::whole(2000)),
        latency_models: Some("roofline".into()),
        state: Some("none".into()),
        metrics_listen: Some(format!("127.0.0.1:{port}")),
        ..Args::default()
    }
    // No GPU listed: both simulated, wherever the test runs.
    .resolve_with(&Vec::new)
    .expect("a valid configuration");
    let Serve::Gpus { dir: sockets, gpus } = resolved.serve else {
        panic!("not serving GPUs: {:?}", resolved.serve);
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(async move {
        tensile_scheduler::node::run_gpus(&sockets, &gpus, resolved.config, async {
            let _ = stopped.await;
        })
        .await
    });
    let file = wait_for_gpus_json(&dir);
    assert_eq!(file.gpus.len(), 2);

    let graph = dir.join("mlp.json");
    let g = mlp(16, 32, 2, Optimizer::sgd());
    std::fs::write(&graph, tensile_graph::json::to_string(&g)).expect("graph file");
    let out = Command::new(env!("CARGO_BIN_EXE_tensile-worker"))
        .arg("--graph")
        .arg(&graph)
        .args(["--iterations", "2", "--threads", "1", "--name", "on-gpu1"])
        .env("CUDA_VISIBLE_DEVICES", "1")
        .env("TENSILE_SOCKET_DIR", &dir)
        .env_remove("TENSILE_SERVER")
        .env_remove("NVIDIA_VISIBLE_DEVICES")
        .output()
        .expect("the worker runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let gpu1 = format!("scheduler: unix:{}", dir.join("gpu1.sock").display());
    assert!(stderr.contains(&gpu1), "{stderr}");
    // Its two reports went to GPU 1's planning domain, none to GPU 0's.
    let body = scrape(port);
    for line in [
        "tensile_scheduler_reports_total{gpu=\"1\"} 2",
        "tensile_scheduler_reports_total{gpu=\"0\"} 0",
    ] {
        assert!(body.lines().any(|l| l == line), "no {line:?} in\n{body}");
    }

    // A GPU the scheduler does not serve is a clear error at once.
    let out = Command::new(env!("CARGO_BIN_EXE_tensile-worker"))
        .arg("--graph")
        .arg(&graph)
        .args(["--iterations", "1"])
        .env("CUDA_VISIBLE_DEVICES", "5")
        .env("TENSILE_SOCKET_DIR", &dir)
        .env_remove("TENSILE_SERVER")
        .output()
        .expect("the worker runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("CUDA_VISIBLE_DEVICES entry \"5\"") && stderr.contains("sim-1"),
        "{stderr}"
    );

    let _ = stop.send(());
    rt.block_on(server)
        .expect("the scheduler task")
        .expect("a clean shutdown");
    assert!(!dir.join("gpus.json").exists());
}
