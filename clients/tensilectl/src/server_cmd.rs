//! The scheduler's client commands: `status`, `budget`, `watch`, and
//! `plan --server` (PlanGraph). Without `--server` they find the scheduler
//! as every client does (`tensile_proto::endpoint`): `TENSILE_SERVER`, else
//! the socket directory's gpus.json, else its default socket. With
//! gpus.json, `status` shows every GPU, `--gpu` picks one, `watch` finds
//! the GPU that has the job and `budget` wants `--gpu` when there are
//! several.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use tensile_cli::Mb;
use tensile_proto::endpoint::{GpuEntry, GpusFile};
use tensile_proto::pb;
use tensile_proto::pb::memory_scheduler_client::MemorySchedulerClient;
use tensile_proto::tls::ClientTls;
use tonic::transport::Channel;

use crate::args::{BudgetArgs, PlanArgs, StatusArgs, WatchArgs};
use tensile_cli::format_mb;

pub(crate) type Client = MemorySchedulerClient<Channel>;

/// A runtime for one command.
pub(crate) fn block_on<F: std::future::Future>(f: F) -> Result<F::Output> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(f))
}

/// The GPUs of the socket directory's gpus.json, with that directory;
/// `None` when there is no such file.
fn gpus_file() -> Result<Option<(PathBuf, GpusFile)>> {
    let dir = tensile_proto::endpoint::socket_dir();
    Ok(GpusFile::read(&dir)?.map(|f| (dir, f)))
}

/// The address of one GPU of gpus.json.
fn gpu_address(dir: &std::path::Path, g: &GpuEntry) -> String {
    format!("unix:{}", GpusFile::socket_path(dir, g).display())
}

/// Where a command for one scheduler goes: `--server`; else `--gpu`'s
/// socket in gpus.json; else the clients' rule (for CUDA ordinal 0).
fn target(server: Option<&str>, gpu: Option<&str>) -> Result<String> {
    if let Some(entry) = gpu {
        let Some((dir, file)) = gpus_file()? else {
            bail!(
                "--gpu {entry}: there is no {} (the scheduler there serves one device: leave --gpu out)",
                tensile_proto::endpoint::socket_dir()
                    .join(tensile_proto::endpoint::GPUS_FILE)
                    .display()
            );
        };
        let g = file.find(entry).map_err(|why| {
            anyhow::anyhow!(
                "--gpu {entry}: {why}; the scheduler serves GPUs {}",
                file.describe()
            )
        })?;
        return Ok(gpu_address(&dir, g));
    }
    Ok(tensile_proto::endpoint::resolve_server(server, 0)?)
}

/// Connects to `server` (unix:PATH, HOST:PORT, https://HOST:PORT), else
/// to the scheduler clients find by default; over TLS where `tls` and the
/// address say so (`tensile_proto::tls::transport`).
pub(crate) async fn connect(server: Option<&str>, tls: Option<&ClientTls>) -> Result<Client> {
    let server = tensile_proto::endpoint::resolve_server(server, 0)?;
    let (endpoint, _) = tensile_proto::tls::endpoint(&server, tls)?;
    let ch = endpoint
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!(tensile_proto::endpoint::unreachable(&server, &e, tls)))?;
    Ok(MemorySchedulerClient::new(ch)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX))
}

/// A failed call to `server` as an error: the TLS reason when TLS is at
/// fault, else the status. A scheduler that wants a client certificate
/// refuses one only after the handshake, which the call sees as a closed
/// connection: a handshake of its own finds why
/// (`tensile_proto::tls::probe`).
fn call_error(server: &str, s: tonic::Status, tls: Option<&ClientTls>) -> anyhow::Error {
    if let Some(why) = tensile_proto::tls::explain(&s, tls) {
        return anyhow::anyhow!("{why}");
    }
    if tls.is_none()
        && let Some(why) = tensile_proto::tls::plaintext_hint(server, &s)
    {
        return anyhow::anyhow!("{why}");
    }
    let lost = matches!(
        s.code(),
        tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Unavailable
    );
    match tls
        .filter(|_| lost)
        .and_then(|t| tensile_proto::tls::probe(server, t))
    {
        Some(why) => anyhow::anyhow!("the scheduler at {server} refused the connection: {why}"),
        None => s.into(),
    }
}

fn state_name(s: i32) -> &'static str {
    match pb::JobState::try_from(s) {
        Ok(pb::JobState::Queued) => "queued",
        Ok(pb::JobState::Active) => "active",
        Ok(pb::JobState::Done) => "done",
        Ok(pb::JobState::Planning) => "planning",
        _ => "unknown",
    }
}

