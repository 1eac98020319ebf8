//! The worker's overhead on CPU: ResNet-50 at batch 2 (224 x 224, Adam),
//! time per iteration of `tensile-worker`'s runtime (executor, effects,
//! host engine, no plan) against the same kernels run back to back by
//! `tensile_kernels::run_iteration` (no executor, no plan); then the host
//! engine's unthrottled copy rate over real tensors. Prints the figures
//! (targets: under 3% more time; at least 2 GB/s).
//!
//! `cargo bench -p tensile-worker --bench overhead` (env: `ROUNDS`,
//! `MODEL`, `BATCH`, `RESOLUTION`).

use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Liveness, StorageId};
use tensile_kernels::{Program, initial_values, run_iteration};
use tensile_swap_executor::{Copy, CopyEngine, CopyStatus, Dir, HostConfig, HostCopies};
use tensile_worker::{Flat, Worker, WorkerConfig, initial_of, vanilla_plan};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn copy_rate() -> (f64, f64) {
    const N: u32 = 8;
    const LEN: i64 = 8 << 20; // floats: 32 MiB each
    let epoch = Instant::now();
    let mut e = HostCopies::<Flat>::new(HostConfig::default(), epoch);
    for s in 0..N {
        e.set_device(
            StorageId(s),
            Flat(Tensor::full(
                [LEN],
                f64::from(s),
                (Kind::Float, Device::Cpu),
            )),
        );
    }
    let mut best = (0.0f64, 0.0f64);
    for round in 0..4 {
        let mut rates = [0.0; 2];
        for (k, dir) in [Dir::ToHost, Dir::ToDevice].into_iter().enumerate() {
            if dir == Dir::ToDevice {
                for s in 0..N {
                    e.drop_device(StorageId(s));
                }
            }
            let t0 = Instant::now();
            let ids: Vec<_> = (0..N)
                .map(|s| {
                    e.submit(Copy {
                        dir,
                        storage: StorageId(s),
                        bytes: LEN as u64 * 4,
                        not_before: 0,
                    })
                })
                .collect();
            e.drain();
            e.poll(epoch.elapsed().as_nanos() as u64);
            let secs = t0.elapsed().as_secs_f64();
            for id in ids {
                assert!(matches!(e.status(id), CopyStatus::Ends(_)));
                e.forget(id);
            }
            rates[k] = f64::from(N) * LEN as f64 * 4.0 / secs / 1e9;
        }
        for s in 0..N {
            e.discard_host(StorageId(s));
        }
        if round > 0 {
            best = (best.0.max(rates[0]), best.1.max(rates[1]));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // Checks the bytes came back.
    let got = e.device(StorageId(3)).expect("prefetched");
    assert_eq!(got.0.double_value(&[12345]), 3.0);
    best
}

fn main() {
    let model = std::env::var("MODEL").unwrap_or_else(|_| "resnet50".into());
    let batch = env("BATCH", 2);
    let resolution = env("RESOLUTION", 224);
    let rounds = env("ROUNDS", 3) as usize;
    let config = ZooConfig {
        resolution: Some(resolution),
        ..ZooConfig::new(batch)
    };
    let g = zoo::build(&model, &config).expect("zoo model");
    let live = Liveness::analyze(&g);
    let plan = vanilla_plan(&live);
    let device = Device::Cpu;
    eprintln!(
        "{model} batch {batch} at {resolution}: {} ops, {} threads",
        g.ops().len(),
        tch::get_num_threads()
    );
    let mut reference = Vec::new();
    let mut worker = Vec::new();
    let mut ref_program = Program::new(&g, device).expect("kernels");
    let mut ref_values = initial_values(&g, device, 0, None, None).expect("values");
    // Warm-up: one of each, not counted.
    run_iteration(&mut ref_program, &g, &mut ref_values).expect("runs");
    for round in 0..=rounds {
        let program = Program::new(&g, device).expect("kernels");
        let values = initial_values(&g, device, 0, None, None).expect("values");
        let config = WorkerConfig {
            iterations: 2,
            memory_budget_bytes: None,
            host: HostConfig::default(),
        };
        let mut w = Worker::new(&g, &live, &plan, program, initial_of(&g, &values), config)
            .expect("worker");
        let reports = w.run(|_| None).expect("runs");
        let t0 = Instant::now();
        run_iteration(&mut ref_program, &g, &mut ref_values).expect("runs");
        let r = t0.elapsed().as_secs_f64();
        if round > 0 {
            // The worker's first iteration warms its own program up.
            worker.push(reports[1].time_ns as f64 / 1e9);
            reference.push(r);
        }
    }
    let (w, r) = (median(worker.clone()), median(reference.clone()));
    println!(
        "{model} batch {batch} at {resolution} on CPU: worker {:.1} ms/iteration, kernels back to back {:.1} ms/iteration: {:+.2}% (median of {rounds}; target under +3%)",
        w * 1e3,
        r * 1e3,
        (w / r - 1.0) * 100.0
    );
    println!("  worker iterations (s): {worker:.3?}");
    println!("  reference iterations (s): {reference:.3?}");
    let (out, back) = copy_rate();
    println!(
        "host engine over tensors, unthrottled, 8 x 32 MiB: device->host {out:.2} GB/s, host->device {back:.2} GB/s (target >= 2 GB/s)"
    );
}
