//! Profiling real kernels through tch: the grid of shapes (every kernel op of
//! the zoo models at several batch sizes, plus the zoo architectures at
//! random batch sizes and resolutions), deduplicated by op type and
//! features, plus small random networks (conv blocks and MLPs of random
//! sizes) for shapes no zoo model has, timed under several background-load levels with warm-up,
//! repeats and the median, appended to a JSON Lines file as measured, so an
//! interrupted run resumes where it stopped.
//!
//! Background load on the CPU: `load` extra threads, each running 256x256
//! matrix products in a loop while the kernel is timed; the utilization
//! feature is `load / cores`. On CUDA the same threads launch their products
//! on the GPU. Timing: the wall clock around each run on a CPU, CUDA events
//! around each run on a GPU (`clock`).

mod clock;
mod kernels;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};
use tensile_graph::builder::{Builder, Optimizer};
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{DType, Graph};
use thiserror::Error;

pub use kernels::{KernelError, SUPPORTED, is_supported};

use tensile_latency_model::dataset::{DatasetError, Sample, SampleWriter, read_samples};
use tensile_latency_model::features::{op_features, shape_key};

/// Where kernels run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchDevice {
    Cpu,
    Cuda,
}

/// What to measure and how.
#[derive(Debug, Clone)]
pub struct ProfileConfig {
    pub device: BenchDevice,
    /// Batch sizes at which every zoo model is built.
    pub batches: Vec<u64>,
    /// Image side (CNNs) or sequence length (BERT) for the batches above,
    /// `None` for each model's default (then clamped to its range).
    pub resolution: Option<u64>,
    /// Extra zoo builds at a random batch (1 to 4) and resolution.
    pub random_builds: usize,
    /// Small random networks (a conv block, pooling and an MLP head, or an
    /// MLP on a random number of rows): shapes no zoo model has.
    pub random_nets: usize,
    /// Background load levels.
    pub loads: Vec<u32>,
    pub warmup: u32,
    pub repeats: u32,
    /// A kernel whose warm-up run takes longer than this gets only
    /// `ceil(repeats / 2)` timed runs (large convolutions on a CPU).
    pub slow_run: Duration,
    /// Stop (cleanly, resumable) after this long.
    pub time_limit: Duration,
    /// libtorch intra-op threads for the timed kernels.
    pub threads: i32,
    pub seed: u64,
}

impl Default for ProfileConfig {
    fn default() -> ProfileConfig {
        ProfileConfig {
            device: BenchDevice::Cpu,
            batches: vec![1, 2, 4],
            resolution: Some(64),
            random_builds: 8,
            random_nets: 300,
            loads: vec![0, 1],
            warmup: 2,
            repeats: 5,
            slow_run: Duration::from_millis(100),
            time_limit: Duration::from_secs(600),
            threads: 1,
            seed: 1,
        }
    }
}

/// One op to measure.
#[derive(Debug, Clone)]
pub struct Case {
    pub graph: usize,
    pub op: usize,
    pub key: String,
    pub source: String,
}

/// The graphs and the deduplicated ops to measure in them.
#[derive(Debug)]
pub struct Grid {
    pub graphs: Vec<Graph>,
    pub cases: Vec<Case>,
    /// Builds the zoo refused (e.g. Inception-V3 at batch 1: its auxiliary
    /// head's batch norm sees one value per channel), with the reason.
    pub skipped: Vec<String>,
}

/// Progress, reported after every case.
#[derive(Debug, Clone)]
pub struct Progress<'a> {
    pub done: usize,
    pub total: usize,
    pub op_type: &'a str,
    pub load: u32,
    pub elapsed: Duration,
}

/// What a profile run did.
#[derive(Debug, Clone, Default)]
pub struct ProfileReport {
    pub measured: usize,
    pub already_done: usize,
    pub failed: Vec<String>,
    pub stopped_early: bool,
    pub elapsed: Duration,
    /// How the samples were timed, in words.
    pub timing: &'static str,
}

#[derive(Debug, Error)]
pub enum ProfileError {
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    #[error("no CUDA device is available to libtorch")]
    NoCuda,
}

