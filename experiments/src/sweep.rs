//! `bench colocate --sweep`: capacity across models, counts and devices,
//! not three hand-picked cases. Every model given runs x2 and x3 (copies
//! under one copy's vanilla peak), and every pair of two different models
//! (one job each, under the larger one's vanilla peak), on every device,
//! at every fraction and seed, as the rows of [`crate::colocate`].
//!
//! Beside each case's capacity (the largest fraction every seed fits at
//! EOR <= [`EOR_TARGET`] with nothing over the budget) stands the capacity
//! the swap bound allows: the largest fraction at which, for every seed,
//! some phases of the jobs let a swap plan that adds no time beyond a
//! common period 5% longer than their longest iteration (what a gate may
//! add within that EOR) reach the budget on the device's link
//! ([`crate::bound::phase_bound`]). The bound does not cover
//! recomputation, so ours may pass it.
//!
//! The summary holds the figures against the targets: no run over the
//! budget, none slower than the same jobs taking turns, capacity at least
//! [`NEAR_BOUND`] of the bound's in [`NEAR_BOUND_SHARE`] of the cases,
//! fits monotonic in the fraction, and two ResNet-50 copies at the full
//! batch on the a6000 at every seed.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use tensile_graph::Graph;
use tensile_latency_model::DeviceProfile;
use tensile_planner::RecomputeFirst;

use crate::ExperimentError;
use crate::bound::{phase_bound, sharing_jobs};
use crate::colocate::{
    self, ColocateCase, ColocateConfig, ColocateRow, EOR_TARGET, one_copy_peak, run_row, scaled,
    slower_than_turns,
};
use crate::device::copy_model;

/// How close to the bound's capacity a case's must come, and in what share
/// of the cases.
pub const NEAR_BOUND: f64 = 0.9;
pub const NEAR_BOUND_SHARE: f64 = 0.9;
/// The bound's period: the longest iteration times this (the time a gate
/// may add within an EOR of [`EOR_TARGET`]).
pub const BOUND_STRETCH: f64 = 1.0 + EOR_TARGET;

/// The reference batch of a zoo model in the sweep (its budget is one
/// copy's vanilla peak at it): 32 for the CNNs, 16 for BERT-base.
pub fn reference_batch(model: &str) -> u64 {
    if model.starts_with("bert") { 16 } else { 32 }
}

/// What the sweep runs.
#[derive(Debug, Clone)]
pub struct SweepConfig {
    pub devices: Vec<DeviceProfile>,
    /// Zoo models and their reference batches.
    pub models: Vec<(String, u64)>,
    /// Copies of each model (2 and 3).
    pub copies: Vec<usize>,
    /// Pairs of different models too.
    pub pairs: bool,
    pub fractions: Vec<f64>,
    pub seeds: Vec<u64>,
    pub iterations: usize,
    pub warmup: usize,
    pub threads: usize,
    pub recompute_first: RecomputeFirst,
    /// Steps of the period on which the bound scans each job's phase (for
    /// two and three jobs).
    pub bound_grid: u64,
}

impl SweepConfig {
    /// The cases: each model at each count of copies, then each pair.
    pub fn cases(&self) -> Vec<ColocateCase> {
        let mut cases = Vec::new();
        for (m, b) in &self.models {
            for &k in &self.copies {
                cases.push(ColocateCase::new(m, *b, k));
            }
        }
        if self.pairs {
            for (i, (a, ab)) in self.models.iter().enumerate() {
                for (b, bb) in &self.models[i + 1..] {
                    if a != b {
                        cases.push(ColocateCase::pair(a, *ab, b, *bb));
                    }
                }
            }
        }
        cases
    }

    /// Simulated rows, each with a phase scan of the bound.
    pub fn total_runs(&self) -> usize {
        self.devices.len() * self.cases().len() * self.fractions.len() * self.seeds.len()
    }

