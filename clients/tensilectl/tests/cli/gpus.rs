//! `tensilectl status | budget | watch` against a scheduler serving two
//! (simulated) GPUs: the library in this process, configured as the binary
//! is by `--gpus 0,1`, and the commands with no `--server`.

use std::process::{Command, Output};
use std::time::Duration;

use tensile_graph::DType;
use tensile_graph::builder::{Builder, Optimizer};
use tensile_proto::endpoint::GpusFile;
use tensile_proto::pb;
use tensile_proto::pb::memory_scheduler_client::MemorySchedulerClient;
use tensile_scheduler::cli::{Args, Serve};

use super::{TempDir, text};

/// `tensilectl ARGS` finding the scheduler through `dir` alone.
fn ctl(dir: &TempDir, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tensilectl"))
        .args(args)
        .env("TENSILE_SOCKET_DIR", &dir.0)
        .env_remove("TENSILE_SERVER")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("NVIDIA_VISIBLE_DEVICES")
        .output()
        .unwrap()
}

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A scheduler serving two simulated GPUs in this process, configured as
/// the binary is by `--gpus 0,1` (the a6000 profile, roofline latencies,
/// nothing stored), its sockets and gpus.json in a directory; started once
/// gpus.json is written.
pub(super) struct Node {
    pub(super) rt: tokio::runtime::Runtime,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), tensile_scheduler::RunError>>,
}