/// `status --json`.
#[derive(Debug, Serialize)]
struct StatusJson {
    device: String,
    budget_bytes: u64,
    device_bytes: u64,
    sum_of_peaks_bytes: u64,
    aligned_peak_bytes: u64,
    vanilla_sum_of_peaks_bytes: u64,
    /// `free`, `gated` or `turns` ("" before any joint plan), and why.
    layout: String,
    layout_note: String,
    jobs: Vec<JobJson>,
    diagnostics: Vec<String>,
}

#[derive(Debug, Serialize)]
struct JobJson {
    job_id: u64,
    name: String,
    state: &'static str,
    reason: String,
    priority: i32,
    plan_version: u64,
    ops: u32,
    iterations_reported: u64,
    latency_source: String,
    lower_bound_bytes: u64,
    /// The device memory outside the job's storages that its plans count,
    /// and where it came from: "profile", "registered" or "measured".
    base_bytes: u64,
    base_source: String,
    /// The base the job's last report measured (0: none yet).
    reported_base_bytes: u64,
    /// The process it registered in ("": none given), and the job of that
    /// process whose plans count the process's base (base_source "process":
    /// another job's).
    process: String,
    base_job: u64,
    vanilla_peak_bytes: u64,
    planned_peak_bytes: u64,
    reported_peak_bytes: u64,
    /// The gate of its newest plan, when coordinated with the other jobs
    /// (absent: it runs free).
    #[serde(skip_serializing_if = "Option::is_none")]
    gate_period_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gate_phase_ns: Option<u64>,
}

/// One GPU's section of `status --json` without `--server`.
#[derive(Debug, Serialize)]
struct GpuStatusJson {
    index: u32,
    uuid: String,
    name: String,
    socket: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<StatusJson>,
    /// Why the GPU's scheduler did not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// A scheduler's status; `Ok(None)`: it does not have `job`.
async fn get_status(
    server: &str,
    job: Option<u64>,
    tls: Option<&ClientTls>,
) -> Result<Option<StatusJson>> {
    let mut c = connect(Some(server), tls).await?;
    match c
        .get_status(pb::GetStatusRequest {
            job_id: job.unwrap_or(0),
        })
        .await
    {
        Ok(r) => Ok(Some(status_json(r.into_inner()))),
        Err(e) if job.is_some() && e.code() == tonic::Code::NotFound => Ok(None),
        Err(e) => Err(call_error(server, e, tls)).context("GetStatus"),
    }
}

pub(crate) fn status(a: &StatusArgs) -> Result<()> {
    if a.server.is_none()
        && a.gpu.is_none()
        && let Some((dir, file)) = gpus_file()?
    {
        return status_of_gpus(a, &dir, &file);
    }
    let tls = a.tls.load()?;
    let server = target(a.server.as_deref(), a.gpu.as_deref())?;
    let out = block_on(get_status(&server, a.job, tls.as_ref()))??.with_context(|| {
        format!(
            "the scheduler at {server} has no job {}",
            a.job.unwrap_or(0)
        )
    })?;
    if a.json {
        tensile_cli::outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_status(&out);
    }
    Ok(())
}

/// `status` with gpus.json and no `--server`: a section per GPU (with
/// `--job`, those that have it).
fn status_of_gpus(a: &StatusArgs, dir: &std::path::Path, file: &GpusFile) -> Result<()> {
    let sections: Vec<GpuStatusJson> = block_on(async {
        let mut out = Vec::new();
        for g in &file.gpus {
            let answer = get_status(&gpu_address(dir, g), a.job, None).await;
            if matches!(answer, Ok(None)) {
                continue;
            }
            let (status, error) = match answer {
                Ok(st) => (st, None),
                Err(e) => (None, Some(format!("{e:#}").replace('\n', " "))),
            };
            out.push(GpuStatusJson {
                index: g.index,
                uuid: g.uuid.clone(),
                name: g.name.clone(),
                socket: GpusFile::socket_path(dir, g).display().to_string(),
                status,
                error,
            });
        }
        out
    })?;
    if let Some(job) = a.job
        && sections.is_empty()
    {
        bail!(
            "no GPU's scheduler has job {job} (GPUs {})",
            file.describe()
        );
    }
    if a.json {
        tensile_cli::outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "gpus": sections }))?
        );
    } else {
        for (i, g) in sections.iter().enumerate() {
            if i > 0 {
                tensile_cli::outln!();
            }
            tensile_cli::outln!(
                "GPU {} ({}, {}) on unix:{}",
                g.index,
                g.name,
                g.uuid,
                g.socket
            );
            match (&g.status, &g.error) {
                (Some(st), _) => print_status(st),
                (None, e) => tensile_cli::outln!("  unreachable: {}", e.as_deref().unwrap_or("")),
            }
        }
    }
    let failed = sections.iter().filter(|g| g.error.is_some()).count();
    if failed > 0 {
        bail!(
            "{failed} of {} GPUs' schedulers did not answer",
            sections.len()
        );
    }
    Ok(())
}

