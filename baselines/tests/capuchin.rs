//! Capuchin's defining behaviour on tiny graphs: a passive first iteration
//! that evicts under the budget; then a plan (swaps by free time, MSPS
//! recomputation) that keeps later iterations within the budget with no
//! eviction; feedback that moves late swap-ins earlier; and no deadlock or
//! lost tensor when the budget is too small.
#![allow(clippy::unwrap_used)]

use expect_test::{Expect, expect};
use tensile_baselines::Capuchin;
use tensile_executor::sim::{JobResult, SimConfig, SimJob, simulate};
use tensile_graph::builder::{Builder, Optimizer};
use tensile_graph::{DType, Graph, Liveness, OpId, Phase};
use tensile_planner::{CopyModel, EventKind, JobId, Measurements, Plan, Replan, Trigger};

/// An MLP whose activations (`batch` x `width` floats) outweigh its
/// weights, so that the peak is where the forward pass ends. With ReLU,
/// a layer's input is freed once its output exists, so nothing can be
/// recomputed; with GELU, whose backward reads its input, the output can
/// be rebuilt from that input.
fn mlp(batch: u64, width: u64, depth: usize, gelu: bool) -> Graph {
    let mut b = Builder::new("mlp");
    let x = b.input("x", vec![batch, width], DType::F32);
    let y = b.input("y", vec![batch], DType::I64);
    let mut h = x;
    for i in 1..=depth {
        h = b.linear(&format!("fc{i}"), h, width, false);
        h = if gelu {
            b.gelu(&format!("act{i}"), h)
        } else {
            b.relu(&format!("act{i}"), h)
        };
    }
    let logits = b.linear("head", h, 10, false);
    let loss = b.cross_entropy("loss", logits, y);
    b.finish(loss, Optimizer::adam()).expect("valid")
}

const BASE: u64 = 1_000_000;
/// 100 µs per op.
const OP_NS: u64 = 100_000;

/// 10 GB/s each way: a 4 MiB activation takes about 4 ops to copy.
fn fast_link() -> CopyModel {
    CopyModel::duplex(10e9, 10e9, 1_000)
}

fn vanilla_peak(live: &Liveness) -> u64 {
    BASE + live.vanilla_footprint().peak
}

/// Runs one job under Capuchin with `budget`, the ops taking `truth`.
fn run<'g>(
    g: &'g Graph,
    live: &'g Liveness,
    budget: u64,
    truth: Vec<u64>,
    iterations: usize,
    copy: CopyModel,
) -> (JobResult, Capuchin<'g>) {
    let sim = SimConfig {
        iterations,
        sharing_slowdown: 0.0,
        copy,
        base_bytes: BASE,
        budget_bytes: None,
        shared_link: false,
    };
    let mut cap = Capuchin::new(vec![g], vec![live], vec![budget], copy);
    let plan = cap.initial_plans().remove(0);
    let job = SimJob {
        options: cap.exec_options(0),
        ..SimJob::new(g, live, plan, truth)
    };
    let r = simulate(vec![job], &sim, &mut cap);
    (r.jobs.into_iter().next().unwrap(), cap)
}

/// The plan's copies and recomputations, one a line.
fn render(g: &Graph, p: &Plan) -> String {
    let mut out = String::new();
    for e in p.events.iter().filter(|e| e.kind != EventKind::Release) {
        let when = match e.trigger {
            Trigger::IterationStart => format!("start +{}", e.delay_ns),
            Trigger::After(o) => format!("after {} +{}", g.op(o).name, e.delay_ns),
            Trigger::Before(o) => format!("before {}", g.op(o).name),
        };
        out += &format!("{when}: {} {}\n", e.kind.name(), g.tensor(e.tensor).name);
    }
    out
}

fn check_plan(g: &Graph, cap: &Capuchin<'_>, want: Expect) {
    want.assert_eq(&render(g, &cap.plan(0).unwrap()));
}

/// Where the plan swaps `name` back in.
fn swap_in_trigger(g: &Graph, p: &Plan, name: &str) -> OpId {
    p.events
        .iter()
        .find(|e| e.kind == EventKind::SwapIn && g.tensor(e.tensor).name == name)
        .and_then(|e| match e.trigger {
            Trigger::After(op) => Some(op),
            _ => None,
        })
        .unwrap()
}

