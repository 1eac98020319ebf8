//! `tensilectl bench service`: simulated workers against a real scheduler
//! over a real socket. Each worker registers a zoo job at batch 2,
//! subscribes, and reports every iteration (latencies alternating between
//! the roofline and twice it, so that every report drifts past the
//! threshold and asks for a re-plan). Prints register-to-first-plan and
//! re-plan latency percentiles, plans pushed per second and the
//! scheduler's resident memory. Workers that admission queued (their jobs
//! do not fit beside the others' lower bounds) wait for others to leave:
//! their first plans are counted apart. While they run, the bench polls
//! the scheduler's status and keeps the largest amount by which the
//! planned peaks of the plans in force (those of the active jobs) added up
//! past the budget; at the end it reads the scheduler's metrics: its
//! planning time, its own exact count of that excess (where it keeps one)
//! and how long its handlers waited for its job table.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use tensile_graph::Graph;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_latency_model::{DeviceProfile, estimate_latencies};
use tensile_proto::pb;

use crate::args::BenchServiceArgs;
use crate::server_cmd::{Client, block_on, connect};

#[derive(Debug, Clone, Serialize)]
struct Row {
    workers: usize,
    register_to_first_plan_ms_p50: f64,
    register_to_first_plan_ms_p99: f64,
    /// Workers whose registration was queued by admission; their waits
    /// are not in the first-plan percentiles above.
    queued_workers: usize,
    /// The longest wait of a queued worker for its first plan.
    queued_first_plan_ms_max: f64,
    replan_ms_p50: f64,
    replan_ms_p99: f64,
    replans: usize,
    plans_received: usize,
    plans_per_s: f64,
    wall_s: f64,
    /// Workers that got every plan they were promised.
    complete_workers: usize,
    scheduler_rss_mb: Option<f64>,
    scheduler_peak_rss_mb: Option<f64>,
    /// At the end, what the scheduler's data held on its heap and what its
    /// allocator kept resident for it (its metrics, from jemalloc), MB.
    scheduler_heap_allocated_mb: Option<f64>,
    scheduler_heap_resident_mb: Option<f64>,
    /// The scheduler's own planning time (its Prometheus histogram), when
    /// it was started here.
    planning_s_total: Option<f64>,
    plannings: Option<u64>,
    /// Plan versions the workers received per iteration they reported.
    plan_versions_per_job_iteration: f64,
    /// Status polls while the workers ran.
    status_polls: usize,
    /// The largest amount (bytes) by which the planned peaks of the
    /// active jobs' plans added up past the budget at a poll (0: never).
    max_published_over_budget_bytes: u64,
    /// The scheduler's own: the largest excess of the plans in force over
    /// the budget at any publication (gated plans counted by their aligned
    /// peak), when it keeps one.
    scheduler_max_over_budget_bytes: Option<u64>,
    /// Waits for one job's entry in the scheduler's job table (its
    /// metrics), and of its walks of the whole table.
    table_wait_job: Option<Waits>,
    table_wait_walk: Option<Waits>,
}

/// A histogram of waits, as the bench reports it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Waits {
    count: u64,
    total_s: f64,
    mean_us: f64,
    /// The upper bound of the bucket of the 99th percentile.
    p99_bucket_us: Option<f64>,
    /// Waits longer than the bucket bound at about 100 µs (102.4 µs).
    over_100us: u64,
}

/// One worker's figures.
#[derive(Debug, Default)]
struct Worker {
    first_plan: Duration,
    /// Admission queued it at registration.
    queued: bool,
    replans: Vec<Duration>,
    plans: usize,
    complete: bool,
}

