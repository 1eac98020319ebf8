//! `tensile-worker`: trains one job with real kernels, standalone: a zoo
//! model or a graph file, under a plan file (`tensilectl plan -o`) or none
//! (`--vanilla`), for K iterations, with real copies to a capped host pool
//! at a configured link bandwidth and a device memory budget. Prints one
//! line (or one JSON object) per iteration; progress goes to stderr. With
//! `--copies N` it trains N copies of the job at once, each on a thread of
//! its own, as N jobs that share this one process (on a GPU: one CUDA
//! context, one set of library handles, one caching allocator).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{ArgGroup, Parser, ValueEnum};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde::Serialize;
use tch::Device;
use tensile_cli::Mb;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Graph, Limits, Liveness, json};
use tensile_swap_executor::HostConfig;
use tensile_worker::{
    BaseMeter, Engine, IterationReport, Level, LogSink, Session, SessionConfig, Worker,
    WorkerConfig, vanilla_plan,
};

/// The unit of every `-mb` flag: 10^6 bytes, as the scheduler's
/// `--budget-mb` and the peaks the worker prints.

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CopyKind {
    /// Real bytes to a capped pool of host buffers on copy threads.
    Host,
    /// A CUDA stream and a pinned pool (needs a GPU build and a GPU).
    Cuda,
}

