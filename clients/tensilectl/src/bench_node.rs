//! `tensilectl bench service --gpus N`: a simulated node. One scheduler
//! serves N simulated GPUs (`tensile-scheduler --gpus 0,...,N-1`, a
//! planning domain and a socket each, found through gpus.json); jobs
//! arrive over time (a seeded Poisson process), each placed on a GPU
//! (least loaded, or each in turn), each waiting for its first plan,
//! reporting its iterations (latencies alternating between the roofline
//! and twice it, so that every report asks for a re-plan, which the job
//! does not wait for: a worker keeps running the plan it has), waiting for
//! the re-plans it asked for, then unregistering and closing its
//! connection, so that at any moment a fraction of them are live. While
//! they run the bench polls every GPU's status (the plans in force against
//! the budget, the admission queue) and the scheduler's resident memory;
//! at the end it reads the scheduler's metrics, GPU by GPU. Figures per
//! GPU and overall.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use tensile_latency_model::DeviceProfile;
use tensile_proto::endpoint::GpusFile;
use tensile_proto::pb;
use tokio::sync::watch;

use crate::args::{BenchServiceArgs, Placement};
use crate::bench_service::{
    Waits, free_port, job_mix, metrics_page, percentile, rss_mb, scheduler_bin,
};
use crate::progress::Progress;
use crate::server_cmd::{Client, block_on, connect};

/// The most jobs of one run.
pub(crate) const MAX_JOBS: usize = 1024;
/// The most GPUs of the simulated node.
pub(crate) const MAX_GPUS: usize = 64;
/// The targets at 1,024 jobs on 8 GPUs.
mod report;
use report::{print_run, print_targets, targets};

const TARGET_REPLAN_P99_MS: f64 = 2000.0;
const TARGET_RSS_MB: f64 = 1000.0;
/// How often the bench polls the GPUs' status and the scheduler's memory.
const POLL: Duration = Duration::from_millis(100);
/// How long a job waits for its first plan (queued ones included), and
/// for the re-plans it asked for after its last iteration (those that do
/// not come by then are counted unanswered: a joint plan may withhold a
/// job's new plan, which then keeps the one in force).
const FIRST_PLAN_WAIT: Duration = Duration::from_secs(600);
const REPLAN_WAIT: Duration = Duration::from_secs(30);

/// The figures of a set of jobs: one GPU's, or all of them.
#[derive(Debug, Clone, Serialize)]
struct Figures {
    jobs: usize,
    /// Jobs that got their first plan, ran every iteration and
    /// unregistered.
    completed: usize,
    /// Jobs that ended on an error (`errors` in the run says the first).
    failed: usize,
    /// The most jobs of this bench on it at once (from placement to
    /// leaving, queued ones included).
    max_live: usize,
    /// Jobs admission queued at registration, and their longest and
    /// median wait for their first plan (ms).
    queued: usize,
    queue_wait_ms_max: f64,
    queue_wait_ms_p50: f64,
    /// The longest admission queue a status poll saw (all of it, per GPU;
    /// overall, the largest sum over the GPUs at one poll).
    max_queue_length: usize,
    /// Register to first plan of the jobs admitted at once.
    first_plan_ms_p50: f64,
    first_plan_ms_p99: f64,
    /// Report to the plan version it asked for.
    replan_ms_p50: f64,
    replan_ms_p99: f64,
    replan_ms_max: f64,
    /// Re-plans answered (a newer plan version came), and those asked for
    /// (the report said `replanned`) that no version answered before the
    /// job left, 30 s after its last iteration; the percentiles are of the
    /// answered ones.
    replans: usize,
    replans_unanswered: usize,
    plans_received: usize,
    plans_per_s: f64,
    /// Plan versions received per iteration reported.
    plan_versions_per_job_iteration: f64,
    /// The largest amount (bytes) by which the plans in force exceeded the
    /// budget at a status poll (0: never; overall, the largest of any
    /// GPU).
    max_published_over_budget_bytes: u64,
    /// The scheduler's own count of it, at every publication (overall,
    /// the largest of any GPU).
    scheduler_max_over_budget_bytes: Option<u64>,
    /// The scheduler's planning time (seconds, all its joint plans) and
    /// their number, the mean, and the share of the run's wall time it
    /// took (overall: the sum over the GPUs, so up to N).
    planning_s_total: Option<f64>,
    plannings: Option<u64>,
    planning_ms_mean: Option<f64>,
    planning_share_of_wall: Option<f64>,
    /// Joint plans stopped at the scheduler's work bound.
    plannings_capped: Option<u64>,
    /// Plans of joint plans the scheduler did not publish because they
    /// would take the plans in force past the budget (their jobs keep the
    /// plans in force; a report that asked for that re-plan goes
    /// unanswered).
    plans_withheld: Option<u64>,
}

