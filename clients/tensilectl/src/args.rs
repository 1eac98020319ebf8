//! Command-line arguments (clap), kept apart from what the commands do.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use tensile_cli::Mb;
use tensile_planner::RecomputeFirst;

/// Client of the TENSILE memory scheduler: model zoo and graph tools.
#[derive(Debug, Parser)]
#[command(name = "tensilectl", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// The built-in models: parameter counts and, per model, the graph of one
    /// training iteration (ops, tensors, vanilla peak) at a batch size.
    Zoo(ZooArgs),
    /// Inspect, export and validate compute graphs.
    #[command(subcommand)]
    Graph(GraphCommand),
    /// Plan one job (a zoo model or a graph file): predicted vanilla and
    /// planned peaks, events, time.
    Plan(PlanArgs),
    /// Simulate jobs sharing one GPU under a policy, against vanilla.
    Sim(SimArgs),
    /// The learned op-latency predictor: evaluate models. Profiling kernels
    /// and training models link libtorch: `tensile-latency profile|train`.
    #[command(subcommand)]
    Latency(LatencyCommand),
    /// Benchmarks that print figures side by side.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// The real system on this machine: a scheduler and one worker per job
    /// (real kernels on the CPU, real copies), a live table, then the same
    /// jobs without plans, side by side, and memory over time as a plot.
    Demo(DemoArgs),
    /// The scheduler's jobs, their states and plan versions, predicted and
    /// reported peaks, and the memory picture.
    Status(StatusArgs),
    /// Set the scheduler's memory budget (needs the admin token when the
    /// scheduler has one: TENSILE_ADMIN_TOKEN or --admin-token-file).
    Budget(BudgetArgs),
    /// Print a job's plan versions as they arrive.
    Watch(WatchArgs),
}

#[derive(Debug, Clone, Args)]
pub(crate) struct DemoArgs {
    /// The jobs, MODEL:BATCH:RESOLUTION each (zoo models). The default is
    /// three copies of one model, as in a hyper-parameter sweep: copies
    /// iterate alike, so the scheduler can gate them on one period.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "resnet50:4:96,resnet50:4:96,resnet50:4:96"
    )]
    pub(crate) jobs: Vec<String>,
    /// Training iterations per job.
    #[arg(long, default_value_t = 12)]
    pub(crate) iterations: usize,
    /// The memory budget the jobs share, MB of 10^6 bytes, decimals allowed
    /// (default: --budget-fraction of the sum of their vanilla peaks).
    #[arg(long, value_name = "MB", value_parser = tensile_cli::parse_positive_mb,
          allow_negative_numbers = true)]
    pub(crate) budget_mb: Option<Mb>,
    #[arg(long, default_value_t = 0.8)]
    pub(crate) budget_fraction: f64,
    /// The host copy engine's bandwidth per direction, GB/s: scaled so that
    /// copy time against compute time resembles a GPU's (docs/usage.md).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) link_gbps: f64,
    /// Kernel threads per worker.
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: u32,
    /// The scheduler's gate slack (its --gate-slack): a CPU shared by the
    /// workers' kernels and copies jitters by a few percent.
    #[arg(long, default_value_t = 0.1)]
    pub(crate) gate_slack: f64,
    /// Plan the jobs free-running (the scheduler's --no-gates).
    #[arg(long)]
    pub(crate) no_gates: bool,
    /// Where the memory plot goes (SVG).
    #[arg(long, default_value = "target/tensile-demo.svg")]
    pub(crate) plot: PathBuf,
    /// The folder holding tensile-scheduler and tensile-worker (default:
    /// this executable's).
    #[arg(long)]
    pub(crate) bin_dir: Option<PathBuf>,
    /// Keep the run's folder (logs, per-iteration JSON, memory traces).
    /// The scheduler logs at the filter in RUST_LOG (default `info`;
    /// `info,tensile_scheduler::planning=debug` adds why each re-plan was
    /// due).
    #[arg(long)]
    pub(crate) keep_logs: bool,
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[arg(long, env = "TENSILE_SERVER")]
    /// The scheduler: unix:PATH, HOST:PORT or https://HOST:PORT (TLS:
    /// see --tls-ca). Default: every GPU the
    /// scheduler of the socket directory serves (its gpus.json), a section
    /// each; else its default socket.
    pub(crate) server: Option<String>,
    /// Only this GPU of gpus.json: its index or uuid (prefix).
    #[arg(long, conflicts_with = "server")]
    pub(crate) gpu: Option<String>,
    /// Only this job.
    #[arg(long)]
    pub(crate) job: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) tls: tensile_cli::tls::ClientTlsArgs,
}

