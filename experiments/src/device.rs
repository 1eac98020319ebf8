//! Device profiles by name, and what the planner and the simulator take
//! from a profile: the copy link, the planner's configuration, each job's
//! settings under a policy.

use std::path::Path;

use tensile_baselines::Policy;
use tensile_latency_model::DeviceProfile;
use tensile_latency_model::manifest::shipped_cpu_models;
use tensile_planner::{CopyModel, JobSettings, PlannerConfig};

use crate::ExperimentError;

/// A built-in profile (`a6000`, `h100`, `paper`), `cpu` (the CPU the
/// shipped latency models were measured on, its roofline calibrated on the
/// same measurements), or a JSON profile file.
pub fn device_profile(name: &str) -> Result<DeviceProfile, ExperimentError> {
    let failed = |source| ExperimentError::Device {
        name: name.to_string(),
        source,
    };
    if DeviceProfile::builtin_names().contains(&name) {
        return DeviceProfile::builtin(name).map_err(failed);
    }
    if name == "cpu" {
        return DeviceProfile::from_file(shipped_cpu_models().join("roofline.json"))
            .map_err(failed);
    }
    if !Path::new(name).exists() {
        return Err(ExperimentError::UnknownDevice {
            name: name.to_string(),
            builtins: DeviceProfile::builtin_names().join(", "),
        });
    }
    DeviceProfile::from_file(name).map_err(failed)
}

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

pub fn planner_config(
    p: &DeviceProfile,
    budget_bytes: Option<u64>,
    stop_at_budget: bool,
) -> PlannerConfig {
    let mut c = PlannerConfig::new(copy_model(p));
    c.budget_bytes = budget_bytes;
    c.stop_at_budget = stop_at_budget;
    c
}

/// Every job's settings under `policy`: vanilla is the planner with every
/// move turned off, so that it runs through the same re-planner as ours.
pub fn job_settings(policy: Policy, p: &DeviceProfile) -> JobSettings {
    let mut s = JobSettings {
        base_bytes: p.base_bytes,
        ..JobSettings::default()
    };
    if policy == Policy::Vanilla {
        s.swap = false;
        s.recompute = false;
        s.across_iteration = false;
    }
    s
}
