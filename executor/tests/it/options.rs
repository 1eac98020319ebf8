//! The executor options that model baselines' copy discipline:
//! `sync_swap_out` (the compute stream waits for every copy to host) and
//! `max_swap_outs_in_flight` (a bounded offload stash). Each runs an MLP
//! whose saved activations are all swapped out after their last forward
//! use and fetched back on demand, with exact latencies, and checks the
//! waits against the copy times.

use tensile_executor::sim::{FixedPlans, SimConfig, SimJob, simulate};
use tensile_executor::{Dir, ExecOptions, Executor, IterationStats, Next, VirtualCopies};
use tensile_graph::builder::Optimizer;
use tensile_graph::{Graph, Liveness, OpId, Phase, StorageId};
use tensile_planner::{CopyModel, Event, EventKind, Plan, Trigger};

use crate::mlp;

/// 1 ms per op.
const OP_NS: u64 = 1_000_000;

/// Non-persistent storages made in forward and read in backward, with
/// their last forward access.
fn saved(g: &Graph, live: &Liveness) -> Vec<(StorageId, OpId)> {
    let mut last_fwd = vec![None; live.storages.len()];
    let mut read_in_bwd = vec![false; live.storages.len()];
    for op in g.ops() {
        for &t in op.inputs.iter().chain(&op.outputs) {
            let s = live.storage_of[t.index()].index();
            match op.phase {
                Phase::Forward => last_fwd[s] = Some(op.id),
                Phase::Backward => read_in_bwd[s] |= op.inputs.contains(&t),
                Phase::Optimizer => {}
            }
        }
    }
    live.storages
        .iter()
        .enumerate()
        .filter(|(i, st)| {
            !st.persistent
                && read_in_bwd[*i]
                && st.born.is_some_and(|b| g.op(b).phase == Phase::Forward)
        })
        .filter_map(|(i, _)| Some((StorageId(i as u32), last_fwd[i]?)))
        .collect()
}

/// Releases at last use, and a swap-out of every saved activation after
/// its last forward use; no swap-in (the executor fetches on demand).
fn offload_plan(g: &Graph, live: &Liveness) -> Plan {
    let mut events = Event::releases_after_last_use(live);
    for (s, last) in saved(g, live) {
        events.push(Event {
            trigger: Trigger::After(last),
            delay_ns: 0,
            kind: EventKind::SwapOut,
            tensor: live.storages[s.index()].root,
        });
    }
    events.sort_by_key(|e| match e.trigger {
        Trigger::After(op) => (op.0, u8::from(e.kind != EventKind::Release)),
        _ => (0, 0),
    });
    Plan {
        events,
        ..Plan::default()
    }
}

fn simulate_one(
    g: &Graph,
    live: &Liveness,
    copy: CopyModel,
    options: ExecOptions,
) -> Vec<IterationStats> {
    let job = SimJob {
        options,
        ..SimJob::new(g, live, offload_plan(g, live), vec![OP_NS; g.ops().len()])
    };
    let sim = SimConfig {
        iterations: 2,
        sharing_slowdown: 0.0,
        copy,
        base_bytes: 0,
        budget_bytes: None,
        shared_link: false,
    };
    let r = simulate(vec![job], &sim, &mut FixedPlans);
    assert_eq!(r.jobs[0].error, None);
    r.jobs[0].iterations.clone()
}

