//! Op latency prediction for cold start.
//!
//! Built: device profiles, the roofline cost model, and the latencies built
//! on it — the simulated device's ground truth and the crude cold-start
//! estimate the scheduler uses until the learned predictor exists.
//!
//! Not built yet (its own issue): per-op-type features, timing real kernels
//! through tch, one small MLP per op type, ONNX export and ort inference,
//! which will replace [`estimate_latencies`].
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

pub mod latencies;
pub mod profile;
pub mod roofline;

pub use latencies::{TRUE_BIAS_SIGMA, estimate_latencies, roofline_latencies, true_latencies};
pub use profile::{
    ClassEfficiency, CopyDirection, CopyQueue, DeviceProfile, Efficiency, ProfileError,
};
pub use roofline::{OpClass, OpCost, op_class, op_cost, roofline_ns};
