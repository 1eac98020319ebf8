//! What `bench service --gpus` prints: a run's figures as a table, GPU by
//! GPU, and the targets, each met or missed.

use super::*;

fn opt_ms(x: Option<f64>) -> String {
    x.map_or("?".into(), |v| format!("{v:.0}"))
}

fn opt_mb(x: Option<f64>) -> String {
    x.map_or("?".into(), |v| format!("{v:.1} MB"))
}

pub(super) fn print_run(r: &Run) {
    let o = &r.overall;
    tensile_cli::outln!(
        "{} jobs on {} GPUs, arriving at {:.2}/s over {:.1} s; {:.1} s in all; live: mean {:.1}, max {}; {}/{} completed{}; {} re-plans, {} unanswered",
        r.jobs,
        r.gpus,
        r.rate_per_s,
        r.last_arrival_s,
        r.wall_s,
        r.mean_live_jobs,
        o.max_live,
        o.completed,
        r.jobs,
        if o.failed > 0 {
            format!(
                ", {} failed (first: {})",
                o.failed,
                r.errors.first().map_or("", String::as_str)
            )
        } else {
            String::new()
        },
        o.replans,
        o.replans_unanswered
    );
    tensile_cli::outln!(
        "  scheduler RSS: start {}, end {}, peak {} ({} MB per live job at the busiest poll); CPU: scheduler {} s, bench {} s",
        opt_mb(r.scheduler_start_rss_mb),
        opt_mb(r.scheduler_rss_mb),
        opt_mb(r.scheduler_peak_rss_mb),
        r.peak_rss_mb_per_live_job
            .map_or("?".into(), |v| format!("{v:.2}")),
        r.scheduler_cpu_s.map_or("?".into(), |v| format!("{v:.1}")),
        r.bench_cpu_s.map_or("?".into(), |v| format!("{v:.1}")),
    );
    tensile_cli::outln!(
        "  {:>4} {:>5} {:>5} {:>8} {:>7} {:>11} {:>11} {:>11} {:>7} {:>7} {:>7} {:>9} {:>11} {:>9} {:>9} {:>6}",
        "GPU",
        "jobs",
        "live",
        "queued",
        "qwait",
        "first p50",
        "first p99",
        "replan p50",
        "p99",
        "max",
        "unans.",
        "plans/s",
        "planning s",
        "mean ms",
        "cap/whld",
        "over"
    );
    let row = |label: String, f: &Figures| {
        tensile_cli::outln!(
            "  {:>4} {:>5} {:>5} {:>8} {:>7} {:>11.0} {:>11.0} {:>11.0} {:>7.0} {:>7.0} {:>7} {:>9.1} {:>11} {:>9} {:>9} {:>6}",
            label,
            f.jobs,
            f.max_live,
            format!("{}/{}", f.queued, f.max_queue_length),
            format!("{:.0}", f.queue_wait_ms_max),
            f.first_plan_ms_p50,
            f.first_plan_ms_p99,
            f.replan_ms_p50,
            f.replan_ms_p99,
            f.replan_ms_max,
            f.replans_unanswered,
            f.plans_per_s,
            f.planning_s_total.map_or("?".into(), |v| format!("{v:.1}")),
            opt_ms(f.planning_ms_mean),
            format!(
                "{}/{}",
                f.plannings_capped.map_or("?".into(), |v| v.to_string()),
                f.plans_withheld.map_or("?".into(), |v| v.to_string())
            ),
            f.max_published_over_budget_bytes
                .max(f.scheduler_max_over_budget_bytes.unwrap_or(0)),
        );
    };
    for g in &r.per_gpu {
        row(g.gpu.to_string(), &g.figures);
    }
    row("all".into(), o);
    tensile_cli::outln!(
        "  (live: the most at once; queued: by admission at registration / the longest queue; qwait: ms, the longest; first, replan: ms; unans.: re-plans asked for and never answered; cap/whld: joint plans capped at the work bound / plans withheld past the budget; over: bytes the plans in force exceeded the budget by, at most)"
    );
}

/// Each run against the targets: re-plan p99 under 2 s, the
/// scheduler's peak resident memory under 1 GB.
pub(super) fn targets(runs: &[Run]) -> Vec<Target> {
    let mut out = Vec::new();
    for r in runs {
        out.push(Target {
            jobs: r.jobs,
            what: "re-plan p99 (ms)",
            value: Some(r.overall.replan_ms_p99),
            limit: TARGET_REPLAN_P99_MS,
            met: Some(r.overall.replan_ms_p99 < TARGET_REPLAN_P99_MS),
        });
        out.push(Target {
            jobs: r.jobs,
            what: "scheduler peak RSS (MB)",
            value: r.scheduler_peak_rss_mb,
            limit: TARGET_RSS_MB,
            met: r.scheduler_peak_rss_mb.map(|m| m < TARGET_RSS_MB),
        });
    }
    out
}

pub(super) fn print_targets(targets: &[Target]) {
    for t in targets {
        tensile_cli::outln!(
            "target at {} jobs: {} {} < {}: {}",
            t.jobs,
            t.what,
            t.value.map_or("?".into(), |v| format!("{v:.0}")),
            t.limit,
            match t.met {
                Some(true) => "met",
                Some(false) => "MISSED",
                None => "not measured",
            }
        );
    }
}
