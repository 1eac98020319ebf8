//! Op latency prediction for cold start: per-op-type features, one small MLP
//! per op type trained on measured kernel latencies, exported to ONNX and
//! served with ONNX Runtime, batched over all ops of a graph.
//!
//! Not built yet: this crate holds the module map only.
//!
//! # Layout (planned)
//! - `features`: op type, padded input dims, attributes, dtype, utilization.
//! - `profile`: timing real kernels through tch.
//! - `train`, `onnx`: the MLPs and their export.
//! - `predict`: ort sessions, with a roofline fallback.
