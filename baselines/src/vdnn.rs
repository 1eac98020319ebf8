//! vDNN-conv (Rhu et al., "vDNN: Virtualized Deep Neural Networks for
//! Scalable, Memory-Efficient Neural Network Design", MICRO 2016), the
//! variant that offloads only convolution layers' inputs, as a fixed plan.
//!
//! vDNN copies a layer's input feature map (its `X`) to host memory during
//! the layer's forward and frees it on the device once the layer is done,
//! and prefetches it during backward while the layer above it computes, so
//! that the copies overlap compute; its conv
//! variant does this only for convolution layers, which hold most of a CNN's
//! activations and are slow enough to hide a copy. Here:
//!
//! - Offloaded: the data input (argument 0, the `input` of
//!   `aten::convolution`) of every forward convolution, when it is not
//!   persistent and backward reads it; weights and biases (arguments 1 and
//!   2) never move. This includes the batch itself when the first layer is a
//!   convolution, as in vDNN. One swap-out per storage, however many
//!   convolutions read it, after its last forward access.
//! - Layers in backward: one per `aten::convolution_backward`. Backward is
//!   cut after each convolution's backward op: layer `j` is the backward ops
//!   after convolution backward `j - 1` up to and including convolution
//!   backward `j` (layer 0 starts with the backward pass), so a layer holds a
//!   convolution's backward and the cheaper backward ops (activation, norm,
//!   pooling) between it and the previous one.
//! - Prefetch one layer ahead: a storage first read in backward in layer `j`
//!   is swapped in when layer `j - 1` starts, i.e. after the op that runs
//!   just before layer `j - 1`'s first op; a storage needed in layer 0 or 1
//!   is swapped in when backward starts (after the last op before it).
//! - Releases: every storage is freed after its last access (the vanilla
//!   releases); an offloaded one thus leaves the device again after its
//!   last backward use.
//!
//! vDNN starts a layer's offload with the layer's forward, so that the copy
//! overlaps that layer; here it starts after the last forward access, one
//! op later, because the executor frees a swapped-out buffer at the first
//! op boundary after its copy ends, which must not come before the last
//! forward reader has run.

use tensile_graph::{OpId, Phase};
use tensile_planner::{Event, EventKind, Plan, Trigger};

use crate::{BaselineError, BaselineInput, common};

/// The op type of a forward convolution.
const CONV: &str = "aten::convolution";
/// The op type of its backward.
const CONV_BACKWARD: &str = "aten::convolution_backward";

pub(crate) fn plan(input: &BaselineInput<'_>) -> Result<Plan, BaselineError> {
    let (g, live) = (input.graph, input.live);
    let acc = common::accesses(g, live);
    let mut events = Event::releases_after_last_use(live);
    let Some(bw_start) = g.ops().iter().find(|o| o.phase == Phase::Backward) else {
        // No backward pass: nothing is saved for it, nothing to offload.
        return Ok(common::assemble(events));
    };
    // Backward layers end at each convolution backward, in execution order.
    let conv_bw: Vec<OpId> = g
        .ops()
        .iter()
        .filter(|o| o.phase == Phase::Backward && o.op_type == CONV_BACKWARD)
        .map(|o| o.id)
        .collect();
    // The op after which backward starts; op ids run in execution order.
    let before_bw = OpId(bw_start.id.0.saturating_sub(1));
    let mut offloaded = vec![false; live.storages.len()];
    for op in g.ops() {
        if op.phase != Phase::Forward || op.op_type != CONV {
            continue;
        }
        let Some(&x) = op.inputs.first() else {
            continue;
        };
        let s = live.storage_of[x.index()];
        if live.storages[s.index()].persistent || offloaded[s.index()] {
            continue;
        }
        let ops = &acc[s.index()];
        let last_forward = ops
            .iter()
            .copied()
            .rfind(|&o| g.op(o).phase == Phase::Forward);
        let first_backward = ops
            .iter()
            .copied()
            .find(|&o| g.op(o).phase == Phase::Backward);
        let (Some(last_forward), Some(first_backward)) = (last_forward, first_backward) else {
            continue;
        };
        offloaded[s.index()] = true;
        // The layer that needs it, and when the layer before it starts.
        let layer = conv_bw.partition_point(|&c| c < first_backward);
        let issue = match layer {
            0 | 1 => before_bw,
            j => conv_bw[j - 2],
        };
        let root = live.storages[s.index()].root;
        events.push(Event {
            trigger: Trigger::After(last_forward),
            delay_ns: 0,
            kind: EventKind::SwapOut,
            tensor: root,
        });
        events.push(Event {
            // Never before the swap-out (a graph whose phases interleave).
            trigger: Trigger::After(issue.max(last_forward)),
            delay_ns: 0,
            kind: EventKind::SwapIn,
            tensor: root,
        });
    }
    Ok(common::assemble(events))
}
