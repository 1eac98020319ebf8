//! The worker's errors: out of device memory (naming the op, the tensor
//! and the budget in use, with the other jobs' share on a ledger), the
//! ledger's, the executor's, the CUDA engine's, a kernel's.

use std::path::PathBuf;

use tensile_executor::ExecError;
use tensile_swap_executor::CudaUnavailable;

use crate::ledger::LedgerError;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(
        "out of device memory at op {op} ({name}): {bytes} B for tensor {tensor} with {in_use} B of the {budget} B budget in use{}",
        shared_note(*others)
    )]
    OutOfMemory {
        op: u32,
        name: String,
        tensor: String,
        bytes: u64,
        in_use: u64,
        budget: u64,
        /// What the other workers on the ledger held (0 without one).
        others: u64,
    },
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("a memory ledger ({}) shares a budget: give the budget (--memory-mb)", .0.display())]
    LedgerWithoutBudget(PathBuf),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("the CUDA copy engine cannot run: {0}")]
    Cuda(#[from] CudaUnavailable),
    #[error("op {op} ({name}) failed: {why}")]
    Kernel { op: u32, name: String, why: String },
    #[error(
        "op {op} ({name}) runs on the host, and the worker was given no host kernels to run it (Worker::set_host_kernels)"
    )]
    NoHostKernels { op: u32, name: String },
    #[error("tensor {tensor} ({name}): {why}")]
    Tensor {
        tensor: u32,
        name: String,
        why: String,
    },
}

fn shared_note(others: u64) -> String {
    if others == 0 {
        String::new()
    } else {
        format!(" and {others} B held by the other jobs on the memory ledger")
    }
}
