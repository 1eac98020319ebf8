//! The model zoo: the TENSILE paper's five CNNs and BERT-base, each as one
//! training iteration (forward, loss, backward, optimizer) built with
//! [`crate::builder`]. Architectures, parameter names and shapes follow
//! torchvision (VGG-16, ResNet-50, Inception-V3, DenseNet-121), timm
//! (Inception-V4) and Hugging Face transformers (BERT-base).

mod bert;
mod densenet;
mod inception_v3;
mod inception_v4;
mod resnet;
mod vgg;

use thiserror::Error;

use crate::builder::{Builder, Optimizer, Step};
use crate::ir::{DType, Graph, TensorId};
use crate::validate::GraphError;

/// How to build a zoo model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ZooConfig {
    pub batch: u64,
    /// Image side for CNNs, sequence length for BERT; `None`: the model's default.
    pub resolution: Option<u64>,
    pub optimizer: Optimizer,
    /// Where the optimizer's updates run.
    pub step: Step,
    /// Output classes of the classifier (1000 for ImageNet CNNs, 2 for BERT).
    pub classes: Option<u64>,
}

impl ZooConfig {
    pub fn new(batch: u64) -> ZooConfig {
        ZooConfig {
            batch,
            resolution: None,
            optimizer: Optimizer::adam(),
            step: Step::AtEnd,
            classes: None,
        }
    }
}

/// One model of the zoo.
#[derive(Debug, Clone, Copy)]
pub struct ZooModel {
    pub name: &'static str,
    pub description: &'static str,
    /// The reference parameter count (torchvision, timm, transformers).
    pub params: u64,
    /// Default image side (CNNs) or sequence length (BERT).
    pub default_resolution: u64,
    pub default_classes: u64,
    /// The smallest resolution the architecture accepts.
    pub min_resolution: u64,
    pub max_resolution: u64,
    build: fn(&mut Builder, &Dims) -> TensorId,
}

/// Sizes handed to a model's forward function.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub(crate) batch: u64,
    pub(crate) resolution: u64,
    pub(crate) classes: u64,
}

/// Why a zoo model could not be built.
#[derive(Debug, Error)]
pub enum ZooError {
    #[error("unknown model {name:?}; the zoo has {}", names())]
    UnknownModel { name: String },
    #[error("{model}: batch size {batch} is out of range (1 to {MAX_BATCH})")]
    Batch { model: &'static str, batch: u64 },
    #[error("{model}: resolution {resolution} is out of range ({min} to {max})")]
    Resolution {
        model: &'static str,
        resolution: u64,
        min: u64,
        max: u64,
    },
    #[error("{model}: {classes} classes is out of range (2 to {MAX_CLASSES})")]
    Classes { model: &'static str, classes: u64 },
    #[error("{model}: {source}")]
    Graph {
        model: &'static str,
        source: GraphError,
    },
}

pub const MAX_BATCH: u64 = 65_536;
pub const MAX_CLASSES: u64 = 1_000_000;

/// Every model, in the order of the TENSILE paper, then BERT.
pub const MODELS: [ZooModel; 6] = [
    vgg::VGG16,
    inception_v3::INCEPTION_V3,
    inception_v4::INCEPTION_V4,
    resnet::RESNET50,
    densenet::DENSENET121,
    bert::BERT_BASE,
];

fn names() -> String {
    MODELS.map(|m| m.name).join(", ")
}

pub fn model(name: &str) -> Result<&'static ZooModel, ZooError> {
    MODELS
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| ZooError::UnknownModel { name: name.into() })
}

/// Builds one training iteration of the named model.
pub fn build(name: &str, config: &ZooConfig) -> Result<Graph, ZooError> {
    model(name)?.build(config)
}

impl ZooModel {
    pub fn build(&self, config: &ZooConfig) -> Result<Graph, ZooError> {
        if !(1..=MAX_BATCH).contains(&config.batch) {
            return Err(ZooError::Batch {
                model: self.name,
                batch: config.batch,
            });
        }
        let resolution = config.resolution.unwrap_or(self.default_resolution);
        if !(self.min_resolution..=self.max_resolution).contains(&resolution) {
            return Err(ZooError::Resolution {
                model: self.name,
                resolution,
                min: self.min_resolution,
                max: self.max_resolution,
            });
        }
        let classes = config.classes.unwrap_or(self.default_classes);
        if !(2..=MAX_CLASSES).contains(&classes) {
            return Err(ZooError::Classes {
                model: self.name,
                classes,
            });
        }
        let dims = Dims {
            batch: config.batch,
            resolution,
            classes,
        };
        let mut b = Builder::new(format!(
            "{}_b{}_r{}_{}{}",
            self.name,
            config.batch,
            resolution,
            config.optimizer.name(),
            config.step.suffix()
        ));
        let loss = (self.build)(&mut b, &dims);
        b.finish_stepping(loss, config.optimizer, config.step)
            .map_err(|source| ZooError::Graph {
                model: self.name,
                source,
            })
    }
}

/// Image input, labels, and cross-entropy on the logits of `forward`.
pub(crate) fn image_classifier(
    b: &mut Builder,
    d: &Dims,
    forward: impl FnOnce(&mut Builder, TensorId, &Dims) -> TensorId,
) -> TensorId {
    let (x, y) = image_inputs(b, d);
    let logits = forward(b, x, d);
    b.cross_entropy("loss", logits, y)
}

/// The image batch (`input`, N x 3 x R x R) and its labels (`target`, N).
pub(crate) fn image_inputs(b: &mut Builder, d: &Dims) -> (TensorId, TensorId) {
    let x = b.input(
        "input",
        vec![d.batch, 3, d.resolution, d.resolution],
        DType::F32,
    );
    let y = b.input("target", vec![d.batch], DType::I64);
    (x, y)
}

/// `Conv2d(bias=False) + BatchNorm2d(eps) + ReLU(inplace=True)`, the unit of
/// Inception's `BasicConv2d` and of ResNet stems.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv_bn_relu(
    b: &mut Builder,
    conv: &str,
    bn: &str,
    relu: &str,
    x: TensorId,
    out: u64,
    kernel: [u64; 2],
    stride: [u64; 2],
    padding: [u64; 2],
    eps: f64,
) -> TensorId {
    let c = b.conv2d(conv, x, out, kernel, stride, padding, 1, false);
    let n = b.batch_norm(bn, c, eps);
    b.relu_(relu, n)
}