/// One GPU's row.
#[derive(Debug, Clone, Serialize)]
struct GpuRow {
    gpu: u32,
    #[serde(flatten)]
    figures: Figures,
    /// Waits of the handlers, the planning task and the reaper for one
    /// job's entry in this GPU's job table, and of walks of the table.
    table_wait_job: Option<Waits>,
    table_wait_walk: Option<Waits>,
}

/// One run: `jobs` jobs on the node.
#[derive(Debug, Clone, Serialize)]
struct Run {
    jobs: usize,
    gpus: usize,
    /// The arrivals' mean rate, jobs per second.
    rate_per_s: f64,
    /// The last job's arrival, seconds after the first poll.
    last_arrival_s: f64,
    wall_s: f64,
    /// Jobs live (placed, not yet gone) over the status polls.
    mean_live_jobs: f64,
    #[serde(flatten)]
    overall: Figures,
    /// The scheduler's resident memory (VmRSS) before the first job, at
    /// the end, its largest at a poll, and its peak (VmHWM), MB; the
    /// peak's growth over the start per job live at the busiest poll.
    scheduler_start_rss_mb: Option<f64>,
    scheduler_rss_mb: Option<f64>,
    scheduler_max_polled_rss_mb: Option<f64>,
    scheduler_peak_rss_mb: Option<f64>,
    peak_rss_mb_per_live_job: Option<f64>,
    /// CPU time (user + system) of the scheduler and of this bench (its
    /// simulated jobs), seconds.
    scheduler_cpu_s: Option<f64>,
    bench_cpu_s: Option<f64>,
    status_polls: usize,
    per_gpu: Vec<GpuRow>,
    /// The first errors of failed jobs.
    errors: Vec<String>,
}

/// The whole bench, as `--json` prints it.
#[derive(Debug, Serialize)]
struct Report {
    gpus: usize,
    iterations: usize,
    iteration_ms: u64,
    seed: u64,
    placement: Placement,
    models: String,
    budget_bytes: Option<u64>,
    runs: Vec<Run>,
    targets: Vec<Target>,
}

/// A run against one of the targets.
#[derive(Debug, Serialize)]
struct Target {
    jobs: usize,
    what: &'static str,
    value: Option<f64>,
    limit: f64,
    met: Option<bool>,
}

/// The kinds of job the runs cycle through.
#[derive(Debug)]
struct Kind {
    name: String,
    graph: pb::Graph,
    latencies: Vec<f64>,
}

/// What a run needs besides the job count.
struct Setup {
    gpus: usize,
    iterations: usize,
    iteration: Duration,
    rate: Option<f64>,
    arrival_s: f64,
    seed: u64,
    placement: Placement,
    kinds: Vec<Arc<Kind>>,
    socket_dir: Option<PathBuf>,
    scheduler_bin: Option<PathBuf>,
    budget: Option<u64>,
}

