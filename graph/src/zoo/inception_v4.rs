//! Inception-V4 (Szegedy et al. 2016) as timm's `inception_v4()`: a stem of
//! three convolutions and the Mixed3a/4a/5a blocks, 4 Inception-A blocks,
//! Reduction-A, 7 Inception-B blocks, Reduction-B, 3 Inception-C blocks,
//! global average pool and `last_linear` (1536 -> classes). Every conv unit
//! is timm's `ConvNormAct`: a bias-free convolution (`.conv`), BatchNorm with
//! eps 0.001 and an in-place ReLU (`.bn`, `.bn.act`), all with no padding
//! unless given. Branches run and concatenate in the order of timm's
//! `forward`. The head dropout has `drop_rate` 0, which ATen skips entirely
//! (`dropout` with p = 0 returns its input), so there is none here.

use crate::builder::Builder;
use crate::ir::TensorId;
use crate::zoo::{Dims, ZooModel, conv_bn_relu, image_classifier};

pub(crate) const INCEPTION_V4: ZooModel = ZooModel {
    name: "inception_v4",
    description: "Inception-V4 (timm inception_v4), 299x299",
    params: 42_679_816,
    default_resolution: 299,
    default_classes: 1000,
    // 75 -> 37 -> 35 (stem convs) -> 17 (Mixed3a) -> 15 (Mixed4a) -> 7
    // (Mixed5a) -> 3 (Reduction-A) -> 1 (Reduction-B); at 74 the last
    // reduction gets a 2x2 input, too small for its 3x3 windows.
    min_resolution: 75,
    max_resolution: 4096,
    build,
};

const EPS: f64 = 1e-3;

fn build(b: &mut Builder, d: &Dims) -> TensorId {
    image_classifier(b, d, forward)
}

fn forward(b: &mut Builder, x: TensorId, d: &Dims) -> TensorId {
    let mut h = unit(b, "features.0", x, 32, [3, 3], 2, [0, 0]);
    h = unit(b, "features.1", h, 32, [3, 3], 1, [0, 0]);
    h = unit(b, "features.2", h, 64, [3, 3], 1, [1, 1]);
    h = mixed_3a(b, "features.3", h);
    h = mixed_4a(b, "features.4", h);
    h = mixed_5a(b, "features.5", h);
    let mut index = 6;
    let mut next = || {
        index += 1;
        format!("features.{}", index - 1)
    };
    for _ in 0..4 {
        h = inception_a(b, &next(), h);
    }
    h = reduction_a(b, &next(), h);
    for _ in 0..7 {
        h = inception_b(b, &next(), h);
    }
    h = reduction_b(b, &next(), h);
    for _ in 0..3 {
        h = inception_c(b, &next(), h);
    }
    h = b.adaptive_avg_pool2d("global_pool.pool", h, [1, 1]);
    h = b.flatten("global_pool.flatten", h);
    b.linear("last_linear", h, d.classes, true)
}

/// timm's `ConvNormAct` named `name`: `name.conv`, `name.bn`, `name.bn.act`.
fn unit(
    b: &mut Builder,
    name: &str,
    x: TensorId,
    out: u64,
    kernel: [u64; 2],
    stride: u64,
    padding: [u64; 2],
) -> TensorId {
    let conv = format!("{name}.conv");
    let bn = format!("{name}.bn");
    let act = format!("{name}.bn.act");
    conv_bn_relu(
        b,
        &conv,
        &bn,
        &act,
        x,
        out,
        kernel,
        [stride; 2],
        padding,
        EPS,
    )
}

/// A 1x1 `ConvNormAct`.
fn unit1(b: &mut Builder, name: &str, x: TensorId, out: u64) -> TensorId {
    unit(b, name, x, out, [1, 1], 1, [0, 0])
}

/// 3x3 max-pool, stride 2, and a 3x3 stride-2 conv to 96: 64 -> 160 channels.
fn mixed_3a(b: &mut Builder, name: &str, x: TensorId) -> TensorId {
    let x0 = b.max_pool2d(&format!("{name}.maxpool"), x, 3, 2, 0, false);
    let x1 = unit(b, &format!("{name}.conv"), x, 96, [3, 3], 2, [0, 0]);
    b.cat(&format!("{name}.cat"), &[x0, x1], 1)
}

