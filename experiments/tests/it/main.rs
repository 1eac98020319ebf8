//! The experiments library as `tensilectl` uses it: workloads, one
//! simulation against vanilla, the Pareto summary.

#![allow(clippy::unwrap_used)] // tests unwrap: a failure is the test failing

#[cfg(feature = "bound")]
mod bound;
mod h200;
mod steady;
mod turns;
mod util;

use tensile_baselines::Policy;
use tensile_experiments::pareto::{EPS, dominance};
use tensile_experiments::workload::{MIXED_GAP_NS, MODELS, paper_workloads};
use tensile_experiments::{Experiment, RunPolicy, SimStage, device_profile, simulate_workload};

use util::{options, outcome, resnet50, workload};

#[test]
fn the_quick_bench_has_every_experiment_and_a_seeded_mixed_order() {
    let quick = paper_workloads(1, true);
    for e in Experiment::ALL {
        assert!(quick.iter().any(|w| w.experiment == e), "no {e:?}");
    }
    let mixed = quick
        .iter()
        .find(|w| w.experiment == Experiment::Mixed)
        .unwrap();
    let mut models: Vec<&str> = mixed.jobs.iter().map(|j| j.model.as_str()).collect();
    let order = models.join(", ");
    assert!(mixed.note.contains(&order), "{}", mixed.note);
    models.sort_unstable();
    let mut all = MODELS.to_vec();
    all.sort_unstable();
    assert_eq!(models, all, "the five, each once");
    assert_eq!(
        mixed.starts,
        (0..5).map(|k| k * MIXED_GAP_NS).collect::<Vec<_>>()
    );
    // The same seed, the same order; the whole bench has more workloads.
    let again = paper_workloads(1, true);
    assert_eq!(
        again
            .iter()
            .find(|w| w.experiment == Experiment::Mixed)
            .unwrap()
            .jobs,
        mixed.jobs
    );
    assert!(paper_workloads(1, false).len() > quick.len());
}

#[test]
fn exact_latencies_without_sharing_meet_the_prediction_and_never_stall() {
    let graphs = vec![resnet50(2)];
    let profile = device_profile("a6000").unwrap();
    let mut opts = options(2);
    opts.exact = true;
    opts.no_sharing = true;
    let mut stages = Vec::new();
    let out = simulate_workload(&graphs, Policy::Tensile, &profile, &opts, &mut |s| {
        stages.push(s)
    })
    .unwrap();
    assert_eq!(
        stages,
        [
            SimStage::Vanilla,
            SimStage::Policy(Policy::Tensile),
            SimStage::Bound
        ]
    );
    let r = &out.report;
    assert_eq!(r.policy, Policy::Tensile);
    assert_eq!(r.system.stall_s, 0.0);
    assert_eq!(r.jobs[0].peak_bytes, r.jobs[0].predicted_peak_bytes);
    assert!(r.system.msr > 0.0 && r.system.msr <= r.system.msr_max);
    // A run without stalls is a plan that adds no time: the bound is below
    // it, and above the lower bound of the largest working set.
    let bound = r.bound_peak_bytes.unwrap();
    assert!(
        bound <= r.system.peak_bytes,
        "{bound} > {}",
        r.system.peak_bytes
    );
    assert!(bound >= r.system.lower_bound_bytes, "{bound}");
    assert_eq!(
        r.msr_bound.unwrap(),
        1.0 - bound as f64 / r.system.peak_vanilla_bytes as f64
    );
    assert_eq!(r.cold_start_latencies, "the true latencies (--exact)");
    let json = serde_json::to_value(r).unwrap();
    assert_eq!(json["policy"], "tensile");
}

#[test]
fn capuchin_gets_ours_peaks_as_its_budgets() {
    let graphs = vec![resnet50(2)];
    let profile = device_profile("paper").unwrap();
    let mut stages = Vec::new();
    let out = simulate_workload(&graphs, Policy::Capuchin, &profile, &options(2), &mut |s| {
        stages.push(s)
    })
    .unwrap();
    assert_eq!(
        stages,
        [
            SimStage::Vanilla,
            SimStage::OursForCapuchinBudgets,
            SimStage::Policy(Policy::Capuchin),
            SimStage::Bound
        ]
    );
    assert!(out.report.system.peak_bytes < out.report.system.peak_vanilla_bytes);
}

#[test]
fn unknown_devices_are_named() {
    let err = device_profile("tpu9").unwrap_err().to_string();
    assert!(err.starts_with("unknown device \"tpu9\""), "{err}");
}

#[test]
fn ours_at_a_baselines_peak_counts_for_the_pareto_summary() {
    // vdnn saves more than ours alone but ours matches it at its peak;
    // knapsack is faster than ours at the same saving.
    let w = workload(vec![
        outcome(RunPolicy::Plain(Policy::Tensile), 0.30, 0.05),
        outcome(RunPolicy::Plain(Policy::VdnnConv), 0.40, 0.50),
        outcome(RunPolicy::Plain(Policy::Knapsack), 0.30, 0.01),
        outcome(RunPolicy::OursAtBudgetOf(Policy::VdnnConv), 0.40, 0.20),
        outcome(RunPolicy::OursAtBudgetOf(Policy::Knapsack), 0.30, 0.05),
    ]);
    let d = dominance(&[w]);
    assert_eq!((d.dominated, d.compared), (1, 2));
    assert_eq!(d.losses.len(), 1);
    let loss = &d.losses[0];
    assert_eq!(loss.baseline, Policy::Knapsack);
    assert!((loss.d_eor - 0.04).abs() < 1e-9 && loss.d_msr.abs() < EPS);
    let json = serde_json::to_value(loss).unwrap();
    assert_eq!(json["baseline"], "knapsack");
}

/// Copies that are threads of one process (`tensile-worker --copies`) pay
/// the device's base once: two vanilla ResNet-50 copies together peak
/// lower by exactly one base than two processes do, and the shares of
/// three add up to at least the whole.
#[test]
fn copies_in_one_process_pay_the_base_once() {
    use tensile_experiments::device::one_process;
    let profile = device_profile("a6000").unwrap();
    let graphs = vec![resnet50(2), resnet50(2)];
    let lives: Vec<tensile_graph::Liveness> = graphs
        .iter()
        .map(tensile_graph::Liveness::analyze)
        .collect();
    let peak = |p| {
        tensile_experiments::run_policy(&graphs, &lives, Policy::Vanilla, p, &options(2), None)
            .unwrap()
            .result
            .peak_bytes
    };
    let shared = one_process(&profile, 2);
    assert_eq!(shared.base_bytes * 2, profile.base_bytes);
    assert_eq!(peak(&profile) - peak(&shared), profile.base_bytes);
    let three = one_process(&profile, 3);
    assert!(three.base_bytes * 3 >= profile.base_bytes);
    assert!(three.base_bytes * 3 < profile.base_bytes + 3);
}
