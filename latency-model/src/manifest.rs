//! The model directory's format, shared by whoever writes it (the training
//! crate, `tensile-latency-train`) and the [`crate::Predictor`] that serves
//! it.
//!
//! A model directory holds `manifest.json` ([`Manifest`]), one
//! `<op>.onnx` per op type ([`model_file`]) with one input [`INPUT`]
//! (`float[n, FEATURE_LEN]`) and one output [`OUTPUT`] (`float[n, 1]`, the
//! natural log of the latency in ns), `roofline.json` (the fallback device
//! profile, calibrated on the same measurements) and the held-out samples.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::features::FEATURE_LEN;
use crate::predict::PredictError;

/// The models' input: `float[n, FEATURE_LEN]`.
pub const INPUT: &str = "features";
/// The models' output: `float[n, 1]`, the natural log of the latency in ns.
pub const OUTPUT: &str = "ln_ns";

pub const MANIFEST_FORMAT: &str = "tensile-latency-models/v1";

/// The shipped CPU models (this crate's `models/cpu`).
pub fn shipped_cpu_models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join("cpu")
}

/// The file name of an op type's model: `aten::relu_` is `aten__relu_.onnx`.
pub fn model_file(op_type: &str) -> String {
    let safe: String = op_type
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}.onnx")
}

/// `manifest.json` of a model directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `tensile-latency-models/v1`.
    pub format: String,
    /// What was profiled (`cpu`, `cuda`) and on what.
    pub device: String,
    pub feature_len: usize,
    /// The fallback device profile's file, relative to the directory.
    pub roofline: String,
    /// Held-out samples (JSON Lines), relative to the directory.
    pub heldout: String,
    pub models: Vec<ModelEntry>,
}

/// One op type's model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelEntry {
    pub op_type: String,
    pub file: String,
    pub train_samples: usize,
    pub heldout_samples: usize,
}

impl Manifest {
    /// Reads and checks `dir/manifest.json` (format and feature length),
    /// without loading any model.
    pub fn read(dir: &Path) -> Result<Manifest, PredictError> {
        let path = dir.join("manifest.json");
        let bad = |reason: String| PredictError::Manifest {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
        let manifest: Manifest = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if manifest.format != MANIFEST_FORMAT || manifest.feature_len != FEATURE_LEN {
            return Err(bad(format!(
                "format {:?} with {} features; this build reads {MANIFEST_FORMAT} with {FEATURE_LEN}",
                manifest.format, manifest.feature_len
            )));
        }
        Ok(manifest)
    }
}