    /// The runs of the sweep in order (device, case, fraction, seed), each
    /// with the row `prior` already has for it (rows of an earlier run of
    /// the same sweep, read back from its `--out` file), if any. Rows of
    /// `prior` that are not runs of this sweep are left out, and of two for
    /// one run the first is kept.
    pub fn plan(&self, prior: Vec<SweepRow>) -> Result<SweepPlan, ExperimentError> {
        self.check()?;
        let cases = self.cases();
        let mut runs = Vec::new();
        for (d, device) in self.devices.iter().enumerate() {
            for (c, case) in cases.iter().enumerate() {
                let budget = one_copy_peak(case, device)?;
                for &fraction in &self.fractions {
                    for &seed in &self.seeds {
                        runs.push(Run {
                            device: d,
                            case: c,
                            budget,
                            fraction,
                            seed,
                            done: None,
                        });
                    }
                }
            }
        }
        let mut unused = 0;
        for mut row in prior {
            let at = runs.iter().position(|r| {
                r.done.is_none()
                    && self.devices[r.device].name == row.run.device
                    && cases[r.case].label() == row.run.case
                    && r.seed == row.run.seed
                    // As read back from JSON: the same number to the last
                    // digit or so.
                    && (r.fraction - row.run.fraction).abs() <= 1e-9
            });
            match at {
                Some(i) => {
                    row.run.fraction = runs[i].fraction;
                    runs[i].done = Some(row);
                }
                None => unused += 1,
            }
        }
        Ok(SweepPlan {
            runs,
            cases,
            unused,
        })
    }

    fn check(&self) -> Result<(), ExperimentError> {
        if self.models.is_empty() || self.devices.is_empty() {
            return Err(ExperimentError::Colocate(
                "the sweep needs at least one model and one device".to_string(),
            ));
        }
        if !(1..=256).contains(&self.bound_grid) {
            return Err(ExperimentError::Colocate(format!(
                "the bound's phase grid must be 1 to 256 steps, got {}",
                self.bound_grid
            )));
        }
        if self.cases().is_empty() {
            return Err(ExperimentError::Colocate(
                "the sweep has no case: give copies, or two models for pairs".to_string(),
            ));
        }
        if self.warmup + 2 > self.iterations {
            return Err(ExperimentError::Colocate(format!(
                "{} iterations leave fewer than two after the {} of warm-up",
                self.iterations, self.warmup
            )));
        }
        Ok(())
    }
}

/// One run of the sweep: a case on a device at a fraction and seed, and
/// its row where an earlier run of the sweep already made it.
#[derive(Debug, Clone)]
struct Run {
    device: usize,
    case: usize,
    budget: u64,
    fraction: f64,
    seed: u64,
    done: Option<SweepRow>,
}

/// The sweep's runs, those already done with their rows
/// ([`SweepConfig::plan`]).
#[derive(Debug, Clone)]
pub struct SweepPlan {
    runs: Vec<Run>,
    cases: Vec<ColocateCase>,
    unused: usize,
}

impl SweepPlan {
    pub fn total(&self) -> usize {
        self.runs.len()
    }

    /// Runs whose rows are already there.
    pub fn done(&self) -> usize {
        self.runs.iter().filter(|r| r.done.is_some()).count()
    }

    /// Rows given that are no run of this sweep (another device, case,
    /// fraction or seed).
    pub fn unused(&self) -> usize {
        self.unused
    }
}

/// One row: the simulation (as `bench colocate`'s) and the bound at the
/// best phases for the same jobs and seed (a line of a sweep's `--out`
/// file).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepRow {
    #[serde(flatten)]
    pub run: ColocateRow,
    /// The lowest bound found over the phases (the first at or under the
    /// budget: the scan stops there).
    pub phase_bound_bytes: u64,
    /// Some phases let a time-free swap plan reach the budget.
    pub bound_fits: bool,
    /// This run counts for the capacity: it fits, at EOR <= the target.
    pub fits_target: bool,
    /// Slower than the same jobs taking turns.
    pub slower_than_turns: bool,
}

/// How many seeds fit at one fraction.
#[derive(Debug, Clone, Serialize)]
pub struct FractionFits {
    pub fraction: f64,
    pub seeds: usize,
    /// Runs that fit at EOR <= the target.
    pub fit: usize,
    /// Seeds at which the bound reaches the budget.
    pub bound_fits: usize,
}

