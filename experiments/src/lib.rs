//! Experiments on the simulator, as data: a workload (graphs and their
//! start times) under a policy (ours or a baseline) against vanilla on the
//! same graphs and true latencies; the metrics the TENSILE paper reports
//! (MSR, EOR, CBR) and the lower bound no plan goes under; the paper's
//! workloads and figures; and where ours does not Pareto-dominate a
//! baseline. `tensilectl plan`, `sim` and `bench paper` are thin shells
//! around it: they parse arguments, print and plot.
//!
//! Nothing here prints or writes files: results are values (the reports
//! serialize with serde: their JSON is `tensilectl`'s `--json`), warnings
//! are returned, and progress goes to a callback.
//!
//! # Layout
//! - [`device`]: device profiles by name, and what the planner and the
//!   simulator take from one.
//! - [`cold_start`]: where ours takes its first latencies from (the learned
//!   models of the device, else the roofline estimate).
//! - [`run`]: one workload under one policy in the simulator
//!   ([`run_policy`]), and a whole `sim` ([`simulate_workload`]).
//! - [`metrics`]: MSR, EOR, CBR, the lower bound and `msr_max`
//!   ([`SimReport`]), and the per-phase figures of Table I.
//! - [`plan_job`]: one graph planned on its own ([`PlanReport`]).
//! - [`policy`]: [`RunPolicy`], a policy as run (plain, or ours at a
//!   baseline's peak).
//! - [`workload`]: [`Experiment`] and the paper's workloads.
//! - [`paper`]: the figures the paper reports.
//! - [`bench`]: every experiment under every policy ([`run_bench`]).
//! - [`pareto`]: where ours does not dominate a baseline.
//! - `bound` (feature `bound`, on by default): the lowest peak any swap
//!   plan that adds no time can reach (`swap_bound`, a linear program per
//!   instant).
//! - `colocate` (feature `bound`): k copies of a model under one copy's
//!   vanilla peak (`run_colocate`), their capacity at a stated cost.
//! - `sweep` (feature `bound`): that capacity over every model x2 and x3
//!   and pairs of models, devices, fractions and seeds, beside the
//!   capacity the bound allows at its best phases (`run_sweep`).

pub mod bench;
#[cfg(feature = "bound")]
pub mod bound;
pub mod cold_start;
#[cfg(feature = "bound")]
pub mod colocate;
pub mod device;
mod error;
pub mod metrics;
pub mod paper;
pub mod pareto;
pub mod plan_job;
pub mod policy;
pub mod run;
#[cfg(feature = "bound")]
pub mod sweep;
#[cfg(feature = "bound")]
pub mod sweep_out;
pub mod workload;

pub use bench::{
    BenchConfig, BenchReport, DeviceOutcome, PolicyOutcome, WorkloadOutcome, run_bench,
};
#[cfg(feature = "bound")]
pub use bound::{
    BoundJob, BoundReport, PhaseBound, bound_period, phase_bound, sharing_jobs, swap_bound,
};
pub use cold_start::ColdStart;
#[cfg(feature = "bound")]
pub use colocate::{ColocateCase, ColocateConfig, ColocateReport, run_colocate};
pub use device::device_profile;
pub use error::{ExperimentError, error_chain};
pub use metrics::{Metrics, SimReport};
pub use plan_job::{PlanOptions, PlanOutcome, PlanReport, plan_job};
pub use policy::RunPolicy;
pub use run::{Run, SimOptions, SimOutcome, SimStage, run_policy, simulate_workload};
pub use workload::{Experiment, Workload, ZooJob};
