//! One workload under one policy in the simulator, every policy through
//! the same executor on the same graphs and true latencies: ours and
//! vanilla through the EWMA re-planner, Capuchin through its own, the
//! fixed-plan baselines with no re-planning.

use std::sync::Arc;
use std::time::Instant;

use tensile_baselines::{BaselineInput, Capuchin, Policy, static_plan};
use tensile_executor::ExecOptions;
use tensile_executor::replan::TimedReplanner;
use tensile_executor::sim::{FixedPlans, SimConfig, SimJob, SimResult, simulate};
use tensile_graph::{Graph, Liveness};
use tensile_latency_model::{DeviceProfile, estimate_latencies, true_latencies};
use tensile_planner::{JobSettings, Layout, PlannerConfig, RecomputeFirst, Turns};

use crate::ExperimentError;
use crate::cold_start::{ColdStart, cold_start_latencies, relative_error};
use crate::device::{copy_model, job_settings, planner_config};
use crate::metrics::{SimReport, report};

/// How a workload is simulated (from `sim`'s flags, or set by the bench).
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub iterations: usize,
    /// Seed of the simulated device's per-op latency bias (job `j` uses
    /// `seed + j`).
    pub seed: u64,
    /// Plan from the true latencies instead of the cold-start estimate.
    pub exact: bool,
    /// Kernels of different jobs do not slow each other down.
    pub no_sharing: bool,
    pub budget_bytes: Option<u64>,
    /// Ours stops planning once under the budget.
    pub stop_at_budget: bool,
    /// The knapsack policy's activation budget.
    pub activation_budget: f64,
    /// When each job starts, ns (empty: all at 0).
    pub starts: Vec<u64>,
    pub cold_start: ColdStart,
    /// Ours coordinates two jobs or more: gates (a common period, a phase
    /// each), copies on one common time line over the whole link, the
    /// budget on the aligned sum (`PlannerConfig::coordinate`).
    pub coordinate: bool,
    /// Ours plans coordinated jobs that swaps alone leave over the budget
    /// again recomputing first (`PlannerConfig::recompute_first`).
    pub recompute_first: RecomputeFirst,
    /// When ours' coordinated jobs under a budget take turns instead of
    /// sharing the device (`PlannerConfig::turns`).
    pub turns: Turns,
}

/// What one policy did on one workload.
#[derive(Debug, Clone)]
pub struct Run {
    pub result: SimResult,
    pub plan_ms: f64,
    /// Every planning run's wall time, ms; the first is the cold start.
    pub plan_runs_ms: Vec<f64>,
    pub replans: usize,
    /// The first plan's predicted global peak: (sum of peaks, aligned).
    pub predicted: (u64, u64),
    /// Each job's predicted peak under its first plan (0: not predicted).
    pub predicted_peaks: Vec<u64>,
    /// Where the latencies the first plan was made from came from.
    pub predicted_from: String,
    /// Σ|predicted − true| / Σ true over every op of every job.
    pub cold_start_error: f64,
    /// What the user should know about the run (see `ColdStartLatencies`).
    pub warnings: Vec<String>,
    /// The first plan's gates (a coordinated plan), job by job.
    pub gates: Vec<Option<tensile_planner::Gate>>,
    /// Every plan's layout, the first's first: how the jobs shared the
    /// device as the run went on.
    pub layouts: Vec<Layout>,
    /// The first plan's predicted cycles sharing and taking turns, ns (0:
    /// not predicted), and why its layout was taken.
    pub shared_cycle_ns: u64,
    pub turns_cycle_ns: u64,
    pub layout_note: String,
}

impl Run {
    /// A run whose policy predicts nothing.
    fn measured(result: SimResult) -> Run {
        Run {
            result,
            plan_ms: 0.0,
            plan_runs_ms: Vec::new(),
            replans: 0,
            predicted: (0, 0),
            predicted_peaks: Vec::new(),
            predicted_from: String::new(),
            cold_start_error: 0.0,
            warnings: Vec::new(),
            gates: Vec::new(),
            layouts: Vec::new(),
            shared_cycle_ns: 0,
            turns_cycle_ns: 0,
            layout_note: String::new(),
        }
    }
}

/// The one place the re-planner of ours (and of vanilla, which is ours
/// with every move off and re-planning disabled) is made.
fn new_replanner(
    graphs: &[Graph],
    predicted: &[Vec<u64>],
    settings: JobSettings,
    config: PlannerConfig,
    enabled: bool,
) -> Result<TimedReplanner, ExperimentError> {
    let mut replanner = TimedReplanner::new(
        graphs.iter().map(|g| Arc::new(g.clone())).collect(),
        predicted,
        &vec![settings; graphs.len()],
        config,
    )?;
    replanner.inner.enabled = enabled;
    Ok(replanner)
}

