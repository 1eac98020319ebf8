//! The device memory this process uses on one GPU, as the driver counts
//! it: NVML (`libnvidia-ml.so.1`, loaded at run time like the CUDA driver,
//! so the build needs no NVIDIA library), per process
//! (`nvmlDeviceGetComputeRunningProcesses_v3`), matched to this process
//! by its pid and to the CUDA device by its PCI bus id (NVML numbers the
//! GPUs its own way, and `CUDA_VISIBLE_DEVICES` renumbers CUDA's). That
//! figure holds everything the process holds on the device: the CUDA
//! context, the libraries' handles and workspaces, and the caching
//! allocator's reserved memory, tensors and cache alike.
//!
//! The crate's second module with `unsafe` (the NVML calls, the library's
//! symbols); each block says why it is sound.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::Arc;

use cudarc::driver::CudaContext;
use cudarc::driver::sys::CUdevice_attribute;
use libloading::Library;

use crate::cuda::{CudaUnavailable, cuda_available};

/// The library's name, as the driver installs it.
const LIBRARY: &str = "libnvidia-ml.so.1";
const SUCCESS: c_int = 0;
const INSUFFICIENT_SIZE: c_int = 7;
/// `usedGpuMemory` when NVML cannot tell (Windows' WDDM, some vGPUs).
const VALUE_NOT_AVAILABLE: c_ulonglong = c_ulonglong::MAX;

/// `nvmlProcessInfo_t` (`nvmlProcessInfo_v2_t`), what the `_v3` query
/// fills.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

type Device = *mut c_void;
type InitFn = unsafe extern "C" fn() -> c_int;
type ShutdownFn = unsafe extern "C" fn() -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type HandleByPciBusIdFn = unsafe extern "C" fn(*const c_char, *mut Device) -> c_int;
type ProcessesFn = unsafe extern "C" fn(Device, *mut c_uint, *mut ProcessInfo) -> c_int;

/// Why the process's device memory cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    #[error("NVML ({LIBRARY}) cannot be loaded: {0}")]
    Missing(String),
    #[error("{call} failed: {message} (NVML error {code})")]
    Call {
        call: &'static str,
        code: i32,
        message: String,
    },
    #[error(
        "this process (pid {pid}) is not among the {listed} processes NVML lists on the device (in a container with a PID namespace of its own, NVML lists the host's pids)"
    )]
    NotListed { pid: u32, listed: usize },
    #[error("NVML does not count the memory of single processes on this device")]
    NotAvailable,
    #[error("the CUDA device's PCI bus id: {0}")]
    Cuda(#[from] CudaUnavailable),
}

/// The device memory this process uses on one CUDA device, through NVML.
pub struct ProcessMemory {
    /// Keeps the functions below valid.
    _lib: Library,
    shutdown: ShutdownFn,
    error_string: ErrorStringFn,
    processes: ProcessesFn,
    device: Device,
    pid: u32,
    /// Where the device is on the PCI bus (`0000:3b:00.0`).
    pci_bus_id: String,
    /// The device's primary context, held as libtorch and the copy engine
    /// hold it: looking the bus id up must not create and destroy it.
    _ctx: Arc<CudaContext>,
}

// SAFETY: an `nvmlDevice_t` is a process-wide handle that stays valid
// until `nvmlShutdown` (called only on drop), and NVML's functions are
// thread-safe; the rest is plain data and function pointers into a
// library this value keeps loaded.
unsafe impl Send for ProcessMemory {}
// SAFETY: as for `Send`: every method takes `&self` and only calls NVML,
// which is thread-safe.
unsafe impl Sync for ProcessMemory {}

impl std::fmt::Debug for ProcessMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessMemory")
            .field("pci_bus_id", &self.pci_bus_id)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

fn driver(e: cudarc::driver::DriverError) -> CudaUnavailable {
    CudaUnavailable::Driver(e.to_string())
}

/// The device's PCI bus id as NVML reads it (`domain:bus:device.0`, in
/// hex).
fn pci_bus_id(ctx: &CudaContext) -> Result<String, CudaUnavailable> {
    let attr = |a| ctx.attribute(a).map_err(driver);
    let domain = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
    let bus = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
    let device = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
    Ok(format!("{domain:04x}:{bus:02x}:{device:02x}.0"))
}

/// CUDA device `ordinal`'s memory, bytes.
pub fn device_memory_bytes(ordinal: usize) -> Result<u64, CudaUnavailable> {
    cuda_available(ordinal)?;
    let ctx = CudaContext::new(ordinal).map_err(driver)?;
    Ok(ctx.total_mem().map_err(driver)? as u64)
}

