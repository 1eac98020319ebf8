//! The binary at its edge with a person and the tools around it: its
//! sockets' mode, gRPC reflection in both versions, a log without colour
//! codes in a file, decimal MB, and a closed stdout.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio_stream::StreamExt;

fn scheduler() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tensile-scheduler"))
}

/// The binary on one Unix socket in `dir`, its log (at info) in `log`.
fn start(dir: &Path, extra: &[&str], log: &Path) -> Child {
    scheduler()
        .args([
            "--device",
            "a6000",
            "--latency-models",
            "roofline",
            "--state",
            "none",
        ])
        .arg(format!("--listen=unix:{}", dir.join("s.sock").display()))
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// Waits until `log` says the scheduler listens.
fn wait_listening(child: &mut Child, log: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains("listening on") {
            return text;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the scheduler ended ({status}): {text}");
        }
        assert!(
            Instant::now() < deadline,
            "not listening within 30 s: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop(mut child: Child) {
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_takes_the_mode_asked_for_and_the_log_file_has_no_colour() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut child = start(
        dir.path(),
        &["--socket-mode", "0660", "--budget-mb", "1500.5"],
        &log,
    );
    let text = wait_listening(&mut child, &log);
    let mode = std::fs::metadata(dir.path().join("s.sock"))
        .unwrap()
        .permissions()
        .mode();
    // The decimal budget, exactly.
    let mut c =
        crate::util::connect(&format!("unix:{}", dir.path().join("s.sock").display())).await;
    let status = c
        .get_status(tensile_proto::pb::GetStatusRequest { job_id: 0 })
        .await
        .unwrap()
        .into_inner();
    stop(child);
    assert_eq!(mode & 0o777, 0o660, "mode {:o}", mode & 0o777);
    assert_eq!(status.memory.unwrap().budget_bytes, 1_500_500_000);
    // Written to a file, not a terminal: no ANSI escapes.
    assert!(
        !text.contains('\x1b'),
        "colour codes in the log file: {text:?}"
    );
    // And a mode of another socket, to see it is the flag that sets it.
    let log = dir.path().join("log2");
    let mut child = start(dir.path(), &["--socket-mode", "600"], &log);
    wait_listening(&mut child, &log);
    let mode = std::fs::metadata(dir.path().join("s.sock"))
        .unwrap()
        .permissions()
        .mode();
    stop(child);
    assert_eq!(mode & 0o777, 0o600, "mode {:o}", mode & 0o777);
}

#[test]
fn bad_modes_and_sizes_are_refused_by_name() {
    for (args, says) in [
        (&["--socket-mode", "0999"][..], "--socket-mode"),
        (&["--socket-mode", "rw-rw----"], "not a file mode"),
        (&["--socket-mode", "01777"], "at most 0777"),
        (&["--socket-mode", "0066"], "owner read and write"),
        (&["--budget-mb", "1.5.0"], "--budget-mb"),
        (&["--budget-mb", "-300"], "is negative"),
        (&["--max-graph-mb", "0"], "above 0"),
        (&["--max-graph-mb", "5000"], "at most 4096"),
    ] {
        let out = scheduler()
            .args([
                "--listen",
                "unix:/nonexistent/never.sock",
                "--state",
                "none",
            ])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("invalid digit"), "{args:?}: {err}");
    }
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = scheduler()
        .arg("endpoint")
        .env("TENSILE_SERVER", "unix:/run/tensile/gpu0.sock")
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}

/// The services a reflection client of either version lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_answers_in_v1_and_v1alpha() {
    use tonic_reflection::pb::{v1, v1alpha};
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut child = start(dir.path(), &[], &log);
    wait_listening(&mut child, &log);
    let uri = tensile_proto::endpoint::client_uri(Some(&format!(
        "unix:{}",
        dir.path().join("s.sock").display()
    )));
    let channel = tonic::transport::Endpoint::from_shared(uri)
        .unwrap()
        .connect()
        .await
        .unwrap();

    let mut c = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut answers = c
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let v1_services: Vec<String> = match answers.next().await.unwrap().unwrap().message_response {
        Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(l)) => {
            l.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("v1: {other:?}"),
    };

    let mut c = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut answers = c
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let v1alpha_services: Vec<String> =
        match answers.next().await.unwrap().unwrap().message_response {
            Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(l)) => {
                l.service.into_iter().map(|s| s.name).collect()
            }
            other => panic!("v1alpha: {other:?}"),
        };
    stop(child);
    for services in [&v1_services, &v1alpha_services] {
        assert!(
            services.iter().any(|s| s == "tensile.v1.MemoryScheduler"),
            "{services:?}"
        );
        assert!(
            services.iter().any(|s| s == "grpc.health.v1.Health"),
            "{services:?}"
        );
    }
    assert_eq!(v1_services, v1alpha_services);
}

/// A gauge's value on a metrics page.
fn gauge(page: &str, name: &str) -> f64 {
    crate::util::metric_samples(page)
        .into_iter()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} on the page: {page}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_count_the_heap_and_the_graphs_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = start(
        dir.path(),
        &[&format!("--metrics-listen=127.0.0.1:{port}")],
        &log,
    );
    wait_listening(&mut child, &log);
    let allocated = "tensile_scheduler_heap_allocated_bytes";
    let resident = "tensile_scheduler_heap_resident_bytes";
    let before = crate::util::scrape(port).await;
    let a0 = gauge(&before, allocated);
    assert!(a0 > 0.0 && gauge(&before, resident) >= a0, "{before}");
    // Four DenseNet-121 graphs at batch 2 (over a megabyte each on the
    // heap) held for their jobs.
    let g =
        tensile_graph::zoo::build("densenet121", &tensile_graph::zoo::ZooConfig::new(2)).unwrap();
    let mut c =
        crate::util::connect(&format!("unix:{}", dir.path().join("s.sock").display())).await;
    for k in 0..4 {
        crate::util::register(&mut c, &format!("d{k}"), &g).await;
    }
    let after = crate::util::scrape(port).await;
    let a1 = gauge(&after, allocated);
    assert!(
        a1 - a0 > 4e6,
        "the heap grew by {} bytes holding four graphs",
        a1 - a0
    );
    assert!(gauge(&after, resident) >= a1, "{after}");
    stop(child);
}
