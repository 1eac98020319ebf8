//! The memory ledger: workers that share one budget hold its sum. Its slots
//! (workers see each other's bytes, a worker that leaves or dies stops
//! counting, garbage is never trusted, a bad directory is a clear error),
//! then two workers on one ledger: their memory added up over time stays
//! within the budget where without the ledger it goes over, they train
//! exactly as alone (also while each switches plans at every iteration),
//! and two whose smallest working sets just fit side by side both finish.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tch::Tensor;
use tensile_executor::ExecError;
use tensile_graph::builder::Optimizer;
use tensile_graph::{Graph, Liveness, TensorId};
use tensile_planner::Plan;
use tensile_swap_executor::HostConfig;
use tensile_worker::{
    IterationReport, Ledger, LedgerError, SlotState, Worker, WorkerConfig, WorkerError,
};

use crate::{Outcome, bytes, mlp, mock, run, vanilla};

/// A fresh directory under the system's temporary one, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("tensile-ledger-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn slots(dir: &Path) -> usize {
    fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".slot"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn two_ledgers_on_one_directory_see_each_others_bytes() {
    let _heavy = crate::heavy();
    let dir = TempDir::new("see");
    let mut a = Ledger::open(dir.path()).expect("opens");
    let mut b = Ledger::open(dir.path()).expect("opens");
    // Each sees the other at once (a new slot is announced), not after a
    // listing interval.
    assert_eq!(a.others().expect("reads").live, 1);
    assert_eq!(b.others().expect("reads").live, 1);
    a.publish(1_000, SlotState::Running).expect("publishes");
    b.publish(234, SlotState::Waiting).expect("publishes");
    let seen_by_b = b.others().expect("reads");
    assert_eq!((seen_by_b.bytes, seen_by_b.running), (1_000, 1));
    let seen_by_a = a.others().expect("reads");
    assert_eq!(seen_by_a.bytes, 234);
    // b started after a: it is the younger, and waits.
    assert_eq!((seen_by_a.younger, seen_by_a.younger_waiting), (1, 1));
    assert_eq!(seen_by_b.younger, 0);
    // A third sees both.
    let mut c = Ledger::open(dir.path()).expect("opens");
    let seen_by_c = c.others().expect("reads");
    assert_eq!((seen_by_c.live, seen_by_c.bytes), (2, 1_234));
}

#[test]
fn a_claim_takes_only_what_the_others_leave_and_stands_until_published() {
    let _heavy = crate::heavy();
    let dir = TempDir::new("claim");
    let mut a = Ledger::open(dir.path()).expect("opens");
    let mut b = Ledger::open(dir.path()).expect("opens");
    let budget = 1_000;
    let ca = a.claim(budget, SlotState::Running).expect("claims");
    assert_eq!(ca.room, 1_000);
    // a's claim stands: b has no room until a says what it holds.
    assert_eq!(b.claim(budget, SlotState::Running).expect("claims").room, 0);
    a.publish(300, SlotState::Running).expect("publishes");
    let cb = b.claim(budget, SlotState::Running).expect("claims");
    assert_eq!((cb.room, cb.others.bytes), (700, 300));
    // Now b's claim of 700 stands.
    assert_eq!(
        a.claim(budget, SlotState::Running).expect("claims").room,
        300
    );
}

