//! Helpers: small hand-built graphs and the zoo.

use tensile_graph::builder::{Builder, Optimizer};
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{DType, Graph, Op};

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

/// A grouped, strided conv without bias: `[1, 4, 9, 9]`, 8 channels,
/// 3x3, stride 2, no padding, 2 groups: output `[1, 8, 4, 4]`.
pub(crate) fn grouped_conv() -> Graph {
    let mut b = Builder::new("grouped_conv");
    let x = b.input("input", vec![1, 4, 9, 9], DType::F32);
    let y = b.input("target", vec![1], DType::I64);
    let c = b.conv2d("conv", x, 8, [3, 3], [2, 2], [0, 0], 2, false);
    let f = b.flatten("flatten", c);
    let loss = b.cross_entropy("loss", f, y);
    b.finish(loss, Optimizer::adam()).unwrap()
}

/// The only op of `op_type` in `g`.
pub(crate) fn only<'g>(g: &'g Graph, op_type: &str) -> &'g Op {
    let mut ops = g.ops().iter().filter(|o| o.op_type == op_type);
    let op = ops
        .next()
        .unwrap_or_else(|| panic!("no {op_type} in {}", g.name()));
    assert!(
        ops.next().is_none(),
        "more than one {op_type} in {}",
        g.name()
    );
    op
}

/// Every zoo model at a small batch.
pub(crate) fn zoo_graphs(batch: u64) -> Vec<Graph> {
    zoo::MODELS
        .iter()
        .map(|m| zoo::build(m.name, &ZooConfig::new(batch)).unwrap())
        .collect()
}

/// One zoo model.
pub(crate) fn zoo_graph(name: &str, batch: u64) -> Graph {
    zoo::build(name, &ZooConfig::new(batch)).unwrap()
}
