//! The range of every number and string a client sends, checked where it
//! comes off the wire: a value out of range is an `INVALID_ARGUMENT` that
//! names the field and the range, and the planning task only ever sees
//! values inside them. The ranges are far beyond any real job, and small
//! enough that the planner's time and byte arithmetic cannot overflow
//! (an iteration of at most a day is 8.64e13 ns; u64 holds 1.8e19).

use tensile_graph::Graph;

use crate::error::Error;

/// The longest one op may take, in seconds (an hour).
pub const MAX_OP_LATENCY_S: f64 = 3600.0;
/// The longest one iteration may take, its ops' latencies (and a report's
/// stall) added up, in seconds (a day).
pub const MAX_ITERATION_S: f64 = 86_400.0;
/// The most device memory a job's base or a budget may name (1 PiB).
pub const MAX_BYTES: u64 = 1 << 50;
/// The slowest and fastest copy rates a device may name, in bytes/s
/// (1 MB/s to 1 PB/s).
pub const MIN_RATE: f64 = 1e6;
pub const MAX_RATE: f64 = 1e15;
/// The longest job name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// Per-op seconds from the wire as ns: one per op, each finite, in
/// `[0, MAX_OP_LATENCY_S]`, adding up to at most `MAX_ITERATION_S`.
pub fn latencies_ns(graph: &Graph, s: &[f64], what: &str) -> Result<Vec<u64>, Error> {
    if s.len() != graph.ops().len() {
        return Err(Error::InvalidArgument(format!(
            "{what} has {} entries; the graph has {} ops (one latency per op, by op id)",
            s.len(),
            graph.ops().len()
        )));
    }
    for (i, &x) in s.iter().enumerate() {
        if !(x.is_finite() && (0.0..=MAX_OP_LATENCY_S).contains(&x)) {
            return Err(Error::InvalidArgument(format!(
                "{what}[{i}] (op {i} {:?}) is {x}: a latency must be finite, in [0, {MAX_OP_LATENCY_S}] s",
                graph.ops()[i].name
            )));
        }
    }
    let total: f64 = s.iter().sum();
    if total > MAX_ITERATION_S {
        return Err(Error::InvalidArgument(format!(
            "{what} adds up to {total} s: an iteration must take at most {MAX_ITERATION_S} s"
        )));
    }
    Ok(s.iter().map(|&x| (x * 1e9).round() as u64).collect())
}

/// A report's stall in seconds: finite, in `[0, MAX_ITERATION_S]`.
pub fn stall_s(x: f64) -> Result<f64, Error> {
    if x.is_finite() && (0.0..=MAX_ITERATION_S).contains(&x) {
        Ok(x)
    } else {
        Err(Error::InvalidArgument(format!(
            "stall_s is {x}: it must be finite, in [0, {MAX_ITERATION_S}] s"
        )))
    }
}

/// A byte count (a job's base, a budget): at most `MAX_BYTES`.
pub fn bytes(field: &str, x: u64) -> Result<u64, Error> {
    if x <= MAX_BYTES {
        Ok(x)
    } else {
        Err(Error::InvalidArgument(format!(
            "{field} is {x}: at most {MAX_BYTES} bytes (1 PiB)"
        )))
    }
}

/// A report's measured base (`base_bytes`): 0 (not measured) or at most
/// the device's memory (`device_bytes`). Past it the figure is not a
/// measurement (NVML's "not available" is 2^64-1).
pub fn measured_base(x: u64, device_bytes: u64) -> Result<u64, Error> {
    if x <= device_bytes {
        Ok(x)
    } else {
        Err(Error::InvalidArgument(format!(
            "base_bytes is {x}: more than the device's {device_bytes} bytes (the process's device memory outside the job's storages, as measured; 0: not measured)"
        )))
    }
}

/// A copy rate in bytes per second: finite, in `[MIN_RATE, MAX_RATE]` (a
/// rate near 0 would make every copy take longer than any time line).
pub fn rate(field: &str, x: f64) -> Result<f64, Error> {
    if x.is_finite() && (MIN_RATE..=MAX_RATE).contains(&x) {
        Ok(x)
    } else {
        Err(Error::InvalidArgument(format!(
            "{field} is {x}: it must be finite, in [{MIN_RATE}, {MAX_RATE}] bytes/s"
        )))
    }
}

/// A job's name: at most `MAX_NAME_BYTES` bytes, no control characters
/// (it is echoed in logs and status tables).
pub fn name(x: &str) -> Result<&str, Error> {
    if x.len() > MAX_NAME_BYTES {
        return Err(Error::InvalidArgument(format!(
            "name has {} bytes: at most {MAX_NAME_BYTES}",
            x.len()
        )));
    }
    if let Some(c) = x.chars().find(|c| c.is_control()) {
        return Err(Error::InvalidArgument(format!(
            "name contains the control character {c:?}"
        )));
    }
    Ok(x)
}

/// A job's process key (`RegisterJobRequest.process`): "" (a process of
/// its own) or at most `MAX_NAME_BYTES` bytes with no control characters
/// (it is shown in status tables).
pub fn process(x: &str) -> Result<Option<String>, Error> {
    if x.len() > MAX_NAME_BYTES {
        return Err(Error::InvalidArgument(format!(
            "process has {} bytes: at most {MAX_NAME_BYTES}",
            x.len()
        )));
    }
    if let Some(c) = x.chars().find(|c| c.is_control()) {
        return Err(Error::InvalidArgument(format!(
            "process contains the control character {c:?}"
        )));
    }
    Ok((!x.is_empty()).then(|| x.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_key_is_empty_or_short_and_printable() {
        assert_eq!(process("").ok(), Some(None));
        assert_eq!(process("h:12:ab").ok(), Some(Some("h:12:ab".into())));
        let e = process(&"p".repeat(MAX_NAME_BYTES + 1)).unwrap_err();
        assert!(e.to_string().contains("process has 257 bytes"), "{e}");
        let e = process("a\nb").unwrap_err();
        assert!(e.to_string().contains("process contains"), "{e}");
    }

    #[test]
    fn the_ranges_refuse_what_they_are_for() {
        assert!(stall_s(0.5).is_ok());
        for bad in [f64::NAN, -1.0, 1e12, f64::INFINITY] {
            let e = stall_s(bad).unwrap_err().to_string();
            assert!(e.contains("stall_s"), "{e}");
        }
        assert!(bytes("settings.base_bytes", MAX_BYTES).is_ok());
        let e = bytes("settings.base_bytes", u64::MAX)
            .unwrap_err()
            .to_string();
        assert!(e.contains("settings.base_bytes"), "{e}");
        assert_eq!(measured_base(0, 80e9 as u64).ok(), Some(0));
        assert!(measured_base(80e9 as u64, 80e9 as u64).is_ok());
        for bad in [80e9 as u64 + 1, u64::MAX] {
            let e = measured_base(bad, 80e9 as u64).unwrap_err().to_string();
            assert!(e.contains("base_bytes") && e.contains("80000000000"), "{e}");
        }
        assert!(rate("device.h2d_bytes_per_s", 24e9).is_ok());
        assert!(rate("device.h2d_bytes_per_s", 1e-300).is_err());
        assert!(name("resnet50 #2").is_ok());
        assert!(name(&"x".repeat(MAX_NAME_BYTES + 1)).is_err());
        assert!(name("a\nb").is_err());
    }
}
