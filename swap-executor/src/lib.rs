//! The swap executor: TENSILE's Execution Queue
//! (swap events waiting for their delay after their trigger op) and the
//! copy engines that carry out swaps, behind one trait, so that the
//! simulator and the worker run the same executor state machine.
//!
//! A copy engine is told of a copy ([`CopyEngine::submit`]) and learns of
//! its completion later ([`CopyEngine::poll`], [`CopyEngine::status`]):
//! nothing assumes a copy's end is known when it is submitted. The
//! virtual-time engine happens to know it and says so
//! ([`CopyStatus::Ends`] at submission), which lets the simulator jump to it; a real
//! engine says [`CopyStatus::Pending`] until the copy has ended.
//!
//! # Layout
//! - `queue`: [`ExecutionQueue`], swap events ordered by fire time.
//! - `engine`: the [`CopyEngine`] trait, copies, their ids and statuses.
//! - `virtual_time`: [`VirtualCopies`], FIFO copy lanes in virtual time with
//!   a bandwidth and a fixed per-copy latency (the simulator's engine).
//! - `host`: [`HostCopies`], real bytes between device payloads (a trait
//!   the worker implements for its tensors) and a capped pool of host
//!   buffers, on paced copy threads, with fault injection; host runs on a
//!   host thread through a kernel the driver installs ([`HostKernel`]).
//!
//! - `cuda`: [`CudaCopies`], real copies between libtorch's device buffers
//!   (a [`DevicePayload`]) and a capped pool of pinned host buffers on one
//!   non-blocking CUDA stream (cudarc, driver loaded at run time), ordered
//!   against the compute stream with events; fault injection and host runs
//!   as `host`.
//! - `runs`: host runs ([`CopyEngine::run_on_host`]) for both real
//!   engines: the queue's rules once, over each engine's host copies.
//! - `nvml`: [`ProcessMemory`], the device memory this process uses on
//!   one GPU as the driver counts it (NVML, loaded at run time), for the
//!   base the worker measures. `cuda` and `nvml` are the crate's only
//!   modules with `unsafe`, each block with why it is sound.

#[allow(unsafe_code)]
mod cuda;
mod cuda_clock;
mod engine;
mod host;
#[allow(unsafe_code)]
mod nvml;
mod queue;
mod runs;
mod virtual_time;

pub use cuda::{CudaConfig, CudaCopies, CudaUnavailable, DevicePayload, cuda_available};
pub use cuda_clock::CudaOpClock;
pub use engine::{Copy, CopyEngine, CopyError, CopyId, CopyStatus, Dir, HostRun};
pub use host::{HostConfig, HostCopies, Payload};
pub use nvml::{NvmlError, ProcessMemory, device_memory_bytes};
pub use queue::ExecutionQueue;
pub use runs::{HostBytes, HostKernel};
pub use virtual_time::VirtualCopies;
