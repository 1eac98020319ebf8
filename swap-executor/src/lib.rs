//! The swap executor: an Execution Queue of timed swap events and an
//! Execution Buffer over a copy engine, so that copies overlap compute.
//!
//! Not built yet: this crate holds the module map only.
//!
//! # Layout (planned)
//! - `engine`: the copy-engine trait and its `host` (a copy thread over a
//!   budgeted arena) and `sim` (virtual time) implementations.
//! - `cuda`: the CUDA copy engine (cudarc, one non-blocking copy stream,
//!   pinned host buffers from a capped pool), behind a feature; a clear error
//!   when no driver is present.