fn status_json(st: pb::GetStatusResponse) -> StatusJson {
    let mem = st.memory.unwrap_or_default();
    StatusJson {
        device: st.device,
        budget_bytes: mem.budget_bytes,
        device_bytes: mem.device_bytes,
        sum_of_peaks_bytes: mem.sum_of_peaks_bytes,
        aligned_peak_bytes: mem.aligned_peak_bytes,
        vanilla_sum_of_peaks_bytes: mem.vanilla_sum_of_peaks_bytes,
        layout: mem.layout,
        layout_note: mem.layout_note,
        jobs: st
            .jobs
            .iter()
            .map(|j| {
                let p = j.prediction.clone().unwrap_or_default();
                JobJson {
                    job_id: j.job_id,
                    name: j.name.clone(),
                    state: state_name(j.state),
                    reason: j.reason.clone(),
                    priority: j.priority,
                    plan_version: j.plan_version,
                    ops: j.ops,
                    iterations_reported: j.iterations_reported,
                    latency_source: j.latency_source.clone(),
                    lower_bound_bytes: j.lower_bound_bytes,
                    base_bytes: j.base_bytes,
                    base_source: j.base_source.clone(),
                    reported_base_bytes: j.reported_base_bytes,
                    process: j.process.clone(),
                    base_job: j.base_job,
                    vanilla_peak_bytes: p.vanilla_peak_bytes,
                    planned_peak_bytes: p.planned_peak_bytes,
                    reported_peak_bytes: j.reported_peak_bytes,
                    gate_period_ns: j.gate.map(|g| g.period_ns),
                    gate_phase_ns: j.gate.map(|g| g.phase_ns),
                }
            })
            .collect(),
        diagnostics: st.diagnostics.iter().map(|d| d.message.clone()).collect(),
    }
}

/// What each column of `status` measures, printed under the table.
const STATUS_LEGEND: &str = "\
vanilla, planned: the job's predicted peak without a plan and with its newest plan, its base included
measured: the peak of the job's last report (a worker: its storages; the hook: its held tensors on the CPU, the allocator's peak on CUDA)
base: the device memory outside the job's storages its plans count, and where that figure came from (job N: its process's base, counted once, with job N)
gate: period/phase of its iterations when coordinated with the other jobs; free: it runs when it likes";

/// A job's gate as `period/phase ms`, or `free`.
fn gate_cell(period_ns: Option<u64>, phase_ns: Option<u64>) -> String {
    match (period_ns, phase_ns) {
        (Some(p), Some(f)) => format!("{:.1}/{:.1} ms", p as f64 / 1e6, f as f64 / 1e6),
        _ => "free".to_string(),
    }
}

/// Where a job's base came from; for a job whose process's base another
/// job counts, that job.
fn base_cell(j: &JobJson) -> String {
    if j.base_source == "process" {
        match j.base_job {
            0 => "process".to_string(),
            n => format!("job {n}"),
        }
    } else {
        j.base_source.clone()
    }
}

/// One line per process that runs several of `jobs`: which, and the job
/// that counts their one base.
fn shared_processes(jobs: &[JobJson]) -> Vec<String> {
    let mut by: std::collections::BTreeMap<&str, Vec<&JobJson>> = Default::default();
    for j in jobs.iter().filter(|j| !j.process.is_empty()) {
        by.entry(&j.process).or_default().push(j);
    }
    by.into_iter()
        .filter(|(_, js)| js.len() > 1)
        .map(|(p, js)| {
            let ids: Vec<String> = js.iter().map(|j| j.job_id.to_string()).collect();
            let carrier = js.iter().find(|j| j.base_job == j.job_id);
            let base = carrier.map_or_else(
                || "none of them admitted".to_string(),
                |c| format!("{}, counted with job {}", format_mb(c.base_bytes), c.job_id),
            );
            format!(
                "process {p}: jobs {} share one base ({base})",
                ids.join(", ")
            )
        })
        .collect()
}

