//! Real ATen kernels for every op of a graph, through one boxed-dispatch
//! path: a small C++ shim (`csrc/shim.cpp`) finds any operator by its schema
//! name in PyTorch's dispatcher and calls it with `c10::IValue`s in schema
//! order, so ops tch does not generate (`convolution_backward`,
//! `native_batch_norm_backward`, `_fused_adam_`, ...) run like any other.
//!
//! - [`Program::new`] binds every op of a graph to a schema up front
//!   ([`bind`]): an op that cannot run is an error naming it.
//! - [`Program::run`] runs one op on its input tensors.
//! - [`initial_values`] makes the tensors an iteration starts from (seeded,
//!   or loaded from safetensors), [`run_iteration`] is the reference loop
//!   (ops back to back, no executor, no plan) and [`save_params`] writes the
//!   parameters.

mod bind;
mod ffi;
mod program;
mod schema;
mod values;

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};

use thiserror::Error;

pub use program::Program;
pub use values::{Values, initial_values, kind_of, run_iteration, save_params};

/// PyTorch's default random generator is one per device for the whole
/// process. Seeding it and drawing a job's initial tensors, and each random
/// op (dropout), take turns through this lock, so that the tensors seeded
/// on one thread do not depend on what other threads (copies of a job in
/// one process, tests) draw meanwhile.
static RNG: Mutex<()> = Mutex::new(());

fn rng_turn() -> MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Why a graph cannot run, or an op failed.
#[derive(Debug, Error)]
pub enum KernelError {
    /// An op cannot be bound to an ATen schema.
    #[error("op {op} {name:?} ({op_type}) cannot run: {reason}")]
    Bind {
        op: tensile_graph::OpId,
        name: String,
        op_type: String,
        reason: String,
    },
    /// An op failed while running (the kernel's own message).
    #[error("op {op} {name:?} ({op_type}) failed: {reason}")]
    Run {
        op: tensile_graph::OpId,
        name: String,
        op_type: String,
        reason: String,
    },
    /// The program cannot run on this device.
    #[error("device {device:?}: {reason}")]
    Device { device: tch::Device, reason: String },
    /// A tensors file is missing, unreadable, or does not fit the graph.
    #[error("{}: {reason}", path.display())]
    File { path: PathBuf, reason: String },
    /// The values do not fit the graph (a missing initial tensor, ...).
    #[error("{0}")]
    Values(String),
}

/// The CUDA caching allocator's statistics of one device, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    pub allocated: i64,
    pub allocated_peak: i64,
    pub reserved: i64,
    pub reserved_peak: i64,
}

/// The CUDA caching allocator's statistics of device `index`
/// (`c10::getDeviceAllocator(CUDA)->getDeviceStats`, as
/// `torch.cuda.memory_stats`); with `reset_peak`, the peaks are reset
/// afterwards (a per-iteration peak). An error without a GPU.
pub fn cuda_memory(index: usize, reset_peak: bool) -> Result<DeviceMemory, KernelError> {
    let device = tch::Device::Cuda(index);
    if !tch::Cuda::is_available() || index >= tch::Cuda::device_count() as usize {
        return Err(KernelError::Device {
            device,
            reason: format!(
                "no such CUDA device ({} available)",
                tch::Cuda::device_count()
            ),
        });
    }
    let i = i32::try_from(index).map_err(|_| KernelError::Device {
        device,
        reason: "device index out of range".to_string(),
    })?;
    let [allocated, allocated_peak, reserved, reserved_peak] =
        ffi::cuda_memory(i, reset_peak).map_err(|reason| KernelError::Device { device, reason })?;
    Ok(DeviceMemory {
        allocated,
        allocated_peak,
        reserved,
        reserved_peak,
    })
}

/// Gives the CUDA caching allocator's unused cached memory back to the
/// driver (`torch.cuda.empty_cache()`): what the process then holds on the
/// device is what its tensors and the CUDA context need, not the high
/// water of an earlier plan. Blocks in use stay. An error without a GPU.
pub fn cuda_empty_cache() -> Result<(), KernelError> {
    let device = tch::Device::Cuda(0);
    if !tch::Cuda::is_available() {
        return Err(KernelError::Device {
            device,
            reason: "no CUDA device: there is no CUDA cache to empty".to_string(),
        });
    }
    ffi::cuda_empty_cache().map_err(|reason| KernelError::Device { device, reason })
}