#[derive(Debug, Args)]
pub(crate) struct BudgetArgs {
    /// The new budget, MB (10^6 bytes; decimals allowed).
    #[arg(value_parser = tensile_cli::parse_positive_mb,
          allow_negative_numbers = true)]
    pub(crate) mb: Mb,
    /// The scheduler: unix:PATH, HOST:PORT or https://HOST:PORT (TLS:
    /// see --tls-ca). Default: the one GPU of
    /// gpus.json (with several, name one with --gpu), else the default
    /// socket.
    #[arg(long, env = "TENSILE_SERVER")]
    pub(crate) server: Option<String>,
    /// The GPU of gpus.json whose budget this is: its index or uuid
    /// (prefix).
    #[arg(long, conflicts_with = "server")]
    pub(crate) gpu: Option<String>,
    /// A file holding the scheduler's admin token.
    #[arg(long, env = "TENSILE_ADMIN_TOKEN_FILE")]
    pub(crate) admin_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) tls: tensile_cli::tls::ClientTlsArgs,
}

#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    /// The job's id.
    pub(crate) job: u64,
    /// The scheduler: unix:PATH, HOST:PORT or https://HOST:PORT (TLS:
    /// see --tls-ca). Default: the GPU of
    /// gpus.json that has the job, else the default socket.
    #[arg(long, env = "TENSILE_SERVER")]
    pub(crate) server: Option<String>,
    /// The GPU of gpus.json the job is on: its index or uuid (prefix).
    #[arg(long, conflicts_with = "server")]
    pub(crate) gpu: Option<String>,
    /// The job's token: follow its plan stream. Without it, the job's
    /// status is polled.
    #[arg(long, env = "TENSILE_JOB_TOKEN")]
    pub(crate) token: Option<String>,
    #[command(flatten)]
    pub(crate) tls: tensile_cli::tls::ClientTlsArgs,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// The TENSILE paper's experiments (Tables I, III, IV; Figs. 6, 7) for
    /// ours and every baseline, on simulated devices, with the paper's
    /// figures beside ours.
    Paper(BenchPaperArgs),
    /// The scheduler service under load: 1, 8, 64 simulated workers over a
    /// real socket, each registering a zoo job at batch 2 and reporting
    /// every iteration; register-to-first-plan and re-plan latency, plans
    /// per second, the scheduler's resident memory. With --gpus N: a
    /// simulated node, one scheduler serving N simulated GPUs and --jobs
    /// jobs arriving over time (a seeded Poisson process), each on a GPU,
    /// running --iterations and leaving; figures per GPU and overall.
    Service(BenchServiceArgs),
    /// Several copies of a model on one simulated GPU whose memory is ONE
    /// copy's vanilla peak at a reference batch: per case, k copies at
    /// fractions of that batch planned by ours under that budget and run
    /// beside the same jobs co-located with no limit; per row the measured
    /// and predicted peaks, the lowest peak any time-free swap plan could
    /// reach, EOR (steady state) and whether it fits; per case the
    /// capacity (the largest fraction every seed fits at EOR <= 0.05).
    Colocate(BenchColocateArgs),
    /// The joint planner's scaling: for each job count, one joint plan of
    /// that many zoo jobs at batch 2 on the a6000 (the jobs `bench
    /// service` registers, planned as the scheduler plans them, its memory
    /// the budget); wall time, moves tried, rounds, whether it was capped,
    /// the sum of the planned peaks against the budget.
    Planner(BenchPlannerArgs),
}

