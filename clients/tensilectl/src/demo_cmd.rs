//! `tensilectl demo`: the real system on this machine. Starts a
//! `tensile-scheduler` on a socket in a temporary folder with a memory
//! budget that the jobs' vanilla peaks exceed together, launches one
//! `tensile-worker` per job (real kernels on the CPU, the host copy engine
//! at a scaled link bandwidth) and shows a live table from the scheduler's
//! status while they train. Then it runs the same jobs without plans twice:
//! unconstrained, for their figures, and each under the device memory its
//! planned run needed, where vanilla runs out of memory. It prints per job
//! and in total measured peaks and iteration times, and draws measured
//! memory over time. Every process it started is stopped when it ends,
//! also on Ctrl-C.

use std::fmt::Write as _;
use std::fs;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tensile_graph::Liveness;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_proto::pb;

use crate::args::DemoArgs;
use crate::plot::{Chart, Series, render_svg};

const MB: f64 = 1e6;

/// One job of the demo.
#[derive(Debug, Clone)]
struct Job {
    model: String,
    batch: u64,
    resolution: u64,
    /// The vanilla peak the graph predicts (free after last use).
    predicted_vanilla: u64,
    /// Which copy of the same model, batch and resolution this is (0: the
    /// only or the first).
    copy: usize,
}

impl Job {
    fn label(&self) -> String {
        let copy = if self.copy > 0 {
            format!(" #{}", self.copy + 1)
        } else {
            String::new()
        };
        format!("{} b{} r{}{copy}", self.model, self.batch, self.resolution)
    }
}

/// What one worker run measured.
#[derive(Debug, Default, Clone)]
struct Run {
    /// Per iteration: (time ns, measured peak bytes, stall ns).
    iterations: Vec<(u64, u64, u64)>,
    /// The gate of the last gated iteration: (period ns, phase ns), and the
    /// time all iterations waited for their slots.
    gate: Option<(u64, u64)>,
    gate_wait_ns: u64,
    /// When its gated iterations ran: (start of the first, end of the
    /// last), seconds since the pass started.
    gated: Option<(f64, f64)>,
    /// (seconds since the pass started, resident bytes).
    memory: Vec<(f64, f64)>,
    /// Why the worker failed (its last line on stderr), if it did.
    failed: Option<String>,
}

impl Run {
    /// The measured peak of the last iteration: plans change over the
    /// first iterations (cold start, then measured latencies), so the last
    /// is what the job settles at.
    fn peak(&self) -> u64 {
        self.iterations.last().map_or(0, |i| i.1)
    }

    /// The measured peak of any iteration.
    fn max_peak(&self) -> u64 {
        self.iterations.iter().map(|i| i.1).max().unwrap_or(0)
    }

    /// Median iteration time in seconds, the first (warm-up) left out when
    /// there are others.
    fn iteration_s(&self) -> Option<f64> {
        let mut t: Vec<u64> = self.iterations.iter().skip(1).map(|i| i.0).collect();
        if t.is_empty() {
            t = self.iterations.iter().map(|i| i.0).collect();
        }
        t.sort_unstable();
        t.get(t.len() / 2).map(|&ns| ns as f64 * 1e-9)
    }

    fn stall_s(&self) -> f64 {
        self.iterations.iter().map(|i| i.2).sum::<u64>() as f64 * 1e-9
    }
}

