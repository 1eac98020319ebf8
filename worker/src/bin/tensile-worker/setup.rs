//! The run's parts from the flags, each checked with an error naming the
//! flag: the device, the copy engine, the graph, the host pool, the CUDA
//! allocator's settings, the process's base meter and the copies' ledger.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use indicatif::MultiProgress;
use tch::Device;
use tensile_cli::Mb;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Graph, Limits, json};
use tensile_swap_executor::HostConfig;
use tensile_worker::{BaseMeter, Engine};

use crate::args::{Args, CopyKind};
use crate::spec::Source;

/// The process's base meter: on CUDA through NVML (said once, above the
/// progress bars, when that cannot be read), on the CPU none.
pub(crate) fn base_meter(device: Device, copies: usize, bars: &MultiProgress) -> BaseMeter {
    let Some(ordinal) = tensile_worker::cuda_ordinal(device) else {
        return BaseMeter::off(copies);
    };
    let bars = bars.clone();
    BaseMeter::new(
        tensile_worker::process_usage(ordinal),
        copies,
        move |message| bars.suspend(|| eprintln!("tensile-worker: {message}")),
    )
}

pub(crate) fn device(s: &str) -> Result<Device> {
    match s {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => Ok(Device::Cuda(n)),
            _ => bail!("unknown device {s:?} (expected cpu, cuda or cuda:N)"),
        },
    }
}

/// The copy engine: `--copy`, else by device (the CUDA engine on a CUDA
/// device, the host engine on the CPU). Clear errors for a CUDA engine
/// without a CUDA device, a driver or a device, and for a pace on the CUDA
/// engine.
pub(crate) fn engine(args: &Args, device: Device) -> Result<Engine> {
    let copy = args.copy.unwrap_or(match device {
        Device::Cpu => CopyKind::Host,
        _ => CopyKind::Cuda,
    });
    if copy == CopyKind::Cuda {
        let Some(ordinal) = tensile_worker::cuda_ordinal(device) else {
            bail!(
                "--copy cuda needs a CUDA device (--device cuda or cuda:N), not {:?}",
                args.device
            );
        };
        if args.link_gbps.is_some() {
            bail!(
                "--link-gbps paces the host engine only; the CUDA engine runs at the real link's speed (drop it, or use --copy host)"
            );
        }
        tensile_swap_executor::cuda_available(ordinal)
            .with_context(|| format!("--copy cuda on --device {}", args.device))?;
    }
    if device != Device::Cpu && !tch::Cuda::is_available() {
        bail!("--device {}: libtorch sees no CUDA device", args.device);
    }
    Ok(match (copy, tensile_worker::cuda_ordinal(device)) {
        (CopyKind::Cuda, Some(ordinal)) => Engine::Cuda { ordinal },
        _ => Engine::Host,
    })
}

/// A job's graph: its file, or the zoo model it names.
pub(crate) fn graph(source: &Source) -> Result<Graph> {
    let (name, batch, resolution, optimizer) = match source {
        Source::File(path) => {
            let limits = Limits::default();
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            return json::parse(&bytes, &limits)
                .with_context(|| format!("graph file {}", path.display()));
        }
        Source::Zoo {
            model,
            batch,
            resolution,
            optimizer,
        } => (model, *batch, *resolution, optimizer),
    };
    let (optimizer, step) = tensile_graph::builder::Optimizer::with_step_from_name(optimizer)?;
    let config = ZooConfig {
        resolution,
        optimizer,
        step,
        ..ZooConfig::new(batch)
    };
    Ok(zoo::build(name, &config)?)
}

/// This process's key at the scheduler, which its jobs share and no other
/// process has: the host, the pid (not unique across containers on one
/// host) and 32 random bits.
pub(crate) fn process_key() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    // A hasher's keys are drawn from the OS's random source per process.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{host}:{}:{:08x}", std::process::id(), h.finish() as u32)
}

pub(crate) fn host_config(args: &Args) -> Result<HostConfig> {
    let bytes_per_s = match args.link_gbps {
        Some(g) if g.is_finite() && g > 0.0 => Some(g * 1e9),
        Some(g) => bail!("--link-gbps must be a positive number of GB/s, not {g}"),
        None => None,
    };
    if !(args.fault_delay_ms.is_finite() && args.fault_delay_ms >= 0.0) {
        bail!(
            "--fault-delay-ms must be zero or more, not {}",
            args.fault_delay_ms
        );
    }
    if args.fault_fail_every == Some(0) {
        bail!("--fault-fail-every must be at least 1");
    }
    Ok(HostConfig {
        bytes_per_s,
        pool_cap_bytes: args.host_pool_mb.map_or(u64::MAX, Mb::bytes),
        fault_delay: Duration::from_secs_f64(args.fault_delay_ms / 1e3),
        fail_every: args.fault_fail_every,
        ..HostConfig::default()
    })
}

/// Sets the CUDA allocator's settings from --cuda-alloc-conf, before the
/// first device allocation, unless the environment sets them (PyTorch reads
/// that itself).
pub(crate) fn allocator_settings(conf: &str) -> Result<()> {
    let env = ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"];
    if conf.is_empty() || env.iter().any(|v| std::env::var_os(v).is_some()) {
        return Ok(());
    }
    tensile_kernels::set_allocator_settings(conf).context("--cuda-alloc-conf")
}

/// A fresh ledger directory for this process's copies alone, on tmpfs
/// where there is one.
pub(crate) fn private_ledger() -> Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    let mut b = tempfile::Builder::new();
    b.prefix("tensile-copies-");
    let dir = if shm.is_dir() {
        b.tempdir_in(shm).or_else(|_| b.tempdir())
    } else {
        b.tempdir()
    };
    dir.context("making a ledger for the process's jobs")
}