impl ProcessMemory {
    /// Loads NVML and finds CUDA device `ordinal` in it; a clear error
    /// without a driver, a device or NVML.
    pub fn open(ordinal: usize) -> Result<ProcessMemory, NvmlError> {
        cuda_available(ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(driver)?;
        let bus = pci_bus_id(&ctx)?;
        ProcessMemory::open_bus(&bus, ctx)
    }

    /// Loads NVML and finds the device at PCI bus id `bus`.
    fn open_bus(bus: &str, ctx: Arc<CudaContext>) -> Result<ProcessMemory, NvmlError> {
        // SAFETY: loading the driver's NVML runs its initialisers, which
        // have no preconditions on the process (nvidia-smi and PyTorch
        // load it the same way).
        let lib =
            unsafe { Library::new(LIBRARY) }.map_err(|e| NvmlError::Missing(e.to_string()))?;
        // SAFETY: each symbol is looked up with the type NVML's header
        // gives it (nvml.h, the `_v2`/`_v3` entry points named).
        let (init, shutdown, error_string, by_bus, processes) = unsafe {
            let f = |e: libloading::Error| NvmlError::Missing(e.to_string());
            (
                *lib.get::<InitFn>(b"nvmlInit_v2\0").map_err(f)?,
                *lib.get::<ShutdownFn>(b"nvmlShutdown\0").map_err(f)?,
                *lib.get::<ErrorStringFn>(b"nvmlErrorString\0").map_err(f)?,
                *lib.get::<HandleByPciBusIdFn>(b"nvmlDeviceGetHandleByPciBusId_v2\0")
                    .map_err(f)?,
                *lib.get::<ProcessesFn>(b"nvmlDeviceGetComputeRunningProcesses_v3\0")
                    .map_err(f)?,
            )
        };
        // SAFETY: `nvmlInit_v2` takes no arguments; a matching
        // `nvmlShutdown` runs on drop (or below, on failure).
        let rc = unsafe { init() };
        let name = |code| {
            // SAFETY: `nvmlErrorString` returns a static NUL-terminated
            // string for any code (or null, which is checked).
            let p = unsafe { error_string(code) };
            if p.is_null() {
                return format!("error {code}");
            }
            // SAFETY: non-null and NUL-terminated, static in the library.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        if rc != SUCCESS {
            return Err(NvmlError::Call {
                call: "nvmlInit_v2",
                code: rc,
                message: name(rc),
            });
        }
        let c_bus = CString::new(bus).map_err(|_| NvmlError::Call {
            call: "nvmlDeviceGetHandleByPciBusId_v2",
            code: -1,
            message: format!("a NUL byte in the bus id {bus:?}"),
        })?;
        let mut device: Device = std::ptr::null_mut();
        // SAFETY: `c_bus` is NUL-terminated and alive for the call; `device`
        // is a valid out-pointer.
        let rc = unsafe { by_bus(c_bus.as_ptr(), &mut device) };
        if rc != SUCCESS {
            let message = format!("{} (PCI bus id {bus})", name(rc));
            // SAFETY: NVML was initialised above; this undoes it.
            unsafe { shutdown() };
            return Err(NvmlError::Call {
                call: "nvmlDeviceGetHandleByPciBusId_v2",
                code: rc,
                message,
            });
        }
        Ok(ProcessMemory {
            _lib: lib,
            shutdown,
            error_string,
            processes,
            device,
            pid: std::process::id(),
            pci_bus_id: bus.to_string(),
            _ctx: ctx,
        })
    }

    /// The device's PCI bus id.
    pub fn pci_bus_id(&self) -> &str {
        &self.pci_bus_id
    }

    /// The device bytes this process uses now, as the driver counts them.
    pub fn used_bytes(&self) -> Result<u64, NvmlError> {
        let mut infos = vec![ProcessInfo::default(); 64];
        for _ in 0..4 {
            let mut count = c_uint::try_from(infos.len()).unwrap_or(c_uint::MAX);
            // SAFETY: `infos` has room for `count` entries of the layout
            // NVML writes; `count` is a valid in/out pointer; `device` came
            // from this NVML's handle lookup and NVML is initialised.
            let rc = unsafe { (self.processes)(self.device, &mut count, infos.as_mut_ptr()) };
            let listed = count as usize;
            match rc {
                SUCCESS => {
                    let mine = infos[..listed.min(infos.len())]
                        .iter()
                        .find(|p| p.pid == self.pid);
                    return match mine {
                        Some(p) if p.used_gpu_memory == VALUE_NOT_AVAILABLE => {
                            Err(NvmlError::NotAvailable)
                        }
                        Some(p) => Ok(p.used_gpu_memory),
                        None => Err(NvmlError::NotListed {
                            pid: self.pid,
                            listed,
                        }),
                    };
                }
                // Processes came meanwhile: room for them and a few more.
                INSUFFICIENT_SIZE => infos.resize(listed + 16, ProcessInfo::default()),
                code => return Err(self.call_error(code)),
            }
        }
        Err(self.call_error(INSUFFICIENT_SIZE))
    }

    fn call_error(&self, code: c_int) -> NvmlError {
        // SAFETY: `nvmlErrorString` returns a static NUL-terminated string
        // for any code, or null (checked).
        let p = unsafe { (self.error_string)(code) };
        let message = if p.is_null() {
            format!("error {code}")
        } else {
            // SAFETY: non-null and NUL-terminated, static in the library.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        NvmlError::Call {
            call: "nvmlDeviceGetComputeRunningProcesses_v3",
            code,
            message,
        }
    }
}

impl Drop for ProcessMemory {
    fn drop(&mut self) {
        // SAFETY: NVML was initialised when this value was made; each
        // `nvmlInit` is matched by one `nvmlShutdown` (NVML counts them).
        unsafe { (self.shutdown)() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_info_has_nvmls_layout() {
        // pid, 4 bytes of padding, usedGpuMemory, the two instance ids.
        assert_eq!(std::mem::size_of::<ProcessInfo>(), 24);
        assert_eq!(std::mem::offset_of!(ProcessInfo, used_gpu_memory), 8);
    }

    #[test]
    fn without_a_gpu_opening_is_a_clear_error() {
        if cuda_available(0).is_ok() {
            eprintln!("SKIPPED: a GPU is here; the GPU tests cover it");
            return;
        }
        let e = ProcessMemory::open(0).expect_err("no GPU").to_string();
        assert!(e.contains("PCI bus id") && e.contains("CUDA"), "{e}");
    }
}
