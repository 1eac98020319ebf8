//! `tensilectl bench planner`: how the joint planner scales with the job
//! count. For each count, `bench service`'s job mix (zoo models at batch
//! 2, roofline latencies on the a6000) planned in one call as the
//! scheduler plans its jobs: the a6000's copy link, its memory as the
//! budget, gates allowed, every job with the profile's base. Prints the
//! wall time, the moves tried, the rounds, whether the plan was capped and
//! the sum of the planned peaks against the budget.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use tensile_latency_model::DeviceProfile;
use tensile_planner::{JobInput, PlannerConfig};

use crate::args::BenchPlannerArgs;
use crate::bench_service::job_mix;
use crate::progress::Progress;

#[derive(Debug, Clone, Serialize)]
struct Row {
    jobs: usize,
    wall_s: f64,
    /// Swaps tried and budget moves tried on a copy of a job.
    moves_tried: u64,
    rounds: usize,
    swap_rounds: usize,
    budget_rounds: usize,
    /// The search stopped at its cap.
    capped: bool,
    /// Free, gated or turns.
    layout: String,
    sum_of_peaks_mb: f64,
    /// For gated plans and turns: the peak of the jobs' aligned curves.
    aligned_peak_mb: f64,
    vanilla_sum_of_peaks_mb: f64,
    budget_mb: f64,
}

pub(crate) fn run(a: &BenchPlannerArgs) -> Result<()> {
    let counts: Vec<usize> = a
        .jobs
        .split(',')
        .map(|s| s.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .context("--jobs: expected numbers, comma separated")?;
    if counts.is_empty() || counts.iter().any(|&n| n == 0 || n > 4096) {
        bail!("--jobs: each count must be in 1..=4096");
    }
    let cap = match a.time_cap_s {
        None => None,
        Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => bail!("--time-cap-s must be a positive number of seconds, got {s}"),
    };
    let device = DeviceProfile::builtin("a6000")?;
    let mix = job_mix(&a.models, &device)?;
    if a.max_moves == Some(0) {
        bail!("--max-moves must be at least 1");
    }
    let mut config = scheduler_config(&device);
    config.time_cap = cap;
    config.max_moves = a.max_moves;
    config.coordinate = !a.no_gates;
    let settings = tensile_plan_job::job_settings(&device);
    let progress = Progress::new(counts.len());
    let mut rows = Vec::new();
    for &n in &counts {
        progress.bar.set_message(format!("planning {n} jobs"));
        if progress.bar.is_hidden() {
            eprintln!("planning {n} jobs");
        }
        let inputs: Vec<JobInput<'_>> = (0..n)
            .map(|k| {
                let (g, lat) = &mix[k % mix.len()];
                JobInput::new(g, lat.clone(), settings)
            })
            .collect();
        let t = Instant::now();
        let mp = tensile_planner::plan(&inputs, &config)
            .with_context(|| format!("planning {n} jobs"))?;
        let wall = t.elapsed().as_secs_f64();
        let mb = |b: u64| b as f64 / 1e6;
        let row = Row {
            jobs: n,
            wall_s: wall,
            moves_tried: mp.profile.moves_tried,
            rounds: mp.rounds,
            swap_rounds: mp.profile.swap_rounds,
            budget_rounds: mp.profile.budget_rounds,
            capped: mp.profile.capped,
            layout: mp.layout.name().to_string(),
            sum_of_peaks_mb: mb(mp.sum_of_peaks_bytes),
            aligned_peak_mb: mb(mp.aligned_peak_bytes),
            vanilla_sum_of_peaks_mb: mb(mp.vanilla_sum_of_peaks_bytes),
            budget_mb: mb(config.budget_bytes.unwrap_or(0)),
        };
        progress.tick(&format!("{n} jobs in {wall:.2} s"));
        if !a.json {
            if rows.is_empty() {
                print_header();
            }
            print_row(&row);
        }
        rows.push(row);
    }
    progress.bar.finish_and_clear();
    if a.json {
        tensile_cli::outln!("{}", serde_json::to_string_pretty(&rows)?);
    }
    Ok(())
}

/// The planner's configuration as the scheduler's (defaults) on `device`:
/// its memory the budget, gates (and turns) allowed.
fn scheduler_config(device: &DeviceProfile) -> PlannerConfig {
    let mut c = tensile_plan_job::planner_config(device, Some(device.memory_bytes), false);
    c.coordinate = true;
    c
}

fn print_header() {
    tensile_cli::outln!(
        "{:>5} {:>9} {:>10} {:>7} {:>6} {:>7} {:>6} {:>7} {:>12} {:>12} {:>12} {:>10}",
        "jobs",
        "wall s",
        "moves",
        "rounds",
        "swap",
        "budget",
        "capped",
        "layout",
        "peaks MB",
        "aligned MB",
        "vanilla MB",
        "budget MB"
    );
}

fn print_row(r: &Row) {
    tensile_cli::outln!(
        "{:>5} {:>9.3} {:>10} {:>7} {:>6} {:>7} {:>6} {:>7} {:>12.0} {:>12.0} {:>12.0} {:>10.0}",
        r.jobs,
        r.wall_s,
        r.moves_tried,
        r.rounds,
        r.swap_rounds,
        r.budget_rounds,
        if r.capped { "yes" } else { "no" },
        r.layout,
        r.sum_of_peaks_mb,
        r.aligned_peak_mb,
        r.vanilla_sum_of_peaks_mb,
        r.budget_mb
    );
}
