//! Helpers: a tiny graph, synthetic samples and scratch directories.

use std::path::PathBuf;

use tensile_graph::builder::{Builder, Optimizer};
use tensile_graph::{DType, Graph};
use tensile_latency_model::dataset::Sample;
use tensile_latency_model::op_features;

/// A tiny CNN: `input [2, 3, 8, 8]` through a 3x3 conv with bias (4
/// channels, stride 1, padding 1), flattened into a linear layer with bias
/// (3 outputs), cross-entropy, SGD.
pub(crate) fn tiny_cnn() -> Graph {
    let mut b = Builder::new("tiny_cnn");
    let x = b.input("input", vec![2, 3, 8, 8], DType::F32);
    let y = b.input("target", vec![2], DType::I64);
    let c = b.conv2d("conv", x, 4, [3, 3], [1, 1], [1, 1], 1, true);
    let f = b.flatten("flatten", c);
    let logits = b.linear("fc", f, 3, true);
    let loss = b.cross_entropy("loss", logits, y);
    b.finish(loss, Optimizer::sgd()).unwrap()
}

/// A fresh scratch directory under the system temp dir.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tensile-train-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Synthetic samples: every kernel op of the tiny CNN at three loads, with
/// a latency that grows with its work.
pub(crate) fn synthetic() -> Vec<Sample> {
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
