//! With the real kernels (`tensile-kernels`): the worker with no plan
//! computes exactly what the kernels run back to back compute, and plans
//! (swaps, across-iteration swaps, recomputation; copy faults) change no
//! bit of the parameters; the binary trains a zoo model under `--vanilla`
//! and `--plan FILE` and fails under a budget vanilla exceeds.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tch::{Device, Tensor};
use tensile_graph::builder::{Optimizer, Step};
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Graph, Liveness, TensorId};
use tensile_kernels::{Program, initial_values, run_iteration};
use tensile_planner::{CopyModel, JobSettings, Plan};
use tensile_swap_executor::HostConfig;
use tensile_worker::{Engine, Worker, WorkerConfig, initial_of, vanilla_plan};

use crate::cuda::gpu;
use crate::host_ops::{assert_same_by_name, by_name};
use crate::{bytes, latencies, planned};

fn resnet() -> Graph {
    let config = ZooConfig {
        resolution: Some(64),
        optimizer: Optimizer::sgd(),
        ..ZooConfig::new(1)
    };
    zoo::build("resnet50", &config).expect("zoo")
}

fn worker_run(
    g: &Graph,
    plan: &Plan,
    iterations: usize,
    host: HostConfig,
) -> Vec<(TensorId, Tensor)> {
    worker_run_on(g, plan, iterations, host, Device::Cpu, Engine::Host)
}

fn worker_run_on(
    g: &Graph,
    plan: &Plan,
    iterations: usize,
    host: HostConfig,
    device: Device,
    engine: Engine,
) -> Vec<(TensorId, Tensor)> {
    tch::set_num_threads(1);
    let live = Liveness::analyze(g);
    let program = Program::new(g, device).expect("every op runs");
    let values = initial_values(g, device, 7, None, None).expect("values");
    let config = WorkerConfig {
        iterations,
        memory_budget_bytes: None,
        host,
        engine,
        guard: false,
        ledger: None,
    };
    let mut w =
        Worker::new(g, &live, plan, program, initial_of(g, &values), config).expect("worker");
    // Updates kept on the host run the CPU kernels over the host copies.
    w.set_host_kernels(Program::new(g, Device::Cpu).expect("every op runs"));
    let reports = w.run(|_| None).expect("runs");
    for r in &reports {
        // The real tensors' storages are exactly as large as the graph
        // says: the bytes the worker holds are the bytes the executor (and
        // the planner) count.
        assert_eq!(r.measured_peak_bytes, r.executor_peak_bytes, "{r:?}");
    }
    w.persistent_values().expect("values")
}

fn assert_same(g: &Graph, want: &[(TensorId, Tensor)], got: &[(TensorId, Tensor)]) {
    assert_eq!(want.len(), got.len());
    assert!(!want.is_empty());
    for (w, h) in bytes(want).iter().zip(&bytes(got)) {
        assert_eq!(w.0, h.0);
        assert!(
            w.1 == h.1,
            "tensor {} ({}) differs",
            w.0.0,
            g.tensor(w.0).name
        );
    }
}

/// BERT's attention hands the backward of a view a permuted gradient,
/// which autograd's reshape copies: the graph has that copy, so every
/// tensor the kernels produce lies in the storage the graph gives it, and
/// the worker holds the bytes the graph counts.
#[test]
fn bert_trains_where_the_backward_of_a_view_copies() {
    let _heavy = crate::heavy();
    let config = ZooConfig {
        resolution: Some(8),
        optimizer: Optimizer::sgd(),
        ..ZooConfig::new(2)
    };
    let g = zoo::build("bert_base", &config).expect("zoo");
    let live = Liveness::analyze(&g);
    let values = worker_run(&g, &vanilla_plan(&live), 1, HostConfig::default());
    assert!(!values.is_empty());
}

