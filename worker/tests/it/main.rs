//! The worker's proofs on CPU: plans lose nothing (parameters after K
//! iterations bit-identical with and without a plan, for plans with swaps,
//! host-copy reuse, across-iteration swaps and recomputation, for random
//! plans, under injected copy delays and failures), gates, workers sharing
//! a budget, updates kept on the host, the real kernels. The measured peak against the plan's
//! prediction is `tests/peak.rs`, a binary of its own. Kernels: `mock` (a
//! deterministic function of each op's inputs, any graph) until the real
//! ones run everything.

mod common;
mod cuda;
mod gates;
mod host_ops;
mod jobs;
mod ledger;
mod mock;
mod plans;
mod real;
mod session_gpus;

pub(crate) use common::{Outcome, mlp, planned, run, vanilla};

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tch::Tensor;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Graph, TensorId};
use tensile_planner::{CopyModel, JobSettings, Plan};

static TIMING: RwLock<()> = RwLock::new(());

/// Tests whose figures depend on timing (gates, several workers at once)
/// hold this while they run, so that on a small machine they run alone:
/// beside each other and beside the heavy tests ([`heavy`]) the threads'
/// jitter on two cores would be what they measure.
pub(crate) fn timing() -> RwLockWriteGuard<'static, ()> {
    TIMING.write().unwrap_or_else(PoisonError::into_inner)
}

/// Tests that keep the cores busy (real kernels, long runs of random
/// plans) hold this: they run beside each other, never beside a timing
/// test. A test holds one of the two, never both.
pub(crate) fn heavy() -> RwLockReadGuard<'static, ()> {
    TIMING.read().unwrap_or_else(PoisonError::into_inner)
}

/// Proptest cases for the fuzzers: `default` in CI, `TENSILE_FUZZ_CASES`
/// for longer runs by hand.
pub(crate) fn fuzz_cases(default: u32) -> u32 {
    std::env::var("TENSILE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The zoo model that `TENSILE_FUZZ_MODEL` names, or else `default`, at
/// batch 2 and its smallest resolution from 32 up, for fuzzers run by hand
/// on other graphs; `None` when neither names one.
pub(crate) fn fuzz_model(default: Option<&str>) -> Option<Graph> {
    let name = std::env::var("TENSILE_FUZZ_MODEL")
        .ok()
        .or(default.map(String::from))?;
    let model = zoo::model(&name).expect("TENSILE_FUZZ_MODEL names a zoo model");
    let config = ZooConfig {
        resolution: Some(model.min_resolution.max(32)),
        ..ZooConfig::new(2)
    };
    Some(model.build(&config).expect("zoo"))
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
