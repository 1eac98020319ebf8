//! VGG-16 as torchvision's `vgg16()`: 13 3x3 convolutions with bias and
//! in-place ReLU, 5 max-pools, adaptive average pool to 7x7, and a
//! classifier of three linear layers with ReLU and dropout.

use crate::builder::Builder;
use crate::ir::TensorId;
use crate::zoo::{Dims, ZooModel, image_classifier};

pub(crate) const VGG16: ZooModel = ZooModel {
    name: "vgg16",
    description: "VGG-16 (torchvision vgg16), 224x224",
    params: 138_357_544,
    default_resolution: 224,
    default_classes: 1000,
    min_resolution: 32,
    max_resolution: 4096,
    build,
};

/// Channels of each conv; 0 is a max-pool (torchvision's configuration "D").
const CFG: [u64; 18] = [
    64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0,
];

fn build(b: &mut Builder, d: &Dims) -> TensorId {
    image_classifier(b, d, forward)
}

fn forward(b: &mut Builder, x: TensorId, d: &Dims) -> TensorId {
    let mut h = x;
    // Module indices inside `features`: conv k, ReLU k+1; a pool is one module.
    let mut index = 0;
    for &channels in &CFG {
        if channels == 0 {
            h = b.max_pool2d(&format!("features.{index}"), h, 2, 2, 0, false);
            index += 1;
        } else {
            let conv = format!("features.{index}");
            h = b.conv2d(&conv, h, channels, [3, 3], [1, 1], [1, 1], 1, true);
            h = b.relu_(&format!("features.{}", index + 1), h);
            index += 2;
        }
    }
    h = b.adaptive_avg_pool2d("avgpool", h, [7, 7]);
    h = b.flatten("flatten", h);
    h = b.linear("classifier.0", h, 4096, true);
    h = b.relu_("classifier.1", h);
    h = b.dropout("classifier.2", h, 0.5);
    h = b.linear("classifier.3", h, 4096, true);
    h = b.relu_("classifier.4", h);
    h = b.dropout("classifier.5", h, 0.5);
    b.linear("classifier.6", h, d.classes, true)
}
