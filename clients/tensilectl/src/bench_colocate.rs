//! `tensilectl bench colocate`: k copies of a model under one copy's
//! memory (`tensile_experiments::colocate`); prints a table per device and
//! case, the capacities, and with `--plot` draws the capacity per case.

use anyhow::{Context, Result};
use tensile_experiments::colocate::{
    ColocateReport, ColocateRow, EOR_TARGET, TURNS_TOLERANCE, slower_than_turns,
};
use tensile_experiments::run_colocate;

use tensile_experiments::ColocateConfig;

use crate::config::{ColocateCommand, ColocateMode};
use crate::plot::{Bars, render_bars};
use crate::progress::Progress;
use crate::report::device_names;
use tensile_cli::format_mb;

pub(crate) fn run(c: &ColocateCommand) -> Result<()> {
    match &c.mode {
        ColocateMode::Cases(config) => run_cases(c, config),
        ColocateMode::Sweep(config) => crate::bench_sweep::run(c, config),
    }
}

fn run_cases(c: &ColocateCommand, config: &ColocateConfig) -> Result<()> {
    let progress = Progress::new(config.total_runs());
    eprintln!(
        "bench colocate: {} cases x {} fractions x {} seeds on {} ({} runs of {} iterations, each beside vanilla)",
        config.cases.len(),
        config.fractions.len(),
        config.seeds.len(),
        device_names(&config.devices),
        progress.total,
        config.iterations
    );
    let report = run_colocate(config, &|what| progress.tick(what));
    progress.bar.finish();
    let report = report?;
    finish(
        c,
        &report,
        || render_bars(&capacity_bars(&report)),
        print_report,
    )
}

/// A bench's end: the capacity plot written where `--plot` says (drawn by
/// `svg`), then the report as JSON with `--json`, else by `print`.
pub(crate) fn finish<R: serde::Serialize>(
    c: &ColocateCommand,
    report: &R,
    svg: impl FnOnce() -> Result<String>,
    print: fn(&R),
) -> Result<()> {
    if let Some(path) = &c.plot {
        std::fs::write(path, svg()?).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("capacity plot written to {}", path.display());
    }
    if c.json {
        tensile_cli::outln!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print(report);
    }
    Ok(())
}

fn print_report(r: &ColocateReport) {
    tensile_cli::outln!(
        "budget: one copy's vanilla peak at the reference batch; EOR: steady state (iterations {} to {}) against the same jobs co-located with no memory limit",
        r.warmup + 1,
        r.iterations
    );
    if r.one_process {
        tensile_cli::outln!(
            "one process: the copies are threads of one process (tensile-worker --copies) and share one base"
        );
    }
    let mut groups: Vec<(&str, &str)> = r
        .rows
        .iter()
        .map(|x| (x.device.as_str(), x.case.as_str()))
        .collect();
    groups.dedup();
    for (device, case) in groups {
        let rows: Vec<&ColocateRow> = r
            .rows
            .iter()
            .filter(|x| x.device == device && x.case == case)
            .collect();
        tensile_cli::outln!();
        tensile_cli::outln!(
            "{case} on {device}, budget {}",
            format_mb(rows.first().map_or(0, |x| x.budget_bytes))
        );
        tensile_cli::outln!(
            "{:>8} {:>5} {:>4} {:>10} {:>10} {:>10} {:>10} {:>6} {:>6} {:>7} {:>6} {:>8} {:>6} {:>7}  result",
            "fraction",
            "batch",
            "seed",
            "vanilla",
            "predicted",
            "measured",
            "bound",
            "msr",
            "msr≤",
            "eor",
            "gated",
            "stall s",
            "layout",
            "turns"
        );
        for x in rows {
            let result = match (&x.error, x.fits) {
                (Some(e), _) => format!("does not run: {e}"),
                (None, true) if x.eor <= EOR_TARGET => "fits".to_string(),
                (None, true) => format!("fits, EOR over {EOR_TARGET}"),
                (None, false) => format!("OVER the budget by {}", format_mb(x.over_bytes)),
            };
            let result = if x.error.is_none() && slower_than_turns(x) {
                format!("{result}; SLOWER than taking turns")
            } else {
                result
            };
            tensile_cli::outln!(
                "{:>8.3} {:>5} {:>4} {:>10} {:>10} {:>10} {:>10} {:>6.3} {:>6.3} {:>7.4} {:>6} {:>8.3} {:>6} {:>7.4}  {result}",
                x.fraction,
                x.batch,
                x.seed,
                format_mb(x.vanilla_peak_bytes),
                format_mb(x.predicted_peak_bytes),
                format_mb(x.peak_bytes),
                format_mb(x.bound_peak_bytes),
                x.msr,
                x.msr_bound,
                x.eor,
                if x.gated {
                    format!("{:.0}ms", x.cycle_ms)
                } else {
                    "no".to_string()
                },
                x.stall_s,
                x.layout,
                x.turns_eor,
            );
        }
    }
    tensile_cli::outln!();
    tensile_cli::outln!(
        "layout: how ours ran at the end (free, gated, turns); turns: the EOR of the same jobs made to take turns under the same budget"
    );
    tensile_cli::outln!(
        "per case: the worst EOR of ours and of turns, rows in turns, rows slower than turns (by over {TURNS_TOLERANCE} of their throughput):"
    );
    for s in &r.cases {
        tensile_cli::outln!(
            "  {:<22} on {:<6} worst EOR {:.3}, turns {:.3}; {} rows in turns, {} slower than turns",
            s.case,
            s.device,
            s.worst_eor,
            s.worst_turns_eor,
            s.turns_rows,
            s.slower_than_turns
        );
    }
    tensile_cli::outln!();
    tensile_cli::outln!("capacity (the largest fraction every seed fits at EOR <= {EOR_TARGET}):");
    for s in &r.cases {
        tensile_cli::outln!(
            "  {:<22} on {:<6} {}{}",
            s.case,
            s.device,
            s.capacity
                .map_or("below the smallest fraction".to_string(), |f| format!(
                    "{f:.3}"
                )),
            if s.over > 0 {
                format!("  ({} runs OVER the budget)", s.over)
            } else {
                String::new()
            }
        );
    }
    tensile_cli::outln!(
        "msr≤: the saving of the lowest peak any swap plan that adds no time could reach at the same phases (an LP bound)"
    );
}