impl Node {
    pub(super) fn start(dir: &TempDir, budget_mb: Option<tensile_cli::Mb>) -> Node {
        let resolved = Args {
            gpus: Some("0,1".into()),
            socket_dir: Some(dir.0.clone()),
            device: Some("a6000".into()),
            budget_mb,
            latency_models: Some("roofline".into()),
            state: Some("none".into()),
            lease_s: Some(600.0),
            ..Args::default()
        }
        .resolve_with(&Vec::new)
        .unwrap();
        let Serve::Gpus { dir: sockets, gpus } = resolved.serve else {
            panic!("{:?}", resolved.serve)
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = rt.spawn(async move {
            tensile_scheduler::node::run_gpus(&sockets, &gpus, resolved.config, async {
                let _ = stopped.await;
            })
            .await
        });
        let mut tries = 0;
        while GpusFile::read(&dir.0).unwrap().is_none() {
            tries += 1;
            assert!(tries < 600, "no gpus.json within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Node { rt, stop, server }
    }

    /// Stops the scheduler and waits for it to end cleanly.
    pub(super) fn stop(self) {
        let _ = self.stop.send(());
        self.rt.block_on(self.server).unwrap().unwrap();
    }
}

type Client = MemorySchedulerClient<tonic::transport::Channel>;

/// A job registered on `socket` (kept by its lease while the test runs),
/// with the client.
async fn register(socket: &std::path::Path, name: &str) -> (Client, pb::RegisterJobResponse) {
    let uri = format!("unix://{}", socket.display());
    let ch = tonic::transport::Endpoint::from_shared(uri)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut b = Builder::new("mlp");
    let x = b.input("x", vec![64, 32], DType::F32);
    let y = b.input("y", vec![64], DType::I64);
    let h = b.linear("fc", x, 32, false);
    let logits = b.linear("head", h, 10, false);
    let loss = b.cross_entropy("loss", logits, y);
    let g = b.finish(loss, Optimizer::sgd()).unwrap();
    let mut c = MemorySchedulerClient::new(ch);
    let r = c
        .register_job(pb::RegisterJobRequest {
            name: name.into(),
            graph: Some(tensile_proto::convert::graph_to_proto(&g)),
            settings: None,
            op_latency_s: Vec::new(),
            process: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    (c, r)
}

#[test]
fn status_shows_every_gpu_and_budget_and_watch_pick_theirs() {
    let dir = TempDir::new("gpus");
    let node = Node::start(&dir, Some(tensile_cli::Mb::whole(800)));
    let rt = &node.rt;
    let (mut client, registered) = rt.block_on(register(&dir.0.join("gpu1.sock"), "on-gpu1"));
    let job = registered.job_id;

    // Every GPU, a section each; the job only in GPU 1's.
    let out = ctl(&dir, &["status"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let at = |s: &str| {
        stdout
            .find(s)
            .unwrap_or_else(|| panic!("no {s:?} in\n{stdout}"))
    };
    let (gpu0, gpu1, name) = (
        at("GPU 0 (simulated a6000, sim-0) on unix:"),
        at("GPU 1 (simulated a6000, sim-1) on unix:"),
        at("on-gpu1"),
    );
    assert!(gpu0 < gpu1 && gpu1 < name, "{stdout}");
    assert_eq!(stdout.matches("budget 800 MB").count(), 2, "{stdout}");
    let v = json(&ctl(&dir, &["status", "--json"]));
    let sections = v["gpus"].as_array().unwrap();
    assert_eq!(sections.len(), 2);
    assert_eq!(sections[0]["uuid"], "sim-0");
    assert_eq!(sections[0]["status"]["jobs"].as_array().unwrap().len(), 0);
    assert_eq!(sections[1]["status"]["jobs"][0]["name"], "on-gpu1");
    assert_eq!(sections[1]["status"]["budget_bytes"], 800_000_000);
    // Its base: the device profile's until its reports measure one.
    let j = &sections[1]["status"]["jobs"][0];
    assert_eq!(
        (
            &j["base_bytes"],
            &j["base_source"],
            &j["reported_base_bytes"]
        ),
        (&536_870_912.into(), &"profile".into(), &0.into())
    );
    assert!(stdout.contains("536.87 MB profile"), "{stdout}");
    // One GPU: as a single scheduler's status; one job: its GPU's section.
    let v = json(&ctl(&dir, &["status", "--json", "--gpu", "sim-1"]));
    assert_eq!(v["jobs"][0]["job_id"], job);
    let v = json(&ctl(&dir, &["status", "--json", "--job", &job.to_string()]));
    let sections = v["gpus"].as_array().unwrap();
    assert_eq!(sections.len(), 1);
    assert_eq!(sections[0]["index"], 1);

    // A budget needs its GPU when there are several; then it is that GPU's.
    let out = ctl(&dir, &["budget", "600"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("serves 2 GPUs") && text(&out.stderr).contains("--gpu"),
        "{}",
        text(&out.stderr)
    );
    // In decimal MB, as a person types it, and read back in MB.
    let out = ctl(&dir, &["budget", "600.5", "--gpu", "0"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("budget set to 600.5 MB"),
        "{}",
        text(&out.stdout)
    );
    let v = json(&ctl(&dir, &["status", "--json"]));
    assert_eq!(v["gpus"][0]["status"]["budget_bytes"], 600_500_000);
    assert_eq!(v["gpus"][1]["status"]["budget_bytes"], 800_000_000);

    // A GPU it does not serve is named, with those it does.
    let out = ctl(&dir, &["status", "--gpu", "7"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--gpu 7") && err.contains("1 sim-1"), "{err}");

    // `watch` finds the GPU that has the job, and sees it go.
    let mut watch = Command::new(env!("CARGO_BIN_EXE_tensilectl"))
        .args(["watch", &job.to_string()])
        .env("TENSILE_SOCKET_DIR", &dir.0)
        .env_remove("TENSILE_SERVER")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(watch.stdout.take().unwrap()));
    // Its first line: it has found the job.
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains("\"on-gpu1\""), "{first}");
    rt.block_on(client.unregister_job(pb::UnregisterJobRequest {
        job_id: job,
        token: registered.token,
    }))
    .unwrap();
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(watch.wait().unwrap().success());
    assert_eq!(
        rest.last().map(String::as_str),
        Some(format!("job {job} is gone").as_str()),
        "{rest:?}"
    );

    node.stop();
}
