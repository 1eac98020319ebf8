//! The contract of the TENSILE service (`tensile.v1`), generated from
//! `proto/tensile/v1/tensile.proto`, and the one place where wire types and
//! domain types meet.
//!
//! # Layout
//! - [`pb`]: the generated prost messages and tonic client/server.
//! - [`convert`]: `to_proto` / `from_proto` between [`pb`] and the graph IR
//!   and the planner's diagnostics; nothing else in the workspace converts.
//! - [`plan_json`]: a job's plan as a file (`tensile-plan/v1`, mirroring
//!   the `Plan` message), written by `tensilectl plan -o` and read by
//!   workers, validated against the graph. It lives here, at the edge,
//!   because the planner is serde-free and every reader of plans (the
//!   worker) depends on this crate anyway.

pub mod convert;
pub mod plan_json;

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
