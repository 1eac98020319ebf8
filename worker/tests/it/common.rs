//! What the worker's two test binaries share: a small MLP, a plan for it,
//! vanilla's, and a run with the mock kernels (`it` holds the proofs,
//! `peak` the one whose figure needs the machine to itself).

use std::time::Duration;

use tch::Tensor;
use tensile_graph::builder::Optimizer;
use tensile_graph::{Graph, Liveness, TensorId};
use tensile_planner::{CopyModel, JobInput, JobSettings, Plan, PlannerConfig, plan};
use tensile_swap_executor::HostConfig;
use tensile_worker::{IterationReport, Worker, WorkerConfig, WorkerError};

use crate::mock;

/// A small MLP training iteration (linear layers with biases).
pub(crate) fn mlp(batch: u64, width: u64, depth: usize, optimizer: Optimizer) -> Graph {
    tensile_graph::builder::mlp(batch, width, depth, true, optimizer).expect("valid")
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
    // Host ops (optimizer updates kept on the host) run the same kernels.
    w.set_host_kernels(mock::Mock::owned(g.clone(), floor));
    let reports = w.run(|_| None)?;
    Ok((w.persistent_values()?, reports))
}
