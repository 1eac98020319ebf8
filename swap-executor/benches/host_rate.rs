//! The host copy engine's unthrottled copy rate, both directions, for
//! buffers of 8, 32 and 128 MiB side by side: 512 MiB of them out to the
//! host pool and back per round, as fast as they go; the best of three
//! rounds after a warm-up (later rounds reuse the pool's host buffers and
//! the device buffers the engine keeps, as the worker's iterations do).
//! Target: at least 2 GB/s each way.
//!
//! `cargo bench -p tensile-swap-executor --bench host_rate`

use std::sync::Arc;
use std::time::{Duration, Instant};

use tensile_graph::StorageId;
use tensile_swap_executor::{Dir, HostConfig, HostCopies, Payload};

/// A "device" buffer of plain bytes.
struct Buf(Arc<Vec<u8>>);

impl Payload for Buf {
    type Meta = ();
    fn meta(&self) {}
    fn share(&self) -> Self {
        Buf(Arc::clone(&self.0))
    }
    fn byte_len(&self) -> usize {
        self.0.len()
    }
    fn read(&self, dst: &mut [u8]) -> Result<(), String> {
        dst.copy_from_slice(&self.0);
        Ok(())
    }
    fn write(_: &(), src: &[u8]) -> Result<Self, String> {
        Ok(Buf(Arc::new(src.to_vec())))
    }
    fn reusable(&self) -> bool {
        true
    }
    fn overwrite(&mut self, src: &[u8]) -> Result<(), String> {
        let dst = Arc::get_mut(&mut self.0).ok_or("a shared buffer")?;
        dst.copy_from_slice(src);
        Ok(())
    }
}

/// Bytes moved per direction per round.
const TOTAL: usize = 512 << 20;

/// Best (device->host, host->device) GB/s for buffers of `len` bytes.
fn rates(len: usize, reuse: bool) -> (f64, f64) {
    let n = (TOTAL / len) as u32;
    let epoch = Instant::now();
    let config = HostConfig {
        reuse_cap_bytes: if reuse { TOTAL as u64 } else { 0 },
        ..HostConfig::default()
    };
    let mut e = HostCopies::<Buf>::new(config, epoch);
    for s in 0..n {
        e.set_device(StorageId(s), Buf(Arc::new(vec![s as u8; len])));
    }
    let mut best = (0.0f64, 0.0f64);
    for round in 0..4 {
        let out = e.timed_batch(Dir::ToHost, n, len as u64) / 1e9;
        for s in 0..n {
            e.drop_device(StorageId(s));
        }
        let back = e.timed_batch(Dir::ToDevice, n, len as u64) / 1e9;
        for s in 0..n {
            let b = e.device(StorageId(s)).expect("prefetched");
            assert!(b.0.iter().step_by(4096).all(|&x| x == s as u8), "bytes");
        }
        if round > 0 {
            best = (best.0.max(out), best.1.max(back));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    best
}

fn main() {
    println!(
        "host engine, unthrottled, {} MiB each way per round (target >= 2 GB/s):",
        TOTAL >> 20
    );
    println!(
        "{:>8} | {:>14} | {:>14} | {:>22}",
        "buffer", "device->host", "host->device", "host->device, no reuse"
    );
    for mib in [8usize, 32, 128] {
        let len = mib << 20;
        let (out, back) = rates(len, true);
        let (_, fresh) = rates(len, false);
        println!(
            "{:>4} MiB | {:>9.2} GB/s | {:>9.2} GB/s | {:>17.2} GB/s",
            mib, out, back, fresh
        );
    }
}
