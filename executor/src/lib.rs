//! The executor of one job and the simulator built on it. One
//! state machine runs a job's iteration; it owns no clock and no copy
//! engine: the simulator drives it with virtual-time kernels and the
//! virtual-time copy engine, the worker with real kernels and real copies.
//!
//! # Layout
//! - `interface`: what the machine and its driver exchange.
//! - `machine`: the executor state machine, generic over a
//!   [`CopyEngine`]; allocations and frees leave it as [`Effect`]s.
//! - `schedule`: a plan's events indexed by where they fire.
//! - `host_ops`: ops that run on the host (optimizer updates kept there),
//!   handed to the engine's host while the device goes on.
//! - `flight`: copies in flight (submitted, learned of, started from the
//!   Execution Queue).
//! - `state`: what it knows of one storage (device side, host side, copies
//!   in flight).
//! - `evict`: Capuchin's passive mode (LRU eviction under a budget).
//! - `sim`: N jobs on one virtual GPU, processor-shared kernels.
//! - `trace`: memory over time, written and read as the worker's
//!   `--memory-trace` CSV and added up over jobs.
//! - `replan`: the simulator's side of re-planning: measurements of an
//!   iteration handed to the planner's re-planner.

mod evict;
mod flight;
mod guard;
mod host_ops;
mod interface;
mod machine;
pub mod replan;
mod schedule;
pub mod sim;
mod state;
pub mod trace;

pub use interface::{Effect, ExecError, ExecOptions, IterationStats, Next};
pub use machine::Executor;
pub use tensile_swap_executor::{CopyEngine, Dir, VirtualCopies};
