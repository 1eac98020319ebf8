//! Integration tests of the training side: one binary, one module per area.

#![allow(clippy::unwrap_used)] // tests unwrap: a failure is the test failing

mod export;
mod util;
