//! A device profile by the name a user gives (`--device`, `tensile.plan`'s
//! `device_profile`): a built-in GPU, `cpu`, or a profile file. The one
//! rule for every binary and the Python extension.

use std::path::Path;

use thiserror::Error;

use crate::{DeviceProfile, ProfileError};

/// The name of the profile of the CPU the shipped latency models were
/// measured on.
pub const CPU: &str = "cpu";

/// The `cpu` profile: the roofline calibrated on the same measurements as
/// the shipped CPU models (`models/cpu/roofline.json`), embedded so that a
/// binary or a wheel far from this source tree has it too.
const CPU_PROFILE: &str = include_str!("../models/cpu/roofline.json");

/// Why a device name gives no profile.
#[derive(Debug, Error)]
pub enum DeviceError {
    #[error("unknown device {name:?}: not a built-in profile ({builtins}, cpu) and no such file")]
    Unknown { name: String, builtins: String },
    #[error("device {name}")]
    Profile {
        name: String,
        #[source]
        source: ProfileError,
    },
}

/// A built-in profile (`a6000`, `h100`, `h200`, `paper`), `cpu` (the CPU the
/// shipped latency models were measured on, its roofline calibrated on the
/// same measurements), or a JSON profile file.
pub fn device_profile(name: &str) -> Result<DeviceProfile, DeviceError> {
    let failed = |source| DeviceError::Profile {
        name: name.to_string(),
        source,
    };
    if DeviceProfile::builtin_names().contains(&name) {
        return DeviceProfile::builtin(name).map_err(failed);
    }
    if name == CPU {
        return DeviceProfile::from_json(CPU_PROFILE).map_err(failed);
    }
    if !Path::new(name).exists() {
        return Err(DeviceError::Unknown {
            name: name.to_string(),
            builtins: DeviceProfile::builtin_names().join(", "),
        });
    }
    DeviceProfile::from_file(name).map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::shipped_cpu_models;

    #[test]
    fn the_embedded_cpu_profile_is_the_shipped_models_roofline() {
        let shipped = DeviceProfile::from_file(shipped_cpu_models().join("roofline.json"))
            .expect("the shipped roofline");
        assert_eq!(device_profile(CPU).expect("cpu"), shipped);
        assert_eq!(shipped.name, CPU);
    }

    #[test]
    fn names_are_built_ins_cpu_or_files() {
        assert_eq!(device_profile("h100").expect("h100").name, "h100");
        let e = device_profile("tpu").expect_err("no such device");
        assert_eq!(
            e.to_string(),
            "unknown device \"tpu\": not a built-in profile (a6000, h100, h200, paper, cpu) and no such file"
        );
        let dir = tempfile::tempdir().expect("a temporary folder");
        let file = dir.path().join("bad.json");
        std::fs::write(&file, "{").expect("written");
        let name = file.display().to_string();
        let e = device_profile(&name).expect_err("not a profile");
        assert_eq!(e.to_string(), format!("device {name}"));
    }
}
