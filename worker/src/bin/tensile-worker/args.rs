//! The worker's flags (clap): what a person types, parsed; checked and
//! turned into the run's parts in `setup.rs`.

use std::path::PathBuf;

use clap::{ArgGroup, Parser, ValueEnum};
use tensile_cli::Mb;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CopyKind {
    /// Real bytes to a capped pool of host buffers on copy threads.
    Host,
    /// A CUDA stream and a pinned pool (needs a GPU build and a GPU).
    Cuda,
}

/// Trains one job with real kernels under a plan (or none), standalone.
#[derive(Debug, Parser)]
#[command(name = "tensile-worker", version)]
#[command(group(ArgGroup::new("job").required(true).args(["model", "graph", "jobs"])))]
#[command(group(ArgGroup::new("policy").args(["plan", "vanilla", "scheduler"])))]
pub(crate) struct Args {
    /// Zoo model name (see `tensilectl zoo`).
    #[arg(long)]
    pub(crate) model: Option<String>,
    /// Batch size of the zoo model.
    #[arg(long, default_value_t = 16, requires = "model")]
    pub(crate) batch: u64,
    /// Image side (CNNs) or sequence length (BERT) of the zoo model.
    #[arg(long, requires = "model")]
    pub(crate) resolution: Option<u64>,
    /// Optimizer of the zoo model's iteration: adam or sgd; with
    /// `-in-backward` (adam-in-backward), each parameter's update runs as
    /// soon as its gradient is final, inside the backward pass; with
    /// `-on-host` (adam-on-host), so too, but on the host CPU, the
    /// optimizer's state kept there.
    #[arg(long, default_value = "adam", requires = "model")]
    pub(crate) optimizer: String,
    /// A JSON graph file (traced or exported) instead of a zoo model.
    #[arg(long)]
    pub(crate) graph: Option<PathBuf>,
    /// A plan file (tensile-plan/v1, from `tensilectl plan -o`).
    #[arg(long)]
    pub(crate) plan: Option<PathBuf>,
    /// No plan: free every tensor after its last use, as PyTorch does.
    #[arg(long)]
    pub(crate) vanilla: bool,
    /// Plans from the scheduler at ADDR (`unix:PATH`, `HOST:PORT`,
    /// `https://HOST:PORT`; TLS by the --tls-ca rule below); with
    /// neither --plan nor --vanilla, the one clients find by default:
    /// TENSILE_SERVER, else the socket of this job's GPU in the socket
    /// directory's gpus.json (--device cuda:N, through
    /// CUDA_VISIBLE_DEVICES; 0 on the CPU), else the default socket.
    #[arg(long, value_name = "ADDR")]
    pub(crate) scheduler: Option<String>,
    #[command(flatten)]
    pub(crate) tls: tensile_cli::tls::ClientTlsArgs,
    /// The job's name in the scheduler's status (default: the graph's).
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Admission priority among queued jobs (higher first).
    #[arg(long, default_value_t = 0)]
    pub(crate) priority: i32,
    /// Device memory this process holds outside its tensors' storages, MB
    /// (CUDA context, library handles, the allocator's slack), which the
    /// scheduler plans beside the job's tensors: measure it on the GPU as
    /// nvidia-smi's figure for a run less the peak it prints, under a plan
    /// and beside the other jobs where possible (the allocator then holds
    /// more than for a vanilla run alone). Unset: the scheduler's device
    /// profile says. On CUDA the worker measures it itself after its first
    /// iterations (NVML's figure for the process less the storages' peak)
    /// and reports it; the scheduler plans with the measured figure when
    /// it differs materially from this one. With several jobs in this
    /// process (--copies, --job), the whole process's, which the scheduler
    /// counts once for them.
    #[arg(long, value_name = "MB", value_parser = tensile_cli::parse_positive_mb, allow_negative_numbers = true)]
    pub(crate) base_mb: Option<Mb>,
    /// How long to wait for the scheduler's first plan (queued jobs wait
    /// here), seconds.
    #[arg(long, default_value_t = 600.0)]
    pub(crate) plan_timeout_s: f64,
    #[arg(long, default_value_t = 1)]
    pub(crate) iterations: usize,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub(crate) device: String,
    /// The copy engine (default: by device: cuda on a CUDA device, host on
    /// the CPU).
    #[arg(long, value_enum)]
    pub(crate) copy: Option<CopyKind>,
    /// Bandwidth of the host engine per direction, GB/s (unset: as fast as
    /// memory goes).
    #[arg(long)]
    pub(crate) link_gbps: Option<f64>,
    /// Most host memory the engine's pool holds, MB of 10^6 bytes (unset:
    /// no cap).
    #[arg(long, value_name = "MB", allow_negative_numbers = true)]
    pub(crate) host_pool_mb: Option<Mb>,
    /// The device memory budget, MB of 10^6 bytes (as the scheduler's
    /// --budget-mb), for the tensors' storages. Under a plan (a file or the
    /// scheduler's) the executor's guard holds it: an allocation past it
    /// waits for the job's own frees, then moves what the job uses last to
    /// the host; it fails only when even that cannot make room. With
    /// --vanilla an allocation past it fails, as a GPU's out-of-memory
    /// would. With --ledger, the budget of all the workers on the ledger
    /// together.
    #[arg(long, value_name = "MB", allow_negative_numbers = true)]
    pub(crate) memory_mb: Option<Mb>,
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
    pub(crate) ledger: Option<PathBuf>,
    /// Seed of the initial tensors not read from files.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: i64,
    /// Initial parameters (and buffers, optimizer state) by name.
    #[arg(long)]
    pub(crate) init_params: Option<PathBuf>,
    /// The graph's input tensors by name, used every iteration.
    #[arg(long)]
    pub(crate) inputs: Option<PathBuf>,
    /// Write the parameters and buffers after the last iteration here.
    #[arg(long)]
    pub(crate) save_params: Option<PathBuf>,
    /// Append resident device bytes at every change to this file, one
    /// `unix_time_s,bytes` line each (for plots of memory over time).
    #[arg(long, value_name = "FILE")]
    pub(crate) memory_trace: Option<PathBuf>,
    /// One JSON object per iteration on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Fault injection: every copy takes this much longer, ms.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) fault_delay_ms: f64,
    /// Fault injection: every N-th copy fails.
    #[arg(long)]
    pub(crate) fault_fail_every: Option<u64>,
    /// The CUDA caching allocator's settings, in PYTORCH_ALLOC_CONF's
    /// syntax; ignored when PYTORCH_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF is
    /// set. Expandable segments return what a job frees to one growing
    /// mapping instead of caching fixed blocks, so a process holds close to
    /// what its tensors need (on an H200, ResNet-50 b32 peaked at 3764 MiB
    /// against 4382 without). "" leaves PyTorch's defaults.
    #[arg(long, value_name = "CONF", default_value = "expandable_segments:True")]
    pub(crate) cuda_alloc_conf: String,
    /// Threads of the CPU kernels (unset: libtorch's default).
    #[arg(long)]
    pub(crate) threads: Option<i32>,
    /// Train N copies of the job at once in this process, each on a thread
    /// of its own and each a job of its own (its own plan, copies and
    /// guard; at the scheduler, named NAME-0, NAME-1, ...). On a GPU the
    /// copies share one CUDA context, the libraries' handles and one
    /// caching allocator, so the memory a process holds outside its
    /// tensors (--base-mb) is paid once, not once per job: --base-mb is
    /// then the whole process's, and so is the base the process measures:
    /// the copies register as jobs of one process, whose base the
    /// scheduler counts once. They share
    /// --memory-mb through --ledger, or through a private ledger of their
    /// own when none is named. Every copy starts from the same tensors
    /// (--seed, --init-params, --inputs). --memory-trace and --save-params
    /// get the copy's number before the extension (trace.csv:
    /// trace.0.csv, trace.1.csv, ...); with --json each line names its
    /// copy ("copy": N), without, each line starts with "copy N:".
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) copies: u16,
    /// One job of several different ones this process trains at once,
    /// repeated (in place of --model or --graph): KEY=VALUE pairs joined by
    /// commas, e.g. `--job model=resnet50,batch=32 --job
    /// model=bert_base,batch=8,resolution=128`. Keys: model or graph (one
    /// of them), batch (default 16), resolution, optimizer (default adam),
    /// plan (the job's plan file; else --vanilla or the scheduler, for all
    /// the jobs), name (default: the graph's and the job's number), priority,
    /// seed, init-params and inputs (default: the flags'), save-params and
    /// memory-trace (default: the flags' with the job's number before the
    /// extension). As with --copies, each job is a job of its own on a
    /// thread of its own (its own plan, copies, guard, and at the scheduler
    /// its own registration, plan stream and lease), and on a GPU they
    /// share the process's CUDA context, handles and caching allocator, so
    /// the process's base (--base-mb, or measured) is paid once: the
    /// scheduler counts it once for the jobs of this process. They share
    /// --memory-mb through --ledger, or through a private ledger of their
    /// own when none is named. With --json each line names its job ("job":
    /// N, by the order of the --job flags), without, each line starts with
    /// "job N:".
    #[arg(long = "job", value_name = "SPEC", num_args = 1,
          conflicts_with_all = ["model", "graph", "copies", "plan", "name"])]
    pub(crate) jobs: Vec<String>,
}
