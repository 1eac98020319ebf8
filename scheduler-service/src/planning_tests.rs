//! The planning task with a hook that makes every joint plan slow: a job
//! registered while one runs gets a fast first plan at once; the published
//! plans never add up past the budget; every job's versions increase; a
//! report sent meanwhile waits for the plan and reaches the re-planner it
//! hands back. And the job table under them: the reaper's removal checks
//! the lease again, and entries updated from many threads while the table
//! is walked lose nothing.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tensile_graph::builder::{Builder, Optimizer};
use tensile_graph::{DType, Graph, Liveness};
use tensile_planner::{CopyModel, Gate, JobSettings, MultiPlan, Plan, PlannerConfig, Prediction};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::{Admitted, Command, NewJob, Planner};
use crate::base::{Base, BaseSource};
use crate::metrics::Metrics;
use crate::state::{Job, JobState, Shared, Update};
use crate::token::TokenHash;

fn mlp() -> Arc<Graph> {
    let mut b = Builder::new("mlp");
    let x = b.input("x", vec![512, 1024], DType::F32);
    let y = b.input("y", vec![512], DType::I64);
    let mut h = b.linear("fc1", x, 1024, false);
    for k in 0..4 {
        h = b.relu(&format!("act{k}"), h);
        h = b.linear(&format!("fc{}", k + 2), h, 1024, false);
    }
    let logits = b.linear("head", h, 10, false);
    let loss = b.cross_entropy("loss", logits, y);
    Arc::new(b.finish(loss, Optimizer::adam()).unwrap())
}

/// Puts job `id` in the table (as RegisterJob does) and hands it to the
/// planning task; its lower bound.
async fn register(shared: &Shared, tx: &mpsc::Sender<Command>, id: u64, g: &Arc<Graph>) -> u64 {
    register_with_base(shared, tx, id, g, 0).await
}

/// [`register`] with the device profile's base of `base` bytes.
async fn register_with_base(
    shared: &Shared,
    tx: &mpsc::Sender<Command>,
    id: u64,
    g: &Arc<Graph>,
    base: u64,
) -> u64 {
    register_in(
        shared,
        tx,
        id,
        g,
        Base::new(base, BaseSource::Profile),
        None,
    )
    .await
}

/// [`register`] with `base`, in `process` (a process key) or a process of
/// its own.
async fn register_in(
    shared: &Shared,
    tx: &mpsc::Sender<Command>,
    id: u64,
    g: &Arc<Graph>,
    base_of_job: Base,
    process: Option<&str>,
) -> u64 {
    let base = base_of_job.bytes();
    let lower_bound = Liveness::analyze(g).largest_working_set(g) + base;
    let (updates, _) = watch::channel(Update {
        state: JobState::Queued("waiting for admission".into()),
        plan: None,
        diagnostics: Arc::default(),
    });
    shared.insert(
        id,
        Job {
            name: format!("job{id}"),
            graph: g.clone(),
            fingerprint: format!("f{id}"),
            token: TokenHash::of("t"),
            priority: 0,
            lower_bound,
            base_bytes: base,
            base_source: base_of_job.source(),
            process: process.unwrap_or_default().to_string(),
            base_job: 0,
            latency_source: "test",
            lease_until: tokio::time::Instant::now() + Duration::from_secs(60),
            subscribers: 0,
            updates,
            iterations: 0,
            reported_peak: 0,
            reported_base: 0,
            reported_version: None,
            span: tracing::Span::none(),
        },
    );
    tx.send(Command::Add(NewJob {
        id,
        graph: g.clone(),
        latencies: vec![5_000_000; g.ops().len()],
        settings: JobSettings {
            base_bytes: base,
            ..JobSettings::default()
        },
        priority: 0,
        lower_bound,
        base: base_of_job,
        fingerprint: format!("f{id}"),
        process: process.map(String::from),
    }))
    .await
    .unwrap();
    lower_bound
}

/// (version, predicted peak) of each job's newest plan.
fn plans(shared: &Shared, ids: &[u64]) -> Vec<(u64, u64)> {
    ids.iter()
        .map(|&id| {
            shared
                .job(id, |j| {
                    (
                        j.version(),
                        j.prediction().map_or(0, |p| p.planned_peak_bytes),
                    )
                })
                .unwrap()
        })
        .collect()
}

