//! Device profiles: what one GPU model offers a planner and a simulator
//! (memory, copy engines and their bandwidths, compute and memory peaks,
//! kernel launch cost, how co-running jobs slow each other) and how well each
//! class of kernel uses those peaks.
//!
//! Profiles are JSON config files (`latency-model/profiles/*.json`); the
//! built-in ones are embedded in the binary and chosen by name with
//! [`DeviceProfile::builtin`]. Every profile, built-in or read from a file,
//! passes the same validation, and a bad one is an error naming the field.
//! The JSON reading lives in the private `json` submodule only, so
//! [`DeviceProfile`] itself carries no serde.

mod json;

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::roofline::OpClass;

/// The copy engines a job's swaps run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CopyQueue {
    /// Separate host-to-device and device-to-host engines: a swap-out and a
    /// prefetch run at the same time, each at its own direction's bandwidth.
    #[default]
    Duplex,
    /// One queue for both directions per job, as the TENSILE paper's planner
    /// assumes: copies run one after another.
    HalfDuplex,
}

impl CopyQueue {
    /// The name used in profile files: `duplex` or `half_duplex`.
    pub fn name(self) -> &'static str {
        match self {
            CopyQueue::Duplex => "duplex",
            CopyQueue::HalfDuplex => "half_duplex",
        }
    }

    pub fn from_name(name: &str) -> Option<CopyQueue> {
        [CopyQueue::Duplex, CopyQueue::HalfDuplex]
            .into_iter()
            .find(|q| q.name() == name)
    }
}

/// The direction of a copy over the host link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CopyDirection {
    /// Host to device: a prefetch / swap-in.
    HostToDevice,
    /// Device to host: a swap-out.
    DeviceToHost,
}

/// The fraction of a device's peaks one class of kernel reaches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassEfficiency {
    /// Multiple of [`DeviceProfile::peak_flops`] (the FP32 peak), in
    /// `(0, MAX_COMPUTE_EFFICIENCY]`: above 1 where the class runs on tensor
    /// cores faster than FP32 arithmetic (PyTorch lets cuDNN run FP32
    /// convolutions as TF32, which on Hopper beats the FP32 peak).
    pub compute: f64,
    /// Fraction of [`DeviceProfile::mem_bytes_per_s`], in `(0, 1]`.
    pub memory: f64,
}

/// The largest [`ClassEfficiency::compute`] a profile may hold.
pub const MAX_COMPUTE_EFFICIENCY: f64 = 16.0;

/// Efficiencies of every kernel class ([`OpClass`] other than `View`, whose
/// ops launch no kernel).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Efficiency {
    pub conv: ClassEfficiency,
    pub matmul: ClassEfficiency,
    pub normalization: ClassEfficiency,
    pub elementwise: ClassEfficiency,
    pub reduction: ClassEfficiency,
    pub optimizer: ClassEfficiency,
}

impl Efficiency {
    /// The efficiency of a class; `None` for [`OpClass::View`].
    pub fn of(&self, class: OpClass) -> Option<ClassEfficiency> {
        Some(match class {
            OpClass::Conv => self.conv,
            OpClass::Matmul => self.matmul,
            OpClass::Normalization => self.normalization,
            OpClass::Elementwise => self.elementwise,
            OpClass::Reduction => self.reduction,
            OpClass::Optimizer => self.optimizer,
            OpClass::View => return None,
        })
    }
}

/// One GPU model, as the planner and the simulator see it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceProfile {
    /// Short name (`a6000`), used to pick a built-in profile.
    pub name: String,
    pub description: String,
    /// Total device memory.
    pub memory_bytes: u64,
    /// Host-to-device copy bandwidth (pinned memory, measured, one direction).
    pub h2d_bytes_per_s: f64,
    /// Device-to-host copy bandwidth (pinned memory, measured, one direction).
    pub d2h_bytes_per_s: f64,
    /// Fixed cost of every copy (launch and DMA setup).
    pub copy_latency_ns: u64,
    pub copy_queue: CopyQueue,
    /// Peak dense FP32 arithmetic (no tensor cores), FLOP/s, a multiply-add
    /// counting as two. Per-class efficiencies scale it.
    pub peak_flops: f64,
    /// Peak device-memory bandwidth.
    pub mem_bytes_per_s: f64,
    /// Fixed cost of every kernel: launch and the ramp up and down of its waves.
    pub kernel_launch_ns: u64,
    /// Memory every job holds before its first tensor: CUDA context, cuDNN
    /// and cuBLAS handles and workspaces.
    pub base_bytes: u64,
    /// How co-running jobs slow each other: each of `k` kernels that overlap
    /// in time runs at `1 / (1 + sharing_slowdown * (k - 1))` of its own
    /// speed. 0: no interference; 1: fair processor sharing, no gain from
    /// overlap; between: overlapping kernels fill each other's idle SMs.
    pub sharing_slowdown: f64,
    /// Per-class fractions of the peaks that the roofline uses.
    pub efficiency: Efficiency,
    /// The one efficiency (of both peaks) that the cold-start estimate
    /// ([`crate::estimate_latencies`]) applies to every kernel class.
    pub estimate_efficiency: f64,
    /// How fast one job's host ops (an optimizer update kept on the host
    /// CPU) move host memory: bytes read and written per second
    /// ([`tensile_graph::Graph::host_traffic_bytes`]; Adam moves 28 bytes
    /// per f32 parameter). `None`: not given (the planner's copy model
    /// then takes the build machine's measured figure).
    pub host_update_bytes_per_s: Option<f64>,
}