pub(crate) fn percentile(xs: &mut [f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let i = ((xs.len() - 1) as f64 * q).round() as usize;
    xs[i]
}

pub(crate) fn run(a: &BenchServiceArgs) -> Result<()> {
    if let Some(gpus) = a.gpus {
        return crate::bench_node::run(a, gpus);
    }
    let iterations = a.iterations.unwrap_or(6);
    let counts: Vec<usize> = a
        .workers
        .split(',')
        .map(|s| s.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .context("--workers: expected numbers, comma separated")?;
    if counts.iter().any(|&n| n == 0 || n > 1024) {
        bail!("--workers: each count must be in 1..=1024");
    }
    if iterations == 0 || iterations > 1000 {
        bail!("--iterations must be in 1..=1000");
    }
    let device = DeviceProfile::builtin("a6000")?;
    let jobs: Vec<(Arc<Graph>, Arc<Vec<f64>>)> = job_mix(&a.models, &device)?
        .into_iter()
        .map(|(g, lat)| {
            let secs = lat.iter().map(|&ns| ns as f64 / 1e9).collect();
            (g, Arc::new(secs))
        })
        .collect();
    let mut rows = Vec::new();
    for &n in &counts {
        let mut child = None;
        let server = match &a.server {
            Some(s) => s.clone(),
            None => {
                let (c, addr, metrics) = spawn_scheduler(a.scheduler_bin.clone())?;
                child = Some((c, metrics));
                addr
            }
        };
        let result = block_on(bench(&server, n, iterations, &jobs))?;
        let (rss, hwm, scraped) = match &mut child {
            Some((c, metrics)) => {
                let (rss, hwm) = rss_mb(c.id());
                let scraped = block_on(scrape(*metrics, None))?.ok().flatten();
                let _ = Command::new("kill").arg(c.id().to_string()).status();
                let _ = c.wait();
                (rss, hwm, scraped)
            }
            None => (None, None, None),
        };
        let mut row = result?;
        row.scheduler_rss_mb = rss;
        row.scheduler_peak_rss_mb = hwm;
        if let Some(m) = scraped {
            row.planning_s_total = m.planning.map(|p| p.0);
            row.plannings = m.planning.map(|p| p.1);
            row.scheduler_max_over_budget_bytes = m.max_over_budget;
            row.scheduler_heap_allocated_mb = m.heap.0.map(|b| b / 1e6);
            row.scheduler_heap_resident_mb = m.heap.1.map(|b| b / 1e6);
            row.table_wait_job = m.table_wait_job;
            row.table_wait_walk = m.table_wait_walk;
        }
        if !a.json {
            print_row(&row);
        }
        rows.push(row);
    }
    if a.json {
        tensile_cli::outln!("{}", serde_json::to_string_pretty(&rows)?);
    }
    Ok(())
}

/// The zoo models the bench's jobs cycle through, by default.
pub(crate) const MODELS: &str = "resnet50,vgg16,inception_v3,densenet121,bert_base,inception_v4";

/// The bench's job mix: each of `models` (comma separated zoo names) at
/// batch 2, with its latencies on `device` (the roofline, ns per op).
/// Worker `w` runs the mix's job `w % len`; `bench planner` plans the same.
pub(crate) fn job_mix(models: &str, device: &DeviceProfile) -> Result<Vec<(Arc<Graph>, Vec<u64>)>> {
    let mut jobs = Vec::new();
    for m in models.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let g = zoo::build(m, &ZooConfig::new(2)).with_context(|| format!("--models: {m}"))?;
        let lat = estimate_latencies(&g, device);
        jobs.push((Arc::new(g), lat));
    }
    if jobs.is_empty() {
        bail!("--models is empty");
    }
    Ok(jobs)
}

fn print_row(r: &Row) {
    tensile_cli::outln!(
        "{:>3} workers: register->first plan p50 {:.1} ms p99 {:.1} ms{}; re-plan p50 {:.1} ms p99 {:.1} ms ({} re-plans); {} plans in {:.2} s = {:.1} plans/s; {}/{} workers complete; scheduler RSS {} (peak {}{}){}",
        r.workers,
        r.register_to_first_plan_ms_p50,
        r.register_to_first_plan_ms_p99,
        if r.queued_workers > 0 {
            format!(
                " ({} queued by admission, not counted: first plan after up to {:.0} ms)",
                r.queued_workers, r.queued_first_plan_ms_max
            )
        } else {
            String::new()
        },
        r.replan_ms_p50,
        r.replan_ms_p99,
        r.replans,
        r.plans_received,
        r.wall_s,
        r.plans_per_s,
        r.complete_workers,
        r.workers,
        r.scheduler_rss_mb
            .map_or("?".into(), |m| format!("{m:.1} MB")),
        r.scheduler_peak_rss_mb
            .map_or("?".into(), |m| format!("{m:.1} MB")),
        match (r.scheduler_heap_allocated_mb, r.scheduler_heap_resident_mb) {
            (Some(a), Some(h)) => format!("; its heap {a:.1} MB allocated, {h:.1} MB resident"),
            _ => String::new(),
        },
        match (r.planning_s_total, r.plannings) {
            (Some(s), Some(n)) if n > 0 => format!(
                "; the scheduler planned {n} times, {:.1} ms per plan of all jobs",
                s / n as f64 * 1e3
            ),
            _ => String::new(),
        }
    );
    println!(
        "     {:.2} plan versions per job per iteration; plans in force over the budget by at most {} bytes over {} status polls{}{}",
        r.plan_versions_per_job_iteration,
        r.max_published_over_budget_bytes,
        r.status_polls,
        r.scheduler_max_over_budget_bytes
            .map_or(String::new(), |b| format!(
                " ({b} bytes by the scheduler's own count)"
            )),
        [
            ("one job", &r.table_wait_job),
            ("walks", &r.table_wait_walk)
        ]
        .iter()
        .filter_map(|(what, w)| w.as_ref().map(|w| format!(
            "; job table waits ({what}): {} mean {:.2} us, p99 <= {} us, {} over 100 us",
            w.count,
            w.mean_us,
            w.p99_bucket_us.map_or("?".into(), |p| format!("{p:.1}")),
            w.over_100us
        )))
        .collect::<String>()
    );
}

/// How the benches start their scheduler: the a6000 profile, roofline
/// latencies, nothing stored, and a lease long enough that no simulated
/// worker (each keeps its stream open and reports) lapses.
pub(crate) const SCHEDULER_ARGS: [&str; 8] = [
    "--device",
    "a6000",
    "--latency-models",
    "roofline",
    "--state",
    "none",
    "--lease-s",
    "60",
];

/// `tensile-scheduler` from beside this binary, on a fresh socket, with
/// metrics on a free loopback port.
fn spawn_scheduler(bin: Option<PathBuf>) -> Result<(Child, String, u16)> {
    let bin = scheduler_bin(bin)?;
    let dir: PathBuf = std::env::temp_dir().join(format!("tensile-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let sock = dir.join("s.sock");
    let _ = std::fs::remove_file(&sock);
    let port = free_port()?;
    let child = Command::new(bin)
        .args(SCHEDULER_ARGS)
        .arg(format!("--listen=unix:{}", sock.display()))
        .arg(format!("--metrics-listen=127.0.0.1:{port}"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .context("cannot start tensile-scheduler")?;
    let addr = format!("unix:{}", sock.display());
    for _ in 0..200 {
        if sock.exists() {
            return Ok((child, addr, port));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    bail!("tensile-scheduler did not create {}", sock.display())
}

/// `bin`, else `tensile-scheduler` beside this binary; an error that says
/// what to do when it is not there.
pub(crate) fn scheduler_bin(bin: Option<PathBuf>) -> Result<PathBuf> {
    let bin = match bin {
        Some(b) => b,
        None => std::env::current_exe()?.with_file_name("tensile-scheduler"),
    };
    if !bin.exists() {
        bail!(
            "{} not found: build it (cargo build -p tensile-scheduler) or pass --server",
            bin.display()
        );
    }
    Ok(bin)
}

/// A free loopback port for the scheduler's metrics.
pub(crate) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// VmRSS and VmHWM of a process, MB.
pub(crate) fn rss_mb(pid: u32) -> (Option<f64>, Option<f64>) {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return (None, None);
    };
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map(|kb| kb * 1024.0 / 1e6)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// What the bench reads of the scheduler's metrics.
#[derive(Debug, Default)]
pub(crate) struct Scraped {
    /// Planning time: (sum s, count).
    pub(crate) planning: Option<(f64, u64)>,
    /// Joint plans stopped at their work bound.
    pub(crate) capped: Option<u64>,
    /// Plans of joint plans not published (past the budget).
    pub(crate) withheld: Option<u64>,
    pub(crate) max_over_budget: Option<u64>,
    /// The scheduler's heap, allocated and resident bytes (process-wide:
    /// unlabelled on a node too).
    pub(crate) heap: (Option<f64>, Option<f64>),
    pub(crate) table_wait_job: Option<Waits>,
    pub(crate) table_wait_walk: Option<Waits>,
}

/// The scheduler's metrics the bench reports: the unlabelled series
/// (`gpu` None, a single device) or GPU `gpu`'s. `Ok(None)` when nothing
/// listens on `port`.
pub(crate) async fn scrape(port: u16, gpu: Option<u32>) -> Result<Option<Scraped>> {
    Ok(metrics_page(port).await?.map(|p| p.scraped(gpu)))
}

/// The scheduler's metrics page, `None` when nothing listens on `port`.
pub(crate) async fn metrics_page(port: u16) -> Result<Option<MetricsPage>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return Ok(None);
    };
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut body = String::new();
    s.read_to_string(&mut body).await?;
    Ok(Some(MetricsPage::parse(&body)))
}

/// One sample of a metrics page: `name{label="v",...} value`.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// A histogram of a metrics page: (sum, count, its cumulative buckets as
/// (upper bound, count)).
pub(crate) type Histogram = (f64, u64, Vec<(f64, f64)>);

/// A metrics page (Prometheus / OpenMetrics text), its samples.
#[derive(Debug)]
pub(crate) struct MetricsPage(Vec<Sample>);

impl MetricsPage {
    /// The samples of `text`; lines that are not one (comments, the HTTP
    /// header) are skipped.
    pub(crate) fn parse(text: &str) -> MetricsPage {
        let sample = |line: &str| {
            let line = line.trim();
            if line.starts_with('#') || line.is_empty() {
                return None;
            }
            let (head, rest) = match line.split_once('{') {
                Some((name, rest)) => {
                    let (labels, value) = rest.rsplit_once('}')?;
                    (
                        (name, Some(labels)),
                        value.split_whitespace().next()?.to_string(),
                    )
                }
                None => {
                    let mut parts = line.split_whitespace();
                    ((parts.next()?, None), parts.next()?.to_string())
                }
            };
            let (name, labels) = head;
            if !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            {
                return None;
            }
            let labels = labels
                .map(|l| {
                    l.split(',')
                        .filter(|kv| !kv.trim().is_empty())
                        .map(|kv| {
                            let (k, v) = kv.split_once('=')?;
                            Some((k.trim().to_string(), v.trim().trim_matches('"').to_string()))
                        })
                        .collect::<Option<Vec<_>>>()
                })
                .unwrap_or(Some(Vec::new()))?;
            Some(Sample {
                name: name.to_string(),
                labels,
                value: rest.parse().ok()?,
            })
        };
        MetricsPage(text.lines().filter_map(sample).collect())
    }

    /// Whether `s` is of the series `gpu` (None: unlabelled by GPU), with
    /// no labels besides `gpu` and those in `also`.
    fn of(s: &Sample, gpu: Option<u32>, also: &[&str]) -> bool {
        let g = s
            .labels
            .iter()
            .find(|(k, _)| k == "gpu")
            .map(|(_, v)| v.as_str());
        g == gpu.map(|i| i.to_string()).as_deref()
            && s.labels
                .iter()
                .all(|(k, _)| k == "gpu" || also.contains(&k.as_str()))
    }

    pub(crate) fn value(&self, name: &str, gpu: Option<u32>) -> Option<f64> {
        self.0
            .iter()
            .find(|s| s.name == name && Self::of(s, gpu, &[]))
            .map(|s| s.value)
    }

    /// A histogram: (sum, count, cumulative buckets (le, count)).
    pub(crate) fn histogram(&self, name: &str, gpu: Option<u32>) -> Option<Histogram> {
        let sum = self.value(&format!("{name}_sum"), gpu)?;
        let count = self.value(&format!("{name}_count"), gpu)? as u64;
        let bucket = format!("{name}_bucket");
        let buckets = self
            .0
            .iter()
            .filter(|s| s.name == bucket && Self::of(s, gpu, &["le"]))
            .filter_map(|s| {
                let le = s.labels.iter().find(|(k, _)| k == "le")?;
                Some((le.1.parse::<f64>().ok()?, s.value))
            })
            .collect();
        Some((sum, count, buckets))
    }

    fn waits(&self, name: &str, gpu: Option<u32>) -> Option<Waits> {
        let (sum, count, buckets) = self.histogram(name, gpu)?;
        let p99 = buckets
            .iter()
            .find(|&&(_, n)| n >= count as f64 * 0.99)
            .map(|&(le, _)| le)
            .filter(|le| le.is_finite());
        let within_100us = buckets
            .iter()
            .filter(|&&(le, _)| le <= 1.1e-4)
            .map(|&(_, n)| n)
            .fold(0.0, f64::max);
        Some(Waits {
            count,
            total_s: sum,
            mean_us: if count > 0 {
                sum / count as f64 * 1e6
            } else {
                0.0
            },
            p99_bucket_us: p99.map(|s| s * 1e6),
            over_100us: count.saturating_sub(within_100us as u64),
        })
    }

    /// What the bench reports of the series `gpu`.
    pub(crate) fn scraped(&self, gpu: Option<u32>) -> Scraped {
        Scraped {
            planning: self
                .histogram("tensile_scheduler_planning_seconds", gpu)
                .map(|(s, c, _)| (s, c)),
            capped: self
                .value("tensile_scheduler_planning_capped_total", gpu)
                .map(|v| v as u64),
            withheld: self
                .value("tensile_scheduler_plans_withheld_total", gpu)
                .map(|v| v as u64),
            max_over_budget: self
                .value("tensile_scheduler_max_published_over_budget_bytes", gpu)
                .map(|v| v as u64),
            heap: (
                self.value("tensile_scheduler_heap_allocated_bytes", None),
                self.value("tensile_scheduler_heap_resident_bytes", None),
            ),
            table_wait_job: self.waits("tensile_scheduler_job_table_wait_seconds", gpu),
            table_wait_walk: self.waits("tensile_scheduler_job_table_walk_wait_seconds", gpu),
        }
    }
}

/// Polls the status every `every` until `stop`: (polls, the largest
/// excess over the budget of what the plans in force hold, as the status
/// says: jobs gated together or taking turns by their aligned peak, not
/// their peaks added up).
async fn poll_over_budget(
    mut c: Client,
    every: Duration,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> Result<(usize, u64)> {
    let (mut polls, mut worst) = (0, 0u64);
    loop {
        let s = c
            .get_status(pb::GetStatusRequest { job_id: 0 })
            .await
            .context("GetStatus")?
            .into_inner();
        polls += 1;
        if let Some(m) = s.memory {
            worst = worst.max(m.published_bytes.saturating_sub(m.budget_bytes));
        }
        tokio::select! {
            _ = &mut stop => return Ok((polls, worst)),
            () = tokio::time::sleep(every) => {}
        }
    }
}

async fn bench(
    server: &str,
    n: usize,
    iterations: usize,
    jobs: &[(Arc<Graph>, Arc<Vec<f64>>)],
) -> Result<Row> {
    // A --server over TCP may want TLS: from TENSILE_TLS_* as every client.
    let tls = tensile_proto::tls::ClientTlsFiles::from_env().load()?;
    let start = Instant::now();
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let poller = tokio::spawn(poll_over_budget(
        connect(Some(server), tls.as_ref()).await?,
        Duration::from_millis(20),
        stopped,
    ));
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..n {
        let (g, lat) = jobs[w % jobs.len()].clone();
        let c = connect(Some(server), tls.as_ref()).await?;
        tasks.spawn(worker(c, w, g, lat, iterations));
    }
    let mut workers = Vec::new();
    while let Some(r) = tasks.join_next().await {
        workers.push(r.context("a worker panicked")??);
    }
    let wall = start.elapsed().as_secs_f64();
    let _ = stop.send(());
    let (status_polls, max_over) = poller.await.context("the status poller panicked")??;
    let mut first: Vec<f64> = workers
        .iter()
        .filter(|w| !w.queued)
        .map(|w| w.first_plan.as_secs_f64() * 1e3)
        .collect();
    let queued: Vec<f64> = workers
        .iter()
        .filter(|w| w.queued)
        .map(|w| w.first_plan.as_secs_f64() * 1e3)
        .collect();
    let mut replans: Vec<f64> = workers
        .iter()
        .flat_map(|w| w.replans.iter().map(|d| d.as_secs_f64() * 1e3))
        .collect();
    let plans: usize = workers.iter().map(|w| w.plans).sum();
    Ok(Row {
        workers: n,
        register_to_first_plan_ms_p50: percentile(&mut first, 0.5),
        register_to_first_plan_ms_p99: percentile(&mut first, 0.99),
        queued_workers: queued.len(),
        queued_first_plan_ms_max: queued.iter().copied().fold(0.0, f64::max),
        replan_ms_p50: percentile(&mut replans, 0.5),
        replan_ms_p99: percentile(&mut replans, 0.99),
        replans: replans.len(),
        plans_received: plans,
        plans_per_s: plans as f64 / wall,
        wall_s: wall,
        complete_workers: workers.iter().filter(|w| w.complete).count(),
        scheduler_rss_mb: None,
        scheduler_peak_rss_mb: None,
        scheduler_heap_allocated_mb: None,
        scheduler_heap_resident_mb: None,
        planning_s_total: None,
        plannings: None,
        plan_versions_per_job_iteration: plans as f64 / (n * iterations) as f64,
        status_polls,
        max_published_over_budget_bytes: max_over,
        scheduler_max_over_budget_bytes: None,
        table_wait_job: None,
        table_wait_walk: None,
    })
}

/// One simulated worker.
async fn worker(
    mut c: Client,
    w: usize,
    g: Arc<Graph>,
    lat: Arc<Vec<f64>>,
    iterations: usize,
) -> Result<Worker> {
    let mut out = Worker::default();
    let t = Instant::now();
    let (r, mut s) = register_and_subscribe(
        &mut c,
        format!("{}-{w}", g.name()),
        tensile_proto::convert::graph_to_proto(&g),
    )
    .await?;
    out.queued = r.state == pb::JobState::Queued as i32;
    let mut version = 0;
    while version == 0 {
        let Some(u) = s.message().await? else {
            bail!("job {}: the stream ended before the first plan", r.job_id);
        };
        if let Some(p) = u.plan {
            version = p.version;
        }
    }
    out.first_plan = t.elapsed();
    out.plans = 1;
    let mut complete = true;
    for i in 0..iterations {
        let scale = if i % 2 == 0 { 2.0 } else { 1.0 };
        let t = Instant::now();
        let a = c
            .report_latencies(pb::ReportLatenciesRequest {
                job_id: r.job_id,
                token: r.token.clone(),
                iteration: i as u64,
                plan_version: version,
                op_latency_s: lat.iter().map(|x| x * scale).collect(),
                stall_s: 0.0,
                late_prefetches: Vec::new(),
                passive_swaps: 0,
                peak_bytes: 0,
                base_bytes: 0,
            })
            .await
            .context("ReportLatencies")?
            .into_inner();
        if a.replanned {
            // Wait for a version newer than the one the report saw; other
            // jobs' re-plans may bring several.
            let want = a.plan_version + 1;
            loop {
                let next = tokio::time::timeout(Duration::from_secs(120), s.message()).await;
                match next {
                    Ok(Ok(Some(u))) => {
                        if let Some(p) = u.plan {
                            out.plans += 1;
                            version = p.version;
                            if version >= want {
                                break;
                            }
                        }
                    }
                    _ => {
                        complete = false;
                        break;
                    }
                }
            }
            out.replans.push(t.elapsed());
        } else {
            // A simulated iteration.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    out.complete = complete;
    c.unregister_job(pb::UnregisterJobRequest {
        job_id: r.job_id,
        token: r.token,
    })
    .await
    .context("UnregisterJob")?;
    Ok(out)
}

/// Registers a job of `graph` as `name`, with the scheduler's defaults,
/// and opens its plan stream: as a worker starts.
pub(crate) async fn register_and_subscribe(
    c: &mut Client,
    name: String,
    graph: pb::Graph,
) -> Result<(pb::RegisterJobResponse, tonic::Streaming<pb::PlanUpdate>)> {
    let r = c
        .register_job(pb::RegisterJobRequest {
            name,
            graph: Some(graph),
            settings: None,
            op_latency_s: Vec::new(),
            process: String::new(),
        })
        .await
        .context("RegisterJob")?
        .into_inner();
    let stream = c
        .subscribe_plans(pb::SubscribePlansRequest {
            job_id: r.job_id,
            token: r.token.clone(),
            after_version: 0,
        })
        .await
        .context("SubscribePlans")?
        .into_inner();
    Ok((r, stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page of a scheduler serving GPUs: each GPU's series apart, the
    /// single device's (unlabelled) apart, other labels not mistaken for
    /// the plain series.
    #[test]
    fn metrics_pages_are_read_by_gpu() {
        let page = MetricsPage::parse(
            "HTTP/1.0 200 OK\r\n\r\n# HELP x\n\
             tensile_scheduler_planning_seconds_sum{gpu=\"0\"} 1.5\n\
             tensile_scheduler_planning_seconds_count{gpu=\"0\"} 3\n\
             tensile_scheduler_planning_seconds_bucket{gpu=\"0\",le=\"0.5\"} 1\n\
             tensile_scheduler_planning_seconds_bucket{gpu=\"0\",le=\"+Inf\"} 3\n\
             tensile_scheduler_planning_seconds_sum{gpu=\"1\"} 7\n\
             tensile_scheduler_planning_seconds_count{gpu=\"1\"} 2\n\
             tensile_scheduler_replans_total{gpu=\"1\",reason=\"drift\"} 9\n\
             tensile_scheduler_plans_withheld_total{gpu=\"1\"} 4\n\
             tensile_scheduler_max_published_over_budget_bytes 12\n\
             # EOF\n",
        );
        let (sum, count, buckets) = page
            .histogram("tensile_scheduler_planning_seconds", Some(0))
            .unwrap();
        assert_eq!((sum, count), (1.5, 3));
        assert_eq!(buckets.len(), 2);
        assert_eq!(buckets[0], (0.5, 1.0));
        assert_eq!(
            page.scraped(Some(1)).planning,
            Some((7.0, 2)),
            "GPU 1's own"
        );
        assert_eq!(page.scraped(Some(1)).withheld, Some(4));
        assert_eq!(page.scraped(Some(0)).withheld, None);
        // A series with a label besides `gpu` is not the plain one.
        assert_eq!(page.value("tensile_scheduler_replans_total", Some(1)), None);
        // The single device's series are unlabelled.
        assert_eq!(page.scraped(None).max_over_budget, Some(12));
        assert_eq!(page.scraped(Some(0)).max_over_budget, None);
    }
}
