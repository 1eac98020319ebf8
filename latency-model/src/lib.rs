//! Op latency prediction for cold start.
//!
//! Two predictors: the roofline cost model over device profiles (also the
//! simulator's ground truth and the crude cold-start estimate), and the
//! learned one of SPEC §5: per op type, a small ensemble of 4-layer MLPs
//! correcting a roofline fitted to the op type, trained on latencies
//! of real kernels measured through tch (libtorch), exported to ONNX and
//! served with ONNX Runtime, batched over all ops of a graph, with the
//! roofline as the fallback for op types without a model.
//!
//! # Layout
//! - [`profile`]: [`DeviceProfile`] (memory, copy engines, peaks, per-class
//!   efficiencies), the built-in profiles (`profiles/*.json`: `a6000`,
//!   `h100`, `paper`) and profile files, validated.
//! - [`roofline`]: FLOPs and bytes of every op ([`op_cost`]), op classes, and
//!   the roofline time of one op ([`roofline_ns`]).
//! - [`latencies`]: per-op latencies of a whole graph: [`roofline_latencies`],
//!   [`true_latencies`] (roofline times a seeded per-op bias) and
//!   [`estimate_latencies`] (one flat efficiency, no bias).
//! - [`features`]: the fixed-length feature vector of an op.
//! - [`measure`]: the shape grid and the profiler of real kernels (tch).
//! - [`dataset`]: measured samples as JSON Lines, the split by shape.
//! - [`train`]: the model of one op type (tch); [`onnx`]: its ONNX export
//!   (prost, from ONNX's public schema); [`pipeline`]: profile to model
//!   directory; [`calibrate`]: a roofline profile fitted to measurements.
//! - [`predict`]: [`Predictor`] (ort): every op of a graph, with its source.
//! - [`eval`]: accuracy on held-out shapes and prediction speed.

pub mod calibrate;
pub mod dataset;
pub mod eval;
pub mod features;
pub mod latencies;
pub mod measure;
pub mod onnx;
pub mod pipeline;
pub mod predict;
pub mod profile;
pub mod roofline;
pub mod train;

pub use features::{FEATURE_LEN, op_features};
pub use latencies::{TRUE_BIAS_SIGMA, estimate_latencies, roofline_latencies, true_latencies};
pub use predict::{Prediction, Predictor, Source};
pub use profile::{
    ClassEfficiency, CopyDirection, CopyQueue, DeviceProfile, Efficiency, ProfileError,
};
pub use roofline::{OpClass, OpCost, op_class, op_class_of_type, op_cost, roofline_ns};
