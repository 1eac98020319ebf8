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
//! - [`endpoint`]: where the scheduler listens by default, so that the
//!   scheduler, `tensilectl` and workers agree without depending on each
//!   other.
//! - [`clock`]: the host clock the plans' iteration gates are on.
//! - [`tls`]: TLS on TCP, loaded the same way by the scheduler and every
//!   client, and the rule that says when a client's address uses it.

pub mod clock;
pub mod convert;
pub mod endpoint;
pub mod plan_json;
pub mod tls;

/// The encoded `FileDescriptorSet` of `tensile.v1`, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("tensile_descriptor");

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
