//! One graph planned on its own (`tensilectl plan`): `tensile-plan-job`'s,
//! re-exported.

pub use tensile_plan_job::plan::{PlanOptions, PlanOutcome, PlanReport, plan_job};