#[derive(Debug, Args)]
pub(crate) struct BenchColocateArgs {
    /// Device profiles, comma separated (a6000, h100, h200, paper, cpu or
    /// files). Default: a6000,h100; with --sweep a6000,h100,h200.
    #[arg(long, visible_alias = "devices")]
    pub(crate) device: Option<String>,
    /// Cases, comma separated, each MODEL:BATCHxCOPIES[:OPTIMIZER] (the
    /// budget is one copy's vanilla peak at BATCH; OPTIMIZER as
    /// `--optimizer` of `sim` names it, adam by default). Default:
    /// resnet50:32x2,resnet50:32x3,bert_base:16x2,
    /// bert_base:16x2:adam-in-backward,bert_base:16x2:adam-on-host.
    #[arg(long, conflicts_with = "sweep")]
    pub(crate) cases: Option<String>,
    /// Fractions of the reference batch, comma separated, in (0, 1].
    #[arg(long, default_value = "0.5,0.625,0.75,0.875,1")]
    pub(crate) fractions: String,
    /// Seeds of the simulated devices' latency bias, comma separated;
    /// FIRST..LAST is a range. Default: 1,2,3; with --sweep 1..8.
    #[arg(long)]
    pub(crate) seeds: Option<String>,
    /// A sweep instead of cases: every model of --models x2 and x3 (one
    /// copy's vanilla peak the budget) and every pair of two of them (the
    /// larger one's peak), per case the capacity beside the capacity the
    /// swap bound allows at the jobs' best phases (a period 5% over the
    /// longest iteration), the runs over the budget and slower than turns,
    /// whether fits are monotonic, and a summary against the targets.
    #[arg(long)]
    pub(crate) sweep: bool,
    /// With --sweep: zoo models, comma separated, each MODEL[:BATCH] (the
    /// reference batch: 32 for CNNs, 16 for BERT by default). Default:
    /// the whole zoo.
    #[arg(long, requires = "sweep")]
    pub(crate) models: Option<String>,
    /// With --sweep: copies of each model, comma separated (default 2,3).
    #[arg(long, requires = "sweep")]
    pub(crate) copies: Option<String>,
    /// With --sweep: leave out the pairs of different models.
    #[arg(long, requires = "sweep")]
    pub(crate) no_pairs: bool,
    /// With --sweep: steps of the period on which the bound scans each
    /// job's phase (two and three jobs; default 16).
    #[arg(long, requires = "sweep")]
    pub(crate) bound_grid: Option<u64>,
    /// With --sweep: append each run to FILE as one JSON line as soon as
    /// it is done (the first line the settings). Given a FILE that exists,
    /// the sweep goes on with it: the runs it has are not run again, and
    /// the summary is over its rows and the new ones (the settings must be
    /// the same: --iterations, --warmup, --bound-grid, --recompute-first).
    #[arg(long, requires = "sweep", value_name = "FILE")]
    pub(crate) out: Option<PathBuf>,
    /// Iterations per run.
    #[arg(long, default_value_t = 12)]
    pub(crate) iterations: usize,
    /// Iterations left out of the steady-state EOR (the cold start and the
    /// gates taking hold).
    #[arg(long, default_value_t = 4)]
    pub(crate) warmup: usize,
    /// Runs in parallel on at most this many threads.
    #[arg(long, default_value_t = 2)]
    pub(crate) jobs: usize,
    /// Which coordinated jobs that swaps alone leave over the budget are
    /// planned again, recomputing first and swapping around the
    /// recomputations, keeping the lower plan (several times the planning
    /// time): never, many-jobs (three jobs or more) or always;
    /// `--recompute-first` alone is always.
    #[arg(long, value_parser = RecomputeFirst::parse, num_args = 0..=1,
          default_value = "many-jobs", default_missing_value = "always")]
    pub(crate) recompute_first: RecomputeFirst,
    /// Run each case's copies as threads of one process (`tensile-worker
    /// --copies`), which pay the device's base (CUDA context, library
    /// handles) once, a share each, instead of a process per copy, each
    /// with its own base. The budget stays one copy alone, with its base.
    #[arg(long)]
    pub(crate) one_process: bool,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Draw the capacity of every case per device (SVG) here; with
    /// --sweep, each case's capacity beside the bound's.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct BenchServiceArgs {
    /// A running scheduler (unix:PATH or HOST:PORT). Default: start
    /// `tensile-scheduler` (beside this binary) on a temporary socket for
    /// each worker count.
    #[arg(long)]
    pub(crate) server: Option<String>,
    /// The scheduler binary to start. Default: `tensile-scheduler` beside
    /// this binary.
    #[arg(long, conflicts_with = "server")]
    pub(crate) scheduler_bin: Option<PathBuf>,
    /// Worker counts, comma separated.
    #[arg(long, default_value = "1,8,64")]
    pub(crate) workers: String,
    /// Iterations each worker reports. Default: 6; with --gpus 10.
    #[arg(long)]
    pub(crate) iterations: Option<usize>,
    /// Zoo models the workers cycle through (batch 2).
    #[arg(long, default_value = crate::bench_service::MODELS)]
    pub(crate) models: String,
    /// A simulated node: one scheduler serving this many simulated GPUs
    /// (`--gpus 0,...,N-1`, a planning domain and a socket each, from
    /// gpus.json), 1 to 64, and --jobs jobs arriving over time instead of
    /// --workers all at once. Each job is placed on a GPU (--placement),
    /// waits for its first plan, reports --iterations iterations
    /// --iteration-ms apart (latencies alternating between the roofline
    /// and twice it, so that each report asks for a re-plan; the job does
    /// not wait for it, as a worker keeps running its plan), waits for the
    /// re-plans it asked for, unregisters and closes its connection.
    #[arg(long, conflicts_with_all = ["server", "workers"])]
    pub(crate) gpus: Option<usize>,
    /// With --gpus: job counts, comma separated, a run each (1 to 1024).
    #[arg(long, requires = "gpus", default_value = "1024")]
    pub(crate) jobs: String,
    /// With --gpus: jobs arrive at this mean rate, per second (a seeded
    /// Poisson process). Default: --jobs over --arrival-s.
    #[arg(long, requires = "gpus")]
    pub(crate) rate: Option<f64>,
    /// With --gpus and no --rate: the jobs of each run arrive over about
    /// this many seconds (the rate is the job count over it, so that more
    /// jobs are more load).
    #[arg(
        long,
        requires = "gpus",
        conflicts_with = "rate",
        default_value_t = 120.0
    )]
    pub(crate) arrival_s: f64,
    /// With --gpus: a simulated iteration's time, ms.
    #[arg(long, requires = "gpus", default_value_t = 500)]
    pub(crate) iteration_ms: u64,
    /// With --gpus: the seed of the arrivals.
    #[arg(long, requires = "gpus", default_value_t = 1)]
    pub(crate) seed: u64,
    /// With --gpus: which GPU an arriving job goes to: the one with the
    /// fewest jobs of this bench on it (lowest index on a tie), or each
    /// in turn.
    #[arg(long, requires = "gpus", value_enum, default_value = "least-loaded")]
    pub(crate) placement: Placement,
    /// With --gpus: the GPUs of a running scheduler, from gpus.json in
    /// this directory (its first --gpus GPUs), instead of starting one
    /// (then no resident memory nor metrics are read).
    #[arg(long, requires = "gpus", conflicts_with = "scheduler_bin")]
    pub(crate) socket_dir: Option<PathBuf>,
    /// With --gpus, for the scheduler started here: each GPU's memory
    /// budget, MB (10^6 bytes). Default: the a6000 profile's memory.
    #[arg(long, requires = "gpus", conflicts_with = "socket_dir", value_name = "MB",
          value_parser = tensile_cli::parse_positive_mb, allow_negative_numbers = true)]
    pub(crate) budget_mb: Option<Mb>,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Where `bench service --gpus` places an arriving job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Placement {
    LeastLoaded,
    RoundRobin,
}

