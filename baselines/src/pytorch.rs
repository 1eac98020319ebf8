//! Modern PyTorch offloading practice as fixed plans: activations saved for
//! backward go to host memory in forward and come back in backward, when
//! needed (`save_on_cpu`) or a little ahead (torchtune). Both policies are built on saved-tensor hooks, which see every
//! tensor autograd saves; here a "saved activation" is a non-persistent
//! storage made in forward and read in backward ([`common::saved_activations`]).
//!
//! # `save_on_cpu`
//! `torch.autograd.graph.save_on_cpu(pin_memory=False)`: the pack hook is
//! `tensor.cpu()`, a copy into pageable memory that blocks the compute
//! stream until it is done; the unpack hook is `tensor.to(device)`, which
//! copies back, again blocking, when the backward node runs. Modelled as a
//! swap-out of every saved activation after its last forward use, run with
//! [`ExecOptions::sync_swap_out`](tensile_executor::ExecOptions) (the next
//! op waits for the copy), no swap-in (the executor's passive swap-in is the
//! blocking on-demand fetch), and the vanilla release after the last
//! backward use.
//!
//! # `offload_stream`
//! torchtune's `OffloadActivations(use_streams=True)` (pinned memory,
//! `max_fwd_stash_size=5`, `min_offload_size=1024`). What it does:
//! - Forward: every saved tensor of at least `min_offload_size` bytes that
//!   is not a parameter or buffer is copied to host on a side stream, which
//!   first waits for the compute stream to reach the pack point; the device
//!   tensor is kept in a stash until its copy is done. Before offloading
//!   tensor `n`, the compute stream waits for the copies of stashed tensors
//!   `n - 5` and older and drops them: at most five offloads are in flight.
//! - Backward: when autograd unpacks an offloaded tensor for a node, the
//!   copy back is issued on the side stream and the compute stream waits
//!   for it before the node runs. There is no explicit prefetch, but the
//!   copies run ahead of compute on their own: the CPU launches backward
//!   nodes ahead of the GPU, and the side stream only waits (through an
//!   event recorded after each node) for the node before the previous one
//!   to finish before its next copy, so the copy for node `k` overlaps the
//!   compute of node `k - 1`. The maintainers call this implicit
//!   prefetching (torchtune issue #1905). Unpacked tensors are freed once
//!   the node that used them has run.
//!
//! Modelled as an asynchronous swap-out of every saved activation of at
//! least [`MIN_OFFLOAD_BYTES`] after its last forward use, run with
//! [`ExecOptions::max_swap_outs_in_flight`](tensile_executor::ExecOptions)
//! at [`OFFLOAD_STASH`] (an op waits while more copies are in flight), and a
//! swap-in one node ahead: the "nodes" are the backward ops that first read
//! an offloaded storage, in order, and the storages node `k` needs are
//! swapped in after node `k - 2` ends (as backward starts for the first
//! two), so that their copies overlap node `k - 1`. A copy that is late
//! stalls the op, as torchtune's compute stream waits. Releases are the
//! vanilla ones, after the last backward use.
//!
//! # What the model leaves out
//! Both hooks pack once per *save*, not per storage: a tensor that two
//! backward nodes save (a ReLU output read by the ReLU's and the next
//! layer's backward) is copied out twice and fetched back twice, each fetch
//! a fresh device buffer freed after its node; here it moves once each way
//! and stays on the device from its first backward use to its last. The
//! hooks copy at save time, which may precede the last forward use; here the
//! copy starts after it. `save_on_cpu` also copies saved parameters
//! (weights), which stay on the device anyway; here they do not move.
//! torchtune's stash counts every packed tensor (small ones and parameters
//! too) and keeps a device tensor until five later packs, not only until
//! its copy ends, and the last few tensors packed are used from the stash
//! in backward without a round trip. Its implicit prefetch needs the CPU to
//! run ahead of the GPU, and its one side stream orders copies of both
//! directions in one queue; the copy model has a lane per direction. Our
//! backward ops are finer than autograd nodes (a linear layer's backward
//! is three ops here, one node there). Copies from pageable memory
//! (`pin_memory=False`) are slower than pinned ones on real hardware; the
//! copy model has one bandwidth. So both models move fewer bytes, and more
//! quickly, than the real hooks: they understate the time these policies
//! cost. Memory can differ either way: the stash frees later, a tensor
//! fetched twice is on the device for less time.

use tensile_graph::{OpId, Phase};
use tensile_planner::{Event, EventKind, Plan, Trigger};

use crate::common::{self, Saved};
use crate::{BaselineError, BaselineInput};

/// How many offloads torchtune's OffloadActivations keeps in flight
/// (`max_fwd_stash_size`).
pub(crate) const OFFLOAD_STASH: usize = 5;

/// torchtune's `min_offload_size`: smaller saved tensors stay on the device.
pub(crate) const MIN_OFFLOAD_BYTES: u64 = 1024;

pub(crate) fn save_on_cpu(input: &BaselineInput<'_>) -> Result<Plan, BaselineError> {
    // No swap-in: each op fetches what it needs on demand.
    Ok(common::assemble(swap_outs(input, &offloaded(input, 0))))
}

pub(crate) fn offload_stream(input: &BaselineInput<'_>) -> Result<Plan, BaselineError> {
    let (g, live) = (input.graph, input.live);
    let offloaded = offloaded(input, MIN_OFFLOAD_BYTES);
    // The nodes that fetch, in backward order (op ids are execution order).
    let mut nodes: Vec<OpId> = offloaded.iter().map(|s| s.first_backward).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let bw_start = g
        .ops()
        .iter()
        .find(|o| o.phase == Phase::Backward)
        .map_or(OpId(0), |o| o.id);
    let before_bw = OpId(bw_start.0.saturating_sub(1));
    let mut events = swap_outs(input, &offloaded);
    for s in &offloaded {
        let k = nodes.partition_point(|&n| n < s.first_backward);
        let issue = match k {
            0 | 1 => before_bw,
            k => nodes[k - 2],
        };
        events.push(Event {
            // Never before the swap-out (a graph whose phases interleave).
            trigger: Trigger::After(issue.max(s.last_forward)),
            delay_ns: 0,
            kind: EventKind::SwapIn,
            tensor: live.storages[s.storage.index()].root,
        });
    }
    Ok(common::assemble(events))
}

/// The saved activations of at least `min_bytes`.
fn offloaded(input: &BaselineInput<'_>, min_bytes: u64) -> Vec<Saved> {
    let live = input.live;
    common::saved_activations(input.graph, live)
        .into_iter()
        .filter(|s| live.storages[s.storage.index()].bytes >= min_bytes)
        .collect()
}

/// The vanilla releases plus a swap-out of each of `saved` after its last
/// forward use. How the copies block is up to the executor options.
fn swap_outs(input: &BaselineInput<'_>, saved: &[Saved]) -> Vec<Event> {
    let live = input.live;
    let mut events = Event::releases_after_last_use(live);
    events.extend(saved.iter().map(|s| Event {
        trigger: Trigger::After(s.last_forward),
        delay_ns: 0,
        kind: EventKind::SwapOut,
        tensor: live.storages[s.storage.index()].root,
    }));
    events
}