/// Children that are killed when this is dropped (an error, Ctrl-C).
struct Processes {
    children: Vec<(String, Child)>,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Processes {
    fn spawn(&mut self, name: &str, cmd: &mut Command) -> Result<usize> {
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
        self.children.push((name.to_string(), child));
        Ok(self.children.len() - 1)
    }
}

pub(crate) fn run(a: &DemoArgs) -> Result<()> {
    let interrupted = Arc::new(AtomicBool::new(false));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    {
        let flag = interrupted.clone();
        runtime.spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                flag.store(true, Ordering::SeqCst);
            }
        });
    }
    let bins = bin_dir(a)?;
    let jobs = jobs(a)?;
    let vanilla_sum: u64 = jobs.iter().map(|j| j.predicted_vanilla).sum();
    let budget = match a.budget_mb {
        Some(mb) => mb.bytes(),
        None => (vanilla_sum as f64 * a.budget_fraction) as u64,
    };
    let dir = std::env::temp_dir().join(format!("tensile-demo-{}", std::process::id()));
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = demo(a, &runtime, &interrupted, &bins, &jobs, budget, &dir);
    if result.is_ok() && !a.keep_logs {
        let _ = fs::remove_dir_all(&dir);
    } else {
        eprintln!("logs of this run are in {}", dir.display());
    }
    result
}

fn demo(
    a: &DemoArgs,
    runtime: &tokio::runtime::Runtime,
    interrupted: &AtomicBool,
    bins: &Path,
    jobs: &[Job],
    budget: u64,
    dir: &Path,
) -> Result<()> {
    let vanilla_sum: u64 = jobs.iter().map(|j| j.predicted_vanilla).sum();
    tensile_cli::outln!(
        "{} jobs share a memory budget of {:.0} MB; their vanilla peaks add up to {:.0} MB (predicted from their graphs).",
        jobs.len(),
        budget as f64 / MB,
        vanilla_sum as f64 / MB,
    );
    tensile_cli::outln!(
        "Workers run real kernels on the CPU; the host copy engine moves real bytes at {} GB/s per direction.\n",
        a.link_gbps
    );

    // 1. The scheduler, planning for a device like this one.
    let profile = dir.join("device.json");
    fs::write(&profile, device_profile(budget, a.link_gbps)?)?;
    let socket = dir.join("scheduler.sock");
    let mut procs = Processes {
        children: Vec::new(),
    };
    let log = fs::File::create(dir.join("scheduler.log"))?;
    let scheduler = procs.spawn(
        "tensile-scheduler",
        Command::new(bins.join("tensile-scheduler"))
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .arg("--device")
            .arg(&profile)
            .arg("--budget-mb")
            // Exact: the scheduler takes decimal MB.
            .arg(format!("{}.{:06}", budget / 1_000_000, budget % 1_000_000))
            .arg("--state")
            .arg(dir.join("state"))
            .arg("--gate-slack")
            .arg(a.gate_slack.to_string())
            .args(if a.no_gates { &["--no-gates"][..] } else { &[] })
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(log),
    )?;
    let started = Instant::now();
    while !socket.exists() {
        if let Some(status) = procs.children[scheduler].1.try_wait()? {
            bail!(
                "tensile-scheduler exited ({status}): {}",
                last_line(&dir.join("scheduler.log"))
            );
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("tensile-scheduler did not listen within 30 s");
        }
        check(interrupted)?;
        std::thread::sleep(Duration::from_millis(50));
    }
    let server = format!("unix:{}", socket.display());
    tensile_cli::outln!("scheduler listening on {server}");

    // 2. The planned pass, with a live table.
    let (planned, planned_wall) = pass(
        a,
        interrupted,
        bins,
        jobs,
        dir,
        "planned",
        &|_| {
            // One ledger for all the jobs: each worker's guard holds the
            // budget less what the others hold now.
            vec![
                "--scheduler".into(),
                server.clone(),
                "--ledger".into(),
                dir.join("ledger").display().to_string(),
                "--memory-mb".into(),
                (budget / 1_000_000).max(1).to_string(),
            ]
        },
        Some((runtime, server.as_str())),
    )?;

    // 3. The same jobs without plans: unconstrained, then each under the
    // memory its planned run needed.
    tensile_cli::outln!(
        "\nthe same jobs without plans (vanilla: free after last use), unconstrained:"
    );
    let (vanilla, _) = pass(
        a,
        interrupted,
        bins,
        jobs,
        dir,
        "vanilla",
        &|_| vec!["--vanilla".into()],
        None,
    )?;
    tensile_cli::outln!(
        "\nvanilla again, each job under the most device memory its planned run used:"
    );
    let caps: Vec<u64> = planned
        .iter()
        .map(|r| r.max_peak().div_ceil(1_000_000).max(1))
        .collect();
    let (capped, _) = pass(
        &DemoArgs {
            iterations: 1,
            ..a.clone()
        },
        interrupted,
        bins,
        jobs,
        dir,
        "capped",
        &|i| {
            vec![
                "--vanilla".into(),
                "--memory-mb".into(),
                caps[i].to_string(),
            ]
        },
        None,
    )?;
    stop_scheduler(&mut procs, scheduler);

    // 4. What a user without the scheduler would do to stay in the budget:
    // run the jobs one after another, each alone, without plans.
    tensile_cli::outln!(
        "\nthe user's alternative: the same jobs one after another, each alone, no plans:"
    );
    let mut one_by_one = 0.0;
    for (i, j) in jobs.iter().enumerate() {
        let (_, wall) = pass(
            a,
            interrupted,
            bins,
            std::slice::from_ref(j),
            dir,
            &format!("alone{i}"),
            &|_| vec!["--vanilla".into()],
            None,
        )?;
        one_by_one += wall;
    }

    // 5. Figures and the plot.
    // Through `try_out`: a closed stdout comes back as an error, so that
    // the children are stopped (dropped) before the process ends.
    tensile_cli::try_out(&summary(jobs, budget, &planned, &vanilla, &capped, &caps))?;
    tensile_cli::try_out(&together(jobs, budget, &planned, planned_wall, one_by_one))?;
    let chart = Chart {
        title: format!(
            "Measured device memory: {} jobs, budget {:.0} MB (solid: planned, dashed: vanilla)",
            jobs.len(),
            budget as f64 / MB
        ),
        series: series(jobs, budget, &planned, &vanilla),
    };
    if let Some(parent) = a.plot.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::write(&a.plot, render_svg(&chart)?)
        .with_context(|| format!("writing {}", a.plot.display()))?;
    tensile_cli::outln!("\nmemory over time: {}", a.plot.display());
    let failed: Vec<String> = planned
        .iter()
        .zip(jobs)
        .filter_map(|(r, j)| r.failed.as_ref().map(|f| format!("{}: {f}", j.label())))
        .collect();
    if !failed.is_empty() {
        bail!("planned jobs failed: {}", failed.join("; "));
    }
    Ok(())
}