#[derive(Debug, Args)]
pub(crate) struct BenchPlannerArgs {
    /// Job counts, comma separated: for each, one joint plan of that many
    /// jobs.
    #[arg(long, default_value = "8,16,32,64,128,256")]
    pub(crate) jobs: String,
    /// Zoo models the jobs cycle through (batch 2), as `bench service`'s
    /// workers do.
    #[arg(long, default_value = crate::bench_service::MODELS)]
    pub(crate) models: String,
    /// Cap each plan at this many seconds of wall clock (the planner's
    /// `time_cap`). Default: no cap.
    #[arg(long)]
    pub(crate) time_cap_s: Option<f64>,
    /// Bound each plan's work at this many moves tried (the planner's
    /// `max_moves`, the scheduler's `--plan-max-moves`). Default: no bound.
    #[arg(long)]
    pub(crate) max_moves: Option<u64>,
    /// Plan every job free-running, never gated nor taking turns (the
    /// scheduler's `--no-gates`).
    #[arg(long)]
    pub(crate) no_gates: bool,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct BenchPaperArgs {
    /// Device profiles, comma separated (a6000, h100, h200, paper, cpu or
    /// files).
    #[arg(long, default_value = "a6000,h100,paper")]
    pub(crate) device: String,
    /// Policies besides vanilla, comma separated (ours always runs).
    #[arg(
        long,
        default_value = "tensile,vdnn-conv,capuchin,save-on-cpu,offload-stream,checkpoint-blocks,knapsack"
    )]
    pub(crate) policies: String,
    /// Iterations per run: the first is the cold start, the rest are
    /// averaged.
    #[arg(long, default_value_t = 4)]
    pub(crate) iterations: usize,
    /// Seed of the devices' latency bias and of the mixed workload's order.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// The knapsack policy's activation budget.
    #[arg(long, default_value_t = 0.5)]
    pub(crate) activation_budget: f64,
    #[command(flatten)]
    pub(crate) opt: OptimizerArg,
    /// Only ResNet-50 (and the mixed five) at fewer batch sizes: a smoke run.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Simulations run in parallel on at most this many threads.
    #[arg(long, default_value_t = 4)]
    pub(crate) jobs: usize,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write the figures as SVG files into this directory.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum LatencyCommand {
    /// Accuracy on held-out shapes and prediction time per zoo model.
    Eval(EvalArgs),
}

