//! `bench colocate`: several copies of a model on one GPU whose memory is
//! that of ONE copy. Per case (model, reference batch b, k copies, device)
//! the budget is one job's simulated vanilla peak at batch b; k copies at
//! fractions of b are planned under it by ours (the scheduler's planner)
//! and run in the simulator, against the same k jobs co-located with no
//! memory limit. A case's capacity is the largest fraction at which every
//! seed fits (the measured peak never over the budget, no job failing) at
//! an EOR of at most [`EOR_TARGET`] (Waterwave's metric, at a stated cost).
//!
//! EOR is measured in steady state, from the start of one iteration to the
//! start of the next (gate waits included), after `warmup` iterations: a
//! training run lasts thousands of iterations and the first few (the cold
//! start, the phases taking hold) say little of its throughput. Every row
//! also has the lowest peak any time-free swap plan could reach at the
//! same phases ([`crate::bound`]).
//!
//! Every row also runs the same jobs planned to take turns under the same
//! budget (`Turns::Always`), and says which layout ours ran in steady
//! state: sharing (free or gated) or turns, which the planner takes when
//! they fit with a shorter predicted cycle. Taking turns is not free on
//! this EOR: the reference co-locates the jobs with no limit, and two jobs
//! side by side get `2 / (1 + sharing_slowdown)` of one job's throughput
//! alone, so turns score about `(1 - s) / (1 + s)` for two equal jobs
//! (0.11 on the h100, 0.05 on the a6000, 0.67 on the h200).

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use tensile_baselines::Policy;
use tensile_executor::sim::SimResult;
use tensile_graph::builder::Optimizer;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Graph, Liveness};
use tensile_latency_model::DeviceProfile;
use tensile_planner::{Layout, RecomputeFirst, Turns};

use crate::bound::bound_peak;
use crate::run::{SimOptions, run_policy};
use crate::{ColdStart, ExperimentError, error_chain};

/// The cost at which capacity counts.
pub const EOR_TARGET: f64 = 0.05;
/// The fractions of the reference batch each case runs at.
pub const FRACTIONS: [f64; 5] = [0.5, 0.625, 0.75, 0.875, 1.0];

/// k copies of a zoo model, and one job each of `others`; the budget is
/// the largest of the models' vanilla peaks, each alone at its reference
/// batch (one copy's, for copies of one model).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ColocateCase {
    pub model: String,
    pub reference_batch: u64,
    pub copies: usize,
    /// The optimizer of the iteration, as `--optimizer` names it (`adam`,
    /// `adam-in-backward`); the budget is one copy's peak with the same.
    pub optimizer: String,
    /// Jobs of other models beside the copies, each at the same fraction
    /// of its own reference batch (a pair of different models: one copy
    /// and one other).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub others: Vec<OtherJob>,
}

/// A job of another model in a [`ColocateCase`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OtherJob {
    pub model: String,
    pub reference_batch: u64,
}

impl ColocateCase {
    /// With Adam after the backward pass.
    pub fn new(model: &str, reference_batch: u64, copies: usize) -> ColocateCase {
        ColocateCase {
            model: model.to_string(),
            reference_batch,
            copies,
            optimizer: Optimizer::adam().name().to_string(),
            others: Vec::new(),
        }
    }

    /// Two different models, one job each, with Adam after the backward
    /// pass: the budget is the larger one's vanilla peak.
    pub fn pair(a: &str, a_batch: u64, b: &str, b_batch: u64) -> ColocateCase {
        ColocateCase {
            others: vec![OtherJob {
                model: b.to_string(),
                reference_batch: b_batch,
            }],
            ..ColocateCase::new(a, a_batch, 1)
        }
    }

    /// How many jobs run together.
    pub fn jobs(&self) -> usize {
        self.copies + self.others.len()
    }

