//! Tests of the host copy engine over a plain byte payload: bytes round-
//! trip, copies are paced at the bandwidth, the pool cap holds, failures
//! (injected or for want of room) are reported as failed copies; host runs
//! come after their input copies, one after another, over bytes nothing
//! else touches meanwhile.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tensile_graph::{OpId, StorageId};

use super::{HostConfig, HostCopies, Payload};
use crate::engine::{Copy, CopyEngine, CopyError, CopyId, CopyStatus, Dir, HostRun};
use crate::{HostBytes, HostKernel};

/// A "device" buffer: shared bytes.
#[derive(Debug, Clone)]
struct Buf(Arc<Vec<u8>>);

impl Payload for Buf {
    type Meta = ();
    fn meta(&self) {}
    fn share(&self) -> Self {
        self.clone()
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
        let dst = Arc::get_mut(&mut self.0).ok_or("shared")?;
        dst.copy_from_slice(src);
        Ok(())
    }
}

fn pattern(len: usize, seed: u8) -> Buf {
    Buf(Arc::new(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect(),
    ))
}

fn copy(dir: Dir, s: u32, bytes: u64) -> Copy {
    Copy {
        dir,
        storage: StorageId(s),
        bytes,
        not_before: 0,
    }
}

/// Polls until `id` is no longer pending; its status then.
fn settle(e: &mut HostCopies<Buf>, epoch: Instant, id: CopyId) -> CopyStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        e.poll(epoch.elapsed().as_nanos() as u64);
        let st = e.status(id);
        if st != CopyStatus::Pending {
            return st;
        }
        assert!(Instant::now() < deadline, "copy {id:?} never completed");
        e.wait(Duration::from_millis(50));
    }
}

#[test]
fn bytes_round_trip_and_the_source_outlives_its_drop() {
    let epoch = Instant::now();
    let mut e = HostCopies::<Buf>::new(HostConfig::default(), epoch);
    let data = pattern(1 << 20, 7);
    e.set_device(StorageId(3), data.clone());
    let out = e.submit(copy(Dir::ToHost, 3, 1 << 20));
    // The driver drops its buffer at once: the copy holds its own handle.
    e.drop_device(StorageId(3));
    assert!(matches!(settle(&mut e, epoch, out), CopyStatus::Ends(_)));
    e.forget(out);
    assert_eq!(e.pool_bytes().0, 1 << 20);
    assert!(e.device(StorageId(3)).is_none());
    let back = e.submit(copy(Dir::ToDevice, 3, 1 << 20));
    assert!(matches!(settle(&mut e, epoch, back), CopyStatus::Ends(_)));
    let got = e.device(StorageId(3)).expect("prefetched");
    assert_eq!(got.0, data.0);
    // The host copy stays for reuse until discarded.
    assert_eq!(e.pool_bytes().0, 1 << 20);
    e.discard_host(StorageId(3));
    assert_eq!(e.pool_bytes().0, 0);
}

#[test]
fn a_prefetch_into_a_dropped_buffer_installs_nothing() {
    let epoch = Instant::now();
    let mut e = HostCopies::<Buf>::new(HostConfig::default(), epoch);
    e.put_host(StorageId(1), &pattern(4096, 1)).expect("fits");
    let id = e.submit(copy(Dir::ToDevice, 1, 4096));
    e.drop_device(StorageId(1));
    assert!(matches!(settle(&mut e, epoch, id), CopyStatus::Ends(_)));
    assert!(e.device(StorageId(1)).is_none());
}

#[test]
fn copies_are_paced_at_the_bandwidth_in_order() {
    let epoch = Instant::now();
    let config = HostConfig {
        bytes_per_s: Some(100e6),
        ..HostConfig::default()
    };
    let mut e = HostCopies::<Buf>::new(config, epoch);
    for s in 0..2 {
        e.set_device(StorageId(s), pattern(5_000_000, s as u8));
    }
    let t0 = epoch.elapsed().as_nanos() as u64;
    let a = e.submit(copy(Dir::ToHost, 0, 5_000_000));
    let b = e.submit(copy(Dir::ToHost, 1, 5_000_000));
    let (CopyStatus::Ends(ea), CopyStatus::Ends(eb)) =
        (settle(&mut e, epoch, a), settle(&mut e, epoch, b))
    else {
        panic!("both copies end");
    };
    // 5 MB at 100 MB/s: 50 ms each, one after the other on the lane.
    let (da, db) = ((ea - t0) as f64 / 1e6, (eb - t0) as f64 / 1e6);
    assert!((45.0..150.0).contains(&da), "first copy took {da} ms");
    assert!((95.0..250.0).contains(&db), "both copies took {db} ms");
    assert!(eb >= ea + 45_000_000, "the lane is FIFO: {ea} then {eb}");
}

