//! The host copy engine's unthrottled copy rate: 16 MiB buffers out to the
//! host pool and back, both lanes, as fast as they go. Prints GB/s per
//! direction (target: at least 2 GB/s).
//!
//! `cargo bench -p tensile-swap-executor --bench host_rate`

use std::sync::Arc;
use std::time::{Duration, Instant};

use tensile_graph::StorageId;
use tensile_swap_executor::{
    Copy, CopyEngine, CopyId, CopyStatus, Dir, HostConfig, HostCopies, Payload,
};

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
}

const LEN: usize = 16 << 20;
const N: u32 = 16;

fn run(e: &mut HostCopies<Buf>, epoch: Instant, dir: Dir) -> f64 {
    let t0 = Instant::now();
    let ids: Vec<CopyId> = (0..N)
        .map(|s| {
            e.submit(Copy {
                dir,
                storage: StorageId(s),
                bytes: LEN as u64,
                not_before: 0,
            })
        })
        .collect();
    e.drain();
    e.poll(epoch.elapsed().as_nanos() as u64);
    let secs = t0.elapsed().as_secs_f64();
    for id in ids {
        let st = e.status(id);
        assert!(matches!(st, CopyStatus::Ends(_)), "{st:?}");
        e.forget(id);
    }
    (LEN as f64 * f64::from(N)) / secs / 1e9
}

fn main() {
    let epoch = Instant::now();
    let mut e = HostCopies::<Buf>::new(HostConfig::default(), epoch);
    for s in 0..N {
        e.set_device(StorageId(s), Buf(Arc::new(vec![s as u8; LEN])));
    }
    let mut best = (0.0f64, 0.0f64);
    for round in 0..4 {
        let out = run(&mut e, epoch, Dir::ToHost);
        for s in 0..N {
            e.drop_device(StorageId(s));
        }
        let back = run(&mut e, epoch, Dir::ToDevice);
        if round > 0 {
            best = (best.0.max(out), best.1.max(back));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    println!(
        "host engine, unthrottled, {} x {} MiB: device->host {:.2} GB/s, host->device {:.2} GB/s (target >= 2 GB/s)",
        N,
        LEN >> 20,
        best.0,
        best.1
    );
}
