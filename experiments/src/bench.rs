//! The TENSILE paper's experiments (see [`crate::workload`]) for every
//! policy on one or more simulated devices, side by side with vanilla;
//! and Table I: ours in its cold-start iteration (planned from predicted
//! latencies) against its iterations after updating, with Capuchin's
//! passive first iteration beside it (the paper's Table II).
//!
//! Every workload runs vanilla once and every policy against it on the same
//! graphs and true latencies. Capuchin's budget is each job's peak under
//! ours, as the paper set it. Where a baseline ran, ours runs again with
//! that baseline's peak as its budget, so that the two are also compared at
//! the same memory. A policy that fails on a workload is reported with its
//! error, not dropped.

use std::collections::BTreeMap;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;
use tensile_baselines::Policy;
use tensile_graph::Liveness;
use tensile_graph::builder::{Optimizer, Step};
use tensile_latency_model::DeviceProfile;
use tensile_planner::{RecomputeFirst, Turns};

use crate::metrics::{SimReport, phase_metrics, report};
use crate::pareto::{Loss, dominance};
use crate::policy::RunPolicy;
use crate::run::{Run, SimOptions, capuchin_budgets, run_policy};
use crate::workload::{Experiment, Workload, ZooJob, paper_workloads};
use crate::{ColdStart, ExperimentError, error_chain};

/// What `bench paper` runs.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub devices: Vec<DeviceProfile>,
    /// The policies besides vanilla; ours runs whether listed or not.
    pub policies: Vec<Policy>,
    /// Per run: the first is the cold start, the rest are averaged.
    pub iterations: usize,
    /// Seed of the devices' latency bias and of the mixed workload's order.
    pub seed: u64,
    pub activation_budget: f64,
    pub optimizer: Optimizer,
    /// Where the optimizer's updates run.
    pub step: Step,
    /// Only ResNet-50 (and the mixed five) at fewer batch sizes.
    pub quick: bool,
    /// The size of the thread pool the workloads run on.
    pub threads: usize,
}

impl BenchConfig {
    /// The policies run: ours first, then the others as listed, no vanilla
    /// (every policy is measured against it anyway).
    pub fn policies(&self) -> Vec<Policy> {
        let mut policies: Vec<Policy> = self
            .policies
            .iter()
            .copied()
            .filter(|p| *p != Policy::Vanilla)
            .collect();
        if !policies.contains(&Policy::Tensile) {
            policies.insert(0, Policy::Tensile);
        }
        policies
    }

    pub fn workloads(&self) -> Vec<Workload> {
        paper_workloads(self.seed, self.quick)
    }

    /// The simulations a progress bar counts: every policy, and ours again
    /// at each baseline's peak, on every workload and device.
    pub fn total_runs(&self) -> usize {
        self.devices.len() * self.workloads().len() * (2 * self.policies().len() - 1)
    }
}

