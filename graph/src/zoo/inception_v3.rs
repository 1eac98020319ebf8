//! Inception-V3 (Szegedy et al. 2015) as torchvision's
//! `inception_v3(weights=None, aux_logits=True)` in training mode: the stem
//! (`Conv2d_1a_3x3` .. `Conv2d_4a_3x3` with two max-pools), `Mixed_5b..5d`
//! (InceptionA), `Mixed_6a` (InceptionB), `Mixed_6b..6e` (InceptionC), the
//! auxiliary classifier on `Mixed_6e`, `Mixed_7a` (InceptionD),
//! `Mixed_7b..7c` (InceptionE), global average pool, dropout 0.5 and `fc`.
//!
//! Every conv unit is torchvision's `BasicConv2d`: a bias-free convolution
//! (`.conv`), BatchNorm with eps 0.001 (`.bn`) and `F.relu(inplace=True)`.
//! The pooling branches use `F.avg_pool2d(x, 3, 1, 1)`, which counts the
//! padding. Branches run and concatenate in torchvision's `forward` order.
//!
//! In training mode the model returns the main and the auxiliary logits; the
//! loss is the usual `CE(main) + 0.4 * CE(aux)` over one target tensor.

use crate::builder::Builder;
use crate::ir::TensorId;
use crate::zoo::{Dims, ZooModel, conv_bn_relu, image_inputs};

pub(crate) const INCEPTION_V3: ZooModel = ZooModel {
    name: "inception_v3",
    description: "Inception-V3 with aux logits (torchvision inception_v3), 299x299",
    params: 27_161_264,
    default_resolution: 299,
    default_classes: 1000,
    // The auxiliary head needs Mixed_6e to be at least 17x17: its 5x5
    // stride-3 average pool must leave 5x5 for the unpadded 5x5 `conv1`. At
    // 298 Mixed_6e is 16x16, the pool leaves 4x4 and the conv has no output;
    // torchvision fails there too in training mode.
    min_resolution: 299,
    max_resolution: 4096,
    build,
};

const EPS: f64 = 1e-3;
const AUX_WEIGHT: f64 = 0.4;

fn build(b: &mut Builder, d: &Dims) -> TensorId {
    let (x, y) = image_inputs(b, d);
    let (logits, aux) = forward(b, x, d);
    let main = b.cross_entropy("loss.main", logits, y);
    let aux = b.cross_entropy("loss.aux", aux, y);
    let aux = b.scale("loss.aux_weighted", aux, AUX_WEIGHT);
    b.add("loss", main, aux)
}

/// Returns the main and the auxiliary logits.
fn forward(b: &mut Builder, x: TensorId, d: &Dims) -> (TensorId, TensorId) {
    let mut h = unit(b, "Conv2d_1a_3x3", x, 32, [3, 3], 2, [0, 0]);
    h = unit(b, "Conv2d_2a_3x3", h, 32, [3, 3], 1, [0, 0]);
    h = unit(b, "Conv2d_2b_3x3", h, 64, [3, 3], 1, [1, 1]);
    h = b.max_pool2d("maxpool1", h, 3, 2, 0, false);
    h = unit1(b, "Conv2d_3b_1x1", h, 80);
    h = unit(b, "Conv2d_4a_3x3", h, 192, [3, 3], 1, [0, 0]);
    h = b.max_pool2d("maxpool2", h, 3, 2, 0, false);
    h = inception_a(b, "Mixed_5b", h, 32);
    h = inception_a(b, "Mixed_5c", h, 64);
    h = inception_a(b, "Mixed_5d", h, 64);
    h = inception_b(b, "Mixed_6a", h);
    h = inception_c(b, "Mixed_6b", h, 128);
    h = inception_c(b, "Mixed_6c", h, 160);
    h = inception_c(b, "Mixed_6d", h, 160);
    h = inception_c(b, "Mixed_6e", h, 192);
    let aux = aux_logits(b, "AuxLogits", h, d.classes);
    h = inception_d(b, "Mixed_7a", h);
    h = inception_e(b, "Mixed_7b", h);
    h = inception_e(b, "Mixed_7c", h);
    h = b.adaptive_avg_pool2d("avgpool", h, [1, 1]);
    h = b.dropout("dropout", h, 0.5);
    h = b.flatten("flatten", h);
    (b.linear("fc", h, d.classes, true), aux)
}

