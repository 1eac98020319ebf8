//! Op latency prediction for cold start: the serving side.
//!
//! Two predictors: the roofline cost model over device profiles (also the
//! simulator's ground truth and the crude cold-start estimate), and the
//! learned one: per op type, a small ensemble of 4-layer MLPs
//! correcting a roofline fitted to the op type, served from ONNX files with
//! ONNX Runtime, batched over all ops of a graph, with the roofline as the
//! fallback for op types without a model.
//!
//! This crate links no libtorch: profiling real kernels, training the
//! models and writing their ONNX files live in `tensile-latency-train`
//! (`latency-train/`), which depends on this one for the features, the
//! samples and the model directory's format.
//!
//! # Layout
//! - [`profile`]: [`DeviceProfile`] (memory, copy engines, peaks, per-class
//!   efficiencies), the built-in profiles (`profiles/*.json`: `a6000`,
//!   `h100`, `h200`, `paper`) and profile files, validated.
//! - [`device`]: a profile by the name a user gives ([`device_profile`]:
//!   a built-in GPU, `cpu`, or a profile file), the one rule every binary
//!   and the Python extension follow.
//! - [`roofline`]: FLOPs and bytes of every op ([`op_cost`]), op classes, and
//!   the roofline time of one op ([`roofline_ns`]).
//! - [`latencies`]: per-op latencies of a whole graph: [`roofline_latencies`],
//!   [`true_latencies`] (roofline times a seeded per-op bias) and
//!   [`estimate_latencies`] (one flat efficiency, no bias).
//! - [`features`]: the fixed-length feature vector of an op.
//! - [`dataset`]: measured samples as JSON Lines, the split by shape.
//! - [`manifest`]: the model directory's format (manifest, file names,
//!   the models' input and output).
//! - [`predict`]: [`Predictor`] (ort): every op of a graph, with its source.
//! - [`eval`]: accuracy on held-out shapes and prediction speed.

pub mod dataset;
pub mod device;
pub mod eval;
pub mod features;
pub mod latencies;
pub mod manifest;
pub mod predict;
pub mod profile;
pub mod roofline;

pub use device::{DeviceError, device_profile};
pub use features::{FEATURE_LEN, op_features};
pub use latencies::{TRUE_BIAS_SIGMA, estimate_latencies, roofline_latencies, true_latencies};
pub use predict::{Prediction, Predictor, Source};
pub use profile::{
    ClassEfficiency, CopyDirection, CopyQueue, DeviceProfile, Efficiency, ProfileError,
};
pub use roofline::{OpClass, OpCost, op_class, op_class_of_type, op_cost, roofline_ns};
