//! Updates kept on the host (`adam-on-host`: each parameter's update runs
//! on the host CPU, over host copies of the parameter, its gradient and its
//! state, inside the backward pass) lose nothing and reorder nothing: with
//! the mock kernels, which run the same arithmetic on either side, a model
//! trains bit for bit what its updates on the device in the backward pass
//! (`adam-in-backward`) train, with no plan, under the planner's plan,
//! under failing and slow copies, and under a guarded memory limit.

use std::time::Duration;

use tch::Tensor;
use tensile_graph::builder::{Builder, Optimizer, Step};
use tensile_graph::{DType, Graph, Liveness, TensorId};
use tensile_planner::{CopyModel, JobSettings, Plan};
use tensile_swap_executor::HostConfig;
use tensile_worker::{IterationReport, Worker, WorkerConfig, WorkerError};

use crate::{bytes, latencies, mock, planned, vanilla};

/// The MLP of the other proofs (4 hidden layers of 256, biases, Adam),
/// its updates placed by `step`.
pub(crate) fn mlp_stepping(step: Step) -> Graph {
    let mut b = Builder::new("mlp");
    let x = b.input("x", vec![64, 256], DType::F32);
    let y = b.input("y", vec![64], DType::I64);
    let mut h = x;
    for i in 1..=4 {
        h = b.linear(&format!("fc{i}"), h, 256, true);
        h = b.relu(&format!("act{i}"), h);
    }
    let logits = b.linear("head", h, 10, false);
    let loss = b.cross_entropy("loss", logits, y);
    b.finish_stepping(loss, Optimizer::adam(), step)
        .expect("valid")
}

/// Every persistent value by name, for graphs whose tensor ids differ.
pub(crate) fn by_name(g: &Graph, values: &[(TensorId, Tensor)]) -> Vec<(String, Vec<u8>)> {
    let mut named: Vec<(String, Vec<u8>)> = bytes(values)
        .into_iter()
        .map(|(t, b)| (g.tensor(t).name.clone(), b))
        .collect();
    named.sort();
    named
}

/// Asserts two runs' values are the same, name by name, bit for bit.
pub(crate) fn assert_same_by_name(want: &[(String, Vec<u8>)], got: &[(String, Vec<u8>)]) {
    assert_eq!(want.len(), got.len());
    assert!(want.iter().any(|(n, _)| n.ends_with("exp_avg_sq")));
    for (w, h) in want.iter().zip(got) {
        assert_eq!(w.0, h.0);
        assert!(w.1 == h.1, "{} differs", w.0);
    }
}

/// Persistent values by tensor name.
type Values = Vec<(String, Vec<u8>)>;

/// Runs `iterations` of `g` under `plan` with the mock kernels on both
/// sides; with `budget`, guarded by the executor as a planned run is.
fn run_guarded(
    g: &Graph,
    plan: &Plan,
    iterations: usize,
    host: HostConfig,
    budget: Option<u64>,
) -> Result<(Values, Vec<IterationReport>), WorkerError> {
    let live = Liveness::analyze(g);
    let config = WorkerConfig {
        iterations,
        memory_budget_bytes: budget,
        host,
        engine: tensile_worker::Engine::Host,
        guard: budget.is_some(),
        ledger: None,
    };
    let kernels = mock::Mock::new(g, Duration::ZERO);
    let mut w = Worker::new(g, &live, plan, kernels, mock::initial(g), config)?;
    w.set_host_kernels(mock::Mock::owned(g.clone(), Duration::ZERO));
    let reports = w.run(|_| None)?;
    Ok((by_name(g, &w.persistent_values()?), reports))
}

const ITERATIONS: usize = 3;

/// The planner's plan for `g` at `budget` of its vanilla peak.
fn plan_at(g: &Graph, budget: f64) -> Plan {
    let copy = CopyModel::duplex(4e9, 4e9, 5_000);
    planned(g, latencies(g), copy, JobSettings::default(), budget)
}

/// What the updates on the device, in the backward pass, train.
fn on_device() -> Vec<(String, Vec<u8>)> {
    let g = mlp_stepping(Step::InBackward);
    let (want, _) = run_guarded(&g, &vanilla(&g), ITERATIONS, HostConfig::default(), None)
        .expect("runs on the device");
    want
}

fn assert_host_runs(g: &Graph, reports: &[IterationReport]) {
    let host_ops = g.ops().iter().filter(|o| o.on_host()).count();
    assert!(host_ops > 0);
    assert_eq!(reports.len(), ITERATIONS);
    for r in reports {
        assert_eq!(r.host_runs, host_ops, "{r:?}");
    }
}

#[test]
fn the_two_placements_are_the_same_op_sequence() {
    let (dev, host) = (mlp_stepping(Step::InBackward), mlp_stepping(Step::OnHost));
    assert_eq!(dev.ops().len(), host.ops().len());
    for (a, b) in dev.ops().iter().zip(host.ops()) {
        assert_eq!((&a.name, &a.op_type), (&b.name, &b.op_type));
        assert!(!a.on_host());
        assert_eq!(b.on_host(), b.op_type.starts_with("aten::_fused_adam"));
    }
    let live = Liveness::analyze(&host);
    assert!(live.storages.iter().any(|s| s.host_only));
}

#[test]
fn updates_on_the_host_train_what_updates_on_the_device_train() {
    let _heavy = crate::heavy();
    let want = on_device();
    let g = mlp_stepping(Step::OnHost);
    let (got, reports) = run_guarded(&g, &vanilla(&g), ITERATIONS, HostConfig::default(), None)
        .expect("runs on the host");
    assert_same_by_name(&want, &got);
    assert_host_runs(&g, &reports);
}

