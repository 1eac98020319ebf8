//! The Memory Scheduler: a gRPC service (`tensile.v1.MemoryScheduler`) that
//! receives each job's compute graph and measured latencies, plans swaps,
//! releases and recomputations for all registered jobs together, and pushes
//! each job its versioned plan.
//!
//! # Layout
//! - [`server`]: [`run`] (listeners, shutdown passed in), [`Listener`], the
//!   lease reaper; [`node`]: every GPU of a node, one planning domain and
//!   socket each, and the `gpus.json` clients pick their GPU from.
//! - [`service`]: the tonic service, one handler per RPC; [`bounds`]: the
//!   range of every number and string it takes off the wire.
//! - [`planning`]: the planning task, sole owner of the re-planner and of
//!   admission; commands in, plans out through watch channels.
//! - [`state`]: the job table (graph, token hash, lease, newest plan).
//! - [`base`]: a job's base (device memory outside its graph) and when a
//!   measured one replaces it.
//! - [`coldstart`]: cold-start latencies (store, learned models, roofline).
//! - [`store`]: learned latencies in SQLite, keyed by graph fingerprint
//!   and device.
//! - [`token`]: job tokens. [`error`]: typed errors, the one mapping to
//!   `tonic::Status`. [`metrics`]: Prometheus. [`config`]: the validated
//!   configuration; [`cli`]: flags, environment and TOML file into it.
//! - [`endpoint_cmd`]: `tensile-scheduler endpoint`, the clients' endpoint
//!   rule printed for the deploy scripts.

pub mod base;
pub mod bounds;
pub mod cli;
pub mod coldstart;
pub mod config;
pub mod endpoint_cmd;
pub mod error;
pub mod metrics;
pub mod node;
pub mod planning;
pub mod server;
pub mod service;
pub mod state;
pub mod store;
pub mod token;

pub use config::{Config, ListenAddr};
pub use error::{ConfigError, Error};
pub use server::{Listener, RunError, run};