/// Trains one job with real kernels under a plan (or none), standalone.
#[derive(Debug, Parser)]
#[command(name = "tensile-worker", version)]
#[command(group(ArgGroup::new("job").required(true).args(["model", "graph"])))]
#[command(group(ArgGroup::new("policy").args(["plan", "vanilla", "scheduler"])))]
struct Args {
    /// Zoo model name (see `tensilectl zoo`).
    #[arg(long)]
    model: Option<String>,
    /// Batch size of the zoo model.
    #[arg(long, default_value_t = 16, requires = "model")]
    batch: u64,
    /// Image side (CNNs) or sequence length (BERT) of the zoo model.
    #[arg(long, requires = "model")]
    resolution: Option<u64>,
    /// Optimizer of the zoo model's iteration: adam or sgd; with
    /// `-in-backward` (adam-in-backward), each parameter's update runs as
    /// soon as its gradient is final, inside the backward pass; with
    /// `-on-host` (adam-on-host), so too, but on the host CPU, the
    /// optimizer's state kept there.
    #[arg(long, default_value = "adam", requires = "model")]
    optimizer: String,
    /// A JSON graph file (traced or exported) instead of a zoo model.
    #[arg(long)]
    graph: Option<PathBuf>,
    /// A plan file (tensile-plan/v1, from `tensilectl plan -o`).
    #[arg(long)]
    plan: Option<PathBuf>,
    /// No plan: free every tensor after its last use, as PyTorch does.
    #[arg(long)]
    vanilla: bool,
    /// Plans from the scheduler at ADDR (`unix:PATH`, `HOST:PORT`,
    /// `https://HOST:PORT`; TLS by the --tls-ca rule below); with
    /// neither --plan nor --vanilla, the one clients find by default:
    /// TENSILE_SERVER, else the socket of this job's GPU in the socket
    /// directory's gpus.json (--device cuda:N, through
    /// CUDA_VISIBLE_DEVICES; 0 on the CPU), else the default socket.
    #[arg(long, value_name = "ADDR")]
    scheduler: Option<String>,
    #[command(flatten)]
    tls: tensile_cli::tls::ClientTlsArgs,
    /// The job's name in the scheduler's status (default: the graph's).
    #[arg(long)]
    name: Option<String>,
    /// Admission priority among queued jobs (higher first).
    #[arg(long, default_value_t = 0)]
    priority: i32,
    /// Device memory this process holds outside its tensors' storages, MB
    /// (CUDA context, library handles, the allocator's slack), which the
    /// scheduler plans beside the job's tensors: measure it on the GPU as
    /// nvidia-smi's figure for a run less the peak it prints, under a plan
    /// and beside the other jobs where possible (the allocator then holds
    /// more than for a vanilla run alone). Unset: the scheduler's device
    /// profile says. On CUDA the worker measures it itself after its first
    /// iterations (NVML's figure for the process less the storages' peak)
    /// and reports it; the scheduler plans with the measured figure when
    /// it differs materially from this one.
    #[arg(long, value_name = "MB", value_parser = tensile_cli::parse_positive_mb, allow_negative_numbers = true)]
    base_mb: Option<Mb>,
    /// How long to wait for the scheduler's first plan (queued jobs wait
    /// here), seconds.
    #[arg(long, default_value_t = 600.0)]
    plan_timeout_s: f64,
    #[arg(long, default_value_t = 1)]
    iterations: usize,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// The copy engine (default: by device: cuda on a CUDA device, host on
    /// the CPU).
    #[arg(long, value_enum)]
    copy: Option<CopyKind>,
    /// Bandwidth of the host engine per direction, GB/s (unset: as fast as
    /// memory goes).
    #[arg(long)]
    link_gbps: Option<f64>,
    /// Most host memory the engine's pool holds, MB of 10^6 bytes (unset:
    /// no cap).
    #[arg(long, value_name = "MB", allow_negative_numbers = true)]
    host_pool_mb: Option<Mb>,
    /// The device memory budget, MB of 10^6 bytes (as the scheduler's
    /// --budget-mb), for the tensors' storages. Under a plan (a file or the
    /// scheduler's) the executor's guard holds it: an allocation past it
    /// waits for the job's own frees, then moves what the job uses last to
    /// the host; it fails only when even that cannot make room. With
    /// --vanilla an allocation past it fails, as a GPU's out-of-memory
    /// would. With --ledger, the budget of all the workers on the ledger
    /// together.
    #[arg(long, value_name = "MB", allow_negative_numbers = true)]
    memory_mb: Option<Mb>,
    /// A memory ledger shared with the other workers of the device: a
    /// directory (created if missing; e.g. /dev/shm/tensile-gpu0) where
    /// each worker publishes the device bytes it holds. --memory-mb (then
    /// required) becomes the budget that all the workers on the same ledger
    /// share, the same number for all of them: each holds at most what the
    /// others leave. Under a plan an op past that waits for the others to
    /// free memory, and moves what its job uses last to the host when
    /// every worker waits (or after 100 ms); it fails only when even that
    /// cannot make room. With --vanilla an allocation past what the others
    /// leave fails, as on a shared GPU. A worker that dies stops counting
    /// within 50 ms.
    #[arg(long, value_name = "DIR", requires = "memory_mb")]
    ledger: Option<PathBuf>,
    /// Seed of the initial tensors not read from files.
    #[arg(long, default_value_t = 0)]
    seed: i64,
    /// Initial parameters (and buffers, optimizer state) by name.
    #[arg(long)]
    init_params: Option<PathBuf>,
    /// The graph's input tensors by name, used every iteration.
    #[arg(long)]
    inputs: Option<PathBuf>,
    /// Write the parameters and buffers after the last iteration here.
    #[arg(long)]
    save_params: Option<PathBuf>,
    /// Append resident device bytes at every change to this file, one
    /// `unix_time_s,bytes` line each (for plots of memory over time).
    #[arg(long, value_name = "FILE")]
    memory_trace: Option<PathBuf>,
    /// One JSON object per iteration on stdout.
    #[arg(long)]
    json: bool,
    /// Fault injection: every copy takes this much longer, ms.
    #[arg(long, default_value_t = 0.0)]
    fault_delay_ms: f64,
    /// Fault injection: every N-th copy fails.
    #[arg(long)]
    fault_fail_every: Option<u64>,
    /// The CUDA caching allocator's settings, in PYTORCH_ALLOC_CONF's
    /// syntax; ignored when PYTORCH_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF is
    /// set. Expandable segments return what a job frees to one growing
    /// mapping instead of caching fixed blocks, so a process holds close to
    /// what its tensors need (on an H200, ResNet-50 b32 peaked at 3764 MiB
    /// against 4382 without). "" leaves PyTorch's defaults.
    #[arg(long, value_name = "CONF", default_value = "expandable_segments:True")]
    cuda_alloc_conf: String,
    /// Threads of the CPU kernels (unset: libtorch's default).
    #[arg(long)]
    threads: Option<i32>,
    /// Train N copies of the job at once in this process, each on a thread
    /// of its own and each a job of its own (its own plan, copies and
    /// guard; at the scheduler, named NAME-0, NAME-1, ...). On a GPU the
    /// copies share one CUDA context, the libraries' handles and one
    /// caching allocator, so the memory a process holds outside its
    /// tensors (--base-mb) is paid once, not once per job: --base-mb is
    /// then the whole process's, split evenly among the copies, and so is
    /// the base the process measures (each copy reports its share). They share
    /// --memory-mb through --ledger, or through a private ledger of their
    /// own when none is named. Every copy starts from the same tensors
    /// (--seed, --init-params, --inputs). --memory-trace and --save-params
    /// get the copy's number before the extension (trace.csv:
    /// trace.0.csv, trace.1.csv, ...); with --json each line names its
    /// copy ("copy": N), without, each line starts with "copy N:".
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    copies: u16,
}

