//! Randomized: random training graphs (a trunk of linear, activation,
//! dropout and layer-norm layers with random widths and residual adds,
//! cross-entropy, then backward and Adam or SGD) and random op latencies.
//! With exact latencies, planning and running must agree exactly, and the
//! plan must pass the independent validity check, for one job and for
//! several jobs sharing the link.

use proptest::prelude::*;
use tensile_graph::builder::{Builder, Optimizer};
use tensile_graph::{DType, Graph};
use tensile_planner::{CopyModel, JobInput, JobSettings, PlannerConfig, plan};

use crate::check_with;

#[derive(Debug, Clone)]
struct Layer {
    width: u64,
    /// 0: relu, 1: gelu, 2: tanh, 3: dropout, 4: layer norm.
    act: u8,
    /// Add the layer's input back (when the widths agree).
    residual: bool,
}

fn layer() -> impl Strategy<Value = Layer> {
    (
        prop::sample::select(vec![16u64, 64, 256, 1024]),
        0u8..5,
        any::<bool>(),
    )
        .prop_map(|(width, act, residual)| Layer {
            width,
            act,
            residual,
        })
}

fn model(batch: u64, layers: &[Layer], sgd: bool) -> Graph {
    let mut b = Builder::new("random");
    let x = b.input("x", vec![batch, 64], DType::F32);
    let y = b.input("y", vec![batch], DType::I64);
    let mut h = x;
    for (i, l) in layers.iter().enumerate() {
        let name = format!("l{i}");
        let z = b.linear(&format!("{name}.fc"), h, l.width, i % 2 == 0);
        let a = match l.act {
            0 => b.relu(&format!("{name}.act"), z),
            1 => b.gelu(&format!("{name}.act"), z),
            2 => b.tanh(&format!("{name}.act"), z),
            3 => b.dropout(&format!("{name}.act"), z, 0.1),
            _ => b.layer_norm(&format!("{name}.act"), z, 1e-5),
        };
        h = if l.residual && b.shape(h) == b.shape(a) {
            b.add(&format!("{name}.res"), h, a)
        } else {
            a
        };
    }
    let logits = b.linear("head", h, 10, true);
    let loss = b.cross_entropy("loss", logits, y);
    let opt = if sgd {
        Optimizer::sgd()
    } else {
        Optimizer::adam()
    };
    b.finish(loss, opt).expect("random models are valid")
}

/// Latencies between 1 µs and about 1 ms, seeded per op.
fn latencies(g: &Graph, seed: u64) -> Vec<u64> {
    (0..g.ops().len() as u64)
        .map(|k| {
            let mut z = seed ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            1_000 + (z ^ (z >> 31)) % 1_000_000
        })
        .collect()
}

/// The sum of the jobs' peaks planned with no budget.
fn plan_free(graphs: &[Graph], lat: &[Vec<u64>], copy: CopyModel) -> u64 {
    let inputs: Vec<JobInput<'_>> = graphs
        .iter()
        .zip(lat)
        .map(|(g, l)| JobInput::new(g, l.clone(), JobSettings::default()))
        .collect();
    plan(&inputs, &PlannerConfig::new(copy))
        .expect("plans")
        .sum_of_peaks_bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn exact_latencies_random_models(
        jobs in prop::collection::vec(
            (1u64..64, prop::collection::vec(layer(), 1..8), any::<bool>(), any::<u64>()),
            1..4,
        ),
        half_duplex in any::<bool>(),
        gbps in 1u64..32,
        budget_kind in 0u8..3,
        budget_frac in 0.0f64..1.0,
    ) {
        let graphs: Vec<Graph> = jobs
            .iter()
            .map(|(batch, layers, sgd, _)| model(*batch, layers, *sgd))
            .collect();
        let lat: Vec<Vec<u64>> = graphs
            .iter()
            .zip(&jobs)
            .map(|(g, j)| latencies(g, j.3))
            .collect();
        let mut copy = CopyModel::duplex(gbps as f64 * 1e9, gbps as f64 * 1e9, 2_000);
        copy.half_duplex = half_duplex;
        let budget = match budget_kind {
            // A third of the vanilla peaks, mostly out of reach.
            1 => Some(
                graphs
                    .iter()
                    .map(|g| tensile_graph::Liveness::analyze(g).vanilla_footprint().peak)
                    .sum::<u64>()
                    / 3,
            ),
            // Between what the planner reaches without a budget and the
            // largest working set of one op of every job.
            2 => {
                let free = plan_free(&graphs, &lat, copy);
                let floor: u64 = graphs.iter().map(crate::budget::lower_bound_of).sum();
                (free > floor).then(|| floor + ((free - floor) as f64 * budget_frac) as u64)
            }
            _ => None,
        };
        check_with(&graphs, &lat, budget, copy);
    }
}