/// The built-in profiles, by name, as embedded JSON.
const BUILTIN: [(&str, &str); 4] = [
    ("a6000", include_str!("../profiles/a6000.json")),
    ("h100", include_str!("../profiles/h100.json")),
    ("h200", include_str!("../profiles/h200.json")),
    ("paper", include_str!("../profiles/paper.json")),
];

/// Why a profile could not be had.
#[derive(Debug, Error)]
pub enum ProfileError {
    #[error("unknown device profile {name:?}; the built-in profiles are {}", DeviceProfile::builtin_names().join(", "))]
    Unknown { name: String },
    /// Not JSON at all; field-level problems are [`ProfileError::Invalid`].
    #[error("device profile is not valid JSON: {source}")]
    Json {
        #[source]
        source: serde_json::Error,
    },
    #[error("device profile {profile:?}: field `{field}` {reason}")]
    Invalid {
        profile: String,
        field: String,
        reason: String,
    },
    #[error("cannot read device profile {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Largest profile file read, far above any real one.
const MAX_FILE_BYTES: u64 = 1 << 20;

impl DeviceProfile {
    /// The names of the built-in profiles: `a6000`, `h100`, `h200`, `paper`.
    pub fn builtin_names() -> Vec<&'static str> {
        BUILTIN.iter().map(|(name, _)| *name).collect()
    }

    /// A built-in profile by name.
    pub fn builtin(name: &str) -> Result<DeviceProfile, ProfileError> {
        let (_, text) = BUILTIN
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or_else(|| ProfileError::Unknown { name: name.into() })?;
        DeviceProfile::from_json(text)
    }

    /// Parses and validates a profile. Every field is required and unknown
    /// fields are errors, so that a misspelt field is not silently ignored.
    pub fn from_json(text: &str) -> Result<DeviceProfile, ProfileError> {
        let profile = json::parse(text)?;
        profile.validate()?;
        Ok(profile)
    }

    /// Reads, parses and validates a profile file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<DeviceProfile, ProfileError> {
        let path = path.as_ref();
        let io = |source| ProfileError::Io {
            path: path.to_path_buf(),
            source,
        };
        let len = std::fs::metadata(path).map_err(io)?.len();
        if len > MAX_FILE_BYTES {
            return Err(io(std::io::Error::other(format!(
                "{len} bytes is over the {MAX_FILE_BYTES}-byte limit"
            ))));
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        DeviceProfile::from_json(&text)
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let fail = |field: &str, reason: String| ProfileError::Invalid {
            profile: self.name.clone(),
            field: field.into(),
            reason,
        };
        if self.name.trim().is_empty() {
            return Err(fail("name", "must not be empty".into()));
        }
        if self.memory_bytes == 0 {
            return Err(fail("memory_bytes", "must be positive".into()));
        }
        if self.base_bytes >= self.memory_bytes {
            return Err(fail(
                "base_bytes",
                format!(
                    "must be less than memory_bytes ({}), got {}",
                    self.memory_bytes, self.base_bytes
                ),
            ));
        }
        for (field, value) in [
            ("h2d_bytes_per_s", self.h2d_bytes_per_s),
            ("d2h_bytes_per_s", self.d2h_bytes_per_s),
            ("peak_flops", self.peak_flops),
            ("mem_bytes_per_s", self.mem_bytes_per_s),
            (
                "host_update_bytes_per_s",
                self.host_update_bytes_per_s.unwrap_or(1.0),
            ),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(fail(
                    field,
                    format!("must be a positive finite number, got {value}"),
                ));
            }
        }
        let s = self.sharing_slowdown;
        if !(s.is_finite() && (0.0..=16.0).contains(&s)) {
            return Err(fail(
                "sharing_slowdown",
                format!("must be a number from 0 to 16, got {s}"),
            ));
        }
        let in_range = |field: String, value: f64, max: f64| {
            if value.is_finite() && value > 0.0 && value <= max {
                Ok(())
            } else {
                Err(fail(&field, format!("must be in (0, {max}], got {value}")))
            }
        };
        in_range("estimate_efficiency".into(), self.estimate_efficiency, 1.0)?;
        for class in OpClass::ALL {
            if let Some(e) = self.efficiency.of(class) {
                let prefix = format!("efficiency.{}", class.name());
                in_range(
                    format!("{prefix}.compute"),
                    e.compute,
                    MAX_COMPUTE_EFFICIENCY,
                )?;
                in_range(format!("{prefix}.memory"), e.memory, 1.0)?;
            }
        }
        Ok(())
    }

    /// One copy queue for both directions (the TENSILE paper's model).
    pub fn is_half_duplex(&self) -> bool {
        self.copy_queue == CopyQueue::HalfDuplex
    }

    /// The bandwidth of one copy direction.
    pub fn copy_bytes_per_s(&self, direction: CopyDirection) -> f64 {
        match direction {
            CopyDirection::HostToDevice => self.h2d_bytes_per_s,
            CopyDirection::DeviceToHost => self.d2h_bytes_per_s,
        }
    }

    /// Nanoseconds one copy of `bytes` takes alone on the link: the fixed
    /// latency plus the bytes at the direction's bandwidth.
    pub fn copy_ns(&self, bytes: u64, direction: CopyDirection) -> u64 {
        let transfer = (bytes as f64 / self.copy_bytes_per_s(direction) * 1e9).ceil();
        self.copy_latency_ns.saturating_add(transfer as u64)
    }
}