/// Runs one worker per job at once and waits for all of them.
#[allow(clippy::too_many_arguments)]
fn pass(
    a: &DemoArgs,
    interrupted: &AtomicBool,
    bins: &Path,
    jobs: &[Job],
    dir: &Path,
    tag: &str,
    extra: &dyn Fn(usize) -> Vec<String>,
    status: Option<(&tokio::runtime::Runtime, &str)>,
) -> Result<(Vec<Run>, f64)> {
    let mut procs = Processes {
        children: Vec::new(),
    };
    let start_unix = unix_now();
    let start_mono = tensile_proto::clock::monotonic_ns();
    let started = Instant::now();
    for (i, j) in jobs.iter().enumerate() {
        let base = dir.join(format!("{tag}-{i}"));
        let mut cmd = Command::new(bins.join("tensile-worker"));
        cmd.args(["--model", &j.model])
            .args(["--batch", &j.batch.to_string()])
            .args(["--resolution", &j.resolution.to_string()])
            .args(["--iterations", &a.iterations.to_string()])
            .args(["--link-gbps", &a.link_gbps.to_string()])
            .args(["--threads", &a.threads.to_string()])
            .args(["--seed", &i.to_string()])
            .args(["--name", &j.label()])
            .arg("--json")
            .arg("--memory-trace")
            .arg(base.with_extension("mem"))
            .args(extra(i))
            .env("RUST_BACKTRACE", "0")
            .stdout(fs::File::create(base.with_extension("jsonl"))?)
            .stderr(fs::File::create(base.with_extension("log"))?);
        procs.spawn(&j.label(), &mut cmd)?;
    }
    let tty = std::io::stdout().is_terminal();
    let mut shown_lines = 0;
    let mut last_shown = Instant::now() - Duration::from_secs(60);
    let mut done = vec![None; jobs.len()];
    // When each worker was seen to have exited, seconds since the start.
    let mut ended = vec![0.0; jobs.len()];
    loop {
        for (i, (_, c)) in procs.children.iter_mut().enumerate() {
            if done[i].is_none() {
                done[i] = c.try_wait()?;
                ended[i] = started.elapsed().as_secs_f64();
            }
        }
        let all_done = done.iter().all(Option::is_some);
        let every = if tty { 1 } else { 5 };
        if all_done || last_shown.elapsed() >= Duration::from_secs(every) {
            // The table needs only the iterations; the memory traces, which
            // grow with every allocation, are read once at the end.
            let runs: Vec<Run> = (0..jobs.len())
                .map(|i| Run {
                    iterations: read_iterations(dir, tag, i, start_mono).iterations,
                    ..Run::default()
                })
                .collect();
            let text = live_table(jobs, &runs, &done, started.elapsed(), status);
            if tty && shown_lines > 0 {
                tensile_cli::try_out(&format!("\x1b[{shown_lines}A\x1b[J"))?;
            }
            tensile_cli::try_out(&text)?;
            shown_lines = text.lines().count();
            last_shown = Instant::now();
        }
        if all_done {
            break;
        }
        check(interrupted)?;
        std::thread::sleep(Duration::from_millis(200));
    }
    let runs = (0..jobs.len())
        .map(|i| {
            let read = read_iterations(dir, tag, i, start_mono);
            let mut r = Run {
                iterations: read.iterations,
                gate: read.gate,
                gate_wait_ns: read.gate_wait_ns,
                gated: read.gated,
                memory: read_memory(dir, tag, i, start_unix, ended[i]),
                failed: None,
            };
            if done[i].is_some_and(|s| !s.success()) {
                r.failed = Some(error_of(&dir.join(format!("{tag}-{i}.log"))));
            }
            r
        })
        .collect();
    Ok((runs, started.elapsed().as_secs_f64()))
}

