//! One graph planned on its own (`tensilectl plan`, `tensile.plan()`):
//! ours' plan from the cold-start (or the true) latencies, what it
//! predicts, and the lower bound.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use tensile_graph::{Graph, Liveness};
use tensile_latency_model::{DeviceProfile, true_latencies};
use tensile_planner::{EventKind, JobInput, MultiPlan};

use crate::PlanJobError;
use crate::cold_start::{ColdStart, cold_start_latencies_with};
use crate::device::{job_settings, planner_config};

/// How the graph is planned.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// Seed of the simulated device's per-op latency bias (for `exact`).
    pub seed: u64,
    /// Plan from the true latencies instead of the cold-start estimate.
    pub exact: bool,
    /// The memory the plan should fit, if any.
    pub budget_bytes: Option<u64>,
    /// Stop once the plan fits the budget instead of swapping all that can
    /// be hidden.
    pub stop_at_budget: bool,
    pub cold_start: ColdStart,
    /// Whether the plan may recompute (the planner's
    /// `JobSettings::recompute`): off for a runtime that cannot.
    pub recompute: bool,
    /// The ONNX Runtime library the learned cold-start models run on;
    /// `None`: the default one (`tensile_latency_model::predict::default_ort_library`).
    pub ort_library: Option<PathBuf>,
}

impl Default for PlanOptions {
    /// `tensilectl plan`'s defaults: seed 1, cold-start latencies found
    /// automatically, no budget, recomputation allowed.
    fn default() -> PlanOptions {
        PlanOptions {
            seed: 1,
            exact: false,
            budget_bytes: None,
            stop_at_budget: false,
            cold_start: ColdStart::Auto,
            recompute: true,
            ort_library: None,
        }
    }
}

/// The plan and what it took.
#[derive(Debug, Clone)]
pub struct PlanOutcome {
    /// One plan (the graph's) and the planner's diagnostics.
    pub plan: MultiPlan,
    /// Wall time of planning, ms.
    pub plan_ms: f64,
    /// The lowest peak any plan could reach ([`lower_bound_bytes`]).
    pub lower_bound_bytes: u64,
    /// What the user should know (models trained for another device).
    pub warnings: Vec<String>,
}

/// The lowest peak a job of `graph` can have on `profile`: its largest
/// working set (one op's inputs and outputs) plus the profile's base.
pub fn lower_bound_bytes(graph: &Graph, live: &Liveness, profile: &DeviceProfile) -> u64 {
    live.largest_working_set(graph) + profile.base_bytes
}

/// Plans `graph` alone on `profile`.
pub fn plan_job(
    graph: &Graph,
    profile: &DeviceProfile,
    opts: &PlanOptions,
) -> Result<PlanOutcome, PlanJobError> {
    let (lat, warnings) = if opts.exact {
        (true_latencies(graph, profile, opts.seed), Vec::new())
    } else {
        let c = cold_start_latencies_with(
            std::slice::from_ref(graph),
            profile,
            &opts.cold_start,
            opts.ort_library.as_deref(),
        )?;
        (c.per_job.into_iter().next().unwrap_or_default(), c.warnings)
    };
    let cfg = planner_config(profile, opts.budget_bytes, opts.stop_at_budget);
    let mut settings = job_settings(profile);
    settings.recompute = opts.recompute;
    let input = JobInput::new(graph, lat, settings);
    let t = Instant::now();
    let plan = tensile_planner::plan(&[input], &cfg)?;
    let plan_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(PlanOutcome {
        plan,
        plan_ms,
        lower_bound_bytes: lower_bound_bytes(graph, &Liveness::analyze(graph), profile),
        warnings,
    })
}