#[derive(Debug, Args)]
pub(crate) struct EvalArgs {
    /// Model directory; the shipped CPU models when absent.
    #[arg(long)]
    pub(crate) models: Option<PathBuf>,
    /// Samples to evaluate on; the held-out samples of the model directory
    /// when absent.
    #[arg(long)]
    pub(crate) data: Option<PathBuf>,
    /// The ONNX Runtime shared library; default: ORT_DYLIB_PATH, else the
    /// `.venv` library this binary was built against.
    #[arg(long, env = "ORT_DYLIB_PATH")]
    pub(crate) ort_lib: Option<PathBuf>,
    /// Batch size of the zoo graphs whose prediction is timed.
    #[arg(long, default_value_t = 16)]
    pub(crate) batch: u64,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct PlanArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// A JSON graph file (`-` for standard input), instead of --model.
    #[arg(conflicts_with = "model")]
    pub(crate) file: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) device: DeviceArgs,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also write the plan itself here: every event, the prediction and
    /// the diagnostics (`tensile-plan/v1`, see `docs/plan-format.md`).
    #[arg(short, long)]
    pub(crate) output: Option<PathBuf>,
    /// Have this scheduler plan it (PlanGraph): unix:PATH, HOST:PORT or
    /// https://HOST:PORT (TLS: see --tls-ca),
    /// or `default` for the one clients find by default (TENSILE_SERVER,
    /// else GPU 0's socket in gpus.json, else the default socket).
    #[arg(long)]
    pub(crate) server: Option<String>,
    /// Plan without recomputation (swaps only), for a runtime that cannot
    /// recompute.
    #[arg(long)]
    pub(crate) no_recompute: bool,
    #[command(flatten)]
    pub(crate) tls: tensile_cli::tls::ClientTlsArgs,
}

#[derive(Debug, Args)]
pub(crate) struct DeviceArgs {
    /// Device profile: a6000, h100, h200, paper, cpu (the CPU the shipped
    /// latency models were measured on), or a JSON profile file.
    #[arg(long, default_value = "a6000")]
    pub(crate) device: String,
    /// Recompute while the jobs' planned peaks add up to more than this
    /// (MB of 10^6 bytes, decimals allowed).
    #[arg(long, value_name = "MB", value_parser = tensile_cli::parse_positive_mb,
          allow_negative_numbers = true)]
    pub(crate) budget_mb: Option<Mb>,
    /// Stop planning once the jobs' planned peaks fit the budget (save only
    /// what must be saved) instead of swapping all that can be hidden.
    #[arg(long, requires = "budget_mb")]
    pub(crate) stop_at_budget: bool,
    /// Seed of the simulated device's per-op latency bias.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Plan from the true latencies instead of the cold-start estimate.
    #[arg(long)]
    pub(crate) exact: bool,
    /// Where ours takes its cold-start latencies from: `auto` (the learned
    /// models trained for this device, if any: the shipped ones are for
    /// `--device cpu`; else the roofline estimate), `roofline`, or a model
    /// directory (`tensile-latency train --out DIR`).
    #[arg(long, default_value = "auto")]
    pub(crate) latency_models: String,
}