#[test]
fn the_worker_computes_what_the_kernels_back_to_back_compute() {
    let _heavy = crate::heavy();
    let g = resnet();
    tch::set_num_threads(1);
    let mut program = Program::new(&g, Device::Cpu).expect("every op runs");
    let mut values = initial_values(&g, Device::Cpu, 7, None, None).expect("values");
    for _ in 0..2 {
        run_iteration(&mut program, &g, &mut values).expect("runs");
    }
    let want: Vec<(TensorId, Tensor)> = g
        .tensors()
        .iter()
        .filter(|t| t.kind.is_persistent() && g.producer(t.id).is_none())
        .filter_map(|t| values.get(t.id).map(|v| (t.id, v.shallow_clone())))
        .collect();
    let live = Liveness::analyze(&g);
    let got = worker_run(&g, &vanilla_plan(&live), 2, HostConfig::default());
    assert_same(&g, &want, &got);
}

/// ResNet-50 (64 px, batch 1) with its updates placed by `got` trains, with
/// no plan and under a plan that swaps, exactly the values it trains with
/// them placed by `want` and no plan, name by name, bit for bit.
fn trains_the_same(want: Step, got: Step) {
    let build = |step| {
        let config = ZooConfig {
            resolution: Some(64),
            step,
            ..ZooConfig::new(1)
        };
        zoo::build("resnet50", &config).expect("zoo")
    };
    let (reference, g) = (build(want), build(got));
    let named = |g: &Graph, plan: &Plan| by_name(g, &worker_run(g, plan, 2, HostConfig::default()));
    let vanilla = |g: &Graph| vanilla_plan(&Liveness::analyze(g));
    let want = named(&reference, &vanilla(&reference));
    let copy = CopyModel::duplex(4e9, 4e9, 5_000);
    let plan = planned(&g, latencies(&g), copy, JobSettings::default(), 0.5);
    assert!(plan.prediction.swap_outs > 0, "the plan swaps");
    for got in [named(&g, &vanilla(&g)), named(&g, &plan)] {
        assert_same_by_name(&want, &got);
    }
}

/// Each parameter's update inside the backward pass (`adam-in-backward`)
/// trains exactly the values the updates after it train, with no plan and
/// under a plan that swaps: the same arithmetic per parameter, earlier.
#[test]
fn updates_in_the_backward_pass_train_the_same_values() {
    let _heavy = crate::heavy();
    trains_the_same(Step::AtEnd, Step::InBackward);
}

/// Each parameter's update on the host CPU, over host copies of the
/// parameter, its gradient and its Adam state (`adam-on-host`), trains
/// exactly the values its update on the device in the backward pass trains
/// (on the CPU both run the same kernels; the step counters count alike),
/// with no plan and under a plan that swaps.
#[test]
fn updates_on_the_host_train_what_updates_on_the_device_train() {
    let _heavy = crate::heavy();
    trains_the_same(Step::InBackward, Step::OnHost);
}

#[test]
fn plans_with_real_kernels_lose_nothing() {
    let _heavy = crate::heavy();
    let g = resnet();
    let live = Liveness::analyze(&g);
    let want = worker_run(&g, &vanilla_plan(&live), 2, HostConfig::default());
    let copy = CopyModel::duplex(4e9, 4e9, 5_000);
    let p = planned(&g, latencies(&g), copy, JobSettings::default(), 0.5);
    assert!(
        p.prediction.swap_outs > 0
            && p.prediction.recomputed_ops > 0
            && !p.start_on_host.is_empty(),
        "the plan swaps, recomputes and swaps across iterations"
    );
    assert_same(&g, &want, &worker_run(&g, &p, 2, HostConfig::default()));
    let faults = HostConfig {
        fault_delay: Duration::from_micros(200),
        fail_every: Some(4),
        ..HostConfig::default()
    };
    assert_same(&g, &want, &worker_run(&g, &p, 2, faults));
}