/// The table shown while a pass runs: each job's own figures, and the
/// scheduler's view of it when there is one.
fn live_table(
    jobs: &[Job],
    runs: &[Run],
    done: &[Option<std::process::ExitStatus>],
    elapsed: Duration,
    status: Option<(&tokio::runtime::Runtime, &str)>,
) -> String {
    let sched = status.and_then(|(rt, server)| rt.block_on(get_status(server)).ok());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<22} {:>9} {:>5} {:>10} {:>10} {:>11} {:>9}   [{:.0} s]",
        "job",
        "state",
        "plan",
        "iteration",
        "peak MB",
        "planned MB",
        "stalls s",
        elapsed.as_secs_f64()
    );
    for (i, j) in jobs.iter().enumerate() {
        let r = &runs[i];
        let label = j.label();
        let s = sched
            .as_ref()
            .and_then(|s| s.jobs.iter().find(|x| x.name == label));
        let state = match (done[i], s) {
            (Some(e), _) if e.success() => "done".to_string(),
            (Some(_), _) => "failed".to_string(),
            (None, Some(s)) => pb::JobState::try_from(s.state)
                .map(|k| {
                    k.as_str_name()
                        .trim_start_matches("JOB_STATE_")
                        .to_lowercase()
                })
                .unwrap_or_default(),
            (None, None) => "running".to_string(),
        };
        let plan = s.map_or("-".to_string(), |s| s.plan_version.to_string());
        let planned = s
            .and_then(|s| s.prediction.as_ref())
            .map_or("-".to_string(), |p| {
                format!("{:.0}", p.planned_peak_bytes as f64 / MB)
            });
        let _ = writeln!(
            out,
            "{:<22} {:>9} {:>5} {:>10} {:>10.0} {:>11} {:>9.2}",
            label,
            state,
            plan,
            r.iterations.len(),
            r.peak() as f64 / MB,
            planned,
            r.stall_s()
        );
    }
    if let Some(m) = sched.as_ref().and_then(|s| s.memory.as_ref()) {
        let _ = writeln!(
            out,
            "scheduler: budget {:.0} MB, planned peaks add up to {:.0} MB (vanilla {:.0} MB)",
            m.budget_bytes as f64 / MB,
            m.sum_of_peaks_bytes as f64 / MB,
            m.vanilla_sum_of_peaks_bytes as f64 / MB
        );
    }
    out
}