#[test]
fn a_ledger_that_is_dropped_or_dies_stops_counting() {
    let _heavy = crate::heavy();
    let dir = TempDir::new("gone");
    let mut a = Ledger::open(dir.path()).expect("opens");
    {
        let mut b = Ledger::open(dir.path()).expect("opens");
        b.publish(5_000, SlotState::Running).expect("publishes");
        assert_eq!(a.others().expect("reads").bytes, 5_000);
        assert_eq!(slots(dir.path()), 2);
    }
    // Dropped: nothing held, slot removed.
    let o = a.others().expect("reads");
    assert_eq!((o.bytes, o.live), (0, 0));
    assert_eq!(slots(dir.path()), 1);
    // A worker killed with SIGKILL leaves its slot with its last bytes and
    // no lock (the kernel dropped it): a copy of a live slot's file, not
    // locked by anyone, is such a slot.
    let mut c = Ledger::open(dir.path()).expect("opens");
    c.publish(7_000, SlotState::Running).expect("publishes");
    let dead = dir.path().join("00000000000000000001-1-1.slot");
    fs::copy(c.slot_path(), &dead).expect("copies");
    drop(c);
    std::thread::sleep(tensile_worker::REFRESH + Duration::from_millis(10));
    let o = a.others().expect("reads");
    assert_eq!((o.bytes, o.live), (0, 0), "a dead slot counted");
    assert!(!dead.exists(), "a dead slot was left in place");
}

#[test]
fn garbage_and_torn_slots_are_not_trusted() {
    let _heavy = crate::heavy();
    let dir = TempDir::new("garbage");
    let mut a = Ledger::open(dir.path()).expect("opens");
    let mut b = Ledger::open(dir.path()).expect("opens");
    b.publish(4_096, SlotState::Running).expect("publishes");
    let good = fs::read(b.slot_path()).expect("reads");
    drop(b);
    let write_locked = |name: &str, content: &[u8]| -> File {
        let path = dir.path().join(name);
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .expect("creates");
        f.write_all(content).expect("writes");
        f.lock().expect("locks");
        f
    };
    // A live (locked) file that is not a slot: no header.
    let _junk = write_locked("00000000000000000002-1-1.slot", &[0xAB; 24]);
    // A live slot whose record's halves disagree (torn, or corrupt): its
    // value is never used.
    let mut torn = good.clone();
    torn[9] ^= 0x10;
    let _torn = write_locked("00000000000000000003-1-1.slot", &torn);
    // A live slot too short to hold a record.
    let _short = write_locked("00000000000000000004-1-1.slot", &good[..12]);
    // A file beside the slots that is none (not named as one).
    fs::write(dir.path().join("notes.txt"), b"hello").expect("writes");
    let o = a.others().expect("reads");
    assert_eq!(o.bytes, 0, "garbage was counted: {o:?}");
    // A torn read of a slot read whole before falls back on that value.
    let mut later = Ledger::open(dir.path()).expect("opens");
    later.publish(1_000, SlotState::Running).expect("publishes");
    assert_eq!(a.others().expect("reads").bytes, 1_000);
    let path = later.slot_path().to_path_buf();
    let mut bad = fs::read(&path).expect("reads");
    bad[20] ^= 0x01;
    fs::write(&path, &bad).expect("writes");
    assert_eq!(a.others().expect("reads").bytes, 1_000);
    // Unlocked garbage is not a slot of a dead worker: left alone.
    drop((_junk, _torn, _short));
    std::thread::sleep(tensile_worker::REFRESH + Duration::from_millis(10));
    assert_eq!(a.others().expect("reads").bytes, 1_000);
    assert!(dir.path().join("00000000000000000002-1-1.slot").exists());
}

#[test]
fn a_bad_ledger_directory_is_a_clear_error() {
    let _heavy = crate::heavy();
    let dir = TempDir::new("bad");
    fs::create_dir_all(dir.path()).expect("creates");
    let file = dir.path().join("a-file");
    fs::write(&file, b"x").expect("writes");
    let under_a_file = file.join("ledger");
    let e = Ledger::open(&under_a_file).expect_err("a directory under a file");
    let msg = e.to_string();
    assert!(
        matches!(e, LedgerError::Io { .. }) && msg.contains(&under_a_file.display().to_string()),
        "{msg}"
    );
    assert!(msg.contains("memory ledger"), "{msg}");
    // The worker says so too, and that a ledger needs a budget.
    let g = mlp(8, 16, 1, Optimizer::sgd());
    let live = Liveness::analyze(&g);
    let worker = |budget: Option<u64>, ledger: &Path| {
        let config = WorkerConfig {
            memory_budget_bytes: budget,
            ledger: Some(ledger.to_path_buf()),
            ..config(1, 0, None)
        };
        let kernels = mock::Mock::new(&g, Duration::ZERO);
        Worker::new(&g, &live, &vanilla(&g), kernels, mock::initial(&g), config)
    };
    let e = worker(Some(1 << 20), &under_a_file).expect_err("fails");
    assert!(
        e.to_string().contains(&under_a_file.display().to_string()),
        "{e}"
    );
    let e = worker(None, dir.path()).expect_err("fails");
    assert!(
        matches!(e, WorkerError::LedgerWithoutBudget(_)) && e.to_string().contains("--memory-mb"),
        "{e}"
    );
}