/// The job counts of `--jobs`: each 1 to [`MAX_JOBS`].
fn job_counts(s: &str) -> Result<Vec<usize>> {
    let counts: Vec<usize> = s
        .split(',')
        .map(|p| p.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .with_context(|| {
            format!("--jobs {s:?}: expected job counts, comma separated, such as 256,512,1024")
        })?;
    if let Some(bad) = counts.iter().find(|&&n| n == 0 || n > MAX_JOBS) {
        bail!("--jobs: {bad} jobs: each run has 1 to {MAX_JOBS}");
    }
    Ok(counts)
}

pub(crate) fn run(a: &BenchServiceArgs, gpus: usize) -> Result<()> {
    if gpus == 0 || gpus > MAX_GPUS {
        bail!("--gpus {gpus}: a simulated node has 1 to {MAX_GPUS} GPUs");
    }
    let counts = job_counts(&a.jobs)?;
    let iterations = a.iterations.unwrap_or(10);
    if iterations == 0 || iterations > 1000 {
        bail!("--iterations {iterations}: each job runs 1 to 1000");
    }
    if a.iteration_ms == 0 || a.iteration_ms > 60_000 {
        bail!(
            "--iteration-ms {}: an iteration takes 1 to 60000 ms",
            a.iteration_ms
        );
    }
    if let Some(r) = a.rate
        && !(r.is_finite() && r > 0.0 && r <= 10_000.0)
    {
        bail!("--rate {r}: jobs arrive at a rate above 0, at most 10000 per second");
    }
    if !(a.arrival_s.is_finite() && a.arrival_s > 0.0 && a.arrival_s <= 86_400.0) {
        bail!(
            "--arrival-s {}: the jobs arrive over more than 0 s, at most a day",
            a.arrival_s
        );
    }
    if let Some(dir) = &a.socket_dir {
        let file = GpusFile::read(dir)?.with_context(|| {
            format!(
                "{}: no gpus.json: start the scheduler with --gpus and --socket-dir {} first",
                dir.display(),
                dir.display()
            )
        })?;
        if file.gpus.len() < gpus {
            bail!(
                "--gpus {gpus}: the scheduler of {} serves {} GPU(s) ({})",
                dir.display(),
                file.gpus.len(),
                file.describe()
            );
        }
    }
    let device = DeviceProfile::builtin("a6000")?;
    let kinds = job_mix(&a.models, &device)?
        .into_iter()
        .map(|(g, lat)| {
            Arc::new(Kind {
                name: g.name().to_string(),
                graph: tensile_proto::convert::graph_to_proto(&g),
                latencies: lat.iter().map(|&ns| ns as f64 / 1e9).collect(),
            })
        })
        .collect();
    let setup = Setup {
        gpus,
        iterations,
        iteration: Duration::from_millis(a.iteration_ms),
        rate: a.rate,
        arrival_s: a.arrival_s,
        seed: a.seed,
        placement: a.placement,
        kinds,
        socket_dir: a.socket_dir.clone(),
        scheduler_bin: a.scheduler_bin.clone(),
        budget: a.budget_mb.map(|m| m.bytes()),
    };
    let mut runs = Vec::new();
    for &n in &counts {
        let run = run_once(&setup, n)?;
        if !a.json {
            print_run(&run);
        }
        runs.push(run);
    }
    let targets = targets(&runs);
    if a.json {
        let report = Report {
            gpus,
            iterations,
            iteration_ms: a.iteration_ms,
            seed: a.seed,
            placement: a.placement,
            models: a.models.clone(),
            budget_bytes: setup.budget,
            runs,
            targets,
        };
        tensile_cli::outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_targets(&targets);
    }
    Ok(())
}

/// The arrival times of `n` jobs at `rate` per second, seeded: the gaps
/// exponential (a Poisson process), the first after one gap.
fn arrivals(n: usize, rate: f64, seed: u64) -> Vec<Duration> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            let u: f64 = rng.random();
            t += -(1.0 - u).ln() / rate;
            Duration::from_secs_f64(t)
        })
        .collect()
}

