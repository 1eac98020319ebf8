//! Plans lose nothing: swaps, recomputation, failed or slow copies, a full
//! host pool, plans switched at iteration boundaries. (That the measured
//! peak is the predicted one is `tests/peak.rs`.)

use std::sync::OnceLock;
use std::time::Duration;

use proptest::prelude::*;
use tensile_graph::builder::Optimizer;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Graph, Liveness, OpId};
use tensile_planner::{CopyModel, Event, EventKind, JobSettings, Plan, Trigger};
use tensile_swap_executor::HostConfig;
use tensile_worker::{Worker, WorkerConfig};

use crate::{bytes, latencies, mlp, planned, run, vanilla};

fn copy() -> CopyModel {
    CopyModel::duplex(4e9, 4e9, 5_000)
}

fn graph() -> Graph {
    mlp(64, 256, 4, Optimizer::adam())
}

/// Runs `g` under `plan` and vanilla for 3 iterations; asserts the
/// parameters and optimizer state end bit-identical.
fn same_as_vanilla(
    g: &Graph,
    plan: &Plan,
    host: HostConfig,
) -> Vec<tensile_worker::IterationReport> {
    let (want, _) = run(
        g,
        &vanilla(g),
        3,
        HostConfig::default(),
        None,
        Duration::ZERO,
    )
    .expect("vanilla runs");
    let (got, reports) = run(g, plan, 3, host, None, Duration::ZERO).expect("the plan runs");
    assert_eq!(want.len(), got.len());
    assert!(!want.is_empty());
    let (want, got) = (bytes(&want), bytes(&got));
    for (w, h) in want.iter().zip(&got) {
        assert_eq!(w.0, h.0);
        assert!(
            w.1 == h.1,
            "tensor {} ({}) differs",
            w.0.0,
            g.tensor(w.0).name
        );
    }
    reports
}

#[test]
fn swaps_and_host_copy_reuse_lose_nothing() {
    let _heavy = crate::heavy();
    let g = graph();
    let settings = JobSettings {
        recompute: false,
        across_iteration: false,
        ..JobSettings::default()
    };
    let p = planned(&g, latencies(&g), copy(), settings, 0.5);
    assert!(p.prediction.swap_outs > 0, "the plan swaps");
    let reports = same_as_vanilla(&g, &p, HostConfig::default());
    assert!(reports.iter().all(|r| r.swapped_bytes > 0));
}

/// An activation is copied out after its forward use and released one op
/// later, while that copy runs (the release waits for it); its prefetch
/// fires at that op, while the buffer is still there, and is due after
/// the copy out has ended and freed the buffer. The prefetch brings the
/// data back into a buffer of its own in time for the backward pass: the
/// executor once submitted it into no buffer, and the engine took what it
/// brought for the storage's buffer, one nobody counted (the worker then
/// measured a fresh tensor against it: "lies outside its storage"), while
/// the op fetched the data again on demand.
#[test]
fn a_prefetch_due_after_its_swap_out_freed_the_buffer_lands_in_a_new_one() {
    let _heavy = crate::heavy();
    let g = mlp(16, 64, 3, Optimizer::sgd());
    let act = g
        .tensors()
        .iter()
        .find(|t| t.name == "act1")
        .expect("act1")
        .id;
    let uses: Vec<OpId> = g
        .ops()
        .iter()
        .filter(|o| o.inputs.contains(&act))
        .map(|o| o.id)
        .collect();
    // Ops take 2 ms: the backward pass reads it 30 ms or more later.
    assert!(uses.len() >= 2 && uses[1].0 >= uses[0].0 + 16, "{uses:?}");
    let at = |op: OpId, delay_ns: u64, kind: EventKind| Event {
        trigger: Trigger::After(op),
        delay_ns,
        kind,
        tensor: act,
    };
    let release = OpId(uses[0].0 + 1);
    let mut plan = vanilla(&g);
    plan.events.extend([
        at(uses[0], 0, EventKind::SwapOut),
        at(release, 0, EventKind::Release),
        at(release, 15_000_000, EventKind::SwapIn),
    ]);
    // Its 4096 B take 10 ms each way: the copy out ends 8 ms after the
    // prefetch fired, 7 ms before it is due.
    let host = HostConfig {
        bytes_per_s: Some(409_600.0),
        ..HostConfig::default()
    };
    let floor = Duration::from_millis(2);
    let (want, _) =
        run(&g, &vanilla(&g), 3, HostConfig::default(), None, floor).expect("vanilla runs");
    let (got, reports) = run(&g, &plan, 3, host, None, floor).expect("the plan runs");
    assert_eq!(bytes(&want), bytes(&got), "the plan changed the values");
    for r in &reports {
        assert_eq!(r.passive_swaps, 0, "the op fetched it on demand: {r:?}");
        assert_eq!(r.swapped_bytes, g.tensor(act).bytes, "{r:?}");
    }
}