async fn get_status(server: &str) -> Result<pb::GetStatusResponse> {
    // The demo's own scheduler, on a Unix socket: no TLS.
    let mut client = crate::server_cmd::connect(Some(server), None).await?;
    Ok(client
        .get_status(pb::GetStatusRequest { job_id: 0 })
        .await?
        .into_inner())
}

fn summary(
    jobs: &[Job],
    budget: u64,
    planned: &[Run],
    vanilla: &[Run],
    capped: &[Run],
    caps: &[u64],
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nmeasured peaks of the last iteration, median iteration times:\n{:<22} {:>12} {:>12} {:>12} {:>12} {:>10}",
        "job", "vanilla MB", "planned MB", "vanilla s/it", "planned s/it", "stalls s"
    );
    let secs = |r: &Run| r.iteration_s().map_or("-".into(), |s| format!("{s:.3}"));
    for (i, j) in jobs.iter().enumerate() {
        let _ = writeln!(
            out,
            "{:<22} {:>12.0} {:>12.0} {:>12} {:>12} {:>10.2}",
            j.label(),
            vanilla[i].peak() as f64 / MB,
            planned[i].peak() as f64 / MB,
            secs(&vanilla[i]),
            secs(&planned[i]),
            planned[i].stall_s()
        );
    }
    let v: u64 = vanilla.iter().map(Run::peak).sum();
    let p: u64 = planned.iter().map(Run::peak).sum();
    let _ = writeln!(
        out,
        "{:<22} {:>12.0} {:>12.0}   (budget {:.0} MB: vanilla {} it)",
        "total (sum of peaks)",
        v as f64 / MB,
        p as f64 / MB,
        budget as f64 / MB,
        if v > budget { "exceeds" } else { "fits" },
    );
    // What counts is the jobs' memory added up at each moment, over the
    // whole planned pass (the first iterations too).
    let held = total(planned).iter().map(|t| t.1).fold(0.0, f64::max);
    let _ = writeln!(
        out,
        "planned, the jobs together held at most {:.0} MB at any moment (measured): {}",
        held / MB,
        if held <= budget as f64 {
            "within the budget"
        } else {
            "OVER the budget"
        }
    );
    let _ = writeln!(
        out,
        "\nvanilla under the memory each planned run used at most:"
    );
    for (i, j) in jobs.iter().enumerate() {
        let what = match &capped[i].failed {
            Some(why) => why.clone(),
            None => "ran (its peak fits that much memory too)".into(),
        };
        let _ = writeln!(out, "  {} with {} MB: {what}", j.label(), caps[i]);
    }
    out
}

