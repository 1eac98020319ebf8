//! `tensilectl bench paper`: the TENSILE paper's experiments (section V) for
//! every policy on one or more simulated devices, side by side with vanilla
//! and with the figures the paper reports.
//!
//! Experiments, as the paper ran them (SPEC §9):
//! - Table III: one job at batch 16, each of the five models (and BERT-base);
//! - Fig. 6: 1-3 copies of one model at batch 2, all started together;
//! - Table IV: the five models at batch 2, launched one by one in a random
//!   order (seeded), `MIXED_GAP_NS` apart;
//! - Fig. 7: each model alone at batch 2-32;
//! - Table I: ours in its cold-start iteration (planned from predicted
//!   latencies) against its iterations after updating, with Capuchin's
//!   passive first iteration beside it (the paper's Table II).
//!
//! Every workload runs vanilla once and every policy against it on the same
//! graphs and true latencies. Capuchin's budget is each job's peak under
//! ours, as the paper set it. A policy that fails on a workload is reported
//! with its error, not dropped.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use tensile_baselines::Policy;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Graph, Liveness};
use tensile_latency_model::DeviceProfile;

use crate::args::BenchPaperArgs;
use crate::input;
use crate::plot::{Bars, Chart, Series, render_bars, render_svg};
use crate::sim_cmd::{
    ColdStart, Run, SimOptions, SimReport, capuchin_budgets, device, report, run_policy,
};

const MODELS: [&str; 5] = [
    "vgg16",
    "resnet50",
    "inception_v3",
    "inception_v4",
    "densenet121",
];
const BATCHES: [u64; 5] = [2, 4, 8, 16, 32];
/// Launch interval of the mixed workload's jobs.
const MIXED_GAP_NS: u64 = 10_000_000;
/// Two policies are compared with this slack on MSR and EOR.
const EPS: f64 = 1e-3;