#[test]
fn recomputation_loses_nothing() {
    let _heavy = crate::heavy();
    // ResNet-50 at 64 x 64, batch 1, SGD: the MLP has nothing the planner
    // recomputes.
    let config = ZooConfig {
        resolution: Some(64),
        optimizer: Optimizer::sgd(),
        ..ZooConfig::new(1)
    };
    let g = zoo::build("resnet50", &config).expect("zoo");
    let settings = JobSettings {
        swap: false,
        across_iteration: false,
        ..JobSettings::default()
    };
    let p = planned(&g, latencies(&g), copy(), settings, 0.5);
    assert!(p.prediction.recomputed_ops > 0, "the plan recomputes");
    let reports = same_as_vanilla(&g, &p, HostConfig::default());
    assert!(reports.iter().all(|r| r.recomputed_ops > 0));
}

#[test]
fn across_iteration_swaps_lose_nothing() {
    let _heavy = crate::heavy();
    let g = graph();
    let p = planned(&g, latencies(&g), copy(), JobSettings::default(), 0.3);
    assert!(
        !p.start_on_host.is_empty(),
        "persistent storage starts on the host"
    );
    same_as_vanilla(&g, &p, HostConfig::default());
}

#[test]
fn copy_delays_and_failures_lose_nothing() {
    let _heavy = crate::heavy();
    let g = graph();
    let p = planned(&g, latencies(&g), copy(), JobSettings::default(), 0.4);
    for fail_every in [2, 3, 7] {
        let host = HostConfig {
            fault_delay: Duration::from_micros(300),
            fail_every: Some(fail_every),
            ..HostConfig::default()
        };
        let reports = same_as_vanilla(&g, &p, host);
        let failed: usize = reports.iter().map(|r| r.failed_copies).sum();
        assert!(failed > 0, "copies failed (every {fail_every}th)");
    }
}

#[test]
fn failed_copies_of_a_resnet_plan_lose_nothing() {
    let _heavy = crate::heavy();
    // Parameters swapped out, released and fetched again from their host
    // copy before the optimizer, recomputation, across-iteration swaps:
    // every 3rd or 4th copy fails.
    let config = ZooConfig {
        resolution: Some(64),
        optimizer: Optimizer::sgd(),
        ..ZooConfig::new(1)
    };
    let g = zoo::build("resnet50", &config).expect("zoo");
    let p = planned(&g, latencies(&g), copy(), JobSettings::default(), 0.5);
    assert!(p.prediction.swap_outs > 0 && p.prediction.recomputed_ops > 0);
    for fail_every in [3, 4] {
        let host = HostConfig {
            fail_every: Some(fail_every),
            ..HostConfig::default()
        };
        let reports = same_as_vanilla(&g, &p, host);
        assert!(reports.iter().any(|r| r.failed_copies > 0));
    }
}