/// What the gates did and what running together saved: the measured peak
/// of the jobs' memory added up against the sum of their peaks (what it
/// would be had their peaks met), and the wall time against one after
/// another.
fn together(jobs: &[Job], budget: u64, planned: &[Run], wall: f64, one_by_one: f64) -> String {
    let mut out = String::new();
    let gated: Vec<(String, (u64, u64))> = jobs
        .iter()
        .zip(planned)
        .filter_map(|(j, r)| Some((j.label(), r.gate?)))
        .collect();
    // While every job ran gated, or else after the first iteration of every
    // job (the plans taking hold).
    let all_gated = planned
        .iter()
        .map(|r| r.gated)
        .collect::<Option<Vec<_>>>()
        .map(|w| {
            let from = w.iter().map(|g| g.0).fold(0.0, f64::max);
            let to = w.iter().map(|g| g.1).fold(f64::INFINITY, f64::min);
            (from, to)
        })
        .filter(|(from, to)| from < to);
    let after_first = planned
        .iter()
        .filter_map(|r| {
            let first = r.iterations.first()?.0 as f64 * 1e-9;
            r.memory.first().map(|m| m.0 + first)
        })
        .fold(0.0, f64::max);
    let (from, to) = all_gated.unwrap_or((after_first, f64::INFINITY));
    let window: Vec<Run> = planned
        .iter()
        .map(|r| Run {
            memory: clip(&r.memory, from, to),
            ..Run::default()
        })
        .collect();
    let at_once = total(&window).iter().map(|p| p.1).fold(0.0, f64::max);
    let peaks: f64 = window
        .iter()
        .map(|r| r.memory.iter().map(|m| m.1).fold(0.0, f64::max))
        .sum();
    let _ = writeln!(out);
    if gated.is_empty() {
        let _ = writeln!(
            out,
            "no gates: the scheduler planned the jobs free-running (their plans fit the budget without them, or their iterations differ by more than 15%)"
        );
    } else {
        let period = gated[0].1.0;
        let phases: Vec<String> = gated
            .iter()
            .map(|(l, (_, p))| format!("{l} at {:.0} ms", *p as f64 * 1e-6))
            .collect();
        let waits: f64 = planned.iter().map(|r| r.gate_wait_ns as f64 * 1e-9).sum();
        let _ = writeln!(
            out,
            "gates: a period of {:.0} ms, {}; {:.2} s waited at gates in all",
            period as f64 * 1e-6,
            phases.join(", "),
            waits
        );
    }
    let when = match all_gated {
        Some((from, to)) => format!("from {from:.1} s to {to:.1} s, while all ran gated,"),
        None if gated.is_empty() => "after their first iterations".to_string(),
        None => "after their first iterations (never all gated at once)".to_string(),
    };
    let _ = writeln!(
        out,
        "{when} the jobs together peaked at {:.0} MB (measured, all at once); their own peaks add up to {:.0} MB: {:.0} MB saved by their peaks not coinciding (budget {:.0} MB)",
        at_once / MB,
        peaks / MB,
        (peaks - at_once).max(0.0) / MB,
        budget as f64 / MB
    );
    let change = wall / one_by_one.max(1e-9) - 1.0;
    let _ = writeln!(
        out,
        "wall time: {wall:.1} s together under the budget, {one_by_one:.1} s one after another without plans (together {:.0}% {})",
        change.abs() * 100.0,
        if change > 0.0 { "slower" } else { "faster" }
    );
    out
}

/// A memory trace between two times: the value in force at `from`, then
/// the samples up to `to`.
fn clip(memory: &[(f64, f64)], from: f64, to: f64) -> Vec<(f64, f64)> {
    let before = memory
        .iter()
        .rev()
        .find(|m| m.0 < from)
        .map(|m| (from, m.1));
    before
        .into_iter()
        .chain(memory.iter().copied().filter(|m| m.0 >= from && m.0 <= to))
        .collect()
}

