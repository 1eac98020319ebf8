//! The worker's overhead on CPU: ResNet-50 at batch 2 (224 x 224, Adam),
//! time per iteration of `tensile-worker`'s runtime (executor, effects,
//! host engine, no plan) against the same kernels run back to back by
//! `tensile_kernels::run_iteration` (no executor, no plan); then the host
//! engine's unthrottled copy rate over real tensors. Prints the figures
//! (targets: under 3% more time; at least 2 GB/s).
//!
//! `cargo bench -p tensile-worker --bench overhead` (env: `ROUNDS`,
//! `THREADS` (default 1), `MODEL`, `BATCH`, `RESOLUTION`).

use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Liveness, StorageId};
use tensile_kernels::{Program, initial_values, run_iteration};
use tensile_swap_executor::{CopyEngine, Dir, HostConfig, HostCopies};
use tensile_worker::{Flat, Worker, WorkerConfig, initial_of, vanilla_plan};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The fastest of a few runs: on a shared machine, the least disturbed.
fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

/// Best rates over a few rounds of `n` tensors of `len` floats out to the
/// host pool and back.
fn copy_rate(n: u32, len: i64) -> (f64, f64) {
    let epoch = Instant::now();
    let mut e = HostCopies::<Flat>::new(HostConfig::default(), epoch);
    for s in 0..n {
        e.set_device(
            StorageId(s),
            Flat(Tensor::full(
                [len],
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
                for s in 0..n {
                    e.drop_device(StorageId(s));
                }
            }
            rates[k] = e.timed_batch(dir, n, len as u64 * 4) / 1e9;
        }
        for s in 0..n {
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
    let rounds = env("ROUNDS", 4) as usize;
    // One kernel thread by default: on a shared machine, OpenMP threads
    // that wait for each other at every barrier make timings meaningless.
    tch::set_num_threads(env("THREADS", 1) as i32);
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
    // The worker's time outside the kernels in the same iteration (its
    // executor steps, effects, copies started): no other run's noise.
    let mut outside = Vec::new();
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
            engine: tensile_worker::Engine::Host,
            guard: false,
            ledger: None,
        };
        let mut w = Worker::new(&g, &live, &plan, program, initial_of(&g, &values), config)
            .expect("worker");
        let reports = w.run(|_| None).expect("runs");
        let t0 = Instant::now();
        run_iteration(&mut ref_program, &g, &mut ref_values).expect("runs");
        let r = t0.elapsed().as_secs_f64();
        if round > 0 {
            // The worker's first iteration warms its own program up.
            let it = &reports[1];
            worker.push(it.time_ns as f64 / 1e9);
            outside.push(it.time_ns.saturating_sub(it.kernel_ns) as f64 / 1e9);
            reference.push(r);
        }
    }
    let (w, r) = (min(&worker), min(&reference));
    println!(
        "{model} batch {batch} at {resolution} on CPU: worker {:.1} ms/iteration, kernels back to back {:.1} ms/iteration: {:+.2}% (fastest of {rounds}, interleaved; target under +3%)",
        w * 1e3,
        r * 1e3,
        (w / r - 1.0) * 100.0
    );
    let o = min(&outside);
    println!(
        "  worker time outside its kernels (executor, effects, views; kernels timed around Program::run): {:.2} ms/iteration, {:.2}% of its iteration",
        o * 1e3,
        o / w * 100.0
    );
    println!("  worker iterations (s): {worker:.3?}");
    println!("  reference iterations (s): {reference:.3?}");
    // 512 MiB each way for each size, side by side.
    for (n, mib) in [(64u32, 8i64), (16, 32), (4, 128)] {
        let (out, back) = copy_rate(n, mib << 18);
        println!(
            "host engine over tensors, unthrottled, {n} x {mib} MiB: device->host {out:.2} GB/s, host->device {back:.2} GB/s (target >= 2 GB/s)"
        );
    }
}