fn print_status(out: &StatusJson) {
    tensile_cli::outln!(
        "{}: budget {} of {}; planned peaks add up to {} (vanilla {}), aligned {}",
        out.device,
        format_mb(out.budget_bytes),
        format_mb(out.device_bytes),
        format_mb(out.sum_of_peaks_bytes),
        format_mb(out.vanilla_sum_of_peaks_bytes),
        format_mb(out.aligned_peak_bytes)
    );
    if !out.layout.is_empty() {
        let why = if out.layout_note.is_empty() {
            String::new()
        } else {
            format!(" ({})", out.layout_note)
        };
        println!("layout: {}{why}", out.layout);
    }
    if out.jobs.is_empty() {
        tensile_cli::outln!("no jobs");
    } else {
        tensile_cli::outln!(
            "{:>5}  {:<20} {:<9} {:>4} {:>7} {:>6}  {:>10} {:>10} {:>10}  {:>10} {:<10}  {:<15}  latencies",
            "job",
            "name",
            "state",
            "prio",
            "version",
            "iters",
            "vanilla",
            "planned",
            "measured",
            "base",
            "(base of)",
            "gate"
        );
    }
    for j in &out.jobs {
        tensile_cli::outln!(
            "{:>5}  {:<20} {:<9} {:>4} {:>7} {:>6}  {:>10} {:>10} {:>10}  {:>10} {:<10}  {:<15}  {}",
            j.job_id,
            j.name,
            j.state,
            j.priority,
            j.plan_version,
            j.iterations_reported,
            format_mb(j.vanilla_peak_bytes),
            format_mb(j.planned_peak_bytes),
            format_mb(j.reported_peak_bytes),
            format_mb(j.base_bytes),
            base_cell(j),
            gate_cell(j.gate_period_ns, j.gate_phase_ns),
            j.latency_source
        );
        if !j.reason.is_empty() {
            tensile_cli::outln!("       {}", j.reason);
        }
    }
    for line in shared_processes(&out.jobs) {
        tensile_cli::outln!("{line}");
    }
    if !out.jobs.is_empty() {
        tensile_cli::outln!("{STATUS_LEGEND}");
    }
    for d in &out.diagnostics {
        tensile_cli::outln!("note: {d}");
    }
}

/// The admin token: `--admin-token-file`, else `TENSILE_ADMIN_TOKEN`.
fn admin_token(a: &BudgetArgs) -> Result<String> {
    if let Some(p) = &a.admin_token_file {
        let t = std::fs::read_to_string(p).with_context(|| p.display().to_string())?;
        return Ok(t.trim().to_string());
    }
    Ok(std::env::var("TENSILE_ADMIN_TOKEN").unwrap_or_default())
}

pub(crate) fn budget(a: &BudgetArgs) -> Result<()> {
    let token = admin_token(a)?;
    let tls = a.tls.load()?;
    let server = match (&a.server, &a.gpu, gpus_file()?) {
        (None, None, Some((dir, file))) if file.gpus.len() > 1 => bail!(
            "the scheduler of {} serves {} GPUs ({}): name the one whose budget this is with --gpu",
            dir.display(),
            file.gpus.len(),
            file.describe()
        ),
        (None, None, Some((dir, file))) => gpu_address(&dir, &file.gpus[0]),
        _ => target(a.server.as_deref(), a.gpu.as_deref())?,
    };
    let r = block_on(async {
        let mut c = connect(Some(&server), tls.as_ref()).await?;
        let r = c
            .set_memory_budget(pb::SetMemoryBudgetRequest {
                budget_bytes: a.mb.bytes(),
                admin_token: token,
            })
            .await
            .map_err(|e| call_error(&server, e, tls.as_ref()))
            .context("SetMemoryBudget")?;
        Ok::<_, anyhow::Error>(r.into_inner())
    })??;
    tensile_cli::outln!("budget set to {}", format_mb(r.budget_bytes));
    for j in &r.changed {
        tensile_cli::outln!(
            "  job {} {:?} is now {}",
            j.job_id,
            j.name,
            state_name(j.state)
        );
    }
    Ok(())
}

