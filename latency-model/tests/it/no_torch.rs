//! The serving crate links no libtorch: `cargo tree` over its normal and
//! build dependencies (offline, from the lock file) names neither `tch` nor
//! `torch-sys`, and does name ONNX Runtime's `ort`, so an empty or broken
//! listing cannot pass.

use std::process::Command;

/// The packages of `cargo tree -p tensile-latency-model -e <edges>`, one
/// name per line.
fn dependencies(edges: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "-p", "tensile-latency-model", "-e", edges])
        .args(["--prefix", "none", "--offline", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn serving_depends_on_neither_tch_nor_torch_sys() {
    let deps = dependencies("normal,build");
    assert!(deps.iter().any(|d| d == "ort"), "no ort in {deps:?}");
    assert!(
        deps.iter().any(|d| d == "tensile-graph"),
        "no tensile-graph in {deps:?}"
    );
    let torch: Vec<&String> = deps
        .iter()
        .filter(|d| *d == "tch" || *d == "torch-sys")
        .collect();
    assert!(
        torch.is_empty(),
        "tensile-latency-model must not link libtorch, but depends on {torch:?}"
    );
}
