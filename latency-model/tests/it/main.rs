//! Integration tests of the latency model: one binary, one module per area.

#![allow(clippy::unwrap_used)] // tests unwrap: a failure is the test failing

mod costs;
mod features;
mod latencies;
mod no_torch;
mod predictor;
mod profile;
mod util;