    /// Each model with its reference batch, the copies' first.
    fn models(&self) -> impl Iterator<Item = (&str, u64)> {
        std::iter::once((self.model.as_str(), self.reference_batch)).chain(
            self.others
                .iter()
                .map(|o| (o.model.as_str(), o.reference_batch)),
        )
    }

    /// The same case with another optimizer (`adam-in-backward`).
    pub fn with_optimizer(self, optimizer: &str) -> Result<ColocateCase, ExperimentError> {
        Optimizer::with_step_from_name(optimizer)
            .map_err(|e| ExperimentError::Colocate(e.to_string()))?;
        Ok(ColocateCase {
            optimizer: optimizer.to_string(),
            ..self
        })
    }

    /// ResNet-50 (batch 32) x2 and x3, BERT-base (batch 16) x2, with Adam
    /// after the backward pass and, for BERT-base, inside it and inside it
    /// on the host.
    pub fn defaults() -> Vec<ColocateCase> {
        vec![
            ColocateCase::new("resnet50", 32, 2),
            ColocateCase::new("resnet50", 32, 3),
            ColocateCase::new("bert_base", 16, 2),
            ColocateCase {
                optimizer: "adam-in-backward".to_string(),
                ..ColocateCase::new("bert_base", 16, 2)
            },
            ColocateCase {
                optimizer: "adam-on-host".to_string(),
                ..ColocateCase::new("bert_base", 16, 2)
            },
        ]
    }

    /// How the case is named in rows and summaries: `resnet50 b32 x2`,
    /// `resnet50 b32 + bert_base b16`.
    pub fn label(&self) -> String {
        let mut label = if self.others.is_empty() {
            format!("{} b{} x{}", self.model, self.reference_batch, self.copies)
        } else {
            let mut l = format!("{} b{}", self.model, self.reference_batch);
            if self.copies != 1 {
                l.push_str(&format!(" x{}", self.copies));
            }
            for o in &self.others {
                l.push_str(&format!(" + {} b{}", o.model, o.reference_batch));
            }
            l
        };
        if self.optimizer != Optimizer::adam().name() {
            label.push_str(&format!(" {}", self.optimizer));
        }
        label
    }
}

/// What `bench colocate` runs.
#[derive(Debug, Clone)]
pub struct ColocateConfig {
    pub devices: Vec<DeviceProfile>,
    pub cases: Vec<ColocateCase>,
    pub fractions: Vec<f64>,
    pub seeds: Vec<u64>,
    pub iterations: usize,
    /// Iterations left out of the steady-state EOR.
    pub warmup: usize,
    pub threads: usize,
    /// Ours plans with `PlannerConfig::recompute_first`.
    pub recompute_first: RecomputeFirst,
    /// The k copies are threads of one process (`tensile-worker
    /// --copies`): they pay the device's base once, a share each
    /// ([`crate::device::one_process`]), instead of once per job. The
    /// budget is one copy alone either way (its own whole base).
    pub one_process: bool,
}

impl ColocateConfig {
    /// Rows: one per device, case, fraction and seed.
    pub fn total_runs(&self) -> usize {
        self.devices.len() * self.cases.len() * self.fractions.len() * self.seeds.len()
    }
}

