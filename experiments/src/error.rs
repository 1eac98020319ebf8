//! What can go wrong in an experiment, typed; `tensilectl` adds context
//! and prints the chain.

use tensile_baselines::BaselineError;
use tensile_executor::ExecError;
use tensile_graph::zoo::ZooError;
use tensile_latency_model::DeviceError;
use tensile_plan_job::PlanJobError;
use tensile_planner::{PlanError, ReplanError};

#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    /// A device profile by name, or planning one job
    /// (`tensile-plan-job`).
    #[error(transparent)]
    PlanJob(#[from] PlanJobError),
    #[error("{what}")]
    Zoo {
        what: String,
        /// Boxed: a graph error is large, and every result carries the enum.
        #[source]
        source: Box<ZooError>,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Replanner(#[from] ReplanError),
    /// A re-plan during the run failed (the jobs kept their plans).
    #[error("{policy}: re-planning at {at_ns} ns")]
    Replan {
        policy: &'static str,
        at_ns: u64,
        #[source]
        source: ReplanError,
    },
    #[error(transparent)]
    Baseline(#[from] BaselineError),
    /// A job of the simulation could not run its plan.
    #[error("{policy}: job {job} ({name})")]
    JobFailed {
        policy: &'static str,
        job: usize,
        name: String,
        #[source]
        source: ExecError,
    },
    #[error("capuchin needs a memory budget per job")]
    NoBudgets,
    #[error("bench colocate: {0}")]
    Colocate(String),
    /// A sweep's `--out` file that cannot be gone on with.
    #[error("sweep --out {}: {what}", path.display())]
    SweepOut {
        path: std::path::PathBuf,
        what: String,
    },
    #[error("sweep --out {}", path.display())]
    SweepOutIo {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the simulation thread pool: {reason}")]
    Pool { reason: String },
    #[cfg(feature = "bound")]
    #[error("swap bound: job {job} has {got} latencies for a graph of {ops} ops")]
    BoundLatencyCount { job: usize, got: usize, ops: usize },
    #[cfg(feature = "bound")]
    #[error(
        "swap bound: the period of {period_ns} ns is shorter than job {job}'s iteration of {iteration_ns} ns"
    )]
    BoundPeriod {
        job: usize,
        period_ns: u64,
        iteration_ns: u64,
    },
    #[cfg(feature = "bound")]
    #[error("swap bound: the period is 0 ns (no job, or no op of any job takes time)")]
    BoundEmptyPeriod,
    #[cfg(feature = "bound")]
    #[error("swap bound: copy bandwidths must be positive (h2d {h2d} B/s, d2h {d2h} B/s)")]
    BoundBandwidth { h2d: f64, d2h: f64 },
    #[cfg(feature = "bound")]
    #[error(
        "swap bound: the LP solver refused the program at {at_ns} ns ({candidates} idle storages)"
    )]
    BoundLp {
        at_ns: u64,
        candidates: usize,
        #[source]
        source: good_lp::ResolutionError,
    },
    /// What went wrong in one workload of the bench.
    #[error("{workload} on {device}")]
    InWorkload {
        workload: String,
        device: String,
        #[source]
        source: Box<ExperimentError>,
    },
}

/// The error and its causes on one line, `: `-joined, as a user reads them
/// (what `anyhow` prints with `{:#}`), for reports that keep errors as text.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

impl From<DeviceError> for ExperimentError {
    fn from(e: DeviceError) -> ExperimentError {
        ExperimentError::PlanJob(e.into())
    }
}