/// The figures the TENSILE paper reports (section V), per model: (MSR, EOR).
struct PaperFigures {
    /// Table III, single workload at batch 16: vDNN, Capuchin, TENSILE.
    single: [(&'static str, [(f64, f64); 3]); 5],
    /// Table I: cold start, update, whole.
    phases: [(&'static str, [(f64, f64); 3]); 5],
    /// Table IV, mixed five: vDNN, Capuchin, TENSILE.
    mixed: [(f64, f64); 3],
}

// DenseNet's update-phase MSR (0.5236) is a measured figure, not π/6.
#[allow(clippy::approx_constant)]
const PAPER: PaperFigures = PaperFigures {
    single: [
        (
            "vgg16",
            [(0.1109, 1.7835), (0.2558, 1.8304), (0.2670, 1.6287)],
        ),
        (
            "inception_v3",
            [(0.1633, 2.5184), (0.4331, 2.7745), (0.4361, 1.6468)],
        ),
        (
            "inception_v4",
            [(0.1903, 2.5028), (0.5129, 3.2362), (0.5154, 1.4281)],
        ),
        (
            "resnet50",
            [(0.1733, 2.2981), (0.3859, 2.2320), (0.4258, 1.5540)],
        ),
        (
            "densenet121",
            [(0.1381, 2.6148), (0.4860, 3.4400), (0.5135, 1.1678)],
        ),
    ],
    phases: [
        (
            "vgg16",
            [(0.2670, 6.0128), (0.3192, 1.2475), (0.2670, 1.6287)],
        ),
        (
            "inception_v3",
            [(0.4361, 3.1128), (0.4788, 1.4839), (0.4361, 1.6468)],
        ),
        (
            "inception_v4",
            [(0.5154, 2.6727), (0.5558, 1.2898), (0.5154, 1.4281)],
        ),
        (
            "resnet50",
            [(0.4258, 3.5395), (0.4647, 1.3813), (0.4258, 1.5540)],
        ),
        (
            "densenet121",
            [(0.5135, 2.2532), (0.5236, 1.0664), (0.5135, 1.1678)],
        ),
    ],
    mixed: [(0.0580, 1.6297), (0.1150, 7.6545), (0.1565, 1.1589)],
};

/// One workload of one experiment.
#[derive(Debug, Clone)]
struct Workload {
    experiment: &'static str,
    name: String,
    /// (model, batch) per job.
    jobs: Vec<(String, u64)>,
    starts: Vec<u64>,
    /// How the workload was run, where that needs saying.
    note: String,
}

fn workloads(seed: u64, quick: bool) -> Vec<Workload> {
    let models: &[&str] = if quick { &MODELS[1..2] } else { &MODELS };
    let one = |experiment, m: &str, b: u64, k: usize| Workload {
        experiment,
        name: if k == 1 {
            format!("{m} b{b}")
        } else {
            format!("{m} x{k} b{b}")
        },
        jobs: vec![(m.to_string(), b); k],
        starts: Vec::new(),
        note: String::new(),
    };
    let mut out = Vec::new();
    for m in models
        .iter()
        .copied()
        .chain((!quick).then_some("bert_base"))
    {
        out.push(one("single", m, 16, 1));
    }
    for &m in models {
        for k in 1..=3 {
            out.push(one("copies", m, 2, k));
        }
    }
    // The paper launched the five one by one in a random order.
    let mut order: Vec<&str> = MODELS.to_vec();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    out.push(Workload {
        experiment: "mixed",
        name: "mixed five b2".into(),
        note: format!(
            "launched {} ms apart in the order {}",
            MIXED_GAP_NS / 1_000_000,
            order.join(", ")
        ),
        jobs: order.iter().map(|m| (m.to_string(), 2)).collect(),
        starts: (0..order.len() as u64).map(|k| k * MIXED_GAP_NS).collect(),
    });
    let batches: &[u64] = if quick { &BATCHES[..2] } else { &BATCHES };
    for &m in models {
        for &b in batches {
            out.push(one("batch", m, b, 1));
        }
    }
    out
}

#[derive(Serialize, Clone)]
struct PolicyOutcome {
    policy: String,
    /// The run's report, or why the policy failed on this workload.
    report: Option<SimReport>,
    error: Option<String>,
    /// The first iteration alone (the cold start) against vanilla's steady
    /// iteration: (MSR, EOR) of the slowest job.
    first_iteration: Option<(f64, f64)>,
    /// The iterations after the first: (MSR, EOR).
    after_first: Option<(f64, f64)>,
}

#[derive(Serialize, Clone)]
struct WorkloadOutcome {
    experiment: String,
    workload: String,
    note: String,
    /// What no plan can go under (system), and the saving there.
    lower_bound_bytes: u64,
    msr_max: f64,
    vanilla_peak_bytes: u64,
    policies: Vec<PolicyOutcome>,
    /// Memory over time of each policy's first job (plots only).
    #[serde(skip)]
    traces: Vec<(String, Vec<(u64, u64)>)>,
}

#[derive(Serialize)]
struct Loss {
    workload: String,
    baseline: String,
    /// Ours minus the baseline.
    d_msr: f64,
    d_eor: f64,
}

#[derive(Serialize)]
struct DeviceOutcome {
    device: String,
    workloads: Vec<WorkloadOutcome>,
    /// (workload, baseline) pairs where ours (on its own, or given the
    /// baseline's peak as its budget) has at least the MSR at no more EOR,
    /// out of all pairs where both ran.
    dominated: usize,
    compared: usize,
    losses: Vec<Loss>,
    wall_s: f64,
}

/// (MSR, EOR) of one iteration range against vanilla's steady iteration,
/// over the jobs: the lowest saving and the highest overhead.
fn phase_metrics(vanilla: &Run, run: &Run, first: bool) -> Option<(f64, f64)> {
    let mut msr = f64::INFINITY;
    let mut eor = f64::NEG_INFINITY;
    for (v, r) in vanilla.result.jobs.iter().zip(&run.result.jobs) {
        let its = if first {
            r.iterations.get(..1)?
        } else {
            r.iterations.get(1..).filter(|i| !i.is_empty())?
        };
        let vits = v.iterations.get(1..).filter(|i| !i.is_empty())?;
        let mean = |x: &[tensile_executor::IterationStats]| -> f64 {
            x.iter()
                .map(|i| (i.end_ns - i.start_ns) as f64)
                .sum::<f64>()
                / x.len() as f64
        };
        let peak = its.iter().map(|i| i.peak_bytes).max()? as f64;
        msr = msr.min(1.0 - peak / v.peak_bytes().max(1) as f64);
        eor = eor.max(mean(its) / mean(vits).max(1.0) - 1.0);
    }
    Some((msr, eor))
}

fn build(
    jobs: &[(String, u64)],
    optimizer: tensile_graph::builder::Optimizer,
) -> Result<Vec<Graph>> {
    jobs.iter()
        .map(|(m, b)| {
            let mut cfg = ZooConfig::new(*b);
            cfg.optimizer = optimizer;
            zoo::build(m, &cfg).with_context(|| format!("{m}:{b}"))
        })
        .collect()
}

/// Runs every policy on one workload.
fn run_workload(
    w: &Workload,
    policies: &[Policy],
    profile: &DeviceProfile,
    base: &SimOptions,
    optimizer: tensile_graph::builder::Optimizer,
    tick: &dyn Fn(&str),
) -> Result<WorkloadOutcome> {
    let graphs = build(&w.jobs, optimizer)?;
    let lives: Vec<Liveness> = graphs.iter().map(Liveness::analyze).collect();
    let opts = SimOptions {
        starts: w.starts.clone(),
        ..base.clone()
    };
    let vanilla = run_policy(&graphs, &lives, Policy::Vanilla, profile, &opts, None)?;
    let mut runs: BTreeMap<Policy, Result<Run, String>> = BTreeMap::new();
    // Ours first: Capuchin's budget is ours' peak.
    let mut order: Vec<Policy> = policies.to_vec();
    order.sort_by_key(|p| *p != Policy::Tensile);
    for &p in &order {
        tick(&format!("{} / {}", w.name, p.name()));
        let budgets = (p == Policy::Capuchin).then(|| {
            let ours = runs.get(&Policy::Tensile).and_then(|r| r.as_ref().ok());
            capuchin_budgets(&opts, &vanilla, ours)
        });
        let r = run_policy(&graphs, &lives, p, profile, &opts, budgets.as_deref())
            .map_err(|e| format!("{e:#}"));
        runs.insert(p, r);
    }
    let v_report = report(
        &graphs,
        &lives,
        profile,
        &opts,
        Policy::Vanilla,
        &vanilla,
        &vanilla,
    );
    let mut out = WorkloadOutcome {
        experiment: w.experiment.to_string(),
        workload: w.name.clone(),
        note: w.note.clone(),
        lower_bound_bytes: v_report.system.lower_bound_bytes,
        msr_max: v_report.system.msr_max,
        vanilla_peak_bytes: v_report.system.peak_vanilla_bytes,
        policies: Vec::new(),
        traces: vec![(
            "vanilla".into(),
            vanilla
                .result
                .jobs
                .first()
                .map(|j| j.trace.clone())
                .unwrap_or_default(),
        )],
    };
    let measure = |p: Policy, run: &Run| report(&graphs, &lives, profile, &opts, p, &vanilla, run);
    for &p in policies {
        let r = &runs[&p];
        if let Ok(run) = r {
            out.traces.push((
                p.name().into(),
                run.result
                    .jobs
                    .first()
                    .map(|j| j.trace.clone())
                    .unwrap_or_default(),
            ));
        }
        out.policies
            .push(outcome(p.name().into(), r, Some(&vanilla), &|run| {
                measure(p, run)
            }));
    }
    // Ours at each baseline's memory: ours gets that baseline's peak as its
    // budget, and the two are compared at the same memory. Where the
    // baseline saves less than ours, ours saves just as much (and stops
    // there); where it saves more, ours is pushed as far.
    if matches!(runs.get(&Policy::Tensile), Some(Ok(_))) {
        let peaks: Vec<(Policy, u64)> = policies
            .iter()
            .zip(&out.policies)
            .filter(|(p, _)| **p != Policy::Tensile)
            .filter_map(|(p, o)| Some((*p, o.report.as_ref()?.system.peak_bytes)))
            .collect();
        for (p, peak) in peaks {
            tick(&format!("{} / tensile at {}'s peak", w.name, p.name()));
            let at = SimOptions {
                budget_bytes: Some(peak),
                stop_at_budget: true,
                ..opts.clone()
            };
            let r = run_policy(&graphs, &lives, Policy::Tensile, profile, &at, None)
                .map_err(|e| format!("{e:#}"));
            out.policies
                .push(outcome(format!("tensile@{}", p.name()), &r, None, &|run| {
                    measure(Policy::Tensile, run)
                }));
        }
    }
    Ok(out)
}

/// What one run of a policy measured on a workload; with `vanilla`, also
/// its first iteration and the later ones apart (Table I).
fn outcome(
    policy: String,
    r: &Result<Run, String>,
    vanilla: Option<&Run>,
    measure: &dyn Fn(&Run) -> SimReport,
) -> PolicyOutcome {
    match r {
        Ok(run) => PolicyOutcome {
            policy,
            report: Some(measure(run)),
            error: None,
            first_iteration: vanilla.and_then(|v| phase_metrics(v, run, true)),
            after_first: vanilla.and_then(|v| phase_metrics(v, run, false)),
        },
        Err(e) => PolicyOutcome {
            policy,
            report: None,
            error: Some(e.clone()),
            first_iteration: None,
            after_first: None,
        },
    }
}

/// Where ours does not Pareto-dominate a baseline: neither ours on its own
/// nor ours at the baseline's peak has at least its MSR at no more EOR.
fn dominance(workloads: &[WorkloadOutcome]) -> (usize, usize, Vec<Loss>) {
    let (mut dominated, mut compared, mut losses) = (0, 0, Vec::new());
    for w in workloads {
        let sys = |p: &PolicyOutcome| p.report.as_ref().map(|r| (r.system.msr, r.system.eor));
        let Some(ours) = w
            .policies
            .iter()
            .find(|p| p.policy == "tensile")
            .and_then(sys)
        else {
            continue;
        };
        for p in &w.policies {
            if p.policy.starts_with("tensile") || p.policy == "vanilla" {
                continue;
            }
            let Some(theirs) = sys(p) else { continue };
            compared += 1;
            let at_budget = w
                .policies
                .iter()
                .find(|o| o.policy == format!("tensile@{}", p.policy))
                .and_then(sys);
            let dominates = |o: (f64, f64)| o.0 >= theirs.0 - EPS && o.1 <= theirs.1 + EPS;
            if dominates(ours) || at_budget.is_some_and(dominates) {
                dominated += 1;
            } else {
                let ours = at_budget.unwrap_or(ours);
                losses.push(Loss {
                    workload: w.workload.clone(),
                    baseline: p.policy.clone(),
                    d_msr: ours.0 - theirs.0,
                    d_eor: ours.1 - theirs.1,
                });
            }
        }
    }
    (dominated, compared, losses)
}

/// A progress bar on a terminal, a line every few percent otherwise.
struct Progress {
    total: usize,
    done: AtomicUsize,
    start: Instant,
    tty: bool,
    last_line: Mutex<usize>,
}

impl Progress {
    fn tick(&self, what: &str) {
        let k = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        let secs = self.start.elapsed().as_secs_f64();
        let width = 30;
        // Runs of ours at a baseline's peak come on top of the planned count.
        let k = k.min(self.total);
        let filled = width * k / self.total.max(1);
        let line = format!(
            "[{}{}] {k}/{} {:>5.0}s {what}",
            "#".repeat(filled),
            ".".repeat(width - filled),
            self.total,
            secs
        );
        if self.tty {
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\r\x1b[2K{}",
                line.chars().take(120).collect::<String>()
            );
            let _ = err.flush();
        } else if let Ok(mut last) = self.last_line.lock() {
            let step = (self.total / 20).max(1);
            if k >= *last + step || k == self.total {
                *last = k;
                eprintln!("{line}");
            }
        }
    }

    fn finish(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

pub(crate) fn paper(a: &BenchPaperArgs) -> Result<()> {
    if a.iterations < 2 || a.iterations > 1000 {
        bail!(
            "--iterations must be in 2..=1000 (the first is the cold start), got {}",
            a.iterations
        );
    }
    let devices: Vec<DeviceProfile> = a
        .device
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(device)
        .collect::<Result<_>>()?;
    if devices.is_empty() {
        bail!("--device is empty");
    }
    let mut policies: Vec<Policy> = a
        .policies
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(Policy::parse)
        .collect::<Result<_, _>>()?;
    policies.retain(|p| *p != Policy::Vanilla);
    if !policies.contains(&Policy::Tensile) {
        policies.insert(0, Policy::Tensile);
    }
    let optimizer = input::optimizer(&a.opt)?;
    let base = SimOptions {
        iterations: a.iterations,
        seed: a.seed,
        exact: false,
        no_sharing: false,
        budget_bytes: None,
        stop_at_budget: false,
        activation_budget: a.activation_budget,
        starts: Vec::new(),
        cold_start: ColdStart::Auto,
    };
    let work = workloads(a.seed, a.quick);
    let progress = Progress {
        // Every policy, and ours again at each baseline's peak.
        total: devices.len() * work.len() * (2 * policies.len() - 1),
        done: AtomicUsize::new(0),
        start: Instant::now(),
        tty: std::io::stderr().is_terminal(),
        last_line: Mutex::new(0),
    };
    eprintln!(
        "bench paper: {} workloads x {} policies on {} ({} simulations of {} iterations, plus vanilla)",
        work.len(),
        policies.len(),
        devices
            .iter()
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        progress.total,
        a.iterations
    );
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(a.jobs.max(1));
    let mut results = Vec::new();
    for profile in &devices {
        let t = Instant::now();
        let next = AtomicUsize::new(0);
        let slots: Mutex<Vec<Option<Result<WorkloadOutcome>>>> =
            Mutex::new((0..work.len()).map(|_| None).collect());
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(w) = work.get(i) else { break };
                        let tick = |what: &str| progress.tick(&format!("{} {what}", profile.name));
                        let r = run_workload(w, &policies, profile, &base, optimizer, &tick);
                        if let Ok(mut slots) = slots.lock() {
                            slots[i] = Some(r);
                        }
                    }
                });
            }
        });
        let slots = slots
            .into_inner()
            .map_err(|_| anyhow::anyhow!("a simulation thread panicked"))?;
        let mut outcomes = Vec::new();
        for (w, r) in work.iter().zip(slots) {
            let r = r.with_context(|| format!("{} was not run", w.name))?;
            outcomes.push(r.with_context(|| format!("{} on {}", w.name, profile.name))?);
        }
        let (dominated, compared, losses) = dominance(&outcomes);
        results.push(DeviceOutcome {
            device: profile.name.clone(),
            workloads: outcomes,
            dominated,
            compared,
            losses,
            wall_s: t.elapsed().as_secs_f64(),
        });
    }
    progress.finish();
    if let Some(dir) = &a.plot {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for d in &results {
            plots(d, &policies, dir)?;
        }
        eprintln!("plots written to {}", dir.display());
    }
    if a.json {
        #[derive(Serialize)]
        struct Out<'a> {
            iterations: usize,
            seed: u64,
            devices: &'a [DeviceOutcome],
        }
        let out = Out {
            iterations: a.iterations,
            seed: a.seed,
            devices: &results,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for d in &results {
            print_device(d, a.iterations);
        }
    }
    Ok(())
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
    println!(
        "\n=== device {}: {} iterations per run, {:.0} s ===",
        d.device, iterations, d.wall_s
    );
    println!(
        "msr: against vanilla that frees at last use; ka: against keep-all (the paper's MSR); eor: time / vanilla - 1 (steady iterations); msr max: the saving at the lower bound"
    );
    let by_exp = |e: &'static str| d.workloads.iter().filter(move |w| w.experiment == e);
    let headers = [
        ("single", "Table III: one job at batch 16"),
        ("copies", "Fig. 6: 1-3 copies of one model at batch 2"),
        (
            "mixed",
            "Table IV: the five models at batch 2, launched one by one",
        ),
        ("batch", "Fig. 7: one job, batch 2-32"),
    ];
    for (exp, title) in headers {
        println!("\n{title}");
        println!(
            "{:<34} {:<18} {:>6} {:>6} {:>7} {:>8} {:>8}  paper msr/eor",
            "workload", "policy", "msr", "ka", "eor", "cbr", "msr max"
        );
        for w in by_exp(exp) {
            if !w.note.is_empty() {
                println!("({}: {})", w.workload, w.note);
            }
            for p in &w.policies {
                let cbr = p
                    .report
                    .as_ref()
                    .and_then(|r| r.system.cbr)
                    .map_or_else(|| "inf".to_string(), |c| format!("{c:.2}"));
                let cbr = if p.report.is_some() {
                    cbr
                } else {
                    String::new()
                };
                println!(
                    "{:<34} {:<18} {} {:>8} {:>8.3}  {}",
                    w.workload,
                    p.policy,
                    cell(p),
                    cbr,
                    w.msr_max,
                    paper_cell(exp, &w.workload, &p.policy)
                );
                if let Some(e) = &p.error {
                    println!("{:<34}   error: {e}", "");
                }
            }
        }
    }
    println!(
        "\nTable I: ours, cold start (iteration 1, planned from predicted latencies) vs after updating; capuchin's passive first iteration beside it"
    );
    println!(
        "{:<22} {:>14} {:>14} {:>14}  paper cold / update (msr, eor)",
        "workload", "ours cold", "ours updated", "capuchin 1st"
    );
    let pair =
        |x: Option<(f64, f64)>| x.map_or_else(|| "-".into(), |(m, e)| format!("{m:.3} {e:.3}"));
    for w in by_exp("single") {
        let get = |name: &str| w.policies.iter().find(|p| p.policy == name);
        let ours = get("tensile");
        let cap = get("capuchin");
        let model = w.workload.split(' ').next().unwrap_or_default();
        let paper = PAPER
            .phases
            .iter()
            .find(|(m, _)| *m == model)
            .map_or_else(String::new, |(_, f)| {
                format!("{:.3} {:.3} / {:.3} {:.3}", f[0].0, f[0].1, f[1].0, f[1].1)
            });
        println!(
            "{:<22} {:>14} {:>14} {:>14}  {paper}",
            w.workload,
            pair(ours.and_then(|p| p.first_iteration)),
            pair(ours.and_then(|p| p.after_first)),
            pair(cap.and_then(|p| p.first_iteration)),
        );
    }
    println!(
        "\nPareto: ours (on its own, or at the baseline's peak: rows tensile@B) has at least the MSR at no more EOR (slack {EPS}) in {} of {} (workload, baseline) pairs; where not (ours at their peak minus theirs):",
        d.dominated, d.compared
    );
    for l in &d.losses {
        println!(
            "  not dominating {:<18} on {:<34} msr {:+.3}, eor {:+.4}",
            l.baseline, l.workload, l.d_msr, l.d_eor
        );
    }
}

