//! Serving the learned models with ONNX Runtime (ort, loaded at run time
//! from a shared library): all ops of a graph in one batched call per op
//! type, the roofline for op types without a model, and for every op the
//! source of its prediction. The model directory's format is
//! [`crate::manifest`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use tensile_graph::Graph;
use thiserror::Error;

use crate::features::{FEATURE_LEN, op_features};
use crate::manifest::{INPUT, Manifest, OUTPUT};
use crate::profile::{DeviceProfile, ProfileError};
use crate::roofline::{op_cost, roofline_ns};

/// The ONNX Runtime library: `ORT_DYLIB_PATH` when set at run time, else
/// the one this crate was built against (`.cargo/config.toml` points it at
/// `.venv`'s onnxruntime wheel).
pub fn default_ort_library() -> Option<PathBuf> {
    std::env::var_os("ORT_DYLIB_PATH")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| option_env!("ORT_DYLIB_PATH").map(PathBuf::from))
}

/// Where each op's prediction came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The op type's learned model.
    Model,
    /// No model for the op type (or a non-finite output): the roofline.
    Roofline,
    /// A view: no kernel, 0 ns.
    View,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Model => "model",
            Source::Roofline => "roofline",
            Source::View => "view",
        }
    }
}

/// Predicted latencies of every op of a graph, indexed by op id.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    pub ns_per_op: Vec<u64>,
    pub source_per_op: Vec<Source>,
}

#[derive(Debug, Error)]
pub enum PredictError {
    #[error("no ONNX Runtime library: set ORT_DYLIB_PATH (scripts/setup.sh installs one in .venv)")]
    NoRuntime,
    #[error("cannot load ONNX Runtime from {path}: {reason}")]
    Runtime { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Manifest { path: PathBuf, reason: String },
    #[error("{path}: not a usable ONNX model: {reason}")]
    Model { path: PathBuf, reason: String },
    #[error("fallback profile: {0}")]
    Profile(#[from] ProfileError),
    #[error("running the model of {op_type}: {reason}")]
    Run { op_type: String, reason: String },
}

/// The loaded models of one directory.
#[derive(Debug)]
pub struct Predictor {
    manifest: Manifest,
    sessions: HashMap<String, Mutex<ort::session::Session>>,
    fallback: DeviceProfile,
}

static ENVIRONMENT: OnceLock<Result<ort::environment::Environment, String>> = OnceLock::new();

/// Loads ONNX Runtime once per process.
fn environment(lib: &Path) -> Result<&'static ort::environment::Environment, PredictError> {
    let env = ENVIRONMENT.get_or_init(|| {
        if !lib.is_file() {
            return Err(format!("{}: no such file", lib.display()));
        }
        ort::init_from(lib)
            .map_err(|e| e.to_string())?
            .with_name("tensile-latency")
            .build()
            .map_err(|e| e.to_string())
    });
    env.as_ref().map_err(|reason| PredictError::Runtime {
        path: lib.to_owned(),
        reason: reason.clone(),
    })
}

impl Predictor {
    /// Loads the models of `dir` with the default ONNX Runtime library
    /// ([`default_ort_library`]).
    pub fn load(dir: &Path) -> Result<Predictor, PredictError> {
        let lib = default_ort_library().ok_or(PredictError::NoRuntime)?;
        Predictor::load_with(dir, &lib)
    }