pub(crate) fn watch(a: &WatchArgs) -> Result<()> {
    let tls = a.tls.load()?;
    block_on(async {
        let server = match (&a.server, &a.gpu, gpus_file()?) {
            (None, None, Some((dir, file))) => gpu_of_job(&dir, &file, a.job).await?,
            _ => target(a.server.as_deref(), a.gpu.as_deref())?,
        };
        let mut c = connect(Some(&server), tls.as_ref()).await?;
        match &a.token {
            Some(token) => watch_stream(&mut c, a.job, token).await,
            None => watch_status(&mut c, a.job).await,
        }
    })?
}

/// The address of the GPU whose scheduler has `job` (job ids are unique
/// across the GPUs of one scheduler).
async fn gpu_of_job(dir: &std::path::Path, file: &GpusFile, job: u64) -> Result<String> {
    for g in &file.gpus {
        let address = gpu_address(dir, g);
        if get_status(&address, Some(job), None).await?.is_some() {
            return Ok(address);
        }
    }
    bail!(
        "no GPU's scheduler has job {job} (GPUs {})",
        file.describe()
    )
}

/// With the job's token: its plan stream.
async fn watch_stream(c: &mut Client, job: u64, token: &str) -> Result<()> {
    let mut s = c
        .subscribe_plans(pb::SubscribePlansRequest {
            job_id: job,
            token: token.to_string(),
            after_version: 0,
        })
        .await
        .context("SubscribePlans")?
        .into_inner();
    while let Some(u) = s.message().await.context("the plan stream")? {
        match &u.plan {
            Some(p) => {
                let pr = p.prediction.clone().unwrap_or_default();
                tensile_cli::outln!(
                    "job {job} plan v{}: {} events, peak {} (vanilla {}), {:.2} ms per iteration",
                    p.version,
                    p.events.len(),
                    format_mb(pr.planned_peak_bytes),
                    format_mb(pr.vanilla_peak_bytes),
                    pr.planned_iteration_s * 1e3
                );
            }
            None => tensile_cli::outln!("job {job} is {}", state_name(u.state)),
        }
        for d in &u.diagnostics {
            tensile_cli::outln!("  note: {}", d.message);
        }
    }
    tensile_cli::outln!("job {job}: the stream ended");
    Ok(())
}

