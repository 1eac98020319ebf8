//! The contract of the TENSILE service (`tensile.v1`), generated from
//! `proto/tensile/v1/tensile.proto`, and the one place where wire types and
//! domain types meet.
//!
//! # Layout
//! - [`pb`]: the generated prost messages and tonic client/server.
//! - [`convert`]: `to_proto` / `from_proto` between [`pb`] and the graph IR
//!   and the planner's diagnostics; nothing else in the workspace converts.

pub mod convert;

/// Generated code for package `tensile.v1`.
#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations
)]
pub mod pb {
    tonic::include_proto!("tensile.v1");
}
