//! `save_on_cpu` and torchtune's OffloadActivations: which storages go to
//! the host, and how long compute waits for them.

use std::collections::BTreeSet;

use tensile_baselines::Policy;
use tensile_executor::ExecOptions;
use tensile_graph::{Graph, Liveness, OpId, Phase, StorageId};
use tensile_planner::{CopyModel, EventKind, Trigger};

use crate::{convnet, fast_link, in_flight_at_kernels, latencies, moved, plan_of, run, uses};

/// Non-persistent storages made by a forward op and used in backward.
fn saved(g: &Graph, live: &Liveness) -> BTreeSet<StorageId> {
    let u = uses(g, live);
    (0..live.storages.len())
        .filter(|&i| {
            let st = &live.storages[i];
            !st.persistent
                && st.born.is_some_and(|b| g.op(b).phase == Phase::Forward)
                && u.first_backward[i].is_some()
        })
        .map(|i| StorageId(i as u32))
        .collect()
}

/// 200 MB/s: copies fall far behind compute.
fn slow_link() -> CopyModel {
    CopyModel::duplex(2e8, 2e8, 5_000)
}

#[test]
fn save_on_cpu_offloads_every_saved_activation_and_waits_for_each_copy() {
    let g = convnet();
    let live = Liveness::analyze(&g);
    let lat = latencies(&g);
    let copy = fast_link();
    let plan = plan_of(Policy::SaveOnCpu, &g, &live, &lat, copy);
    let want = saved(&g, &live);
    assert!(want.len() >= 8, "{want:?}");
    let outs = moved(&plan, &live, EventKind::SwapOut);
    assert_eq!(outs.iter().map(|x| x.0).collect::<BTreeSet<_>>(), want);
    assert_eq!(outs.len(), want.len());
    let u = uses(&g, &live);
    for &(s, trigger) in &outs {
        assert_eq!(trigger, Trigger::After(u.last_forward[s.index()].unwrap()));
    }
    // Fetched on demand, not prefetched.
    assert_eq!(plan.count(EventKind::SwapIn), 0);
    // Each copy out blocks the next op, and each copy back the op that
    // needs it: with exact latencies the stall is exactly the copy time.
    let copy_ns: u64 = want
        .iter()
        .map(|s| {
            let b = live.storages[s.index()].bytes;
            copy.duration_ns(b, copy.d2h_bytes_per_s) + copy.duration_ns(b, copy.h2d_bytes_per_s)
        })
        .sum();
    let r = run(Policy::SaveOnCpu, &g, &lat, copy);
    for it in &r.iterations {
        assert_eq!(it.stall_ns, copy_ns);
        assert_eq!(it.passive_swaps, want.len());
        assert_eq!(it.end_ns - it.start_ns, lat.iter().sum::<u64>() + copy_ns);
    }
}

#[test]
fn offload_stream_offloads_saved_activations_of_at_least_1_kib() {
    let g = convnet();
    let live = Liveness::analyze(&g);
    let lat = latencies(&g);
    let plan = plan_of(Policy::OffloadStream, &g, &live, &lat, fast_link());
    let all = saved(&g, &live);
    let big: BTreeSet<StorageId> = all
        .iter()
        .copied()
        .filter(|s| live.storages[s.index()].bytes >= 1024)
        .collect();
    // The log-probabilities (8 x 10 floats) stay; the pooled features
    // (8 x 32 floats, exactly 1 KiB) go.
    assert!(big.len() < all.len());
    let outs = moved(&plan, &live, EventKind::SwapOut);
    assert_eq!(outs.iter().map(|x| x.0).collect::<BTreeSet<_>>(), big);
    assert_eq!(outs.len(), big.len());
    let u = uses(&g, &live);
    for &(s, trigger) in &outs {
        assert_eq!(trigger, Trigger::After(u.last_forward[s.index()].unwrap()));
    }
}

#[test]
fn offload_stream_fetches_one_node_ahead() {
    let g = convnet();
    let live = Liveness::analyze(&g);
    let lat = latencies(&g);
    let plan = plan_of(Policy::OffloadStream, &g, &live, &lat, fast_link());
    let u = uses(&g, &live);
    let outs = moved(&plan, &live, EventKind::SwapOut);
    let ins = moved(&plan, &live, EventKind::SwapIn);
    assert_eq!(
        ins.iter().map(|x| x.0).collect::<Vec<_>>(),
        outs.iter().map(|x| x.0).collect::<Vec<_>>(),
        "each offloaded storage comes back once"
    );
    // The backward ops that fetch something, in order.
    let mut nodes: Vec<OpId> = outs
        .iter()
        .map(|&(s, _)| u.first_backward[s.index()].unwrap())
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    assert!(nodes.len() >= 6, "{nodes:?}");
    let bw_start = g
        .ops()
        .iter()
        .find(|op| op.phase == Phase::Backward)
        .unwrap()
        .id;
    for &(s, trigger) in &ins {
        let need = u.first_backward[s.index()].unwrap();
        let k = nodes.iter().position(|&n| n == need).unwrap();
        // Issued as the node before the previous one ends, so that the copy
        // runs while the previous node computes; the first two nodes' as
        // backward starts.
        let want = if k >= 2 {
            nodes[k - 2]
        } else {
            OpId(bw_start.0 - 1)
        };
        assert_eq!(trigger, Trigger::After(want), "node {k}");
    }
    // Copies back that overlap compute: with a link fast enough, no op
    // waits for one, and none is fetched on demand.
    let r = run(Policy::OffloadStream, &g, &lat, fast_link());
    for it in &r.iterations {
        assert_eq!(it.passive_swaps, 0);
        assert!(it.late_prefetches.is_empty(), "{:?}", it.late_prefetches);
    }
}

#[test]
fn offload_stream_keeps_at_most_five_copies_in_flight() {
    let g = convnet();
    let live = Liveness::analyze(&g);
    let lat = latencies(&g);
    let copy = slow_link();
    let plan = plan_of(Policy::OffloadStream, &g, &live, &lat, copy);
    let options = Policy::OffloadStream.exec_options();
    assert_eq!(options.max_swap_outs_in_flight, Some(5));
    let (counts, its) = in_flight_at_kernels(&g, &live, &plan, &lat, copy, options);
    assert_eq!(counts.iter().max(), Some(&5), "{counts:?}");
    // Without the bound the same copies pile up past five, and compute
    // waits less.
    let (free, free_its) =
        in_flight_at_kernels(&g, &live, &plan, &lat, copy, ExecOptions::default());
    assert!(free.iter().max().unwrap() > &5, "{free:?}");
    for (it, free_it) in its.iter().zip(&free_its) {
        assert!(it.stall_ns > free_it.stall_ns);
        assert_eq!(
            it.end_ns - it.start_ns,
            lat.iter().sum::<u64>() + it.stall_ns
        );
    }
}

#[test]
fn offload_stream_stalls_less_than_save_on_cpu() {
    let g = convnet();
    let lat = latencies(&g);
    for copy in [fast_link(), slow_link()] {
        let sync = run(Policy::SaveOnCpu, &g, &lat, copy);
        let stream = run(Policy::OffloadStream, &g, &lat, copy);
        for (a, b) in stream.iterations.iter().zip(&sync.iterations) {
            assert!(
                a.stall_ns < b.stall_ns,
                "{} GB/s: {} vs {}",
                copy.d2h_bytes_per_s / 1e9,
                a.stall_ns,
                b.stall_ns
            );
        }
        assert!(stream.time_ns() < sync.time_ns());
    }
}