/// Without a token: the job's status, printed whenever its plan version or
/// state changes, until it is gone.
async fn watch_status(c: &mut Client, job: u64) -> Result<()> {
    let mut last = None;
    loop {
        let st = match c.get_status(pb::GetStatusRequest { job_id: job }).await {
            Ok(r) => r.into_inner(),
            Err(e) if e.code() == tonic::Code::NotFound && last.is_some() => {
                tensile_cli::outln!("job {job} is gone");
                return Ok(());
            }
            Err(e) => return Err(e).context("GetStatus"),
        };
        if let Some(j) = st.jobs.first() {
            let now = (j.plan_version, j.state);
            if last != Some(now) {
                let p = j.prediction.clone().unwrap_or_default();
                tensile_cli::outln!(
                    "job {job} {:?}: {} plan v{}, peak {} (vanilla {})",
                    j.name,
                    state_name(j.state),
                    j.plan_version,
                    format_mb(p.planned_peak_bytes),
                    format_mb(p.vanilla_peak_bytes)
                );
                last = Some(now);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `plan --server`: the scheduler plans the graph (PlanGraph).
pub(crate) fn plan(a: &PlanArgs, server: &str) -> Result<()> {
    let tls = a.tls.load()?;
    let graph = match &a.file {
        Some(path) => crate::input::graph_file(path, &tensile_graph::Limits::default())
            .with_context(|| path.display().to_string())?,
        None => crate::input::zoo_graph(&a.model)?,
    };
    let req = pb::PlanGraphRequest {
        graph: Some(tensile_proto::convert::graph_to_proto(&graph)),
        settings: a.no_recompute.then(|| pb::JobSettings {
            allow_recompute: Some(false),
            ..pb::JobSettings::default()
        }),
        op_latency_s: Vec::new(),
        device: Some(pb::DeviceProfile {
            name: a.device.device.clone(),
            ..pb::DeviceProfile::default()
        }),
        budget_bytes: a.device.budget_mb.map_or(0, Mb::bytes),
    };
    let r = block_on(async {
        let mut c = connect(Some(server), tls.as_ref()).await?;
        let r = c
            .plan_graph(req)
            .await
            .map_err(|e| call_error(server, e, tls.as_ref()))
            .context("PlanGraph")?;
        Ok::<_, anyhow::Error>(r.into_inner())
    })??;
    let plan = r.plan.clone().unwrap_or_default();
    if let Some(path) = &a.output {
        let domain = tensile_proto::convert::plan_from_proto(&plan, &graph)?;
        let diags: Vec<_> = r
            .diagnostics
            .iter()
            .filter_map(|d| tensile_proto::convert::diagnostic_from_proto(d, 0).ok())
            .collect();
        let text = tensile_proto::plan_json::plan_to_json(&domain, &diags, &graph) + "\n";
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("plan written to {}", path.display());
    }
    let p = plan.prediction.unwrap_or_default();
    let count = |k: pb::EventKind| plan.events.iter().filter(|e| e.kind == k as i32).count();
    if a.json {
        let v = serde_json::json!({
            "graph": graph.name(),
            "server": server,
            "vanilla_peak_bytes": p.vanilla_peak_bytes,
            "planned_peak_bytes": p.planned_peak_bytes,
            "vanilla_time_s": p.vanilla_iteration_s,
            "planned_time_s": p.planned_iteration_s,
            "swap_outs": count(pb::EventKind::SwapOut),
            "swap_ins": count(pb::EventKind::SwapIn),
            "releases": count(pb::EventKind::Release),
            "recomputed_ops": p.recomputed_ops,
            "swapped_bytes": p.swapped_bytes,
            "plan_ms": r.planning_s * 1e3,
            "latency_source": r.latency_source.first().cloned().unwrap_or_default(),
            "diagnostics": r.diagnostics.iter().map(|d| d.message.clone()).collect::<Vec<_>>(),
        });
        tensile_cli::outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    tensile_cli::outln!("{} planned by the scheduler at {server}", graph.name());
    tensile_cli::outln!(
        "  peak      vanilla {}  planned {}",
        format_mb(p.vanilla_peak_bytes),
        format_mb(p.planned_peak_bytes)
    );
    tensile_cli::outln!(
        "  time      vanilla {:.2} ms  planned {:.2} ms  (latencies: {})",
        p.vanilla_iteration_s * 1e3,
        p.planned_iteration_s * 1e3,
        r.latency_source.first().map_or("", String::as_str)
    );
    tensile_cli::outln!(
        "  events    {} swap-outs, {} swap-ins, {} releases, {} recomputed ops; {} swapped",
        count(pb::EventKind::SwapOut),
        count(pb::EventKind::SwapIn),
        count(pb::EventKind::Release),
        p.recomputed_ops,
        format_mb(p.swapped_bytes)
    );
    tensile_cli::outln!("  planned in {:.2} ms", r.planning_s * 1e3);
    for d in &r.diagnostics {
        tensile_cli::outln!("  note: {}", d.message);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{JobJson, base_cell, gate_cell, shared_processes};

    fn job(id: u64, process: &str, base_job: u64, base: u64, source: &str) -> JobJson {
        JobJson {
            job_id: id,
            name: format!("j{id}"),
            state: "active",
            reason: String::new(),
            priority: 0,
            plan_version: 1,
            ops: 1,
            iterations_reported: 0,
            latency_source: String::new(),
            lower_bound_bytes: 0,
            base_bytes: base,
            base_source: source.into(),
            reported_base_bytes: 0,
            process: process.into(),
            base_job,
            vanilla_peak_bytes: 0,
            planned_peak_bytes: 0,
            reported_peak_bytes: 0,
            gate_period_ns: None,
            gate_phase_ns: None,
        }
    }

    #[test]
    fn jobs_of_one_process_are_named_together_with_the_job_counting_their_base() {
        let jobs = [
            job(1, "h:10:a", 1, 900_000_000, "measured"),
            job(2, "h:10:a", 1, 0, "process"),
            job(3, "h:11:b", 3, 700_000_000, "profile"),
            job(4, "", 0, 700_000_000, "profile"),
        ];
        assert_eq!(
            shared_processes(&jobs),
            vec!["process h:10:a: jobs 1, 2 share one base (900 MB, counted with job 1)"]
        );
        assert_eq!(base_cell(&jobs[1]), "job 1");
        assert_eq!(base_cell(&jobs[0]), "measured");
    }

    #[test]
    fn a_gate_shows_its_period_and_phase_and_no_gate_reads_free() {
        assert_eq!(
            gate_cell(Some(839_400_000), Some(367_000_000)),
            "839.4/367.0 ms"
        );
        assert_eq!(gate_cell(None, None), "free");
    }
}
