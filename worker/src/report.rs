//! What the worker reports of each iteration: the executor's statistics
//! with the worker's own measurements (peak of the tensors held, time in
//! the kernels, the gate's wait), printed as the binary's per-iteration
//! JSON and sent to the scheduler.

use serde::Serialize;
use tensile_executor::IterationStats;
use tensile_graph::TensorId;

/// What one iteration measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IterationReport {
    pub iteration: usize,
    pub time_ns: u64,
    /// The most bytes of device storage held at once, measured from the
    /// tensors held (their storages' extents).
    pub measured_peak_bytes: u64,
    /// The same as the executor counts it (the graph's sizes).
    pub executor_peak_bytes: u64,
    pub stall_ns: u64,
    pub passive_swaps: usize,
    pub late_prefetches: usize,
    pub late_prefetch_wait_ns: u64,
    /// The storages (root tensors) whose prefetches were late.
    #[serde(skip)]
    pub late_prefetch_tensors: Vec<TensorId>,
    /// Resident device bytes at every change during the iteration, as (ns
    /// since the Unix epoch, bytes), when [`Worker::record_memory`](crate::Worker::record_memory) is on.
    #[serde(skip)]
    pub memory: Vec<(u64, u64)>,
    pub failed_copies: usize,
    pub recomputed_ops: usize,
    pub swapped_bytes: u64,
    /// Time inside the kernels (recomputations included): the rest of
    /// `time_ns` is the worker's own (executor, effects, views, copies
    /// started) and waits.
    pub kernel_ns: u64,
    /// Time of every op as the executor measured it (its kernel and the
    /// worker's work around it), indexed by op id.
    #[serde(skip)]
    pub op_ns: Vec<u64>,
    /// When the iteration started, ns on the host's monotonic clock (the
    /// clock of the plans' gates).
    pub start_monotonic_ns: u64,
    /// How long the iteration waited for its gate's slot before it began.
    pub gate_wait_ns: u64,
    /// The gate's period and this job's phase in it (0, 0: no gate).
    pub gate_period_ns: u64,
    pub gate_phase_ns: u64,
    /// Ops run on the host (optimizer updates kept there), and how long
    /// the iteration's end waited for them and the copies around them
    /// (not a stall: the device had nothing left to run).
    pub host_runs: usize,
    pub host_wait_ns: u64,
    /// What the guard of `--memory-mb` did: time waited for memory,
    /// storages evicted, prefetches held back.
    pub memory_wait_ns: u64,
    pub guard_evictions: usize,
    pub held_back: usize,
    /// On CUDA, the caching allocator's peak of allocated bytes during the
    /// iteration (`torch.cuda.max_memory_allocated`, its peak reset as each
    /// iteration ends): every tensor of the process, the kernels'
    /// temporaries included, where `measured_peak_bytes` counts the
    /// storages the plan moves. Absent on the CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_peak_bytes: Option<u64>,
    /// On CUDA, once measured (after the first iterations): the device
    /// bytes the process holds outside its jobs' storages (NVML's figure
    /// for the process less the storages' peak; see `base`), the whole
    /// process's when it trains several jobs. Absent on the CPU,
    /// before the first measurement and where it cannot be measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_bytes: Option<u64>,
}

impl IterationReport {
    pub(crate) fn new(
        iteration: usize,
        s: &IterationStats,
        measured_peak_bytes: u64,
        kernel_ns: u64,
    ) -> IterationReport {
        IterationReport {
            iteration,
            time_ns: s.end_ns - s.start_ns,
            measured_peak_bytes,
            executor_peak_bytes: s.peak_bytes,
            stall_ns: s.stall_ns,
            passive_swaps: s.passive_swaps,
            late_prefetches: s.late_prefetches.len(),
            late_prefetch_wait_ns: s.late_prefetches.iter().map(|l| l.1).sum(),
            late_prefetch_tensors: s.late_prefetches.iter().map(|l| l.0).collect(),
            memory: Vec::new(),
            failed_copies: s.failed_copies,
            recomputed_ops: s.recomputed_ops,
            swapped_bytes: s.swapped_bytes,
            kernel_ns,
            op_ns: s.op_ns.clone(),
            start_monotonic_ns: 0,
            gate_wait_ns: 0,
            gate_period_ns: 0,
            gate_phase_ns: 0,
            host_runs: s.host_runs,
            host_wait_ns: s.host_wait_ns,
            memory_wait_ns: s.memory_wait_ns,
            guard_evictions: s.guard_evictions,
            held_back: s.held_back,
            allocator_peak_bytes: None,
            base_bytes: None,
        }
    }
}

impl IterationReport {
    /// The iteration as the scheduler hears it (the session's report).
    pub fn to_session_report(&self) -> tensile_session::Report {
        tensile_session::Report {
            iteration: self.iteration as u64,
            op_latency_s: self.op_ns.iter().map(|&ns| ns as f64 * 1e-9).collect(),
            stall_s: self.stall_ns as f64 * 1e-9,
            late_prefetches: self.late_prefetch_tensors.iter().map(|t| t.0).collect(),
            passive_swaps: u32::try_from(self.passive_swaps).unwrap_or(u32::MAX),
            peak_bytes: self.measured_peak_bytes,
            base_bytes: self.base_bytes.unwrap_or(0),
        }
    }
}
