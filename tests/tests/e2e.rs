//! End to end over real processes and a real socket: `tensile-scheduler`
//! and `tensile-worker`s as a user runs them, on a Unix socket in a
//! temporary folder.
//!
//! - Three workers on one scheduler, under a budget their vanilla peaks
//!   exceed together, finish with parameters bit-identical to their
//!   standalone vanilla runs.
//! - `kill -9` of a worker: its job is dropped within the lease and the
//!   others receive new plans.
//! - `kill -9` of the scheduler mid-run and a restart on the same socket
//!   and store: the worker keeps training, registers again, and finishes
//!   with bit-identical parameters.
//! - A fault run: copies failing, a worker hung (SIGSTOP) past its lease
//!   and resumed, a worker killed, the scheduler killed and restarted, and
//!   a client flooding reports, all at once: the surviving workers end
//!   bit-identical to their vanilla runs, the scheduler never panics, and
//!   no job is left behind.
//! - `--copies 2`: two copies of a job in one worker process are two jobs
//!   at the scheduler, each trains bit-identical to its vanilla run, and
//!   together they hold the budget they share; `--job` twice: two different
//!   models in one process, whose base the scheduler counts once, likewise.
//! - `tensilectl demo`, the main command, on small jobs: the planned jobs
//!   together (on one memory ledger) stay within the budget at every
//!   moment, vanilla capped at the planned runs' memory runs out, and the
//!   summary and plot come out.
//!
//! The binaries are the workspace's own (`cargo test --workspace` builds
//! them, since their packages have tests of their own); a missing one is a
//! failure that says how to build it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tensile_graph::Liveness;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_proto::pb;