/// The passive iteration runs out of room and evicts; from what it measured
/// Capuchin swaps the activations with the largest free time (the earliest
/// layers: out right after the next layer reads them, back in just before
/// their backward use), and later iterations stay within the budget with no
/// eviction, no stall, and exactly the predicted peak, on two copy engines
/// and on one half-duplex queue.
#[test]
fn the_passive_iteration_evicts_then_the_plan_fits() {
    let g = mlp(4096, 256, 6, false);
    let live = Liveness::analyze(&g);
    let budget = vanilla_peak(&live) * 3 / 4;
    let mut half = fast_link();
    half.half_duplex = true;
    for copy in [fast_link(), half] {
        let (r, cap) = run(&g, &live, budget, vec![OP_NS; g.ops().len()], 4, copy);
        assert_eq!(r.error, None);
        let first = &r.iterations[0];
        assert!(!first.evictions.is_empty());
        assert!(first.passive_swaps > 0);
        assert!(first.stall_ns > 0);
        assert!(first.peak_bytes <= budget);
        let report = cap.job(0).unwrap();
        assert!(report.swaps > 0, "{report:?}");
        assert!(report.evicted_bytes > 0);
        assert!(report.predicted_peak_bytes <= budget);
        for it in &r.iterations[1..] {
            assert!(it.evictions.is_empty(), "{:?}", it.evictions);
            assert_eq!(it.passive_swaps, 0);
            assert_eq!(it.stall_ns, 0);
            assert!(it.peak_bytes <= budget);
            assert_eq!(it.peak_bytes, report.predicted_peak_bytes);
            assert!(it.end_ns - it.start_ns < first.end_ns - first.start_ns);
        }
        assert_eq!(r.last_plan_version, 2);
    }
    let (_, cap) = run(
        &g,
        &live,
        budget,
        vec![OP_NS; g.ops().len()],
        2,
        fast_link(),
    );
    check_plan(
        &g,
        &cap,
        expect![[r#"
            after fc2 +0: swap_out act1
            after fc3 +120431: swap_out act2
            after fc4 +240862: swap_out act3
            after fc6.backward.weight +0: swap_in act3
            after act4.backward +0: swap_in act2
            after fc3.backward.input +0: swap_in act1
        "#]],
    );
}

/// At 0.5 GB/s no copy of a 4 MiB activation hides behind the ops:
/// Capuchin recomputes instead, largest MSPS first. The linear layers are
/// slow, and the later a layer the slower its GELU, so the GELU outputs of
/// the earliest layers save the most memory per second of recomputation:
/// those two are picked. The plan holds the budget with no eviction.
#[test]
fn recomputes_by_msps_when_no_swap_can_be_hidden() {
    let g = mlp(4096, 256, 6, true);
    let live = Liveness::analyze(&g);
    // Two activations of 4 MiB must go.
    let budget = vanilla_peak(&live) - 6 * (1 << 20);
    let truth: Vec<u64> = g
        .ops()
        .iter()
        .map(|o| match (o.phase, o.op_type.as_str()) {
            (Phase::Forward, "aten::mm") => 10 * OP_NS,
            (Phase::Forward, "aten::gelu") => {
                let layer: u64 = o.name["act".len()..].parse().unwrap();
                OP_NS * (1 + layer)
            }
            _ => OP_NS,
        })
        .collect();
    let slow = CopyModel::duplex(0.5e9, 0.5e9, 1_000);
    let (r, cap) = run(&g, &live, budget, truth, 3, slow);
    assert_eq!(r.error, None);
    let report = cap.job(0).unwrap();
    assert_eq!((report.swaps, report.fetches), (0, 0), "{report:?}");
    assert!(report.recomputes > 0);
    for it in &r.iterations[1..] {
        assert!(it.evictions.is_empty());
        assert_eq!(it.recomputed_ops, report.recomputes);
        assert!(it.peak_bytes <= budget);
    }
    check_plan(
        &g,
        &cap,
        expect![[r#"
        before fc3.backward.weight: recompute act2
        before fc2.backward.weight: recompute act1
    "#]],
    );
}

/// A budget the vanilla iteration already fits: nothing is evicted and the
/// plan stays free-after-last-use.
#[test]
fn a_budget_that_fits_changes_nothing() {
    let g = mlp(4096, 256, 6, false);
    let live = Liveness::analyze(&g);
    let budget = vanilla_peak(&live);
    let (r, cap) = run(
        &g,
        &live,
        budget,
        vec![OP_NS; g.ops().len()],
        3,
        fast_link(),
    );
    assert_eq!(r.error, None);
    for it in &r.iterations {
        assert!(it.evictions.is_empty());
        assert_eq!(it.passive_swaps, 0);
        assert_eq!(it.peak_bytes, budget);
    }
    check_plan(&g, &cap, expect![""]);
}

/// Measured while the backward pass ran twice as slow, the plan triggers
/// its swap-ins too late for the real, faster backward pass: the ops wait.
/// Every miss moves the late swap-in earlier (5% more lead), until none is
/// late.
#[test]
fn late_swap_ins_move_earlier_until_on_time() {
    let g = mlp(4096, 256, 6, false);
    let live = Liveness::analyze(&g);
    let budget = vanilla_peak(&live) * 3 / 4;
    let slow_backward: Vec<u64> = g
        .ops()
        .iter()
        .map(|o| {
            if o.phase == Phase::Backward {
                2 * OP_NS
            } else {
                OP_NS
            }
        })
        .collect();
    let (_, mut cap) = run(&g, &live, budget, slow_backward, 1, fast_link());
    let planned = cap.plan(0).unwrap();
    let sim = SimConfig {
        iterations: 6,
        sharing_slowdown: 0.0,
        copy: fast_link(),
        base_bytes: BASE,
        budget_bytes: None,
        shared_link: false,
    };
    let job = SimJob {
        options: cap.exec_options(0),
        ..SimJob::new(&g, &live, planned.clone(), vec![OP_NS; g.ops().len()])
    };
    let r = simulate(vec![job], &sim, &mut cap);
    let its = &r.jobs[0].iterations;
    assert_eq!(r.jobs[0].error, None);
    assert!(!its[0].late_prefetches.is_empty());
    assert!(its[0].stall_ns > 0);
    for w in its.windows(2) {
        assert!(w[1].stall_ns <= w[0].stall_ns, "stalls {its:?}");
    }
    let last = its.last().unwrap();
    assert!(
        last.late_prefetches.is_empty(),
        "{:?}",
        last.late_prefetches
    );
    assert_eq!(last.stall_ns, 0);
    assert!(cap.job(0).unwrap().feedback_moves > 0);
    let moved = cap.plan(0).unwrap();
    for name in ["act1", "act2", "act3"] {
        assert!(
            swap_in_trigger(&g, &moved, name) < swap_in_trigger(&g, &planned, name),
            "{name}"
        );
    }
}

/// Each reported miss makes that swap-in's lead (from its trigger to the
/// access it serves) 5% longer: on a deep MLP of 10 µs ops, where a copy
/// spans dozens of ops, the trigger moves to the latest op that ends by
/// then, in a new plan version. A miss of a tensor the plan does not swap
/// changes nothing.
#[test]
fn each_miss_adds_five_percent_to_the_lead() {
    const OP: u64 = 10_000;
    let g = mlp(1024, 256, 20, false);
    let live = Liveness::analyze(&g);
    let budget = vanilla_peak(&live) * 3 / 4;
    let link = CopyModel::duplex(2.5e9, 2.5e9, 1_000);
    let (_, mut cap) = run(&g, &live, budget, vec![OP; g.ops().len()], 1, link);
    let tensor = |name: &str| g.tensors().iter().find(|t| t.name == name).unwrap().id;
    let mut plan = cap.plan(0).unwrap();
    check_plan(
        &g,
        &cap,
        expect![[r#"
        after fc2 +0: swap_out act1
        after fc13.backward.weight +0: swap_in act1
    "#]],
    );
    // act1's first use in the backward pass.
    let use_op = g
        .ops()
        .iter()
        .find(|o| o.name == "fc2.backward.weight")
        .unwrap()
        .id;
    let miss = |name: &str| Measurements {
        late_prefetches: vec![(tensor(name), 1_000)],
        ..Measurements::default()
    };
    assert!(
        cap.after_iteration(JobId(0), &miss("x"))
            .unwrap()
            .is_empty()
    );
    for _ in 0..3 {
        let out = cap.after_iteration(JobId(0), &miss("act1")).unwrap();
        assert_eq!(out.len(), 1);
        let (job, next) = &out[0];
        assert_eq!(*job, JobId(0));
        assert_eq!(next.version, plan.version + 1);
        // Every op takes 10 µs: op k ends at (k + 1) * 10 µs.
        let use_at = u64::from(use_op.0) * OP;
        let was = swap_in_trigger(&g, &plan, "act1");
        let lead = use_at - (u64::from(was.0) + 1) * OP;
        let want = use_at - (lead as f64 * 1.05).ceil() as u64;
        let moved = swap_in_trigger(&g, next, "act1");
        assert_eq!(u64::from(moved.0), want / OP - 1, "lead {lead} ns");
        assert!(was.0 - moved.0 >= 2, "5% of a lead of {lead} ns spans ops");
        plan = next.clone();
    }
}

/// A budget below the parameters and optimizer state: no plan can reach
/// it, the executor evicts what it may and runs over the budget, says by
/// how much, and finishes every iteration with no tensor lost.
#[test]
fn a_budget_too_small_finishes_and_is_reported() {
    let g = mlp(4096, 256, 6, false);
    let live = Liveness::analyze(&g);
    let budget = BASE + live.persistent_bytes() / 2;
    let (r, cap) = run(
        &g,
        &live,
        budget,
        vec![OP_NS; g.ops().len()],
        3,
        fast_link(),
    );
    assert_eq!(r.error, None);
    assert_eq!(r.iterations.len(), 3);
    for it in &r.iterations {
        assert!(it.over_budget_bytes > 0);
        assert_eq!(it.over_budget_bytes, it.peak_bytes - budget);
        assert!(!it.evictions.is_empty());
    }
    assert!(cap.job(0).unwrap().predicted_peak_bytes > budget);
}
