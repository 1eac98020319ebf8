//! `tensilectl bench paper`: runs the paper's experiments through
//! `tensile_experiments::run_bench` and prints them beside the paper's
//! figures, with a Pareto summary; `--plot` draws them.

use std::path::Path;

use anyhow::{Context, Result};
use tensile_baselines::Policy;
use tensile_experiments::paper::{paper_figure, paper_phases};
use tensile_experiments::pareto::EPS;
use tensile_experiments::{
    DeviceOutcome, Experiment, PolicyOutcome, RunPolicy, WorkloadOutcome, run_bench,
};

use crate::config::BenchCommand;
use crate::plot::{Bars, Chart, Series, render_bars, render_svg};
use crate::progress::Progress;
use crate::report::device_names;

pub(crate) fn run(c: &BenchCommand) -> Result<()> {
    let config = &c.config;
    let progress = Progress::new(config.total_runs());
    eprintln!(
        "bench paper: {} workloads x {} policies on {} ({} simulations of {} iterations, plus vanilla)",
        config.workloads().len(),
        config.policies().len(),
        device_names(&config.devices),
        progress.total,
        config.iterations
    );
    let report = run_bench(config, &|what| progress.tick(what));
    progress.bar.finish();
    let report = report?;
    if let Some(dir) = &c.plot {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for d in &report.devices {
            plots(d, &report.policies, dir)?;
        }
        eprintln!("plots written to {}", dir.display());
    }
    if c.json {
        tensile_cli::outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for d in &report.devices {
            print_device(d, report.iterations);
        }
    }
    Ok(())
}

/// What each experiment's table is headed with.
fn title(e: Experiment) -> &'static str {
    match e {
        Experiment::Single => "Table III: one job at batch 16",
        Experiment::Copies => "Fig. 6: 1-3 copies of one model at batch 2",
        Experiment::Mixed => "Table IV: the five models at batch 2, launched one by one",
        Experiment::Batch => "Fig. 7: one job, batch 2-32",
    }
}

/// The model a workload is looked up by in the paper's tables: its first.
fn model(w: &WorkloadOutcome) -> &str {
    w.jobs.first().map_or("", |j| j.model.as_str())
}

fn cell(p: &PolicyOutcome) -> String {
    match &p.report {
        Some(r) => format!(
            "{:>6.3} {:>6.3} {:>7.4}",
            r.system.msr, r.system.msr_vs_keepall, r.system.eor
        ),
        None => format!("{:>21}", "failed"),
    }
}

