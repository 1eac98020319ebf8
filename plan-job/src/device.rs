//! What the planner takes from a device profile: the copy link, its
//! configuration, a job's settings.

use tensile_latency_model::DeviceProfile;
use tensile_planner::{CopyModel, JobSettings, PlannerConfig};

/// The device's copy link as the planner and the simulator model it.
pub fn copy_model(p: &DeviceProfile) -> CopyModel {
    CopyModel {
        h2d_bytes_per_s: p.h2d_bytes_per_s,
        d2h_bytes_per_s: p.d2h_bytes_per_s,
        latency_ns: p.copy_latency_ns,
        half_duplex: p.is_half_duplex(),
        // The paper plans every job as if it had the link to itself.
        shared_by_jobs: !p.is_half_duplex(),
        host_bytes_per_s: p
            .host_update_bytes_per_s
            .unwrap_or(CopyModel::DEFAULT_HOST_BYTES_PER_S),
    }
}

/// The profile as each of `jobs` jobs sees it when they are threads of one
/// process (`tensile-worker --copies`): the base (CUDA context, library
/// handles) is the process's, paid once, so each job holds its share of it
/// (rounded up) instead of a whole one.
pub fn one_process(p: &DeviceProfile, jobs: usize) -> DeviceProfile {
    DeviceProfile {
        base_bytes: p.base_bytes.div_ceil(jobs.max(1) as u64),
        ..p.clone()
    }
}

/// The planner's configuration on `p`: its copy link, the budget the
/// jobs' peaks should fit (`None`: no budget), and whether to stop once
/// they fit (save only what must be saved) rather than swap all that can
/// be hidden.
pub fn planner_config(
    p: &DeviceProfile,
    budget_bytes: Option<u64>,
    stop_at_budget: bool,
) -> PlannerConfig {
    let mut c = PlannerConfig::new(copy_model(p));
    // What sharing the device costs, against which taking turns is weighed.
    c.sharing_slowdown = p.sharing_slowdown;
    c.budget_bytes = budget_bytes;
    c.stop_at_budget = stop_at_budget;
    c
}

/// A job's settings on `p` with every move of ours allowed: its base is
/// the profile's.
pub fn job_settings(p: &DeviceProfile) -> JobSettings {
    JobSettings {
        base_bytes: p.base_bytes,
        ..JobSettings::default()
    }
}
