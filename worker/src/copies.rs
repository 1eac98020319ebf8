//! The worker's copy engine, picked at start: the host engine (real bytes
//! on copy threads, any device) or the CUDA engine (a CUDA stream and a
//! pinned pool, CUDA devices only). One type for the executor, so the
//! runtime is the same over both.

use std::time::{Duration, Instant};

use tch::{Device, Tensor};
use tensile_graph::StorageId;
use tensile_swap_executor::{
    Copy, CopyEngine, CopyId, CopyStatus, CudaConfig, CudaCopies, CudaUnavailable, DevicePayload,
    HostConfig, HostCopies, HostKernel, HostRun,
};

use crate::payload::{Flat, FlatMeta};

/// Which copy engine the worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// [`HostCopies`]: copy threads, paced at `HostConfig::bytes_per_s`.
    #[default]
    Host,
    /// [`CudaCopies`] on CUDA device `ordinal` (the kernels' device); the
    /// host config's pool cap and faults apply, its pace does not (the
    /// link is the real one).
    Cuda { ordinal: usize },
}

// SAFETY: a `Flat` is one contiguous libtorch tensor (`Flat::over` and
// `alloc` make it so) that owns its storage for as long as it lives:
// `data_ptr` is the first byte of `byte_len` bytes of it, on the device
// `device_ordinal` reads from the tensor itself, allocated by libtorch's
// caching allocator in the device's primary context.
#[allow(unsafe_code)]
unsafe impl DevicePayload for Flat {
    fn device_ptr(&self) -> u64 {
        self.0.data_ptr() as usize as u64
    }

    fn device_ordinal(&self) -> Option<usize> {
        match self.0.device() {
            Device::Cuda(i) => Some(i),
            _ => None,
        }
    }

    fn alloc(meta: &FlatMeta, len: usize) -> Result<Flat, String> {
        let elt = meta.kind.elt_size_in_bytes();
        if !len.is_multiple_of(elt) {
            return Err(format!("{len} B is not a whole number of {:?}", meta.kind));
        }
        Tensor::f_empty([(len / elt) as i64], (meta.kind, meta.device))
            .map(Flat)
            .map_err(|e| format!("allocating {len} B on {:?}: {e}", meta.device))
    }
}

/// The engine in use.
#[derive(Debug)]
pub enum Copies {
    Host(HostCopies<Flat>),
    Cuda(CudaCopies<Flat>),
}

macro_rules! each {
    ($self:expr, $e:ident => $body:expr) => {
        match $self {
            Copies::Host($e) => $body,
            Copies::Cuda($e) => $body,
        }
    };
}

impl Copies {
    /// The engine `engine` with `host`'s pool cap and faults; times are ns
    /// since `epoch`. The CUDA engine is a clear error without a driver or
    /// a device.
    pub fn new(
        engine: Engine,
        host: HostConfig,
        epoch: Instant,
    ) -> Result<Copies, CudaUnavailable> {
        Ok(match engine {
            Engine::Host => Copies::Host(HostCopies::new(host, epoch)),
            Engine::Cuda { ordinal } => {
                let config = CudaConfig {
                    ordinal,
                    pool_cap_bytes: host.pool_cap_bytes,
                    fault_delay: host.fault_delay,
                    fail_every: host.fail_every,
                };
                Copies::Cuda(CudaCopies::new(config, epoch)?)
            }
        })
    }

    pub fn set_device(&mut self, s: StorageId, payload: Flat) {
        each!(self, e => e.set_device(s, payload))
    }

    pub fn device(&self, s: StorageId) -> Option<&Flat> {
        each!(self, e => e.device(s))
    }

    pub fn put_host(&mut self, s: StorageId, payload: &Flat) -> Result<(), String> {
        each!(self, e => e.put_host(s, payload))
    }

    pub fn host_payload(&self, s: StorageId) -> Option<Result<Flat, String>> {
        each!(self, e => e.host_payload(s))
    }

    pub fn pool_bytes(&self) -> (u64, u64) {
        each!(self, e => e.pool_bytes())
    }

    pub fn wait(&mut self, timeout: Duration) -> bool {
        each!(self, e => e.wait(timeout))
    }

    pub fn drain(&mut self) {
        each!(self, e => e.drain())
    }

    pub fn in_flight(&self) -> usize {
        each!(self, e => e.in_flight())
    }

    /// Installs the kernel of host runs (either engine runs them over its
    /// host copies, on a host thread of its own).
    pub(crate) fn set_host_kernel(&mut self, kernel: impl HostKernel<FlatMeta>) {
        each!(self, e => e.set_host_kernel(kernel))
    }
}

impl CopyEngine for Copies {
    fn submit(&mut self, copy: Copy) -> CopyId {
        each!(self, e => e.submit(copy))
    }
    fn run_on_host(&mut self, run: HostRun) -> CopyId {
        each!(self, e => e.run_on_host(run))
    }
    fn poll(&mut self, now: u64) {
        each!(self, e => e.poll(now))
    }
    fn status(&self, id: CopyId) -> CopyStatus {
        each!(self, e => e.status(id))
    }
    fn forget(&mut self, id: CopyId) {
        each!(self, e => e.forget(id))
    }
    fn discard_host(&mut self, s: StorageId) {
        each!(self, e => e.discard_host(s))
    }
    fn device_freed(&mut self, s: StorageId) {
        each!(self, e => e.device_freed(s))
    }
}

/// The CUDA device of `device`, for [`Engine::Cuda`]; `None` on the CPU.
pub fn cuda_ordinal(device: Device) -> Option<usize> {
    match device {
        Device::Cuda(n) => Some(n),
        _ => None,
    }
}