/// One case at one fraction, device and seed. Read back (a sweep's
/// `--out` file) as written: an EOR that could not be measured is written
/// `null` and read as infinite.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ColocateRow {
    pub device: String,
    pub case: String,
    pub fraction: f64,
    pub batch: u64,
    pub seed: u64,
    pub budget_bytes: u64,
    /// The same jobs co-located with no memory limit.
    pub vanilla_peak_bytes: u64,
    /// Ours' first plan: the aligned peak of gated jobs, else the sum of
    /// the jobs' peaks.
    pub predicted_peak_bytes: u64,
    pub peak_bytes: u64,
    /// The lowest peak a time-free swap plan could reach at these phases.
    pub bound_peak_bytes: u64,
    pub msr: f64,
    pub msr_bound: f64,
    /// Steady-state throughput against vanilla co-located, minus one.
    #[serde(deserialize_with = "infinite_if_null")]
    pub eor: f64,
    pub gated: bool,
    pub cycle_ms: f64,
    /// The layout ours ran in at the end of the run (`free`, `gated`,
    /// `turns`), and at its first plan.
    pub layout: String,
    pub first_layout: String,
    /// Ours' first plan's predicted cycle sharing the device and taking
    /// turns (0: not predicted), and why it took its layout.
    pub shared_cycle_ms: f64,
    pub turns_cycle_ms: f64,
    pub layout_note: String,
    /// The same jobs made to take turns under the same budget: their EOR
    /// (infinite: they could not run) and measured peak.
    #[serde(deserialize_with = "infinite_if_null")]
    pub turns_eor: f64,
    pub turns_peak_bytes: u64,
    pub stall_s: f64,
    pub memory_wait_s: f64,
    pub guard_evictions: usize,
    /// The measured peak within the budget and every job done.
    pub fits: bool,
    /// How far the measured peak went over the budget (0: it held).
    pub over_bytes: u64,
    /// Why ours could not run, when it could not.
    pub error: Option<String>,
}

/// An EOR as JSON writes it: a number, or `null` for an infinite one.
fn infinite_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}

/// A case's result on one device.
#[derive(Debug, Clone, Serialize)]
pub struct CaseSummary {
    pub device: String,
    pub case: String,
    pub budget_bytes: u64,
    /// The largest fraction at which every seed fits at EOR <= the
    /// target; `None`: not even the smallest.
    pub capacity: Option<f64>,
    /// Rows whose measured peak went over the budget (none expected).
    pub over: usize,
    /// The worst EOR of ours over the rows, and of the same jobs taking
    /// turns.
    pub worst_eor: f64,
    pub worst_turns_eor: f64,
    /// Rows in which ours ran its jobs in turns at the end.
    pub turns_rows: usize,
    /// Rows in which ours was slower than the same jobs taking turns (by
    /// more than [`TURNS_TOLERANCE`] of their throughput).
    pub slower_than_turns: usize,
}

/// How much lower than turns' throughput ours' may be before a row counts
/// as slower than taking turns: runs of the same plans differ by about
/// this much with the phases they start on.
pub const TURNS_TOLERANCE: f64 = 0.02;

/// Everything `bench colocate` measured (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct ColocateReport {
    pub iterations: usize,
    pub warmup: usize,
    pub eor_target: f64,
    /// The copies ran as threads of one process (one base for all).
    pub one_process: bool,
    pub rows: Vec<ColocateRow>,
    pub cases: Vec<CaseSummary>,
}

