//! From a profile to a model directory: split by shape, train one model (a
//! small ensemble of MLPs over a roofline, [`crate::train`]) per op type on
//! the training shapes, export each to ONNX, calibrate the
//! fallback roofline on the training samples, and write the manifest and
//! the held-out samples (see [`tensile_latency_model::manifest`] for the
//! layout).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tensile_latency_model::dataset::{DatasetError, Sample, write_samples};
use tensile_latency_model::features::FEATURE_LEN;
use tensile_latency_model::manifest::{MANIFEST_FORMAT, Manifest, ModelEntry, model_file};
use tensile_latency_model::profile::ProfileError;
use thiserror::Error;

use crate::calibrate::{Base, calibrate, profile_json};
use crate::train::{TrainConfig, TrainError, train};

/// What [`train_dir`] did, per op type.
#[derive(Debug, Clone)]
pub struct TrainedType {
    pub op_type: String,
    pub train_samples: usize,
    pub heldout_samples: usize,
    /// Mean relative error on the training rows, last epoch.
    pub final_loss: f64,
    /// Each ensemble member's MAPE (percent) on its validation fold of the
    /// training shapes, at the epoch it kept (`NaN`: no fold).
    pub validation_mape: Vec<f64>,
    /// Each member's kept epoch.
    pub best_epoch: Vec<u32>,
    pub onnx_bytes: usize,
}

#[derive(Debug, Error)]
pub enum PipelineError {
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error("calibrating the fallback roofline: {0}")]
    Profile(#[from] ProfileError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{op_type}: exporting the model: {source}")]
    Export {
        op_type: String,
        #[source]
        source: tch::TchError,
    },
}

/// Trains every op type of `samples` and writes the model directory `out`.
pub fn train_dir(
    samples: &[Sample],
    out: &Path,
    device: &str,
    base: &Base,
    config: &TrainConfig,
    progress: &mut dyn FnMut(&TrainedType),
) -> Result<Vec<TrainedType>, PipelineError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| PipelineError::Io { path, source }
    };
    std::fs::create_dir_all(out).map_err(io(out))?;
    let mut by_type: BTreeMap<&str, (Vec<&Sample>, usize)> = BTreeMap::new();
    let mut heldout = Vec::new();
    let mut training = Vec::new();
    for s in samples {
        let entry = by_type.entry(s.op_type.as_str()).or_default();
        if s.is_held_out() {
            heldout.push(s.clone());
            entry.1 += 1;
        } else {
            entry.0.push(s);
            training.push(s.clone());
        }
    }
    let mut done = Vec::new();
    let mut entries = Vec::new();
    for (op_type, (train_set, n_held)) in by_type {
        if train_set.is_empty() {
            continue;
        }
        let net = train(&train_set, config)?;
        let export = |source| PipelineError::Export {
            op_type: op_type.to_owned(),
            source,
        };
        let bytes = crate::onnx::export(&net.to_mlp().map_err(export)?);
        let file = model_file(op_type);
        let path = out.join(&file);
        std::fs::write(&path, &bytes).map_err(io(&path))?;
        let t = TrainedType {
            op_type: op_type.to_owned(),
            train_samples: train_set.len(),
            heldout_samples: n_held,
            final_loss: net.final_loss,
            validation_mape: net.validation_mape.clone(),
            best_epoch: net.best_epoch.clone(),
            onnx_bytes: bytes.len(),
        };
        progress(&t);
        entries.push(ModelEntry {
            op_type: op_type.to_owned(),
            file,
            train_samples: t.train_samples,
            heldout_samples: n_held,
        });
        done.push(t);
    }
    let (profile, _) = calibrate(base, &training)?;
    let roofline = out.join("roofline.json");
    std::fs::write(&roofline, profile_json(&profile)).map_err(io(&roofline))?;
    write_samples(&out.join("heldout.jsonl"), &heldout)?;
    let manifest = Manifest {
        format: MANIFEST_FORMAT.into(),
        device: device.into(),
        feature_len: FEATURE_LEN,
        roofline: "roofline.json".into(),
        heldout: "heldout.jsonl".into(),
        models: entries,
    };
    let path = out.join("manifest.json");
    let mut text = serde_json::to_string_pretty(&manifest).unwrap_or_default();
    text.push('\n');
    std::fs::write(&path, text).map_err(io(&path))?;
    Ok(done)
}