#[test]
fn the_pool_cap_holds_and_a_copy_past_it_fails_clearly() {
    let epoch = Instant::now();
    let config = HostConfig {
        pool_cap_bytes: 1_500_000,
        ..HostConfig::default()
    };
    let mut e = HostCopies::<Buf>::new(config, epoch);
    for s in 0..3 {
        e.set_device(StorageId(s), pattern(1_000_000, s as u8));
    }
    let a = e.submit(copy(Dir::ToHost, 0, 1_000_000));
    let b = e.submit(copy(Dir::ToHost, 1, 1_000_000));
    assert!(matches!(settle(&mut e, epoch, a), CopyStatus::Ends(_)));
    match settle(&mut e, epoch, b) {
        CopyStatus::Failed(CopyError::Failed {
            storage: 1, why, ..
        }) => {
            assert!(why.contains("host pool full"), "{why}");
        }
        other => panic!("expected a failure for want of room, got {other:?}"),
    }
    assert!(e.pool_bytes().1 <= 1_500_000, "never over the cap");
    assert!(
        e.pool_bytes().0 + e.spare_bytes <= 1_500_000,
        "spares included"
    );
    // Room comes back when the first host copy is discarded.
    e.discard_host(StorageId(0));
    let c = e.submit(copy(Dir::ToHost, 2, 1_000_000));
    assert!(matches!(settle(&mut e, epoch, c), CopyStatus::Ends(_)));
    assert_eq!(e.pool_bytes(), (1_000_000, 1_000_000));
    // The discarded buffer was kept (it fits the cap beside the copy) and
    // is reused by the next swap-out of that size, no new allocation.
    assert_eq!(e.spare_bytes, 0, "reused by storage 2's copy");
    e.discard_host(StorageId(2));
    assert_eq!((e.pool_bytes().0, e.spare_bytes), (0, 1_000_000));
    let d = e.submit(copy(Dir::ToHost, 0, 1_000_000));
    assert!(matches!(settle(&mut e, epoch, d), CopyStatus::Ends(_)));
    assert_eq!((e.pool_bytes().0, e.spare_bytes), (1_000_000, 0));
}

#[test]
fn injected_failures_and_delays_are_reported() {
    let epoch = Instant::now();
    let config = HostConfig {
        fail_every: Some(2),
        fault_delay: Duration::from_millis(30),
        ..HostConfig::default()
    };
    let mut e = HostCopies::<Buf>::new(config, epoch);
    e.set_device(StorageId(0), pattern(1000, 0));
    let ids: Vec<CopyId> = (0..4)
        .map(|_| e.submit(copy(Dir::ToHost, 0, 1000)))
        .collect();
    let t0 = epoch.elapsed().as_nanos() as u64;
    let got: Vec<CopyStatus> = ids.iter().map(|&i| settle(&mut e, epoch, i)).collect();
    for (k, st) in got.iter().enumerate() {
        if k % 2 == 1 {
            assert!(
                matches!(st, CopyStatus::Failed(CopyError::Failed { why, .. }) if why.contains("injected")),
                "copy {k}: {st:?}"
            );
        } else {
            assert!(matches!(st, CopyStatus::Ends(_)), "copy {k}: {st:?}");
        }
    }
    // Four delayed copies on one lane: at least 4 x 30 ms.
    let CopyStatus::Ends(last) = got[2] else {
        unreachable!()
    };
    assert!(last >= t0 + 60_000_000, "delays were applied");
    // A failed swap-out holds no pool room; the one good copy does.
    assert_eq!(e.pool_bytes().0, 1000);
}

#[test]
fn copies_without_data_fail_instead_of_inventing_it() {
    let epoch = Instant::now();
    let mut e = HostCopies::<Buf>::new(HostConfig::default(), epoch);
    let a = e.submit(copy(Dir::ToHost, 9, 10));
    let b = e.submit(copy(Dir::ToDevice, 9, 10));
    for id in [a, b] {
        assert!(matches!(
            settle(&mut e, epoch, id),
            CopyStatus::Failed(CopyError::Failed { storage: 9, .. })
        ));
    }
    assert!(matches!(
        e.status(CopyId(77)),
        CopyStatus::Failed(CopyError::Unknown(_))
    ));
}