/// Runs every row (on a pool of `config.threads`); `progress` hears of
/// each one done.
pub fn run_colocate(
    config: &ColocateConfig,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<ColocateReport, ExperimentError> {
    if config.warmup + 2 > config.iterations {
        return Err(ExperimentError::Colocate(format!(
            "{} iterations leave fewer than two after the {} of warm-up",
            config.iterations, config.warmup
        )));
    }
    let mut work = Vec::new();
    for device in &config.devices {
        for case in &config.cases {
            let budget = one_copy_peak(case, device)?;
            for &fraction in &config.fractions {
                for &seed in &config.seeds {
                    work.push((device, case, budget, fraction, seed));
                }
            }
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(config.threads.max(1))
        .build()
        .map_err(|e| ExperimentError::Colocate(format!("thread pool: {e}")))?;
    let rows: Vec<ColocateRow> = pool.install(|| {
        work.par_iter()
            .map(|&(device, case, budget, fraction, seed)| {
                let row = run_row(config, device, case, budget, fraction, seed);
                progress(&format!(
                    "{} {} at {:.3} seed {seed}",
                    device.name,
                    case.label(),
                    fraction
                ));
                row
            })
            .collect::<Result<_, _>>()
    })?;
    let mut cases = Vec::new();
    for device in &config.devices {
        for case in &config.cases {
            let label = case.label();
            let mine: Vec<&ColocateRow> = rows
                .iter()
                .filter(|r| r.device == device.name && r.case == label)
                .collect();
            cases.push(summarize(&device.name, &label, &mine));
        }
    }
    Ok(ColocateReport {
        one_process: config.one_process,
        iterations: config.iterations,
        warmup: config.warmup,
        eor_target: EOR_TARGET,
        rows,
        cases,
    })
}

/// The capacity: the largest fraction whose rows (every seed) all fit at
/// EOR <= the target.
fn summarize(device: &str, case: &str, rows: &[&ColocateRow]) -> CaseSummary {
    let mut fractions: Vec<f64> = rows.iter().map(|r| r.fraction).collect();
    fractions.sort_by(f64::total_cmp);
    fractions.dedup();
    let capacity = fractions.into_iter().rev().find(|&f| {
        rows.iter()
            .filter(|r| r.fraction == f)
            .all(|r| r.fits && r.eor <= EOR_TARGET)
    });
    let worst = |f: fn(&ColocateRow) -> f64| rows.iter().map(|r| f(r)).fold(0.0, f64::max);
    CaseSummary {
        device: device.to_string(),
        case: case.to_string(),
        budget_bytes: rows.first().map_or(0, |r| r.budget_bytes),
        capacity,
        over: rows.iter().filter(|r| r.over_bytes > 0).count(),
        worst_eor: worst(|r| r.eor),
        worst_turns_eor: worst(|r| r.turns_eor),
        turns_rows: rows.iter().filter(|r| r.layout == "turns").count(),
        slower_than_turns: rows.iter().filter(|r| slower_than_turns(r)).count(),
    }
}

/// Whether ours' throughput in `row` is below the same jobs' taking turns
/// by more than [`TURNS_TOLERANCE`] (EOR is vanilla's throughput over
/// ours, minus one).
pub fn slower_than_turns(row: &ColocateRow) -> bool {
    row.turns_eor.is_finite() && (1.0 + row.eor) > (1.0 + row.turns_eor) * (1.0 + TURNS_TOLERANCE)
}

/// A case's copies at `batch`: the zoo model with the case's optimizer,
/// once per copy; then each other job at the same fraction of its own
/// reference batch.
pub fn graphs(case: &ColocateCase, batch: u64) -> Result<Vec<Graph>, ExperimentError> {
    graphs_at(
        case,
        batch,
        batch as f64 / case.reference_batch.max(1) as f64,
    )
}

/// The copies at `batch`, the others at `fraction` of their reference
/// batches.
fn graphs_at(
    case: &ColocateCase,
    batch: u64,
    fraction: f64,
) -> Result<Vec<Graph>, ExperimentError> {
    let g = zoo_graph(case, &case.model, batch)?;
    let mut out = vec![g; case.copies];
    for o in &case.others {
        out.push(zoo_graph(
            case,
            &o.model,
            scaled(o.reference_batch, fraction),
        )?);
    }
    Ok(out)
}

/// `fraction` of a reference batch, rounded, at least 1.
pub fn scaled(reference_batch: u64, fraction: f64) -> u64 {
    ((reference_batch as f64 * fraction).round() as u64).max(1)
}

fn zoo_graph(case: &ColocateCase, model: &str, batch: u64) -> Result<Graph, ExperimentError> {
    let mut cfg = ZooConfig::new(batch);
    (cfg.optimizer, cfg.step) = Optimizer::with_step_from_name(&case.optimizer)
        .map_err(|e| ExperimentError::Colocate(e.to_string()))?;
    zoo::build(model, &cfg).map_err(|e| ExperimentError::Colocate(e.to_string()))
}

/// How the bench simulates a row: coordinated jobs, latencies from the
/// roofline estimate, compute sharing on.
pub fn options(
    iterations: usize,
    seed: u64,
    budget: Option<u64>,
    recompute_first: RecomputeFirst,
    turns: Turns,
) -> SimOptions {
    SimOptions {
        iterations,
        seed,
        exact: false,
        no_sharing: false,
        budget_bytes: budget,
        stop_at_budget: false,
        activation_budget: 0.5,
        starts: Vec::new(),
        cold_start: ColdStart::Roofline,
        coordinate: true,
        recompute_first,
        turns,
    }
}

/// One copy's vanilla peak at the reference batch, alone on the device:
/// the budget of the case's rows. With other models in the case, the
/// largest of the models' peaks, each alone at its reference batch.
pub fn one_copy_peak(case: &ColocateCase, device: &DeviceProfile) -> Result<u64, ExperimentError> {
    let mut budget = 0;
    for (model, batch) in case.models() {
        let g = vec![zoo_graph(case, model, batch)?];
        let lives: Vec<Liveness> = g.iter().map(Liveness::analyze).collect();
        let run = run_policy(
            &g,
            &lives,
            Policy::Vanilla,
            device,
            &options(1, 1, None, RecomputeFirst::Never, Turns::Never),
            None,
        )?;
        budget = budget.max(run.result.peak_bytes);
    }
    Ok(budget)
}

/// One row: the case's jobs at `fraction` of its reference batch under
/// `budget` on `device`, ours against vanilla and against turns.
pub fn run_row(
    config: &ColocateConfig,
    device: &DeviceProfile,
    case: &ColocateCase,
    budget: u64,
    fraction: f64,
    seed: u64,
) -> Result<ColocateRow, ExperimentError> {
    let batch = scaled(case.reference_batch, fraction);
    let shared;
    let device = if config.one_process {
        shared = crate::device::one_process(device, case.jobs());
        &shared
    } else {
        device
    };
    let graphs = graphs_at(case, batch, fraction)?;
    let lives: Vec<Liveness> = graphs.iter().map(Liveness::analyze).collect();
    let n = config.iterations;
    let vanilla = run_policy(
        &graphs,
        &lives,
        Policy::Vanilla,
        device,
        &options(n, seed, None, RecomputeFirst::Never, Turns::Never),
        None,
    )?;
    let ours_with = |turns| {
        run_policy(
            &graphs,
            &lives,
            Policy::Tensile,
            device,
            &options(n, seed, Some(budget), config.recompute_first, turns),
            None,
        )
    };
    let ours = ours_with(Turns::WhenFaster);
    let turns = ours_with(Turns::Always).ok();
    let bound = bound_peak(&graphs, device, seed, ours.as_ref().ok());
    let vpeak = vanilla.result.peak_bytes;
    let mut row = ColocateRow {
        device: device.name.clone(),
        case: case.label(),
        fraction,
        batch,
        seed,
        budget_bytes: budget,
        vanilla_peak_bytes: vpeak,
        predicted_peak_bytes: 0,
        peak_bytes: 0,
        bound_peak_bytes: bound?,
        msr: 0.0,
        msr_bound: 0.0,
        eor: f64::INFINITY,
        gated: false,
        cycle_ms: 0.0,
        layout: String::new(),
        first_layout: String::new(),
        shared_cycle_ms: 0.0,
        turns_cycle_ms: 0.0,
        layout_note: String::new(),
        turns_eor: turns.as_ref().map_or(f64::INFINITY, |t| {
            steady_eor(&vanilla.result, &t.result, config.warmup)
        }),
        turns_peak_bytes: turns.as_ref().map_or(0, |t| t.result.peak_bytes),
        stall_s: 0.0,
        memory_wait_s: 0.0,
        guard_evictions: 0,
        fits: false,
        over_bytes: 0,
        error: None,
    };
    row.msr_bound = 1.0 - row.bound_peak_bytes as f64 / vpeak.max(1) as f64;
    match ours {
        Ok(run) => {
            let r = &run.result;
            let gate = run.gates.iter().flatten().next();
            row.gated = gate.is_some();
            row.cycle_ms = gate.map_or(0.0, |g| g.period_ns as f64 / 1e6);
            let name = |l: Option<&Layout>| l.map_or("", |l| l.name()).to_string();
            row.layout = name(run.layouts.last());
            row.first_layout = name(run.layouts.first());
            row.shared_cycle_ms = run.shared_cycle_ns as f64 / 1e6;
            row.turns_cycle_ms = run.turns_cycle_ns as f64 / 1e6;
            row.layout_note = run.layout_note.clone();
            row.predicted_peak_bytes = if row.gated {
                run.predicted.1
            } else {
                run.predicted.0
            };
            row.peak_bytes = r.peak_bytes;
            row.msr = 1.0 - r.peak_bytes as f64 / vpeak.max(1) as f64;
            row.eor = steady_eor(&vanilla.result, r, config.warmup);
            let its = r.jobs.iter().flat_map(|j| &j.iterations);
            row.stall_s = its.clone().map(|i| i.stall_ns).sum::<u64>() as f64 / 1e9;
            row.memory_wait_s = its.clone().map(|i| i.memory_wait_ns).sum::<u64>() as f64 / 1e9;
            row.guard_evictions = its.map(|i| i.guard_evictions).sum();
            row.over_bytes = r.peak_bytes.saturating_sub(budget);
            row.fits = row.over_bytes == 0;
        }
        // A job that cannot run under the budget (its working set alone
        // does not fit beside the others) is a row that does not fit.
        Err(e) => row.error = Some(error_chain(&e)),
    }
    Ok(row)
}

/// Steady-state throughput of `ours` against `vanilla`, minus one. Each
/// run is measured over its steady window: from when the last job is past
/// its `warmup` iterations to when the first job starts its last one, so
/// that every job runs beside the others throughout. In it, each job's
/// progress (iterations, interpolated between their starts) per second,
/// added up over the jobs. Jobs that never run side by side after their
/// warm-up (one waited until another was done) have no such window: the
/// EOR is then infinite, since each job's rate measured alone would make
/// running one after another look faster than sharing the GPU.
pub fn steady_eor(vanilla: &SimResult, ours: &SimResult, warmup: usize) -> f64 {
    match (steady_rate(vanilla, warmup), steady_rate(ours, warmup)) {
        (Some(v), Some(o)) if o > 0.0 => v / o - 1.0,
        _ => f64::INFINITY,
    }
}

/// Iterations per second of all jobs together over the run's steady
/// window (see [`steady_eor`]); `None` when there is none.
fn steady_rate(r: &SimResult, warmup: usize) -> Option<f64> {
    let starts: Vec<Vec<u64>> = r
        .jobs
        .iter()
        .map(|j| j.iterations.iter().map(|i| i.start_ns).collect())
        .collect();
    // Every job past its warm-up (a job without that many iterations has
    // no steady state), none yet on its last iteration.
    let past: Option<Vec<u64>> = starts.iter().map(|s| s.get(warmup).copied()).collect();
    let last: Option<Vec<u64>> = starts.iter().map(|s| s.last().copied()).collect();
    let from = past?.into_iter().max()?;
    let to = last?.into_iter().min()?;
    if to <= from {
        return None;
    }
    // Iterations started by `t`, interpolated between starts.
    let progress = |s: &[u64], t: u64| -> f64 {
        let i = s.partition_point(|&x| x <= t);
        match (i.checked_sub(1), s.get(i)) {
            (Some(k), Some(&next)) => k as f64 + (t - s[k]) as f64 / (next - s[k]).max(1) as f64,
            (Some(k), None) => k as f64,
            (None, _) => 0.0,
        }
    };
    let seconds = (to - from) as f64 / 1e9;
    Some(
        starts
            .iter()
            .map(|s| (progress(s, to) - progress(s, from)) / seconds)
            .sum(),
    )
}