/// On a GPU, `g` trains bit for bit with the CUDA engine what it trains
/// with the host engine there: with no plan, and under a plan that swaps
/// and swaps across iterations, with and without failing copies.
fn the_cuda_engine_trains_as_the_host_engine(g: &Graph) {
    let live = Liveness::analyze(g);
    let dev = Device::Cuda(0);
    // cuDNN's autotuner may pick different kernels run to run, and its
    // default backward convolutions sum in any order.
    tensile_kernels::set_deterministic_cudnn(true);
    let host = HostConfig::default();
    let want = worker_run_on(g, &vanilla_plan(&live), 2, host, dev, Engine::Host);
    let again = worker_run_on(g, &vanilla_plan(&live), 2, host, dev, Engine::Host);
    // The device's kernels themselves repeat bit for bit (else no
    // comparison below could tell the engine's fault from theirs).
    assert_same(g, &want, &again);
    let cuda = Engine::Cuda { ordinal: 0 };
    assert_same(
        g,
        &want,
        &worker_run_on(g, &vanilla_plan(&live), 2, host, dev, cuda),
    );
    let copy = CopyModel::duplex(12e9, 12e9, 10_000);
    let p = planned(g, latencies(g), copy, JobSettings::default(), 0.5);
    assert!(p.prediction.swap_outs > 0 && !p.start_on_host.is_empty());
    assert_same(g, &want, &worker_run_on(g, &p, 2, host, dev, cuda));
    let faults = HostConfig {
        fault_delay: Duration::from_micros(300),
        fail_every: Some(3),
        ..host
    };
    assert_same(g, &want, &worker_run_on(g, &p, 2, faults, dev, cuda));
}

#[test]
fn on_a_gpu_the_cuda_engine_loses_nothing_even_under_faults() {
    let _heavy = crate::heavy();
    if gpu() {
        the_cuda_engine_trains_as_the_host_engine(&resnet());
    }
}

/// On a GPU, updates kept on the host run on the CUDA engine's host
/// thread over its pinned host copies, and train what they train with the
/// host engine.
#[test]
fn on_a_gpu_the_cuda_engine_runs_updates_on_the_host() {
    let _heavy = crate::heavy();
    if !gpu() {
        return;
    }
    let config = ZooConfig {
        resolution: Some(64),
        step: Step::OnHost,
        ..ZooConfig::new(1)
    };
    the_cuda_engine_trains_as_the_host_engine(&zoo::build("resnet50", &config).expect("zoo"));
}

