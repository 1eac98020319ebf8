//! Where ours takes the latencies of its first (cold-start) plan from: the
//! learned models trained for the device when there are any, else the
//! roofline estimate; and how far they are from the simulated truth.

use std::path::{Path, PathBuf};

use tensile_graph::Graph;
use tensile_latency_model::manifest::{Manifest, shipped_cpu_models};
use tensile_latency_model::{DeviceProfile, Predictor, Source, estimate_latencies};

use crate::PlanJobError;

/// Where the planner's cold-start latencies come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColdStart {
    /// The learned models trained for this device if there are any (the
    /// shipped ones are for `cpu`), else the roofline estimate.
    Auto,
    /// The roofline estimate.
    Roofline,
    /// The learned models in this directory.
    Models(PathBuf),
}

impl ColdStart {
    /// `auto`, `roofline`, or a model directory.
    pub fn parse(s: &str) -> ColdStart {
        match s {
            "auto" => ColdStart::Auto,
            "roofline" => ColdStart::Roofline,
            dir => ColdStart::Models(PathBuf::from(dir)),
        }
    }
}

/// The cold-start latencies of every job (ns per op, per job), and where
/// they came from.
#[derive(Debug, Clone)]
pub struct ColdStartLatencies {
    pub per_job: Vec<Vec<u64>>,
    /// For people: "roofline estimate", or the models and how many ops
    /// each source predicted.
    pub source: String,
    /// Something the user should know (models trained for another device).
    pub warnings: Vec<String>,
}

/// Predicts every op of every graph as `how` says, with ONNX Runtime from
/// its default location.
pub fn cold_start_latencies(
    graphs: &[Graph],
    profile: &DeviceProfile,
    how: &ColdStart,
) -> Result<ColdStartLatencies, PlanJobError> {
    cold_start_latencies_with(graphs, profile, how, None)
}

/// [`cold_start_latencies`] with ONNX Runtime from `ort_library` when
/// given (the first library loaded in a process stays its library).
pub fn cold_start_latencies_with(
    graphs: &[Graph],
    profile: &DeviceProfile,
    how: &ColdStart,
    ort_library: Option<&Path>,
) -> Result<ColdStartLatencies, PlanJobError> {
    let dir = match how {
        ColdStart::Roofline => None,
        ColdStart::Models(dir) => Some(dir.clone()),
        ColdStart::Auto => {
            let dir = shipped_cpu_models();
            let device = Manifest::read(&dir).ok().map(|m| m.device);
            (device.as_deref() == Some(profile.name.as_str())).then_some(dir)
        }
    };
    let Some(dir) = dir else {
        return Ok(ColdStartLatencies {
            per_job: graphs
                .iter()
                .map(|g| estimate_latencies(g, profile))
                .collect(),
            source: "roofline estimate".into(),
            warnings: Vec::new(),
        });
    };
    let failed = |source| PlanJobError::Predictor {
        dir: dir.clone(),
        source,
    };
    let predictor = match ort_library {
        Some(lib) => Predictor::load_with(&dir, lib),
        None => Predictor::load(&dir),
    }
    .map_err(failed)?;
    let mut warnings = Vec::new();
    if predictor.manifest().device != profile.name {
        warnings.push(format!(
            "the latency models in {} were trained on {:?}, the device is {:?}",
            dir.display(),
            predictor.manifest().device,
            profile.name
        ));
    }
    let (mut model, mut roofline) = (0, 0);
    let mut per_job = Vec::new();
    for g in graphs {
        let p = predictor.predict_graph(g, 0.0).map_err(failed)?;
        let count = |source| p.source_per_op.iter().filter(|s| **s == source).count();
        model += count(Source::Model);
        roofline += count(Source::Roofline);
        per_job.push(p.ns_per_op);
    }
    Ok(ColdStartLatencies {
        per_job,
        source: format!(
            "learned models ({}): {model} ops by a model, {roofline} by the roofline",
            dir.display()
        ),
        warnings,
    })
}

/// Σ|predicted − true| / Σ true over every op of every job.
pub fn relative_error(predicted: &[Vec<u64>], truth: &[Vec<u64>]) -> f64 {
    let (mut err, mut total) = (0.0, 0.0);
    for (p, t) in predicted.iter().zip(truth) {
        for (&p, &t) in p.iter().zip(t) {
            err += (p as f64 - t as f64).abs();
            total += t as f64;
        }
    }
    err / total.max(1.0)
}
