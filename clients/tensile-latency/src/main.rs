//! `tensile-latency`: making the learned op-latency models. `profile`
//! times every zoo op type's real kernel through libtorch, `train` trains
//! one MLP per op type and exports ONNX models. `tensilectl latency eval`
//! evaluates them (ONNX Runtime, no libtorch).
//!
//! Apart from `tensilectl` because these two link libtorch: the operator's
//! commands (`tensilectl status`, `budget`, `watch`, `plan`) must start on
//! a machine without PyTorch's libraries.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use tensile_cli::outln;
use tensile_latency_model::dataset::read_samples;
use tensile_latency_train::calibrate::Base;
use tensile_latency_train::measure::{self, BenchDevice, ProfileConfig};
use tensile_latency_train::pipeline;
use tensile_latency_train::train::TrainConfig;

/// Makes TENSILE's learned op-latency models: profile real kernels
/// (libtorch), train per-op-type MLPs, export ONNX. Evaluate them with
/// `tensilectl latency eval`.
#[derive(Debug, Parser)]
#[command(name = "tensile-latency", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Time every zoo op type's real kernel (libtorch) over a grid of shapes
    /// and background loads; appends to FILE and resumes where it stopped.
    Profile(ProfileArgs),
    /// Train one MLP per op type on a profile, export ONNX models to DIR.
    Train(TrainArgs),
}