fn config(iterations: usize, budget: u64, ledger: Option<&Path>) -> WorkerConfig {
    WorkerConfig {
        iterations,
        memory_budget_bytes: Some(budget),
        host: HostConfig::default(),
        engine: tensile_worker::Engine::Host,
        guard: true,
        ledger: ledger.map(Path::to_path_buf),
    }
}

/// How long a test waits for its workers before it calls it a deadlock.
const DEADLOCK: Duration = Duration::from_secs(60);

/// Runs one worker per config at once (threads, as processes would: the
/// ledger is files), each under `plan` with memory recorded, and adds to
/// each one's last memory log the moment its memory goes (the worker is
/// dropped: its ledger slot goes after). Fails if they have not all
/// finished within [`DEADLOCK`].
fn together(
    g: &Graph,
    plan: &Plan,
    configs: Vec<WorkerConfig>,
    floor: Duration,
) -> Vec<Result<Outcome, WorkerError>> {
    let plans = vec![vec![plan.clone()]; configs.len()];
    switching(g, plans, configs, floor)
}

/// [`together`], each worker starting on the first of its plans and
/// switching to the next at each iteration boundary while there are more.
fn switching(
    g: &Graph,
    plans: Vec<Vec<Plan>>,
    configs: Vec<WorkerConfig>,
    floor: Duration,
) -> Vec<Result<Outcome, WorkerError>> {
    let n = configs.len();
    let (tx, rx) = mpsc::channel();
    for ((j, config), plans) in configs.into_iter().enumerate().zip(plans) {
        let (g, tx) = (g.clone(), tx.clone());
        std::thread::spawn(move || {
            let live = Liveness::analyze(&g);
            let ran = (|| {
                let kernels = mock::Mock::new(&g, floor);
                let mut w = Worker::new(&g, &live, &plans[0], kernels, mock::initial(&g), config)?;
                w.record_memory();
                let mut next = plans.into_iter().skip(1);
                let mut reports = w.run(|_| next.next())?;
                let values = w.persistent_values()?;
                let rest = w.close();
                if let Some(last) = reports.last_mut() {
                    last.memory.extend(rest);
                }
                Ok((values, reports))
            })();
            let _ = tx.send((j, ran));
        });
    }
    drop(tx);
    let deadline = Instant::now() + DEADLOCK;
    let mut out: Vec<Option<Result<Outcome, WorkerError>>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((j, ran)) => out[j] = Some(ran),
            Err(_) => panic!("the workers did not all finish within {DEADLOCK:?}: a deadlock"),
        }
    }
    out.into_iter()
        .map(|r| r.expect("every worker reports"))
        .collect()
}

/// The most device memory the workers held together at any moment, from
/// their memory logs (the threads of one process log on one clock).
fn sum_peak(runs: &[Vec<IterationReport>]) -> u64 {
    let logs: Vec<Vec<(u64, u64)>> = runs
        .iter()
        .map(|reports| {
            reports
                .iter()
                .flat_map(|r| r.memory.iter().copied())
                .collect()
        })
        .collect();
    let logs: Vec<&[(u64, u64)]> = logs.iter().map(Vec::as_slice).collect();
    tensile_executor::trace::joint_peak(&logs)
}

