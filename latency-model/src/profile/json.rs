//! The on-disk JSON form of a [`DeviceProfile`], read field by field from a
//! `serde_json::Value` so that every error (missing, misspelt, of the wrong
//! type, negative where a count is due) names its field. Value ranges are
//! checked afterwards by [`DeviceProfile::validate`].

use serde_json::{Map, Value};

use crate::profile::{ClassEfficiency, CopyQueue, DeviceProfile, Efficiency, ProfileError};

/// Parses a profile without validating its values.
pub(super) fn parse(text: &str) -> Result<DeviceProfile, ProfileError> {
    let value: Value =
        serde_json::from_str(text).map_err(|source| ProfileError::Json { source })?;
    let profile = value
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_string();
    let mut top = Fields::new(&profile, "", &value)?;
    let queue = top.string("copy_queue")?;
    let copy_queue = CopyQueue::from_name(&queue).ok_or_else(|| {
        top.error(
            "copy_queue",
            format!("must be \"duplex\" or \"half_duplex\", got {queue:?}"),
        )
    })?;
    let mut eff = Fields::new(&profile, "efficiency.", &top.take("efficiency")?)?;
    let mut class = |name: &str| -> Result<ClassEfficiency, ProfileError> {
        let mut c = Fields::new(&profile, &format!("efficiency.{name}."), &eff.take(name)?)?;
        let e = ClassEfficiency {
            compute: c.number("compute")?,
            memory: c.number("memory")?,
        };
        c.finish()?;
        Ok(e)
    };
    let efficiency = Efficiency {
        conv: class("conv")?,
        matmul: class("matmul")?,
        normalization: class("normalization")?,
        elementwise: class("elementwise")?,
        reduction: class("reduction")?,
        optimizer: class("optimizer")?,
    };
    eff.finish()?;
    let p = DeviceProfile {
        name: top.string("name")?,
        description: top.string("description")?,
        memory_bytes: top.count("memory_bytes")?,
        h2d_bytes_per_s: top.number("h2d_bytes_per_s")?,
        d2h_bytes_per_s: top.number("d2h_bytes_per_s")?,
        copy_latency_ns: top.count("copy_latency_ns")?,
        copy_queue,
        peak_flops: top.number("peak_flops")?,
        mem_bytes_per_s: top.number("mem_bytes_per_s")?,
        kernel_launch_ns: top.count("kernel_launch_ns")?,
        base_bytes: top.count("base_bytes")?,
        sharing_slowdown: top.number("sharing_slowdown")?,
        efficiency,
        estimate_efficiency: top.number("estimate_efficiency")?,
        host_update_bytes_per_s: top.optional_number("host_update_bytes_per_s")?,
    };
    top.finish()?;
    Ok(p)
}

/// The fields of one JSON object, taken one by one; one never taken by
/// [`Fields::finish`] is an unknown field.
struct Fields<'a> {
    profile: &'a str,
    /// Path of this object, `efficiency.conv.` say, for error messages.
    prefix: String,
    map: Map<String, Value>,
    taken: Vec<String>,
}

impl<'a> Fields<'a> {
    fn new(profile: &'a str, prefix: &str, value: &Value) -> Result<Fields<'a>, ProfileError> {
        let fields = Fields {
            profile,
            prefix: prefix.to_string(),
            map: Map::new(),
            taken: Vec::new(),
        };
        match value {
            Value::Object(map) => Ok(Fields {
                map: map.clone(),
                ..fields
            }),
            _ => {
                let here = prefix.trim_end_matches('.');
                Err(if here.is_empty() {
                    ProfileError::Invalid {
                        profile: profile.into(),
                        field: "(top level)".into(),
                        reason: "must be a JSON object".into(),
                    }
                } else {
                    fields.error_at(here, "must be a JSON object".into())
                })
            }
        }
    }

    fn error(&self, field: &str, reason: String) -> ProfileError {
        self.error_at(&format!("{}{field}", self.prefix), reason)
    }

    fn error_at(&self, path: &str, reason: String) -> ProfileError {
        ProfileError::Invalid {
            profile: self.profile.into(),
            field: path.into(),
            reason,
        }
    }

    fn take(&mut self, field: &str) -> Result<Value, ProfileError> {
        let value = self.map.get(field).cloned();
        self.taken.push(field.to_string());
        value.ok_or_else(|| self.error(field, "is missing".into()))
    }

    fn string(&mut self, field: &str) -> Result<String, ProfileError> {
        match self.take(field)? {
            Value::String(s) => Ok(s.clone()),
            other => Err(self.error(field, format!("must be a string, got {other}"))),
        }
    }

    fn number(&mut self, field: &str) -> Result<f64, ProfileError> {
        let value = self.take(field)?;
        value
            .as_f64()
            .ok_or_else(|| self.error(field, format!("must be a number, got {value}")))
    }

    /// A number that may be left out.
    fn optional_number(&mut self, field: &str) -> Result<Option<f64>, ProfileError> {
        if !self.map.contains_key(field) {
            self.taken.push(field.to_string());
            return Ok(None);
        }
        self.number(field).map(Some)
    }

    /// A non-negative whole number (bytes, nanoseconds); `1e9` is accepted.
    fn count(&mut self, field: &str) -> Result<u64, ProfileError> {
        let value = self.take(field)?;
        if let Some(v) = value.as_u64() {
            return Ok(v);
        }
        match value.as_f64() {
            // Whole numbers up to 2^53, which an f64 holds exactly.
            Some(v) if v >= 0.0 && v.fract() == 0.0 && v <= (1u64 << 53) as f64 => Ok(v as u64),
            _ => Err(self.error(
                field,
                format!("must be a non-negative whole number, got {value}"),
            )),
        }
    }

    fn finish(&self) -> Result<(), ProfileError> {
        match self.map.keys().find(|k| !self.taken.contains(k)) {
            Some(extra) => Err(self.error(extra, "is not a profile field".into())),
            None => Ok(()),
        }
    }
}