#[derive(Debug, Args)]
pub(crate) struct SimArgs {
    /// Jobs, comma separated: a zoo model as MODEL:BATCH, or a JSON graph
    /// file (an entry with a `/`, ending in `.json`, or naming an existing
    /// file), e.g. resnet50:16,vgg16:2,traced/bert.json.
    #[arg(long, default_value = "resnet50:2,vgg16:2,inception_v3:2")]
    pub(crate) jobs: String,
    /// `tensile` (ours), `vanilla` (free after last use), or a baseline:
    /// `vdnn-conv`, `capuchin`, `save-on-cpu`, `offload-stream`,
    /// `checkpoint-blocks`, `knapsack`. Capuchin's budget: `--budget-mb`
    /// split over the jobs by their vanilla peaks, else each job's peak
    /// under ours.
    #[arg(long, default_value = "tensile")]
    pub(crate) policy: String,
    /// The knapsack policy's activation budget: the fraction of the saved
    /// activations' bytes it may keep (torch.compile's
    /// `activation_memory_budget`).
    #[arg(long, default_value_t = 0.5)]
    pub(crate) activation_budget: f64,
    #[command(flatten)]
    pub(crate) device: DeviceArgs,
    /// Iterations per job.
    #[arg(long, default_value_t = 10)]
    pub(crate) iterations: usize,
    #[command(flatten)]
    pub(crate) opt: OptimizerArg,
    /// Turn off the slowdown of kernels that share the GPU.
    #[arg(long)]
    pub(crate) no_sharing: bool,
    /// Let ours plan two jobs or more as free-running jobs (each on its
    /// share of the link, the budget on the sum of their peaks) instead of
    /// gating their iterations so that their memory curves interleave.
    #[arg(long)]
    pub(crate) no_gates: bool,
    /// Which coordinated jobs that swaps alone leave over the budget are
    /// planned again, recomputing first and swapping around the
    /// recomputations, keeping the lower plan (several times the planning
    /// time): never, many-jobs (three jobs or more) or always;
    /// `--recompute-first` alone is always.
    #[arg(long, value_parser = RecomputeFirst::parse, num_args = 0..=1,
          default_value = "many-jobs", default_missing_value = "always")]
    pub(crate) recompute_first: RecomputeFirst,
    /// The jobs are threads of one process (`tensile-worker --copies`):
    /// they pay the device's base (CUDA context, library handles) once, a
    /// share each, instead of once per job.
    #[arg(long)]
    pub(crate) one_process: bool,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Draw memory over time (vanilla and planned, per job and total) here.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum GraphCommand {
    /// Ops, tensors, parameters and the vanilla peak of a graph.
    Stats(StatsArgs),
    /// Write a zoo model's graph as JSON.
    Export(ExportArgs),
    /// Validate a JSON graph file: exit 0 when valid, 1 with the reason when not.
    Check(CheckArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ZooArgs {
    /// Batch size of the graphs whose statistics are printed.
    #[arg(long, default_value_t = 16)]
    pub(crate) batch: u64,
    #[command(flatten)]
    pub(crate) opt: OptimizerArg,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Which zoo model to build, and how.
#[derive(Debug, Args)]
pub(crate) struct ModelArgs {
    /// Zoo model name (see `tensilectl zoo`).
    #[arg(long)]
    pub(crate) model: Option<String>,
    /// Batch size.
    #[arg(long, default_value_t = 16)]
    pub(crate) batch: u64,
    /// Image side (CNNs) or sequence length (BERT); default: the model's own.
    #[arg(long)]
    pub(crate) resolution: Option<u64>,
    /// Number of classes; default: the model's own.
    #[arg(long)]
    pub(crate) classes: Option<u64>,
    #[command(flatten)]
    pub(crate) opt: OptimizerArg,
}

#[derive(Debug, Args)]
pub(crate) struct OptimizerArg {
    /// Optimizer of the iteration: `adam` or `sgd` (with momentum); with
    /// `-in-backward` (`adam-in-backward`), each parameter's update runs as
    /// soon as its gradient is final, inside the backward pass (PyTorch's
    /// post-accumulate-grad hook pattern), instead of after it; with
    /// `-on-host` (`adam-on-host`), so too, but on the host CPU, with the
    /// optimizer's state kept there (ZeRO-Offload's CPU optimizer): the
    /// gradient goes out, the updated parameter comes back.
    #[arg(long, default_value = "adam")]
    pub(crate) optimizer: String,
}

#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// A JSON graph file (`-` for standard input), instead of --model.
    #[arg(conflicts_with = "model")]
    pub(crate) file: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Write here instead of standard output.
    #[arg(short, long)]
    pub(crate) output: Option<PathBuf>,
    /// One line instead of pretty-printed JSON.
    #[arg(long)]
    pub(crate) compact: bool,
}

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The JSON graph file (`-` for standard input).
    pub(crate) file: PathBuf,
    /// Refuse inputs larger than this many bytes, before reading them.
    #[arg(long, default_value_t = tensile_graph::Limits::default().max_input_bytes)]
    pub(crate) max_bytes: u64,
}