/// Runs `policy` on `graphs`. `budgets`: each job's memory budget, for
/// Capuchin (ours is given the same limit only through
/// [`SimOptions::budget_bytes`]).
pub fn run_policy(
    graphs: &[Graph],
    lives: &[Liveness],
    policy: Policy,
    profile: &DeviceProfile,
    opts: &SimOptions,
    budgets: Option<&[u64]>,
) -> Result<Run, ExperimentError> {
    let mut cfg = planner_config(profile, opts.budget_bytes, opts.stop_at_budget);
    let ours = policy == Policy::Tensile;
    cfg.coordinate = ours && opts.coordinate && graphs.len() >= 2;
    cfg.recompute_first = opts.recompute_first;
    cfg.turns = opts.turns;
    if opts.no_sharing {
        cfg.sharing_slowdown = 0.0;
    }

    let truth: Vec<Vec<u64>> = graphs
        .iter()
        .enumerate()
        .map(|(j, g)| true_latencies(g, profile, opts.seed.wrapping_add(j as u64)))
        .collect();
    let (predicted, predicted_from, warnings) = if opts.exact {
        let from = "the true latencies (--exact)".to_string();
        (truth.clone(), from, Vec::new())
    } else if policy == Policy::Tensile {
        let c = cold_start_latencies(graphs, profile, &opts.cold_start)?;
        (c.per_job, c.source, c.warnings)
    } else {
        let lat = graphs
            .iter()
            .map(|g| estimate_latencies(g, profile))
            .collect();
        (lat, "roofline estimate".to_string(), Vec::new())
    };
    // Measured against the kernels' own latencies, before the slowdown of
    // sharing the GPU that ours adds below.
    let cold_start_error = relative_error(&predicted, &truth);
    // Jobs that share the GPU slow each other's kernels: ours starts from
    // the device's sharing slowdown for this many jobs (its measurements
    // take over after the first iteration).
    let k = graphs.len();
    let (predicted, predicted_from) = if ours && k > 1 && !opts.no_sharing {
        let f = 1.0 + profile.sharing_slowdown * (k - 1) as f64;
        let scaled = predicted
            .iter()
            .map(|l| l.iter().map(|&x| (x as f64 * f).round() as u64).collect())
            .collect();
        (
            scaled,
            format!("{predicted_from}, x{f:.2} for {k} jobs sharing the GPU"),
        )
    } else {
        (predicted, predicted_from)
    };
    let sim = SimConfig {
        iterations: opts.iterations,
        sharing_slowdown: if opts.no_sharing {
            0.0
        } else {
            profile.sharing_slowdown
        },
        copy: copy_model(profile),
        base_bytes: profile.base_bytes,
        // Ours never lets the run exceed the budget its plans were made
        // for (the executor's guard); the baselines run as they would.
        budget_bytes: opts.budget_bytes.filter(|_| ours),
        // Set below from whether the planner coordinated the jobs.
        shared_link: false,
    };
    let jobs = |plans: Vec<tensile_planner::Plan>, options: &dyn Fn(usize) -> ExecOptions| {
        graphs
            .iter()
            .zip(lives)
            .zip(plans)
            .zip(truth.clone())
            .enumerate()
            .map(|(j, (((graph, live), plan), true_ns))| SimJob {
                options: options(j),
                start_ns: opts.starts.get(j).copied().unwrap_or(0),
                ..SimJob::new(graph, live, plan, true_ns)
            })
            .collect::<Vec<SimJob<'_>>>()
    };
    let mut run = match policy {
        Policy::Vanilla | Policy::Tensile => {
            let settings = job_settings(policy, profile);
            let mut replanner =
                new_replanner(graphs, &predicted, settings, cfg, policy != Policy::Vanilla)?;
            let first = replanner.plan_all()?;
            // Coordinated plans put every job's copies on the whole link.
            let sim = SimConfig {
                shared_link: first.cycle_ns > 0,
                ..sim
            };
            let predicted_peaks = first
                .plans
                .iter()
                .map(|p| p.prediction.planned_peak_bytes)
                .collect();
            let gates = first.plans.iter().map(|p| p.gate).collect();
            let (shared_cycle_ns, turns_cycle_ns) = (first.shared_cycle_ns, first.turns_cycle_ns);
            let layout_note = first.layout_note.clone();
            let result = simulate(
                jobs(first.plans, &|_| ExecOptions::default()),
                &sim,
                &mut replanner,
            );
            Run {
                plan_ms: replanner.plan_ns.iter().sum::<u64>() as f64 / 1e6,
                plan_runs_ms: replanner.plan_ns.iter().map(|&n| n as f64 / 1e6).collect(),
                replans: replanner.inner.replans,
                predicted: (first.sum_of_peaks_bytes, first.aligned_peak_bytes),
                predicted_peaks,
                gates,
                layouts: replanner.layouts.clone(),
                shared_cycle_ns,
                turns_cycle_ns,
                layout_note,
                ..Run::measured(result)
            }
        }
        Policy::Capuchin => {
            let budgets = budgets.ok_or(ExperimentError::NoBudgets)?.to_vec();
            let mut cap = Capuchin::new(
                graphs.iter().collect(),
                lives.iter().collect(),
                budgets,
                cfg.copy,
            );
            let plans = cap.initial_plans();
            let options: Vec<ExecOptions> =
                (0..graphs.len()).map(|j| cap.exec_options(j)).collect();
            let result = simulate(jobs(plans, &|j| options[j]), &sim, &mut cap);
            Run::measured(result)
        }
        _ => {
            let t = Instant::now();
            let plans = graphs
                .iter()
                .zip(lives)
                .zip(&predicted)
                .map(|((graph, live), lat)| {
                    static_plan(
                        policy,
                        &BaselineInput {
                            graph,
                            live,
                            latency_ns: lat,
                            copy: cfg.copy,
                            activation_budget: opts.activation_budget,
                        },
                    )
                })
                .collect::<Result<Vec<_>, _>>()?;
            let plan_ms = t.elapsed().as_secs_f64() * 1e3;
            let result = simulate(
                jobs(plans, &|_| policy.exec_options()),
                &sim,
                &mut FixedPlans,
            );
            Run {
                plan_ms,
                plan_runs_ms: vec![plan_ms],
                ..Run::measured(result)
            }
        }
    };
    if let Some((at_ns, e)) = run.result.replan_errors.first() {
        return Err(ExperimentError::Replan {
            policy: policy.name(),
            at_ns: *at_ns,
            source: e.clone(),
        });
    }
    for (j, r) in run.result.jobs.iter().enumerate() {
        if let Some(e) = &r.error {
            return Err(ExperimentError::JobFailed {
                policy: policy.name(),
                job: j,
                name: graphs[j].name().to_string(),
                source: e.clone(),
            });
        }
    }
    if run.predicted_peaks.is_empty() {
        run.predicted_peaks = vec![0; graphs.len()];
    }
    run.predicted_from = predicted_from;
    run.cold_start_error = cold_start_error;
    run.warnings = warnings;
    Ok(run)
}

