//! `tensilectl latency profile|train|eval`: the learned op-latency
//! predictor's pipeline on the command line.

use std::io::Write;
use std::time::Duration;

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::json;
use tensile_latency_model::dataset::read_samples;
use tensile_latency_model::manifest::shipped_cpu_models;
use tensile_latency_model::{Predictor, eval};
use tensile_latency_train::calibrate::Base;
use tensile_latency_train::measure::{self, BenchDevice, ProfileConfig};
use tensile_latency_train::pipeline;
use tensile_latency_train::train::TrainConfig;

use crate::args::{EvalArgs, ProfileArgs, TrainArgs};

/// Timed predictions per zoo model in `latency eval`: enough for a steady
/// median on a shared machine, well under a second in all.
const SPEED_REPEATS: usize = 50;

pub(crate) fn profile(a: &ProfileArgs) -> Result<()> {
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
    println!(
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
    for f in report.failed.iter().take(10) {
        eprintln!("failed: {f}");
    }
    Ok(())
}

pub(crate) fn train(a: &TrainArgs) -> Result<()> {
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
    println!(
        "{} models ({} bytes of ONNX) from {} samples in {:.1} s -> {}",
        trained.len(),
        bytes,
        samples.len(),
        start.elapsed().as_secs_f64(),
        a.out.display()
    );
    Ok(())
}

pub(crate) fn eval(a: &EvalArgs) -> Result<()> {
    let dir = a.models.clone().unwrap_or_else(shipped_cpu_models);
    let predictor = match &a.ort_lib {
        Some(lib) => Predictor::load_with(&dir, lib),
        None => Predictor::load(&dir),
    }
    .with_context(|| format!("loading the models in {}", dir.display()))?;
    let data = a
        .data
        .clone()
        .unwrap_or_else(|| dir.join(&predictor.manifest().heldout));
    let samples = read_samples(&data)?;
    let acc = eval::accuracy(&predictor, &samples)?;
    let speed = eval::speed(&predictor, a.batch, SPEED_REPEATS)?;
    let shipped = dir_bytes(&dir, &predictor)?;
    if a.json {
        let per_op_type: serde_json::Map<String, serde_json::Value> = acc
            .iter()
            .map(|(k, v)| {
                let source = if v.model { "model" } else { "roofline" };
                (
                    k.clone(),
                    json!({"samples": v.samples, "mape": v.mape, "median_ape": v.median_ape,
                           "p90_ape": v.p90_ape, "source": source}),
                )
            })
            .collect();
        let per_model: serde_json::Map<String, serde_json::Value> = speed
            .iter()
            .map(|s| (s.model.clone(), json!(s.predict_ms)))
            .collect();
        let detail: Vec<_> = speed
            .iter()
            .map(|s| {
                json!({"model": s.model, "batch": s.batch, "ops": s.ops,
                       "from_model": s.from_model, "from_roofline": s.from_roofline,
                       "predict_ms": s.predict_ms, "features_ms": s.features_ms,
                       "runs_ms": s.runs_ms, "other_ms": s.other_ms,
                       "run_calls": s.run_calls, "rows": s.rows})
            })
            .collect();
        let out = json!({
            "models": dir.display().to_string(),
            "data": data.display().to_string(),
            "device": predictor.manifest().device,
            "per_op_type": per_op_type,
            "predict_ms_per_model": per_model,
            "predict_batch": a.batch,
            "predict_detail": detail,
            "model_bytes": shipped,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "held-out accuracy ({} samples from {}), absolute percentage error:",
        samples.len(),
        data.display()
    );
    println!(
        "{:<40} {:>7} {:>8} {:>8} {:>8}  source",
        "op type", "samples", "MAPE%", "median%", "p90%"
    );
    for (k, v) in &acc {
        println!(
            "{:<40} {:>7} {:>8.1} {:>8.1} {:>8.1}  {}",
            k,
            v.samples,
            v.mape,
            v.median_ape,
            v.p90_ape,
            if v.model { "model" } else { "roofline" }
        );
    }
    println!(
        "\ntime to predict every op of a zoo model (batch {}, medians of {SPEED_REPEATS} calls; \
         the parts: features, ONNX Runtime calls on the distinct rows, the rest):",
        a.batch
    );
    for s in &speed {
        println!(
            "{:<14} {:>5} ops ({:>4} model, {:>3} roofline, rest views) {:>8.3} ms \
             = features {:.3} + {:>2} runs of {:>4} rows {:.3} + other {:.3}",
            s.model,
            s.ops,
            s.from_model,
            s.from_roofline,
            s.predict_ms,
            s.features_ms,
            s.run_calls,
            s.rows,
            s.runs_ms,
            s.other_ms
        );
    }
    println!(
        "\nmodels on disk: {shipped} bytes ({} ONNX files)",
        predictor.manifest().models.len()
    );
    Ok(())
}

/// Bytes of the ONNX models, the manifest and the fallback profile.
fn dir_bytes(dir: &Path, p: &Predictor) -> Result<u64> {
    let m = p.manifest();
    let mut files: Vec<String> = m.models.iter().map(|e| e.file.clone()).collect();
    files.push("manifest.json".into());
    files.push(m.roofline.clone());
    files
        .iter()
        .map(|f| {
            let path = dir.join(f);
            std::fs::metadata(&path)
                .map(|md| md.len())
                .with_context(|| path.display().to_string())
        })
        .sum()
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
