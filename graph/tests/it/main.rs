//! Integration tests of the graph IR: one binary, one module per area.

#![allow(clippy::unwrap_used)] // tests unwrap: a failure is the test failing

mod json;
mod liveness;
mod props;
mod util;
mod validate;
mod zoo;