/// Which of the process's copies of the job one thread trains.
#[derive(Debug, Clone, Copy)]
struct JobCopy {
    index: usize,
    of: usize,
}

impl JobCopy {
    /// The copy's own file: `PATH` alone, else the copy's number before
    /// the extension.
    fn path(self, path: &Path) -> PathBuf {
        if self.of == 1 {
            return path.to_path_buf();
        }
        let stem = path
            .file_stem()
            .map_or_else(Default::default, |s| s.to_os_string());
        let mut name = stem;
        name.push(format!(".{}", self.index));
        if let Some(ext) = path.extension() {
            name.push(".");
            name.push(ext);
        }
        path.with_file_name(name)
    }

    /// The job's name at the scheduler.
    fn name(self, name: &str) -> String {
        if self.of == 1 {
            name.to_string()
        } else {
            format!("{name}-{}", self.index)
        }
    }

    /// The copy's share of the process's base, rounded up so that the
    /// shares add up to at least the whole.
    fn base_share(self, bytes: u64) -> u64 {
        bytes.div_ceil(self.of as u64)
    }
}

/// What the copies of one process share: the device, the copy engine's
/// kind, the host pool's settings, the memory ledger, where they print,
/// the process's base meter.
struct Shared {
    device: Device,
    engine: Engine,
    host: HostConfig,
    ledger: Option<PathBuf>,
    bars: MultiProgress,
    base: Arc<BaseMeter>,
}

/// The process's base meter: on CUDA through NVML (said once, above the
/// progress bars, when that cannot be read), on the CPU none.
fn base_meter(device: Device, copies: usize, bars: &MultiProgress) -> BaseMeter {
    let Some(ordinal) = tensile_worker::cuda_ordinal(device) else {
        return BaseMeter::off(copies);
    };
    let bars = bars.clone();
    BaseMeter::new(
        tensile_worker::process_usage(ordinal),
        copies,
        move |message| bars.suspend(|| eprintln!("tensile-worker: {message}")),
    )
}

fn device(s: &str) -> Result<Device> {
    match s {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => Ok(Device::Cuda(n)),
            _ => bail!("unknown device {s:?} (expected cpu, cuda or cuda:N)"),
        },
    }
}

/// The copy engine: `--copy`, else by device (the CUDA engine on a CUDA
/// device, the host engine on the CPU). Clear errors for a CUDA engine
/// without a CUDA device, a driver or a device, and for a pace on the CUDA
/// engine.
fn engine(args: &Args, device: Device) -> Result<Engine> {
    let copy = args.copy.unwrap_or(match device {
        Device::Cpu => CopyKind::Host,
        _ => CopyKind::Cuda,
    });
    if copy == CopyKind::Cuda {
        let Some(ordinal) = tensile_worker::cuda_ordinal(device) else {
            bail!(
                "--copy cuda needs a CUDA device (--device cuda or cuda:N), not {:?}",
                args.device
            );
        };
        if args.link_gbps.is_some() {
            bail!(
                "--link-gbps paces the host engine only; the CUDA engine runs at the real link's speed (drop it, or use --copy host)"
            );
        }
        tensile_swap_executor::cuda_available(ordinal)
            .with_context(|| format!("--copy cuda on --device {}", args.device))?;
    }
    if device != Device::Cpu && !tch::Cuda::is_available() {
        bail!("--device {}: libtorch sees no CUDA device", args.device);
    }
    Ok(match (copy, tensile_worker::cuda_ordinal(device)) {
        (CopyKind::Cuda, Some(ordinal)) => Engine::Cuda { ordinal },
        _ => Engine::Host,
    })
}