#[test]
fn freed_device_buffers_are_refilled_once_no_swap_out_reads_them() {
    let epoch = Instant::now();
    // 1 MiB at 0.25 GB/s: a swap-out is in flight for about 4 ms.
    let config = HostConfig {
        bytes_per_s: Some(0.25e9),
        ..HostConfig::default()
    };
    let mut e = HostCopies::<Buf>::new(config, epoch);
    let len = 1 << 20;
    e.put_host(StorageId(1), &pattern(len, 1)).expect("fits");
    let id = e.submit(copy(Dir::ToDevice, 1, len as u64));
    assert!(matches!(settle(&mut e, epoch, id), CopyStatus::Ends(_)));
    e.forget(id);
    let first = e.device(StorageId(1)).expect("prefetched").0.as_ptr();
    // Swapped out again and freed while the copy reads it: a prefetch of
    // the same size meanwhile must not take it.
    e.discard_host(StorageId(1));
    let out = e.submit(copy(Dir::ToHost, 1, len as u64));
    e.drop_device(StorageId(1));
    assert_eq!(e.reuse_bytes(), len as u64, "kept");
    e.put_host(StorageId(2), &pattern(len, 2)).expect("fits");
    let in2 = e.submit(copy(Dir::ToDevice, 2, len as u64));
    assert!(matches!(settle(&mut e, epoch, in2), CopyStatus::Ends(_)));
    assert!(matches!(settle(&mut e, epoch, out), CopyStatus::Ends(_)));
    let two = e.device(StorageId(2)).expect("prefetched");
    assert_ne!(two.0.as_ptr(), first, "taken while a swap-out read it");
    assert_eq!(two.0, pattern(len, 2).0);
    let host = e
        .host_payload(StorageId(1))
        .expect("host copy")
        .expect("bytes");
    assert_eq!(host.0, pattern(len, 1).0, "the swap-out read its own bytes");
    // Now nothing reads it: the next prefetch of that size refills it.
    let in1 = e.submit(copy(Dir::ToDevice, 1, len as u64));
    assert!(matches!(settle(&mut e, epoch, in1), CopyStatus::Ends(_)));
    let one = e.device(StorageId(1)).expect("prefetched");
    assert_eq!(one.0.as_ptr(), first, "refilled, not allocated");
    assert_eq!(one.0, pattern(len, 1).0);
    assert_eq!(e.reuse_bytes(), 0);
    // A buffer the driver set (a kernel's output) is never kept.
    e.set_device(StorageId(3), pattern(len, 3));
    e.drop_device(StorageId(3));
    assert_eq!(e.reuse_bytes(), 0);
}

fn run(op: u32, storages: &[u32], after: Vec<CopyId>) -> HostRun {
    HostRun {
        op: OpId(op),
        storages: storages.iter().map(|&s| StorageId(s)).collect(),
        bytes: 0,
        after,
        not_before: 0,
    }
}

/// A host copy's bytes now.
fn host_bytes(e: &HostCopies<Buf>, s: u32) -> Vec<u8> {
    let p = e.host_payload(StorageId(s)).expect("a host copy");
    p.expect("bytes").0.to_vec()
}

/// Adds the second buffer into the first, byte by byte (an "update" of a
/// parameter by its gradient); slow by `pause`.
fn add_kernel(pause: Duration) -> impl HostKernel<()> {
    move |_: OpId, bufs: &mut [HostBytes<'_, ()>]| {
        std::thread::sleep(pause);
        let [param, grad] = bufs else {
            return Err(format!("{} buffers", bufs.len()));
        };
        for (p, g) in param.bytes.iter_mut().zip(grad.bytes.iter()) {
            *p = p.wrapping_add(*g);
        }
        Ok(())
    }
}

