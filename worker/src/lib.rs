//! The per-job worker: runs a job's graph op by op with real kernels under
//! the executor (the same state machine the simulator runs), carries out
//! its plan's swap-outs, prefetches, releases and recomputations with real
//! tensors and real copies to a capped host pool, and measures what the
//! planner predicted: time per iteration, peak device memory, stalls,
//! passive swaps and late prefetches.
//!
//! # Layout
//! - `payload`: device storages as the host copy engine sees them (one flat
//!   tensor per storage) and the layouts that re-derive views from it.
//! - `copies`: the copy engine the worker picks ([`Engine`]): the host
//!   engine, or the CUDA engine (one stream, a pinned pool) on a GPU.
//! - `runtime`: [`Worker`], the driver of the executor over the copy
//!   engine; the [`Kernels`] trait it runs ops through; out-of-memory under
//!   a device budget, its own or one shared through a ledger.
//! - `ledger`: [`Ledger`], the device bytes each worker of one device holds,
//!   in slot files of a shared directory, so that workers sharing one
//!   budget hold its sum.
//! - `host_kernels`: ops placed on the host (optimizer updates kept on the
//!   host CPU) run by the host copy engine over its host buffers, viewed as
//!   CPU tensors, through the worker's host [`Kernels`].
//! - `base`: [`BaseMeter`], what the process holds on the device beyond
//!   its jobs' storages, measured after the first iterations (NVML's
//!   figure less the storages' peak) and reported as each job's base.
//! - `real`: the real kernels (`tensile-kernels`) as [`Kernels`], their
//!   initial values, saving parameters.
//! - [`Session`] (`tensile-session`, re-exported): the job's connection
//!   to the scheduler (register, plan stream, reports, lease), on a
//!   background thread; the loop takes a new plan only at an iteration
//!   boundary. The Python hook runs the same session.
//! - `main.rs`: the `tensile-worker` binary.

mod base;
mod copies;
mod error;
mod host_kernels;
mod ledger;
mod payload;
mod real;
mod report;
mod runtime;

pub use base::{BaseMeter, DeviceUsage, WARMUP, process_usage};
pub use copies::{Copies, Engine, cuda_ordinal};
pub use error::WorkerError;
pub use ledger::{Claim, Ledger, LedgerError, Others, REFRESH, SlotState};
pub use payload::{Flat, FlatMeta, Layout};
pub use real::{initial_of, save_params};
pub use report::IterationReport;
pub use runtime::{
    ALL_WAIT_GRACE, BREAK_AFTER, Kernels, POLL, STUCK_AFTER, Worker, WorkerConfig, vanilla_plan,
};
pub use tensile_session::{Level, LogSink, PushedPlan, Session, SessionConfig};
