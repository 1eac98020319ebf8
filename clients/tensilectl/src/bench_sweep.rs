//! `tensilectl bench colocate --sweep` (`tensile_experiments::sweep`):
//! prints a line per case (capacity beside the bound's, runs over the
//! budget and slower than turns, monotonic fits) and the summary against
//! the targets; with `--plot`, each case's capacity beside the bound's.

use anyhow::Result;
use tensile_experiments::colocate::EOR_TARGET;
use tensile_experiments::sweep::{
    BOUND_STRETCH, NEAR_BOUND, SweepConfig, SweepReport, SweepRow, fraction, run_sweep,
};
use tensile_experiments::sweep_out::SweepOut;

use crate::config::ColocateCommand;
use crate::plot::{Bars, render_bars_wide};
use crate::progress::Progress;
use crate::report::device_names;
use tensile_cli::format_mb;

pub(crate) fn run(c: &ColocateCommand, config: &SweepConfig) -> Result<()> {
    let (out, prior) = match &c.out {
        Some(path) => {
            let (out, rows) = SweepOut::open(path, config)?;
            (Some(out), rows)
        }
        None => (None, Vec::new()),
    };
    let plan = config.plan(prior)?;
    let runs = plan.total();
    let todo = runs - plan.done();
    eprintln!(
        "bench colocate --sweep: {} cases x {} fractions x {} seeds on {} ({runs} runs of {} iterations beside vanilla and in turns, each with a bound scan)",
        config.cases().len(),
        config.fractions.len(),
        config.seeds.len(),
        device_names(&config.devices),
        config.iterations
    );
    if let Some(out) = &out {
        eprintln!(
            "{}: {} of the runs already there, {todo} to run, each appended as it is done{}",
            out.path().display(),
            plan.done(),
            match plan.unused() {
                0 => String::new(),
                n => format!(" ({n} rows of other runs left out of this summary)"),
            }
        );
    }
    let progress = Progress::new(todo);
    let append = |row: &SweepRow| out.as_ref().map_or(Ok(()), |o| o.append(row));
    let report = run_sweep(config, plan, &append, &|what| progress.tick(what));
    progress.bar.finish();
    let report = report?;
    crate::bench_colocate::finish(
        c,
        &report,
        || render_bars_wide(&capacity_bars(&report), 7),
        print_report,
    )
}

fn print_report(r: &SweepReport) {
    tensile_cli::outln!(
        "capacity: the largest fraction every seed fits at EOR <= {EOR_TARGET} with nothing over the budget; bound: the largest at which, every seed, some phases let a swap plan adding no time beyond a period {BOUND_STRETCH} times the longest iteration reach the budget (LP, the device's link)"
    );
    tensile_cli::outln!(
        "seeds {:?}, fractions {:?}, {} iterations ({} of warm-up)",
        r.seeds,
        r.fractions,
        r.iterations,
        r.warmup
    );
    tensile_cli::outln!();
    tensile_cli::outln!(
        "{:<6} {:<36} {:>10} {:>8} {:>6} {:>6} {:>5} {:>6} {:>5} {:>5}  fit/bound per fraction",
        "device",
        "case",
        "budget",
        "capacity",
        "bound",
        "ratio",
        "over",
        "slower",
        "error",
        "mono"
    );
    for s in &r.cases {
        let per: Vec<String> = s
            .fractions
            .iter()
            .map(|f| format!("{}/{}", f.fit, f.bound_fits))
            .collect();
        tensile_cli::outln!(
            "{:<6} {:<36} {:>10} {:>8} {:>6} {:>6} {:>5} {:>6} {:>5} {:>5}  {}",
            s.device,
            s.case,
            format_mb(s.budget_bytes),
            fraction(s.capacity),
            fraction(s.bound_capacity),
            s.ratio.map_or("-".to_string(), |x| format!("{x:.2}")),
            s.over,
            s.slower_than_turns,
            s.errors,
            if s.monotonic { "yes" } else { "NO" },
            per.join(" ")
        );
    }
    tensile_cli::outln!();
    let m = &r.summary;
    tensile_cli::outln!(
        "{} cases, {} runs ({} could not run); capacity >= {NEAR_BOUND} of the bound's in {} cases",
        m.cases,
        m.runs,
        m.error_runs,
        m.near_bound_cases
    );
    tensile_cli::outln!("targets:");
    for t in &m.targets {
        let met = match t.met {
            Some(true) => "MET",
            Some(false) => "NOT MET",
            None => "n/a",
        };
        tensile_cli::outln!("  {:<8} {}: {}", met, t.name, t.figure);
        for w in &t.worst {
            tensile_cli::outln!("           {w}");
        }
    }
}

/// Each case's capacity beside the bound's (a missing one, a cross).
fn capacity_bars(r: &SweepReport) -> Bars {
    let groups = r
        .cases
        .iter()
        .map(|s| format!("{} @ {}", s.case, s.device))
        .collect();
    Bars {
        title: format!(
            "Capacity vs the swap bound's (EOR <= {EOR_TARGET}, budget one job's vanilla peak)"
        ),
        y_label: "fraction of the reference batch".to_string(),
        groups,
        series: vec![
            (
                "capacity (ours)".to_string(),
                r.cases.iter().map(|s| s.capacity).collect(),
            ),
            (
                "bound allows".to_string(),
                r.cases.iter().map(|s| s.bound_capacity).collect(),
            ),
        ],
    }
}
