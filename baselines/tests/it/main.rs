//! The baselines' defining behaviour, on tiny graphs built with the graph
//! builder and on zoo convolution nets: which storages each policy moves,
//! when, and what the executor makes of it.
#![allow(clippy::unwrap_used)]

use tensile_baselines::{BaselineInput, Policy, static_plan};
use tensile_executor::sim::{FixedPlans, JobResult, SimConfig, SimJob, simulate};
use tensile_executor::{Dir, ExecOptions, Executor, IterationStats, Next, VirtualCopies};
use tensile_graph::builder::{Builder, Optimizer};
use tensile_graph::{DType, Graph, Liveness, OpId, Phase, StorageId};
use tensile_planner::{CopyModel, EventKind, Plan, Trigger};

mod pytorch;
mod vdnn;

/// A small CNN: four conv-ReLU pairs (in-place ReLU, as in VGG), a
/// max-pool, a residual block whose input is read by a convolution and by
/// the skip addition, a strided convolution, average pooling and a linear
/// head; 8 x 3 x 32 x 32 images. Deep enough at full resolution that
/// vanilla's peak is where backward starts, as in real CNNs.
pub(crate) fn convnet() -> Graph {
    let mut b = Builder::new("convnet");
    let x = b.input("x", vec![8, 3, 32, 32], DType::F32);
    let y = b.input("y", vec![8], DType::I64);
    let mut h = x;
    for i in 1..=4 {
        h = b.conv2d(&format!("conv{i}"), h, 16, [3, 3], [1, 1], [1, 1], 1, true);
        h = b.relu_(&format!("relu{i}"), h);
    }
    h = b.max_pool2d("pool", h, 2, 2, 0, false);
    let skip = h;
    h = b.conv2d("block.conv_a", h, 16, [3, 3], [1, 1], [1, 1], 1, false);
    h = b.relu_("block.relu_a", h);
    h = b.conv2d("block.conv_b", h, 16, [3, 3], [1, 1], [1, 1], 1, false);
    h = b.add("block.add", h, skip);
    h = b.relu_("block.relu", h);
    h = b.conv2d("down", h, 32, [3, 3], [2, 2], [1, 1], 1, true);
    h = b.relu_("down.relu", h);
    h = b.adaptive_avg_pool2d("avgpool", h, [1, 1]);
    h = b.flatten("flatten", h);
    let logits = b.linear("fc", h, 10, true);
    let loss = b.cross_entropy("loss", logits, y);
    b.finish(loss, Optimizer::sgd()).unwrap()
}

/// Latencies slow enough for a 24 GB/s link to keep up: 2 us plus 1 ns per
/// 4 bytes an op touches (a copy moves 24 bytes per ns).
pub(crate) fn latencies(g: &Graph) -> Vec<u64> {
    g.ops()
        .iter()
        .map(|op| {
            let b: u64 = op
                .inputs
                .iter()
                .chain(&op.outputs)
                .map(|&t| g.tensor(t).bytes)
                .sum();
            2_000 + b / 4
        })
        .collect()
}

pub(crate) fn fast_link() -> CopyModel {
    CopyModel::duplex(24e9, 24e9, 5_000)
}

pub(crate) fn plan_of(
    policy: Policy,
    g: &Graph,
    live: &Liveness,
    lat: &[u64],
    copy: CopyModel,
) -> Plan {
    static_plan(
        policy,
        &BaselineInput {
            graph: g,
            live,
            latency_ns: lat,
            copy,
            activation_budget: 0.5,
        },
    )
    .unwrap()
}

/// Simulates one job for two iterations with `lat` as the truth and the
/// policy's executor options.
pub(crate) fn run(policy: Policy, g: &Graph, lat: &[u64], copy: CopyModel) -> JobResult {
    let live = Liveness::analyze(g);
    let plan = plan_of(policy, g, &live, lat, copy);
    let job = SimJob {
        options: policy.exec_options(),
        ..SimJob::new(g, &live, plan, lat.to_vec())
    };
    let sim = SimConfig {
        iterations: 2,
        sharing_slowdown: 0.0,
        copy,
        base_bytes: 0,
        budget_bytes: None,
        shared_link: false,
    };
    let mut r = simulate(vec![job], &sim, &mut FixedPlans);
    assert_eq!(r.jobs[0].error, None, "{} on {}", policy.name(), g.name());
    assert_eq!(r.jobs[0].iterations.len(), 2);
    r.jobs.remove(0)
}