/// The planning task on `shared`, every joint plan of which first sleeps
/// `slow`: its command sender, its cancel token and its task.
fn slow_planning(
    shared: &Arc<Shared>,
    config: PlannerConfig,
    store: Option<Arc<crate::store::Store>>,
    slow: Duration,
) -> (
    mpsc::Sender<Command>,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    slow_planning_with(shared, config, store, slow, Arc::new(Metrics::new()))
}

/// [`slow_planning`] with its metrics in `metrics`.
fn slow_planning_with(
    shared: &Arc<Shared>,
    config: PlannerConfig,
    store: Option<Arc<crate::store::Store>>,
    slow: Duration,
    metrics: Arc<Metrics>,
) -> (
    mpsc::Sender<Command>,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let mut planner = Planner::new(
        shared.clone(),
        config,
        0.3,
        0.9,
        Duration::from_secs(30),
        store,
        "test".into(),
        metrics,
    );
    planner.slow_joint_plans = Some(slow);
    let (tx, rx) = mpsc::channel(64);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(planner.run(rx, cancel.clone()));
    (tx, cancel, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_registered_during_a_slow_joint_plan_gets_a_fast_first_plan() {
    let g = mlp();
    let vanilla = {
        let c = PlannerConfig::new(CopyModel::duplex(1e10, 1e10, 1_000));
        let s = JobSettings {
            swap: false,
            recompute: false,
            across_iteration: false,
            ..JobSettings::default()
        };
        let input = tensile_planner::JobInput::new(&g, vec![5_000_000; g.ops().len()], s);
        tensile_planner::plan(&[input], &c)
            .unwrap()
            .sum_of_peaks_bytes
    };
    let lb = Liveness::analyze(&g).largest_working_set(&g);
    // Room for one job as it is and one squeezed: the plans must share it.
    let budget = vanilla + lb + lb / 2;
    let shared = Arc::new(Shared::new(budget));
    let mut config = PlannerConfig::new(CopyModel::duplex(1e10, 1e10, 1_000));
    config.budget_bytes = Some(budget);
    let slow = Duration::from_millis(1500);
    let (tx, cancel, task) = slow_planning(&shared, config, None, slow);

    register(&shared, &tx, 1, &g).await;
    // Job 1's joint plan is now sleeping; job 2 arrives.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(plans(&shared, &[1])[0].0, 0, "the joint plan was not slow");
    let t = Instant::now();
    register(&shared, &tx, 2, &g).await;
    let ids = [1, 2];
    let mut seen = vec![(0, 0); 2];
    let mut first_plan_of_2 = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    // Until job 2 runs a plan made with job 1 (a joint one).
    while seen[1].0 < 2 {
        assert!(
            Instant::now() < deadline,
            "no joint plan for job 2: {seen:?}"
        );
        let now = plans(&shared, &ids);
        let sum: u64 = now.iter().map(|p| p.1).sum();
        assert!(
            sum <= budget,
            "published peaks {now:?} add up past the budget of {budget}"
        );
        for (k, (old, new)) in seen.iter().zip(&now).enumerate() {
            assert!(new.0 >= old.0, "job {}: version went back", ids[k]);
        }
        if now[1].0 >= 1 && first_plan_of_2.is_none() {
            first_plan_of_2 = Some(t.elapsed());
        }
        seen = now;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let first = first_plan_of_2.unwrap();
    assert!(
        first < slow / 2,
        "job 2's first plan took {first:?}, behind a joint plan of {slow:?}"
    );
    assert_eq!(shared.job(2, Job::state).unwrap(), JobState::Active);
    cancel.cancel();
    task.await.unwrap();
}

fn with_peak(version: u64, peak: u64) -> Plan {
    Plan {
        version,
        prediction: Prediction {
            planned_peak_bytes: peak,
            ..Prediction::default()
        },
        ..Plan::default()
    }
}

/// A planner on `shared` that a test drives by hand (no task, no store).
fn hand_driven(shared: &Arc<Shared>, config: PlannerConfig) -> Planner {
    Planner::new(
        shared.clone(),
        config,
        0.3,
        0.9,
        Duration::from_secs(2),
        None,
        "test".into(),
        Arc::new(Metrics::new()),
    )
}

#[tokio::test]
async fn a_joint_plan_that_does_not_fit_beside_a_fast_plan_goes_out_in_part() {
    let g = mlp();
    let budget = 100;
    let shared = Arc::new(Shared::new(budget));
    let mut config = PlannerConfig::new(CopyModel::duplex(1e10, 1e10, 1_000));
    config.budget_bytes = Some(budget);
    let mut planner = hand_driven(&shared, config);
    let (tx, _rx) = mpsc::channel(8);
    for id in 1..=3 {
        register(&shared, &tx, id, &g).await;
        planner.admitted.insert(
            id,
            Admitted {
                lower_bound: 10,
                need: 10,
                job: NewJob {
                    id,
                    graph: g.clone(),
                    latencies: vec![5_000_000; g.ops().len()],
                    settings: JobSettings::default(),
                    priority: 0,
                    lower_bound: 10,
                    base: Base::new(0, BaseSource::Profile),
                    fingerprint: String::new(),
                    process: None,
                },
                seq: id,
                working_set: 10,
                base: Base::new(0, BaseSource::Profile),
                fingerprint: String::new(),
                at_plan: 0.0,
                unsaved: false,
            },
        );
    }
    // Job 1 runs a joint plan at 40, job 2 a fast plan at 30; job 3 has
    // none. A joint plan made without job 2 lowers job 1 to 35 and gives
    // job 3 40: 35 + 30 + 40 is past the budget, so only job 1's goes out.
    planner.publish_one(1, with_peak(0, 40), Vec::new(), false);
    planner.publish_one(2, with_peak(0, 30), Vec::new(), false);
    let mp = MultiPlan {
        plans: vec![with_peak(0, 35), with_peak(0, 40)],
        sum_of_peaks_bytes: 75,
        ..MultiPlan::default()
    };
    assert_eq!(planner.what_fits(&[1, 3], &mp), vec![0]);
    // With job 3 at 30 both fit (35 + 30 + 30 = 95).
    let mp = MultiPlan {
        plans: vec![with_peak(0, 35), with_peak(0, 30)],
        sum_of_peaks_bytes: 65,
        ..MultiPlan::default()
    };
    let order = planner.what_fits(&[1, 3], &mp);
    assert_eq!(order, vec![0, 1]);
    planner.publish(&[1, 3], mp, &order);
    let peaks = plans(&shared, &[1, 2, 3]);
    assert_eq!(peaks, vec![(2, 35), (1, 30), (1, 30)]);
    // Status counts what runs: job 2's fast plan too.
    assert_eq!(shared.memory().sum_of_peaks_bytes, 95);
}

/// A gated plan of jobs 1, 2 and 3 at `peak` bytes each whose gates keep
/// them together at `aligned` bytes.
fn gated_at(peak: u64, aligned: u64) -> MultiPlan {
    let period = 200_000_000;
    MultiPlan {
        plans: (0..3u64)
            .map(|k| Plan {
                gate: Some(Gate {
                    period_ns: period,
                    phase_ns: k * period / 3,
                    epoch_ns: 0,
                }),
                ..with_peak(0, peak)
            })
            .collect(),
        cycle_ns: period,
        sum_of_peaks_bytes: 3 * peak,
        aligned_peak_bytes: aligned,
        ..MultiPlan::default()
    }
}

/// A joint plan without gates of jobs 1, 2 and 3 at `peaks`.
fn free_at(peaks: [u64; 3]) -> MultiPlan {
    MultiPlan {
        plans: peaks.iter().map(|&p| with_peak(0, p)).collect(),
        sum_of_peaks_bytes: peaks.iter().sum(),
        ..MultiPlan::default()
    }
}

#[tokio::test]
async fn plans_without_gates_replace_a_gated_set_without_going_past_the_budget() {
    let g = mlp();
    let budget = 90;
    let shared = Arc::new(Shared::new(budget));
    let mut config = PlannerConfig::new(CopyModel::duplex(1e10, 1e10, 1_000));
    config.budget_bytes = Some(budget);
    let mut planner = hand_driven(&shared, config);
    let (tx, _rx) = mpsc::channel(8);
    for id in 1..=3 {
        register(&shared, &tx, id, &g).await;
    }
    let ids = [1, 2, 3];
    // Three jobs at 40 each (120, past the budget), gated to hold 70
    // together.
    planner.publish(&ids, gated_at(40, 70), &[0, 1, 2]);
    assert_eq!(shared.memory().published_bytes, 70);
    // A plan without gates lowers job 1 to 15 and the others to 35 (85 in
    // all). Job 1 goes first (the largest fall): while jobs 2 and 3 still
    // run their gates they hold at most 70 together, so 15 + 70 = 85; the
    // ledger must not count them by their peaks (15 + 80 = 95).
    let order = planner.what_fits(&ids, &free_at([15, 35, 35]));
    assert_eq!(order, vec![0, 1, 2]);
    planner.publish(&ids, free_at([15, 35, 35]), &order);
    assert_eq!(planner.max_over, 0);
    assert_eq!(plans(&shared, &ids), vec![(2, 15), (2, 35), (2, 35)]);
    assert_eq!(shared.memory().published_bytes, 85);

    // Gated again; now a plan without gates that fits as a whole (20 + 35
    // + 35 = 90) but not on the way: job 3 at 20 beside the gated pair
    // (70) is 90, then job 1 at 35 beside job 2 still at its gated 40 is
    // 95, a real moment past the budget. Only job 3's plan goes out; jobs
    // 1 and 2 keep their gated plans.
    planner.publish(&ids, gated_at(40, 70), &[0, 1, 2]);
    let order = planner.what_fits(&ids, &free_at([35, 35, 20]));
    assert_eq!(order, vec![2]);
    planner.publish(&ids, free_at([35, 35, 20]), &order);
    assert_eq!(planner.max_over, 0);
    assert_eq!(plans(&shared, &ids), vec![(3, 40), (3, 40), (4, 20)]);
    assert_eq!(shared.memory().published_bytes, 90);
    assert_eq!(planner.metrics.max_published_over_budget_bytes.get(), 0);
}

/// The gate of job `id`'s newest plan.
fn gate_of(shared: &Shared, id: u64) -> Gate {
    shared
        .job(id, |j| {
            j.updates.borrow().plan.as_ref().and_then(|p| p.gate)
        })
        .flatten()
        .unwrap()
}

#[tokio::test]
async fn gates_keep_the_cycle_in_use_unless_a_job_anchors_the_new_one() {
    let g = mlp();
    let shared = Arc::new(Shared::new(1 << 40));
    let mut planner = hand_driven(
        &shared,
        PlannerConfig::new(CopyModel::duplex(1e10, 1e10, 1_000)),
    );
    let (tx, _rx) = mpsc::channel(8);
    for id in 1..=2 {
        register(&shared, &tx, id, &g).await;
    }
    let gated = |period: u64, phases: [u64; 2], anchor_job| MultiPlan {
        plans: phases
            .iter()
            .map(|&phase_ns| Plan {
                gate: Some(Gate {
                    period_ns: period,
                    phase_ns,
                    epoch_ns: 0,
                }),
                ..Plan::default()
            })
            .collect(),
        cycle_ns: period,
        anchor_job,
        ..MultiPlan::default()
    };
    let period = 200_000_000;
    planner.publish(&[1, 2], gated(period, [0, period / 2], None), &[0, 1]);
    let first = gate_of(&shared, 1);
    assert_eq!(gate_of(&shared, 2).epoch_ns, first.epoch_ns);
    // Without an anchor, new gates keep the cycle in use: their epoch is
    // a whole number of old periods from the first.
    planner.publish(&[1, 2], gated(period, [0, period / 2], None), &[0, 1]);
    let kept = gate_of(&shared, 1).epoch_ns;
    assert_eq!(kept.abs_diff(first.epoch_ns) % period, 0);
    // Stretched gates anchored on job 2: its next slot is when they went
    // out, whatever the old grid.
    let stretched = 210_000_000;
    let before = tensile_proto::clock::monotonic_ns();
    planner.publish(
        &[1, 2],
        gated(stretched, [0, stretched / 2], Some(1)),
        &[0, 1],
    );
    let after = tensile_proto::clock::monotonic_ns();
    let (a, b) = (gate_of(&shared, 1), gate_of(&shared, 2));
    assert_eq!(a.epoch_ns, b.epoch_ns);
    let slot = b.epoch_ns + b.phase_ns;
    assert!(before <= slot && slot <= after, "{before} {slot} {after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_sent_during_a_joint_plan_is_answered_after_it_and_kept() {
    let g = mlp();
    let ops = g.ops().len();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(crate::store::Store::open(dir.path()).unwrap());
    let shared = Arc::new(Shared::new(u64::MAX));
    let slow = Duration::from_millis(800);
    let config = PlannerConfig::new(CopyModel::duplex(1e10, 1e10, 1_000));
    let (tx, cancel, task) = slow_planning(&shared, config, Some(store.clone()), slow);

    let started = Instant::now();
    register(&shared, &tx, 1, &g).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(plans(&shared, &[1])[0].0, 0, "the joint plan was not slow");
    // Measured 7 ms per op, against the 5 ms registered.
    let (reply, answer) = tokio::sync::oneshot::channel();
    tx.send(Command::Report {
        id: 1,
        measured: tensile_planner::Measurements {
            op_ns: vec![7_000_000; ops],
            late_prefetches: Vec::new(),
            start_bytes: 0,
            evictions: Vec::new(),
            switched: false,
            iteration_ns: 7_000_000 * ops as u64,
            plan_version: 0,
        },
        base_bytes: 0,
        reply,
    })
    .await
    .unwrap();
    let outcome = answer.await.unwrap().unwrap();
    assert!(
        started.elapsed() >= slow,
        "answered in {:?}, before the joint plan of {slow:?} landed",
        started.elapsed()
    );
    assert!(
        plans(&shared, &[1])[0].0 >= 1,
        "answered before the joint plan was published"
    );
    assert!(outcome.change_rate > 0.3, "{outcome:?}");
    cancel.cancel();
    task.await.unwrap();
    // The report reached the re-planner the joint plan handed back: the
    // estimates saved at shutdown moved from 5 ms towards 7 ms.
    let saved = store.load("f1", "test", ops).unwrap().unwrap();
    assert!(
        saved.iter().all(|&ns| ns > 5_500_000),
        "the report was lost: saved estimates {saved:?}"
    );
}

/// Reports one iteration of job `id` (every op at the 5 ms it registered
/// with) with a measured base of `base` bytes; the answer.
async fn report_base(
    tx: &mpsc::Sender<Command>,
    id: u64,
    ops: usize,
    base: u64,
) -> super::ReportOutcome {
    let (reply, answer) = tokio::sync::oneshot::channel();
    tx.send(Command::Report {
        id,
        measured: tensile_planner::Measurements {
            op_ns: vec![5_000_000; ops],
            iteration_ns: 5_000_000 * ops as u64,
            ..tensile_planner::Measurements::default()
        },
        base_bytes: base,
        reply,
    })
    .await
    .unwrap();
    answer.await.unwrap().unwrap()
}

/// Waits until job `id`'s newest plan is past `version`; its (version,
/// predicted peak).
async fn plan_after(shared: &Shared, id: u64, version: u64) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let p = plans(shared, &[id])[0];
        if p.0 > version {
            return p;
        }
        assert!(Instant::now() < deadline, "no plan after version {version}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Job `id`'s (base, where it came from, lower bound) as status shows it.
fn base_of(shared: &Shared, id: u64) -> (u64, &'static str, u64) {
    shared
        .job(id, |j| (j.base_bytes, j.base_source.name(), j.lower_bound))
        .unwrap()
}

const MB: u64 = 1_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_measured_base_is_planned_inside_the_peak_in_place_of_the_profiles() {
    let g = mlp();
    let ops = g.ops().len();
    let shared = Arc::new(Shared::new(u64::MAX));
    let config = PlannerConfig::new(CopyModel::duplex(1e10, 1e10, 1_000));
    let (tx, cancel, task) = slow_planning(&shared, config, None, Duration::ZERO);
    let profile = 100 * MB;
    let lb = register_with_base(&shared, &tx, 1, &g, profile).await;
    let (v1, peak1) = plan_after(&shared, 1, 0).await;
    assert_eq!(base_of(&shared, 1), (profile, "profile", lb));
    // Within a tenth and 64 MiB of the profile's: planned as it was.
    let out = report_base(&tx, 1, ops, profile + 30 * MB).await;
    assert_eq!(base_of(&shared, 1).1, "profile");
    assert!(out.replanned, "the first measurements re-plan");
    // The same latencies and base, the same plan: not sent again, the job
    // keeps the version it runs.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(plans(&shared, &[1])[0], (v1, peak1));
    let v2 = v1;
    // Measured 900 MB: planned at once, inside the job's peak and lower
    // bound.
    let measured = 900 * MB;
    let out = report_base(&tx, 1, ops, measured).await;
    assert!(out.replanned, "{out:?}");
    let (_, peak3) = plan_after(&shared, 1, v2).await;
    assert_eq!(peak3, peak1 - profile + measured);
    assert_eq!(
        base_of(&shared, 1),
        (measured, "measured", lb - profile + measured)
    );
    // Not measured (0) changes nothing.
    let out = report_base(&tx, 1, ops, 0).await;
    assert!(!out.replanned, "{out:?}");
    assert_eq!(base_of(&shared, 1).0, measured);
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_counts_a_measured_base_and_a_process_base_shared_by_its_jobs_once() {
    let g = mlp();
    let ops = g.ops().len();
    let ws = Liveness::analyze(&g).largest_working_set(&g);
    // Two jobs of one process (`tensile-worker --copies 2`) whose process
    // holds 600 MB outside their storages: each reports its share, 300
    // MB. Charged 600 MB each, a third job of 100 MB would not fit.
    let process = 600 * MB;
    let budget = 3 * ws + process + 100 * MB + 50 * MB;
    let shared = Arc::new(Shared::new(budget));
    let mut config = PlannerConfig::new(CopyModel::duplex(1e10, 1e10, 1_000));
    config.budget_bytes = Some(budget);
    let (tx, cancel, task) = slow_planning(&shared, config, None, Duration::ZERO);
    for id in [1, 2] {
        register_with_base(&shared, &tx, id, &g, 10 * MB).await;
        plan_after(&shared, id, 0).await;
    }
    for id in [1, 2] {
        report_base(&tx, id, ops, process.div_ceil(2)).await;
        assert_eq!(base_of(&shared, id).0, 300 * MB);
    }
    register_with_base(&shared, &tx, 3, &g, 100 * MB).await;
    plan_after(&shared, 3, 0).await;
    assert_eq!(shared.job(3, Job::state).unwrap(), JobState::Active);
    // Job 1's share rises past what is left: job 4 (a base of 100 MB
    // too) now waits, and says how much it is short.
    report_base(&tx, 1, ops, 800 * MB).await;
    register_with_base(&shared, &tx, 4, &g, 0).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let reason = loop {
        match shared.job(4, Job::state).unwrap() {
            JobState::Queued(why) if why != "waiting for admission" => break why,
            JobState::Queued(_) if Instant::now() < deadline => {}
            other => panic!("job 4 is {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(reason.ends_with(" MB short"), "{reason}");
    // Three reports in a row materially lower bring job 1's base down to
    // the largest of them, and job 4 in.
    for base in [150 * MB, 140 * MB, 145 * MB] {
        assert_eq!(
            shared.job(4, Job::state).unwrap(),
            JobState::Queued(reason.clone())
        );
        report_base(&tx, 1, ops, base).await;
    }
    assert_eq!(base_of(&shared, 1).0, 150 * MB);
    plan_after(&shared, 4, 0).await;
    cancel.cancel();
    task.await.unwrap();
}

/// Job `id`'s (base, where it came from, the job counting its process's
/// base).
fn process_base_of(shared: &Shared, id: u64) -> (u64, &'static str, u64) {
    shared
        .job(id, |j| (j.base_bytes, j.base_source.name(), j.base_job))
        .unwrap()
}

/// Waits until job `id` is queued for want of memory; why.
async fn queued_reason(shared: &Shared, id: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match shared.job(id, Job::state).unwrap() {
            JobState::Queued(why) if why != "waiting for admission" => return why,
            JobState::Queued(_) if Instant::now() < deadline => {}
            other => panic!("job {id} is {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_one_process_count_its_base_once_and_hand_it_over() {
    let g = mlp();
    let ops = g.ops().len();
    let ws = Liveness::analyze(&g).largest_working_set(&g);
    // Room for both jobs' working sets and one base of 600 MB, not two.
    let base = 600 * MB;
    let budget = 2 * ws + base + 400 * MB;
    let registered = || Base::new(base, BaseSource::Registered);
    let planning = |shared: &Arc<Shared>| {
        let mut config = PlannerConfig::new(CopyModel::duplex(1e10, 1e10, 1_000));
        config.budget_bytes = Some(budget);
        slow_planning(shared, config, None, Duration::ZERO)
    };
    // Two processes: the second job waits, short of a base's worth.
    let shared = Arc::new(Shared::new(budget));
    let (tx, cancel, task) = planning(&shared);
    register_in(&shared, &tx, 1, &g, registered(), Some("host:1:a")).await;
    plan_after(&shared, 1, 0).await;
    register_in(&shared, &tx, 2, &g, registered(), Some("host:2:b")).await;
    let why = queued_reason(&shared, 2).await;
    eprintln!(
        "two processes under {} MB: job 2 queued: {why}",
        budget / MB
    );
    assert!(why.contains("200 MB short"), "{why}");
    assert_eq!(process_base_of(&shared, 2), (base, "registered", 0));
    cancel.cancel();
    task.await.unwrap();

    // One process: both admitted, the first job planned with the base, the
    // second with none.
    let shared = Arc::new(Shared::new(budget));
    let (tx, cancel, task) = planning(&shared);
    let key = Some("host:7:c");
    register_in(&shared, &tx, 1, &g, registered(), key).await;
    let (v1, peak1) = plan_after(&shared, 1, 0).await;
    register_in(&shared, &tx, 2, &g, registered(), key).await;
    let (v2, peak2) = plan_after(&shared, 2, 0).await;
    assert_eq!(process_base_of(&shared, 1), (base, "registered", 1));
    assert_eq!(process_base_of(&shared, 2), (0, "process", 1));
    assert_eq!(base_of(&shared, 2).2, ws);
    assert!(peak1 >= base && peak2 < base, "peaks {peak1} and {peak2}");
    // The joint plan that follows holds both under the budget.
    let (v1, peak1) = plan_after(&shared, 1, v1).await;
    let (_, peak2) = plans(&shared, &[2])[0];
    eprintln!(
        "one process under {} MB: both admitted, planned peaks {:.1} + {:.1} MB (base {} MB counted once)",
        budget / MB,
        peak1 as f64 / 1e6,
        peak2 as f64 / 1e6,
        base / MB
    );
    assert!(peak1 + peak2 <= budget, "{peak1} + {peak2} > {budget}");
    // A base measured by the second job is the process's: planned with the
    // first.
    report_base(&tx, 2, ops, 900 * MB).await;
    assert_eq!(process_base_of(&shared, 1), (900 * MB, "measured", 1));
    assert_eq!(process_base_of(&shared, 2), (0, "process", 1));
    let (_, peak1) = plan_after(&shared, 1, v1).await;
    assert!(peak1 >= 900 * MB, "{peak1}");
    // The first job leaves: the second takes the base over.
    shared.remove(1, "unregistered");
    tx.send(Command::Remove(1)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, peak2) = plans(&shared, &[2])[0];
        if process_base_of(&shared, 2) == (900 * MB, "measured", 2) && peak2 >= 900 * MB {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "job 2 did not take the base over: {:?}, peak {peak2}",
            process_base_of(&shared, 2)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(base_of(&shared, 2).2, ws + 900 * MB);
    assert!(plans(&shared, &[2])[0].0 > v2);
    cancel.cancel();
    task.await.unwrap();
}

/// A report of job `id`'s ops at `scale` times 5 ms (alternate scales
/// drift past the threshold: each asks for a re-plan); a queued job's is
/// refused.
async fn report_scaled(tx: &mpsc::Sender<Command>, id: u64, ops: usize, scale: u64) {
    let (reply, answer) = tokio::sync::oneshot::channel();
    tx.send(Command::Report {
        id,
        measured: tensile_planner::Measurements {
            op_ns: vec![5_000_000 * scale; ops],
            iteration_ns: 5_000_000 * scale * ops as u64,
            ..tensile_planner::Measurements::default()
        },
        base_bytes: 0,
        reply,
    })
    .await
    .unwrap();
    let _ = answer.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_plans_never_add_up_past_the_budget_while_jobs_come_and_go() {
    let g = mlp();
    let ops = g.ops().len();
    let lb = Liveness::analyze(&g).largest_working_set(&g);
    // Room for three and a half lower bounds; plans that may add no time
    // (max_overhead 0) cannot always get three jobs under it, so joint
    // plans over the budget by themselves come up.
    let budget = lb * 7 / 2;
    let shared = Arc::new(Shared::new(budget));
    let mut config = PlannerConfig::new(CopyModel::duplex(1e10, 1e10, 1_000));
    config.budget_bytes = Some(budget);
    config.max_overhead = 0.0;
    let metrics = Arc::new(Metrics::new());
    // Every joint plan takes 30 ms: jobs arrive while one runs (fast
    // plans, jobs joining late).
    let (tx, cancel, task) = slow_planning_with(
        &shared,
        config,
        None,
        Duration::from_millis(30),
        metrics.clone(),
    );
    let mut live: Vec<u64> = Vec::new();
    for id in 1..=12u64 {
        register(&shared, &tx, id, &g).await;
        live.push(id);
        // Job 1 is paused: it never reports. The others drift.
        for &j in live.iter().filter(|&&j| j != 1) {
            report_scaled(&tx, j, ops, 1 + (id + j) % 2).await;
        }
        // Every third arrival, the oldest running job but job 1 leaves.
        if id % 3 == 0 {
            let gone = live.remove(1);
            shared.remove(gone, "unregistered");
            tx.send(Command::Remove(gone)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Let the last joint plans land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(metrics.max_published_over_budget_bytes.get(), 0);
    assert!(
        metrics.plans_withheld.get() > 0,
        "no joint plan was over the budget: the case is not exercised"
    );
    // The ledger is what the jobs run: the active jobs' plans in the table.
    let in_table: u64 = shared
        .each(|_, j| {
            (j.state() == JobState::Active)
                .then(|| j.prediction().map_or(0, |p| p.planned_peak_bytes))
        })
        .iter()
        .sum();
    assert!(in_table <= budget, "{in_table} > {budget}");
    assert_eq!(metrics.published_bytes.get() as u64, in_table);
    // And the status says the same.
    assert_eq!(shared.memory().published_bytes, in_table);
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn the_reaper_keeps_a_job_whose_lease_was_renewed_after_its_scan() {
    let g = mlp();
    let shared = Shared::new(u64::MAX);
    let (tx, _rx) = mpsc::channel(8);
    register(&shared, &tx, 1, &g).await;
    register(&shared, &tx, 2, &g).await;
    // Both leases (60 s) lapse by then; job 2 renews between the scan and
    // the removal.
    let now = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut lapsed = shared.lapsed(now);
    lapsed.sort();
    assert_eq!(lapsed, vec![1, 2]);
    shared.job_mut(2, |j| j.lease_until = now + Duration::from_secs(60));
    let removed: Vec<u64> = lapsed
        .into_iter()
        .filter(|&id| {
            shared
                .remove_if(id, |j| j.lease_until <= now, "its lease lapsed")
                .is_some()
        })
        .collect();
    assert_eq!(removed, vec![1]);
    assert!(!shared.contains(1) && shared.contains(2));
}

#[test]
fn jobs_updated_from_many_threads_while_the_table_is_walked_lose_nothing() {
    let g = mlp();
    let shared = Arc::new(Shared::new(u64::MAX));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (tx, _rx) = mpsc::channel(64);
    for id in 1..=16 {
        rt.block_on(register(&shared, &tx, id, &g));
    }
    let walker = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            for _ in 0..200 {
                assert_eq!(shared.each(|id, _| Some(id)).len(), 16);
            }
        })
    };
    let workers: Vec<_> = (1..=16u64)
        .map(|id| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                for _ in 0..500 {
                    // Its own entry, and a neighbour's: shards are shared.
                    shared.job_mut(id, |j| j.iterations += 1).unwrap();
                    shared
                        .job_mut(id % 16 + 1, |j| j.reported_peak += 1)
                        .unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    walker.join().unwrap();
    for id in 1..=16 {
        assert_eq!(
            shared.job(id, |j| (j.iterations, j.reported_peak)),
            Some((500, 500))
        );
    }
}

#[tokio::test]
async fn a_budget_change_is_written_by_the_planning_task_everywhere_before_it_answers() {
    use tensile_proto::endpoint::{GpuEntry, GpusFile, gpu_socket_name};
    let dir = tempfile::tempdir().unwrap();
    let entry = |index| GpuEntry {
        index,
        uuid: format!("sim-{index}"),
        name: "simulated a6000".into(),
        memory_bytes: 1 << 30,
        budget_bytes: 1 << 30,
        socket: gpu_socket_name(index),
    };
    let manifest = Arc::new(crate::node::Manifest::new(
        dir.path().to_path_buf(),
        GpusFile {
            gpus: vec![entry(0), entry(1)],
        },
    ));
    manifest.write().unwrap();
    let shared = Arc::new(Shared::new(1 << 30));
    let mut config = PlannerConfig::new(CopyModel::duplex(1e10, 1e10, 1_000));
    config.budget_bytes = Some(1 << 30);
    let metrics = Arc::new(Metrics::new());
    let planner = Planner::new(
        shared.clone(),
        config,
        0.3,
        0.9,
        Duration::from_secs(30),
        None,
        "test".into(),
        metrics.clone(),
    )
    .keeping_manifest(1, manifest.clone());
    assert_eq!(metrics.budget_bytes.get(), 1 << 30);
    let (tx, rx) = mpsc::channel(8);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(planner.run(rx, cancel.clone()));

    let (reply, answer) = tokio::sync::oneshot::channel();
    tx.send(Command::Budget {
        bytes: 300_000_000,
        reply,
    })
    .await
    .unwrap();
    answer.await.unwrap();
    // By the answer, the file, the status and the metric say it.
    let file = GpusFile::read(dir.path()).unwrap().unwrap();
    assert_eq!(
        file.gpus.iter().map(|g| g.budget_bytes).collect::<Vec<_>>(),
        [1 << 30, 300_000_000]
    );
    assert_eq!(shared.memory().budget_bytes, 300_000_000);
    assert_eq!(metrics.budget_bytes.get(), 300_000_000);
    cancel.cancel();
    task.await.unwrap();
}
