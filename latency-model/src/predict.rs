//! Serving the learned models with ONNX Runtime (ort, loaded at run time
//! from a shared library): all ops of a graph in one batched call per op
//! type, each distinct feature vector once, the roofline for op types
//! without a model, and for every op the source of its prediction. The
//! model directory's format is [`crate::manifest`].

mod batch;
mod runtime;
mod wheel;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tensile_graph::Graph;
use thiserror::Error;

use crate::features::op_features;
use crate::manifest::Manifest;
use crate::profile::{DeviceProfile, ProfileError};
use crate::roofline::{op_cost, roofline_ns};
use batch::{Batches, FastMap};
use runtime::Model;

/// The ONNX Runtime library: `ORT_DYLIB_PATH` when set at run time, else
/// the onnxruntime wheel of the Python environment the executable is
/// installed in (a `tensile` wheel's `tensile-scheduler`), else the one
/// this crate was built against (`.cargo/config.toml` points it at
/// `.venv`'s onnxruntime wheel).
pub fn default_ort_library() -> Option<PathBuf> {
    std::env::var_os("ORT_DYLIB_PATH")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| wheel::beside(&std::env::current_exe().ok()?))
        .or_else(|| option_env!("ORT_DYLIB_PATH").map(PathBuf::from))
}

/// The ONNX Runtime library for a process whose Python environment is
/// `prefix` (`sys.prefix`: the Python extension, whose executable is the
/// interpreter, not a file of the environment): `ORT_DYLIB_PATH` when set,
/// else the onnxruntime wheel installed in that environment, else
/// [`default_ort_library`].
pub fn ort_library_in_environment(prefix: &Path) -> Option<PathBuf> {
    std::env::var_os("ORT_DYLIB_PATH")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| wheel::in_environment(prefix))
        .or_else(default_ort_library)
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

/// Where the time of one [`Predictor::predict_graph_timed`] call went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PredictTiming {
    /// Every op's feature vector, and grouping the distinct ones by op type.
    pub features: Duration,
    /// The ONNX Runtime calls, one per op type with a model and kernel ops.
    pub runs: Duration,
    /// The rest: the roofline of ops without a model, and handing each
    /// model output to the ops that share its row.
    pub other: Duration,
    /// Calls to ONNX Runtime.
    pub run_calls: usize,
    /// Rows sent to the models: distinct feature vectors per op type.
    pub rows: usize,
}

