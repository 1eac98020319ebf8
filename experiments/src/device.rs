//! Device profiles by name, and what the planner and the simulator take
//! from a profile: the copy link, the planner's configuration
//! (`tensile-plan-job`'s, re-exported), and each job's settings under a
//! policy.

use tensile_baselines::Policy;
use tensile_latency_model::DeviceProfile;
use tensile_planner::JobSettings;

pub use tensile_latency_model::device_profile;
pub use tensile_plan_job::device::{copy_model, one_process, planner_config};

/// Every job's settings under `policy`: vanilla is the planner with every
/// move turned off, so that it runs through the same re-planner as ours.
pub fn job_settings(policy: Policy, p: &DeviceProfile) -> JobSettings {
    let mut s = tensile_plan_job::job_settings(p);
    if policy == Policy::Vanilla {
        s.swap = false;
        s.recompute = false;
        s.across_iteration = false;
    }
    s
}
