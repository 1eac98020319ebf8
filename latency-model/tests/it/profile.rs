//! Device profiles: the built-ins, files, and errors that name the field.

use serde_json::{Value, json};
use tensile_latency_model::{CopyDirection, CopyQueue, DeviceProfile, ProfileError};

const A6000: &str = include_str!("../../profiles/a6000.json");

/// The a6000 profile with `edit` applied to its JSON.
fn edited(edit: impl FnOnce(&mut Value)) -> Result<DeviceProfile, ProfileError> {
    let mut v: Value = serde_json::from_str(A6000).unwrap();
    edit(&mut v);
    DeviceProfile::from_json(&v.to_string())
}

/// The error of `result`, which must name `field`.
fn assert_names(result: Result<DeviceProfile, ProfileError>, field: &str) -> String {
    let err = result.unwrap_err();
    let msg = err.to_string();
    match &err {
        ProfileError::Invalid { field: f, .. } => assert_eq!(f, field, "{msg}"),
        other => panic!("expected an invalid-field error, got {other:?}"),
    }
    assert!(msg.contains(&format!("`{field}`")), "{msg}");
    msg
}

#[test]
fn builtins_parse_and_validate() {
    assert_eq!(
        DeviceProfile::builtin_names(),
        ["a6000", "h100", "h200", "paper"]
    );
    for name in DeviceProfile::builtin_names() {
        let p = DeviceProfile::builtin(name).unwrap();
        assert_eq!(p.name, name);
        p.validate().unwrap();
        assert!(p.base_bytes < p.memory_bytes);
    }
    let a = DeviceProfile::builtin("a6000").unwrap();
    assert_eq!(a.copy_queue, CopyQueue::Duplex);
    assert_eq!(a.h2d_bytes_per_s, 24e9);
    assert_eq!(a.peak_flops, 38.7e12);
    let h = DeviceProfile::builtin("h100").unwrap();
    assert!(h.d2h_bytes_per_s > h.h2d_bytes_per_s);
    assert!(h.memory_bytes > 80_000_000_000);
    // The paper's planner: A6000 compute, 12 GB/s, one half-duplex queue.
    let p = DeviceProfile::builtin("paper").unwrap();
    assert!(p.is_half_duplex());
    assert_eq!((p.h2d_bytes_per_s, p.d2h_bytes_per_s), (12e9, 12e9));
    assert_eq!(p.peak_flops, a.peak_flops);
    assert_eq!(p.efficiency, a.efficiency);
}

#[test]
fn unknown_builtin_lists_the_names() {
    let msg = DeviceProfile::builtin("v100").unwrap_err().to_string();
    assert!(msg.contains("\"v100\""), "{msg}");
    assert!(msg.contains("a6000, h100, h200, paper"), "{msg}");
}

#[test]
fn files_read_like_builtins() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/profiles");
    for name in DeviceProfile::builtin_names() {
        let p = DeviceProfile::from_file(format!("{dir}/{name}.json")).unwrap();
        assert_eq!(p, DeviceProfile::builtin(name).unwrap());
    }
    let err = DeviceProfile::from_file(format!("{dir}/missing.json")).unwrap_err();
    assert!(matches!(err, ProfileError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("missing.json"), "{err}");
}

#[test]
fn bad_json_is_an_error() {
    let err = DeviceProfile::from_json("{ \"name\": ").unwrap_err();
    assert!(matches!(err, ProfileError::Json { .. }), "{err:?}");
    let msg = assert_names(DeviceProfile::from_json("[1, 2]"), "(top level)");
    assert!(msg.contains("object"), "{msg}");
}

#[test]
fn missing_fields_are_named() {
    let msg = assert_names(
        edited(|v| {
            v.as_object_mut().unwrap().remove("h2d_bytes_per_s");
        }),
        "h2d_bytes_per_s",
    );
    assert!(msg.contains("missing"), "{msg}");
    assert_names(
        edited(|v| {
            v["efficiency"]["conv"]
                .as_object_mut()
                .unwrap()
                .remove("memory");
        }),
        "efficiency.conv.memory",
    );
}

#[test]
fn bad_values_are_named() {
    let msg = assert_names(
        edited(|v| v["d2h_bytes_per_s"] = json!(-24e9)),
        "d2h_bytes_per_s",
    );
    assert!(msg.contains("positive"), "{msg}");
    assert_names(edited(|v| v["peak_flops"] = json!(0.0)), "peak_flops");
    assert_names(
        edited(|v| v["mem_bytes_per_s"] = json!("fast")),
        "mem_bytes_per_s",
    );
    assert_names(edited(|v| v["memory_bytes"] = json!(-1)), "memory_bytes");
    assert_names(
        edited(|v| v["copy_latency_ns"] = json!(1.5)),
        "copy_latency_ns",
    );
    assert_names(edited(|v| v["memory_bytes"] = json!(0)), "memory_bytes");
    assert_names(edited(|v| v["base_bytes"] = json!(1e15)), "base_bytes");
    assert_names(edited(|v| v["copy_queue"] = json!("simplex")), "copy_queue");
    assert_names(
        edited(|v| v["sharing_slowdown"] = json!(-0.5)),
        "sharing_slowdown",
    );
    assert_names(
        edited(|v| v["efficiency"]["matmul"]["memory"] = json!(1.5)),
        "efficiency.matmul.memory",
    );
    assert_names(
        edited(|v| v["efficiency"]["optimizer"]["compute"] = json!(0)),
        "efficiency.optimizer.compute",
    );
    assert_names(
        edited(|v| v["estimate_efficiency"] = json!(2)),
        "estimate_efficiency",
    );
    assert_names(edited(|v| v["name"] = json!(" ")), "name");
}

#[test]
fn unknown_fields_are_named() {
    assert_names(edited(|v| v["half_duplex"] = json!(true)), "half_duplex");
    assert_names(
        edited(|v| v["efficiency"]["pooling"] = json!({"compute": 0.5, "memory": 0.5})),
        "efficiency.pooling",
    );
}

#[test]
fn whole_numbers_may_be_written_in_exponent_form() {
    let p = edited(|v| v["memory_bytes"] = json!(4.8e10)).unwrap();
    assert_eq!(p.memory_bytes, 48_000_000_000);
}

#[test]
fn copy_time_is_latency_plus_bytes_over_bandwidth() {
    let h = DeviceProfile::builtin("h100").unwrap();
    // 35 GB/s up, 50 GB/s down, 8 us per copy.
    assert_eq!(h.copy_ns(0, CopyDirection::HostToDevice), 8_000);
    assert_eq!(
        h.copy_ns(350_000_000, CopyDirection::HostToDevice),
        10_008_000
    );
    assert_eq!(
        h.copy_ns(350_000_000, CopyDirection::DeviceToHost),
        7_008_000
    );
}
