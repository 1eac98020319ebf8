//! The Memory Scheduler: a gRPC service (`tensile.v1.MemoryScheduler`) that
//! receives each job's compute graph and measured latencies, plans swaps,
//! releases and recomputations for all registered jobs together, and pushes
//! each job its versioned plan.
//!
//! Not built yet: this crate holds the module map only. The contract it will
//! serve is `proto/tensile/v1/tensile.proto` (crate `tensile-proto`).
//!
//! # Layout (planned)
//! - `server`: the tonic service, `run(listener, shutdown)`.
//! - `registry`: jobs, their graphs, latencies (EWMA) and plan versions.
//! - `replan`: the change-rate trigger and plan pushes.