/// Runs one job alone and returns, for every kernel, how many swap-outs
/// were in flight (queued or copying) when it started, and the stats.
fn in_flight_at_kernels(
    g: &Graph,
    live: &Liveness,
    copy: CopyModel,
    options: ExecOptions,
) -> (Vec<usize>, Vec<IterationStats>) {
    let plan = offload_plan(g, live);
    let mut ex = Executor::new(g, live, &plan, VirtualCopies::new(copy, 1.0), 2);
    ex.set_options(options);
    // When each copy in the channel log was queued.
    let mut queued: Vec<u64> = Vec::new();
    let mut counts = Vec::new();
    let mut now = 0u64;
    loop {
        let next = ex.step(now).expect("runs");
        queued.resize(ex.engine().log.len(), now);
        match next {
            Next::Kernel { .. } => {
                let n = ex
                    .engine()
                    .log
                    .iter()
                    .zip(&queued)
                    .filter(|&(&(dir, _, end), &at)| dir == Dir::ToHost && at <= now && end > now)
                    .count();
                counts.push(n);
                now += OP_NS;
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

/// 1 GB/s each way: a 4 MB activation takes about 4 ms to copy, four ops.
fn slow_link() -> CopyModel {
    CopyModel::duplex(1e9, 1e9, 10_000)
}

#[test]
fn sync_swap_out_stalls_for_every_copy() {
    let g = mlp(1024, 1024, 4, Optimizer::sgd());
    let live = Liveness::analyze(&g);
    let copy = slow_link();
    let saved = saved(&g, &live);
    assert!(saved.len() >= 4, "{saved:?}");
    // Every copy out blocks compute, and so does every copy back (on
    // demand, as nothing prefetches): the stall is all the copy time.
    let copy_ns: u64 = saved
        .iter()
        .map(|(s, _)| {
            let b = live.storages[s.index()].bytes;
            copy.duration_ns(b, copy.d2h_bytes_per_s) + copy.duration_ns(b, copy.h2d_bytes_per_s)
        })
        .sum();
    let sync = ExecOptions {
        sync_swap_out: true,
        ..ExecOptions::default()
    };
    let its = simulate_one(&g, &live, copy, sync);
    for it in &its {
        assert_eq!(it.stall_ns, copy_ns);
        assert_eq!(it.passive_swaps, saved.len());
        assert_eq!(
            it.end_ns - it.start_ns,
            OP_NS * g.ops().len() as u64 + copy_ns
        );
    }
    // Asynchronous copies overlap compute: only the fetches stall.
    let plain = simulate_one(&g, &live, copy, ExecOptions::default());
    assert!(
        plain[1].stall_ns < its[1].stall_ns,
        "{} vs {}",
        plain[1].stall_ns,
        its[1].stall_ns
    );
}

#[test]
fn max_swap_outs_in_flight_bounds_the_stash() {
    let g = mlp(1024, 1024, 8, Optimizer::sgd());
    let live = Liveness::analyze(&g);
    let copy = slow_link();
    let (free, free_its) = in_flight_at_kernels(&g, &live, copy, ExecOptions::default());
    let most = free.iter().copied().max().unwrap_or(0);
    assert!(
        most > 2,
        "the link must fall behind for the bound to matter: {most}"
    );
    let bounded = ExecOptions {
        max_swap_outs_in_flight: Some(2),
        ..ExecOptions::default()
    };
    let (counts, its) = in_flight_at_kernels(&g, &live, copy, bounded);
    assert_eq!(counts.iter().copied().max(), Some(2), "{counts:?}");
    // The waits are counted as stalls, and they are what it costs.
    for (it, free_it) in its.iter().zip(&free_its) {
        assert!(it.stall_ns > free_it.stall_ns);
        assert_eq!(
            it.end_ns - it.start_ns,
            OP_NS * g.ops().len() as u64 + it.stall_ns
        );
        assert_eq!(
            free_it.end_ns - free_it.start_ns,
            OP_NS * g.ops().len() as u64 + free_it.stall_ns
        );
    }
    // A synchronous copy is the bound at zero: it stalls most.
    let sync = ExecOptions {
        sync_swap_out: true,
        ..ExecOptions::default()
    };
    let (zero, sync_its) = in_flight_at_kernels(&g, &live, copy, sync);
    assert_eq!(zero.iter().copied().max(), Some(0));
    assert!(sync_its[1].stall_ns > its[1].stall_ns);
}

#[test]
fn a_bound_never_reached_changes_nothing() {
    let g = mlp(1024, 1024, 4, Optimizer::sgd());
    let live = Liveness::analyze(&g);
    let loose = ExecOptions {
        max_swap_outs_in_flight: Some(usize::MAX),
        ..ExecOptions::default()
    };
    assert_eq!(
        simulate_one(&g, &live, slow_link(), loose),
        simulate_one(&g, &live, slow_link(), ExecOptions::default())
    );
}
