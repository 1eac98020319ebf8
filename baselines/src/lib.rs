//! The baselines: the systems and practices TENSILE is compared
//! with, expressed as plans for the same executor and simulator, plus the
//! executor options some of them need (synchronous copies, a bounded
//! offload stash, Capuchin's passive eviction). Nothing here simulates on
//! its own: every policy runs through `tensile_executor::sim`, on the same
//! graphs and the same true latencies as ours.
//!
//! # Layout
//! - `common`: what every plan generator needs (releases at last use,
//!   saved activations, the plan's assembly).
//! - `vdnn`: vDNN-conv.
//! - `pytorch`: `save_on_cpu` and torchtune's OffloadActivations.
//! - `checkpoint`: activation checkpointing of every block.
//! - `knapsack`: a knapsack recompute plan under an activation budget
//!   (torch.compile's `activation_memory_budget`).
//! - `capuchin`: Capuchin (passive first iteration, then swaps by free time
//!   and MSPS recomputation under a budget, with late-prefetch feedback).

mod capuchin;
mod checkpoint;
pub mod common;
mod knapsack;
mod pytorch;
mod vdnn;

use tensile_executor::ExecOptions;
use tensile_graph::{Graph, Liveness};
use tensile_planner::{CopyModel, Plan};

pub use capuchin::Capuchin;

/// Every policy `tensilectl sim --policy` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Policy {
    /// Free after last use, nothing else.
    Vanilla,
    /// Ours.
    Tensile,
    VdnnConv,
    Capuchin,
    SaveOnCpu,
    OffloadStream,
    CheckpointBlocks,
    Knapsack,
}

impl Policy {
    pub const ALL: [Policy; 8] = [
        Policy::Vanilla,
        Policy::Tensile,
        Policy::VdnnConv,
        Policy::Capuchin,
        Policy::SaveOnCpu,
        Policy::OffloadStream,
        Policy::CheckpointBlocks,
        Policy::Knapsack,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Vanilla => "vanilla",
            Policy::Tensile => "tensile",
            Policy::VdnnConv => "vdnn-conv",
            Policy::Capuchin => "capuchin",
            Policy::SaveOnCpu => "save-on-cpu",
            Policy::OffloadStream => "offload-stream",
            Policy::CheckpointBlocks => "checkpoint-blocks",
            Policy::Knapsack => "knapsack",
        }
    }

    pub fn parse(name: &str) -> Result<Policy, BaselineError> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| BaselineError::UnknownPolicy {
                name: name.to_string(),
            })
    }

    /// Whether the policy is a fixed plan made before the job runs (all but
    /// ours and Capuchin, which plan from measurements).
    pub fn is_static(self) -> bool {
        !matches!(self, Policy::Tensile | Policy::Capuchin)
    }

    /// How the executor runs this policy's copies.
    pub fn exec_options(self) -> ExecOptions {
        match self {
            Policy::SaveOnCpu => ExecOptions {
                sync_swap_out: true,
                ..ExecOptions::default()
            },
            Policy::OffloadStream => ExecOptions {
                max_swap_outs_in_flight: Some(pytorch::OFFLOAD_STASH),
                ..ExecOptions::default()
            },
            _ => ExecOptions::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BaselineError {
    #[error(
        "unknown policy {name:?}; known: vanilla, tensile, vdnn-conv, capuchin, save-on-cpu, offload-stream, checkpoint-blocks, knapsack"
    )]
    UnknownPolicy { name: String },
    #[error("policy {policy} plans from measurements, not as a fixed plan")]
    NotStatic { policy: &'static str },
    #[error("{policy}: {got} latencies for a graph of {ops} ops")]
    LatencyCount {
        policy: &'static str,
        got: usize,
        ops: usize,
    },
    #[error("{policy}: {what}")]
    Invalid { policy: &'static str, what: String },
}

/// What a fixed-plan baseline is given about one job.
#[derive(Debug, Clone, Copy)]
pub struct BaselineInput<'a> {
    pub graph: &'a Graph,
    pub live: &'a Liveness,
    /// Predicted latency of every op, ns, indexed by op id.
    pub latency_ns: &'a [u64],
    pub copy: CopyModel,
    /// The knapsack policy keeps at most this fraction of the saved
    /// activations' bytes (torch.compile's `activation_memory_budget`).
    pub activation_budget: f64,
}

/// The fixed plan of a static policy for one job.
pub fn static_plan(policy: Policy, input: &BaselineInput<'_>) -> Result<Plan, BaselineError> {
    if input.latency_ns.len() != input.graph.ops().len() {
        return Err(BaselineError::LatencyCount {
            policy: policy.name(),
            got: input.latency_ns.len(),
            ops: input.graph.ops().len(),
        });
    }
    match policy {
        Policy::Vanilla => Ok(common::vanilla(input.live)),
        Policy::VdnnConv => vdnn::plan(input),
        Policy::SaveOnCpu => pytorch::save_on_cpu(input),
        Policy::OffloadStream => pytorch::offload_stream(input),
        Policy::CheckpointBlocks => checkpoint::plan(input),
        Policy::Knapsack => knapsack::plan(input),
        Policy::Tensile | Policy::Capuchin => Err(BaselineError::NotStatic {
            policy: policy.name(),
        }),
    }
}