/// Capacity per case, a bar per device.
fn capacity_bars(r: &ColocateReport) -> Bars {
    // Each case once, in the order of the first device's (the summaries
    // come device by device).
    let mut cases: Vec<String> = Vec::new();
    for s in &r.cases {
        if !cases.contains(&s.case) {
            cases.push(s.case.clone());
        }
    }
    let mut devices: Vec<String> = r.cases.iter().map(|s| s.device.clone()).collect();
    devices.sort();
    devices.dedup();
    let series = devices
        .iter()
        .map(|d| {
            let vals = cases
                .iter()
                .map(|c| {
                    r.cases
                        .iter()
                        .find(|s| &s.device == d && &s.case == c)
                        .map(|s| s.capacity.unwrap_or(0.0))
                })
                .collect();
            (d.clone(), vals)
        })
        .collect();
    Bars {
        title: format!(
            "Capacity: the batch fraction k copies fit in one copy's memory at EOR <= {EOR_TARGET}"
        ),
        y_label: "fraction of the reference batch".to_string(),
        groups: cases,
        series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_experiments::colocate::CaseSummary;

    #[test]
    fn the_capacity_plot_has_each_case_once_with_a_bar_per_device() {
        let case = |device: &str, case: &str, capacity| CaseSummary {
            device: device.into(),
            case: case.into(),
            budget_bytes: 1,
            capacity,
            over: 0,
            worst_eor: 0.0,
            worst_turns_eor: 0.0,
            turns_rows: 0,
            slower_than_turns: 0,
        };
        let report = ColocateReport {
            iterations: 12,
            warmup: 4,
            eor_target: EOR_TARGET,
            one_process: false,
            rows: Vec::new(),
            cases: vec![
                case("a6000", "x2", Some(1.0)),
                case("a6000", "x3", None),
                case("h100", "x2", Some(0.5)),
                case("h100", "x3", Some(0.625)),
            ],
        };
        let bars = capacity_bars(&report);
        assert_eq!(bars.groups, ["x2", "x3"]);
        assert_eq!(
            bars.series,
            [
                ("a6000".to_string(), vec![Some(1.0), Some(0.0)]),
                ("h100".to_string(), vec![Some(0.5), Some(0.625)]),
            ]
        );
    }
}