/// Each run's parameters (and optimizer state) against `want`, bit for
/// bit; the reports.
fn trained_as(
    g: &Graph,
    want: &[(TensorId, Tensor)],
    runs: Vec<Result<Outcome, WorkerError>>,
) -> Vec<Vec<IterationReport>> {
    let want = bytes(want);
    runs.into_iter()
        .enumerate()
        .map(|(j, r)| {
            let (values, reports) = r.unwrap_or_else(|e| panic!("job {j}: {e}"));
            let got = bytes(&values);
            assert_eq!(want.len(), got.len());
            for (w, h) in want.iter().zip(&got) {
                assert!(
                    w == h,
                    "job {j}: tensor {} ({}) differs",
                    w.0.0,
                    g.tensor(w.0).name
                );
            }
            reports
        })
        .collect()
}

/// An MLP whose activations outweigh its parameters (8.2 MB vanilla peak,
/// 0.8 MB persistent, 3.1 MB the largest working set of an op).
fn graph() -> Graph {
    mlp(2048, 128, 4, Optimizer::adam())
}

/// Two copies of a job under vanilla plans and a budget a quarter over
/// one's vanilla peak (under the two peaks together, well over either's
/// largest working set). Without the ledger each worker holds the budget
/// alone and together they go over it; on one ledger their memory added up
/// over time stays within it, the guard having held them back, and both
/// train bit for bit as a run without any budget.
#[test]
fn two_workers_on_a_ledger_hold_their_sum_to_the_shared_budget() {
    let _timing = crate::timing();
    let g = graph();
    let live = Liveness::analyze(&g);
    let peak = live.vanilla_footprint().peak;
    let budget = peak * 5 / 4;
    assert!(budget < 2 * peak && budget > 2 * live.largest_working_set(&g));
    let p = vanilla(&g);
    let floor = Duration::from_micros(500);
    let alone: Vec<Vec<IterationReport>> =
        together(&g, &p, vec![config(3, budget, None); 2], floor)
            .into_iter()
            .map(|r| r.expect("runs alone").1)
            .collect();
    let over = sum_peak(&alone);
    assert!(
        over > budget,
        "without the ledger, together {over} B, within the {budget} B budget: the test shows nothing"
    );
    let dir = TempDir::new("shared");
    let started = Instant::now();
    let shared = together(&g, &p, vec![config(3, budget, Some(dir.path())); 2], floor);
    let took = started.elapsed();
    let (want, _) = run(&g, &p, 3, HostConfig::default(), None, Duration::ZERO).expect("runs");
    let reports = trained_as(&g, &want, shared);
    let held = sum_peak(&reports);
    let waited: u64 = reports.iter().flatten().map(|r| r.memory_wait_ns).sum();
    let evicted: usize = reports.iter().flatten().map(|r| r.guard_evictions).sum();
    eprintln!(
        "budget {budget} B: without the ledger together {over} B, with it {held} B; {:.1} ms waited for memory, {evicted} evictions, {took:?}",
        waited as f64 / 1e6
    );
    assert!(
        held <= budget,
        "together {held} B over the {budget} B budget"
    );
    assert!(waited > 0, "the ledger never held a job back");
    assert_eq!(slots(dir.path()), 0, "slots left behind");
}

/// The same job twice on a budget that just fits the two largest working
/// sets side by side (under even one job's vanilla peak): each must evict
/// its own storages to let the other go on, and waiting for each other
/// would never end. Both finish, within the budget, bit for bit as alone.
#[test]
fn two_workers_whose_working_sets_just_fit_together_both_finish() {
    let _timing = crate::timing();
    let g = graph();
    let live = Liveness::analyze(&g);
    let budget = 2 * live.largest_working_set(&g) + (64 << 10);
    assert!(budget < live.vanilla_footprint().peak);
    let p = vanilla(&g);
    let dir = TempDir::new("tight");
    let started = Instant::now();
    let shared = together(
        &g,
        &p,
        vec![config(2, budget, Some(dir.path())); 2],
        Duration::from_micros(200),
    );
    let took = started.elapsed();
    let (want, _) = run(&g, &p, 2, HostConfig::default(), None, Duration::ZERO).expect("runs");
    let reports = trained_as(&g, &want, shared);
    let held = sum_peak(&reports);
    let evicted: Vec<usize> = reports
        .iter()
        .map(|r| r.iter().map(|x| x.guard_evictions).sum())
        .collect();
    eprintln!("budget {budget} B: together {held} B, evictions {evicted:?}, {took:?}");
    assert!(
        held <= budget,
        "together {held} B over the {budget} B budget"
    );
    assert!(evicted.iter().all(|&e| e > 0), "evictions {evicted:?}");
}

