//! What can go wrong in planning one job, typed; the binaries add context
//! and print the chain.

use std::path::PathBuf;

use tensile_latency_model::DeviceError;
use tensile_latency_model::predict::PredictError;
use tensile_planner::PlanError;

/// Why a job could not be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanJobError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("cold-start latency models {}", dir.display())]
    Predictor {
        dir: PathBuf,
        #[source]
        source: PredictError,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
}
