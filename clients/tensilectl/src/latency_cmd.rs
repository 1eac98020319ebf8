//! `tensilectl latency eval`: the learned op-latency predictor's accuracy
//! and speed. Making the models (`profile`, `train`) links libtorch and is
//! `tensile-latency`'s, a binary of its own.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;
use tensile_latency_model::dataset::read_samples;
use tensile_latency_model::manifest::shipped_cpu_models;
use tensile_latency_model::{Predictor, eval};

use crate::args::EvalArgs;

/// Timed predictions per zoo model in `latency eval`: enough for a steady
/// median on a shared machine, well under a second in all.
const SPEED_REPEATS: usize = 50;

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
        tensile_cli::outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    tensile_cli::outln!(
        "held-out accuracy ({} samples from {}), absolute percentage error:",
        samples.len(),
        data.display()
    );
    tensile_cli::outln!(
        "{:<40} {:>7} {:>8} {:>8} {:>8}  source",
        "op type",
        "samples",
        "MAPE%",
        "median%",
        "p90%"
    );
    for (k, v) in &acc {
        tensile_cli::outln!(
            "{:<40} {:>7} {:>8.1} {:>8.1} {:>8.1}  {}",
            k,
            v.samples,
            v.mape,
            v.median_ape,
            v.p90_ape,
            if v.model { "model" } else { "roofline" }
        );
    }
    tensile_cli::outln!(
        "\ntime to predict every op of a zoo model (batch {}, medians of {SPEED_REPEATS} calls; \
         the parts: features, ONNX Runtime calls on the distinct rows, the rest):",
        a.batch
    );
    for s in &speed {
        tensile_cli::outln!(
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
    tensile_cli::outln!(
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
