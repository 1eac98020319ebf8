//! Capuchin's passive mode in the executor (`ExecOptions::evict_budget_bytes`):
//! evict least-recently-used storages to the host when an op's allocations
//! would go over the budget, bring them back on demand, never lose data and
//! never deadlock; and with no budget, the executor is unchanged.

use tensile_executor::sim::{FixedPlans, SimConfig, SimJob, SimResult, simulate};
use tensile_executor::{ExecOptions, IterationStats};
use tensile_graph::builder::Optimizer;
use tensile_graph::{Graph, Liveness};
use tensile_planner::{CopyModel, Event, EventKind, Plan, Trigger};

use crate::mlp;

/// Free after last use, nothing else.
fn vanilla(live: &Liveness) -> Plan {
    Plan {
        events: Event::releases_after_last_use(live),
        ..Plan::default()
    }
}

const BASE: u64 = 1_000_000;

/// Runs `g` for 3 iterations under `plan` with 100 µs per op.
fn run(g: &Graph, live: &Liveness, plan: Plan, options: ExecOptions) -> SimResult {
    let job = SimJob {
        options,
        ..SimJob::new(g, live, plan, vec![100_000; g.ops().len()])
    };
    let sim = SimConfig {
        iterations: 3,
        sharing_slowdown: 0.0,
        copy: CopyModel::duplex(10e9, 10e9, 1_000),
        base_bytes: BASE,
        budget_bytes: None,
        shared_link: false,
    };
    simulate(vec![job], &sim, &mut FixedPlans)
}

fn budget(b: u64) -> ExecOptions {
    ExecOptions {
        evict_budget_bytes: Some(b),
        ..ExecOptions::default()
    }
}

fn names(g: &Graph, it: &IterationStats) -> Vec<String> {
    it.evictions
        .iter()
        .map(|&(t, op)| format!("{} before {}", g.tensor(t).name, g.op(op).name))
        .collect()
}

#[test]
fn without_a_budget_nothing_changes() {
    assert_eq!(ExecOptions::default().evict_budget_bytes, None);
    let g = mlp(4096, 256, 4, Optimizer::sgd());
    let live = Liveness::analyze(&g);
    let free = run(&g, &live, vanilla(&live), ExecOptions::default());
    let peak = free.jobs[0].peak_bytes();
    // A budget that is never reached evicts nothing and changes no figure.
    let roomy = run(&g, &live, vanilla(&live), budget(peak));
    assert_eq!(free.jobs[0].iterations, roomy.jobs[0].iterations);
    assert_eq!(free.jobs[0].trace, roomy.jobs[0].trace);
    for it in &free.jobs[0].iterations {
        assert!(it.evictions.is_empty());
        assert_eq!(it.over_budget_bytes, 0);
        assert_eq!(it.passive_swaps, 0);
        assert_eq!(it.start_bytes, BASE + live.bytes_at_start());
    }
}

/// At three quarters of the vanilla peak, the forward pass runs out of room
/// at `act4`: the least recently used storages go first (the labels, held
/// since the iteration began, then the input, last read by `fc1`), and
/// `act1` before the backward pass needs room again. Each comes back on
/// demand, and the op waits for the copies.
#[test]
fn evicts_least_recently_used_under_the_budget() {
    let g = mlp(4096, 256, 4, Optimizer::sgd());
    let live = Liveness::analyze(&g);
    let free = run(&g, &live, vanilla(&live), ExecOptions::default());
    let b = free.jobs[0].peak_bytes() * 3 / 4;
    let r = run(&g, &live, vanilla(&live), budget(b));
    assert_eq!(r.jobs[0].error, None);
    assert_eq!(r.jobs[0].iterations.len(), 3);
    for it in &r.jobs[0].iterations {
        assert!(it.peak_bytes <= b, "peak {} over {b}", it.peak_bytes);
        assert_eq!(it.over_budget_bytes, 0);
        assert_eq!(
            names(&g, it),
            [
                "y before act4",
                "x before act4",
                "act1 before act4.backward"
            ]
        );
        // Three copies out, three back.
        assert_eq!(it.passive_swaps, 6);
        assert!(it.stall_ns > 0);
    }
    assert!(r.jobs[0].time_ns() > free.jobs[0].time_ns());
}

