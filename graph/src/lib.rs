//! The compute-graph IR of one training iteration.
//!
//! # Layout
//! - [`ir`]: tensors, ops (ATen names), phases, aliases, and the validated [`Graph`].
//! - [`validate`]: the checks behind [`Graph::new`], [`Limits`], and
//!   [`GraphError`], whose every message names the op or tensor at fault.
//! - [`json`]: the on-disk JSON format, at the edge.
//! - [`liveness`]: activity analysis (storages, release after last use) and
//!   the vanilla footprint.
//! - [`text`]: a readable one-op-per-line rendering, for snapshots.
//! - [`builder`]: a builder with a small autograd, so models are written as
//!   forward passes and get PyTorch's backward and optimizer ops.
//! - [`zoo`]: the built-in models (VGG-16, ResNet-50, Inception-V3/V4,
//!   DenseNet-121, BERT-base).

pub mod builder;
pub mod ir;
pub mod json;
pub mod liveness;
pub mod text;
pub mod validate;
pub mod zoo;

pub use ir::{
    Alias, AliasKind, AttrValue, Attrs, DType, Graph, GraphDraft, Op, OpId, Phase, Placement,
    Tensor, TensorId, TensorKind,
};
pub use liveness::{Footprint, Liveness, Storage, StorageId};
pub use validate::{GraphError, Limits};