/// An op whose working set is larger than the whole shared budget fails
/// with the executor's no-memory error, alone or beside another job that
/// holds nothing it could wait for, rather than waiting forever.
#[test]
fn an_op_larger_than_the_whole_shared_budget_fails_clearly() {
    let _timing = crate::timing();
    let g = graph();
    let live = Liveness::analyze(&g);
    let budget = live.largest_working_set(&g) - 1;
    let dir = TempDir::new("small");
    let p = vanilla(&g);
    let started = Instant::now();
    let runs = together(
        &g,
        &p,
        vec![config(1, budget, Some(dir.path())); 2],
        Duration::ZERO,
    );
    for r in runs {
        match r {
            Err(WorkerError::Exec(ExecError::NoMemory { need, limit, .. })) => {
                assert!(limit <= budget && need > 0, "need {need}, limit {limit}");
            }
            Err(e) => panic!("another error: {e}"),
            Ok(_) => panic!("a job ran with an op larger than the budget"),
        }
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(slots(dir.path()), 0, "slots left behind");
}

/// Two jobs whose largest working sets do not fit side by side (a budget
/// an eighth over one): when both have evicted all they can and still wait
/// for each other, the youngest fails with the no-memory error and the
/// other goes on (or, if one ran ahead, the other waited for it); none
/// waits forever.
#[test]
fn two_workers_that_cannot_fit_together_do_not_wait_forever() {
    let _timing = crate::timing();
    let g = graph();
    let live = Liveness::analyze(&g);
    let ws = live.largest_working_set(&g);
    let budget = ws + ws / 8;
    let dir = TempDir::new("deadlock");
    let p = vanilla(&g);
    let runs = together(
        &g,
        &p,
        vec![config(2, budget, Some(dir.path())); 2],
        Duration::from_micros(200),
    );
    let mut finished = 0;
    for r in &runs {
        match r {
            Ok(_) => finished += 1,
            Err(WorkerError::Exec(ExecError::NoMemory { .. })) => {}
            Err(e) => panic!("another error: {e}"),
        }
    }
    let errors: Vec<String> = runs
        .iter()
        .filter_map(|r| r.as_ref().err().map(ToString::to_string))
        .collect();
    eprintln!("{finished} of 2 finished; {errors:?}");
    assert!(finished >= 1, "both failed");
}

/// One worker beside another job's slot (driven by hand) that holds so
/// much that the worker's ops do not fit: while that job is stuck too, the
/// worker (the younger) evicts, then fails with the no-memory error; while
/// that job runs, the worker waits for it, and goes on once it frees.
#[test]
fn a_worker_fails_beside_stuck_jobs_and_waits_for_running_ones() {
    let _timing = crate::timing();
    let g = graph();
    let live = Liveness::analyze(&g);
    let ws = live.largest_working_set(&g);
    let budget = 2 * ws;
    let p = vanilla(&g);
    let worker = |dir: &Path| {
        let kernels = mock::Mock::new(&g, Duration::ZERO);
        let config = config(1, budget, Some(dir));
        Worker::new(&g, &live, &p, kernels, mock::initial(&g), config)
            .and_then(|mut w| Ok((w.run(|_| None)?, w.persistent_values()?)))
    };
    let dir = TempDir::new("stuck");
    let mut other = Ledger::open(dir.path()).expect("opens");
    other
        .publish(budget - ws / 2, SlotState::Stuck)
        .expect("publishes");
    let started = Instant::now();
    let r = worker(dir.path());
    let took = started.elapsed();
    assert!(
        matches!(r, Err(WorkerError::Exec(ExecError::NoMemory { .. }))),
        "{:?}",
        r.map(|_| ())
    );
    // It waited for the all-wait grace, evicted, then stayed stuck.
    assert!(
        took >= tensile_worker::STUCK_AFTER && took < Duration::from_secs(5),
        "{took:?}"
    );
    other
        .publish(budget - ws / 2, SlotState::Running)
        .expect("publishes");
    let hold = Duration::from_millis(300);
    let freer = std::thread::spawn(move || {
        std::thread::sleep(hold);
        other.publish(0, SlotState::Running).expect("publishes");
        other
    });
    let (reports, values) = worker(dir.path()).expect("waits, then runs");
    drop(freer.join().expect("joins"));
    let waited: u64 = reports.iter().map(|r| r.memory_wait_ns).sum();
    assert!(
        waited as f64 >= hold.as_nanos() as f64 * 0.5,
        "waited {waited} ns"
    );
    let (want, _) = run(&g, &p, 1, HostConfig::default(), None, Duration::ZERO).expect("runs");
    assert!(bytes(&want) == bytes(&values), "trained differently");
}

/// The binary: `--ledger` needs `--memory-mb`, says so in its help, names
/// a directory it cannot use, and two processes (real kernels) on one
/// ledger train within the budget they share, leaving no slot behind.
#[test]
fn the_binary_takes_a_ledger() {
    let _timing = crate::timing();
    let bin = || std::process::Command::new(env!("CARGO_BIN_EXE_tensile-worker"));
    let help = bin().arg("--help").output().expect("runs");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("--ledger <DIR>") && help.contains("share"),
        "{help}"
    );
    let dir = TempDir::new("binary");
    fs::create_dir_all(dir.path()).expect("creates");
    let g = graph();
    let graph_file = dir.path().join("graph.json");
    fs::write(&graph_file, tensile_graph::json::to_string(&g)).expect("writes");
    let plan_file = dir.path().join("plan.json");
    let plan = tensile_proto::plan_json::plan_to_json(&vanilla(&g), &[], &g);
    fs::write(&plan_file, plan).expect("writes");
    let job = |b: &mut std::process::Command| {
        b.arg("--graph").arg(&graph_file).arg("--threads").arg("1");
    };
    let ledger = dir.path().join("ledger");
    let mut c = bin();
    job(&mut c);
    let out = c
        .args(["--vanilla", "--ledger"])
        .arg(&ledger)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--memory-mb"),
        "{stderr}"
    );
    let file = dir.path().join("a-file");
    fs::write(&file, b"x").expect("writes");
    let mut c = bin();
    job(&mut c);
    let out = c
        .args(["--vanilla", "--memory-mb", "100", "--ledger"])
        .arg(file.join("ledger"))
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&file.join("ledger").display().to_string()) && !stderr.contains("panicked"),
        "{stderr}"
    );
    // Two processes under the guard, a budget of 10 MiB shared (one job's
    // vanilla peak is 8.2 MB).
    let budget = 10u64 << 20;
    let children: Vec<_> = (0..2)
        .map(|k| {
            let mut c = bin();
            job(&mut c);
            c.args(["--plan"])
                .arg(&plan_file)
                .args(["--iterations", "20", "--memory-mb", "10", "--ledger"])
                .arg(&ledger)
                .arg("--memory-trace")
                .arg(dir.path().join(format!("trace{k}.csv")))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("starts")
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
    }
    assert_eq!(slots(&ledger), 0, "a slot outlived its worker");
    // Their traces added up, to within 1 MiB (one of the job's largest
    // storages): each process reads the Unix clock once, so the merged
    // order may err by microseconds, and a trace ends with what its
    // process held before it exited (its parameters), not with nothing.
    let traces: Vec<Vec<(f64, u64)>> = (0..2)
        .map(|k| {
            let text = fs::read_to_string(dir.path().join(format!("trace{k}.csv"))).expect("reads");
            text.lines()
                .filter_map(|l| {
                    let (t, b) = l.split_once(',')?;
                    Some((t.parse().ok()?, b.parse().ok()?))
                })
                .collect()
        })
        .collect();
    let overlap = traces[0].last().map_or(0.0, |l| l.0) > traces[1].first().map_or(0.0, |f| f.0)
        && traces[1].last().map_or(0.0, |l| l.0) > traces[0].first().map_or(0.0, |f| f.0);
    let mut changes: Vec<(f64, usize, u64)> = traces
        .iter()
        .enumerate()
        .flat_map(|(j, t)| t.iter().map(move |&(s, b)| (s, j, b)))
        .collect();
    changes.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut cur = [0u64; 2];
    let mut best = 0;
    for (_, j, b) in changes {
        cur[j] = b;
        best = best.max(cur[0] + cur[1]);
    }
    eprintln!("two processes: together {best} B of {budget} B, overlapping: {overlap}");
    assert!(
        best <= budget + (1 << 20),
        "together {best} B over {budget} B"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: crate::fuzz_cases(4),
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// Two workers on one ledger, each switching plans at every iteration
    /// boundary in its own random order among `plan_pool`'s (swapping
    /// across iterations, within them, recomputing, a slow link's,
    /// vanilla), gated or not, under a shared
    /// budget that their peaks exceed together: both train exactly as
    /// alone, and together they hold the budget. By hand,
    /// `TENSILE_FUZZ_MODEL` runs it on a zoo model instead of the MLP.
    #[test]
    fn two_workers_switching_plans_on_a_ledger_lose_nothing(
        orders in proptest::collection::vec(proptest::collection::vec(0usize..5, 5), 2),
        share in 1.2f64..1.8,
        floor_us in 50u64..400,
        gated in proptest::prelude::any::<bool>(),
    ) {
        let _timing = crate::timing();
        // The graph and its plans, made once for all cases (planning a zoo
        // model takes seconds).
        static POOL: std::sync::OnceLock<(Graph, Vec<Plan>)> = std::sync::OnceLock::new();
        let (g, pool) = POOL.get_or_init(|| {
            let g = crate::fuzz_model(None).unwrap_or_else(graph);
            let pool = crate::plan_pool(&g);
            (g, pool)
        });
        let live = Liveness::analyze(g);
        let ws = live.largest_working_set(g);
        let most = pool.iter().map(|p| p.prediction.planned_peak_bytes).max().unwrap_or(0);
        let budget = ((most as f64 * share) as u64).max(2 * ws + (64 << 10));
        // Gated: the two interleave on a period of twice a mock iteration
        // (each op takes at least the floor), half a period apart.
        let period = 2 * g.ops().len() as u64 * floor_us * 1_000;
        let plans: Vec<Vec<Plan>> = orders
            .iter()
            .enumerate()
            .map(|(j, o)| {
                o.iter()
                    .map(|&k| Plan {
                        gate: gated.then_some(tensile_planner::Gate {
                            period_ns: period,
                            phase_ns: j as u64 * period / 2,
                            epoch_ns: 0,
                        }),
                        ..pool[k].clone()
                    })
                    .collect()
            })
            .collect();
        let iterations = orders[0].len() + 1;
        let dir = TempDir::new("switch");
        let shared = switching(g, plans, vec![config(iterations, budget, Some(dir.path())); 2], Duration::from_micros(floor_us));
        let (want, _) = run(g, &vanilla(g), iterations, HostConfig::default(), None, Duration::ZERO).expect("runs");
        let reports = trained_as(g, &want, shared);
        let held = sum_peak(&reports);
        proptest::prop_assert!(held <= budget, "together {held} B over the {budget} B budget");
    }
}