fn graph(args: &Args) -> Result<Graph> {
    if let Some(path) = &args.graph {
        let limits = Limits::default();
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        return json::parse(&bytes, &limits)
            .with_context(|| format!("graph file {}", path.display()));
    }
    let Some(name) = &args.model else {
        bail!("name a zoo model with --model or give --graph FILE");
    };
    let (optimizer, step) =
        tensile_graph::builder::Optimizer::with_step_from_name(&args.optimizer)?;
    let config = ZooConfig {
        resolution: args.resolution,
        optimizer,
        step,
        ..ZooConfig::new(args.batch)
    };
    Ok(zoo::build(name, &config)?)
}

fn host_config(args: &Args) -> Result<HostConfig> {
    let bytes_per_s = match args.link_gbps {
        Some(g) if g.is_finite() && g > 0.0 => Some(g * 1e9),
        Some(g) => bail!("--link-gbps must be a positive number of GB/s, not {g}"),
        None => None,
    };
    if !(args.fault_delay_ms.is_finite() && args.fault_delay_ms >= 0.0) {
        bail!(
            "--fault-delay-ms must be zero or more, not {}",
            args.fault_delay_ms
        );
    }
    if args.fault_fail_every == Some(0) {
        bail!("--fault-fail-every must be at least 1");
    }
    Ok(HostConfig {
        bytes_per_s,
        pool_cap_bytes: args.host_pool_mb.map_or(u64::MAX, Mb::bytes),
        fault_delay: Duration::from_secs_f64(args.fault_delay_ms / 1e3),
        fail_every: args.fault_fail_every,
        ..HostConfig::default()
    })
}

/// One iteration's JSON line: the report, and its copy's number when the
/// process trains several.
#[derive(Serialize)]
struct Line<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    copy: Option<usize>,
    #[serde(flatten)]
    report: &'a IterationReport,
}

fn print(r: &IterationReport, copy: JobCopy, json: bool) -> Result<()> {
    let number = (copy.of > 1).then_some(copy.index);
    if json {
        let line = Line {
            copy: number,
            report: r,
        };
        tensile_cli::try_out(&format!("{}\n", serde_json::to_string(&line)?))?;
    } else {
        let prefix = number.map_or_else(String::new, |n| format!("copy {n}: "));
        // The base only once measured (on CUDA, after the first
        // iterations).
        let base = r.base_bytes.map_or_else(String::new, |b| {
            format!(", base outside the storages {:.1} MB", b as f64 / 1e6)
        });
        tensile_cli::try_out(&format!(
            "{prefix}iteration {}: {:.1} ms, peak {:.1} MB, stalls {:.1} ms, {} passive swaps, {} late prefetches, {} failed copies, {} recomputed ops, {:.1} MB swapped{base}\n",
            r.iteration,
            r.time_ns as f64 / 1e6,
            r.measured_peak_bytes as f64 / 1e6,
            r.stall_ns as f64 / 1e6,
            r.passive_swaps,
            r.late_prefetches,
            r.failed_copies,
            r.recomputed_ops,
            r.swapped_bytes as f64 / 1e6,
        ))?;
    }
    Ok(())
}

fn start_session(args: &Args, g: &Graph, copy: JobCopy, bars: &MultiProgress) -> Result<Session> {
    let device_ordinal = tensile_proto::endpoint::device_ordinal(&args.device);
    // Found again at every connection; once here so that a scheduler that
    // cannot be found is a clear error at once.
    let address =
        tensile_proto::endpoint::resolve_server(args.scheduler.as_deref(), device_ordinal)
            .context("finding the scheduler (--scheduler ADDR names one)")?;
    let tls = args.tls.load()?;
    bars.suspend(|| eprintln!("scheduler: {address}"));
    let say = bars.clone();
    let config = SessionConfig {
        server: args.scheduler.clone(),
        device_ordinal,
        name: copy.name(args.name.as_deref().unwrap_or(g.name())),
        priority: args.priority,
        allow_recompute: None,
        base_bytes: args.base_mb.map(|m| copy.base_share(m.bytes())),
        max_backoff: Duration::from_secs(2),
        call_timeout: None,
        tls,
        // Above the progress bars, as everything else the worker says.
        log: LogSink::new(move |level, message| {
            if level >= Level::Info {
                say.suspend(|| eprintln!("scheduler: {message}"));
            }
        }),
    };
    Session::start(Arc::new(g.clone()), config).context("starting the scheduler session")
}

