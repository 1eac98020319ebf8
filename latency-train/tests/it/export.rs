//! From training to serving: the ONNX export computes in ONNX Runtime what
//! tch computes, and a directory written by the pipeline is one the serving
//! crate's `Predictor` loads and uses.

use tensile_latency_model::dataset::Sample;
use tensile_latency_model::manifest::{
    MANIFEST_FORMAT, Manifest, ModelEntry, model_file, shipped_cpu_models,
};
use tensile_latency_model::{FEATURE_LEN, Predictor, Source};
use tensile_latency_train::calibrate::Base;
use tensile_latency_train::pipeline::train_dir;
use tensile_latency_train::train::{TrainConfig, train};

use crate::util::{scratch, synthetic, tiny_cnn};

/// A quick configuration: the tests check plumbing, not accuracy.
fn quick() -> TrainConfig {
    TrainConfig {
        epochs: 200,
        hidden: 16,
        ..TrainConfig::default()
    }
}

#[test]
fn onnx_export_runs_in_ort_as_tch_computes_it() {
    let samples = synthetic();
    let refs: Vec<&Sample> = samples.iter().collect();
    let net = train(&refs, &quick()).unwrap();
    let mlp = net.to_mlp().unwrap();
    let dir = scratch("roundtrip");
    let op_type = "aten::convolution_backward";
    std::fs::write(
        dir.join("m.onnx"),
        tensile_latency_train::onnx::export(&mlp),
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
fn a_trained_directory_is_served_by_the_predictor() {
    let samples = synthetic();
    let dir = scratch("pipeline");
    let base = Base {
        name: "test".into(),
        description: "synthetic".into(),
        memory_bytes: 1 << 30,
        peak_flops: 100e9,
        mem_bytes_per_s: 20e9,
    };
    let trained = train_dir(&samples, &dir, "test", &base, &quick(), &mut |_| {}).unwrap();
    assert_eq!(trained.len(), 1);
    let op_type = "aten::convolution_backward";
    assert!(dir.join(model_file(op_type)).is_file());
    let predictor = Predictor::load(&dir).unwrap();
    assert_eq!(predictor.manifest().device, "test");
    assert!(predictor.has_model(op_type));
    let g = tiny_cnn();
    let p = predictor.predict_graph(&g, 0.0).unwrap();
    for ((op, &ns), &src) in g.ops().iter().zip(&p.ns_per_op).zip(&p.source_per_op) {
        if op.op_type == op_type {
            assert_eq!(src, Source::Model, "{}", op.name);
            assert!(ns > 0, "{}: {ns} ns", op.name);
        } else {
            assert_ne!(src, Source::Model, "{}", op.name);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
