//! Every iteration of k copies of a zoo model planned by ours under a
//! budget in the simulator, as `bench colocate` runs one of its rows: when
//! each began and how long it ran, its ops' measured time, its stalls,
//! waits for memory, time held to its plan's pace, late prefetches, the
//! guard's evictions, its peak and the plan version it ran. This is how to
//! see why a row misses its EOR (a copy drifting off its gate, a re-plan
//! the run cannot hold).
//!
//! ```text
//! cargo run --release -p tensile-experiments --example iterations -- \
//!     MODEL[:OPTIMIZER] BATCH COPIES BUDGET_BYTES [SEED] [ITERATIONS] [DEVICE] [--one-process] [--turns=MODE]
//! ```
//!
//! `BUDGET_BYTES` is the budget `bench colocate` prints in its JSON
//! (`budget_bytes`); MODEL may name an optimizer as `bench colocate`'s
//! cases do (`bert_base:adam-in-backward`); the seed defaults to 1, the iterations to 12 and the
//! device to `a6000`.

use std::process::ExitCode;

use tensile_baselines::Policy;
use tensile_experiments::colocate::{self, ColocateCase};
use tensile_experiments::device::one_process;
use tensile_experiments::{device_profile, run_policy};
use tensile_graph::Liveness;
use tensile_planner::{RecomputeFirst, Turns};

#[path = "common/mod.rs"]
mod common;

const USAGE: &str = "usage: iterations MODEL[:OPTIMIZER] BATCH COPIES BUDGET_BYTES [SEED] [ITERATIONS] [DEVICE] [--one-process] [--turns=never|when-faster|always]";

fn main() -> ExitCode {
    common::exit("iterations", run)
}

fn run() -> Result<(), String> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let shared = all.iter().any(|a| a == "--one-process");
    let turns = match all.iter().find_map(|a| a.strip_prefix("--turns=")) {
        Some(t) => Turns::parse(t)?,
        None => Turns::default(),
    };
    let args: Vec<String> = all
        .into_iter()
        .filter(|a| a != "--one-process" && !a.starts_with("--turns="))
        .collect();
    let p = common::Positional {
        args: &args,
        usage: USAGE,
    };
    let model = p.text(0, "MODEL")?;
    let batch: u64 = p.get(1, "BATCH", None)?;
    let copies: usize = p.get(2, "COPIES", None)?;
    let budget: u64 = p.get(3, "BUDGET_BYTES", None)?;
    let seed: u64 = p.get(4, "SEED", Some(1))?;
    let iterations: usize = p.get(5, "ITERATIONS", Some(12))?;
    let device = args.get(6).map_or("a6000", String::as_str);
    if !(1..=16).contains(&copies) || batch == 0 || !(1..=1000).contains(&iterations) {
        return Err(format!(
            "COPIES must be 1 to 16, BATCH positive, ITERATIONS 1 to 1000; {USAGE}"
        ));
    }
    let mut profile = device_profile(device).map_err(|e| e.to_string())?;
    if shared {
        profile = one_process(&profile, copies);
    }
    let case = match model.split_once(':') {
        Some((model, optimizer)) => ColocateCase::new(model, batch, copies)
            .with_optimizer(optimizer)
            .map_err(|e| e.to_string())?,
        None => ColocateCase::new(model, batch, copies),
    };
    let graphs = colocate::graphs(&case, batch).map_err(|e| e.to_string())?;
    let lives: Vec<Liveness> = graphs.iter().map(Liveness::analyze).collect();
    let opts = colocate::options(
        iterations,
        seed,
        Some(budget),
        RecomputeFirst::default(),
        turns,
    );
    let run = run_policy(&graphs, &lives, Policy::Tensile, &profile, &opts, None)
        .map_err(|e| e.to_string())?;
    let ms = |ns: u64| ns as f64 / 1e6;
    for (j, gate) in run.gates.iter().enumerate() {
        match gate {
            Some(g) => println!(
                "copy {j}: first gate period {:.1} ms, phase {:.1} ms",
                ms(g.period_ns),
                ms(g.phase_ns)
            ),
            None => println!("copy {j}: first plan not gated"),
        }
    }
    println!(
        "copy  it  plan  start ms    ran ms    ops ms  stall ms  mem wait ms  paced ms  late  evicted  peak MiB"
    );
    for (j, job) in run.result.jobs.iter().enumerate() {
        for (i, it) in job.iterations.iter().enumerate() {
            println!(
                "{j:>4} {i:>3} {:>4}{} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>12.1} {:>9.1} {:>5} {:>8} {:>9.0}",
                it.plan_version,
                if it.switched { "*" } else { " " },
                ms(it.start_ns),
                ms(it.end_ns - it.start_ns),
                ms(it.op_ns.iter().sum()),
                ms(it.stall_ns),
                ms(it.memory_wait_ns),
                ms(it.paced_ns),
                it.late_prefetches.len(),
                it.guard_evictions,
                it.peak_bytes as f64 / (1u64 << 20) as f64
            );
        }
    }
    println!("*: the first iteration on a new plan");
    let layouts: Vec<&str> = run.layouts.iter().map(|l| l.name()).collect();
    println!("layouts, plan by plan: {}", layouts.join(" "));
    if !run.layout_note.is_empty() {
        println!("first plan: {}", run.layout_note);
    }
    println!(
        "peak of all copies together {:.0} MiB of a {:.0} MiB budget; {} re-plans",
        run.result.peak_bytes as f64 / (1u64 << 20) as f64,
        budget as f64 / (1u64 << 20) as f64,
        run.replans
    );
    for (at, e) in &run.result.replan_errors {
        println!("re-plan at {:.1} ms failed: {e}", ms(*at));
    }
    Ok(())
}