#[test]
fn a_plan_loses_nothing_with_updates_on_the_host() {
    let _heavy = crate::heavy();
    let want = on_device();
    let g = mlp_stepping(Step::OnHost);
    for budget in [0.4, 0.6] {
        let p = plan_at(&g, budget);
        assert!(p.prediction.swap_outs > 0, "the plan swaps");
        let (got, reports) =
            run_guarded(&g, &p, ITERATIONS, HostConfig::default(), None).expect("the plan runs");
        assert_same_by_name(&want, &got);
        assert_host_runs(&g, &reports);
        assert!(reports.iter().all(|r| r.swapped_bytes > 0));
    }
}

#[test]
fn slow_copies_lose_nothing_with_updates_on_the_host() {
    let _heavy = crate::heavy();
    let want = on_device();
    let g = mlp_stepping(Step::OnHost);
    let p = plan_at(&g, 0.4);
    let slow = HostConfig {
        bytes_per_s: Some(1e9),
        fault_delay: Duration::from_micros(300),
        ..HostConfig::default()
    };
    for plan in [vanilla(&g), p] {
        let (got, reports) = run_guarded(&g, &plan, ITERATIONS, slow, None).expect("the plan runs");
        assert_same_by_name(&want, &got);
        assert_host_runs(&g, &reports);
    }
}

#[test]
fn failing_copies_lose_nothing_with_updates_on_the_host() {
    let _heavy = crate::heavy();
    let want = on_device();
    let g = mlp_stepping(Step::OnHost);
    let p = plan_at(&g, 0.4);
    for fail_every in [3, 7] {
        let host = HostConfig {
            fault_delay: Duration::from_micros(300),
            fail_every: Some(fail_every),
            ..HostConfig::default()
        };
        let (got, reports) = run_guarded(&g, &p, ITERATIONS, host, None).expect("the plan runs");
        assert_same_by_name(&want, &got);
        let failed: usize = reports.iter().map(|r| r.failed_copies).sum();
        assert!(failed > 0, "copies failed (every {fail_every}th)");
    }
}

#[test]
fn a_guarded_limit_loses_nothing_with_updates_on_the_host() {
    let _heavy = crate::heavy();
    let want = on_device();
    let g = mlp_stepping(Step::OnHost);
    let p = plan_at(&g, 0.5);
    // Under the plan's own peak: the guard must evict or wait to hold it,
    // with slow copies so that prefetches come late.
    let limit = p.prediction.planned_peak_bytes * 9 / 10;
    let host = HostConfig {
        bytes_per_s: Some(2e9),
        fault_delay: Duration::from_micros(200),
        ..HostConfig::default()
    };
    let (got, reports) =
        run_guarded(&g, &p, ITERATIONS, host, Some(limit)).expect("the guard holds the limit");
    assert_same_by_name(&want, &got);
    assert_host_runs(&g, &reports);
    for r in &reports {
        assert!(r.measured_peak_bytes <= limit, "{r:?}");
    }
}

/// Host kernels that always fail.
struct Refusing;

impl tensile_worker::Kernels for Refusing {
    fn run(&mut self, op: tensile_graph::OpId, _: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        Err(format!("the host kernel refuses op {}", op.0))
    }
}

/// A host op whose kernel fails is an error naming the op and why, also
/// where failing copies make runs go again: only a run whose input copy
/// failed is submitted again, never one whose kernel did.
#[test]
fn a_failing_host_kernel_is_an_error_naming_the_op() {
    let _heavy = crate::heavy();
    let g = mlp_stepping(Step::OnHost);
    let live = Liveness::analyze(&g);
    let failing = HostConfig {
        fault_delay: Duration::from_micros(300),
        fail_every: Some(3),
        ..HostConfig::default()
    };
    for (plan, host) in [
        (vanilla(&g), HostConfig::default()),
        (plan_at(&g, 0.4), failing),
    ] {
        let config = WorkerConfig {
            iterations: ITERATIONS,
            memory_budget_bytes: None,
            host,
            engine: tensile_worker::Engine::Host,
            guard: false,
            ledger: None,
        };
        let kernels = mock::Mock::new(&g, Duration::ZERO);
        let mut w =
            Worker::new(&g, &live, &plan, kernels, mock::initial(&g), config).expect("worker");
        w.set_host_kernels(Refusing);
        let msg = w.run(|_| None).expect_err("the kernel fails").to_string();
        assert!(
            msg.contains("runs on the host and failed there")
                && msg.contains("the host kernel refuses op"),
            "{msg}"
        );
    }
}

#[test]
fn a_worker_without_host_kernels_says_so_before_it_runs() {
    let g = mlp_stepping(Step::OnHost);
    let live = Liveness::analyze(&g);
    let config = WorkerConfig {
        iterations: 1,
        memory_budget_bytes: None,
        host: HostConfig::default(),
        engine: tensile_worker::Engine::Host,
        guard: false,
        ledger: None,
    };
    let kernels = mock::Mock::new(&g, Duration::ZERO);
    let mut w =
        Worker::new(&g, &live, &vanilla(&g), kernels, mock::initial(&g), config).expect("worker");
    let err = w.run(|_| None).expect_err("no host kernels");
    let msg = err.to_string();
    assert!(
        msg.contains("runs on the host") && msg.contains("no host kernels"),
        "{msg}"
    );
}