/// Everything `bench paper` measured (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub iterations: usize,
    pub seed: u64,
    pub devices: Vec<DeviceOutcome>,
    /// The policies run, in order (see [`BenchConfig::policies`]).
    #[serde(skip)]
    pub policies: Vec<Policy>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeviceOutcome {
    pub device: String,
    pub workloads: Vec<WorkloadOutcome>,
    /// (workload, baseline) pairs where ours (on its own, or given the
    /// baseline's peak as its budget) has at least the MSR at no more EOR,
    /// out of all pairs where both ran.
    pub dominated: usize,
    pub compared: usize,
    pub losses: Vec<Loss>,
    pub wall_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkloadOutcome {
    pub experiment: Experiment,
    pub workload: String,
    pub note: String,
    /// What no plan can go under (system), and the saving there.
    pub lower_bound_bytes: u64,
    pub msr_max: f64,
    pub vanilla_peak_bytes: u64,
    pub policies: Vec<PolicyOutcome>,
    /// The workload's jobs.
    #[serde(skip)]
    pub jobs: Vec<ZooJob>,
    /// Memory over time of the first job, under vanilla and each policy
    /// that ran (for plots).
    #[serde(skip)]
    pub traces: Vec<(Policy, Vec<(u64, u64)>)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PolicyOutcome {
    pub policy: RunPolicy,
    /// The run's report, or why the policy failed on this workload.
    pub report: Option<SimReport>,
    pub error: Option<String>,
    /// The first iteration alone (the cold start) against vanilla's steady
    /// iteration: (MSR, EOR) of the slowest job.
    pub first_iteration: Option<(f64, f64)>,
    /// The iterations after the first: (MSR, EOR).
    pub after_first: Option<(f64, f64)>,
}

/// Runs every workload under every policy on every device; `tick` hears of
/// each simulation as it starts (from any thread).
pub fn run_bench(
    config: &BenchConfig,
    tick: &(dyn Fn(&str) + Sync),
) -> Result<BenchReport, ExperimentError> {
    let policies = config.policies();
    let base = SimOptions {
        iterations: config.iterations,
        seed: config.seed,
        exact: false,
        no_sharing: false,
        budget_bytes: None,
        stop_at_budget: false,
        activation_budget: config.activation_budget,
        starts: Vec::new(),
        cold_start: ColdStart::Auto,
        coordinate: true,
        recompute_first: RecomputeFirst::default(),
        turns: Turns::default(),
    };
    let work = config.workloads();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(config.threads.max(1))
        .build()
        .map_err(|e| ExperimentError::Pool {
            reason: e.to_string(),
        })?;
    let mut devices = Vec::new();
    for profile in &config.devices {
        let t = Instant::now();
        // Workloads are independent and each is deterministic: the pool
        // changes how long the bench takes, never what it reports.
        let results: Vec<Result<WorkloadOutcome, ExperimentError>> = pool.install(|| {
            work.par_iter()
                .map(|w| {
                    let tick = |what: &str| tick(&format!("{} {what}", profile.name));
                    run_workload(
                        w,
                        &policies,
                        profile,
                        &base,
                        (config.optimizer, config.step),
                        &tick,
                    )
                })
                .collect()
        });
        let mut outcomes = Vec::new();
        for (w, r) in work.iter().zip(results) {
            outcomes.push(r.map_err(|e| ExperimentError::InWorkload {
                workload: w.name.clone(),
                device: profile.name.clone(),
                source: Box::new(e),
            })?);
        }
        let d = dominance(&outcomes);
        devices.push(DeviceOutcome {
            device: profile.name.clone(),
            workloads: outcomes,
            dominated: d.dominated,
            compared: d.compared,
            losses: d.losses,
            wall_s: t.elapsed().as_secs_f64(),
        });
    }
    Ok(BenchReport {
        iterations: config.iterations,
        seed: config.seed,
        devices,
        policies,
    })
}

/// The first job's memory over time.
fn first_trace(run: &Run) -> Vec<(u64, u64)> {
    run.result
        .jobs
        .first()
        .map(|j| j.trace.clone())
        .unwrap_or_default()
}

/// Runs every policy on one workload.
fn run_workload(
    w: &Workload,
    policies: &[Policy],
    profile: &DeviceProfile,
    base: &SimOptions,
    (optimizer, step): (Optimizer, Step),
    tick: &dyn Fn(&str),
) -> Result<WorkloadOutcome, ExperimentError> {
    let graphs = w.build(optimizer, step)?;
    let lives: Vec<Liveness> = graphs.iter().map(Liveness::analyze).collect();
    let opts = SimOptions {
        starts: w.starts.clone(),
        ..base.clone()
    };
    let vanilla = run_policy(&graphs, &lives, Policy::Vanilla, profile, &opts, None)?;
    let mut runs: BTreeMap<Policy, Result<Run, String>> = BTreeMap::new();
    // Ours first: Capuchin's budget is ours' peak.
    let mut order: Vec<Policy> = policies.to_vec();
    order.sort_by_key(|p| *p != Policy::Tensile);
    for &p in &order {
        tick(&format!("{} / {}", w.name, p.name()));
        let budgets = (p == Policy::Capuchin).then(|| {
            let ours = runs.get(&Policy::Tensile).and_then(|r| r.as_ref().ok());
            capuchin_budgets(&opts, &vanilla, ours)
        });
        let r = run_policy(&graphs, &lives, p, profile, &opts, budgets.as_deref())
            .map_err(|e| error_chain(&e));
        runs.insert(p, r);
    }
    let measure = |p: Policy, run: &Run| report(&graphs, &lives, profile, &opts, p, &vanilla, run);
    let v_report = measure(Policy::Vanilla, &vanilla);
    let mut out = WorkloadOutcome {
        experiment: w.experiment,
        workload: w.name.clone(),
        note: w.note.clone(),
        lower_bound_bytes: v_report.system.lower_bound_bytes,
        msr_max: v_report.system.msr_max,
        vanilla_peak_bytes: v_report.system.peak_vanilla_bytes,
        policies: Vec::new(),
        jobs: w.jobs.clone(),
        traces: vec![(Policy::Vanilla, first_trace(&vanilla))],
    };
    for &p in policies {
        let r = &runs[&p];
        if let Ok(run) = r {
            out.traces.push((p, first_trace(run)));
        }
        out.policies
            .push(outcome(RunPolicy::Plain(p), r, Some(&vanilla), &|run| {
                measure(p, run)
            }));
    }
    // Ours at each baseline's memory: ours gets that baseline's peak as its
    // budget, and the two are compared at the same memory. Where the
    // baseline saves less than ours, ours saves just as much (and stops
    // there); where it saves more, ours is pushed as far.
    if matches!(runs.get(&Policy::Tensile), Some(Ok(_))) {
        let peaks: Vec<(Policy, u64)> = policies
            .iter()
            .zip(&out.policies)
            .filter(|(p, _)| **p != Policy::Tensile)
            .filter_map(|(p, o)| Some((*p, o.report.as_ref()?.system.peak_bytes)))
            .collect();
        for (p, peak) in peaks {
            tick(&format!("{} / tensile at {}'s peak", w.name, p.name()));
            let at = SimOptions {
                budget_bytes: Some(peak),
                stop_at_budget: true,
                ..opts.clone()
            };
            let r = run_policy(&graphs, &lives, Policy::Tensile, profile, &at, None)
                .map_err(|e| error_chain(&e));
            out.policies
                .push(outcome(RunPolicy::OursAtBudgetOf(p), &r, None, &|run| {
                    measure(Policy::Tensile, run)
                }));
        }
    }
    Ok(out)
}

/// What one run of a policy measured on a workload; with `vanilla`, also
/// its first iteration and the later ones apart (Table I).
fn outcome(
    policy: RunPolicy,
    r: &Result<Run, String>,
    vanilla: Option<&Run>,
    measure: &dyn Fn(&Run) -> SimReport,
) -> PolicyOutcome {
    match r {
        Ok(run) => PolicyOutcome {
            policy,
            report: Some(measure(run)),
            error: None,
            first_iteration: vanilla.and_then(|v| phase_metrics(v, run, true)),
            after_first: vanilla.and_then(|v| phase_metrics(v, run, false)),
        },
        Err(e) => PolicyOutcome {
            policy,
            report: None,
            error: Some(e.clone()),
            first_iteration: None,
            after_first: None,
        },
    }
}
