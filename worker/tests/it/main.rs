//! The worker's proofs on CPU: plans lose nothing (parameters after K
//! iterations bit-identical with and without a plan, for plans with swaps,
//! host-copy reuse, across-iteration swaps and recomputation, for random
//! plans, under injected copy delays and failures), the measured peak of
//! device memory against the plan's prediction, and out-of-memory under a
//! budget that vanilla exceeds. Kernels: `mock` (a deterministic function
//! of each op's inputs, any graph) until the real ones run everything.

mod cuda;
mod gates;
mod ledger;
mod mock;
mod plans;
mod real;
mod session_gpus;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tch::Tensor;
use tensile_graph::builder::{Builder, Optimizer};
use tensile_graph::{DType, Graph, Liveness, TensorId};
use tensile_planner::{CopyModel, JobInput, JobSettings, Plan, PlannerConfig, plan};
use tensile_swap_executor::HostConfig;
use tensile_worker::{IterationReport, Worker, WorkerConfig, WorkerError};

/// Tests whose figures depend on timing (gates, a measured peak against
/// its prediction, several workers at once) hold this while they run, so
/// that on a small machine they do not run beside each other.
pub(crate) fn timing() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A small MLP training iteration.
pub(crate) fn mlp(batch: u64, width: u64, depth: usize, optimizer: Optimizer) -> Graph {
    let mut b = Builder::new("mlp");
    let x = b.input("x", vec![batch, width], DType::F32);
    let y = b.input("y", vec![batch], DType::I64);
    let mut h = x;
    for i in 1..=depth {
        h = b.linear(&format!("fc{i}"), h, width, true);
        h = b.relu(&format!("act{i}"), h);
    }
    let logits = b.linear("head", h, 10, false);
    let loss = b.cross_entropy("loss", logits, y);
    b.finish(loss, optimizer).expect("valid")
}

/// Proptest cases for the fuzzers: `default` in CI, `TENSILE_FUZZ_CASES`
/// for longer runs by hand.
pub(crate) fn fuzz_cases(default: u32) -> u32 {
    std::env::var("TENSILE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Op latencies for planning: a fixed cost plus one per byte touched.
pub(crate) fn latencies(g: &Graph) -> Vec<u64> {
    g.ops()
        .iter()
        .map(|op| {
            let b: u64 = op
                .inputs
                .iter()
                .chain(&op.outputs)
                .map(|&t| g.tensor(t).bytes)
                .sum();
            20_000 + b / 100
        })
        .collect()
}

/// A plan for `g` alone under `budget` (a fraction of its vanilla peak).
pub(crate) fn planned(
    g: &Graph,
    lat: Vec<u64>,
    copy: CopyModel,
    settings: JobSettings,
    budget: f64,
) -> Plan {
    let live = Liveness::analyze(g);
    let vanilla = live.vanilla_footprint().peak;
    let mut config = PlannerConfig::new(copy);
    config.budget_bytes = Some((vanilla as f64 * budget) as u64);
    let input = JobInput::new(g, lat, settings);
    plan(&[input], &config).expect("plans").plans.remove(0)
}

/// Frees after last use, no plan.
pub(crate) fn vanilla(g: &Graph) -> Plan {
    tensile_worker::vanilla_plan(&Liveness::analyze(g))
}

/// Plans of `g` that keep storage in different places: across-iteration
/// swaps, swaps within the iteration only, recomputation only, a slow
/// link's, and vanilla; each carries its own version (2 to 6), for tests
/// that switch among them.
pub(crate) fn plan_pool(g: &Graph) -> Vec<Plan> {
    let only = |swap, recompute, across_iteration| JobSettings {
        swap,
        recompute,
        across_iteration,
        ..JobSettings::default()
    };
    let fast = CopyModel::duplex(4e9, 4e9, 5_000);
    let slow = CopyModel::duplex(1e9, 1e9, 50_000);
    let mut pool = vec![
        planned(g, latencies(g), fast, JobSettings::default(), 0.3),
        planned(g, latencies(g), fast, only(true, false, false), 0.5),
        planned(g, latencies(g), fast, only(false, true, false), 0.6),
        planned(g, latencies(g), slow, JobSettings::default(), 0.4),
        vanilla(g),
    ];
    for (k, p) in pool.iter_mut().enumerate() {
        p.version = k as u64 + 2;
    }
    pool
}

/// The persistent values after a run, and its reports.
pub(crate) type Outcome = (Vec<(TensorId, Tensor)>, Vec<IterationReport>);

/// Runs `iterations` of `g` under `plan` with the mock kernels; the
/// persistent values at the end and the reports.
pub(crate) fn run(
    g: &Graph,
    plan: &Plan,
    iterations: usize,
    host: HostConfig,
    budget: Option<u64>,
    floor: Duration,
) -> Result<Outcome, WorkerError> {
    let live = Liveness::analyze(g);
    let kernels = mock::Mock::new(g, floor);
    let config = WorkerConfig {
        iterations,
        memory_budget_bytes: budget,
        host,
        engine: tensile_worker::Engine::Host,
        guard: false,
        ledger: None,
    };
    let mut w = Worker::new(g, &live, plan, kernels, mock::initial(g), config)?;
    let reports = w.run(|_| None)?;
    Ok((w.persistent_values()?, reports))
}

/// The bytes of every tensor, for a bit-for-bit comparison.
pub(crate) fn bytes(values: &[(TensorId, Tensor)]) -> Vec<(TensorId, Vec<u8>)> {
    values
        .iter()
        .map(|(t, v)| {
            let v = v.contiguous();
            let mut b = vec![0u8; v.numel() * v.kind().elt_size_in_bytes()];
            v.copy_data_u8(&mut b, v.numel());
            (*t, b)
        })
        .collect()
}
