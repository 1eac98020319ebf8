//! `tensilectl sim`: jobs sharing one simulated GPU under a policy, side by
//! side with vanilla (free after last use); the table, and memory over time
//! as a chart.

use anyhow::{Context, Result};
use tensile_baselines::Policy;
use tensile_executor::sim::SimResult;
use tensile_experiments::metrics::total_trace;
use tensile_experiments::{SimReport, SimStage, simulate_workload};
use tensile_graph::Graph;

use crate::config::SimCommand;
use crate::plot::{Chart, Series, render_svg};
use tensile_cli::format_mb;

pub(crate) fn run(c: &SimCommand) -> Result<()> {
    let n = c.graphs.len();
    let mut stage = |s: SimStage| match s {
        SimStage::Vanilla => eprintln!("simulating {n} jobs: vanilla ..."),
        SimStage::OursForCapuchinBudgets => {
            eprintln!("simulating {n} jobs: tensile, for capuchin's budgets ...");
        }
        SimStage::Policy(p) => eprintln!("simulating {n} jobs: {} ...", p.name()),
        SimStage::Bound => eprintln!("the bound: a linear program over the link ..."),
    };
    let outcome = simulate_workload(&c.graphs, c.policy, &c.profile, &c.options, &mut stage)?;
    for w in &outcome.warnings {
        eprintln!("note: {w}");
    }
    let report = &outcome.report;
    if let Some(path) = &c.plot {
        let chart = chart(
            &c.graphs,
            &outcome.vanilla.result,
            &outcome.run.result,
            report,
        );
        std::fs::write(path, render_svg(&chart)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("memory plot written to {}", path.display());
    }
    if c.json {
        tensile_cli::outln!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print_table(report);
    }
    Ok(())
}

fn print_table(r: &SimReport) {
    tensile_cli::outln!(
        "{} jobs on {}, policy {}, {} iterations (seed {})",
        r.jobs.len(),
        r.device,
        r.policy.name(),
        r.iterations,
        r.seed
    );
    tensile_cli::outln!(
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
        tensile_cli::outln!(
            "{:<28} {:>11} {:>11} {:>7.3} {:>7.3} {:>7.3} {:>9.2}ms {:>8.2}ms {:>8.4} {:>8} {:>7.4} {:>7}",
            m.name,
            format_mb(m.peak_vanilla_bytes),
            format_mb(m.peak_bytes),
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
    tensile_cli::outln!(
        "planning: {:.2} ms in all; first plan {:.2} ms; {} re-plans, {:.2} ms mean, {:.2} ms worst",
        r.system.plan_ms,
        r.first_plan_ms,
        r.system.replans,
        r.replan_mean_ms,
        r.replan_max_ms
    );
    let ours = r.policy == Policy::Tensile;
    if ours {
        tensile_cli::outln!(
            "cold start: {} (error vs the true latencies {:.1}%)",
            r.cold_start_latencies,
            r.cold_start_error * 100.0
        );
    }
    for m in r.jobs.iter().filter(|m| m.over_budget_bytes > 0) {
        tensile_cli::outln!(
            "note: {} went over its memory budget by up to {} (nothing more could be evicted)",
            m.name,
            format_mb(m.over_budget_bytes)
        );
    }
    tensile_cli::outln!(
        "msr max: the saving at the lower bound (largest working set of one op + base)"
    );
    if let (Some(peak), Some(msr)) = (r.bound_peak_bytes, r.msr_bound) {
        tensile_cli::outln!(
            "bound: no swap plan that adds no time goes under {} on this link (msr {msr:.3}, ours {:.3})",
            format_mb(peak),
            r.system.msr
        );
    }
    if ours {
        tensile_cli::outln!(
            "predicted global peak: sum of peaks {}, aligned {}",
            format_mb(r.predicted_sum_of_peaks_bytes),
            format_mb(r.predicted_aligned_peak_bytes)
        );
    }
}

/// (ns, bytes) as (s, bytes) for the chart.
fn seconds(trace: &[(u64, u64)]) -> Vec<(f64, f64)> {
    trace
        .iter()
        .map(|&(t, m)| (t as f64 / 1e9, m as f64))
        .collect()
}

fn chart(graphs: &[Graph], vanilla: &SimResult, run: &SimResult, r: &SimReport) -> Chart {
    let policy = r.policy.name();
    let mut series = vec![
        Series {
            label: "total, vanilla".into(),
            points: seconds(&total_trace(vanilla)),
            dashed: true,
        },
        Series {
            label: format!("total, {policy}"),
            points: seconds(&total_trace(run)),
            dashed: false,
        },
    ];
    for (j, g) in graphs.iter().enumerate() {
        series.push(Series {
            label: format!("{} vanilla", g.name()),
            points: seconds(&vanilla.jobs[j].trace),
            dashed: true,
        });
        series.push(Series {
            label: format!("{} {policy}", g.name()),
            points: seconds(&run.jobs[j].trace),
            dashed: false,
        });
    }
    Chart {
        title: format!(
            "Memory over time on {}: vanilla (dashed) vs {policy} (solid)",
            r.device
        ),
        series,
    }
}