fn print_device(d: &DeviceOutcome, iterations: usize) {
    tensile_cli::outln!(
        "\n=== device {}: {} iterations per run, {:.0} s ===",
        d.device,
        iterations,
        d.wall_s
    );
    tensile_cli::outln!(
        "msr: against vanilla that frees at last use; ka: against keep-all (the paper's MSR); eor: time / vanilla - 1 (steady iterations); msr max: the saving at the lower bound"
    );
    let by_exp = |e: Experiment| d.workloads.iter().filter(move |w| w.experiment == e);
    for exp in Experiment::ALL {
        tensile_cli::outln!("\n{}", title(exp));
        tensile_cli::outln!(
            "{:<34} {:<18} {:>6} {:>6} {:>7} {:>8} {:>8}  paper msr/eor",
            "workload",
            "policy",
            "msr",
            "ka",
            "eor",
            "cbr",
            "msr max"
        );
        for w in by_exp(exp) {
            if !w.note.is_empty() {
                tensile_cli::outln!("({}: {})", w.workload, w.note);
            }
            for p in &w.policies {
                let cbr = match &p.report {
                    Some(r) => r
                        .system
                        .cbr
                        .map_or_else(|| "inf".to_string(), |c| format!("{c:.2}")),
                    None => String::new(),
                };
                let paper = match p.policy {
                    RunPolicy::Plain(policy) => paper_figure(exp, model(w), policy),
                    RunPolicy::OursAtBudgetOf(_) => None,
                };
                tensile_cli::outln!(
                    "{:<34} {:<18} {} {:>8} {:>8.3}  {}",
                    w.workload,
                    p.policy.to_string(),
                    cell(p),
                    cbr,
                    w.msr_max,
                    paper.map_or_else(String::new, |(m, e)| format!("{m:.3} {e:.3}"))
                );
                if let Some(e) = &p.error {
                    tensile_cli::outln!("{:<34}   error: {e}", "");
                }
            }
        }
    }
    tensile_cli::outln!(
        "\nTable I: ours, cold start (iteration 1, planned from predicted latencies) vs after updating; capuchin's passive first iteration beside it"
    );
    tensile_cli::outln!(
        "{:<22} {:>14} {:>14} {:>14}  paper cold / update (msr, eor)",
        "workload",
        "ours cold",
        "ours updated",
        "capuchin 1st"
    );
    let pair =
        |x: Option<(f64, f64)>| x.map_or_else(|| "-".into(), |(m, e)| format!("{m:.3} {e:.3}"));
    for w in by_exp(Experiment::Single) {
        let get = |p: Policy| w.policies.iter().find(|o| o.policy == RunPolicy::Plain(p));
        let ours = get(Policy::Tensile);
        let cap = get(Policy::Capuchin);
        let paper = paper_phases(model(w)).map_or_else(String::new, |f| {
            format!("{:.3} {:.3} / {:.3} {:.3}", f[0].0, f[0].1, f[1].0, f[1].1)
        });
        tensile_cli::outln!(
            "{:<22} {:>14} {:>14} {:>14}  {paper}",
            w.workload,
            pair(ours.and_then(|p| p.first_iteration)),
            pair(ours.and_then(|p| p.after_first)),
            pair(cap.and_then(|p| p.first_iteration)),
        );
    }
    tensile_cli::outln!(
        "\nPareto: ours (on its own, or at the baseline's peak: rows tensile@B) has at least the MSR at no more EOR (slack {EPS}) in {} of {} (workload, baseline) pairs; where not (ours at their peak minus theirs):",
        d.dominated,
        d.compared
    );
    for l in &d.losses {
        tensile_cli::outln!(
            "  not dominating {:<18} on {:<34} msr {:+.3}, eor {:+.4}",
            l.baseline.name(),
            l.workload,
            l.d_msr,
            l.d_eor
        );
    }
}

fn plots(d: &DeviceOutcome, policies: &[Policy], dir: &Path) -> Result<()> {
    let write = |name: String, svg: String| -> Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, svg).with_context(|| format!("cannot write {}", path.display()))
    };
    for (exp, name, title) in [
        (Experiment::Single, "single", "one job at batch 16"),
        (Experiment::Copies, "copies", "1-3 copies at batch 2"),
        (Experiment::Batch, "batch", "one job, batch 2-32"),
    ] {
        let ws: Vec<&WorkloadOutcome> =
            d.workloads.iter().filter(|w| w.experiment == exp).collect();
        for (metric, label) in [("msr", "MSR (vs free at last use)"), ("eor", "EOR")] {
            let series = policies
                .iter()
                .map(|&p| {
                    let values = ws
                        .iter()
                        .map(|w| {
                            w.policies
                                .iter()
                                .find(|o| o.policy == RunPolicy::Plain(p))
                                .and_then(|o| o.report.as_ref())
                                .map(|r| {
                                    if metric == "msr" {
                                        r.system.msr
                                    } else {
                                        r.system.eor
                                    }
                                })
                        })
                        .collect();
                    (p.name().to_string(), values)
                })
                .collect();
            let bars = Bars {
                title: format!("{label} on {}: {title}", d.device),
                y_label: label.into(),
                groups: ws.iter().map(|w| w.workload.clone()).collect(),
                series,
            };
            write(
                format!("{}-{name}-{metric}.svg", d.device),
                render_bars(&bars)?,
            )?;
        }
    }
    if let Some(w) = d
        .workloads
        .iter()
        .find(|w| w.experiment == Experiment::Single && model(w) == "resnet50")
    {
        let series = w
            .traces
            .iter()
            .map(|(policy, trace)| Series {
                label: policy.name().to_string(),
                points: trace
                    .iter()
                    .map(|&(t, m)| (t as f64 / 1e9, m as f64))
                    .collect(),
                dashed: *policy == Policy::Vanilla,
            })
            .collect();
        let chart = Chart {
            title: format!(
                "Memory over time on {}: {} under each policy",
                d.device, w.workload
            ),
            series,
        };
        write(
            format!("{}-memory-resnet50.svg", d.device),
            render_svg(&chart)?,
        )?;
    }
    Ok(())
}