/// One case (models x count x device).
#[derive(Debug, Clone, Serialize)]
pub struct SweepCase {
    pub device: String,
    pub case: String,
    pub jobs: usize,
    pub budget_bytes: u64,
    /// The largest fraction every seed fits at EOR <= the target.
    pub capacity: Option<f64>,
    /// The largest fraction the bound reaches the budget at, every seed.
    pub bound_capacity: Option<f64>,
    /// `capacity / bound_capacity` (no capacity counts 0); `None` where
    /// the bound allows no fraction.
    pub ratio: Option<f64>,
    /// Capacity at least [`NEAR_BOUND`] of the bound's (true where the
    /// bound allows nothing).
    pub near_bound: bool,
    pub runs: usize,
    /// Runs whose measured peak passed the budget.
    pub over: usize,
    /// Runs in which ours could not run at all.
    pub errors: usize,
    pub slower_than_turns: usize,
    pub turns_rows: usize,
    pub worst_eor: f64,
    /// Every seed's fits are monotonic in the fraction: none fits at a
    /// fraction above one it does not fit at.
    pub monotonic: bool,
    /// Seeds whose fits are not monotonic.
    pub non_monotonic_seeds: Vec<u64>,
    pub fractions: Vec<FractionFits>,
}

/// One target and whether the sweep met it.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub name: String,
    /// `None`: the sweep has no case that says (ResNet-50 x2 on the a6000
    /// left out).
    pub met: Option<bool>,
    pub figure: String,
    /// The worst cases against it.
    pub worst: Vec<String>,
}

/// The sweep's totals.
#[derive(Debug, Clone, Serialize)]
pub struct SweepSummary {
    pub cases: usize,
    pub runs: usize,
    pub over_runs: usize,
    pub error_runs: usize,
    pub slower_than_turns_runs: usize,
    pub near_bound_cases: usize,
    pub near_bound_share: f64,
    pub monotonic_cases: usize,
    /// Seeds at which ResNet-50 x2 (b32) fits at the full batch on the
    /// a6000, of how many (`None`: not in the sweep).
    pub resnet50_x2_a6000_full: Option<(usize, usize)>,
    pub targets: Vec<Target>,
}

/// Everything the sweep measured (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    pub iterations: usize,
    pub warmup: usize,
    pub eor_target: f64,
    pub bound_stretch: f64,
    pub bound_grid: u64,
    pub devices: Vec<String>,
    pub fractions: Vec<f64>,
    pub seeds: Vec<u64>,
    pub rows: Vec<SweepRow>,
    pub cases: Vec<SweepCase>,
    pub summary: SweepSummary,
}

