//! One graph planned on its own (`tensilectl plan`): ours' plan from the
//! cold-start (or the true) latencies, what it predicts, and the lower
//! bound.

use std::time::Instant;

use serde::Serialize;
use tensile_baselines::Policy;
use tensile_graph::{Graph, Liveness};
use tensile_latency_model::{DeviceProfile, true_latencies};
use tensile_planner::{EventKind, JobInput, MultiPlan};

use crate::ExperimentError;
use crate::cold_start::{ColdStart, cold_start_latencies};
use crate::device::{job_settings, planner_config};
use crate::metrics::lower_bound_bytes;

/// How the graph is planned.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// Seed of the simulated device's per-op latency bias (for `exact`).
    pub seed: u64,
    /// Plan from the true latencies instead of the cold-start estimate.
    pub exact: bool,
    pub budget_bytes: Option<u64>,
    pub stop_at_budget: bool,
    pub cold_start: ColdStart,
}

/// The plan and what it took.
#[derive(Debug, Clone)]
pub struct PlanOutcome {
    /// One plan (the graph's) and the planner's diagnostics.
    pub plan: MultiPlan,
    /// Wall time of planning, ms.
    pub plan_ms: f64,
    pub lower_bound_bytes: u64,
    pub warnings: Vec<String>,
}

/// Plans `graph` alone on `profile`.
pub fn plan_job(
    graph: &Graph,
    profile: &DeviceProfile,
    opts: &PlanOptions,
) -> Result<PlanOutcome, ExperimentError> {
    let (lat, warnings) = if opts.exact {
        (true_latencies(graph, profile, opts.seed), Vec::new())
    } else {
        let c = cold_start_latencies(std::slice::from_ref(graph), profile, &opts.cold_start)?;
        (c.per_job.into_iter().next().unwrap_or_default(), c.warnings)
    };
    let cfg = planner_config(profile, opts.budget_bytes, opts.stop_at_budget);
    let input = JobInput::new(graph, lat, job_settings(Policy::Tensile, profile));
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