/// cuDNN's deterministic algorithms on or off, its autotuner off (as
/// `torch.backends.cudnn.deterministic = True; benchmark = False`): the
/// same kernels on the same GPU then give bit-identical results run to run,
/// which numeric tests that compare runs need. No effect without cuDNN.
pub fn set_deterministic_cudnn(on: bool) {
    ffi::set_deterministic_cudnn(on);
}

/// Sets PyTorch's caching allocators' settings, in the syntax of
/// `PYTORCH_ALLOC_CONF` (`"expandable_segments:True"`, say), as
/// `torch.cuda.memory._set_allocator_settings` does: before the first device
/// allocation they apply to everything; later, to what is allocated next.
/// An error names a setting the allocator refuses.
pub fn set_allocator_settings(conf: &str) -> Result<(), KernelError> {
    ffi::set_allocator_settings(conf)
        .map_err(|e| KernelError::Values(format!("allocator settings {conf:?}: {e}")))
}

/// Writes `src` into the memory of `dst`, a contiguous CPU tensor of
/// exactly `src.len()` bytes, without allocating: for copy engines that
/// refill buffers they reuse (a fresh allocation of tens of MB page-faults
/// on first touch). An error names what does not fit.
pub fn write_bytes(dst: &tch::Tensor, src: &[u8]) -> Result<(), String> {
    ffi::write_bytes(dst, src)
}

/// Runs `f` on CPU tensors over bytes the caller owns, without copying
/// them: one flat tensor per buffer (`bytes.len() / elt` elements of its
/// kind), valid only inside `f`, whose in-place writes land in the bytes.
/// For kernels that run over a copy engine's host buffers (an optimizer
/// update kept on the host). Every tensor over the buffers, views
/// included, must be dropped before `f` returns: one that is kept aborts
/// the process (it would point at memory given back). An error names a
/// buffer that is not whole, aligned elements of its kind.
pub fn with_cpu_tensors<R>(
    bufs: &mut [(&mut [u8], tch::Kind)],
    f: impl FnOnce(&[tch::Tensor]) -> R,
) -> Result<R, String> {
    ffi::with_cpu_tensors(bufs, f)
}

/// The schema `op` binds to, as PyTorch prints it, or why it cannot run.
pub fn binding_of(op: &tensile_graph::Op) -> Result<String, String> {
    bind::bind(op, &mut bind::Cache::default()).map(|b| b.schema.text)
}

#[cfg(test)]
mod tests {
    use tch::Kind;

    #[test]
    fn tensors_over_lent_bytes_write_in_place_and_misfits_are_errors() {
        let mut a: Vec<u8> = [1.5f32, -2.0, 4.0]
            .iter()
            .flat_map(|x| x.to_ne_bytes())
            .collect();
        let mut b: Vec<u8> = [0.5f32, 0.5, 0.5]
            .iter()
            .flat_map(|x| x.to_ne_bytes())
            .collect();
        let sum = super::with_cpu_tensors(
            &mut [(&mut a[..], Kind::Float), (&mut b[..], Kind::Float)],
            |t| {
                let mut x = t[0].shallow_clone();
                let _ = x.f_add_(&t[1]).expect("adds");
                // A view made and dropped inside is fine.
                t[0].narrow(0, 1, 2).sum(Kind::Double).double_value(&[])
            },
        )
        .expect("wraps");
        assert_eq!(sum, 3.0);
        let back: Vec<f32> = a
            .chunks(4)
            .map(|c| f32::from_ne_bytes(c.try_into().expect("4 bytes")))
            .collect();
        assert_eq!(back, [2.0, -1.5, 4.5]);
        let mut odd = [0u8; 6];
        let err = super::with_cpu_tensors(&mut [(&mut odd[..], Kind::Float)], |_| ())
            .expect_err("6 bytes are not floats");
        assert!(err.contains("not whole, aligned elements"), "{err}");
        let mut empty: Vec<u8> = Vec::new();
        let n = super::with_cpu_tensors(&mut [(&mut empty[..], Kind::Float)], |t| t[0].numel())
            .expect("empty");
        assert_eq!(n, 0);
    }
}
