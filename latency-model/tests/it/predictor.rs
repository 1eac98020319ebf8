//! The learned predictor: the shipped models on every zoo op, and clear
//! errors for bad model directories. (The ONNX export's round trip against
//! tch is tested in `tensile-latency-train`.)

use std::path::{Path, PathBuf};
use std::time::Duration;

use tensile_latency_model::manifest::shipped_cpu_models;
use tensile_latency_model::{Predictor, Source, op_class, op_features};

use crate::util::{zoo_graph, zoo_graphs};

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
fn a_graph_predicts_what_its_ops_predict_one_by_one() {
    // predict_graph batches each op type's rows and runs each distinct row
    // once; neither may change a prediction beyond float rounding.
    let predictor = Predictor::load(&shipped_cpu_models()).unwrap();
    for (name, batch) in [("resnet50", 2), ("densenet121", 1), ("bert_base", 1)] {
        let g = zoo_graph(name, batch);
        let (p, timing) = predictor.predict_graph_timed(&g, 0.25).unwrap();
        assert_eq!(p, predictor.predict_graph(&g, 0.25).unwrap());
        let from_model = p.source_per_op.iter().filter(|&&s| s == Source::Model);
        assert!(timing.rows < from_model.count(), "{name}: no row shared");
        assert!(
            timing.run_calls > 0 && timing.runs > Duration::ZERO,
            "{name}"
        );
        for (op, (&ns, &src)) in g.ops().iter().zip(p.ns_per_op.iter().zip(&p.source_per_op)) {
            if src != Source::Model {
                continue;
            }
            let f = op_features(&g, op, 0.25).unwrap();
            let alone = predictor.predict_rows(&op.op_type, &f).unwrap().unwrap();
            let alone = f64::from(alone[0]).exp();
            // Whole nanoseconds, and a few ulps of f32 in ln(ns).
            let tolerance = (1e-5 * alone).max(1.0);
            assert!(
                (ns as f64 - alone).abs() <= tolerance,
                "{name} {}: {ns} ns batched, {alone} alone",
                op.name
            );
        }
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