/// Runs the sweep's runs not done yet (`plan`, from
/// [`SweepConfig::plan`]) on a pool of `config.threads`, each simulated
/// and its bound scanned; `on_row` gets each new row as it is done (and
/// may keep it: a sweep's `--out` file), `progress` hears of it. The
/// report is over every run of the plan, those done before and the new.
pub fn run_sweep(
    config: &SweepConfig,
    plan: SweepPlan,
    on_row: &(dyn Fn(&SweepRow) -> Result<(), ExperimentError> + Sync),
    progress: &(dyn Fn(&str) + Sync),
) -> Result<SweepReport, ExperimentError> {
    config.check()?;
    let SweepPlan { runs, cases, .. } = plan;
    let colocate = ColocateConfig {
        devices: config.devices.clone(),
        cases: cases.clone(),
        fractions: config.fractions.clone(),
        seeds: config.seeds.clone(),
        iterations: config.iterations,
        warmup: config.warmup,
        threads: config.threads,
        recompute_first: config.recompute_first,
        one_process: false,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(config.threads.max(1))
        .build()
        .map_err(|e| ExperimentError::Colocate(format!("thread pool: {e}")))?;
    let rows: Vec<SweepRow> = pool.install(|| {
        runs.into_par_iter()
            .map(|r| {
                if let Some(row) = r.done {
                    return Ok(row);
                }
                let device = &config.devices[r.device];
                let case = &cases[r.case];
                let run = run_row(&colocate, device, case, r.budget, r.fraction, r.seed)?;
                let graphs = colocate::graphs(case, scaled(case.reference_batch, r.fraction))?;
                let bound = bound_at(&graphs, device, r.seed, r.budget, config)?;
                let row = SweepRow {
                    phase_bound_bytes: bound,
                    bound_fits: bound <= r.budget,
                    fits_target: fits_target(&run),
                    slower_than_turns: run.error.is_none() && slower_than_turns(&run),
                    run,
                };
                on_row(&row)?;
                progress(&format!(
                    "{} {} at {:.3} seed {}",
                    device.name,
                    case.label(),
                    r.fraction,
                    r.seed
                ));
                Ok(row)
            })
            .collect::<Result<_, ExperimentError>>()
    })?;
    let mut summaries = Vec::new();
    for device in &config.devices {
        for case in &cases {
            let label = case.label();
            let mine: Vec<&SweepRow> = rows
                .iter()
                .filter(|r| r.run.device == device.name && r.run.case == label)
                .collect();
            summaries.push(summarize_case(&device.name, case, &mine));
        }
    }
    let summary = summarize(&summaries, &rows);
    Ok(SweepReport {
        iterations: config.iterations,
        warmup: config.warmup,
        eor_target: EOR_TARGET,
        bound_stretch: BOUND_STRETCH,
        bound_grid: config.bound_grid,
        devices: config.devices.iter().map(|d| d.name.clone()).collect(),
        fractions: config.fractions.clone(),
        seeds: config.seeds.clone(),
        rows,
        cases: summaries,
        summary,
    })
}

/// The lowest bound over the jobs' phases (the first at or under the
/// budget), at their true latencies for `seed` slowed by sharing.
fn bound_at(
    graphs: &[Graph],
    device: &DeviceProfile,
    seed: u64,
    budget: u64,
    config: &SweepConfig,
) -> Result<u64, ExperimentError> {
    let jobs = sharing_jobs(graphs.iter(), device, seed);
    let b = phase_bound(
        &jobs,
        &copy_model(device),
        BOUND_STRETCH,
        config.bound_grid,
        Some(budget),
    )?;
    Ok(b.lowest_peak_bytes)
}

/// A run that counts for the capacity.
pub fn fits_target(r: &ColocateRow) -> bool {
    r.error.is_none() && r.fits && r.over_bytes == 0 && r.eor <= EOR_TARGET
}

fn summarize_case(device: &str, case: &ColocateCase, rows: &[&SweepRow]) -> SweepCase {
    let mut fractions: Vec<f64> = rows.iter().map(|r| r.run.fraction).collect();
    fractions.sort_by(f64::total_cmp);
    fractions.dedup();
    let mut seeds: Vec<u64> = rows.iter().map(|r| r.run.seed).collect();
    seeds.sort_unstable();
    seeds.dedup();
    let at = |f: f64| rows.iter().filter(move |r| r.run.fraction == f);
    let per_fraction: Vec<FractionFits> = fractions
        .iter()
        .map(|&f| FractionFits {
            fraction: f,
            seeds: at(f).count(),
            fit: at(f).filter(|r| r.fits_target).count(),
            bound_fits: at(f).filter(|r| r.bound_fits).count(),
        })
        .collect();
    let capacity = per_fraction
        .iter()
        .rev()
        .find(|x| x.seeds > 0 && x.fit == x.seeds)
        .map(|x| x.fraction);
    let bound_capacity = per_fraction
        .iter()
        .rev()
        .find(|x| x.seeds > 0 && x.bound_fits == x.seeds)
        .map(|x| x.fraction);
    let ratio = bound_capacity.map(|b| capacity.unwrap_or(0.0) / b);
    // A seed is monotonic when, fraction by fraction upwards, nothing fits
    // after the first that does not.
    let non_monotonic_seeds: Vec<u64> = seeds
        .iter()
        .copied()
        .filter(|&s| {
            let fits: Vec<bool> = fractions
                .iter()
                .filter_map(|&f| {
                    rows.iter()
                        .find(|r| r.run.fraction == f && r.run.seed == s)
                        .map(|r| r.fits_target)
                })
                .collect();
            fits.windows(2).any(|w| !w[0] && w[1])
        })
        .collect();
    SweepCase {
        device: device.to_string(),
        case: case.label(),
        jobs: case.jobs(),
        budget_bytes: rows.first().map_or(0, |r| r.run.budget_bytes),
        capacity,
        bound_capacity,
        ratio,
        near_bound: ratio.is_none_or(|r| r >= NEAR_BOUND - 1e-9),
        runs: rows.len(),
        over: rows.iter().filter(|r| r.run.over_bytes > 0).count(),
        errors: rows.iter().filter(|r| r.run.error.is_some()).count(),
        slower_than_turns: rows.iter().filter(|r| r.slower_than_turns).count(),
        turns_rows: rows.iter().filter(|r| r.run.layout == "turns").count(),
        worst_eor: rows.iter().map(|r| r.run.eor).fold(0.0, f64::max),
        monotonic: non_monotonic_seeds.is_empty(),
        non_monotonic_seeds,
        fractions: per_fraction,
    }
}

fn name(c: &SweepCase) -> String {
    format!("{} on {}", c.case, c.device)
}

/// The totals and each target, with the worst cases against it (at most
/// five each).
fn summarize(cases: &[SweepCase], rows: &[SweepRow]) -> SweepSummary {
    let runs = rows.len();
    let over_runs = rows.iter().filter(|r| r.run.over_bytes > 0).count();
    let slower = rows.iter().filter(|r| r.slower_than_turns).count();
    let near = cases.iter().filter(|c| c.near_bound).count();
    let share = near as f64 / cases.len().max(1) as f64;
    let monotonic = cases.iter().filter(|c| c.monotonic).count();
    let worst_by = |key: &dyn Fn(&SweepCase) -> f64, label: &dyn Fn(&SweepCase) -> String| {
        let mut bad: Vec<&SweepCase> = cases.iter().filter(|c| key(c) > 0.0).collect();
        bad.sort_by(|a, b| {
            key(b)
                .total_cmp(&key(a))
                .then_with(|| name(a).cmp(&name(b)))
        });
        bad.iter().take(5).map(|c| label(c)).collect::<Vec<_>>()
    };
    let resnet: Vec<&SweepRow> = rows
        .iter()
        .filter(|r| {
            r.run.device == "a6000" && r.run.case == "resnet50 b32 x2" && r.run.fraction == 1.0
        })
        .collect();
    let resnet_full = (!resnet.is_empty()).then(|| {
        (
            resnet.iter().filter(|r| r.fits_target).count(),
            resnet.len(),
        )
    });
    let targets = vec![
        Target {
            name: "0 runs over the budget".to_string(),
            met: Some(over_runs == 0),
            figure: format!("{over_runs} of {runs} runs over the budget"),
            worst: worst_by(&|c| c.over as f64, &|c| {
                format!("{}: {} over", name(c), c.over)
            }),
        },
        Target {
            name: "no run slower than the same jobs in turns".to_string(),
            met: Some(slower == 0),
            figure: format!("{slower} of {runs} runs slower than turns"),
            worst: worst_by(&|c| c.slower_than_turns as f64, &|c| {
                format!("{}: {} slower", name(c), c.slower_than_turns)
            }),
        },
        Target {
            name: format!(
                "capacity >= {NEAR_BOUND} of the bound's in {:.0}% of cases",
                NEAR_BOUND_SHARE * 100.0
            ),
            met: Some(share >= NEAR_BOUND_SHARE - 1e-9),
            figure: format!("{near} of {} cases ({:.1}%)", cases.len(), share * 100.0),
            worst: worst_by(
                &|c| {
                    if c.near_bound {
                        0.0
                    } else {
                        1.0 - c.ratio.unwrap_or(1.0)
                    }
                },
                &|c| {
                    format!(
                        "{}: {} vs bound {}",
                        name(c),
                        fraction(c.capacity),
                        fraction(c.bound_capacity)
                    )
                },
            ),
        },
        Target {
            name: "fits monotonic in the fraction".to_string(),
            met: Some(monotonic == cases.len()),
            figure: format!("{monotonic} of {} cases monotonic", cases.len()),
            worst: worst_by(&|c| c.non_monotonic_seeds.len() as f64, &|c| {
                format!("{}: seeds {:?}", name(c), c.non_monotonic_seeds)
            }),
        },
        Target {
            name: "ResNet-50 x2 at 1.0 on the a6000 at every seed".to_string(),
            met: resnet_full.map(|(fit, n)| fit == n),
            figure: resnet_full.map_or("not in the sweep".to_string(), |(fit, n)| {
                format!("{fit} of {n} seeds fit")
            }),
            worst: resnet
                .iter()
                .filter(|r| !r.fits_target)
                .map(|r| {
                    format!(
                        "seed {}: EOR {:.3}, over {} B",
                        r.run.seed, r.run.eor, r.run.over_bytes
                    )
                })
                .collect(),
        },
    ];
    SweepSummary {
        cases: cases.len(),
        runs,
        over_runs,
        error_runs: rows.iter().filter(|r| r.run.error.is_some()).count(),
        slower_than_turns_runs: slower,
        near_bound_cases: near,
        near_bound_share: share,
        monotonic_cases: monotonic,
        resnet50_x2_a6000_full: resnet_full,
        targets,
    }
}

/// A capacity as printed: the fraction, or `-` for none.
pub fn fraction(f: Option<f64>) -> String {
    f.map_or("-".to_string(), |f| format!("{f:.3}"))
}