fn series(jobs: &[Job], budget: u64, planned: &[Run], vanilla: &[Run]) -> Vec<Series> {
    let end = planned
        .iter()
        .chain(vanilla)
        .filter_map(|r| r.memory.last().map(|p| p.0))
        .fold(0.0, f64::max);
    let mut out = vec![Series {
        label: "budget".into(),
        points: vec![(0.0, budget as f64), (end, budget as f64)],
        dashed: true,
    }];
    for (runs, dashed, tag) in [(planned, false, "planned"), (vanilla, true, "vanilla")] {
        for (j, r) in jobs.iter().zip(runs) {
            out.push(Series {
                label: format!("{} ({tag})", j.label()),
                points: r.memory.clone(),
                dashed,
            });
        }
        out.push(Series {
            label: format!("total ({tag})"),
            points: total(runs),
            dashed,
        });
    }
    out
}

/// The sum of the jobs' resident bytes over time.
fn total(runs: &[Run]) -> Vec<(f64, f64)> {
    let bytes: Vec<Vec<(f64, u64)>> = runs
        .iter()
        .map(|r| r.memory.iter().map(|&(t, b)| (t, b as u64)).collect())
        .collect();
    let bytes: Vec<&[(f64, u64)]> = bytes.iter().map(Vec::as_slice).collect();
    tensile_executor::trace::summed(&bytes)
        .into_iter()
        .map(|(t, b)| (t, b as f64))
        .collect()
}

/// What a worker's per-iteration JSON lines say so far.
#[derive(Debug, Default)]
struct Iterations {
    /// (time ns, measured peak bytes, stall ns) per iteration.
    iterations: Vec<(u64, u64, u64)>,
    /// The gate of the last gated iteration: (period ns, phase ns).
    gate: Option<(u64, u64)>,
    /// The time all iterations waited for their gates.
    gate_wait_ns: u64,
    /// When the gated iterations ran, seconds since `start_mono` (the
    /// host's monotonic clock, which the workers' `start_monotonic_ns`
    /// reads too).
    gated: Option<(f64, f64)>,
}

fn read_iterations(dir: &Path, tag: &str, i: usize, start_mono: u64) -> Iterations {
    let text = fs::read_to_string(dir.join(format!("{tag}-{i}.jsonl"))).unwrap_or_default();
    let mut out = Iterations::default();
    let since = |ns: u64| ns.saturating_sub(start_mono) as f64 * 1e-9;
    for v in text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
    {
        let get = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
        out.iterations
            .push((get("time_ns"), get("measured_peak_bytes"), get("stall_ns")));
        let period = get("gate_period_ns");
        out.gate_wait_ns += get("gate_wait_ns");
        if period > 0 {
            out.gate = Some((period, get("gate_phase_ns")));
            // start_monotonic_ns is when the iteration began, past its gate.
            let start = get("start_monotonic_ns");
            let end = since(start + get("time_ns"));
            let first = out.gated.map_or(since(start), |g| g.0);
            out.gated = Some((first, end));
        }
    }
    out
}

/// A worker's `--memory-trace` as (seconds since the pass started, bytes),
/// read once it has exited (at `ended` or before). A worker that finished
/// wrote when its memory went (0 bytes); one that failed did not, and
/// counts what it held last until it was seen to exit.
fn read_memory(dir: &Path, tag: &str, i: usize, start_unix: f64, ended: f64) -> Vec<(f64, f64)> {
    let text = fs::read_to_string(dir.join(format!("{tag}-{i}.mem"))).unwrap_or_default();
    let mut out: Vec<(f64, f64)> = tensile_executor::trace::parse_csv(&text)
        .into_iter()
        .map(|(t, b)| (t - start_unix, b as f64))
        .collect();
    if let Some(&(t, b)) = out.last()
        && b > 0.0
    {
        out.push((t.max(ended), 0.0));
    }
    out
}

/// A failed worker's error, as one line: `Error: ...` and its causes.
fn error_of(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    match text.find("Error: ") {
        Some(at) => text[at + "Error: ".len()..]
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && *l != "Caused by:")
            .map(|l| {
                l.trim_start_matches(|c: char| c.is_ascii_digit() || c == ':')
                    .trim()
            })
            .collect::<Vec<_>>()
            .join(": "),
        None => last_line(path),
    }
}

