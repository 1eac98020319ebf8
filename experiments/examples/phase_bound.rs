//! The swap bound of k copies of a zoo model sharing one simulated GPU, at
//! the phases that make it lowest: whether any swap plan that adds no time
//! (beyond a gate period stretched by a chosen share) can fit a budget,
//! whatever the phases the scheduler picks.
//!
//! ```text
//! cargo run --release -p tensile-experiments --example phase_bound -- \
//!     MODEL BATCH COPIES [DEVICE] [STRETCH] [GRID] [SEED]
//! ```
//!
//! Every copy runs its iteration with its ops slowed by the device's
//! sharing slowdown for `COPIES` jobs (job `j` draws its latency bias from
//! seed `SEED + j`, as `tensilectl sim` does); the common period is the
//! longest iteration times `STRETCH` (default 1: no time added; 1.05: the
//! 5% a gate may add within the co-location target). Copy 0 starts at 0;
//! the others take every phase on a grid of `GRID` steps of the period
//! (default 32 for two copies, 8 for three; more copies are not scanned).
//! It prints the bound at evenly spread phases, the lowest on the grid, and
//! the bound with an infinitely fast link (what the link costs).

use std::process::ExitCode;

use tensile_experiments::device::copy_model;
use tensile_experiments::{BoundJob, device_profile, sharing_jobs, swap_bound};
use tensile_graph::builder::Optimizer;
use tensile_graph::zoo::{self, ZooConfig};

const GIB: f64 = (1u64 << 30) as f64;

#[path = "common/mod.rs"]
mod common;

const USAGE: &str = "usage: phase_bound MODEL BATCH COPIES [DEVICE] [STRETCH] [GRID] [SEED]";

fn main() -> ExitCode {
    common::exit("phase_bound", run)
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let p = common::Positional {
        args: &args,
        usage: USAGE,
    };
    let model = p.text(0, "MODEL")?;
    let batch: u64 = p.get(1, "BATCH", None)?;
    let copies: usize = p.get(2, "COPIES", None)?;
    let device = args.get(3).map_or("a6000", String::as_str);
    let stretch: f64 = p.get(4, "STRETCH", Some(1.0))?;
    let grid: u64 = p.get(5, "GRID", Some(if copies == 2 { 32 } else { 8 }))?;
    let seed: u64 = p.get(6, "SEED", Some(1))?;
    if !(2..=3).contains(&copies) {
        return Err(format!("COPIES must be 2 or 3, got {copies}"));
    }
    if !(stretch.is_finite() && stretch >= 1.0) {
        return Err(format!("STRETCH must be at least 1, got {stretch}"));
    }
    if !(1..=256).contains(&grid) {
        return Err(format!("GRID must be 1 to 256, got {grid}"));
    }
    let profile = device_profile(device).map_err(|e| e.to_string())?;
    let mut config = ZooConfig::new(batch);
    config.optimizer = Optimizer::adam();
    let graph = zoo::build(model, &config).map_err(|e| e.to_string())?;
    let slow = 1.0 + profile.sharing_slowdown * (copies - 1) as f64;
    let jobs = sharing_jobs(std::iter::repeat_n(&graph, copies), &profile, seed);
    let iterations: Vec<u64> = jobs.iter().map(|j| j.latency_ns.iter().sum()).collect();
    let longest = iterations.iter().copied().max().unwrap_or(0);
    let period = (longest as f64 * stretch).round() as u64;
    let jobs_at = |phases: &[u64]| -> Vec<BoundJob<'_>> {
        jobs.iter()
            .zip(phases)
            .map(|(job, &phase_ns)| BoundJob {
                phase_ns,
                ..job.clone()
            })
            .collect()
    };
    let link = copy_model(&profile);
    let bound = |phases: &[u64]| -> Result<u64, String> {
        swap_bound(&jobs_at(phases), Some(period), &link, 64)
            .map(|r| r.lowest_peak_bytes)
            .map_err(|e| e.to_string())
    };
    let spread: Vec<u64> = (0..copies as u64)
        .map(|j| period * j / copies as u64)
        .collect();
    let even = bound(&spread)?;
    let mut best = (even, spread.clone());
    let steps: Vec<u64> = (0..grid).map(|i| period * i / grid).collect();
    let grid_phases: Vec<Vec<u64>> = if copies == 2 {
        steps.iter().map(|&p| vec![0, p]).collect()
    } else {
        steps
            .iter()
            .flat_map(|&a| steps.iter().map(move |&b| vec![0, a, b]))
            .collect()
    };
    for phases in &grid_phases {
        let b = bound(phases)?;
        if b < best.0 {
            best = (b, phases.clone());
        }
    }
    let mut fast = link;
    fast.h2d_bytes_per_s = 1e18;
    fast.d2h_bytes_per_s = 1e18;
    let unlimited = swap_bound(&jobs_at(&best.1), Some(period), &fast, 64)
        .map_err(|e| e.to_string())?
        .lowest_peak_bytes;
    let ms = |ns: u64| ns as f64 / 1e6;
    println!(
        "{model} b{batch} x{copies} on {device} (seed {seed}): iterations {} ms at {slow:.2}x sharing; period {:.1} ms (x{stretch})",
        iterations
            .iter()
            .map(|&t| format!("{:.1}", ms(t)))
            .collect::<Vec<_>>()
            .join(", "),
        ms(period)
    );
    println!(
        "bound at evenly spread phases: {:.2} GiB",
        even as f64 / GIB
    );
    println!(
        "lowest bound over {} phase choices (the grid and the even spread): {:.2} GiB at phases {} ms",
        grid_phases.len() + 1,
        best.0 as f64 / GIB,
        best.1
            .iter()
            .map(|&p| format!("{:.1}", ms(p)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "the same with an infinitely fast link: {:.2} GiB",
        unlimited as f64 / GIB
    );
    Ok(())
}
