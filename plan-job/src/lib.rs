//! One job planned on its own, and what the planner takes from a device
//! profile: the piece of planning that `tensilectl plan`, the scheduler and
//! the Python extension (`tensile._core`, `tensile.plan()`) share. It
//! depends on the planner, the graph IR and the latency models only: no
//! simulator, no baselines, no libtorch.
//!
//! # Layout
//! - [`device`]: a profile as the planner sees it: its copy link
//!   ([`copy_model`]), the planner's configuration ([`planner_config`]) and
//!   a job's settings ([`job_settings`]).
//! - [`cold_start`]: where a first plan's latencies come from (the learned
//!   models of the device, else the roofline estimate).
//! - [`plan`]: one graph planned alone ([`plan_job`]) and what it
//!   predicts ([`PlanReport`], `tensilectl plan --json`).
//! - `error`: [`PlanJobError`].

pub mod cold_start;
pub mod device;
mod error;
pub mod plan;

pub use cold_start::{ColdStart, ColdStartLatencies, cold_start_latencies};
pub use device::{copy_model, job_settings, one_process, planner_config};
pub use error::PlanJobError;
pub use plan::{PlanOptions, PlanOutcome, PlanReport, lower_bound_bytes, plan_job};
pub use tensile_latency_model::device_profile;