/// Runs one job alone under `plan` and `options`; returns how many
/// swap-outs were in flight (queued or copying) when each kernel started,
/// and the iterations' stats.
pub(crate) fn in_flight_at_kernels(
    g: &Graph,
    live: &Liveness,
    plan: &Plan,
    lat: &[u64],
    copy: CopyModel,
    options: ExecOptions,
) -> (Vec<usize>, Vec<IterationStats>) {
    let mut ex = Executor::new(g, live, plan, VirtualCopies::new(copy, 1.0), 2);
    ex.set_options(options);
    // When each copy of the channel log was queued.
    let mut queued: Vec<u64> = Vec::new();
    let mut counts = Vec::new();
    let mut now = 0u64;
    loop {
        let next = ex.step(now).unwrap();
        queued.resize(ex.engine().log.len(), now);
        match next {
            Next::Kernel { op } => {
                let n = ex
                    .engine()
                    .log
                    .iter()
                    .zip(&queued)
                    .filter(|&(&(dir, _, end), &at)| dir == Dir::ToHost && at <= now && end > now)
                    .count();
                counts.push(n);
                now += lat[op.index()];
                ex.kernel_done(now);
                queued.resize(ex.engine().log.len(), now);
            }
            Next::WaitUntil(t) => now = t.max(now + 1),
            Next::IterationDone => {}
            Next::WaitForCopy => panic!("virtual time knows every copy's end"),
            Next::WaitForMemory => panic!("no limit was set"),
            Next::Done => break,
        }
    }
    (counts, ex.iterations_done().to_vec())
}

/// Every storage's last forward access and first backward access, from
/// the ops alone.
pub(crate) struct Uses {
    pub last_forward: Vec<Option<OpId>>,
    pub first_backward: Vec<Option<OpId>>,
}

pub(crate) fn uses(g: &Graph, live: &Liveness) -> Uses {
    let n = live.storages.len();
    let mut u = Uses {
        last_forward: vec![None; n],
        first_backward: vec![None; n],
    };
    for op in g.ops() {
        for &t in op.inputs.iter().chain(&op.outputs) {
            let s = live.storage_of[t.index()].index();
            match op.phase {
                Phase::Forward => u.last_forward[s] = Some(op.id),
                Phase::Backward => {
                    u.first_backward[s].get_or_insert(op.id);
                }
                Phase::Optimizer => {}
            }
        }
    }
    u
}

/// The storages a plan swaps out (or in), each once, with the triggers.
pub(crate) fn moved(plan: &Plan, live: &Liveness, kind: EventKind) -> Vec<(StorageId, Trigger)> {
    let mut out: Vec<(StorageId, Trigger)> = plan
        .events
        .iter()
        .filter(|e| e.kind == kind)
        .map(|e| (live.storage_of[e.tensor.index()], e.trigger))
        .collect();
    out.sort_by_key(|x| x.0);
    out
}

/// The same graph, policy by policy: every one runs clean and lowers the
/// peak of vanilla (free at last use), with the convnet's latencies and on
/// zoo nets with the A6000 profile's.
#[test]
fn every_policy_runs_clean_and_lowers_the_peak_of_a_conv_net() {
    let policies = [Policy::VdnnConv, Policy::SaveOnCpu, Policy::OffloadStream];
    let g = convnet();
    let lat = latencies(&g);
    let vanilla = run(Policy::Vanilla, &g, &lat, fast_link()).peak_bytes();
    for p in policies {
        let peak = run(p, &g, &lat, fast_link()).peak_bytes();
        assert!(peak < vanilla, "{}: {peak} vs vanilla {vanilla}", p.name());
    }
    use tensile_graph::zoo::{self, ZooConfig};
    use tensile_latency_model::{DeviceProfile, true_latencies};
    let profile = DeviceProfile::builtin("a6000").unwrap();
    let copy = CopyModel::duplex(
        profile.h2d_bytes_per_s,
        profile.d2h_bytes_per_s,
        profile.copy_latency_ns,
    );
    for name in ["vgg16", "resnet50"] {
        let g = zoo::build(name, &ZooConfig::new(2)).unwrap();
        let lat = true_latencies(&g, &profile, 0);
        let vanilla = run(Policy::Vanilla, &g, &lat, copy).peak_bytes();
        for p in policies {
            let peak = run(p, &g, &lat, copy).peak_bytes();
            assert!(
                peak < vanilla,
                "{name} {}: {peak} vs vanilla {vanilla}",
                p.name()
            );
        }
    }
}
