//! Calibrating a roofline device profile against measurements: per op
//! class, the compute and memory efficiencies, and one kernel launch cost,
//! that minimise the mean absolute log error of the roofline time over the
//! samples measured without background load. A grid search: the roofline
//! is not differentiable at its kink, and the grid is small.
//!
//! The FLOPs and bytes are read back from the features (slots 29 and 30
//! hold `log2(1 + x)`), so calibrating needs no graph.

use std::collections::BTreeMap;

use tensile_latency_model::dataset::Sample;
use tensile_latency_model::profile::{DeviceProfile, MAX_COMPUTE_EFFICIENCY, ProfileError};
use tensile_latency_model::roofline::{OpClass, op_class_of_type};

/// The fixed part of a profile: what calibration does not fit.
#[derive(Debug, Clone)]
pub struct Base {
    pub name: String,
    pub description: String,
    pub memory_bytes: u64,
    pub peak_flops: f64,
    pub mem_bytes_per_s: f64,
}

/// Launch costs tried, ns.
const LAUNCH: [f64; 7] = [250.0, 500.0, 1000.0, 2000.0, 4000.0, 8000.0, 16000.0];

/// The calibrated profile and its mean absolute log error per class.
pub fn calibrate(
    base: &Base,
    samples: &[Sample],
) -> Result<(DeviceProfile, BTreeMap<&'static str, f64>), ProfileError> {
    let mut by_class: BTreeMap<OpClass, Vec<(f64, f64, f64)>> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.load == 0) {
        let class = op_class_of_type(&s.op_type);
        if !class.is_kernel() {
            continue;
        }
        let back = |x: f32| f64::from(x).exp2() - 1.0;
        by_class.entry(class).or_default().push((
            back(s.features[29]),
            back(s.features[30]),
            s.ns.max(1) as f64,
        ));
    }
    let compute: Vec<f64> = geomspace(0.005, MAX_COMPUTE_EFFICIENCY, 40);
    let memory: Vec<f64> = geomspace(0.005, 1.0, 30);
    let mut best = (f64::INFINITY, 0.0, BTreeMap::new());
    for launch in LAUNCH {
        let mut total = 0.0;
        let mut fits = BTreeMap::new();
        for (&class, pts) in &by_class {
            let mut fit = (f64::INFINITY, 1.0, 1.0);
            for &c in &compute {
                for &m in &memory {
                    let err: f64 = pts
                        .iter()
                        .map(|&(flops, bytes, ns)| {
                            let t = launch
                                + (flops / (base.peak_flops * c))
                                    .max(bytes / (base.mem_bytes_per_s * m))
                                    * 1e9;
                            (t / ns).ln().abs()
                        })
                        .sum::<f64>()
                        / pts.len() as f64;
                    if err < fit.0 {
                        fit = (err, c, m);
                    }
                }
            }
            total += fit.0 * pts.len() as f64;
            fits.insert(class, fit);
        }
        if total < best.0 {
            best = (total, launch, fits);
        }
    }
    let (_, launch, fits) = best;
    let eff = |class: OpClass| {
        let (_, c, m) = fits.get(&class).copied().unwrap_or((0.0, 1.0, 1.0));
        serde_json::json!({ "compute": c, "memory": m })
    };
    let json = serde_json::json!({
        "name": base.name,
        "description": base.description,
        "memory_bytes": base.memory_bytes,
        "h2d_bytes_per_s": base.mem_bytes_per_s,
        "d2h_bytes_per_s": base.mem_bytes_per_s,
        "copy_latency_ns": 1000,
        "copy_queue": "duplex",
        "peak_flops": base.peak_flops,
        "mem_bytes_per_s": base.mem_bytes_per_s,
        "kernel_launch_ns": launch as u64,
        "base_bytes": 0,
        "sharing_slowdown": 1.0,
        "efficiency": {
            "conv": eff(OpClass::Conv),
            "matmul": eff(OpClass::Matmul),
            "normalization": eff(OpClass::Normalization),
            "elementwise": eff(OpClass::Elementwise),
            "reduction": eff(OpClass::Reduction),
            "optimizer": eff(OpClass::Optimizer),
        },
        "estimate_efficiency": 0.5,
    });
    let text = serde_json::to_string_pretty(&json).unwrap_or_default();
    let profile = DeviceProfile::from_json(&text)?;
    let errors = fits.iter().map(|(c, f)| (c.name(), f.0)).collect();
    Ok((profile, errors))
}

/// The profile as JSON, in the format of `profiles/*.json`.
pub fn profile_json(samples_profile: &DeviceProfile) -> String {
    let p = samples_profile;
    let eff = |class: OpClass| {
        let e = p
            .efficiency
            .of(class)
            .map_or((1.0, 1.0), |e| (e.compute, e.memory));
        serde_json::json!({ "compute": e.0, "memory": e.1 })
    };
    let json = serde_json::json!({
        "name": p.name,
        "description": p.description,
        "memory_bytes": p.memory_bytes,
        "h2d_bytes_per_s": p.h2d_bytes_per_s,
        "d2h_bytes_per_s": p.d2h_bytes_per_s,
        "copy_latency_ns": p.copy_latency_ns,
        "copy_queue": p.copy_queue.name(),
        "peak_flops": p.peak_flops,
        "mem_bytes_per_s": p.mem_bytes_per_s,
        "kernel_launch_ns": p.kernel_launch_ns,
        "base_bytes": p.base_bytes,
        "sharing_slowdown": p.sharing_slowdown,
        "efficiency": {
            "conv": eff(OpClass::Conv),
            "matmul": eff(OpClass::Matmul),
            "normalization": eff(OpClass::Normalization),
            "elementwise": eff(OpClass::Elementwise),
            "reduction": eff(OpClass::Reduction),
            "optimizer": eff(OpClass::Optimizer),
        },
        "estimate_efficiency": p.estimate_efficiency,
    });
    let mut text = serde_json::to_string_pretty(&json).unwrap_or_default();
    text.push('\n');
    text
}

fn geomspace(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| lo * (hi / lo).powf(i as f64 / (n - 1).max(1) as f64))
        .collect()
}
