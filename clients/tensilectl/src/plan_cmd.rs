//! `tensilectl plan`: plan one job, print what the plan predicts, and
//! write the plan itself as a `tensile-plan/v1` file when asked.

use anyhow::{Context, Result};
use tensile_plan_job::{PlanReport, plan_job};
use tensile_proto::plan_json::plan_to_json;

use crate::config::PlanCommand;
use tensile_cli::format_mb;

pub(crate) fn run(c: &PlanCommand) -> Result<()> {
    let outcome = plan_job(&c.graph, &c.profile, &c.options)?;
    for w in &outcome.warnings {
        eprintln!("note: {w}");
    }
    if let Some(path) = &c.output {
        let mp = &outcome.plan;
        let text = plan_to_json(&mp.plans[0], &mp.diagnostics, &c.graph) + "\n";
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("plan written to {}", path.display());
    }
    let r = PlanReport::new(c.model.clone(), c.batch, &c.profile, &outcome);
    if c.json {
        tensile_cli::outln!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print_text(&r);
    }
    Ok(())
}

fn print_text(r: &PlanReport) {
    match r.batch {
        Some(b) => tensile_cli::outln!("{} batch {b} on {}", r.model, r.device),
        None => tensile_cli::outln!("{} on {}", r.model, r.device),
    }
    tensile_cli::outln!(
        "  peak      vanilla {}  planned {}  (msr {:.3}; lower bound {})",
        format_mb(r.vanilla_peak_bytes),
        format_mb(r.planned_peak_bytes),
        r.msr,
        format_mb(r.lower_bound_bytes)
    );
    tensile_cli::outln!(
        "  time      vanilla {:.2} ms  planned {:.2} ms",
        r.vanilla_time_s * 1e3,
        r.planned_time_s * 1e3
    );
    tensile_cli::outln!(
        "  events    {} swap-outs, {} swap-ins, {} releases, {} recomputed ops; {} swapped",
        r.swap_outs,
        r.swap_ins,
        r.releases,
        r.recomputed_ops,
        format_mb(r.swapped_bytes)
    );
    tensile_cli::outln!("  planned in {:.2} ms", r.plan_ms);
    for d in &r.diagnostics {
        tensile_cli::outln!("  note: {d}");
    }
}
