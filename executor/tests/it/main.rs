//! Invariants of planning and execution together: with exact latencies the
//! executor never stalls and measures exactly the predicted peak.
#![allow(clippy::unwrap_used)]

use tensile_executor::sim::{FixedPlans, SimConfig, SimJob, simulate};
use tensile_graph::builder::{Optimizer, Step};
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Graph, Liveness};
use tensile_planner::{CopyModel, JobInput, JobSettings, PlannerConfig, plan};

mod budget;
mod engine;
mod evict;
mod guard;
mod options;
mod random;
mod snapshots;
mod validity;

/// A stand-in for true latencies: proportional to the bytes an op touches.
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
            2_000 + b / 200
        })
        .collect()
}

fn check(graphs: &[Graph], budget: Option<u64>, copy: CopyModel) {
    let lat: Vec<Vec<u64>> = graphs.iter().map(latencies).collect();
    check_with(graphs, &lat, budget, copy);
}

/// Plans `graphs` from `lat`, checks every plan with the independent
/// validity check, then runs them with `lat` as the truth: no passive
/// swap, exactly the predicted peak, time and waits (none unless a budget
/// asked for them), every iteration.
pub(crate) fn check_with(graphs: &[Graph], lat: &[Vec<u64>], budget: Option<u64>, copy: CopyModel) {
    let lives: Vec<Liveness> = graphs.iter().map(Liveness::analyze).collect();
    let inputs: Vec<JobInput<'_>> = graphs
        .iter()
        .zip(lat)
        .map(|(g, l)| JobInput::new(g, l.clone(), JobSettings::default()))
        .collect();
    let mut cfg = PlannerConfig::new(copy);
    cfg.budget_bytes = budget;
    let mp = plan(&inputs, &cfg).unwrap();
    let share = if copy.shared_by_jobs {
        1.0 / graphs.len() as f64
    } else {
        1.0
    };
    for (j, p) in mp.plans.iter().enumerate() {
        let bad = validity::check_plan(&graphs[j], &lives[j], p, &lat[j], copy, share);
        assert!(
            bad.is_empty(),
            "{}: invalid plan: {bad:#?}",
            graphs[j].name()
        );
    }
    let jobs: Vec<SimJob<'_>> = graphs
        .iter()
        .zip(&lives)
        .zip(&mp.plans)
        .zip(lat)
        .map(|(((g, live), p), l)| SimJob::new(g, live, p.clone(), l.clone()))
        .collect();
    let sim = SimConfig {
        iterations: 3,
        sharing_slowdown: 0.0,
        copy,
        base_bytes: 0,
        budget_bytes: None,
        shared_link: false,
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
            assert_eq!(
                it.stall_ns,
                p.prediction.stall_ns(),
                "{name}: stalled otherwise than planned"
            );
            if budget.is_none() {
                assert_eq!(it.stall_ns, 0, "{name}: stalled with no budget");
            }
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
    // A budget is met unless the planner says why not.
    if let Some(b) = budget
        && mp
            .diagnostics
            .iter()
            .all(|d| !d.message.contains("over the budget"))
    {
        assert!(
            mp.sum_of_peaks_bytes <= b,
            "{} > {b}",
            mp.sum_of_peaks_bytes
        );
    }
}

/// An MLP of `depth` hidden layers and a head, `batch` x `width`
/// activations: the tiny model of the snapshot, eviction, option and
/// budget tests.
pub(crate) fn mlp(batch: u64, width: u64, depth: usize, optimizer: Optimizer) -> Graph {
    tensile_graph::builder::mlp(batch, width, depth, false, optimizer).expect("valid")
}

fn zoo_graph(name: &str, batch: u64) -> Graph {
    zoo::build(name, &ZooConfig::new(batch)).unwrap()
}

fn zoo_graph_on_host(name: &str, batch: u64) -> Graph {
    let config = ZooConfig {
        step: Step::OnHost,
        ..ZooConfig::new(batch)
    };
    zoo::build(name, &config).unwrap()
}

/// With every update on the host: the gradients go out, the updates run on
/// the host beside the backward pass, the parameters come back, and the
/// executor measures what the planner predicted, to the byte and the ns.
#[test]
fn exact_latencies_with_updates_on_the_host() {
    for name in ["bert_base", "resnet50"] {
        check(
            &[zoo_graph_on_host(name, 2)],
            None,
            CopyModel::duplex(24e9, 24e9, 5_000),
        );
    }
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

/// Plans made from latencies that overstate the backward pass by a quarter
/// start prefetches too late: the first iteration stalls and reports its
/// late prefetches; the re-plans (measured latencies folded in, and a lead
/// for every late tensor) remove the stalls.
#[test]
fn late_prefetches_are_fixed_by_replanning() {
    use std::sync::Arc;
    use tensile_executor::replan::TimedReplanner;
    use tensile_graph::Phase;

    let g = zoo_graph("resnet50", 4);
    let live = Liveness::analyze(&g);
    let truth = latencies(&g);
    let predicted: Vec<u64> = truth
        .iter()
        .zip(g.ops())
        .map(|(&t, op)| {
            if op.phase == Phase::Backward {
                t + t / 4
            } else {
                t
            }
        })
        .collect();
    let copy = CopyModel::duplex(24e9, 24e9, 5_000);
    let mut rp = TimedReplanner::new(
        vec![Arc::new(g.clone())],
        &[predicted],
        &[JobSettings::default()],
        PlannerConfig::new(copy),
    )
    .unwrap();
    let first = rp.plan_all().unwrap();
    let jobs = vec![SimJob::new(&g, &live, first.plans[0].clone(), truth)];
    let sim = SimConfig {
        iterations: 8,
        sharing_slowdown: 0.0,
        copy,
        base_bytes: 0,
        budget_bytes: None,
        shared_link: false,
    };
    let r = simulate(jobs, &sim, &mut rp);
    let its = &r.jobs[0].iterations;
    assert!(its[0].stall_ns > 0, "the first iteration must stall");
    assert!(!its[0].late_prefetches.is_empty());
    assert!(rp.inner.replans >= 1);
    // Measured: stalls of 1.9 ms, 1.6 ms, 0.5 ms, then none.
    for it in &its[3..] {
        assert_eq!(it.stall_ns, 0, "still late: {:?}", it.late_prefetches);
    }
}

/// With `stop_at_budget`, ours saves just what the budget asks: the
/// predicted peak fits the budget, fewer tensors move than when it saves
/// all it can hide, and the run still measures exactly the prediction.
#[test]
fn stop_at_budget_saves_just_enough() {
    let g = zoo_graph("resnet50", 4);
    let lat = latencies(&g);
    let copy = CopyModel::duplex(24e9, 24e9, 5_000);
    let run = |budget: Option<u64>, stop: bool| {
        let mut cfg = PlannerConfig::new(copy);
        cfg.budget_bytes = budget;
        cfg.stop_at_budget = stop;
        plan(
            &[JobInput::new(&g, lat.clone(), JobSettings::default())],
            &cfg,
        )
        .unwrap()
        .plans
        .remove(0)
    };
    let all = run(None, false);
    let (vanilla, full) = (
        all.prediction.vanilla_peak_bytes,
        all.prediction.planned_peak_bytes,
    );
    assert!(full < vanilla);
    // Halfway between vanilla and everything hidden.
    let budget = (vanilla + full) / 2;
    let just = run(Some(budget), true);
    assert!(just.prediction.planned_peak_bytes <= budget);
    assert!(
        just.prediction.planned_peak_bytes > full,
        "it stopped early"
    );
    assert!(
        just.count(tensile_planner::EventKind::SwapOut)
            < all.count(tensile_planner::EventKind::SwapOut),
        "fewer swaps"
    );
    // Without the flag the same budget changes nothing: everything that
    // hides is swapped anyway.
    assert_eq!(run(Some(budget), false).events, all.events);
    // A budget over vanilla's peak: no swap at all.
    assert_eq!(
        run(Some(vanilla + 1), true).count(tensile_planner::EventKind::SwapOut),
        0
    );
}