#[test]
fn a_full_host_pool_loses_nothing() {
    let _heavy = crate::heavy();
    let g = graph();
    let settings = JobSettings {
        across_iteration: false,
        ..JobSettings::default()
    };
    let p = planned(&g, latencies(&g), copy(), settings, 0.4);
    let host = HostConfig {
        pool_cap_bytes: 200_000,
        ..HostConfig::default()
    };
    let reports = same_as_vanilla(&g, &p, host);
    assert!(
        reports.iter().any(|r| r.failed_copies > 0),
        "the pool filled up"
    );
}

#[test]
fn plans_switched_at_iteration_boundaries_lose_nothing() {
    let _heavy = crate::heavy();
    let g = graph();
    let live = Liveness::analyze(&g);
    let (want, _) = run(
        &g,
        &vanilla(&g),
        5,
        HostConfig::default(),
        None,
        Duration::ZERO,
    )
    .expect("vanilla runs");
    // Vanilla, then a plan that starts persistent storage on the host,
    // then one that recomputes, then vanilla again.
    let across = planned(&g, latencies(&g), copy(), JobSettings::default(), 0.3);
    assert!(!across.start_on_host.is_empty());
    let other = planned(
        &g,
        latencies(&g),
        CopyModel::duplex(1e9, 1e9, 50_000),
        JobSettings::default(),
        0.6,
    );
    let mut next = vec![vanilla(&g), other, across].into_iter();
    let kernels = crate::mock::Mock::new(&g, Duration::ZERO);
    let config = WorkerConfig {
        iterations: 5,
        memory_budget_bytes: None,
        host: HostConfig::default(),
        engine: tensile_worker::Engine::Host,
        guard: false,
        ledger: None,
    };
    let first = vanilla(&g);
    let mut w =
        Worker::new(&g, &live, &first, kernels, crate::mock::initial(&g), config).expect("worker");
    let mut seen = 0;
    w.run(|_| {
        seen += 1;
        next.next_back()
    })
    .expect("runs");
    assert_eq!(seen, 5);
    let got = w.persistent_values().expect("values");
    let (want, got) = (bytes(&want), bytes(&got));
    assert!(want == got, "switching plans changed the parameters");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    #[test]
    fn random_plans_lose_nothing(
        budget in 0.2f64..0.9,
        swap in any::<bool>(),
        recompute in any::<bool>(),
        across in any::<bool>(),
        gbps in prop::sample::select(vec![0.5f64, 4.0, 50.0]),
        sgd in any::<bool>(),
    ) {
        let _heavy = crate::heavy();
        let g = mlp(32, 128, 3, if sgd { Optimizer::sgd() } else { Optimizer::adam() });
        let settings = JobSettings { swap, recompute, across_iteration: across, ..JobSettings::default() };
        let p = planned(&g, latencies(&g), CopyModel::duplex(gbps * 1e9, gbps * 1e9, 5_000), settings, budget);
        same_as_vanilla(&g, &p, HostConfig::default());
    }
}

/// A graph with the plans to switch among and vanilla's values after
/// `SWITCHES + 1` iterations, built once per graph for all of a fuzzer's
/// cases.
struct Switching {
    graph: Graph,
    pool: Vec<Plan>,
    want: Vec<(tensile_graph::TensorId, Vec<u8>)>,
}

const SWITCHES: usize = 7;

impl Switching {
    fn new(graph: Graph) -> Switching {
        let (want, _) = run(
            &graph,
            &vanilla(&graph),
            SWITCHES + 1,
            HostConfig::default(),
            None,
            Duration::ZERO,
        )
        .expect("vanilla runs");
        let pool = crate::plan_pool(&graph);
        Switching {
            want: bytes(&want),
            pool,
            graph,
        }
    }

