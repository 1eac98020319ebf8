//! The CUDA copy engine over the worker's tensors, on a GPU: bytes round
//! trip through the pinned pool, a swap-out waits for the kernel that
//! produced its source (still running on the compute stream when it is
//! submitted), a swap-out submitted while a prefetch of the same storage
//! is in flight reads the arriving bytes, and injected failures lose
//! nothing. Without a GPU each test prints `SKIPPED` and passes.

use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};
use tensile_graph::StorageId;
use tensile_swap_executor::{
    Copy, CopyEngine, CopyId, CopyStatus, CudaConfig, CudaCopies, Dir, Payload,
};
use tensile_worker::Flat;

/// Whether this machine can run the CUDA engine; says why not when it
/// cannot, so that skipped GPU tests say they skipped.
pub(crate) fn gpu() -> bool {
    match tensile_swap_executor::cuda_available(0) {
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            false
        }
        Ok(()) if !tch::Cuda::is_available() => {
            eprintln!("SKIPPED: a CUDA driver, but libtorch sees no CUDA device");
            false
        }
        Ok(()) => true,
    }
}

/// A CUDA engine on device 0, with the instant its times count from.
fn engine(config: CudaConfig) -> (CudaCopies<Flat>, Instant) {
    let epoch = Instant::now();
    let e = CudaCopies::<Flat>::new(config, epoch).expect("a GPU");
    (e, epoch)
}

fn copy(dir: Dir, s: u32, bytes: u64) -> Copy {
    Copy {
        dir,
        storage: StorageId(s),
        bytes,
        not_before: 0,
    }
}

fn settle(e: &mut CudaCopies<Flat>, epoch: Instant, id: CopyId) -> CopyStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        e.poll(epoch.elapsed().as_nanos() as u64);
        let st = e.status(id);
        if st != CopyStatus::Pending {
            return st;
        }
        assert!(Instant::now() < deadline, "copy {id:?} never completed");
        e.wait(Duration::from_millis(10));
    }
}

/// The pinned host copy of `s`, rebuilt as the payload it came from (on
/// the device) and brought to the CPU, to compare with CPU tensors.
fn host_bytes(e: &CudaCopies<Flat>, s: u32) -> Tensor {
    e.host_payload(StorageId(s))
        .expect("a host copy")
        .expect("rebuilt")
        .0
        .to_device(Device::Cpu)
}

#[test]
fn on_a_gpu_copies_are_ordered_against_the_compute_stream() {
    let _heavy = crate::heavy();
    if !gpu() {
        return;
    }
    let dev = Device::Cuda(0);
    let (mut e, epoch) = engine(CudaConfig::default());
    let a = Tensor::randn([1 << 12, 1 << 12], (Kind::Float, dev));
    // Queued on the compute stream, likely still running at the submit.
    let b = a.matmul(&a).flatten(0, 1);
    let bytes = 64 << 20;
    e.set_device(StorageId(0), Flat(b.shallow_clone()));
    let out = e.submit(copy(Dir::ToHost, 0, bytes));
    let want = b.to_device(Device::Cpu);
    // The driver lets go at once: the copy keeps its source.
    e.drop_device(StorageId(0));
    drop(b);
    assert!(matches!(settle(&mut e, epoch, out), CopyStatus::Ends(_)));
    assert!(
        host_bytes(&e, 0).equal(&want),
        "the swap-out read the product"
    );
    let back = e.submit(copy(Dir::ToDevice, 0, bytes));
    // A swap-out of the arriving buffer, into a second host copy.
    let again = e.submit(copy(Dir::ToHost, 0, bytes));
    assert!(matches!(settle(&mut e, epoch, back), CopyStatus::Ends(_)));
    assert!(matches!(settle(&mut e, epoch, again), CopyStatus::Ends(_)));
    let on_device = e.device(StorageId(0)).expect("prefetched");
    assert_eq!(on_device.byte_len() as u64, bytes);
    assert!(on_device.0.to_device(Device::Cpu).equal(&want));
    assert!(host_bytes(&e, 0).equal(&want), "read after it arrived");
    let (used, peak) = e.pool_bytes();
    assert_eq!(used, bytes);
    assert!(peak <= 2 * bytes);
}