#[test]
fn a_host_run_starts_after_its_input_copy_and_writes_in_place() {
    let epoch = Instant::now();
    // 4 MB at 0.2 GB/s: the gradient's swap-out takes about 20 ms.
    let config = HostConfig {
        bytes_per_s: Some(0.2e9),
        ..HostConfig::default()
    };
    let mut e = HostCopies::<Buf>::new(config, epoch);
    e.set_host_kernel(add_kernel(Duration::ZERO));
    let len = 4_000_000;
    let (param, grad) = (pattern(len, 1), pattern(len, 2));
    e.put_host(StorageId(0), &param).expect("fits");
    e.set_device(StorageId(1), grad.clone());
    let out = e.submit(copy(Dir::ToHost, 1, len as u64));
    let r = e.run_on_host(run(9, &[0, 1], vec![out]));
    let CopyStatus::Ends(t_run) = settle(&mut e, epoch, r) else {
        panic!("the run ends")
    };
    let CopyStatus::Ends(t_out) = settle(&mut e, epoch, out) else {
        panic!("the copy ends")
    };
    assert!(
        t_run >= t_out,
        "the run ended at {t_run}, before its input at {t_out}"
    );
    let want: Vec<u8> = param
        .0
        .iter()
        .zip(grad.0.iter())
        .map(|(p, g)| p.wrapping_add(*g))
        .collect();
    assert_eq!(host_bytes(&e, 0), want, "the parameter's host copy updated");
    assert_eq!(host_bytes(&e, 1), grad.0.to_vec(), "the gradient read only");
    assert_eq!(e.pool_bytes().0, 2 * len as u64);
    e.forget(r);
    e.forget(out);
    // The parameter comes back to the device with the update.
    let back = e.submit(copy(Dir::ToDevice, 0, len as u64));
    assert!(matches!(settle(&mut e, epoch, back), CopyStatus::Ends(_)));
    assert_eq!(e.device(StorageId(0)).expect("prefetched").0.to_vec(), want);
}

#[test]
fn host_runs_run_one_after_another_in_submission_order() {
    let epoch = Instant::now();
    let config = HostConfig {
        bytes_per_s: Some(0.1e9),
        ..HostConfig::default()
    };
    let mut e = HostCopies::<Buf>::new(config, epoch);
    let log = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&log);
    e.set_host_kernel(move |op: OpId, _: &mut [HostBytes<'_, ()>]| {
        seen.lock().expect("log").push((op.0, Instant::now()));
        std::thread::sleep(Duration::from_millis(5));
        Ok(())
    });
    for s in 0..3 {
        e.put_host(StorageId(s), &pattern(1000, s as u8))
            .expect("fits");
    }
    // The first waits for a 10 ms copy; the others wait for nothing, on
    // other storages, and still come after it.
    e.set_device(StorageId(7), pattern(1_000_000, 7));
    let out = e.submit(copy(Dir::ToHost, 7, 1_000_000));
    let ids = [
        e.run_on_host(run(10, &[0, 7], vec![out])),
        e.run_on_host(run(11, &[1], Vec::new())),
        e.run_on_host(run(12, &[2], Vec::new())),
    ];
    let ends: Vec<u64> = ids
        .iter()
        .map(|&id| match settle(&mut e, epoch, id) {
            CopyStatus::Ends(t) => t,
            other => panic!("{other:?}"),
        })
        .collect();
    let order: Vec<u32> = log.lock().expect("log").iter().map(|l| l.0).collect();
    assert_eq!(order, [10, 11, 12]);
    assert!(ends.windows(2).all(|w| w[0] <= w[1]), "{ends:?}");
    assert_eq!(e.host_runs_in_flight(), 0);
}

#[test]
fn a_failing_kernel_or_input_copy_fails_the_run_and_says_why() {
    let epoch = Instant::now();
    let mut e = HostCopies::<Buf>::new(HostConfig::default(), epoch);
    e.set_host_kernel(|op: OpId, _: &mut [HostBytes<'_, ()>]| match op.0 {
        1 => Err("the update diverged".to_string()),
        2 => panic!("a bug in the kernel"),
        _ => Ok(()),
    });
    e.put_host(StorageId(0), &pattern(100, 0)).expect("fits");
    let why = |e: &mut HostCopies<Buf>, id| match settle(e, epoch, id) {
        CopyStatus::Failed(CopyError::Failed { why, .. }) => why,
        other => panic!("expected a failure, got {other:?}"),
    };
    let a = e.run_on_host(run(1, &[0], Vec::new()));
    assert!(why(&mut e, a).contains("the update diverged"));
    let b = e.run_on_host(run(2, &[0], Vec::new()));
    let msg = why(&mut e, b);
    assert!(msg.contains("panicked") && msg.contains("a bug"), "{msg}");
    // The host thread goes on after a panic.
    let c = e.run_on_host(run(3, &[0], Vec::new()));
    assert!(matches!(settle(&mut e, epoch, c), CopyStatus::Ends(_)));
    // A run whose input copy fails fails too, naming the copy, and never
    // runs; a storage with no host copy likewise.
    let config = HostConfig {
        fail_every: Some(1),
        fault_delay: Duration::from_millis(10),
        ..HostConfig::default()
    };
    let mut f = HostCopies::<Buf>::new(config, epoch);
    let ran = Arc::new(Mutex::new(false));
    let flag = Arc::clone(&ran);
    f.set_host_kernel(move |_: OpId, _: &mut [HostBytes<'_, ()>]| {
        *flag.lock().expect("flag") = true;
        Ok(())
    });
    f.set_device(StorageId(1), pattern(100, 1));
    let out = f.submit(copy(Dir::ToHost, 1, 100));
    let r = f.run_on_host(run(4, &[1], vec![out]));
    let msg = why(&mut f, r);
    assert!(
        msg.contains(&format!("copy {} that it waits for failed", out.0))
            && msg.contains("injected"),
        "{msg}"
    );
    let r = f.run_on_host(run(5, &[6], Vec::new()));
    assert!(why(&mut f, r).contains("storage 6 has no host copy"));
    assert!(!*ran.lock().expect("flag"), "no run reached the kernel");
}