/// torchvision's `BasicConv2d` named `name`: `name.conv`, `name.bn`, relu.
fn unit(
    b: &mut Builder,
    name: &str,
    x: TensorId,
    out: u64,
    kernel: [u64; 2],
    stride: u64,
    padding: [u64; 2],
) -> TensorId {
    conv_bn_relu(
        b,
        &format!("{name}.conv"),
        &format!("{name}.bn"),
        &format!("{name}.relu"),
        x,
        out,
        kernel,
        [stride; 2],
        padding,
        EPS,
    )
}

/// A 1x1 `BasicConv2d`.
fn unit1(b: &mut Builder, name: &str, x: TensorId, out: u64) -> TensorId {
    unit(b, name, x, out, [1, 1], 1, [0, 0])
}

/// A 1x7 (`wide`) or 7x1 `BasicConv2d` with "same" padding.
fn unit7(b: &mut Builder, name: &str, x: TensorId, out: u64, wide: bool) -> TensorId {
    if wide {
        unit(b, name, x, out, [1, 7], 1, [0, 3])
    } else {
        unit(b, name, x, out, [7, 1], 1, [3, 0])
    }
}

/// A 1x3 (`wide`) or 3x1 `BasicConv2d` with "same" padding.
fn unit3(b: &mut Builder, name: &str, x: TensorId, out: u64, wide: bool) -> TensorId {
    if wide {
        unit(b, name, x, out, [1, 3], 1, [0, 1])
    } else {
        unit(b, name, x, out, [3, 1], 1, [1, 0])
    }
}

/// `F.avg_pool2d(x, 3, stride=1, padding=1)` then the 1x1 `branch_pool`.
fn pool_branch(b: &mut Builder, name: &str, x: TensorId, out: u64) -> TensorId {
    let p = b.avg_pool2d(&format!("{name}.avg_pool"), x, 3, 1, 1, true);
    unit1(b, &format!("{name}.branch_pool"), p, out)
}

/// InceptionA (35x35): 64 + 64 + 96 + `pool_features` channels.
fn inception_a(b: &mut Builder, name: &str, x: TensorId, pool_features: u64) -> TensorId {
    let n = |part: &str| format!("{name}.{part}");
    let b1 = unit1(b, &n("branch1x1"), x, 64);
    let mut b5 = unit1(b, &n("branch5x5_1"), x, 48);
    b5 = unit(b, &n("branch5x5_2"), b5, 64, [5, 5], 1, [2, 2]);
    let mut b3 = unit1(b, &n("branch3x3dbl_1"), x, 64);
    b3 = unit(b, &n("branch3x3dbl_2"), b3, 96, [3, 3], 1, [1, 1]);
    b3 = unit(b, &n("branch3x3dbl_3"), b3, 96, [3, 3], 1, [1, 1]);
    let bp = pool_branch(b, name, x, pool_features);
    b.cat(&n("cat"), &[b1, b5, b3, bp], 1)
}

/// InceptionB (Mixed_6a), 35 -> 17: 384 + 96 + the input's channels.
fn inception_b(b: &mut Builder, name: &str, x: TensorId) -> TensorId {
    let n = |part: &str| format!("{name}.{part}");
    let b3 = unit(b, &n("branch3x3"), x, 384, [3, 3], 2, [0, 0]);
    let mut bd = unit1(b, &n("branch3x3dbl_1"), x, 64);
    bd = unit(b, &n("branch3x3dbl_2"), bd, 96, [3, 3], 1, [1, 1]);
    bd = unit(b, &n("branch3x3dbl_3"), bd, 96, [3, 3], 2, [0, 0]);
    let bp = b.max_pool2d(&n("max_pool"), x, 3, 2, 0, false);
    b.cat(&n("cat"), &[b3, bd, bp], 1)
}