fn last_line(path: &Path) -> String {
    fs::read_to_string(path)
        .ok()
        .and_then(|t| {
            t.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| format!("no output ({})", path.display()))
}

fn check(interrupted: &AtomicBool) -> Result<()> {
    if interrupted.load(Ordering::SeqCst) {
        bail!("interrupted: every process this demo started was stopped");
    }
    Ok(())
}

/// SIGTERM (a graceful stop that flushes its store), then SIGKILL after 10 s.
fn stop_scheduler(procs: &mut Processes, index: usize) {
    let child = &mut procs.children[index].1;
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Where `tensile-scheduler` and `tensile-worker` are: `--bin-dir`, else
/// beside this executable (cargo puts all three in one folder).
fn bin_dir(a: &DemoArgs) -> Result<PathBuf> {
    let dir = match &a.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("this executable has no folder")?
            .to_path_buf(),
    };
    for bin in ["tensile-scheduler", "tensile-worker"] {
        if !dir.join(bin).exists() {
            bail!(
                "{} not found in {} (build it: cargo build --release -p {}; or give --bin-dir)",
                bin,
                dir.display(),
                bin
            );
        }
    }
    Ok(dir)
}

fn jobs(a: &DemoArgs) -> Result<Vec<Job>> {
    let mut jobs: Vec<Job> = a
        .jobs
        .iter()
        .map(|spec| {
            let parts: Vec<&str> = spec.split(':').collect();
            let [model, batch, resolution] = parts[..] else {
                bail!("--jobs: {spec:?} is not MODEL:BATCH:RESOLUTION");
            };
            let batch: u64 = batch
                .parse()
                .with_context(|| format!("--jobs {spec:?}: batch {batch:?} is not a number"))?;
            let resolution: u64 = resolution.parse().with_context(|| {
                format!("--jobs {spec:?}: resolution {resolution:?} is not a number")
            })?;
            let config = ZooConfig {
                resolution: Some(resolution),
                ..ZooConfig::new(batch)
            };
            let g = zoo::build(model, &config).with_context(|| format!("--jobs {spec:?}"))?;
            let predicted_vanilla = Liveness::analyze(&g).vanilla_footprint().peak;
            Ok(Job {
                model: model.to_string(),
                batch,
                resolution,
                predicted_vanilla,
                copy: 0,
            })
        })
        .collect::<Result<_>>()?;
    for i in 0..jobs.len() {
        jobs[i].copy = jobs[..i]
            .iter()
            .filter(|j| {
                (&j.model, j.batch, j.resolution)
                    == (&jobs[i].model, jobs[i].batch, jobs[i].resolution)
            })
            .count();
    }
    Ok(jobs)
}

/// The device the scheduler plans for: this CPU's calibrated roofline (the
/// shipped `cpu` profile) with the budget as its memory, no fixed context
/// memory, and the workers' scaled link.
fn device_profile(budget: u64, link_gbps: f64) -> Result<String> {
    let cpu = tensile_latency_model::manifest::shipped_cpu_models().join("roofline.json");
    let text = fs::read_to_string(&cpu).with_context(|| format!("reading {}", cpu.display()))?;
    let mut v: serde_json::Value = serde_json::from_str(&text)?;
    let o = v
        .as_object_mut()
        .context("the cpu profile is not a JSON object")?;
    o.insert("name".into(), "cpu-demo".into());
    o.insert("memory_bytes".into(), budget.into());
    o.insert("h2d_bytes_per_s".into(), (link_gbps * 1e9).into());
    o.insert("d2h_bytes_per_s".into(), (link_gbps * 1e9).into());
    o.insert("base_bytes".into(), 0.into());
    Ok(serde_json::to_string_pretty(&v)?)
}
