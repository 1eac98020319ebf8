//! The learned predictor: ONNX export round trip against tch, the shipped
//! models on every zoo op, and clear errors for bad model directories.

use std::path::{Path, PathBuf};

use tensile_latency_model::dataset::Sample;
use tensile_latency_model::predict::{MANIFEST_FORMAT, Manifest, ModelEntry, shipped_cpu_models};
use tensile_latency_model::train::{TrainConfig, train};
use tensile_latency_model::{FEATURE_LEN, Predictor, Source, op_class, op_features};

use crate::util::{tiny_cnn, zoo_graphs};

/// A fresh scratch directory under the system temp dir.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tensile-lat-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Copies the shipped model directory (manifest, profile, models) into `dir`.
fn copy_shipped(dir: &Path) {
    for entry in std::fs::read_dir(shipped_cpu_models()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        std::fs::copy(&path, dir.join(name)).unwrap();
    }
}

/// Synthetic samples: every kernel op of the tiny CNN at three loads, with
/// a latency that grows with its work.
fn synthetic() -> Vec<Sample> {
    let g = tiny_cnn();
    let mut out = Vec::new();
    for op in g
        .ops()
        .iter()
        .filter(|o| o.op_type == "aten::convolution_backward")
    {
        for load in 0..3 {
            let f = op_features(&g, op, load as f32 / 2.0).unwrap();
            out.push(Sample {
                op_type: op.op_type.clone(),
                features: f.to_vec(),
                load,
                ns: 1000 + 300 * u64::from(load),
                runs: 1,
                source: "synthetic".into(),
            });
        }
    }
    // Vary the shapes so the normalisation has spread to work with.
    for (i, s) in out.clone().iter().enumerate() {
        let mut t = s.clone();
        t.features[2] += i as f32;
        t.ns += 500 * i as u64;
        out.push(t);
    }
    out
}

#[test]
fn onnx_export_runs_in_ort_as_tch_computes_it() {
    let samples = synthetic();
    let refs: Vec<&Sample> = samples.iter().collect();
    let config = TrainConfig {
        epochs: 200,
        hidden: 16,
        ..TrainConfig::default()
    };
    let net = train(&refs, &config).unwrap();
    let mlp = net.to_mlp().unwrap();
    let dir = scratch("roundtrip");
    let op_type = "aten::convolution_backward";
    std::fs::write(
        dir.join("m.onnx"),
        tensile_latency_model::onnx::export(&mlp),
    )
    .unwrap();
    std::fs::copy(
        shipped_cpu_models().join("roofline.json"),
        dir.join("roofline.json"),
    )
    .unwrap();
    let manifest = Manifest {
        format: MANIFEST_FORMAT.into(),
        device: "test".into(),
        feature_len: FEATURE_LEN,
        roofline: "roofline.json".into(),
        heldout: "heldout.jsonl".into(),
        models: vec![ModelEntry {
            op_type: op_type.into(),
            file: "m.onnx".into(),
            train_samples: samples.len(),
            heldout_samples: 0,
        }],
    };
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_string(&manifest).unwrap(),
    )
    .unwrap();
    let predictor = Predictor::load(&dir).unwrap();
    let rows: Vec<f32> = samples.iter().flat_map(|s| s.features.clone()).collect();
    let ours = predictor.predict_rows(op_type, &rows).unwrap().unwrap();
    let theirs = net.forward(&rows).unwrap();
    assert_eq!(ours.len(), samples.len());
    for (a, b) in ours.iter().zip(&theirs) {
        // ln(ns) is around 7 to 9 here: 1e-5 relative is a few ulps of f32.
        assert!(
            (a - b).abs() <= 1e-5 * b.abs().max(1.0),
            "ort {a} vs tch {b}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn shipped_models_predict_every_zoo_op_positive() {
    let predictor = Predictor::load(&shipped_cpu_models()).unwrap();
    for g in zoo_graphs(2) {
        let p = predictor.predict_graph(&g, 0.0).unwrap();
        assert_eq!(p.ns_per_op.len(), g.ops().len());
        for ((op, &ns), &src) in g.ops().iter().zip(&p.ns_per_op).zip(&p.source_per_op) {
            if op_class(op).is_kernel() {
                assert!(ns > 0, "{} {}: {ns} ns", g.name(), op.name);
                assert_ne!(src, Source::View, "{} {}", g.name(), op.name);
                // Within reason for one CPU thread: under a minute per op.
                assert!(ns < 60_000_000_000, "{} {}: {ns} ns", g.name(), op.name);
            } else {
                assert_eq!((ns, src), (0, Source::View), "{} {}", g.name(), op.name);
            }
        }
        let learned = p
            .source_per_op
            .iter()
            .filter(|&&s| s == Source::Model)
            .count();
        assert!(learned > 0, "{}: no op used a learned model", g.name());
    }
}

#[test]
fn a_corrupt_model_file_is_an_error_naming_it() {
    let dir = scratch("corrupt");
    copy_shipped(&dir);
    let victim = "aten__convolution.onnx";
    std::fs::write(dir.join(victim), b"this is not protobuf").unwrap();
    let err = Predictor::load(&dir).unwrap_err().to_string();
    assert!(err.contains(victim), "{err}");
    assert!(err.contains("not a usable ONNX model"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_model_file_or_manifest_is_an_error_naming_it() {
    let dir = scratch("missing");
    copy_shipped(&dir);
    std::fs::remove_file(dir.join("aten__addmm.onnx")).unwrap();
    let err = Predictor::load(&dir).unwrap_err().to_string();
    assert!(err.contains("aten__addmm.onnx"), "{err}");
    std::fs::remove_file(dir.join("manifest.json")).unwrap();
    let err = Predictor::load(&dir).unwrap_err().to_string();
    assert!(err.contains("manifest.json"), "{err}");
    std::fs::write(dir.join("manifest.json"), "{\"format\": 3}").unwrap();
    let err = Predictor::load(&dir).unwrap_err().to_string();
    assert!(err.contains("manifest.json"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