#[test]
fn on_a_gpu_injected_failures_and_a_full_pool_lose_nothing() {
    let _heavy = crate::heavy();
    if !gpu() {
        return;
    }
    let dev = Device::Cuda(0);
    let (mut e, epoch) = engine(CudaConfig {
        pool_cap_bytes: 10 << 20,
        fault_delay: Duration::from_millis(2),
        fail_every: Some(2),
        ..CudaConfig::default()
    });
    let x = Tensor::arange(1 << 20, (Kind::Float, dev));
    let want = x.to_device(Device::Cpu);
    e.set_device(StorageId(1), Flat(x.shallow_clone()));
    let t0 = Instant::now();
    let ok = e.submit(copy(Dir::ToHost, 1, 4 << 20));
    assert!(matches!(settle(&mut e, epoch, ok), CopyStatus::Ends(_)));
    assert!(t0.elapsed() >= Duration::from_millis(2), "delayed");
    // The second copy fails: the device copy is untouched.
    let failed = e.submit(copy(Dir::ToHost, 1, 4 << 20));
    assert!(matches!(
        settle(&mut e, epoch, failed),
        CopyStatus::Failed(_)
    ));
    assert!(e.device(StorageId(1)).expect("kept").0.equal(&x));
    assert!(host_bytes(&e, 1).equal(&want), "the first copy stands");
    // A second storage does not fit the pool beside the first.
    let y = Tensor::arange(2 << 20, (Kind::Float, dev));
    e.set_device(StorageId(2), Flat(y));
    let full = e.submit(copy(Dir::ToHost, 2, 8 << 20));
    match settle(&mut e, epoch, full) {
        CopyStatus::Failed(err) => assert!(err.to_string().contains("pinned pool full")),
        other => panic!("{other:?}"),
    }
    // The 4th copy fails by injection: a failed prefetch installs nothing
    // and the host copy stays; the 5th brings the storage back.
    e.drop_device(StorageId(1));
    let lost = e.submit(copy(Dir::ToDevice, 1, 4 << 20));
    assert!(matches!(settle(&mut e, epoch, lost), CopyStatus::Failed(_)));
    assert!(e.device(StorageId(1)).is_none());
    let back = e.submit(copy(Dir::ToDevice, 1, 4 << 20));
    assert!(matches!(settle(&mut e, epoch, back), CopyStatus::Ends(_)));
    assert!(e.device(StorageId(1)).expect("prefetched").0.equal(&x));
}

/// A host run on the CUDA engine starts after the swap-outs that bring
/// its inputs, writes the pinned host copy in place on the engine's host
/// thread, and a prefetch of that storage submitted while it runs reads
/// what it wrote.
#[test]
fn on_a_gpu_a_host_run_writes_its_pinned_copy_before_the_prefetch_reads_it() {
    let _heavy = crate::heavy();
    if !gpu() {
        return;
    }
    let dev = Device::Cuda(0);
    let (mut e, epoch) = engine(CudaConfig::default());
    // Adds the gradient's bytes into the parameter's, slowly enough that
    // the prefetch below is submitted while it runs.
    e.set_host_kernel(
        |_: tensile_graph::OpId, bufs: &mut [tensile_swap_executor::HostBytes<'_, _>]| {
            std::thread::sleep(Duration::from_millis(30));
            let [param, grad] = bufs else {
                return Err(format!("{} buffers", bufs.len()));
            };
            for (p, g) in param.bytes.iter_mut().zip(grad.bytes.iter()) {
                *p = p.wrapping_add(*g);
            }
            Ok(())
        },
    );
    let n = 4 << 20;
    let param = Tensor::arange(n, (Kind::Int64, dev))
        .remainder(251)
        .to_kind(Kind::Uint8);
    let grad = Tensor::arange(n, (Kind::Int64, dev))
        .remainder(13)
        .to_kind(Kind::Uint8);
    let want = (param.to_kind(Kind::Int64) + grad.to_kind(Kind::Int64))
        .remainder(256)
        .to_kind(Kind::Uint8)
        .to_device(Device::Cpu);
    e.set_device(StorageId(0), Flat(param.shallow_clone()));
    e.set_device(StorageId(1), Flat(grad.shallow_clone()));
    let outs = [
        e.submit(copy(Dir::ToHost, 0, n as u64)),
        e.submit(copy(Dir::ToHost, 1, n as u64)),
    ];
    let run = e.run_on_host(tensile_swap_executor::HostRun {
        op: tensile_graph::OpId(7),
        storages: vec![StorageId(0), StorageId(1)],
        bytes: 2 * n as u64,
        after: outs.to_vec(),
        not_before: 0,
    });
    for o in outs {
        assert!(matches!(settle(&mut e, epoch, o), CopyStatus::Ends(_)));
    }
    e.drop_device(StorageId(0));
    let back = e.submit(copy(Dir::ToDevice, 0, n as u64));
    assert!(matches!(settle(&mut e, epoch, run), CopyStatus::Ends(_)));
    assert!(matches!(settle(&mut e, epoch, back), CopyStatus::Ends(_)));
    assert_eq!(e.host_runs_in_flight(), 0);
    let got = e
        .device(StorageId(0))
        .expect("prefetched")
        .0
        .to_device(Device::Cpu);
    assert!(got.equal(&want), "the prefetch read the update");
    assert!(
        host_bytes(&e, 1).equal(&grad.to_device(Device::Cpu)),
        "the gradient read only"
    );
    // Without a kernel, a run fails at once, saying so.
    let (mut bare, _) = engine(CudaConfig::default());
    let r = bare.run_on_host(tensile_swap_executor::HostRun {
        op: tensile_graph::OpId(3),
        storages: vec![StorageId(0)],
        bytes: 0,
        after: Vec::new(),
        not_before: 0,
    });
    match bare.status(r) {
        CopyStatus::Failed(err) => assert!(
            err.to_string()
                .contains("no host kernel is installed on the CUDA copy engine"),
            "{err}"
        ),
        other => panic!("{other:?}"),
    }
}