/// Two branches ending in unpadded 3x3 convs: 160 -> 192 channels.
fn mixed_4a(b: &mut Builder, name: &str, x: TensorId) -> TensorId {
    let n = |part: &str| format!("{name}.{part}");
    let mut x0 = unit1(b, &n("branch0.0"), x, 64);
    x0 = unit(b, &n("branch0.1"), x0, 96, [3, 3], 1, [0, 0]);
    let mut x1 = unit1(b, &n("branch1.0"), x, 64);
    x1 = unit(b, &n("branch1.1"), x1, 64, [1, 7], 1, [0, 3]);
    x1 = unit(b, &n("branch1.2"), x1, 64, [7, 1], 1, [3, 0]);
    x1 = unit(b, &n("branch1.3"), x1, 96, [3, 3], 1, [0, 0]);
    b.cat(&n("cat"), &[x0, x1], 1)
}

/// A 3x3 stride-2 conv to 192, then a 3x3 stride-2 max-pool: 192 -> 384.
fn mixed_5a(b: &mut Builder, name: &str, x: TensorId) -> TensorId {
    let x0 = unit(b, &format!("{name}.conv"), x, 192, [3, 3], 2, [0, 0]);
    let x1 = b.max_pool2d(&format!("{name}.maxpool"), x, 3, 2, 0, false);
    b.cat(&format!("{name}.cat"), &[x0, x1], 1)
}

/// 3x3 average pool, stride 1, padding 1, not counting the padding (the
/// first module of the pooling branches).
fn branch_pool(b: &mut Builder, name: &str, x: TensorId) -> TensorId {
    b.avg_pool2d(name, x, 3, 1, 1, false)
}

/// Inception-A (35x35): 384 -> 4 x 96 channels.
fn inception_a(b: &mut Builder, name: &str, x: TensorId) -> TensorId {
    let n = |part: &str| format!("{name}.{part}");
    let x0 = unit1(b, &n("branch0"), x, 96);
    let mut x1 = unit1(b, &n("branch1.0"), x, 64);
    x1 = unit(b, &n("branch1.1"), x1, 96, [3, 3], 1, [1, 1]);
    let mut x2 = unit1(b, &n("branch2.0"), x, 64);
    x2 = unit(b, &n("branch2.1"), x2, 96, [3, 3], 1, [1, 1]);
    x2 = unit(b, &n("branch2.2"), x2, 96, [3, 3], 1, [1, 1]);
    let mut x3 = branch_pool(b, &n("branch3.0"), x);
    x3 = unit1(b, &n("branch3.1"), x3, 96);
    b.cat(&n("cat"), &[x0, x1, x2, x3], 1)
}

/// Reduction-A (Mixed6a), 35 -> 17: 384 -> 384 + 256 + 384 = 1024 channels.
fn reduction_a(b: &mut Builder, name: &str, x: TensorId) -> TensorId {
    let n = |part: &str| format!("{name}.{part}");
    let x0 = unit(b, &n("branch0"), x, 384, [3, 3], 2, [0, 0]);
    let mut x1 = unit1(b, &n("branch1.0"), x, 192);
    x1 = unit(b, &n("branch1.1"), x1, 224, [3, 3], 1, [1, 1]);
    x1 = unit(b, &n("branch1.2"), x1, 256, [3, 3], 2, [0, 0]);
    let x2 = b.max_pool2d(&n("branch2"), x, 3, 2, 0, false);
    b.cat(&n("cat"), &[x0, x1, x2], 1)
}

/// Inception-B (17x17) with factorized 7x7 convs: 1024 -> 384 + 256 + 256 +
/// 128 = 1024 channels.
fn inception_b(b: &mut Builder, name: &str, x: TensorId) -> TensorId {
    let n = |part: &str| format!("{name}.{part}");
    let x0 = unit1(b, &n("branch0"), x, 384);
    let mut x1 = unit1(b, &n("branch1.0"), x, 192);
    x1 = unit(b, &n("branch1.1"), x1, 224, [1, 7], 1, [0, 3]);
    x1 = unit(b, &n("branch1.2"), x1, 256, [7, 1], 1, [3, 0]);
    let mut x2 = unit1(b, &n("branch2.0"), x, 192);
    x2 = unit(b, &n("branch2.1"), x2, 192, [7, 1], 1, [3, 0]);
    x2 = unit(b, &n("branch2.2"), x2, 224, [1, 7], 1, [0, 3]);
    x2 = unit(b, &n("branch2.3"), x2, 224, [7, 1], 1, [3, 0]);
    x2 = unit(b, &n("branch2.4"), x2, 256, [1, 7], 1, [0, 3]);
    let mut x3 = branch_pool(b, &n("branch3.0"), x);
    x3 = unit1(b, &n("branch3.1"), x3, 128);
    b.cat(&n("cat"), &[x0, x1, x2, x3], 1)
}