/// Sets the CUDA allocator's settings from --cuda-alloc-conf, before the
/// first device allocation, unless the environment sets them (PyTorch reads
/// that itself).
fn allocator_settings(conf: &str) -> Result<()> {
    let env = ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"];
    if conf.is_empty() || env.iter().any(|v| std::env::var_os(v).is_some()) {
        return Ok(());
    }
    tensile_kernels::set_allocator_settings(conf).context("--cuda-alloc-conf")
}

fn main() -> Result<()> {
    let args = Args::parse();
    let device = device(&args.device)?;
    if device.is_cuda() {
        allocator_settings(&args.cuda_alloc_conf)?;
    }
    let engine = engine(&args, device)?;
    if let Some(n) = args.threads {
        tch::set_num_threads(n);
    }
    let host = host_config(&args)?;
    if let Some(dir) = &args.ledger {
        // Before the graph and the kernels load: a directory that cannot be
        // made or listed fails at once.
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::read_dir(dir).map(drop))
            .with_context(|| format!("--ledger {}: cannot use the directory", dir.display()))?;
    }
    let g = graph(&args)?;
    let live = Liveness::analyze(&g);
    let copies = usize::from(args.copies);
    // Copies under one budget and no ledger named share a private one,
    // removed when they are done.
    let private = match (&args.ledger, args.memory_mb) {
        (None, Some(_)) if copies > 1 => Some(private_ledger()?),
        _ => None,
    };
    let bars = MultiProgress::new();
    let shared = Shared {
        device,
        engine,
        host,
        ledger: args
            .ledger
            .clone()
            .or_else(|| private.as_ref().map(|d| d.path().to_path_buf())),
        base: Arc::new(base_meter(device, copies, &bars)),
        bars,
    };
    if copies == 1 {
        return run_copy(&args, &g, &live, &shared, JobCopy { index: 0, of: 1 });
    }
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..copies)
            .map(|index| {
                let copy = JobCopy { index, of: copies };
                let (args, g, live, shared) = (&args, &g, &live, &shared);
                std::thread::Builder::new()
                    .name(format!("copy-{index}"))
                    .spawn_scoped(s, move || run_copy(args, g, live, shared, copy))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| match t {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("the copy's thread panicked"))),
                Err(e) => Err(anyhow::Error::new(e).context("starting the copy's thread")),
            })
            .collect()
    });
    // Every copy ran to its end (one that fails does not stop the others);
    // each failure is named.
    let failed: Vec<String> = results
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().err().map(|e| format!("copy {i}: {e:#}")))
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} of {copies} copies failed:\n{}",
            failed.len(),
            failed.join("\n")
        );
    }
    Ok(())
}

/// A fresh ledger directory for this process's copies alone, on tmpfs
/// where there is one.
fn private_ledger() -> Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    let mut b = tempfile::Builder::new();
    b.prefix("tensile-copies-");
    let dir = if shm.is_dir() {
        b.tempdir_in(shm).or_else(|_| b.tempdir())
    } else {
        b.tempdir()
    };
    dir.context("making a ledger for the copies")
}