/// Builds the grid: the zoo at `config.batches`, then the random builds.
pub fn grid(config: &ProfileConfig) -> Result<Grid, ProfileError> {
    let mut builds = Vec::new();
    for &batch in &config.batches {
        for m in zoo::MODELS {
            let res = config
                .resolution
                .unwrap_or(m.default_resolution)
                .clamp(m.min_resolution, m.max_resolution);
            builds.push((m.name, batch, res));
        }
    }
    let mut rng = config.seed.max(1);
    for _ in 0..config.random_builds {
        for m in zoo::MODELS {
            let batch = 1 + next(&mut rng) % 4;
            let hi = m
                .default_resolution
                .min(m.max_resolution)
                .max(m.min_resolution);
            let span = hi - m.min_resolution.max(32).min(hi) + 1;
            let res = m.min_resolution.max(32).min(hi) + next(&mut rng) % span;
            builds.push((m.name, batch, res));
        }
    }
    let mut built = Vec::new();
    for (name, batch, res) in builds {
        let source = format!("{name}@{batch}x{res}");
        let mut cfg = ZooConfig::new(batch);
        cfg.resolution = Some(res);
        built.push((source, zoo::build(name, &cfg).map_err(|e| e.to_string())));
    }
    for i in 0..config.random_nets {
        let (source, g) = random_net(&mut rng, i);
        built.push((source, g.map_err(|e| e.to_string())));
    }
    let mut graphs = Vec::new();
    let mut cases = Vec::new();
    let mut seen = HashSet::new();
    let mut skipped = Vec::new();
    for (source, g) in built {
        let g = match g {
            Ok(g) => g,
            Err(e) => {
                skipped.push(format!("{source}: {e}"));
                continue;
            }
        };
        for (i, op) in g.ops().iter().enumerate() {
            let Some(f) = op_features(&g, op, 0.0) else {
                continue;
            };
            let key = shape_key(&op.op_type, &f);
            if seen.insert(key.clone()) {
                cases.push(Case {
                    graph: graphs.len(),
                    op: i,
                    key,
                    source: source.clone(),
                });
            }
        }
        graphs.push(g);
    }
    Ok(Grid {
        graphs,
        cases,
        skipped,
    })
}

