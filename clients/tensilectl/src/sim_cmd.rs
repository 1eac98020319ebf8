//! `tensilectl plan` and `tensilectl sim`: plan zoo jobs, and simulate them
//! sharing one GPU, side by side with vanilla (free after last use).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use tensile_baselines::{BaselineInput, Capuchin, Policy, static_plan};
use tensile_executor::ExecOptions;
use tensile_executor::replan::TimedReplanner;
use tensile_executor::sim::{FixedPlans, JobResult, SimConfig, SimJob, SimResult, simulate};
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Graph, Liveness};
use tensile_latency_model::manifest::{Manifest, shipped_cpu_models};
use tensile_latency_model::{DeviceProfile, Predictor, Source, estimate_latencies, true_latencies};
use tensile_planner::{CopyModel, EventKind, JobSettings, PlannerConfig};

use crate::args::{PlanArgs, SimArgs};
use crate::input;
use crate::plot::{Chart, Series, render_svg};
use crate::report::bytes;

pub(crate) fn device(arg: &str) -> Result<DeviceProfile> {
    if DeviceProfile::builtin_names().contains(&arg) {
        return Ok(DeviceProfile::builtin(arg)?);
    }
    if arg == "cpu" {
        // The CPU the shipped latency models were measured on: its roofline
        // calibrated on the same measurements.
        let path = shipped_cpu_models().join("roofline.json");
        return DeviceProfile::from_file(&path).with_context(|| path.display().to_string());
    }
    let path = Path::new(arg);
    if !path.exists() {
        bail!(
            "unknown device {arg:?}: not a built-in profile ({}, cpu) and no such file",
            DeviceProfile::builtin_names().join(", ")
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {arg}"))?;
    DeviceProfile::from_json(&text).with_context(|| arg.to_string())
}

/// Where the planner's cold-start latencies come from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ColdStart {
    /// The learned models trained for this device if there are any (the
    /// shipped ones are for `cpu`), else the roofline estimate.
    Auto,
    /// The roofline estimate.
    Roofline,
    /// The learned models in this directory.
    Models(PathBuf),
}

impl ColdStart {
    pub(crate) fn parse(s: &str) -> ColdStart {
        match s {
            "auto" => ColdStart::Auto,
            "roofline" => ColdStart::Roofline,
            dir => ColdStart::Models(PathBuf::from(dir)),
        }
    }
}

/// The cold-start latencies of every job, and where they came from.
fn cold_start(
    graphs: &[Graph],
    profile: &DeviceProfile,
    how: &ColdStart,
) -> Result<(Vec<Vec<u64>>, String)> {
    let dir = match how {
        ColdStart::Roofline => None,
        ColdStart::Models(dir) => Some(dir.clone()),
        ColdStart::Auto => {
            let dir = shipped_cpu_models();
            let device = Manifest::read(&dir).ok().map(|m| m.device);
            (device.as_deref() == Some(profile.name.as_str())).then_some(dir)
        }
    };
    let Some(dir) = dir else {
        let lat = graphs
            .iter()
            .map(|g| estimate_latencies(g, profile))
            .collect();
        return Ok((lat, "roofline estimate".into()));
    };
    let predictor = Predictor::load(&dir)
        .with_context(|| format!("cold-start latency models {}", dir.display()))?;
    if predictor.manifest().device != profile.name {
        eprintln!(
            "note: the latency models in {} were trained on {:?}, the device is {:?}",
            dir.display(),
            predictor.manifest().device,
            profile.name
        );
    }
    let (mut model, mut roofline) = (0, 0);
    let mut out = Vec::new();
    for g in graphs {
        let p = predictor.predict_graph(g, 0.0)?;
        model += p
            .source_per_op
            .iter()
            .filter(|s| **s == Source::Model)
            .count();
        roofline += p
            .source_per_op
            .iter()
            .filter(|s| **s == Source::Roofline)
            .count();
        out.push(p.ns_per_op);
    }
    let what = format!(
        "learned models ({}): {model} ops by a model, {roofline} by the roofline",
        dir.display()
    );
    Ok((out, what))
}

fn copy_model(p: &DeviceProfile) -> CopyModel {
    CopyModel {
        h2d_bytes_per_s: p.h2d_bytes_per_s,
        d2h_bytes_per_s: p.d2h_bytes_per_s,
        latency_ns: p.copy_latency_ns,
        half_duplex: p.is_half_duplex(),
        // The paper plans every job as if it had the link to itself.
        shared_by_jobs: !p.is_half_duplex(),
    }
}

fn planner_config(
    p: &DeviceProfile,
    budget_bytes: Option<u64>,
    stop_at_budget: bool,
) -> PlannerConfig {
    let mut c = PlannerConfig::new(copy_model(p));
    c.budget_bytes = budget_bytes;
    c.stop_at_budget = stop_at_budget;
    c
}

/// How a workload is simulated (from `sim`'s flags, or set by `bench`).
#[derive(Debug, Clone)]
pub(crate) struct SimOptions {
    pub(crate) iterations: usize,
    pub(crate) seed: u64,
    /// Plan from the true latencies instead of the cold-start estimate.
    pub(crate) exact: bool,
    pub(crate) no_sharing: bool,
    pub(crate) budget_bytes: Option<u64>,
    /// Ours stops planning once under the budget.
    pub(crate) stop_at_budget: bool,
    pub(crate) activation_budget: f64,
    /// When each job starts, ns (empty: all at 0).
    pub(crate) starts: Vec<u64>,
    pub(crate) cold_start: ColdStart,
}

impl SimOptions {
    fn from_args(a: &SimArgs) -> SimOptions {
        SimOptions {
            iterations: a.iterations,
            seed: a.device.seed,
            exact: a.device.exact,
            no_sharing: a.no_sharing,
            budget_bytes: a.device.budget_mb.map(|mb| mb * 1_000_000),
            stop_at_budget: a.device.stop_at_budget,
            activation_budget: a.activation_budget,
            starts: Vec::new(),
            cold_start: ColdStart::parse(&a.device.latency_models),
        }
    }
}

fn settings(policy: Policy, p: &DeviceProfile) -> JobSettings {
    let mut s = JobSettings {
        base_bytes: p.base_bytes,
        ..JobSettings::default()
    };
    if policy == Policy::Vanilla {
        s.swap = false;
        s.recompute = false;
        s.across_iteration = false;
    }
    s
}

#[derive(Serialize)]
struct PlanReport {
    model: String,
    batch: u64,
    device: String,
    vanilla_peak_bytes: u64,
    planned_peak_bytes: u64,
    msr: f64,
    vanilla_time_s: f64,
    planned_time_s: f64,
    swap_outs: usize,
    swap_ins: usize,
    releases: usize,
    recomputed_ops: usize,
    swapped_bytes: u64,
    plan_ms: f64,
    lower_bound_bytes: u64,
    diagnostics: Vec<String>,
}

pub(crate) fn plan(a: &PlanArgs) -> Result<()> {
    let profile = device(&a.device.device)?;
    let graph = input::zoo_graph(&a.model)?;
    let lat = if a.device.exact {
        true_latencies(&graph, &profile, a.device.seed)
    } else {
        let how = ColdStart::parse(&a.device.latency_models);
        let (mut lat, _) = cold_start(std::slice::from_ref(&graph), &profile, &how)?;
        lat.pop().unwrap_or_default()
    };
    let cfg = planner_config(
        &profile,
        a.device.budget_mb.map(|mb| mb * 1_000_000),
        a.device.stop_at_budget,
    );
    let input = tensile_planner::JobInput::new(&graph, lat, settings(Policy::Tensile, &profile));
    let t = Instant::now();
    let mp = tensile_planner::plan(&[input], &cfg)?;
    let plan_ms = t.elapsed().as_secs_f64() * 1e3;
    let p = &mp.plans[0];
    let pr = &p.prediction;
    let r = PlanReport {
        model: a.model.model.clone().unwrap_or_default(),
        batch: a.model.batch,
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
        plan_ms,
        lower_bound_bytes: Liveness::analyze(&graph).largest_working_set(&graph)
            + profile.base_bytes,
        diagnostics: mp.diagnostics.iter().map(|d| d.message.clone()).collect(),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!("{} batch {} on {}", r.model, r.batch, r.device);
        println!(
            "  peak      vanilla {}  planned {}  (msr {:.3}; lower bound {})",
            bytes(r.vanilla_peak_bytes),
            bytes(r.planned_peak_bytes),
            r.msr,
            bytes(r.lower_bound_bytes)
        );
        println!(
            "  time      vanilla {:.2} ms  planned {:.2} ms",
            r.vanilla_time_s * 1e3,
            r.planned_time_s * 1e3
        );
        println!(
            "  events    {} swap-outs, {} swap-ins, {} releases, {} recomputed ops; {} swapped",
            r.swap_outs,
            r.swap_ins,
            r.releases,
            r.recomputed_ops,
            bytes(r.swapped_bytes)
        );
        println!("  planned in {:.2} ms", r.plan_ms);
        for d in &r.diagnostics {
            println!("  note: {d}");
        }
    }
    Ok(())
}

#[derive(Serialize, Default, Clone)]
pub(crate) struct Metrics {
    pub(crate) name: String,
    pub(crate) peak_vanilla_bytes: u64,
    pub(crate) peak_bytes: u64,
    /// What the planner predicted under its first plan.
    pub(crate) predicted_peak_bytes: u64,
    pub(crate) msr: f64,
    pub(crate) msr_vs_keepall: f64,
    pub(crate) time_vanilla_s: f64,
    pub(crate) time_s: f64,
    pub(crate) eor: f64,
    /// `null` stands for infinity (no overhead).
    pub(crate) cbr: Option<f64>,
    pub(crate) stall_s: f64,
    pub(crate) passive_swaps: usize,
    pub(crate) swapped_bytes: u64,
    pub(crate) recomputed_ops: usize,
    pub(crate) plan_ms: f64,
    pub(crate) replans: usize,
    /// What no plan can go under: for a job, the largest working set of any
    /// one op plus the base; for the system, the sum over jobs.
    pub(crate) lower_bound_bytes: u64,
    /// The saving at the lower bound: how far any plan could go.
    pub(crate) msr_max: f64,
    /// How far the job went over its memory budget at most (Capuchin's
    /// passive mode when even evicting everything cannot fit).
    pub(crate) over_budget_bytes: u64,
}

impl Metrics {
    fn finish(&mut self, keepall: u64) {
        self.msr = 1.0 - self.peak_bytes as f64 / self.peak_vanilla_bytes.max(1) as f64;
        self.msr_max = 1.0 - self.lower_bound_bytes as f64 / self.peak_vanilla_bytes.max(1) as f64;
        self.msr_vs_keepall = 1.0 - self.peak_bytes as f64 / keepall.max(1) as f64;
        self.eor = self.time_s / self.time_vanilla_s.max(1e-12) - 1.0;
        self.cbr = (self.eor > 1e-9).then(|| self.msr / self.eor);
    }
}

#[derive(Serialize, Clone)]
pub(crate) struct SimReport {
    pub(crate) device: String,
    pub(crate) policy: String,
    pub(crate) iterations: usize,
    pub(crate) seed: u64,
    pub(crate) jobs: Vec<Metrics>,
    pub(crate) system: Metrics,
    pub(crate) predicted_sum_of_peaks_bytes: u64,
    pub(crate) predicted_aligned_peak_bytes: u64,
    /// Wall time of the first (cold-start) plan of all jobs together.
    pub(crate) first_plan_ms: f64,
    /// Mean and worst wall time of a re-plan of all jobs.
    pub(crate) replan_mean_ms: f64,
    pub(crate) replan_max_ms: f64,
    /// Where the cold-start latencies came from, and their error against
    /// the simulated device's true latencies (Σ|p − t| / Σ t).
    pub(crate) cold_start_latencies: String,
    pub(crate) cold_start_error: f64,
}

/// Mean iteration time after the first (cold-start) iteration.
fn steady_time_s(r: &JobResult) -> f64 {
    let its = if r.iterations.len() > 1 {
        &r.iterations[1..]
    } else {
        &r.iterations[..]
    };
    let total: u64 = its.iter().map(|i| i.end_ns - i.start_ns).sum();
    total as f64 / its.len().max(1) as f64 / 1e9
}

pub(crate) struct Run {
    pub(crate) result: SimResult,
    pub(crate) plan_ms: f64,
    /// Every planning run's wall time, ms; the first is the cold start.
    pub(crate) plan_runs_ms: Vec<f64>,
    pub(crate) replans: usize,
    pub(crate) predicted: (u64, u64),
    /// Each job's predicted peak under its first plan.
    pub(crate) predicted_peaks: Vec<u64>,
    /// Where the latencies the first plan was made from came from.
    pub(crate) predicted_from: String,
    /// Σ|predicted − true| / Σ true over every op of every job.
    pub(crate) cold_start_error: f64,
}

/// Runs `policy` on `graphs`. `budgets`: each job's memory budget, for
/// Capuchin (ours is given the same limit only through `--budget-mb`).
pub(crate) fn run_policy(
    graphs: &[Graph],
    lives: &[Liveness],
    policy: Policy,
    profile: &DeviceProfile,
    a: &SimOptions,
    budgets: Option<&[u64]>,
) -> Result<Run> {
    let cfg = planner_config(profile, a.budget_bytes, a.stop_at_budget);
    let truth: Vec<Vec<u64>> = graphs
        .iter()
        .enumerate()
        .map(|(j, g)| true_latencies(g, profile, a.seed.wrapping_add(j as u64)))
        .collect();
    let (predicted, predicted_from) = if a.exact {
        (truth.clone(), "the true latencies (--exact)".to_string())
    } else if policy == Policy::Tensile {
        cold_start(graphs, profile, &a.cold_start)?
    } else {
        let lat = graphs
            .iter()
            .map(|g| estimate_latencies(g, profile))
            .collect();
        (lat, "roofline estimate".to_string())
    };
    let cold_start_error = {
        let (mut err, mut total) = (0.0, 0.0);
        for (p, t) in predicted.iter().zip(&truth) {
            for (&p, &t) in p.iter().zip(t) {
                err += (p as f64 - t as f64).abs();
                total += t as f64;
            }
        }
        err / total.max(1.0)
    };
    let sim = SimConfig {
        iterations: a.iterations,
        sharing_slowdown: if a.no_sharing {
            0.0
        } else {
            profile.sharing_slowdown
        },
        copy: copy_model(profile),
        base_bytes: profile.base_bytes,
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
                start_ns: a.starts.get(j).copied().unwrap_or(0),
                ..SimJob::new(graph, live, plan, true_ns)
            })
            .collect::<Vec<SimJob<'_>>>()
    };
    let mut run = match policy {
        Policy::Vanilla | Policy::Tensile => {
            let s = settings(policy, profile);
            let mut replanner = TimedReplanner::new(
                graphs.iter().map(|g| Arc::new(g.clone())).collect(),
                &predicted,
                &vec![s; graphs.len()],
                cfg,
            )?;
            replanner.inner.enabled = policy != Policy::Vanilla;
            let first = replanner.plan_all()?;
            let predicted_peaks = first
                .plans
                .iter()
                .map(|p| p.prediction.planned_peak_bytes)
                .collect();
            let result = simulate(
                jobs(first.plans, &|_| ExecOptions::default()),
                &sim,
                &mut replanner,
            );
            Run {
                result,
                plan_ms: replanner.plan_ns.iter().sum::<u64>() as f64 / 1e6,
                plan_runs_ms: replanner.plan_ns.iter().map(|&n| n as f64 / 1e6).collect(),
                replans: replanner.inner.replans,
                predicted: (first.sum_of_peaks_bytes, first.aligned_peak_bytes),
                predicted_peaks,
                predicted_from: String::new(),
                cold_start_error: 0.0,
            }
        }
        Policy::Capuchin => {
            let budgets = budgets
                .context("capuchin needs a memory budget per job")?
                .to_vec();
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
                            activation_budget: a.activation_budget,
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
    if let Some((at, e)) = run.result.replan_errors.first() {
        bail!("{}: re-planning at {at} ns: {e}", policy.name());
    }
    for (j, r) in run.result.jobs.iter().enumerate() {
        if let Some(e) = &r.error {
            bail!("{}: job {j} ({}): {e}", policy.name(), graphs[j].name());
        }
    }
    if run.predicted_peaks.is_empty() {
        run.predicted_peaks = vec![0; graphs.len()];
    }
    run.predicted_from = predicted_from;
    run.cold_start_error = cold_start_error;
    Ok(run)
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
        }
    }
}