/// A victim whose host copy is still valid (the plan swapped `x` out and
/// back in, and nothing wrote it since) is dropped without a second copy.
#[test]
fn a_victim_with_a_valid_host_copy_is_dropped_without_copying() {
    let g = mlp(4096, 256, 4, Optimizer::sgd());
    let live = Liveness::analyze(&g);
    let x = g.tensors().iter().find(|t| t.name == "x").unwrap().id;
    let mut plan = vanilla(&live);
    for (op, kind) in [(0, EventKind::SwapOut), (2, EventKind::SwapIn)] {
        plan.events.push(Event {
            trigger: Trigger::After(tensile_graph::OpId(op)),
            delay_ns: 0,
            kind,
            tensor: x,
        });
    }
    let free = run(&g, &live, plan.clone(), ExecOptions::default());
    let b = free.jobs[0].peak_bytes() * 3 / 4;
    let r = run(&g, &live, plan, budget(b));
    assert_eq!(r.jobs[0].error, None);
    let it = &r.jobs[0].iterations[1];
    assert!(it.peak_bytes <= b);
    let names = names(&g, it);
    assert!(names.contains(&"x before act4".to_string()), "{names:?}");
    // The plan's copy of x, and the evictions of y and act1: not x again.
    let xb = g.tensor(x).bytes;
    let yb = 4096 * 8;
    assert_eq!(it.swapped_bytes, xb + yb + xb, "{names:?}");
}

/// A planned prefetch that would take the job over the budget is not
/// started: the op that needs the tensor fetches it on demand, after making
/// room, so the budget holds.
#[test]
fn a_prefetch_that_does_not_fit_is_left_to_its_op() {
    let g = mlp(4096, 256, 4, Optimizer::sgd());
    let live = Liveness::analyze(&g);
    let op = |name: &str| g.ops().iter().find(|o| o.name == name).unwrap().id;
    let act1 = g.tensors().iter().find(|t| t.name == "act1").unwrap().id;
    // act1 goes out after fc2 and comes back far too early, right after
    // fc4, while the forward pass still builds up.
    let mut plan = vanilla(&live);
    for (after, kind) in [("fc2", EventKind::SwapOut), ("fc4", EventKind::SwapIn)] {
        plan.events.push(Event {
            trigger: Trigger::After(op(after)),
            delay_ns: 0,
            kind,
            tensor: act1,
        });
    }
    // The budget leaves 2 MB beside what fc4 runs with: not enough for
    // act1's 4 MiB.
    let free = run(&g, &live, plan.clone(), ExecOptions::default());
    let fc4_starts = u64::from(op("fc4").0) * 100_000;
    let at_fc4 = free.jobs[0]
        .trace
        .iter()
        .rfind(|&&(t, _)| t <= fc4_starts)
        .unwrap()
        .1;
    let b = at_fc4 + 2_000_000;
    let r = run(&g, &live, plan, budget(b));
    assert_eq!(r.jobs[0].error, None);
    for it in &r.jobs[0].iterations {
        assert!(it.peak_bytes <= b, "peak {} over {b}", it.peak_bytes);
        assert_eq!(it.over_budget_bytes, 0);
        assert!(it.passive_swaps > 0);
    }
}

/// Copies slower than the ops: the op that needs room waits until enough
/// evictions have landed on the host, and the budget still holds.
#[test]
fn the_op_waits_for_slow_evictions() {
    let g = mlp(4096, 256, 4, Optimizer::sgd());
    let live = Liveness::analyze(&g);
    let job = |options| SimJob {
        options,
        ..SimJob::new(&g, &live, vanilla(&live), vec![10_000; g.ops().len()])
    };
    let sim = SimConfig {
        iterations: 2,
        sharing_slowdown: 0.0,
        copy: CopyModel::duplex(1e9, 1e9, 1_000),
        base_bytes: BASE,
        budget_bytes: None,
        shared_link: false,
    };
    let free = simulate(vec![job(ExecOptions::default())], &sim, &mut FixedPlans);
    let b = free.jobs[0].peak_bytes() * 2 / 3;
    let r = simulate(vec![job(budget(b))], &sim, &mut FixedPlans);
    assert_eq!(r.jobs[0].error, None);
    for it in &r.jobs[0].iterations {
        assert!(it.peak_bytes <= b);
        assert!(!it.evictions.is_empty());
        // Each eviction of 4 MiB takes 4 ms at 1 GB/s; ops take 10 µs.
        assert!(it.stall_ns > 4_000_000, "stalled {} ns", it.stall_ns);
    }
}

/// A budget below what one op needs (here, below even the parameters):
/// evict everything that may go, run over the budget, say by how much, and
/// finish every iteration with no tensor lost.
#[test]
fn a_budget_too_small_runs_over_and_says_so() {
    let g = mlp(4096, 256, 4, Optimizer::sgd());
    let live = Liveness::analyze(&g);
    for b in [1, BASE + live.persistent_bytes() + 4_000_000] {
        let r = run(&g, &live, vanilla(&live), budget(b));
        assert_eq!(r.jobs[0].error, None, "budget {b}");
        assert_eq!(r.jobs[0].iterations.len(), 3);
        for it in &r.jobs[0].iterations {
            assert!(it.over_budget_bytes > 0, "budget {b}");
            assert_eq!(it.over_budget_bytes, it.peak_bytes - b, "budget {b}");
            assert!(!it.evictions.is_empty());
        }
    }
}