fn bin(name: &str) -> PathBuf {
    // target/debug/deps/e2e-HASH -> target/debug
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(Path::parent).expect("target folder");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build -p {}` (cargo test --workspace builds it)",
        path.display(),
        name
    );
    path
}

/// A child process killed (SIGKILL) when dropped, so that a failing test
/// leaves nothing running.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Scheduler {
    proc: Proc,
    socket: PathBuf,
}

fn start_scheduler(dir: &Path, budget_mb: u64, lease_s: f64) -> Scheduler {
    let socket = dir.join("scheduler.sock");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("scheduler.log"))
        .expect("scheduler log");
    let child = Command::new(bin("tensile-scheduler"))
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .arg("--state")
        .arg(dir.join("state"))
        .args(["--budget-mb", &budget_mb.to_string()])
        // This CPU's calibrated profile: no fixed per-job context memory,
        // unlike a GPU's.
        .args(["--device", "cpu"])
        .args(["--lease-s", &lease_s.to_string()])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start tensile-scheduler");
    let proc = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    // A restarted scheduler replaces the stale socket: wait until it answers.
    while !answers(&socket) {
        assert!(
            Instant::now() < deadline,
            "tensile-scheduler did not answer within 60 s: {}",
            std::fs::read_to_string(dir.join("scheduler.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Scheduler { proc, socket }
}

type Client = pb::memory_scheduler_client::MemorySchedulerClient<tonic::transport::Channel>;

/// A client of the scheduler on `socket`, with no message size limits.
async fn connect(socket: &Path) -> Result<Client, String> {
    let uri = tensile_proto::endpoint::client_uri(Some(&format!("unix:{}", socket.display())));
    let channel = tonic::transport::Endpoint::from_shared(uri)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    Ok(Client::new(channel)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX))
}

fn status(socket: &Path) -> Result<pb::GetStatusResponse, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut client = connect(socket).await?;
        client
            .get_status(pb::GetStatusRequest { job_id: 0 })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|e| e.to_string())
    })
}

fn answers(socket: &Path) -> bool {
    socket.exists() && status(socket).is_ok()
}

#[derive(Clone)]
struct Job {
    model: &'static str,
    batch: u64,
    resolution: u64,
    seed: u64,
}

impl Job {
    fn name(&self) -> String {
        format!(
            "{}-b{}-r{}-s{}",
            self.model, self.batch, self.resolution, self.seed
        )
    }

    fn vanilla_peak(&self) -> u64 {
        let config = ZooConfig {
            resolution: Some(self.resolution),
            ..ZooConfig::new(self.batch)
        };
        let g = zoo::build(self.model, &config).expect("zoo model");
        Liveness::analyze(&g).vanilla_footprint().peak
    }

    /// Starts the worker; `policy` is `--vanilla` or `--scheduler ADDR`.
    fn spawn(&self, dir: &Path, tag: &str, iterations: usize, policy: &[String]) -> Proc {
        let base = dir.join(format!("{tag}-{}", self.name()));
        let child = Command::new(bin("tensile-worker"))
            .args(["--model", self.model])
            .args(["--batch", &self.batch.to_string()])
            .args(["--resolution", &self.resolution.to_string()])
            .args(["--seed", &self.seed.to_string()])
            .args(["--iterations", &iterations.to_string()])
            .args(["--threads", "1", "--link-gbps", "2", "--json"])
            .args(["--name", &self.name()])
            .arg("--save-params")
            .arg(base.with_extension("safetensors"))
            .args(policy)
            .env("RUST_BACKTRACE", "0")
            .stdout(std::fs::File::create(base.with_extension("jsonl")).expect("stdout file"))
            .stderr(std::fs::File::create(base.with_extension("log")).expect("stderr file"))
            .spawn()
            .expect("start tensile-worker");
        Proc(child)
    }
}

fn wait_ok(mut p: Proc, what: &str, log: &Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = p.0.try_wait().expect("wait") {
            assert!(
                status.success(),
                "{what} failed ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} still running after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn file(dir: &Path, tag: &str, job: &Job, ext: &str) -> PathBuf {
    dir.join(format!("{tag}-{}.{ext}", job.name()))
}

fn same_params(dir: &Path, a: &str, b: &str, job: &Job) {
    let x = std::fs::read(file(dir, a, job, "safetensors")).expect("parameters");
    let y = std::fs::read(file(dir, b, job, "safetensors")).expect("parameters");
    assert!(
        x == y,
        "{}: parameters of the {a} run differ from the {b} run",
        job.name()
    );
}

fn swapped_bytes(dir: &Path, tag: &str, job: &Job) -> u64 {
    let text = std::fs::read_to_string(file(dir, tag, job, "jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("swapped_bytes").and_then(serde_json::Value::as_u64))
        .sum()
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tensile-e2e-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

const LIMIT: Duration = Duration::from_secs(300);

/// The tests run one at a time: each starts several processes that train,
/// and the machines that run CI have two cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn three_workers_on_one_scheduler_match_their_standalone_vanilla_runs() {
    let _serial = one_at_a_time();
    let dir = tempdir();
    let jobs = [
        Job {
            model: "resnet50",
            batch: 2,
            resolution: 32,
            seed: 1,
        },
        Job {
            model: "densenet121",
            batch: 2,
            resolution: 32,
            seed: 2,
        },
        Job {
            model: "resnet50",
            batch: 2,
            resolution: 48,
            seed: 3,
        },
    ];
    let vanilla_sum: u64 = jobs.iter().map(Job::vanilla_peak).sum();
    let budget_mb = vanilla_sum * 6 / 10 / 1_000_000;
    let sched = start_scheduler(&dir, budget_mb, 10.0);
    let server = vec![
        "--scheduler".to_string(),
        format!("unix:{}", sched.socket.display()),
    ];
    let planned: Vec<Proc> = jobs
        .iter()
        .map(|j| j.spawn(&dir, "planned", 3, &server))
        .collect();
    for (p, j) in planned.into_iter().zip(&jobs) {
        wait_ok(p, &j.name(), &file(&dir, "planned", j, "log"), LIMIT);
    }
    for j in &jobs {
        let vanilla = j.spawn(&dir, "vanilla", 3, &["--vanilla".to_string()]);
        wait_ok(vanilla, &j.name(), &file(&dir, "vanilla", j, "log"), LIMIT);
        same_params(&dir, "planned", "vanilla", j);
        let log = std::fs::read_to_string(file(&dir, "planned", j, "log")).unwrap_or_default();
        assert!(
            log.contains("scheduler: plan version"),
            "{}: no plan applied: {log}",
            j.name()
        );
    }
    let swapped: u64 = jobs.iter().map(|j| swapped_bytes(&dir, "planned", j)).sum();
    assert!(
        swapped > 0,
        "under a budget 40% below vanilla, the plans moved nothing"
    );
    // Every job left when it finished.
    let left = status(&sched.socket).expect("status");
    assert!(
        left.jobs
            .iter()
            .all(|j| j.state == pb::JobState::Done as i32),
        "{left:?}"
    );
    drop(sched);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_worker_is_dropped_within_its_lease_and_the_others_replanned() {
    let _serial = one_at_a_time();
    let dir = tempdir();
    let a = Job {
        model: "resnet50",
        batch: 2,
        resolution: 32,
        seed: 4,
    };
    let b = Job {
        model: "resnet50",
        batch: 2,
        resolution: 48,
        seed: 5,
    };
    let budget_mb = (a.vanilla_peak() + b.vanilla_peak()) * 7 / 10 / 1_000_000;
    let lease_s = 2.0;
    let sched = start_scheduler(&dir, budget_mb, lease_s);
    let server = vec![
        "--scheduler".to_string(),
        format!("unix:{}", sched.socket.display()),
    ];
    let mut pa = a.spawn(&dir, "long", 100_000, &server);
    let _pb = b.spawn(&dir, "long", 100_000, &server);
    // Both admitted and planned.
    let deadline = Instant::now() + Duration::from_secs(120);
    let version_of = |s: &pb::GetStatusResponse, name: &str| {
        s.jobs
            .iter()
            .find(|j| j.name == name && j.state == pb::JobState::Active as i32)
            .map(|j| j.plan_version)
    };
    let before = loop {
        let s = status(&sched.socket).expect("status");
        if let (Some(_), Some(vb)) = (version_of(&s, &a.name()), version_of(&s, &b.name())) {
            break vb;
        }
        assert!(Instant::now() < deadline, "jobs not both planned: {s:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    pa.0.kill().expect("kill -9 the worker");
    let killed = Instant::now();
    loop {
        let s = status(&sched.socket).expect("status");
        let a_gone = !s
            .jobs
            .iter()
            .any(|j| j.name == a.name() && j.state != pb::JobState::Done as i32);
        let b_replanned = version_of(&s, &b.name()).is_some_and(|v| v > before);
        if a_gone && b_replanned {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs_f64(lease_s * 2.0 + 30.0),
            "after {:?}: killed job gone {a_gone}, other job re-planned {b_replanned}: {s:?}",
            killed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(sched);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_restarted_scheduler_gets_the_worker_back_and_nothing_is_lost() {
    let _serial = one_at_a_time();
    let dir = tempdir();
    let job = Job {
        model: "resnet50",
        batch: 2,
        resolution: 32,
        seed: 6,
    };
    let budget_mb = job.vanilla_peak() * 7 / 10 / 1_000_000;
    let mut sched = start_scheduler(&dir, budget_mb, 10.0);
    let server = vec![
        "--scheduler".to_string(),
        format!("unix:{}", sched.socket.display()),
    ];
    let iterations = 40;
    let worker = job.spawn(&dir, "restart", iterations, &server);
    let log = file(&dir, "restart", &job, "log");
    let jsonl = file(&dir, "restart", &job, "jsonl");
    let iterations_done = || {
        std::fs::read_to_string(&jsonl)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while iterations_done() < 2 {
        assert!(
            Instant::now() < deadline,
            "the worker did not start training"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // kill -9 the scheduler mid-run; the worker trains on meanwhile.
    sched.proc.0.kill().expect("kill -9 the scheduler");
    let _ = sched.proc.0.wait();
    let at_kill = iterations_done();
    std::thread::sleep(Duration::from_millis(500));
    sched = start_scheduler(&dir, budget_mb, 10.0);
    wait_ok(worker, "worker across a scheduler restart", &log, LIMIT);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.matches("scheduler: registered as job").count() >= 2,
        "the worker did not register again: {text}"
    );
    assert!(
        at_kill < iterations,
        "the worker finished before the scheduler was killed: make it longer"
    );
    assert_eq!(iterations_done(), iterations);
    let vanilla = job.spawn(&dir, "vanilla", iterations, &["--vanilla".to_string()]);
    wait_ok(
        vanilla,
        "vanilla run",
        &file(&dir, "vanilla", &job, "log"),
        LIMIT,
    );
    same_params(&dir, "restart", "vanilla", &job);
    drop(sched);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_demo_keeps_its_jobs_within_the_budget_they_share() {
    let _serial = one_at_a_time();
    let dir = tempdir();
    let plot = dir.join("demo.svg");
    let tensilectl = bin("tensilectl");
    let bins = tensilectl.parent().expect("bin folder").to_path_buf();
    let out = Command::new(&tensilectl)
        .args(["demo", "--jobs", "resnet50:2:32,resnet50:2:32"])
        .args(["--iterations", "12", "--budget-fraction", "0.75"])
        .arg("--plot")
        .arg(&plot)
        .arg("--bin-dir")
        .arg(&bins)
        .stdin(Stdio::null())
        .output()
        .expect("tensilectl demo runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let held = text
        .lines()
        .find(|l| l.starts_with("planned, the jobs together held at most"))
        .unwrap_or_else(|| panic!("no measured total in:\n{text}"));
    assert!(held.ends_with("within the budget"), "{held}");
    assert!(
        text.contains("out of device memory"),
        "vanilla at the planned runs' memory should run out:\n{text}"
    );
    assert!(
        text.contains("one after another without plans"),
        "no wall-time comparison:\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("gates: a period of ") || l.starts_with("no gates: ")),
        "the summary does not say what the gates did:\n{text}"
    );
    let svg = std::fs::read_to_string(&plot).expect("the plot is written");
    assert!(svg.contains("<svg"), "not an SVG");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--base-mb`: the memory a worker's process holds outside its tensors
/// reaches the scheduler, which plans the job with it in the budget; an
/// absurd figure is refused by name, and nothing runs.
#[test]
fn a_workers_measured_base_is_planned_in_the_budget() {
    let _serial = one_at_a_time();
    let dir = tempdir();
    let sched = start_scheduler(&dir, 4000, 10.0);
    let server = format!("unix:{}", sched.socket.display());
    // One job per run (the seed tells them apart in the status).
    let run = |seed: u64, base: Option<&str>, iterations: usize| {
        let job = Job {
            model: "resnet50",
            batch: 2,
            resolution: 32,
            seed,
        };
        let mut policy = vec!["--scheduler".to_string(), server.clone()];
        if let Some(mb) = base {
            policy.extend(["--base-mb".to_string(), mb.to_string()]);
        }
        let p = job.spawn(&dir, "base", iterations, &policy);
        (p, file(&dir, "base", &job, "log"), job.name())
    };
    let running = [run(1, None, 20), run(2, Some("40"), 20)];
    // The scheduler forgets a job that is done: read it while both run.
    let deadline = Instant::now() + LIMIT;
    let peaks = loop {
        let s = status(&sched.socket).expect("status");
        let peak = |name: &str| {
            let j = s.jobs.iter().find(|j| j.name == name)?;
            Some(j.prediction.as_ref()?.vanilla_peak_bytes)
        };
        if let (Some(a), Some(b)) = (peak(&running[0].2), peak(&running[1].2)) {
            break (a, b);
        }
        assert!(Instant::now() < deadline, "no plans for both jobs: {s:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    // The CPU profile has no base of its own: 40 MB is all the difference.
    assert_eq!(peaks.1 - peaks.0, 40_000_000);
    for (p, log, name) in running {
        wait_ok(p, &name, &log, LIMIT);
    }
    // 2^64 bytes and more: refused, named, and the worker says so.
    let (mut p, log, _) = run(3, Some("18446744073709"), 1);
    let code = p.0.wait().expect("wait");
    let err = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!code.success(), "an absurd base ran: {err}");
    assert!(err.contains("settings.base_bytes"), "{err}");
    // Zero is not a measurement: the flag refuses it.
    let (mut p, log, _) = run(4, Some("0"), 1);
    let code = p.0.wait().expect("wait");
    let err = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!code.success() && err.contains("--base-mb"), "{err}");
    drop(sched);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A worker's `--memory-trace` file: (seconds, bytes) at every change.
fn trace(path: &Path) -> Vec<(f64, u64)> {
    tensile_executor::trace::parse_csv(&std::fs::read_to_string(path).unwrap_or_default())
}

/// `--copies 2`: one process trains two copies of a job as two jobs of the
/// scheduler (named apart, registered in one process whose base one of
/// them is planned with, the other with none),
/// each copy ends bit-identical to the job's vanilla run alone, and the
/// two hold their storages together within `--memory-mb`, 30% less than
/// their vanilla peaks add up to.
#[test]
fn copies_in_one_process_are_jobs_of_their_own_and_train_as_alone() {
    let _serial = one_at_a_time();
    let dir = tempdir();
    let job = Job {
        model: "resnet50",
        batch: 2,
        resolution: 32,
        seed: 1,
    };
    let peak = job.vanilla_peak();
    let base_mb = 40;
    // The two copies' storages in 70% of what their vanilla peaks add up
    // to, and the process's base beside them.
    let storages_mb = peak * 2 * 7 / 10 / 1_000_000;
    let sched = start_scheduler(&dir, storages_mb + base_mb, 10.0);
    let traces = dir.join("copies.mem");
    let policy: Vec<String> = [
        "--copies",
        "2",
        "--base-mb",
        &base_mb.to_string(),
        "--memory-mb",
        &storages_mb.to_string(),
        "--memory-trace",
        &traces.display().to_string(),
        "--scheduler",
        &format!("unix:{}", sched.socket.display()),
    ]
    .map(String::from)
    .to_vec();
    let p = job.spawn(&dir, "copies", 4, &policy);
    let log = file(&dir, "copies", &job, "log");
    // Both copies are jobs of the scheduler, one planned with the
    // process's base and the other with none (the CPU profile has none of
    // its own).
    let names = [0, 1].map(|i| format!("{}-{i}", job.name()));
    let deadline = Instant::now() + LIMIT;
    let planned = loop {
        let s = status(&sched.socket).expect("status");
        let peaks: Vec<u64> = names
            .iter()
            .filter_map(|n| {
                let j = s.jobs.iter().find(|j| &j.name == n)?;
                Some(j.prediction.as_ref()?.vanilla_peak_bytes)
            })
            .collect();
        if peaks.len() == 2 {
            break peaks;
        }
        assert!(
            Instant::now() < deadline,
            "no plans for both copies: {s:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut planned = planned;
    planned.sort_unstable();
    assert_eq!(planned, vec![peak, peak + base_mb * 1_000_000]);
    wait_ok(p, "two copies", &log, LIMIT);
    let vanilla = job.spawn(&dir, "vanilla", 4, &["--vanilla".to_string()]);
    wait_ok(
        vanilla,
        "vanilla",
        &file(&dir, "vanilla", &job, "log"),
        LIMIT,
    );
    let want = std::fs::read(file(&dir, "vanilla", &job, "safetensors")).expect("parameters");
    for i in 0..2 {
        let path = dir.join(format!("copies-{}.{i}.safetensors", job.name()));
        let got = std::fs::read(&path).expect("a copy's parameters");
        assert!(got == want, "copy {i} trained differently from vanilla");
    }
    // Each JSON line names its copy; both copies ran every iteration and
    // moved bytes to meet the budget.
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(file(&dir, "copies", &job, "jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
    for i in 0..2u64 {
        let mine: Vec<_> = lines
            .iter()
            .filter(|v| v.get("copy").and_then(serde_json::Value::as_u64) == Some(i))
            .collect();
        assert_eq!(mine.len(), 4, "copy {i}: {lines:?}");
    }
    assert!(
        swapped_bytes(&dir, "copies", &job) > 0,
        "under 70% of the copies' vanilla peaks, the plans moved nothing"
    );
    let traces = [0, 1].map(|i| trace(&dir.join(format!("copies.{i}.mem"))));
    let held = tensile_executor::trace::joint_peak(&[&traces[0][..], &traces[1][..]]);
    eprintln!(
        "two copies in one process: together {held} B of {} B",
        storages_mb * 1_000_000
    );
    assert!(held > 0 && held <= storages_mb * 1_000_000);
    drop(sched);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--job` twice: one process trains two different models under the
/// scheduler; they register as jobs of one process, whose base (`--base-mb`)
/// the scheduler plans once, with one of them; each ends bit-identical to
/// its vanilla run alone, and together they hold `--memory-mb`.
#[test]
fn different_jobs_in_one_process_pay_one_base_and_train_as_alone() {
    let _serial = one_at_a_time();
    let dir = tempdir();
    let jobs = [("resnet50", "r"), ("densenet121", "d")].map(|(model, tag)| {
        let job = Job {
            model,
            batch: 2,
            resolution: 32,
            seed: 1,
        };
        (job, tag)
    });
    let base_mb = 200;
    let peaks: u64 = jobs.iter().map(|(j, _)| j.vanilla_peak()).sum();
    let storages_mb = peaks * 7 / 10 / 1_000_000;
    let budget_mb = storages_mb + base_mb;
    let sched = start_scheduler(&dir, budget_mb, 10.0);
    let mut cmd = Command::new(bin("tensile-worker"));
    for (j, tag) in &jobs {
        cmd.arg("--job").arg(format!(
            "model={},batch={},resolution={},seed={},name={tag}",
            j.model, j.batch, j.resolution, j.seed
        ));
    }
    let log = dir.join("both.log");
    let child = cmd
        .args([
            "--iterations",
            "4",
            "--threads",
            "1",
            "--link-gbps",
            "2",
            "--json",
        ])
        .args(["--base-mb", &base_mb.to_string()])
        .args(["--memory-mb", &storages_mb.to_string()])
        .arg("--save-params")
        .arg(dir.join("both.safetensors"))
        .arg("--memory-trace")
        .arg(dir.join("both.mem"))
        .arg("--scheduler")
        .arg(format!("unix:{}", sched.socket.display()))
        .env("RUST_BACKTRACE", "0")
        .stdout(std::fs::File::create(dir.join("both.jsonl")).expect("stdout file"))
        .stderr(std::fs::File::create(&log).expect("stderr file"))
        .spawn()
        .expect("start tensile-worker");
    let p = Proc(child);
    // Both planned: one process, its base on one job.
    let deadline = Instant::now() + LIMIT;
    let seen = loop {
        let s = status(&sched.socket).expect("status");
        let planned: Vec<&pb::JobStatus> = ["r", "d"]
            .iter()
            .filter_map(|n| {
                s.jobs
                    .iter()
                    .find(|j| j.name == *n && j.prediction.is_some())
            })
            .collect();
        if planned.len() == 2 {
            break planned.into_iter().cloned().collect::<Vec<_>>();
        }
        assert!(
            Instant::now() < deadline,
            "no plans for both jobs: {s:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        !seen[0].process.is_empty() && seen[0].process == seen[1].process,
        "{seen:?}"
    );
    let carrier = seen
        .iter()
        .find(|j| j.base_job == j.job_id)
        .expect("a job counts the base");
    let other = seen
        .iter()
        .find(|j| j.job_id != carrier.job_id)
        .expect("two jobs");
    assert_eq!(
        (carrier.base_bytes, carrier.base_source.as_str()),
        (base_mb * 1_000_000, "registered")
    );
    assert_eq!(
        (other.base_bytes, other.base_source.as_str(), other.base_job),
        (0, "process", carrier.job_id)
    );
    let sum: u64 = seen
        .iter()
        .map(|j| j.prediction.as_ref().map_or(0, |p| p.planned_peak_bytes))
        .sum();
    eprintln!(
        "two jobs in one process under {budget_mb} MB: planned peaks add up to {:.1} MB, base {base_mb} MB counted once (job {})",
        sum as f64 / 1e6,
        carrier.job_id
    );
    assert!(sum <= budget_mb * 1_000_000, "{sum} past {budget_mb} MB");
    wait_ok(p, "two jobs", &log, LIMIT);
    let traces = [0, 1].map(|i| trace(&dir.join(format!("both.{i}.mem"))));
    let held = tensile_executor::trace::joint_peak(&[&traces[0][..], &traces[1][..]]);
    assert!(held > 0 && held <= storages_mb * 1_000_000, "{held}");
    for (i, (job, _)) in jobs.iter().enumerate() {
        let vanilla = job.spawn(&dir, "vanilla", 4, &["--vanilla".to_string()]);
        wait_ok(
            vanilla,
            "vanilla",
            &file(&dir, "vanilla", job, "log"),
            LIMIT,
        );
        let want = std::fs::read(file(&dir, "vanilla", job, "safetensors")).expect("parameters");
        let got = std::fs::read(dir.join(format!("both.{i}.safetensors"))).expect("parameters");
        assert!(
            got == want,
            "{} in one process trained differently from alone",
            job.model
        );
    }
    drop(sched);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sends `signal` (`STOP`, `CONT`) to a worker with the system's `kill`.
fn signal(p: &Proc, signal: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(p.0.id().to_string())
        .status()
        .expect("run kill");
    assert!(ok.success(), "kill -{signal} failed");
}

/// A client that registers `graph` and sends valid reports as fast as the
/// scheduler takes them until `stop`, registering again whenever it loses
/// the job; returns how many reports were taken.
fn flood(
    socket: PathBuf,
    graph: tensile_graph::Graph,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    use std::sync::atomic::Ordering;
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let ops = graph.ops().len();
            let proto = tensile_proto::convert::graph_to_proto(&graph);
            let mut taken = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut c) = connect(&socket).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let request = pb::RegisterJobRequest {
                    name: "flood".into(),
                    graph: Some(proto.clone()),
                    settings: None,
                    op_latency_s: Vec::new(),
                    process: String::new(),
                };
                let Ok(job) = c.register_job(request).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let job = job.into_inner();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let report = pb::ReportLatenciesRequest {
                        job_id: job.job_id,
                        token: job.token.clone(),
                        iteration: i,
                        plan_version: 0,
                        op_latency_s: vec![1e-4 * (1 + i % 7) as f64; ops],
                        stall_s: 0.0,
                        late_prefetches: Vec::new(),
                        passive_swaps: 0,
                        peak_bytes: 1,
                        base_bytes: 0,
                    };
                    i += 1;
                    match c.report_latencies(report).await {
                        Ok(_) => taken += 1,
                        // Queued: not taken, and no use sending more now.
                        Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        Err(_) => break,
                    }
                }
                let _ = c
                    .unregister_job(pb::UnregisterJobRequest {
                        job_id: job.job_id,
                        token: job.token.clone(),
                    })
                    .await;
            }
            taken
        })
    })
}

#[test]
fn under_every_fault_at_once_the_survivors_match_vanilla_and_nothing_is_left_behind() {
    let _serial = one_at_a_time();
    let dir = tempdir();
    let job = |seed| Job {
        model: "resnet50",
        batch: 2,
        resolution: 32,
        seed,
    };
    let (faulty, hung, killed) = (job(21), job(22), job(23));
    let lease_s = 2.0;
    let budget_mb = faulty.vanilla_peak() * 2 / 1_000_000;
    let mut sched = start_scheduler(&dir, budget_mb, lease_s);
    let server = format!("unix:{}", sched.socket.display());
    let planned = |extra: &[&str]| -> Vec<String> {
        let mut v = vec!["--scheduler".to_string(), server.clone()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let iterations = 30;
    let a = faulty.spawn(
        &dir,
        "faults",
        iterations,
        &planned(&["--fault-fail-every", "5", "--fault-delay-ms", "2"]),
    );
    let b = hung.spawn(&dir, "faults", iterations, &planned(&[]));
    let c = killed.spawn(&dir, "faults", iterations, &planned(&[]));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooding = flood(
        sched.socket.clone(),
        zoo::build("resnet50", &ZooConfig::new(2)).expect("zoo model"),
        stop.clone(),
    );
    let done = |j: &Job| {
        std::fs::read_to_string(file(&dir, "faults", j, "jsonl"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while done(&hung) < 2 || done(&killed) < 2 {
        assert!(
            Instant::now() < deadline,
            "the workers did not start training"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // B hangs past its lease; C dies; then the scheduler dies and comes
    // back on the same socket and store.
    signal(&b, "STOP");
    let stopped = Instant::now();
    drop(c);
    std::thread::sleep(Duration::from_millis(500));
    sched.proc.0.kill().expect("kill -9 the scheduler");
    let _ = sched.proc.0.wait();
    std::thread::sleep(Duration::from_millis(300));
    sched = start_scheduler(&dir, budget_mb, lease_s);
    let hang = Duration::from_secs_f64(lease_s * 2.5);
    std::thread::sleep(hang.saturating_sub(stopped.elapsed()));
    signal(&b, "CONT");
    assert!(
        done(&faulty) < iterations && done(&hung) < iterations,
        "a worker finished before the faults: make the run longer"
    );
    wait_ok(
        a,
        "the worker with failing copies",
        &file(&dir, "faults", &faulty, "log"),
        LIMIT,
    );
    wait_ok(
        b,
        "the worker hung past its lease",
        &file(&dir, "faults", &hung, "log"),
        LIMIT,
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let taken = flooding.join().expect("the flooding client");
    eprintln!("the flood had {taken} reports taken");
    assert!(taken > 20, "the flood had only {taken} reports taken");

    // The scheduler lives, never panicked, and holds no job that is not
    // done: the survivors left, the killed one is not there (it died
    // before the restart), the flood unregistered.
    assert!(
        sched.proc.0.try_wait().expect("wait").is_none(),
        "the scheduler exited"
    );
    let log = std::fs::read_to_string(dir.join("scheduler.log")).unwrap_or_default();
    assert!(!log.contains("panicked"), "the scheduler panicked: {log}");
    let left = status(&sched.socket).expect("status");
    assert!(
        left.jobs
            .iter()
            .all(|j| j.state == pb::JobState::Done as i32),
        "jobs left behind: {left:?}"
    );
    let text = std::fs::read_to_string(file(&dir, "faults", &hung, "log")).unwrap_or_default();
    assert!(
        text.matches("scheduler: registered as job").count() >= 2,
        "the hung worker did not register again: {text}"
    );
    for j in [&faulty, &hung] {
        let vanilla = j.spawn(&dir, "vanilla", iterations, &["--vanilla".to_string()]);
        wait_ok(
            vanilla,
            "vanilla run",
            &file(&dir, "vanilla", j, "log"),
            LIMIT,
        );
        same_params(&dir, "faults", "vanilla", j);
    }
    drop(sched);
    let _ = std::fs::remove_dir_all(&dir);
}
