//! The per-job worker process: registers its job's graph with the scheduler,
//! runs iterations op by op with the executor, fires plan events at their
//! trigger ops, and reports measured op latencies.
//!
//! Not built yet: this crate holds the module map only.
//!
//! # Layout (planned)
//! - `kernels`: the kernel backends (`tch` for real libtorch kernels, `sim`).
//! - `session`: the job's stream to the scheduler; plans switch at iteration boundaries.