#[test]
fn a_run_keeps_the_bytes_it_uses_when_the_host_copy_is_discarded() {
    let epoch = Instant::now();
    let mut e = HostCopies::<Buf>::new(HostConfig::default(), epoch);
    let (param, grad) = (pattern(1000, 3), pattern(1000, 4));
    e.put_host(StorageId(0), &param).expect("fits");
    e.put_host(StorageId(1), &grad).expect("fits");
    e.set_host_kernel(add_kernel(Duration::from_millis(50)));
    let r = e.run_on_host(run(0, &[0, 1], Vec::new()));
    // The end of the iteration: the gradient's host copy is stale, while
    // the run still reads it. Its bytes stay counted until the run is done.
    std::thread::sleep(Duration::from_millis(10));
    e.discard_host(StorageId(1));
    assert_eq!(e.pool_bytes().0, 2000, "the run still holds the gradient");
    assert!(matches!(settle(&mut e, epoch, r), CopyStatus::Ends(_)));
    let want: Vec<u8> = param
        .0
        .iter()
        .zip(grad.0.iter())
        .map(|(p, g)| p.wrapping_add(*g))
        .collect();
    assert_eq!(host_bytes(&e, 0), want, "it read the discarded bytes whole");
    assert!(
        e.host_payload(StorageId(1)).is_none(),
        "discarded at the end"
    );
    assert_eq!(e.pool_bytes().0, 1000);
    assert!(e.pool_bytes().1 <= 2000);
}

#[test]
fn a_prefetch_submitted_during_a_run_reads_what_the_run_wrote() {
    let epoch = Instant::now();
    let mut e = HostCopies::<Buf>::new(HostConfig::default(), epoch);
    e.set_host_kernel(|_: OpId, bufs: &mut [HostBytes<'_, ()>]| {
        std::thread::sleep(Duration::from_millis(30));
        bufs[0].bytes.fill(42);
        Ok(())
    });
    e.put_host(StorageId(0), &pattern(4096, 0)).expect("fits");
    let r = e.run_on_host(run(0, &[0], Vec::new()));
    std::thread::sleep(Duration::from_millis(5));
    let p = e.submit(copy(Dir::ToDevice, 0, 4096));
    let (CopyStatus::Ends(t_run), CopyStatus::Ends(t_in)) =
        (settle(&mut e, epoch, r), settle(&mut e, epoch, p))
    else {
        panic!("both end")
    };
    assert!(t_in >= t_run);
    assert_eq!(
        e.device(StorageId(0)).expect("fetched").0.to_vec(),
        vec![42; 4096]
    );
}

#[test]
fn without_a_kernel_a_host_run_fails_saying_so() {
    let epoch = Instant::now();
    let mut e = HostCopies::<Buf>::new(HostConfig::default(), epoch);
    e.put_host(StorageId(0), &pattern(10, 0)).expect("fits");
    let r = e.run_on_host(run(5, &[0], Vec::new()));
    match e.status(r) {
        CopyStatus::Failed(CopyError::Failed { why, .. }) => {
            assert!(
                why.contains("op 5") && why.contains("no host kernel"),
                "{why}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(e.host_runs_in_flight(), 0);
}