/// Capuchin's memory budget per job: the budget split over the jobs by
/// their vanilla peaks, else each job's peak under ours (`ours`), as the
/// TENSILE paper set it.
pub fn capuchin_budgets(opts: &SimOptions, vanilla: &Run, ours: Option<&Run>) -> Vec<u64> {
    let peaks = |r: &Run| -> Vec<u64> { r.result.jobs.iter().map(|j| j.peak_bytes()).collect() };
    match (opts.budget_bytes, ours) {
        (None, Some(ours)) => peaks(ours),
        (budget, _) => {
            let v = peaks(vanilla);
            let total: u64 = v.iter().sum();
            let budget = budget.unwrap_or(total);
            v.iter()
                .map(|&p| (budget as f64 * p as f64 / total.max(1) as f64) as u64)
                .collect()
        }
    }
}

/// What [`simulate_workload`] is about to run, for progress lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimStage {
    Vanilla,
    /// Ours, whose peaks are Capuchin's budgets.
    OursForCapuchinBudgets,
    Policy(Policy),
    /// The bound no swap plan goes under (a linear program).
    Bound,
}

/// A `sim`: vanilla and the policy, and the report of one against the other.
#[derive(Debug, Clone)]
pub struct SimOutcome {
    pub vanilla: Run,
    pub run: Run,
    pub report: SimReport,
    /// Every run's warnings, in order.
    pub warnings: Vec<String>,
}

/// Runs vanilla, then `policy` (Capuchin with its budgets: the budget
/// split by vanilla peaks, else ours' peaks), and measures one against the
/// other.
pub fn simulate_workload(
    graphs: &[Graph],
    policy: Policy,
    profile: &DeviceProfile,
    opts: &SimOptions,
    stage: &mut dyn FnMut(SimStage),
) -> Result<SimOutcome, ExperimentError> {
    let lives: Vec<Liveness> = graphs.iter().map(Liveness::analyze).collect();
    stage(SimStage::Vanilla);
    let vanilla = run_policy(graphs, &lives, Policy::Vanilla, profile, opts, None)?;
    let mut warnings = vanilla.warnings.clone();
    let budgets = if policy != Policy::Capuchin {
        None
    } else if opts.budget_bytes.is_some() {
        Some(capuchin_budgets(opts, &vanilla, None))
    } else {
        stage(SimStage::OursForCapuchinBudgets);
        let ours = run_policy(graphs, &lives, Policy::Tensile, profile, opts, None)?;
        warnings.extend(ours.warnings.iter().cloned());
        Some(capuchin_budgets(opts, &vanilla, Some(&ours)))
    };
    stage(SimStage::Policy(policy));
    let run = run_policy(graphs, &lives, policy, profile, opts, budgets.as_deref())?;
    warnings.extend(run.warnings.iter().cloned());
    #[allow(unused_mut)]
    let mut report = report(graphs, &lives, profile, opts, policy, &vanilla, &run);
    #[cfg(feature = "bound")]
    {
        stage(SimStage::Bound);
        let bound = crate::bound::bound_peak(graphs, profile, opts.seed, Some(&run))?;
        report.bound_peak_bytes = Some(bound);
        report.msr_bound =
            Some(1.0 - bound as f64 / report.system.peak_vanilla_bytes.max(1) as f64);
    }
    Ok(SimOutcome {
        vanilla,
        run,
        report,
        warnings,
    })
}