/// What `tensilectl plan` reports (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    /// The zoo model's name, or the graph file's graph name.
    pub model: String,
    /// The zoo batch size; `null` for a graph file.
    pub batch: Option<u64>,
    pub device: String,
    pub vanilla_peak_bytes: u64,
    pub planned_peak_bytes: u64,
    /// The memory saving ratio: 1 − planned peak / vanilla peak.
    pub msr: f64,
    pub vanilla_time_s: f64,
    pub planned_time_s: f64,
    pub swap_outs: usize,
    pub swap_ins: usize,
    pub releases: usize,
    pub recomputed_ops: usize,
    pub swapped_bytes: u64,
    pub plan_ms: f64,
    pub lower_bound_bytes: u64,
    /// The planner's diagnostics, as messages.
    pub diagnostics: Vec<String>,
}

impl PlanReport {
    /// The report of `o`, the plan of `model` (`batch`: the zoo batch) on
    /// `profile`.
    pub fn new(
        model: String,
        batch: Option<u64>,
        profile: &DeviceProfile,
        o: &PlanOutcome,
    ) -> PlanReport {
        let p = &o.plan.plans[0];
        let pr = &p.prediction;
        PlanReport {
            model,
            batch,
            device: profile.name.clone(),
            vanilla_peak_bytes: pr.vanilla_peak_bytes,
            planned_peak_bytes: pr.planned_peak_bytes,
            msr: 1.0 - pr.planned_peak_bytes as f64 / pr.vanilla_peak_bytes.max(1) as f64,
            vanilla_time_s: pr.vanilla_time_ns as f64 / 1e9,
            planned_time_s: pr.planned_time_ns as f64 / 1e9,
            swap_outs: p.count(EventKind::SwapOut),
            swap_ins: p.count(EventKind::SwapIn),
            releases: p.count(EventKind::Release),
            recomputed_ops: pr.recomputed_ops,
            swapped_bytes: pr.swapped_bytes,
            plan_ms: o.plan_ms,
            lower_bound_bytes: o.lower_bound_bytes,
            diagnostics: o.plan.diagnostics.iter().map(|d| d.to_string()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_graph::zoo;

    fn graph() -> Graph {
        zoo::build("resnet50", &zoo::ZooConfig::new(2)).expect("a zoo model")
    }

    #[test]
    fn a_plan_without_recomputation_recomputes_nothing_even_under_a_tight_budget() {
        let g = graph();
        let profile = tensile_latency_model::device_profile("a6000").expect("a6000");
        let tight = PlanOptions {
            budget_bytes: Some(1),
            cold_start: ColdStart::Roofline,
            ..PlanOptions::default()
        };
        let with = plan_job(&g, &profile, &tight).expect("planned");
        assert!(
            with.plan.plans[0].count(EventKind::Recompute) > 0,
            "the tight budget must make the planner recompute for this test to mean anything"
        );
        let without = plan_job(
            &g,
            &profile,
            &PlanOptions {
                recompute: false,
                ..tight
            },
        )
        .expect("planned");
        assert_eq!(without.plan.plans[0].count(EventKind::Recompute), 0);
        assert_eq!(without.plan.plans[0].prediction.recomputed_ops, 0);
    }

    #[test]
    fn the_report_says_what_the_plan_predicts() {
        let g = graph();
        let profile = tensile_latency_model::device_profile("h100").expect("h100");
        let opts = PlanOptions {
            cold_start: ColdStart::Roofline,
            ..PlanOptions::default()
        };
        let o = plan_job(&g, &profile, &opts).expect("planned");
        let r = PlanReport::new("resnet50".into(), Some(2), &profile, &o);
        let p = &o.plan.plans[0].prediction;
        assert_eq!(r.planned_peak_bytes, p.planned_peak_bytes);
        assert!(r.planned_peak_bytes < r.vanilla_peak_bytes && r.msr > 0.0);
        assert!(r.lower_bound_bytes <= r.planned_peak_bytes);
        assert_eq!(r.device, "h100");
        let json = serde_json::to_value(&r).expect("serializable");
        assert_eq!(json["batch"], 2);
    }
}
