//! Invariants of planning and execution together: with exact latencies the
//! executor never stalls and measures exactly the predicted peak.
#![allow(clippy::unwrap_used)]

use tensile_executor::sim::{FixedPlans, SimConfig, SimJob, simulate};
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Graph, Liveness};
use tensile_planner::{CopyModel, JobInput, JobSettings, PlannerConfig, plan};

/// A stand-in for true latencies: proportional to the bytes an op touches.
fn latencies(g: &Graph) -> Vec<u64> {
    g.ops()
        .iter()
        .map(|op| {
            let b: u64 = op
                .inputs
                .iter()
                .chain(&op.outputs)
                .map(|&t| g.tensor(t).bytes)
                .sum();
            2_000 + b / 200
        })
        .collect()
}

fn check(graphs: &[Graph], budget: Option<u64>, copy: CopyModel) {
    let lives: Vec<Liveness> = graphs.iter().map(Liveness::analyze).collect();
    let lat: Vec<Vec<u64>> = graphs.iter().map(latencies).collect();
    let inputs: Vec<JobInput<'_>> = graphs
        .iter()
        .zip(&lat)
        .map(|(g, l)| JobInput {
            graph: g,
            latency_ns: l.clone(),
            settings: JobSettings::default(),
        })
        .collect();
    let mut cfg = PlannerConfig::new(copy);
    cfg.budget_bytes = budget;
    let mp = plan(&inputs, &cfg).unwrap();
    let jobs: Vec<SimJob<'_>> = graphs
        .iter()
        .zip(&lives)
        .zip(&mp.plans)
        .zip(&lat)
        .map(|(((g, live), p), l)| SimJob {
            graph: g,
            live,
            plan: p.clone(),
            true_ns: l.clone(),
            start_ns: 0,
        })
        .collect();
    let sim = SimConfig {
        iterations: 3,
        sharing_slowdown: 0.0,
        copy,
        base_bytes: 0,
    };
    let r = simulate(jobs, &sim, &mut FixedPlans);
    for (j, (res, p)) in r.jobs.iter().zip(&mp.plans).enumerate() {
        let name = graphs[j].name();
        assert_eq!(res.error, None, "{name}");
        assert_eq!(res.iterations.len(), 3, "{name}");
        for it in &res.iterations {
            assert_eq!(
                it.recomputed_ops, p.prediction.recomputed_ops,
                "{name}: recomputes"
            );
            assert_eq!(it.stall_ns, 0, "{name}: stalled");
            assert_eq!(it.passive_swaps, 0, "{name}: passive swaps");
            assert_eq!(
                it.peak_bytes, p.prediction.planned_peak_bytes,
                "{name}: peak"
            );
            assert_eq!(
                it.end_ns - it.start_ns,
                p.prediction.planned_time_ns,
                "{name}: time"
            );
        }
        assert!(p.prediction.planned_peak_bytes <= p.prediction.vanilla_peak_bytes);
    }
}

fn zoo_graph(name: &str, batch: u64) -> Graph {
    zoo::build(name, &ZooConfig::new(batch)).unwrap()
}

#[test]
fn exact_latencies_every_zoo_model_one_job() {
    for m in &zoo::MODELS {
        check(
            &[zoo_graph(m.name, 2)],
            None,
            CopyModel::duplex(24e9, 24e9, 5_000),
        );
    }
}

#[test]
fn exact_latencies_with_recomputation() {
    for name in ["resnet50", "densenet121", "vgg16"] {
        let g = zoo_graph(name, 4);
        let vanilla = Liveness::analyze(&g).vanilla_footprint().peak;
        check(
            &[g],
            Some(vanilla / 3),
            CopyModel::duplex(24e9, 24e9, 5_000),
        );
    }
}

#[test]
fn exact_latencies_several_jobs_half_duplex() {
    let graphs = vec![
        zoo_graph("resnet50", 2),
        zoo_graph("vgg16", 2),
        zoo_graph("bert_base", 2),
    ];
    let mut copy = CopyModel::duplex(12e9, 12e9, 5_000);
    copy.half_duplex = true;
    check(&graphs, None, copy);
    check(&graphs, Some(1), CopyModel::duplex(24e9, 24e9, 5_000));
}