#[derive(Debug, Args)]
struct ProfileArgs {
    /// Where kernels run: cpu or cuda.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// JSON Lines file the samples are appended to.
    #[arg(long)]
    out: PathBuf,
    /// Batch sizes at which the zoo models are built, comma separated.
    #[arg(long, default_value = "1,2,4")]
    batches: String,
    /// Image side / sequence length for those builds (clamped to each
    /// model's range); 0 for each model's default.
    #[arg(long, default_value_t = 64)]
    resolution: u64,
    /// Extra builds of every zoo model at a random batch and resolution.
    #[arg(long, default_value_t = 8)]
    random_builds: usize,
    /// Small random networks (conv blocks, MLPs) for shapes off the zoo.
    #[arg(long, default_value_t = 300)]
    random_nets: usize,
    /// Background load levels (other threads running kernels), comma separated.
    #[arg(long, default_value = "0,1")]
    loads: String,
    /// Timed runs per kernel (after warm-up); the median is kept.
    #[arg(long, default_value_t = 5)]
    repeats: u32,
    /// Stop after this many seconds (rerun to resume).
    #[arg(long, default_value_t = 600)]
    max_seconds: u64,
    /// libtorch threads for the timed kernels.
    #[arg(long, default_value_t = 1)]
    threads: i32,
    /// Seed of the random builds and tensors.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Debug, Args)]
struct TrainArgs {
    /// A profile (JSON Lines) from `tensile-latency profile`.
    #[arg(long)]
    data: PathBuf,
    /// Directory for the ONNX models, manifest and held-out samples.
    #[arg(long)]
    out: PathBuf,
    /// The device profiled: cpu, or the built-in GPU profile whose peaks the
    /// fallback roofline is calibrated from (a6000, h100, h200).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Training epochs per op type (full batch, Adam).
    #[arg(long, default_value_t = 1500)]
    epochs: u32,
    /// Hidden width of the MLPs.
    #[arg(long, default_value_t = 64)]
    hidden: i64,
    /// Seed of the weight initialisation.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Profile(a) => profile(&a),
        Command::Train(a) => train(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the chain of causes joined, as a user would read it.
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

fn profile(a: &ProfileArgs) -> Result<()> {
    let device = match a.device.as_str() {
        "cpu" => BenchDevice::Cpu,
        "cuda" => BenchDevice::Cuda,
        other => bail!("unknown device {other:?}: cpu or cuda"),
    };
    let config = ProfileConfig {
        device,
        batches: list(&a.batches).context("--batches")?,
        resolution: (a.resolution > 0).then_some(a.resolution),
        random_builds: a.random_builds,
        random_nets: a.random_nets,
        loads: list(&a.loads).context("--loads")?,
        repeats: a.repeats.max(1),
        time_limit: Duration::from_secs(a.max_seconds),
        threads: a.threads.max(1),
        seed: a.seed,
        ..ProfileConfig::default()
    };
    let grid = measure::grid(&config)?;
    for s in &grid.skipped {
        eprintln!("skipped {s}");
    }
    eprintln!(
        "{} shapes from {} builds, {} load levels -> {}",
        grid.cases.len(),
        grid.graphs.len(),
        config.loads.len(),
        a.out.display()
    );
    let mut last = Duration::ZERO;
    let report = measure::profile(&config, &grid, &a.out, &mut |p| {
        if p.elapsed - last < Duration::from_millis(250) && p.done < p.total {
            return;
        }
        last = p.elapsed;
        let frac = p.done as f64 / p.total.max(1) as f64;
        let width = 30;
        let filled = (frac * width as f64) as usize;
        eprint!(
            "\r[{}{}] {:>5}/{} {:>3.0}% {:>5.0}s load {} {:<40}",
            "#".repeat(filled),
            " ".repeat(width - filled),
            p.done,
            p.total,
            100.0 * frac,
            p.elapsed.as_secs_f64(),
            p.load,
            p.op_type
        );
        let _ = std::io::stderr().flush();
    })?;
    eprintln!();
    outln!(
        "measured {} samples, {} already done, {} failed, in {:.0} s{}",
        report.measured,
        report.already_done,
        report.failed.len(),
        report.elapsed.as_secs_f64(),
        if report.stopped_early {
            " (time limit reached: rerun to resume)"
        } else {
            ""
        }
    );
    outln!("timing: {}", report.timing);
    for f in report.failed.iter().take(10) {
        eprintln!("failed: {f}");
    }
    Ok(())
}

fn train(a: &TrainArgs) -> Result<()> {
    let samples = read_samples(&a.data)?;
    if samples.is_empty() {
        bail!("{}: no samples", a.data.display());
    }
    let base = match a.device.as_str() {
        "cpu" => Base {
            name: "cpu".into(),
            description: "CPU of the build machines (AMD EPYC, AVX-512), one libtorch thread; \
                          efficiencies calibrated on the shipped CPU profile"
                .into(),
            memory_bytes: 16 << 30,
            peak_flops: 100e9,
            mem_bytes_per_s: 20e9,
        },
        other => {
            let p = tensile_latency_model::DeviceProfile::builtin(other)
                .with_context(|| format!("--device {other}: cpu or a built-in GPU profile"))?;
            Base {
                name: format!("{other}-calibrated"),
                description: format!("{}; efficiencies calibrated on measurements", p.description),
                memory_bytes: p.memory_bytes,
                peak_flops: p.peak_flops,
                mem_bytes_per_s: p.mem_bytes_per_s,
            }
        }
    };
    let config = TrainConfig {
        epochs: a.epochs,
        hidden: a.hidden,
        seed: a.seed,
        ..TrainConfig::default()
    };
    let start = Instant::now();
    let trained = pipeline::train_dir(&samples, &a.out, &a.device, &base, &config, &mut |t| {
        let val: Vec<String> = t
            .validation_mape
            .iter()
            .zip(&t.best_epoch)
            .map(|(m, e)| format!("{m:.1}%@{e}"))
            .collect();
        eprintln!(
            "{:<40} {:>5} train {:>5} held out  loss {:.4}  validation {}  {:>6} B",
            t.op_type,
            t.train_samples,
            t.heldout_samples,
            t.final_loss,
            val.join(" "),
            t.onnx_bytes
        );
    })?;
    let bytes: usize = trained.iter().map(|t| t.onnx_bytes).sum();
    outln!(
        "{} models ({} bytes of ONNX) from {} samples in {:.1} s -> {}",
        trained.len(),
        bytes,
        samples.len(),
        start.elapsed().as_secs_f64(),
        a.out.display()
    );
    Ok(())
}

fn list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| x.trim().parse::<T>().with_context(|| format!("{x:?}")))
        .collect()
}