/// InceptionC (17x17) with factorized 7x7 convs of width `c7`: 4 x 192.
fn inception_c(b: &mut Builder, name: &str, x: TensorId, c7: u64) -> TensorId {
    let n = |part: &str| format!("{name}.{part}");
    let b1 = unit1(b, &n("branch1x1"), x, 192);
    let mut b7 = unit1(b, &n("branch7x7_1"), x, c7);
    b7 = unit7(b, &n("branch7x7_2"), b7, c7, true);
    b7 = unit7(b, &n("branch7x7_3"), b7, 192, false);
    let mut bd = unit1(b, &n("branch7x7dbl_1"), x, c7);
    bd = unit7(b, &n("branch7x7dbl_2"), bd, c7, false);
    bd = unit7(b, &n("branch7x7dbl_3"), bd, c7, true);
    bd = unit7(b, &n("branch7x7dbl_4"), bd, c7, false);
    bd = unit7(b, &n("branch7x7dbl_5"), bd, 192, true);
    let bp = pool_branch(b, name, x, 192);
    b.cat(&n("cat"), &[b1, b7, bd, bp], 1)
}

/// InceptionD (Mixed_7a), 17 -> 8: 320 + 192 + the input's channels.
fn inception_d(b: &mut Builder, name: &str, x: TensorId) -> TensorId {
    let n = |part: &str| format!("{name}.{part}");
    let mut b3 = unit1(b, &n("branch3x3_1"), x, 192);
    b3 = unit(b, &n("branch3x3_2"), b3, 320, [3, 3], 2, [0, 0]);
    let mut b7 = unit1(b, &n("branch7x7x3_1"), x, 192);
    b7 = unit7(b, &n("branch7x7x3_2"), b7, 192, true);
    b7 = unit7(b, &n("branch7x7x3_3"), b7, 192, false);
    b7 = unit(b, &n("branch7x7x3_4"), b7, 192, [3, 3], 2, [0, 0]);
    let bp = b.max_pool2d(&n("max_pool"), x, 3, 2, 0, false);
    b.cat(&n("cat"), &[b3, b7, bp], 1)
}

/// InceptionE (8x8), whose 3x3 branches split into 1x3 and 3x1 convs
/// concatenated on the spot: 320 + 768 + 768 + 192 = 2048 channels.
fn inception_e(b: &mut Builder, name: &str, x: TensorId) -> TensorId {
    let n = |part: &str| format!("{name}.{part}");
    let b1 = unit1(b, &n("branch1x1"), x, 320);

    let s = unit1(b, &n("branch3x3_1"), x, 384);
    let a = unit3(b, &n("branch3x3_2a"), s, 384, true);
    let c = unit3(b, &n("branch3x3_2b"), s, 384, false);
    let b3 = b.cat(&n("branch3x3.cat"), &[a, c], 1);

    let mut d = unit1(b, &n("branch3x3dbl_1"), x, 448);
    d = unit(b, &n("branch3x3dbl_2"), d, 384, [3, 3], 1, [1, 1]);
    let a = unit3(b, &n("branch3x3dbl_3a"), d, 384, true);
    let c = unit3(b, &n("branch3x3dbl_3b"), d, 384, false);
    let bd = b.cat(&n("branch3x3dbl.cat"), &[a, c], 1);

    let bp = pool_branch(b, name, x, 192);
    b.cat(&n("cat"), &[b1, b3, bd, bp], 1)
}

/// InceptionAux: 5x5 stride-3 average pool, 1x1 conv to 128, 5x5 conv to
/// 768, global average pool and `fc` (768 -> classes).
fn aux_logits(b: &mut Builder, name: &str, x: TensorId, classes: u64) -> TensorId {
    let n = |part: &str| format!("{name}.{part}");
    let mut h = b.avg_pool2d(&n("avg_pool"), x, 5, 3, 0, true);
    h = unit1(b, &n("conv0"), h, 128);
    h = unit(b, &n("conv1"), h, 768, [5, 5], 1, [0, 0]);
    h = b.adaptive_avg_pool2d(&n("adaptive_avg_pool"), h, [1, 1]);
    h = b.flatten(&n("flatten"), h);
    b.linear(&n("fc"), h, classes, true)
}
