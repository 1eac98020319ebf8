//! What an [`Executor`](crate::Executor) and its driver exchange: what it
//! asks the driver to do next ([`Next`]), the memory changes the driver
//! carries out ([`Effect`]), its errors, its options and the measurements
//! of every iteration.

use tensile_graph::{OpId, StorageId, TensorId};

/// What the executor asks of its driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Run `op`'s kernel now; call [`Executor::kernel_done`] when it ends.
    Kernel { op: OpId },
    /// Nothing to do before this time; call [`Executor::step`] then.
    WaitUntil(u64),
    /// Nothing to do until the copy engine completes a copy whose end it
    /// did not know: poll it and call [`Executor::step`] again.
    WaitForCopy,
    /// An iteration has just ended; call [`Executor::step`] again at the
    /// same time. A plan handed over now (after looking at the finished
    /// iteration's measurements) applies to the very next iteration.
    IterationDone,
    /// An allocation must wait until memory frees elsewhere: the job is at
    /// the limit its driver set ([`Executor::set_limit`]) and has nothing of
    /// its own left to free or evict. Call [`Executor::step`] again once the
    /// limit has risen (another job freed memory).
    WaitForMemory,
    /// All iterations are done.
    Done,
}

/// A change of device memory the driver carries out (or counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Make room for the storage on the device.
    Alloc(StorageId),
    /// The storage's device buffer is no longer needed.
    Free(StorageId),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    #[error("op {op} ({name}) needs tensor {tensor} but the plan dropped it with no host copy")]
    Lost { op: u32, name: String, tensor: u32 },
    #[error(
        "persistent tensor {tensor} has no data on the device or the host at the start of iteration {iteration}: it was freed with no host copy"
    )]
    LostPersistent { tensor: u32, iteration: usize },
    #[error("op {op} ({name}) runs on the host and failed there: {why}")]
    HostOpFailed { op: u32, name: String, why: String },
    #[error(
        "op {op} ({name}) needs {need} more bytes of device memory, beyond the {limit} bytes the job may hold, and nothing will free any"
    )]
    NoMemory {
        op: u32,
        name: String,
        need: u64,
        limit: u64,
    },
}

/// How the executor runs copies and memory, beyond what the plan says. The
/// defaults are TENSILE's executor; the other settings model baselines
/// in the same state machine.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExecOptions {
    /// The compute stream waits for every swap-out to end before it runs
    /// the next op (PyTorch's `save_on_cpu`: a synchronous copy to host).
    pub sync_swap_out: bool,
    /// At most this many swap-outs in flight when an op starts: when the
    /// events after an op leave more in flight, the next op first waits for
    /// the oldest to end (torchtune's OffloadActivations keeps a small stash
    /// of tensors in flight). The extra copies are queued at once: the copy
    /// lane is FIFO, so queueing them early moves no copy, only compute
    /// waits.
    pub max_swap_outs_in_flight: Option<usize>,
    /// Capuchin's passive mode: when an allocation would take the job's
    /// memory over this, evict resident non-persistent storages that the
    /// current op does not use, least recently accessed first, to the host
    /// (the op waits for the copies), and swap them back on demand. A
    /// planned prefetch that would not fit is left to its op to fetch.
    pub evict_budget_bytes: Option<u64>,
}

/// Per-iteration measurements.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IterationStats {
    pub start_ns: u64,
    pub end_ns: u64,
    pub peak_bytes: u64,
    pub stall_ns: u64,
    pub passive_swaps: usize,
    pub swapped_bytes: u64,
    pub recomputed_ops: usize,
    /// Measured latency of every op, indexed by op id (recomputes excluded).
    pub op_ns: Vec<u64>,
    /// Planned prefetches that arrived late: (storage root, how long the
    /// op waited for it).
    pub late_prefetches: Vec<(TensorId, u64)>,
    /// Device memory when the iteration began (base, persistent storage,
    /// inputs), as an allocator reports it before the first op: a planner
    /// that is not told the job's base can derive it from this.
    pub start_bytes: u64,
    /// Passive evictions under [`ExecOptions::evict_budget_bytes`], in
    /// order: (storage root, the op that needed the room). What Capuchin's
    /// passive mode observes besides `op_ns`: which tensors did not fit.
    pub evictions: Vec<(TensorId, OpId)>,
    /// How far the job's memory went over `evict_budget_bytes` at most
    /// (0: the budget held): when evicting everything evictable could not
    /// make room, the op ran anyway.
    pub over_budget_bytes: u64,
    /// Copies the engine reported failed (the data stayed where it was).
    pub failed_copies: usize,
    /// Time the job waited for memory under its limit
    /// ([`Executor::set_limit`]): for its own frees in flight, for its
    /// evictions to the host, or for other jobs to free memory (part of
    /// `stall_ns`).
    pub memory_wait_ns: u64,
    /// Prefetches the limit held back when they fired (started later, or
    /// fetched on demand by their op), and storages it evicted.
    pub held_back: usize,
    pub guard_evictions: usize,
    /// Time the job held an op back to keep to its plan's pace (not a
    /// stall: the plan's time line has it).
    pub paced_ns: u64,
    /// The version of the plan the iteration ran, and whether it was the
    /// first iteration on it (a switch: persistent storage moves to where
    /// the new plan wants it, so its copies and waits are not the plan's).
    pub plan_version: u64,
    pub switched: bool,
    /// Ops handed to the host (optimizer updates kept there).
    pub host_runs: usize,
    /// Time the iteration ran on after its last op for its host ops (and
    /// the copies around them) to end: the program's, not a stall.
    pub host_wait_ns: u64,
}