/// Trains one copy of the job: plan, kernels and initial tensors of its
/// own, its own session with the scheduler, its own files.
fn run_copy(args: &Args, g: &Graph, live: &Liveness, shared: &Shared, copy: JobCopy) -> Result<()> {
    let session = if args.plan.is_none() && !args.vanilla {
        Some(start_session(args, g, copy, &shared.bars)?)
    } else {
        None
    };
    let plan = match (&args.plan, &session) {
        (Some(path), _) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            tensile_proto::plan_json::plan_from_json(&bytes, g)
                .with_context(|| format!("plan file {}", path.display()))?
        }
        (None, Some(session)) => {
            let wait = Duration::try_from_secs_f64(args.plan_timeout_s)
                .context("--plan-timeout-s must be a number of seconds")?;
            let Some(pushed) = session.wait_for_plan(wait) else {
                if let Some(why) = session.gave_up() {
                    bail!("the scheduler refused the job: {why}");
                }
                bail!("no plan from the scheduler within {wait:?}");
            };
            shared.bars.suspend(|| {
                eprintln!(
                    "scheduler: plan version {} of job {}",
                    pushed.version, pushed.job_id
                )
            });
            session.applied(&pushed);
            pushed.plan
        }
        (None, None) => vanilla_plan(live),
    };
    let program = tensile_kernels::Program::new(g, shared.device)
        .with_context(|| format!("graph {:?} cannot run", g.name()))?;
    // Seeded under the kernels' lock on the process's generator, so every
    // copy starts from the same tensors whatever the others draw meanwhile.
    let values = tensile_kernels::initial_values(
        g,
        shared.device,
        args.seed,
        args.init_params.as_deref(),
        args.inputs.as_deref(),
    )?;
    let initial = tensile_worker::initial_of(g, &values);
    let config = WorkerConfig {
        iterations: args.iterations,
        memory_budget_bytes: args.memory_mb.map(Mb::bytes),
        host: shared.host,
        engine: shared.engine,
        // A plan's run holds --memory-mb with the executor's guard;
        // vanilla runs out of memory past it, as a GPU would.
        guard: !args.vanilla,
        ledger: shared.ledger.clone(),
    };
    let mut worker = Worker::new(g, live, &plan, program, initial, config)?;
    worker.set_base_meter(shared.base.clone(), copy.index);
    if g.has_host_ops() {
        // Updates kept on the host run the CPU kernels over the host
        // copies, whatever the device.
        let host = tensile_kernels::Program::new(g, Device::Cpu)
            .with_context(|| format!("graph {:?}: its host ops cannot run", g.name()))?;
        worker.set_host_kernels(host);
    }
    let bar = shared.bars.add(
        ProgressBar::new(args.iterations as u64).with_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} iterations ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        ),
    );
    bar.set_message(copy.name(g.name()));
    let mut trace = match &args.memory_trace {
        Some(path) => {
            worker.record_memory();
            let path = copy.path(path);
            let file = std::fs::File::create(&path)
                .with_context(|| format!("creating {}", path.display()))?;
            Some(std::io::BufWriter::new(file))
        }
        None => None,
    };
    let mut printed = Ok(());
    worker.run(|r| {
        bar.inc(1);
        shared.bars.suspend(|| {
            if printed.is_ok() {
                printed = print(r, copy, args.json);
            }
            if let (Some(out), true) = (&mut trace, printed.is_ok()) {
                printed = tensile_executor::trace::write_csv(out, &r.memory).map_err(Into::into);
            }
        });
        let pushed = session.as_ref()?.iteration_done(r.to_session_report())?;
        shared.bars.suspend(|| {
            eprintln!(
                "scheduler: plan version {} of job {} from the next iteration",
                pushed.version, pushed.job_id
            )
        });
        Some(pushed.plan)
    })?;
    bar.finish_and_clear();
    match printed {
        // Stdout's reader went away (`| head`): the job still trained to
        // its end, which matters more than its log; nothing failed.
        Err(e)
            if e.downcast_ref::<tensile_cli::StdoutError>()
                .is_some_and(tensile_cli::StdoutError::reader_gone) => {}
        other => other?,
    }
    if let Some(path) = &args.save_params {
        let path = copy.path(path);
        let values = worker.persistent_values()?;
        tensile_worker::save_params(g, values, &path)?;
        shared
            .bars
            .suspend(|| eprintln!("parameters written to {}", path.display()));
    }
    // The device memory goes before the scheduler hears the job is done
    // (which may take seconds): the other jobs of the device get it now,
    // and the trace says when it went.
    let rest = worker.close();
    if let Some(mut out) = trace {
        tensile_executor::trace::write_csv(&mut out, &rest)?;
    }
    if let Some(session) = session {
        session.finish(Duration::from_secs(5));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copys_files_carry_its_number_before_the_extension() {
        let one = JobCopy { index: 0, of: 1 };
        let second = JobCopy { index: 1, of: 3 };
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(one.path(&p("out/trace.csv")), p("out/trace.csv"));
        assert_eq!(second.path(&p("out/trace.csv")), p("out/trace.1.csv"));
        assert_eq!(second.path(&p("trace")), p("trace.1"));
        assert_eq!(second.path(&p("a.b.pt")), p("a.b.1.pt"));
        assert_eq!(
            (one.name("r50"), second.name("r50")),
            ("r50".into(), "r50-1".into())
        );
        // Shares of the base add up to at least the whole.
        assert_eq!(second.base_share(1_000_000_001), 333_333_334);
    }
}
