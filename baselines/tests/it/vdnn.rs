//! vDNN-conv: offloads exactly the data inputs of convolutions and
//! prefetches each one backward layer ahead.

use std::collections::BTreeSet;

use tensile_baselines::Policy;
use tensile_graph::{Liveness, OpId, Phase, StorageId};
use tensile_planner::{Event, EventKind, Trigger};

use crate::{convnet, fast_link, latencies, moved, plan_of, run, uses};

#[test]
fn swaps_out_exactly_the_non_weight_inputs_of_convolutions() {
    let g = convnet();
    let live = Liveness::analyze(&g);
    let lat = latencies(&g);
    let plan = plan_of(Policy::VdnnConv, &g, &live, &lat, fast_link());
    // Every forward convolution's inputs, less its weight and bias.
    let want: BTreeSet<StorageId> = g
        .ops()
        .iter()
        .filter(|op| op.op_type == "aten::convolution" && op.phase == Phase::Forward)
        .flat_map(|op| &op.inputs)
        .map(|t| live.storage_of[t.index()])
        .filter(|s| !live.storages[s.index()].persistent)
        .collect();
    // conv1 reads the batch, the others an activation; the block's input
    // is also the skip connection's.
    assert_eq!(want.len(), 7);
    let outs = moved(&plan, &live, EventKind::SwapOut);
    let got: BTreeSet<StorageId> = outs.iter().map(|x| x.0).collect();
    assert_eq!(got, want);
    assert_eq!(outs.len(), want.len(), "one swap-out per storage");
    // Each after its last forward use (the skip addition for the block's
    // input, not the convolution).
    let u = uses(&g, &live);
    for &(s, trigger) in &outs {
        let last = u.last_forward[s.index()].unwrap();
        assert_eq!(
            trigger,
            Trigger::After(last),
            "{}",
            g.tensor(live.storages[s.index()].root).name
        );
    }
    let skip = g.ops().iter().find(|op| op.name == "block.add").unwrap();
    assert!(outs.iter().any(|&(_, t)| t == Trigger::After(skip.id)));
    // Everything else is the vanilla plan: each storage freed at last use.
    let mut releases: Vec<_> = plan
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Release)
        .copied()
        .collect();
    let mut vanilla = Event::releases_after_last_use(&live);
    releases.sort();
    vanilla.sort();
    assert_eq!(releases, vanilla);
    assert_eq!(plan.count(EventKind::Recompute), 0);
}

#[test]
fn prefetches_each_input_one_layer_ahead() {
    let g = convnet();
    let live = Liveness::analyze(&g);
    let lat = latencies(&g);
    let plan = plan_of(Policy::VdnnConv, &g, &live, &lat, fast_link());
    let u = uses(&g, &live);
    let conv_bw: Vec<OpId> = g
        .ops()
        .iter()
        .filter(|op| op.op_type == "aten::convolution_backward")
        .map(|op| op.id)
        .collect();
    assert_eq!(conv_bw.len(), 7);
    let bw_start = g
        .ops()
        .iter()
        .find(|op| op.phase == Phase::Backward)
        .unwrap()
        .id;
    let ins = moved(&plan, &live, EventKind::SwapIn);
    let outs = moved(&plan, &live, EventKind::SwapOut);
    assert_eq!(
        ins.iter().map(|x| x.0).collect::<Vec<_>>(),
        outs.iter().map(|x| x.0).collect::<Vec<_>>(),
        "each offloaded storage comes back once"
    );
    let mut layers_ahead = Vec::new();
    for &(s, trigger) in &ins {
        let Trigger::After(t) = trigger else {
            panic!("swap-in not after an op: {trigger:?}");
        };
        let need = u.first_backward[s.index()].unwrap();
        // Issued when the layer before the one that needs it starts: after
        // a convolution's backward (the end of the layer before that) or,
        // for the first two layers, as backward starts.
        assert!(
            conv_bw.contains(&t) || t.0 + 1 == bw_start.0,
            "{}: issued after {}",
            g.tensor(live.storages[s.index()].root).name,
            g.op(t).name
        );
        let between = conv_bw.iter().filter(|&&c| t < c && c < need).count();
        let before_need = conv_bw.iter().filter(|&&c| c < need).count();
        assert_eq!(between, before_need.min(1));
        layers_ahead.push(between);
    }
    // The last convolution's input is needed by the first backward layer,
    // so it comes back as backward starts; every other one a layer ahead.
    layers_ahead.sort_unstable();
    assert_eq!(layers_ahead, [0, 1, 1, 1, 1, 1, 1]);
    // With a link fast enough, every prefetch is in time: no wait, no
    // fetch on demand.
    let r = run(Policy::VdnnConv, &g, &lat, fast_link());
    for it in &r.iterations {
        assert_eq!(it.passive_swaps, 0);
        assert!(it.late_prefetches.is_empty(), "{:?}", it.late_prefetches);
        assert_eq!(it.stall_ns, 0);
    }
}
