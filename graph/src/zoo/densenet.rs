//! DenseNet-121 as torchvision's `densenet121()` (memory_efficient=False):
//! growth rate 32, blocks of 6, 12, 24 and 16 layers, bottleneck width 4x32,
//! compression 0.5. Every dense layer concatenates all earlier features into
//! a new tensor (`torch.cat`, even of a single tensor), which is what makes
//! DenseNet's activations large.

use crate::builder::Builder;
use crate::ir::TensorId;
use crate::zoo::{Dims, ZooModel, conv_bn_relu, image_classifier};

pub(crate) const DENSENET121: ZooModel = ZooModel {
    name: "densenet121",
    description: "DenseNet-121 (torchvision densenet121), 224x224",
    params: 7_978_856,
    default_resolution: 224,
    default_classes: 1000,
    min_resolution: 32,
    max_resolution: 4096,
    build,
};

const EPS: f64 = 1e-5;
const GROWTH: u64 = 32;
const BN_SIZE: u64 = 4;
const BLOCKS: [u64; 4] = [6, 12, 24, 16];

fn build(b: &mut Builder, d: &Dims) -> TensorId {
    image_classifier(b, d, forward)
}

fn forward(b: &mut Builder, x: TensorId, d: &Dims) -> TensorId {
    let mut h = conv_bn_relu(
        b,
        "features.conv0",
        "features.norm0",
        "features.relu0",
        x,
        64,
        [7, 7],
        [2, 2],
        [3, 3],
        EPS,
    );
    h = b.max_pool2d("features.pool0", h, 3, 2, 1, false);
    let mut features = 64;
    for (i, &layers) in BLOCKS.iter().enumerate() {
        let block = format!("features.denseblock{}", i + 1);
        let mut parts = vec![h];
        for j in 1..=layers {
            let name = format!("{block}.denselayer{j}");
            let new = dense_layer(b, &name, &parts);
            parts.push(new);
        }
        h = b.cat(&format!("{block}.cat"), &parts, 1);
        features += layers * GROWTH;
        if i + 1 < BLOCKS.len() {
            let t = format!("features.transition{}", i + 1);
            let n = b.batch_norm(&format!("{t}.norm"), h, EPS);
            let r = b.relu_(&format!("{t}.relu"), n);
            features /= 2;
            let c = b.conv2d(
                &format!("{t}.conv"),
                r,
                features,
                [1, 1],
                [1, 1],
                [0, 0],
                1,
                false,
            );
            h = b.avg_pool2d(&format!("{t}.pool"), c, 2, 2, 0, true);
        }
    }
    h = b.batch_norm("features.norm5", h, EPS);
    h = b.relu_("relu", h);
    h = b.adaptive_avg_pool2d("adaptive_avg_pool2d", h, [1, 1]);
    h = b.flatten("flatten", h);
    b.linear("classifier", h, d.classes, true)
}

/// norm1 -> relu1 -> conv1 (1x1, 128) -> norm2 -> relu2 -> conv2 (3x3, 32)
/// over the concatenation of all earlier features.
fn dense_layer(b: &mut Builder, name: &str, inputs: &[TensorId]) -> TensorId {
    let n = |part: &str| format!("{name}.{part}");
    let concated = b.cat(&n("cat"), inputs, 1);
    let h = b.batch_norm(&n("norm1"), concated, EPS);
    let h = b.relu_(&n("relu1"), h);
    let h = b.conv2d(
        &n("conv1"),
        h,
        BN_SIZE * GROWTH,
        [1, 1],
        [1, 1],
        [0, 0],
        1,
        false,
    );
    conv_bn_relu_pre(b, name, h)
}

/// The second half of a dense layer: norm2 -> relu2 -> conv2.
fn conv_bn_relu_pre(b: &mut Builder, name: &str, x: TensorId) -> TensorId {
    let n = |part: &str| format!("{name}.{part}");
    let h = b.batch_norm(&n("norm2"), x, EPS);
    let h = b.relu_(&n("relu2"), h);
    b.conv2d(&n("conv2"), h, GROWTH, [3, 3], [1, 1], [1, 1], 1, false)
}