    /// Runs the plans of `case.order`, one per iteration, under a memory
    /// limit the guard holds, with slow kernels and copies that are slow or
    /// fail: training must end bit-identical to vanilla's. Callers hold
    /// [`crate::timing`], here and while the graph's vanilla run and plans
    /// are first made: they load the machine, and must not run beside the
    /// tests that measure timing.
    fn check(&self, case: &Case) -> Result<(), TestCaseError> {
        let Case {
            order,
            slack,
            delay_us,
            fail,
            floor_us,
        } = case;
        let g = &self.graph;
        let live = Liveness::analyze(g);
        let most = self
            .pool
            .iter()
            .map(|p| p.prediction.planned_peak_bytes)
            .max()
            .unwrap_or(0);
        let config = WorkerConfig {
            iterations: order.len() + 1,
            memory_budget_bytes: Some((most as f64 * slack) as u64),
            host: HostConfig {
                fault_delay: Duration::from_micros(*delay_us),
                fail_every: *fail,
                ..HostConfig::default()
            },
            engine: tensile_worker::Engine::Host,
            guard: true,
            ledger: None,
        };
        let kernels = crate::mock::Mock::new(g, Duration::from_micros(*floor_us));
        let first = &self.pool[order[0]];
        let mut w =
            Worker::new(g, &live, first, kernels, crate::mock::initial(g), config).expect("worker");
        let mut next = order[1..].iter().map(|&k| self.pool[k].clone());
        if let Err(e) = w.run(|_| next.next()) {
            return Err(TestCaseError::fail(format!(
                "switching plans in order {order:?}: {e}"
            )));
        }
        let got = bytes(&w.persistent_values().expect("values"));
        prop_assert!(
            self.want == got,
            "switching plans in order {order:?} changed the parameters"
        );
        Ok(())
    }
}

fn mlp_switching() -> &'static Switching {
    static S: OnceLock<Switching> = OnceLock::new();
    S.get_or_init(|| Switching::new(graph()))
}

/// ResNet-50 at 32 x 32 (many small parameters of equal size, which the
/// host engine's reuse of freed buffers by size mixes up if anything does,
/// batch norms, Adam), or the zoo model `TENSILE_FUZZ_MODEL` names.
fn zoo_switching() -> &'static Switching {
    static S: OnceLock<Switching> = OnceLock::new();
    S.get_or_init(|| Switching::new(crate::fuzz_model(Some("resnet50")).expect("a zoo model")))
}

/// One case of the plan-switch fuzzers: the pool's plans in the order run,
/// the limit as a multiple of the largest predicted peak, each copy's delay,
/// every how many copies one fails, and the kernels' least time.
#[derive(Debug, Clone)]
struct Case {
    order: Vec<usize>,
    slack: f64,
    delay_us: u64,
    fail: Option<u64>,
    floor_us: u64,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(0usize..5, SWITCHES),
        1.0f64..1.3,
        0u64..300,
        prop::option::of(5u64..40),
        0u64..100,
    )
        .prop_map(|(order, slack, delay_us, fail, floor_us)| Case {
            order,
            slack,
            delay_us,
            fail,
            floor_us,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::fuzz_cases(8), ..ProptestConfig::default() })]

    /// A plan switch at every iteration boundary, in any order among
    /// `plan_pool`'s, under a memory limit the guard holds, with slow
    /// kernels and copies that are slow or fail: training ends
    /// bit-identical to vanilla's.
    #[test]
    fn random_plan_switches_under_a_guarded_limit_lose_nothing(case in cases()) {
        let _timing = crate::timing();
        mlp_switching().check(&case)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::fuzz_cases(3), ..ProptestConfig::default() })]

    /// The same on ResNet-50 (or `TENSILE_FUZZ_MODEL`). It found an
    /// updated parameter freed by a release that had waited for its
    /// swap-out (a lost parameter at the next iteration).
    #[test]
    fn random_plan_switches_of_a_zoo_model_lose_nothing(case in cases()) {
        let _timing = crate::timing();
        zoo_switching().check(&case)?;
    }
}
