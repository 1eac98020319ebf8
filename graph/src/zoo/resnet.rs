//! ResNet-50 as torchvision's `resnet50()` (v1.5: the stride sits on the 3x3
//! conv of a bottleneck): a 7x7 stem, bottleneck stages of 3, 4, 6 and 3
//! blocks, global average pool and one linear layer. The residual sum is the
//! in-place `out += identity` and every ReLU is in place, as in torchvision.

use crate::builder::Builder;
use crate::ir::TensorId;
use crate::zoo::{Dims, ZooModel, conv_bn_relu, image_classifier};

pub(crate) const RESNET50: ZooModel = ZooModel {
    name: "resnet50",
    description: "ResNet-50 (torchvision resnet50), 224x224",
    params: 25_557_032,
    default_resolution: 224,
    default_classes: 1000,
    min_resolution: 32,
    max_resolution: 4096,
    build,
};

const EPS: f64 = 1e-5;

fn build(b: &mut Builder, d: &Dims) -> TensorId {
    image_classifier(b, d, forward)
}

fn forward(b: &mut Builder, x: TensorId, d: &Dims) -> TensorId {
    let mut h = conv_bn_relu(
        b,
        "conv1",
        "bn1",
        "relu",
        x,
        64,
        [7, 7],
        [2, 2],
        [3, 3],
        EPS,
    );
    h = b.max_pool2d("maxpool", h, 3, 2, 1, false);
    let mut inplanes = 64;
    for (stage, (blocks, planes)) in [(3, 64), (4, 128), (6, 256), (3, 512)]
        .into_iter()
        .enumerate()
    {
        for block in 0..blocks {
            let stride = if stage > 0 && block == 0 { 2 } else { 1 };
            let name = format!("layer{}.{block}", stage + 1);
            h = bottleneck(b, &name, h, inplanes, planes, stride);
            inplanes = planes * 4;
        }
    }
    h = b.adaptive_avg_pool2d("avgpool", h, [1, 1]);
    h = b.flatten("flatten", h);
    b.linear("fc", h, d.classes, true)
}

fn bottleneck(
    b: &mut Builder,
    name: &str,
    x: TensorId,
    inplanes: u64,
    planes: u64,
    stride: u64,
) -> TensorId {
    let n = |part: &str| format!("{name}.{part}");
    let mut out = conv_bn_relu(
        b,
        &n("conv1"),
        &n("bn1"),
        &n("relu.1"),
        x,
        planes,
        [1, 1],
        [1, 1],
        [0, 0],
        EPS,
    );
    out = conv_bn_relu(
        b,
        &n("conv2"),
        &n("bn2"),
        &n("relu.2"),
        out,
        planes,
        [3, 3],
        [stride; 2],
        [1, 1],
        EPS,
    );
    out = b.conv2d(
        &n("conv3"),
        out,
        planes * 4,
        [1, 1],
        [1, 1],
        [0, 0],
        1,
        false,
    );
    out = b.batch_norm(&n("bn3"), out, EPS);
    let identity = if stride != 1 || inplanes != planes * 4 {
        let c = b.conv2d(
            &n("downsample.0"),
            x,
            planes * 4,
            [1, 1],
            [stride; 2],
            [0, 0],
            1,
            false,
        );
        b.batch_norm(&n("downsample.1"), c, EPS)
    } else {
        x
    };
    out = b.add_(&n("add"), out, identity);
    b.relu_(&n("relu.3"), out)
}
