//! TEMPORARY stub while the model is being written.
use crate::builder::Builder;
use crate::ir::TensorId;
use crate::zoo::{Dims, ZooModel, image_classifier};

pub(crate) const INCEPTION_V4: ZooModel = ZooModel {
    name: "inception_v4",
    description: "stub",
    params: 0,
    default_resolution: 299,
    default_classes: 1000,
    min_resolution: 75,
    max_resolution: 4096,
    build,
};

fn build(b: &mut Builder, d: &Dims) -> TensorId {
    image_classifier(b, d, |b, x, d| {
        let h = b.adaptive_avg_pool2d("p", x, [1, 1]);
        let h = b.flatten("f", h);
        b.linear("fc", h, d.classes, true)
    })
}