/// The scheduler this bench started: the process, its socket directory
/// (removed with it) and its metrics port.
struct Started {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for Started {
    fn drop(&mut self) {
        // SIGTERM: the scheduler shuts down in order (gpus.json removed).
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .arg(self.child.id().to_string())
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `tensile-scheduler --gpus 0,...,N-1` on a fresh socket directory, with
/// metrics on a free loopback port; back once gpus.json names the sockets.
fn start_scheduler(s: &Setup, n: usize) -> Result<Started> {
    let bin = scheduler_bin(s.scheduler_bin.clone())?;
    let dir = std::env::temp_dir().join(format!("tensile-node-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let port = free_port()?;
    let log = dir.join("scheduler.log");
    let gpus = (0..s.gpus)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let mut cmd = Command::new(&bin);
    cmd.args(["--gpus", &gpus])
        .args(crate::bench_service::SCHEDULER_ARGS)
        .arg("--socket-dir")
        .arg(&dir)
        .arg(format!("--metrics-listen=127.0.0.1:{port}"));
    if let Some(b) = s.budget {
        cmd.arg(format!("--budget-mb={}", b as f64 / 1e6));
    }
    let child = cmd
        .env("RUST_LOG", "warn")
        .env_remove("TENSILE_CONFIG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    let mut started = Started { child, dir, port };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(f) = GpusFile::read(&started.dir)?
            && f.gpus.len() == s.gpus
        {
            return Ok(started);
        }
        if let Some(status) = started.child.try_wait()? {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            bail!(
                "{} --gpus {gpus} exited ({status}): {}",
                bin.display(),
                text.lines().last().unwrap_or("no message")
            );
        }
        if Instant::now() > deadline {
            bail!(
                "{} --gpus {gpus} wrote no gpus.json in {} within 30 s",
                bin.display(),
                started.dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// One job's figures.
#[derive(Debug, Default)]
struct JobOut {
    gpu: usize,
    first_plan: Duration,
    queued: bool,
    replans: Vec<Duration>,
    unanswered: usize,
    plans: usize,
    iterations: usize,
    complete: bool,
    error: Option<String>,
}

/// What the status poller saw.
#[derive(Debug, Default)]
struct Polled {
    polls: usize,
    over: Vec<u64>,
    max_queue: Vec<usize>,
    max_queue_total: usize,
    max_live: Vec<usize>,
    max_live_total: usize,
    live_sum: usize,
    max_rss_mb: Option<f64>,
}

/// CPU time (user + system) of process `pid` ("self" for this one), s.
fn cpu_s(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's name in parentheses: state is field 3, utime 14,
    // stime 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // The kernel's USER_HZ is 100 on every Linux this runs on.
    Some(ticks / 100.0)
}

fn run_once(s: &Setup, n: usize) -> Result<Run> {
    let started = match &s.socket_dir {
        Some(_) => None,
        None => Some(start_scheduler(s, n)?),
    };
    let dir = match (&s.socket_dir, &started) {
        (Some(d), _) => d.clone(),
        (None, Some(st)) => st.dir.clone(),
        (None, None) => unreachable!("a scheduler was started or named"),
    };
    let file = GpusFile::read(&dir)?.with_context(|| format!("{}: no gpus.json", dir.display()))?;
    let mut entries = file.gpus.clone();
    entries.truncate(s.gpus);
    let sockets: Vec<String> = entries
        .iter()
        .map(|g| format!("unix:{}", GpusFile::socket_path(&dir, g).display()))
        .collect();
    let indices: Vec<u32> = entries.iter().map(|g| g.index).collect();
    let pid = started.as_ref().map(|st| st.child.id().to_string());
    let start_rss = pid.as_ref().and_then(|p| rss_mb(p.parse().ok()?).0);
    let cpu0 = (pid.as_deref().and_then(cpu_s), cpu_s("self"));
    let rate = s.rate.unwrap_or(n as f64 / s.arrival_s);
    let times = arrivals(n, rate, s.seed);
    let progress = Progress::new(n);
    progress
        .bar
        .set_message(format!("{n} jobs on {} GPUs", s.gpus));
    let (jobs, polled, wall) = block_on(drive(s, &sockets, &times, pid.clone(), &progress))??;
    progress.bar.finish_and_clear();
    let page = match &started {
        Some(st) => block_on(metrics_page(st.port))??,
        None => None,
    };
    let (rss, peak) = match &pid {
        Some(p) => rss_mb(p.parse()?),
        None => (None, None),
    };
    let cpu = (
        pid.as_deref()
            .and_then(cpu_s)
            .zip(cpu0.0)
            .map(|(b, a)| b - a),
        cpu_s("self").zip(cpu0.1).map(|(b, a)| b - a),
    );
    drop(started);

    let mut per_gpu = Vec::new();
    for (g, &index) in indices.iter().enumerate() {
        let mine: Vec<&JobOut> = jobs.iter().filter(|j| j.gpu == g).collect();
        let scraped = page.as_ref().map(|p| p.scraped(Some(index)));
        let mut f = figures(&mine, wall);
        f.max_live = polled.max_live[g];
        f.max_queue_length = polled.max_queue[g];
        f.max_published_over_budget_bytes = polled.over[g];
        if let Some(sc) = &scraped {
            f.scheduler_max_over_budget_bytes = sc.max_over_budget;
            f.planning_s_total = sc.planning.map(|p| p.0);
            f.plannings = sc.planning.map(|p| p.1);
            f.plannings_capped = sc.capped;
            f.plans_withheld = sc.withheld;
        }
        planning_means(&mut f, wall);
        per_gpu.push(GpuRow {
            gpu: index,
            figures: f,
            table_wait_job: scraped.as_ref().and_then(|sc| sc.table_wait_job.clone()),
            table_wait_walk: scraped.and_then(|sc| sc.table_wait_walk),
        });
    }
    let all: Vec<&JobOut> = jobs.iter().collect();
    let mut overall = figures(&all, wall);
    overall.max_live = polled.max_live_total;
    overall.max_queue_length = polled.max_queue_total;
    overall.max_published_over_budget_bytes = polled.over.iter().copied().max().unwrap_or(0);
    let rows = || per_gpu.iter().map(|r| &r.figures);
    let sum_f = |get: fn(&Figures) -> Option<f64>| rows().map(get).sum::<Option<f64>>();
    overall.scheduler_max_over_budget_bytes = rows()
        .map(|f| f.scheduler_max_over_budget_bytes)
        .collect::<Option<Vec<_>>>()
        .map(|v| v.into_iter().max().unwrap_or(0));
    overall.planning_s_total = sum_f(|f| f.planning_s_total);
    overall.plannings = rows().map(|f| f.plannings).sum();
    overall.plannings_capped = rows().map(|f| f.plannings_capped).sum();
    overall.plans_withheld = rows().map(|f| f.plans_withheld).sum();
    planning_means(&mut overall, wall);
    let errors: Vec<String> = jobs
        .iter()
        .filter_map(|j| j.error.clone())
        .take(5)
        .collect();
    let live_peak = polled.max_live_total.max(1) as f64;
    Ok(Run {
        jobs: n,
        gpus: s.gpus,
        rate_per_s: rate,
        last_arrival_s: times.last().map_or(0.0, Duration::as_secs_f64),
        wall_s: wall,
        mean_live_jobs: if polled.polls > 0 {
            polled.live_sum as f64 / polled.polls as f64
        } else {
            0.0
        },
        overall,
        scheduler_start_rss_mb: start_rss,
        scheduler_rss_mb: rss,
        scheduler_max_polled_rss_mb: polled.max_rss_mb,
        scheduler_peak_rss_mb: peak,
        peak_rss_mb_per_live_job: peak
            .zip(start_rss)
            .map(|(p, s0)| (p - s0).max(0.0) / live_peak),
        scheduler_cpu_s: cpu.0,
        bench_cpu_s: cpu.1,
        status_polls: polled.polls,
        per_gpu,
        errors,
    })
}

/// The planning mean and share of the wall time, from the total.
fn planning_means(f: &mut Figures, wall: f64) {
    if let (Some(t), Some(c)) = (f.planning_s_total, f.plannings) {
        f.planning_ms_mean = (c > 0).then(|| t / c as f64 * 1e3);
        f.planning_share_of_wall = (wall > 0.0).then(|| t / wall);
    }
}

/// The figures of `jobs` (the polled and scraped ones left empty).
fn figures(jobs: &[&JobOut], wall: f64) -> Figures {
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let mut first: Vec<f64> = jobs
        .iter()
        .filter(|j| !j.queued && j.plans > 0)
        .map(|j| ms(&j.first_plan))
        .collect();
    let mut waits: Vec<f64> = jobs
        .iter()
        .filter(|j| j.queued && j.plans > 0)
        .map(|j| ms(&j.first_plan))
        .collect();
    let mut replans: Vec<f64> = jobs.iter().flat_map(|j| j.replans.iter().map(ms)).collect();
    let plans: usize = jobs.iter().map(|j| j.plans).sum();
    let reported: usize = jobs.iter().map(|j| j.iterations).sum();
    let nan_to_zero = |x: f64| if x.is_nan() { 0.0 } else { x };
    Figures {
        jobs: jobs.len(),
        completed: jobs.iter().filter(|j| j.complete).count(),
        failed: jobs.iter().filter(|j| j.error.is_some()).count(),
        max_live: 0,
        queued: jobs.iter().filter(|j| j.queued).count(),
        queue_wait_ms_max: waits.iter().copied().fold(0.0, f64::max),
        queue_wait_ms_p50: nan_to_zero(percentile(&mut waits, 0.5)),
        max_queue_length: 0,
        first_plan_ms_p50: nan_to_zero(percentile(&mut first, 0.5)),
        first_plan_ms_p99: nan_to_zero(percentile(&mut first, 0.99)),
        replan_ms_p50: nan_to_zero(percentile(&mut replans, 0.5)),
        replan_ms_p99: nan_to_zero(percentile(&mut replans, 0.99)),
        replan_ms_max: replans.iter().copied().fold(0.0, f64::max),
        replans: replans.len(),
        replans_unanswered: jobs.iter().map(|j| j.unanswered).sum(),
        plans_received: plans,
        plans_per_s: if wall > 0.0 { plans as f64 / wall } else { 0.0 },
        plan_versions_per_job_iteration: if reported > 0 {
            plans as f64 / reported as f64
        } else {
            0.0
        },
        max_published_over_budget_bytes: 0,
        scheduler_max_over_budget_bytes: None,
        planning_s_total: None,
        plannings: None,
        planning_ms_mean: None,
        planning_share_of_wall: None,
        plannings_capped: None,
        plans_withheld: None,
    }
}

/// Runs the arrivals, the jobs and the poller: (the jobs, what the poller
/// saw, the wall time in seconds).
async fn drive(
    s: &Setup,
    sockets: &[String],
    times: &[Duration],
    pid: Option<String>,
    progress: &Progress,
) -> Result<(Vec<JobOut>, Polled, f64)> {
    let n = times.len();
    let live: Arc<Vec<AtomicUsize>> =
        Arc::new(sockets.iter().map(|_| AtomicUsize::new(0)).collect());
    let mut pollers = Vec::new();
    for addr in sockets {
        pollers.push(connect(Some(addr), None).await?);
    }
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let summary = Arc::new(Mutex::new(String::new()));
    let poller = tokio::spawn(poll(
        pollers,
        live.clone(),
        pid,
        stopped,
        progress.bar.clone(),
        summary.clone(),
    ));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut jobs = Vec::with_capacity(n);
    for (j, &at) in times.iter().enumerate() {
        tokio::time::sleep_until((start + at).into()).await;
        let gpu = match s.placement {
            Placement::RoundRobin => j % sockets.len(),
            Placement::LeastLoaded => (0..sockets.len())
                .min_by_key(|&g| (live[g].load(Ordering::Relaxed), g))
                .unwrap_or(0),
        };
        live[gpu].fetch_add(1, Ordering::Relaxed);
        let kind = s.kinds[j % s.kinds.len()].clone();
        let addr = sockets[gpu].clone();
        let live = live.clone();
        let (iterations, iteration) = (s.iterations, s.iteration);
        tasks.spawn(async move {
            let mut out = match job(&addr, j, gpu, &kind, iterations, iteration).await {
                Ok(out) => out,
                Err(e) => JobOut {
                    error: Some(format!("job {j} on GPU socket {addr}: {e:#}")),
                    ..JobOut::default()
                },
            };
            out.gpu = gpu;
            live[gpu].fetch_sub(1, Ordering::Relaxed);
            out
        });
        // Reap the jobs that have ended as they go.
        while let Some(r) = tasks.try_join_next() {
            let out = r.context("a simulated job panicked")?;
            progress.tick(&tick_message(&out, &summary));
            jobs.push(out);
        }
    }
    while let Some(r) = tasks.join_next().await {
        let out = r.context("a simulated job panicked")?;
        progress.tick(&tick_message(&out, &summary));
        jobs.push(out);
    }
    let wall = start.elapsed().as_secs_f64();
    let _ = stop.send(());
    let polled = poller.await.context("the status poller panicked")??;
    Ok((jobs, polled, wall))
}

/// The progress bar's message after a job ended: the poller's last
/// summary, or why the job failed.
fn tick_message(out: &JobOut, summary: &Mutex<String>) -> String {
    match &out.error {
        Some(e) => format!("failed: {e}"),
        None => summary.lock().map(|s| s.clone()).unwrap_or_default(),
    }
}

/// Polls every GPU's status and the scheduler's memory every [`POLL`]
/// until `stop`.
async fn poll(
    mut clients: Vec<Client>,
    live: Arc<Vec<AtomicUsize>>,
    pid: Option<String>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
    bar: indicatif::ProgressBar,
    summary: Arc<Mutex<String>>,
) -> Result<Polled> {
    let k = clients.len();
    let mut p = Polled {
        over: vec![0; k],
        max_queue: vec![0; k],
        max_live: vec![0; k],
        ..Polled::default()
    };
    loop {
        let mut queue_total = 0;
        let mut live_total = 0;
        for (g, c) in clients.iter_mut().enumerate() {
            let status = c
                .get_status(pb::GetStatusRequest { job_id: 0 })
                .await
                .with_context(|| format!("GetStatus of GPU {g}"))?
                .into_inner();
            if let Some(m) = &status.memory {
                p.over[g] = p.over[g].max(m.published_bytes.saturating_sub(m.budget_bytes));
            }
            let queued = status
                .jobs
                .iter()
                .filter(|j| j.state == pb::JobState::Queued as i32)
                .count();
            p.max_queue[g] = p.max_queue[g].max(queued);
            queue_total += queued;
            let l = live[g].load(Ordering::Relaxed);
            p.max_live[g] = p.max_live[g].max(l);
            live_total += l;
        }
        p.polls += 1;
        p.max_queue_total = p.max_queue_total.max(queue_total);
        p.max_live_total = p.max_live_total.max(live_total);
        p.live_sum += live_total;
        let rss = pid.as_ref().and_then(|id| rss_mb(id.parse().ok()?).0);
        if let Some(r) = rss {
            p.max_rss_mb = Some(p.max_rss_mb.map_or(r, |m: f64| m.max(r)));
        }
        let line = format!(
            "{live_total} live, {queue_total} queued{}",
            rss.map_or(String::new(), |r| format!(", scheduler RSS {r:.0} MB"))
        );
        bar.set_message(line.clone());
        if let Ok(mut s) = summary.lock() {
            *s = line;
        }
        tokio::select! {
            _ = &mut stop => return Ok(p),
            () = tokio::time::sleep(POLL) => {}
        }
    }
}

/// The plan versions a job received, with when.
type Received = Arc<Mutex<Vec<(u64, Instant)>>>;

/// One simulated job on the GPU at `addr`.
async fn job(
    addr: &str,
    j: usize,
    gpu: usize,
    kind: &Kind,
    iterations: usize,
    iteration: Duration,
) -> Result<JobOut> {
    let mut out = JobOut {
        gpu,
        ..JobOut::default()
    };
    let mut c = connect(Some(addr), None).await?;
    let t = Instant::now();
    let (r, mut stream) = crate::bench_service::register_and_subscribe(
        &mut c,
        format!("{}-{j}", kind.name),
        kind.graph.clone(),
    )
    .await?;
    out.queued = r.state == pb::JobState::Queued as i32;
    // The plan stream, read beside the iterations as a worker does.
    let received: Received = Arc::default();
    let (newest, mut version) = watch::channel(0u64);
    let reader = {
        let received = received.clone();
        tokio::spawn(async move {
            while let Ok(Some(u)) = stream.message().await {
                if let Some(p) = u.plan {
                    if let Ok(mut r) = received.lock() {
                        r.push((p.version, Instant::now()));
                    }
                    newest.send_replace(p.version);
                }
            }
        })
    };
    let result = iterate(
        &mut c,
        &r,
        &mut version,
        &received,
        t,
        kind,
        iterations,
        iteration,
        &mut out,
    )
    .await;
    reader.abort();
    out.plans = received.lock().map_or(0, |r| r.len());
    // Leave however the iterations went: unregistered, the connection
    // closed.
    let left = c
        .unregister_job(pb::UnregisterJobRequest {
            job_id: r.job_id,
            token: r.token,
        })
        .await
        .context("UnregisterJob");
    result?;
    left?;
    Ok(out)
}

/// The job's life once registered: its first plan, its iterations, the
/// re-plans they asked for.
#[allow(clippy::too_many_arguments)]
async fn iterate(
    c: &mut Client,
    r: &pb::RegisterJobResponse,
    version: &mut watch::Receiver<u64>,
    received: &Received,
    registered: Instant,
    kind: &Kind,
    iterations: usize,
    iteration: Duration,
    out: &mut JobOut,
) -> Result<()> {
    match wait_version(c, r, version, 1, FIRST_PLAN_WAIT).await? {
        Some(true) => {}
        Some(false) => bail!(
            "job {}: the plan stream ended before its first plan",
            r.job_id
        ),
        None => bail!(
            "job {}: no first plan within {} s",
            r.job_id,
            FIRST_PLAN_WAIT.as_secs()
        ),
    }
    out.first_plan = registered.elapsed();
    // Each report, with the plan version it asked for.
    let mut asked: Vec<(Instant, u64)> = Vec::new();
    let began = Instant::now();
    for i in 0..iterations {
        tokio::time::sleep_until((began + iteration * (i as u32 + 1)).into()).await;
        let scale = if i % 2 == 0 { 2.0 } else { 1.0 };
        let running = *version.borrow();
        let sent = Instant::now();
        let a = c
            .report_latencies(pb::ReportLatenciesRequest {
                job_id: r.job_id,
                token: r.token.clone(),
                iteration: i as u64,
                plan_version: running,
                op_latency_s: kind.latencies.iter().map(|x| x * scale).collect(),
                stall_s: 0.0,
                late_prefetches: Vec::new(),
                passive_swaps: 0,
                peak_bytes: 0,
                base_bytes: 0,
            })
            .await
            .context("ReportLatencies")?
            .into_inner();
        out.iterations += 1;
        if a.replanned {
            asked.push((sent, a.plan_version + 1));
        }
    }
    let want = asked.iter().map(|&(_, v)| v).max().unwrap_or(0);
    let got = wait_version(c, r, version, want, REPLAN_WAIT).await?;
    let log = received.lock().map(|r| r.clone()).unwrap_or_default();
    for &(sent, want) in &asked {
        if let Some(&(_, at)) = log.iter().find(|&&(v, at)| v >= want && at >= sent) {
            out.replans.push(at - sent);
        }
    }
    out.unanswered = asked.len() - out.replans.len();
    if got == Some(false) {
        bail!(
            "job {}: the plan stream ended before its last re-plan",
            r.job_id
        );
    }
    out.complete = true;
    Ok(())
}

/// Waits up to `limit` for plan version `want` or a newer one, renewing
/// the job's lease meanwhile (an open stream alone does not): `Some(true)`
/// once here, `Some(false)` if the stream ended first, `None` past
/// `limit`.
async fn wait_version(
    c: &mut Client,
    r: &pb::RegisterJobResponse,
    version: &mut watch::Receiver<u64>,
    want: u64,
    limit: Duration,
) -> Result<Option<bool>> {
    let beat = Duration::from_secs_f64((r.lease_s / 3.0).clamp(0.1, 5.0));
    let deadline = Instant::now() + limit;
    loop {
        let until = (Instant::now() + beat).min(deadline);
        tokio::select! {
            got = version.wait_for(|&v| v >= want) => return Ok(Some(got.is_ok())),
            () = tokio::time::sleep_until(until.into()) => {}
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        c.heartbeat(pb::HeartbeatRequest {
            job_id: r.job_id,
            token: r.token.clone(),
        })
        .await
        .context("Heartbeat")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_are_seeded_and_at_the_rate() {
        let a = arrivals(4000, 8.0, 1);
        assert_eq!(a, arrivals(4000, 8.0, 1));
        assert_ne!(a, arrivals(4000, 8.0, 2));
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        // 4000 arrivals at 8/s: about 500 s (the sum of 4000 exponential
        // gaps has a standard deviation of 500 / sqrt(4000) = 7.9 s).
        let last = a[3999].as_secs_f64();
        assert!((460.0..540.0).contains(&last), "{last}");
    }

    #[test]
    fn job_counts_are_checked() {
        assert_eq!(job_counts("256, 512,1024").unwrap(), [256, 512, 1024]);
        for (bad, says) in [
            ("0", "0 jobs"),
            ("1025", "1025 jobs"),
            ("8,x", "comma separated"),
        ] {
            let e = format!("{:#}", job_counts(bad).unwrap_err());
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