/// Measures every case of `grid` under every load level, appending to
/// `out` and skipping what `out` already holds.
pub fn profile(
    config: &ProfileConfig,
    grid: &Grid,
    out: &Path,
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Result<ProfileReport, ProfileError> {
    let device = match config.device {
        BenchDevice::Cpu => Device::Cpu,
        BenchDevice::Cuda if tch::Cuda::is_available() => Device::Cuda(0),
        BenchDevice::Cuda => return Err(ProfileError::NoCuda),
    };
    let done: HashSet<String> = if out.exists() {
        read_samples(out)?.iter().map(Sample::done_key).collect()
    } else {
        HashSet::new()
    };
    let mut writer = SampleWriter::append(out)?;
    tch::set_num_threads(config.threads);
    tch::manual_seed(config.seed as i64);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f32;
    let start = Instant::now();
    let mut clock = clock::Clock::for_device(device);
    let mut report = ProfileReport {
        timing: clock.describe(),
        ..ProfileReport::default()
    };
    let total = grid.cases.len() * config.loads.len();
    let mut n = 0;
    // Loads inside shapes, so that a run cut by the time limit has every
    // load level of the shapes it reached.
    'cases: for case in &grid.cases {
        for &load in &config.loads {
            n += 1;
            if done.contains(&format!("{} @load{load}", case.key)) {
                report.already_done += 1;
                continue;
            }
            if start.elapsed() > config.time_limit {
                report.stopped_early = true;
                break 'cases;
            }
            let g = &grid.graphs[case.graph];
            let op = &g.ops()[case.op];
            if !is_supported(&op.op_type) {
                continue;
            }
            let background = Background::start(load, device);
            let measured = measure(config, g, op, device, &mut clock);
            drop(background);
            match measured {
                Ok((ns, runs)) => {
                    let utilization = (load as f32 / cores).min(1.0);
                    let mut features = op_features(g, op, utilization)
                        .map(Vec::from)
                        .unwrap_or_default();
                    features.resize(tensile_latency_model::FEATURE_LEN, 0.0);
                    writer.write(&Sample {
                        op_type: op.op_type.clone(),
                        features,
                        load,
                        ns,
                        runs,
                        source: case.source.clone(),
                    })?;
                    report.measured += 1;
                }
                Err(e) => report.failed.push(e.to_string()),
            }
            progress(&Progress {
                done: n,
                total,
                op_type: &op.op_type,
                load,
                elapsed: start.elapsed(),
            });
        }
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

/// Median ns and timed runs of one op, net of its baseline.
fn measure(
    config: &ProfileConfig,
    g: &Graph,
    op: &tensile_graph::Op,
    device: Device,
    clock: &mut clock::Clock,
) -> Result<(u64, u32), KernelError> {
    let failed = |e| match e {
        clock::RunError::Torch(source) => KernelError::Torch {
            op: op.name.clone(),
            op_type: op.op_type.clone(),
            source,
        },
        clock::RunError::Clock(why) => KernelError::Clock {
            op: op.name.clone(),
            op_type: op.op_type.clone(),
            why,
        },
    };
    let mut k = kernels::prepare(g, op, device)?;
    let warm = clock
        .time(config.warmup.max(1), &mut k.run)
        .map_err(failed)?;
    let slowest = warm.into_iter().max().unwrap_or_default();
    let repeats = if slowest > config.slow_run {
        config.repeats.div_ceil(2)
    } else {
        config.repeats
    }
    .max(1);
    let mut runs = clock.time(repeats, &mut k.run).map_err(failed)?;
    let mut ns = median(&mut runs).as_nanos() as f64;
    if let Some(base) = k.baseline.as_mut() {
        let mut b = clock.time(repeats, base).map_err(failed)?;
        // Never let the baseline take more than half of the measurement.
        ns -= (median(&mut b).as_nanos() as f64).min(ns / 2.0);
    }
    Ok((ns.max(1.0) as u64, repeats))
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Threads running matrix products until dropped.
struct Background {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Background {
    fn start(load: u32, device: Device) -> Background {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..load)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    tch::set_num_threads(1);
                    let Ok(a) = Tensor::f_randn([256, 256], (Kind::Float, device)) else {
                        return;
                    };
                    while !stop.load(Ordering::Relaxed) {
                        if a.f_mm(&a).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        if load > 0 {
            // Let the threads reach their loop before the kernel is timed.
            std::thread::sleep(Duration::from_millis(2));
        }
        Background { stop, threads }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A small random network: even `i`, a conv block (conv, batch norm, ReLU,
/// max pooling) on a random image, global pooling and a two-layer MLP head;
/// odd `i`, a two-layer MLP on a random number of rows.
fn random_net(rng: &mut u64, i: usize) -> (String, Result<Graph, tensile_graph::GraphError>) {
    let mut pick = |xs: &[u64]| xs[(next(rng) % xs.len() as u64) as usize];
    let widths = [8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 384, 512];
    let mut b = Builder::new(format!("random{i}"));
    let (source, features, rows) = if i.is_multiple_of(2) {
        let batch = pick(&[1, 2, 3, 4, 6, 8]);
        let c = pick(&[3, 8, 16, 32, 64, 128, 256]);
        let hw = pick(&[8, 12, 14, 16, 24, 28, 32, 48, 56, 64, 96]);
        let k = pick(&[1, 3, 5, 7]);
        let stride = pick(&[1, 1, 2]);
        let out = pick(&widths);
        let bias = pick(&[0, 1]) == 1;
        let x = b.input("x", vec![batch, c, hw, hw], DType::F32);
        let y = b.conv2d("conv", x, out, [k, k], [stride; 2], [k / 2; 2], 1, bias);
        let y = b.batch_norm("bn", y, 1e-5);
        let y = b.relu_("relu", y);
        let y = b.max_pool2d("pool", y, pick(&[2, 3]), 2, 0, true);
        let y = b.adaptive_avg_pool2d("gap", y, [1, 1]);
        let y = b.flatten("flatten", y);
        let source = format!("random-conv{i}@{batch}x{c}x{hw}k{k}s{stride}o{out}");
        (source, y, batch)
    } else {
        let rows = pick(&[1, 2, 4, 8, 16, 32, 64, 128, 256, 512]);
        let k = pick(&widths) * pick(&[1, 2, 4]);
        let x = b.input("x", vec![rows, k], DType::F32);
        (format!("random-mlp{i}@{rows}x{k}"), x, rows)
    };
    let hidden = pick(&widths) * pick(&[1, 2, 4, 8]);
    let classes = pick(&[2, 10, 100, 1000]);
    let h = b.linear("fc1", features, hidden, true);
    let h = b.relu("act", h);
    let logits = b.linear("fc2", h, classes, pick(&[0, 1]) == 1);
    let target = b.input("target", vec![rows], DType::I64);
    let loss = b.cross_entropy("loss", logits, target);
    let opt = if pick(&[0, 1]) == 1 {
        Optimizer::adam()
    } else {
        Optimizer::sgd()
    };
    (source, b.finish(loss, opt))
}

/// xorshift64: the grid's random builds, reproducible from the seed.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}