pub(crate) fn parse_jobs(spec: &str, a: &SimArgs) -> Result<Vec<Graph>> {
    let optimizer = input::optimizer(&a.opt)?;
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, batch) = item
            .split_once(':')
            .with_context(|| format!("job {item:?}: expected MODEL:BATCH"))?;
        let batch: u64 = batch
            .parse()
            .with_context(|| format!("job {item:?}: batch {batch:?} is not a number"))?;
        let mut cfg = ZooConfig::new(batch);
        cfg.optimizer = optimizer;
        out.push(zoo::build(name, &cfg).with_context(|| format!("job {item:?}"))?);
    }
    if out.is_empty() {
        bail!("--jobs is empty");
    }
    Ok(out)
}

/// Capuchin's memory budget per job: `--budget-mb` split over the jobs by
/// their vanilla peaks, else each job's peak under ours (`ours`), as the
/// TENSILE paper set it.
pub(crate) fn capuchin_budgets(opts: &SimOptions, vanilla: &Run, ours: Option<&Run>) -> Vec<u64> {
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

/// The metrics of `run` against `vanilla`, per job and for the system.
pub(crate) fn report(
    graphs: &[Graph],
    lives: &[Liveness],
    profile: &DeviceProfile,
    opts: &SimOptions,
    policy: Policy,
    vanilla: &Run,
    run: &Run,
) -> SimReport {
    let mut jobs = Vec::new();
    for (j, g) in graphs.iter().enumerate() {
        let (v, r) = (&vanilla.result.jobs[j], &run.result.jobs[j]);
        let last = r.iterations.last();
        let mut m = Metrics {
            name: g.name().to_string(),
            peak_vanilla_bytes: v.peak_bytes(),
            peak_bytes: r.peak_bytes(),
            predicted_peak_bytes: run.predicted_peaks[j],
            time_vanilla_s: steady_time_s(v),
            time_s: steady_time_s(r),
            stall_s: r.iterations.iter().map(|i| i.stall_ns).sum::<u64>() as f64 / 1e9,
            passive_swaps: r.iterations.iter().map(|i| i.passive_swaps).sum(),
            swapped_bytes: last.map_or(0, |i| i.swapped_bytes),
            recomputed_ops: last.map_or(0, |i| i.recomputed_ops),
            lower_bound_bytes: lives[j].largest_working_set(g) + profile.base_bytes,
            over_budget_bytes: r
                .iterations
                .iter()
                .map(|i| i.over_budget_bytes)
                .max()
                .unwrap_or(0),
            ..Metrics::default()
        };
        m.finish(lives[j].keep_all_footprint().peak + profile.base_bytes);
        jobs.push(m);
    }
    let keepall: u64 = lives
        .iter()
        .map(|l| l.keep_all_footprint().peak + profile.base_bytes)
        .sum();
    let mut system = Metrics {
        name: "system".into(),
        peak_vanilla_bytes: vanilla.result.peak_bytes,
        peak_bytes: run.result.peak_bytes,
        time_vanilla_s: vanilla.result.makespan_ns as f64 / 1e9,
        time_s: run.result.makespan_ns as f64 / 1e9,
        stall_s: jobs.iter().map(|m| m.stall_s).sum(),
        passive_swaps: jobs.iter().map(|m| m.passive_swaps).sum(),
        swapped_bytes: jobs.iter().map(|m| m.swapped_bytes).sum(),
        recomputed_ops: jobs.iter().map(|m| m.recomputed_ops).sum(),
        plan_ms: run.plan_ms,
        replans: run.replans,
        lower_bound_bytes: jobs.iter().map(|m| m.lower_bound_bytes).sum(),
        over_budget_bytes: jobs.iter().map(|m| m.over_budget_bytes).max().unwrap_or(0),
        ..Metrics::default()
    };
    system.finish(keepall);
    let replans = run.plan_runs_ms.get(1..).unwrap_or_default();
    SimReport {
        device: profile.name.clone(),
        policy: policy.name().to_string(),
        iterations: opts.iterations,
        seed: opts.seed,
        jobs,
        system,
        predicted_sum_of_peaks_bytes: run.predicted.0,
        predicted_aligned_peak_bytes: run.predicted.1,
        first_plan_ms: run.plan_runs_ms.first().copied().unwrap_or(0.0),
        replan_mean_ms: replans.iter().fold(0.0, |s, x| s + x) / replans.len().max(1) as f64,
        replan_max_ms: replans.iter().copied().fold(0.0, f64::max),
        cold_start_latencies: run.predicted_from.clone(),
        cold_start_error: run.cold_start_error,
    }
}

pub(crate) fn sim(a: &SimArgs) -> Result<()> {
    if a.iterations == 0 || a.iterations > 10_000 {
        bail!("--iterations must be in 1..=10000, got {}", a.iterations);
    }
    let profile = device(&a.device.device)?;
    let graphs = parse_jobs(&a.jobs, a)?;
    let lives: Vec<Liveness> = graphs.iter().map(Liveness::analyze).collect();
    let policy = Policy::parse(&a.policy)?;
    if !(0.0..=1.0).contains(&a.activation_budget) {
        bail!(
            "--activation-budget must be in [0, 1], got {}",
            a.activation_budget
        );
    }
    let opts = SimOptions::from_args(a);
    eprintln!("simulating {} jobs: vanilla ...", graphs.len());
    let vanilla = run_policy(&graphs, &lives, Policy::Vanilla, &profile, &opts, None)?;
    let budgets = if policy != Policy::Capuchin {
        None
    } else if opts.budget_bytes.is_some() {
        Some(capuchin_budgets(&opts, &vanilla, None))
    } else {
        eprintln!(
            "simulating {} jobs: tensile, for capuchin's budgets ...",
            graphs.len()
        );
        let ours = run_policy(&graphs, &lives, Policy::Tensile, &profile, &opts, None)?;
        Some(capuchin_budgets(&opts, &vanilla, Some(&ours)))
    };
    eprintln!("simulating {} jobs: {} ...", graphs.len(), a.policy);
    let run = run_policy(&graphs, &lives, policy, &profile, &opts, budgets.as_deref())?;
    let report = report(&graphs, &lives, &profile, &opts, policy, &vanilla, &run);
    if let Some(path) = &a.plot {
        let svg = render_svg(&chart(&graphs, &vanilla.result, &run.result, &report));
        std::fs::write(path, svg).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("memory plot written to {}", path.display());
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

fn print_table(r: &SimReport) {
    println!(
        "{} jobs on {}, policy {}, {} iterations (seed {})",
        r.jobs.len(),
        r.device,
        r.policy,
        r.iterations,
        r.seed
    );
    println!(
        "{:<28} {:>11} {:>11} {:>7} {:>7} {:>7} {:>10} {:>10} {:>8} {:>8} {:>7} {:>7}",
        "job",
        "vanilla pk",
        "peak",
        "msr",
        "msr/ka",
        "msr max",
        "t vanilla",
        "t",
        "eor",
        "cbr",
        "stall s",
        "recomp"
    );
    for m in r.jobs.iter().chain(std::iter::once(&r.system)) {
        println!(
            "{:<28} {:>11} {:>11} {:>7.3} {:>7.3} {:>7.3} {:>9.2}ms {:>8.2}ms {:>8.4} {:>8} {:>7.4} {:>7}",
            m.name,
            bytes(m.peak_vanilla_bytes),
            bytes(m.peak_bytes),
            m.msr,
            m.msr_vs_keepall,
            m.msr_max,
            m.time_vanilla_s * 1e3,
            m.time_s * 1e3,
            m.eor,
            m.cbr.map_or("inf".to_string(), |c| format!("{c:.2}")),
            m.stall_s,
            m.recomputed_ops
        );
    }
    println!(
        "planning: {:.2} ms in all; first plan {:.2} ms; {} re-plans, {:.2} ms mean, {:.2} ms worst",
        r.system.plan_ms, r.first_plan_ms, r.system.replans, r.replan_mean_ms, r.replan_max_ms
    );
    if r.policy == "tensile" {
        println!(
            "cold start: {} (error vs the true latencies {:.1}%)",
            r.cold_start_latencies,
            r.cold_start_error * 100.0
        );
    }
    for m in r.jobs.iter().filter(|m| m.over_budget_bytes > 0) {
        println!(
            "note: {} went over its memory budget by up to {} (nothing more could be evicted)",
            m.name,
            bytes(m.over_budget_bytes)
        );
    }
    println!("msr max: the saving at the lower bound (largest working set of one op + base)");
    if r.policy == "tensile" {
        println!(
            "predicted global peak: sum of peaks {}, aligned {}",
            bytes(r.predicted_sum_of_peaks_bytes),
            bytes(r.predicted_aligned_peak_bytes)
        );
    }
}

fn chart(graphs: &[Graph], vanilla: &SimResult, run: &SimResult, r: &SimReport) -> Chart {
    let to_points = |trace: &[(u64, u64)]| -> Vec<(f64, f64)> {
        trace
            .iter()
            .map(|&(t, m)| (t as f64 / 1e9, m as f64))
            .collect()
    };
    let total = |res: &SimResult| -> Vec<(f64, f64)> {
        let mut changes: Vec<(u64, usize, u64)> = res
            .jobs
            .iter()
            .enumerate()
            .flat_map(|(j, job)| job.trace.iter().map(move |&(t, m)| (t, j, m)))
            .collect();
        changes.sort_by_key(|c| (c.0, c.1));
        let mut cur = vec![0u64; res.jobs.len()];
        let mut sum = 0u64;
        let mut out = Vec::with_capacity(changes.len());
        for (t, j, m) in changes {
            sum = sum - cur[j] + m;
            cur[j] = m;
            out.push((t as f64 / 1e9, sum as f64));
        }
        out
    };
    let mut series = vec![
        Series {
            label: "total, vanilla".into(),
            points: total(vanilla),
            dashed: true,
        },
        Series {
            label: format!("total, {}", r.policy),
            points: total(run),
            dashed: false,
        },
    ];
    for (j, g) in graphs.iter().enumerate() {
        series.push(Series {
            label: format!("{} vanilla", g.name()),
            points: to_points(&vanilla.jobs[j].trace),
            dashed: true,
        });
        series.push(Series {
            label: format!("{} {}", g.name(), r.policy),
            points: to_points(&run.jobs[j].trace),
            dashed: false,
        });
    }
    Chart {
        title: format!(
            "Memory over time on {}: vanilla (dashed) vs {} (solid)",
            r.device, r.policy
        ),
        series,
    }
}