/// The loaded models of one directory.
#[derive(Debug)]
pub struct Predictor {
    manifest: Manifest,
    models: Vec<Model>,
    /// Op type to its index in `models`.
    index: FastMap<String, usize>,
    fallback: DeviceProfile,
    /// The batches of the last call, for their buffers; a call that finds
    /// it taken (another thread predicting) uses its own.
    scratch: Mutex<Batches>,
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
        let env = runtime::environment(ort_lib).map_err(|reason| PredictError::Runtime {
            path: ort_lib.to_owned(),
            reason: reason.to_owned(),
        })?;
        let mut models = Vec::with_capacity(manifest.models.len());
        let mut index = FastMap::default();
        for m in &manifest.models {
            let file = dir.join(&m.file);
            let model = |reason: String| PredictError::Model {
                path: file.clone(),
                reason,
            };
            let bytes = std::fs::read(&file).map_err(|e| model(e.to_string()))?;
            models.push(Model::load(env, &bytes).map_err(model)?);
            index.insert(m.op_type.clone(), models.len() - 1);
        }
        Ok(Predictor {
            manifest,
            models,
            index,
            fallback,
            scratch: Mutex::default(),
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
        self.index.contains_key(op_type)
    }

    /// `ln(ns)` for rows of [`crate::FEATURE_LEN`] features of one op type, in one
    /// call; `None` when the op type has no model.
    pub fn predict_rows(
        &self,
        op_type: &str,
        rows: &[f32],
    ) -> Result<Option<Vec<f32>>, PredictError> {
        let Some(&m) = self.index.get(op_type) else {
            return Ok(None);
        };
        let mut ln_ns = Vec::new();
        self.run(m, rows, &mut |out| ln_ns.extend_from_slice(out))?;
        Ok(Some(ln_ns))
    }

    /// Predicts every op of `graph` under `utilization` (other work's share
    /// of the device, `[0, 1]`): one batched call per op type with a model,
    /// the roofline of the fallback profile for the others, 0 for views.
    pub fn predict_graph(
        &self,
        graph: &Graph,
        utilization: f32,
    ) -> Result<Prediction, PredictError> {
        self.predict_graph_timed(graph, utilization).map(|(p, _)| p)
    }

    /// [`Predictor::predict_graph`], and where its time went.
    pub fn predict_graph_timed(
        &self,
        graph: &Graph,
        utilization: f32,
    ) -> Result<(Prediction, PredictTiming), PredictError> {
        /// What an op's prediction comes from.
        #[derive(Clone, Copy)]
        enum Slot {
            View,
            Roofline,
            /// A model and a row of its batch.
            Row(u32, u32),
        }
        let start = Instant::now();
        let ops = graph.ops();
        let mut own = Batches::default();
        let mut scratch = self.scratch.try_lock();
        let batches = match scratch.as_deref_mut() {
            Ok(b) => b,
            Err(_) => &mut own,
        };
        batches.reset(self.models.len());
        let mut slots = Vec::with_capacity(ops.len());
        for op in ops {
            let slot = match op_features(graph, op, utilization) {
                None => Slot::View,
                Some(f) => match self.index.get(op.op_type.as_str()) {
                    Some(&m) => Slot::Row(m as u32, batches.row(m, &f)),
                    None => Slot::Roofline,
                },
            };
            slots.push(slot);
        }
        let features = start.elapsed();

        let mut timing = PredictTiming {
            features,
            ..PredictTiming::default()
        };
        // ln(ns) of every row of every batch, one flat vector; offsets[m]
        // is where model m's rows start.
        let mut ln_ns = Vec::with_capacity(batches.rows());
        let mut offsets = Vec::with_capacity(self.models.len());
        for (m, batch) in batches.iter().enumerate() {
            offsets.push(ln_ns.len());
            if batch.len() == 0 {
                continue;
            }
            self.run(m, &batch.rows, &mut |out| ln_ns.extend_from_slice(out))?;
            timing.run_calls += 1;
            timing.rows += batch.len();
        }
        drop(scratch);
        timing.runs = start.elapsed() - features;

        let roofline = |i: usize| roofline_ns(&self.fallback, &ops[i], &op_cost(graph, &ops[i]));
        let mut ns = vec![0u64; ops.len()];
        let mut source = vec![Source::View; ops.len()];
        for (i, slot) in slots.into_iter().enumerate() {
            let t = match slot {
                Slot::View => continue,
                Slot::Roofline => None,
                Slot::Row(m, r) => Some(f64::from(ln_ns[offsets[m as usize] + r as usize]).exp())
                    .filter(|t| t.is_finite()),
            };
            (ns[i], source[i]) = match t {
                Some(t) => (t.round().clamp(1.0, u64::MAX as f64) as u64, Source::Model),
                None => (roofline(i), Source::Roofline),
            };
        }
        timing.other = start.elapsed() - features - timing.runs;
        let prediction = Prediction {
            ns_per_op: ns,
            source_per_op: source,
        };
        Ok((prediction, timing))
    }

    /// Runs model `m` on `rows`, naming its op type in an error.
    fn run(&self, m: usize, rows: &[f32], out: &mut dyn FnMut(&[f32])) -> Result<(), PredictError> {
        self.models[m]
            .run(rows, out)
            .map_err(|reason| PredictError::Run {
                op_type: self.manifest.models[m].op_type.clone(),
                reason,
            })
    }
}