/// On a GPU the process measures what it holds outside its storages
/// after its first iterations: every later report carries it, positive
/// and below the device's memory; two copies of the job in one process
/// report each the process's one base (the scheduler counts it once).
#[test]
fn on_a_gpu_the_measured_base_is_positive_and_below_the_devices_memory() {
    let _heavy = crate::heavy();
    if !gpu() {
        return;
    }
    let device = tensile_swap_executor::device_memory_bytes(0).expect("the device's memory");
    let iterations = 8;
    // The JSON lines of a vanilla run of `copies` copies.
    let run = |copies: u16| -> Vec<serde_json::Value> {
        let out = worker_bin()
            .args(["--model", "resnet50", "--batch", "1", "--resolution", "64"])
            .args(["--vanilla", "--device", "cuda", "--json", "--iterations"])
            .arg(iterations.to_string())
            .args(["--copies", &copies.to_string()])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(
            !stderr.contains("cannot be measured"),
            "NVML could not measure the process: {stderr}"
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect()
    };
    let base = |l: &serde_json::Value| l.get("base_bytes").and_then(serde_json::Value::as_u64);
    let alone = run(1);
    assert_eq!(alone.len(), iterations);
    for l in &alone[..tensile_worker::WARMUP] {
        assert_eq!(base(l), None, "measured during the warm-up: {l}");
    }
    for l in &alone[tensile_worker::WARMUP..] {
        let b = base(l).unwrap_or_else(|| panic!("no base after the warm-up: {l}"));
        // At least a CUDA context's worth (hundreds of MB), below the
        // device's memory.
        assert!(
            b > 50_000_000 && b < device,
            "base {b} of a {device} B device"
        );
    }
    let both = run(2);
    assert_eq!(both.len(), 2 * iterations);
    let last = |copy: u64| {
        both.iter()
            .rev()
            .find(|l| l["copy"].as_u64() == Some(copy))
            .and_then(base)
            .unwrap_or_else(|| panic!("copy {copy} reported no base"))
    };
    let (a, b) = (last(0), last(1));
    // Each the whole process's: one base, below the device's memory.
    assert!(a > 0 && b > 0 && a.max(b) < device, "bases {a} and {b}");
    eprintln!(
        "measured base: {:.1} MB alone; {:.1} and {:.1} MB (the process's, as each copy reports it) for two copies in one process",
        base(&alone[iterations - 1]).unwrap_or(0) as f64 / 1e6,
        a as f64 / 1e6,
        b as f64 / 1e6
    );
}

#[test]
fn without_a_gpu_the_cuda_engine_is_a_clear_error() {
    let _heavy = crate::heavy();
    let g = resnet();
    let live = Liveness::analyze(&g);
    if tensile_swap_executor::cuda_available(0).is_ok() {
        eprintln!("SKIPPED: this machine has a CUDA device");
        return;
    }
    let config = WorkerConfig {
        iterations: 1,
        memory_budget_bytes: None,
        host: HostConfig::default(),
        engine: Engine::Cuda { ordinal: 0 },
        guard: false,
        ledger: None,
    };
    let program = Program::new(&g, Device::Cpu).expect("every op runs");
    let values = initial_values(&g, Device::Cpu, 7, None, None).expect("values");
    let plan = vanilla_plan(&live);
    let err = Worker::new(&g, &live, &plan, program, initial_of(&g, &values), config)
        .expect_err("no GPU");
    let msg = err.to_string();
    assert!(
        msg.contains("CUDA copy engine cannot run")
            && (msg.contains("no CUDA driver library") || msg.contains("does not exist")),
        "{msg}"
    );
    let out = worker_bin()
        .args(["--model", "resnet50", "--batch", "1", "--resolution", "64"])
        .args(["--vanilla", "--device", "cuda"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--copy cuda on --device cuda")
            && (stderr.contains("no CUDA driver library") || stderr.contains("does not exist")),
        "{stderr}"
    );
}

fn worker_bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tensile-worker"))
}

#[test]
fn the_binary_trains_under_vanilla_and_a_plan_file_and_runs_out_of_memory_clearly() {
    let _heavy = crate::heavy();
    let g = resnet();
    let copy = CopyModel::duplex(4e9, 4e9, 5_000);
    let p = planned(&g, latencies(&g), copy, JobSettings::default(), 0.5);
    let dir = std::env::temp_dir().join(format!("tensile-worker-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let plan_file: PathBuf = dir.join("plan.json");
    std::fs::write(
        &plan_file,
        tensile_proto::plan_json::plan_to_json(&p, &[], &g),
    )
    .expect("write");
    let job = [
        "--model",
        "resnet50",
        "--batch",
        "1",
        "--resolution",
        "64",
        "--optimizer",
        "sgd",
        "--threads",
        "1",
    ];
    let mut saved = Vec::new();
    for (policy, name) in [
        (vec!["--vanilla"], "vanilla"),
        (vec!["--plan", plan_file.to_str().expect("utf-8")], "plan"),
    ] {
        let out_file = dir.join(format!("{name}.safetensors"));
        let out = worker_bin()
            .args(job)
            .args(&policy)
            .args(["--iterations", "2", "--json", "--save-params"])
            .arg(&out_file)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<serde_json::Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(lines.len(), 2, "{stdout}");
        for l in &lines {
            assert!(l["time_ns"].as_u64().is_some_and(|t| t > 0));
            assert!(l["measured_peak_bytes"].as_u64().is_some_and(|b| b > 0));
            // On the CPU no base is measured (the report says 0).
            assert!(l.get("base_bytes").is_none(), "{l}");
        }
        saved.push(std::fs::read(&out_file).expect("saved"));
    }
    assert!(saved[0] == saved[1], "the plan changed the parameters");
    // Under a budget between the plan's peak and vanilla's.
    let mb = (p.prediction.planned_peak_bytes
        + (p.prediction.vanilla_peak_bytes - p.prediction.planned_peak_bytes) / 2)
        / 1_000_000;
    let out = worker_bin()
        .args(job)
        .args(["--vanilla", "--memory-mb", &mb.to_string()])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("out of device memory at op"), "{stderr}");
    let out = worker_bin()
        .args(job)
        .args([
            "--plan",
            plan_file.to_str().expect("utf-8"),
            "--memory-mb",
            &mb.to_string(),
        ])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "the plan fits: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = worker_bin()
        .args(job)
        .args(["--vanilla", "--copy", "cuda"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--copy cuda needs a CUDA device"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tensile-worker --optimizer adam-on-host` trains ResNet-50 with its
/// updates on the host, with no plan and under a plan file, to the same
/// parameters; every iteration's JSON counts the host runs.
#[test]
fn the_binary_trains_with_updates_on_the_host() {
    let _heavy = crate::heavy();
    let config = ZooConfig {
        step: Step::OnHost,
        ..ZooConfig::new(2)
    };
    let g = zoo::build("resnet50", &config).expect("zoo");
    let host_ops = g.ops().iter().filter(|o| o.on_host()).count() as u64;
    let copy = CopyModel::duplex(4e9, 4e9, 5_000);
    let p = planned(&g, latencies(&g), copy, JobSettings::default(), 0.5);
    assert!(p.prediction.swap_outs > 0, "the plan swaps");
    let dir = std::env::temp_dir().join(format!("tensile-worker-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let plan_file = dir.join("plan.json");
    std::fs::write(
        &plan_file,
        tensile_proto::plan_json::plan_to_json(&p, &[], &g),
    )
    .expect("write");
    let plan = plan_file.to_str().expect("utf-8");
    // Trains 3 iterations with `args` added: its standard output (a JSON
    // line an iteration) and the parameters it saved.
    let train = |args: &[&str], name: &str| {
        let out_file = dir.join(format!("{name}.safetensors"));
        let out = worker_bin()
            .args(["--model", "resnet50", "--batch", "2", "--optimizer"])
            .args(["adam-on-host", "--iterations", "3", "--json"])
            .args(args)
            .arg("--save-params")
            .arg(&out_file)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        (stdout, std::fs::read(&out_file).expect("saved"))
    };
    let mut saved = Vec::new();
    for (policy, name) in [
        (["--vanilla"].as_slice(), "vanilla"),
        (&["--plan", plan], "plan"),
    ] {
        let (stdout, params) = train(&[&["--threads", "1"], policy].concat(), name);
        let lines: Vec<serde_json::Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(lines.len(), 3, "{stdout}");
        for l in &lines {
            assert_eq!(l["host_runs"].as_u64(), Some(host_ops), "{name}: {l}");
            assert!(l["host_wait_ns"].as_u64().is_some(), "{name}: {l}");
            assert!(l["swapped_bytes"].as_u64().is_some_and(|b| b > 0));
        }
        saved.push(params);
    }
    assert!(saved[0] == saved[1], "the plan changed the parameters");
    // On a GPU, the CUDA engine runs the host ops too (over its pinned
    // host copies) and trains what the host engine trains there.
    if gpu() {
        let on_gpu = ["host", "cuda"].map(|copy| {
            let args = ["--device", "cuda:0", "--copy", copy, "--plan", plan];
            train(&args, &format!("gpu-{copy}")).1
        });
        assert!(
            on_gpu[0] == on_gpu[1],
            "the CUDA engine changed the parameters"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_binary_reads_graph_files_and_parameter_files() {
    let _heavy = crate::heavy();
    let g = resnet();
    let dir = std::env::temp_dir().join(format!("tensile-worker-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let graph_file = dir.join("graph.json");
    std::fs::write(&graph_file, tensile_graph::json::to_string(&g)).expect("write");
    let init = dir.join("init.safetensors");
    // No iteration: the initial parameters as seeded.
    let out = worker_bin()
        .args(["--graph", graph_file.to_str().expect("utf-8")])
        .args([
            "--vanilla",
            "--iterations",
            "0",
            "--seed",
            "3",
            "--save-params",
        ])
        .arg(&init)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Two iterations from the seed and from the file it wrote: the same.
    let mut saved = Vec::new();
    // The same seed for what the file does not hold (the batch).
    let from_file = ["--init-params", init.to_str().expect("utf-8")];
    for (k, source) in [&[][..], &from_file[..]].into_iter().enumerate() {
        let file = dir.join(format!("after{k}.safetensors"));
        let out = worker_bin()
            .args([
                "--graph",
                graph_file.to_str().expect("utf-8"),
                "--threads",
                "1",
                "--seed",
                "3",
            ])
            .args(source)
            .args(["--vanilla", "--iterations", "2", "--save-params"])
            .arg(&file)
            .output()
            .expect("runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        saved.push(std::fs::read(&file).expect("saved"));
    }
    assert!(
        saved[0] == saved[1],
        "--init-params did not give the seeded values"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_binary_says_what_is_wrong() {
    let _heavy = crate::heavy();
    let job = ["--model", "resnet50", "--batch", "1", "--resolution", "64"];
    let cases: [(&[&str], &str); 6] = [
        (&["--vanilla", "--device", "tpu"], "unknown device"),
        (
            &["--vanilla", "--fault-fail-every", "0"],
            "--fault-fail-every",
        ),
        (&["--vanilla", "--link-gbps=-1"], "--link-gbps"),
        (
            &["--plan", "/nonexistent/plan.json"],
            "/nonexistent/plan.json",
        ),
        (&["--vanilla", "--device", "cuda"], "cuda"),
        (&["--vanilla", "--optimizer", "lamb"], "lamb"),
    ];
    for (args, want) in cases {
        let out = worker_bin().args(job).args(args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    let out = worker_bin()
        .args(["--model", "no_such_model", "--vanilla"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no_such_model"));
}

#[test]
fn a_closed_stdout_ends_quietly_after_the_job() {
    let _heavy = crate::heavy();
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = worker_bin()
        .args(["--model", "resnet50", "--batch", "1", "--resolution", "64"])
        .args(["--optimizer", "sgd", "--threads", "1", "--vanilla"])
        .args(["--iterations", "2"])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

#[test]
fn sizes_in_mb_take_decimals_and_name_the_flag_when_wrong() {
    for (flag, value, says) in [
        ("--memory-mb", "1.5x", "not a size in MB"),
        ("--host-pool-mb", "-3", "is negative"),
        ("--base-mb", "0", "above 0"),
    ] {
        let out = worker_bin()
            .args(["--model", "resnet50", "--vanilla", flag, value])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {stderr}");
        assert!(stderr.contains(flag) && stderr.contains(says), "{stderr}");
    }
    // A decimal budget is the bytes it says: 0.5 MB holds no ResNet-50, and
    // the out-of-memory error names the budget.
    let out = worker_bin()
        .args(["--model", "resnet50", "--batch", "1", "--resolution", "64"])
        .args(["--optimizer", "sgd", "--threads", "1", "--vanilla"])
        .args(["--memory-mb", "0.5"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("500000"), "{stderr}");
}
