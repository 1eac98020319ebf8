//! Where ours takes the latencies of its first (cold-start) plan from:
//! `tensile-plan-job`'s rule, re-exported for the simulations.

pub use tensile_plan_job::cold_start::{
    ColdStart, ColdStartLatencies, cold_start_latencies, relative_error,
};
