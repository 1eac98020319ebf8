//! Helpers of the integration tests: zoo graphs, options, hand-made
//! outcomes.

#![allow(dead_code)] // not every test uses every helper

use tensile_experiments::{
    ColdStart, Experiment, Metrics, PolicyOutcome, RunPolicy, SimOptions, SimReport,
    WorkloadOutcome,
};
use tensile_graph::Graph;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_planner::{RecomputeFirst, Turns};

pub(crate) fn resnet50(batch: u64) -> Graph {
    zoo::build("resnet50", &ZooConfig::new(batch)).unwrap()
}

/// The bench's options for `iterations` iterations.
pub(crate) fn options(iterations: usize) -> SimOptions {
    SimOptions {
        iterations,
        seed: 1,
        exact: false,
        no_sharing: false,
        budget_bytes: None,
        stop_at_budget: false,
        activation_budget: 0.5,
        starts: Vec::new(),
        cold_start: ColdStart::Auto,
        coordinate: true,
        recompute_first: RecomputeFirst::default(),
        turns: Turns::default(),
    }
}

/// A run that measured this system MSR and EOR.
pub(crate) fn outcome(policy: RunPolicy, msr: f64, eor: f64) -> PolicyOutcome {
    let system = Metrics {
        name: "system".into(),
        msr,
        eor,
        ..Metrics::default()
    };
    PolicyOutcome {
        policy,
        report: Some(SimReport {
            device: "test".into(),
            policy: policy.policy(),
            iterations: 2,
            seed: 1,
            jobs: Vec::new(),
            system,
            predicted_sum_of_peaks_bytes: 0,
            predicted_aligned_peak_bytes: 0,
            first_plan_ms: 0.0,
            replan_mean_ms: 0.0,
            replan_max_ms: 0.0,
            cold_start_latencies: String::new(),
            bound_peak_bytes: None,
            msr_bound: None,
            cold_start_error: 0.0,
        }),
        error: None,
        first_iteration: None,
        after_first: None,
    }
}

pub(crate) fn workload(policies: Vec<PolicyOutcome>) -> WorkloadOutcome {
    WorkloadOutcome {
        experiment: Experiment::Single,
        workload: "resnet50 b16".into(),
        note: String::new(),
        lower_bound_bytes: 0,
        msr_max: 1.0,
        vanilla_peak_bytes: 0,
        policies,
        jobs: Vec::new(),
        traces: Vec::new(),
    }
}
