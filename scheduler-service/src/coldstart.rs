//! Cold-start latencies: what the planner assumes for a job before it has
//! reported any. In order: the job's own measurements (sent with
//! RegisterJob), what the store learned about the same graph on this device
//! in an earlier run, the learned models for the device (ONNX, loaded once
//! at start), the roofline estimate.

use std::path::PathBuf;

use tensile_graph::Graph;
use tensile_latency_model::manifest::{Manifest, shipped_cpu_models};
use tensile_latency_model::{DeviceProfile, Predictor, estimate_latencies};

/// Where the learned models are looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelsSpec {
    /// The shipped models when they were trained for this device.
    Auto,
    /// The roofline only.
    Roofline,
    /// The models in this directory.
    Dir(PathBuf),
}

/// The device's predictor, loaded once.
#[derive(Debug)]
pub struct ColdStart {
    profile: DeviceProfile,
    predictor: Option<Predictor>,
    /// For the log and status: which predictor is in use.
    pub description: String,
}

/// Where a job's latencies came from (`JobStatus.latency_source`).
pub const SOURCE_MEASURED: &str = "measured";
pub const SOURCE_STORE: &str = "store";
pub const SOURCE_LEARNED: &str = "learned";
pub const SOURCE_ROOFLINE: &str = "roofline";

impl ColdStart {
    /// Loads the models `spec` names; a failure to load them falls back to
    /// the roofline and says why in `description` (the scheduler still
    /// serves).
    pub fn load(profile: &DeviceProfile, spec: &ModelsSpec) -> ColdStart {
        let dir = match spec {
            ModelsSpec::Roofline => None,
            ModelsSpec::Dir(d) => Some(d.clone()),
            ModelsSpec::Auto => {
                let dir = shipped_cpu_models();
                let device = Manifest::read(&dir).ok().map(|m| m.device);
                (device.as_deref() == Some(profile.name.as_str())).then_some(dir)
            }
        };
        let (predictor, description) = match dir {
            None => (None, format!("roofline estimate for {:?}", profile.name)),
            Some(dir) => match Predictor::load(&dir) {
                Ok(p) => (Some(p), format!("learned models in {}", dir.display())),
                Err(e) => (
                    None,
                    format!(
                        "roofline estimate for {:?} (the models in {} did not load: {e})",
                        profile.name,
                        dir.display()
                    ),
                ),
            },
        };
        ColdStart {
            profile: profile.clone(),
            predictor,
            description,
        }
    }

    /// Every op's predicted latency (ns) and the source's name.
    pub fn predict(&self, graph: &Graph) -> (Vec<u64>, &'static str) {
        if let Some(p) = &self.predictor
            && let Ok(pred) = p.predict_graph(graph, 0.0)
        {
            return (pred.ns_per_op, SOURCE_LEARNED);
        }
        (estimate_latencies(graph, &self.profile), SOURCE_ROOFLINE)
    }
}