/// Reduction-B (Mixed7a), 17 -> 8: 1024 -> 192 + 320 + 1024 = 1536 channels.
fn reduction_b(b: &mut Builder, name: &str, x: TensorId) -> TensorId {
    let n = |part: &str| format!("{name}.{part}");
    let mut x0 = unit1(b, &n("branch0.0"), x, 192);
    x0 = unit(b, &n("branch0.1"), x0, 192, [3, 3], 2, [0, 0]);
    let mut x1 = unit1(b, &n("branch1.0"), x, 256);
    x1 = unit(b, &n("branch1.1"), x1, 256, [1, 7], 1, [0, 3]);
    x1 = unit(b, &n("branch1.2"), x1, 320, [7, 1], 1, [3, 0]);
    x1 = unit(b, &n("branch1.3"), x1, 320, [3, 3], 2, [0, 0]);
    let x2 = b.max_pool2d(&n("branch2"), x, 3, 2, 0, false);
    b.cat(&n("cat"), &[x0, x1, x2], 1)
}

/// Inception-C (8x8), whose two middle branches split into 1x3 and 3x1
/// convs concatenated on the spot: 1536 -> 256 + 512 + 512 + 256 = 1536.
fn inception_c(b: &mut Builder, name: &str, x: TensorId) -> TensorId {
    let n = |part: &str| format!("{name}.{part}");
    let x0 = unit1(b, &n("branch0"), x, 256);

    let x1_0 = unit1(b, &n("branch1_0"), x, 384);
    let x1_1a = unit(b, &n("branch1_1a"), x1_0, 256, [1, 3], 1, [0, 1]);
    let x1_1b = unit(b, &n("branch1_1b"), x1_0, 256, [3, 1], 1, [1, 0]);
    let x1 = b.cat(&n("branch1.cat"), &[x1_1a, x1_1b], 1);

    let x2_0 = unit1(b, &n("branch2_0"), x, 384);
    let x2_1 = unit(b, &n("branch2_1"), x2_0, 448, [3, 1], 1, [1, 0]);
    let x2_2 = unit(b, &n("branch2_2"), x2_1, 512, [1, 3], 1, [0, 1]);
    let x2_3a = unit(b, &n("branch2_3a"), x2_2, 256, [1, 3], 1, [0, 1]);
    let x2_3b = unit(b, &n("branch2_3b"), x2_2, 256, [3, 1], 1, [1, 0]);
    let x2 = b.cat(&n("branch2.cat"), &[x2_3a, x2_3b], 1);

    let mut x3 = branch_pool(b, &n("branch3.0"), x);
    x3 = unit1(b, &n("branch3.1"), x3, 256);
    b.cat(&n("cat"), &[x0, x1, x2, x3], 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::Optimizer;

    fn build_at(resolution: u64) -> Result<crate::ir::Graph, crate::validate::GraphError> {
        let mut b = Builder::new("inception_v4_test");
        let d = Dims {
            batch: 2,
            resolution,
            classes: 10,
        };
        let loss = build(&mut b, &d);
        b.finish(loss, Optimizer::adam())
    }

    #[test]
    fn min_resolution_is_the_smallest_that_builds() {
        assert!(build_at(INCEPTION_V4.min_resolution).is_ok());
        let err = build_at(INCEPTION_V4.min_resolution - 1).unwrap_err();
        assert!(err.to_string().contains("too small"), "{err}");
    }

    /// Stage outputs at batch 2, as timm's forward hooks report them.
    #[test]
    fn stage_shapes_match_timm() {
        let g = build_at(299).unwrap();
        let shape = |name: &str| {
            g.tensors()
                .iter()
                .find(|t| t.name == name)
                .map(|t| t.shape.clone())
        };
        assert_eq!(shape("features.5.cat"), Some(vec![2, 384, 35, 35]));
        assert_eq!(shape("features.10.cat"), Some(vec![2, 1024, 17, 17]));
        assert_eq!(shape("features.18.cat"), Some(vec![2, 1536, 8, 8]));
        assert_eq!(shape("features.21.cat"), Some(vec![2, 1536, 8, 8]));
        assert_eq!(shape("last_linear"), Some(vec![2, 10]));
    }
}
