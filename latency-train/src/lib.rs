//! Making the learned op-latency models, for
//! `tensile-latency-model` to serve: real kernels timed through tch
//! (libtorch), per op type a small ensemble of 4-layer MLPs trained with
//! tch to correct a roofline fitted to the op type, written as ONNX, and a
//! roofline profile calibrated on the same measurements as the fallback.
//!
//! Only this crate links libtorch; the features, the samples' format and
//! the model directory's format come from `tensile-latency-model`, so what
//! is measured and trained here is what is served there.
//!
//! # Layout
//! - [`measure`]: the shape grid and the profiler of real kernels (tch).
//! - [`train`]: the model of one op type (tch), handed on as plain numbers
//!   ([`train::Mlp`]).
//! - [`onnx`]: an [`train::Mlp`]'s ONNX export (prost, from ONNX's public
//!   schema; no tch).
//! - [`calibrate`]: a roofline profile fitted to measurements.
//! - [`pipeline`]: profile to model directory.

pub mod calibrate;
pub mod measure;
pub mod onnx;
pub mod pipeline;
pub mod train;