/// The paper's (MSR, EOR) for this row, where it reports one.
fn paper_cell(exp: &str, workload: &str, policy: &str) -> String {
    let col = match policy {
        "vdnn-conv" => 0,
        "capuchin" => 1,
        "tensile" => 2,
        _ => return String::new(),
    };
    let f = match exp {
        "single" => {
            let model = workload.split(' ').next().unwrap_or_default();
            PAPER
                .single
                .iter()
                .find(|(m, _)| *m == model)
                .map(|(_, f)| f[col])
        }
        "mixed" => Some(PAPER.mixed[col]),
        _ => None,
    };
    f.map_or_else(String::new, |(m, e)| format!("{m:.3} {e:.3}"))
}

fn plots(d: &DeviceOutcome, policies: &[Policy], dir: &Path) -> Result<()> {
    let write = |name: String, svg: String| -> Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, svg).with_context(|| format!("cannot write {}", path.display()))
    };
    for (exp, title) in [
        ("single", "one job at batch 16"),
        ("copies", "1-3 copies at batch 2"),
        ("batch", "one job, batch 2-32"),
    ] {
        let ws: Vec<&WorkloadOutcome> =
            d.workloads.iter().filter(|w| w.experiment == exp).collect();
        for (metric, label) in [("msr", "MSR (vs free at last use)"), ("eor", "EOR")] {
            let series = policies
                .iter()
                .map(|p| {
                    let values = ws
                        .iter()
                        .map(|w| {
                            w.policies
                                .iter()
                                .find(|o| o.policy == p.name())
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
                format!("{}-{exp}-{metric}.svg", d.device),
                render_bars(&bars),
            )?;
        }
    }
    if let Some(w) = d
        .workloads
        .iter()
        .find(|w| w.experiment == "single" && w.workload.starts_with("resnet50"))
    {
        let series = w
            .traces
            .iter()
            .map(|(name, trace)| Series {
                label: name.clone(),
                points: trace
                    .iter()
                    .map(|&(t, m)| (t as f64 / 1e9, m as f64))
                    .collect(),
                dashed: name == "vanilla",
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
            render_svg(&chart),
        )?;
    }
    Ok(())
}