    /// Loads the models of `dir` with ONNX Runtime from `ort_lib` (the first
    /// load in a process fixes the library for the process).
    pub fn load_with(dir: &Path, ort_lib: &Path) -> Result<Predictor, PredictError> {
        let manifest = Manifest::read(dir)?;
        let fallback = DeviceProfile::from_file(dir.join(&manifest.roofline))?;
        let env = environment(ort_lib)?;
        let mut sessions = HashMap::new();
        for m in &manifest.models {
            let file = dir.join(&m.file);
            let model = |reason: String| PredictError::Model {
                path: file.clone(),
                reason,
            };
            let bytes = std::fs::read(&file).map_err(|e| model(e.to_string()))?;
            let session = ort::session::Session::builder(env)
                .map_err(|e| model(e.to_string()))?
                .with_intra_threads(1)
                .map_err(|e| model(e.to_string()))?
                .commit_from_memory(&bytes)
                .map_err(|e| model(e.to_string()))?;
            let io_ok = session.inputs().len() == 1
                && session.inputs()[0].name() == INPUT
                && session.outputs().len() == 1
                && session.outputs()[0].name() == OUTPUT;
            if !io_ok {
                return Err(model(format!(
                    "expected one input {INPUT:?} and one output {OUTPUT:?}"
                )));
            }
            sessions.insert(m.op_type.clone(), Mutex::new(session));
        }
        Ok(Predictor {
            manifest,
            sessions,
            fallback,
        })
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The roofline profile used for op types without a model.
    pub fn fallback_profile(&self) -> &DeviceProfile {
        &self.fallback
    }

    /// Whether `op_type` has a learned model.
    pub fn has_model(&self, op_type: &str) -> bool {
        self.sessions.contains_key(op_type)
    }

    /// `ln(ns)` for rows of [`FEATURE_LEN`] features of one op type, in one
    /// call; `None` when the op type has no model.
    pub fn predict_rows(
        &self,
        op_type: &str,
        rows: &[f32],
    ) -> Result<Option<Vec<f32>>, PredictError> {
        let Some(session) = self.sessions.get(op_type) else {
            return Ok(None);
        };
        let run = |reason: String| PredictError::Run {
            op_type: op_type.to_owned(),
            reason,
        };
        let n = rows.len() / FEATURE_LEN;
        if n == 0 {
            return Ok(Some(Vec::new()));
        }
        let input =
            ort::value::Tensor::from_array(([n, FEATURE_LEN], rows[..n * FEATURE_LEN].to_vec()))
                .map_err(|e| run(e.to_string()))?;
        let mut session = session
            .lock()
            .map_err(|_| run("a previous run panicked".into()))?;
        let outputs = session
            .run(ort::inputs![INPUT => input])
            .map_err(|e| run(e.to_string()))?;
        let (_, out) = outputs[0]
            .try_extract_tensor::<f32>()
            .map_err(|e| run(e.to_string()))?;
        if out.len() != n {
            return Err(run(format!("{} outputs for {n} rows", out.len())));
        }
        Ok(Some(out.to_vec()))
    }

    /// Predicts every op of `graph` under `utilization` (other work's share
    /// of the device, `[0, 1]`): one batched call per op type with a model,
    /// the roofline of the fallback profile for the others, 0 for views.
    pub fn predict_graph(
        &self,
        graph: &Graph,
        utilization: f32,
    ) -> Result<Prediction, PredictError> {
        let ops = graph.ops();
        let mut ns = vec![0u64; ops.len()];
        let mut source = vec![Source::View; ops.len()];
        let mut batches: HashMap<&str, (Vec<usize>, Vec<f32>)> = HashMap::new();
        for (i, op) in ops.iter().enumerate() {
            let Some(f) = op_features(graph, op, utilization) else {
                continue;
            };
            if self.has_model(&op.op_type) {
                let (ids, rows) = batches.entry(op.op_type.as_str()).or_default();
                ids.push(i);
                rows.extend_from_slice(&f);
            } else {
                ns[i] = roofline_ns(&self.fallback, op, &op_cost(graph, op));
                source[i] = Source::Roofline;
            }
        }
        for (op_type, (ids, rows)) in batches {
            let out = self.predict_rows(op_type, &rows)?.unwrap_or_default();
            for (&i, &ln) in ids.iter().zip(&out) {
                let t = f64::from(ln).exp();
                if t.is_finite() {
                    ns[i] = t.round().clamp(1.0, u64::MAX as f64) as u64;
                    source[i] = Source::Model;
                } else {
                    ns[i] = roofline_ns(&self.fallback, &ops[i], &op_cost(graph, &ops[i]));
                    source[i] = Source::Roofline;
                }
            }
        }
        Ok(Prediction {
            ns_per_op: ns,
            source_per_op: source,
        })
    }
}
