//! The executor of one job and the simulator built on it (SPEC §6). One
//! state machine runs a job's iteration over pluggable time: the simulator
//! drives it with virtual-time kernels and copy channels; the worker will
//! drive it with real kernels and copy engines.
//!
//! # Layout
//! - `machine`: the executor state machine.
//! - `copy`: virtual-time copy channels.
//! - `sim`: N jobs on one virtual GPU, processor-shared kernels.
//! - `replan`: EWMA of measured latencies and re-planning over a threshold.

mod copy;
mod machine;
pub mod replan;
pub mod sim;

pub use copy::{Channels, Dir};
pub use machine::{ExecError, ExecOptions, Executor, IterationStats, Next};
