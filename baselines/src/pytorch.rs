//! Modern PyTorch offloading practice as fixed plans: activations saved for
//! backward go to host memory in forward and come back on demand in
//! backward. Both policies are built on saved-tensor hooks, which see every
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
//! - Backward: when autograd unpacks an offloaded tensor, the copy back is
//!   issued on the side stream and the compute stream waits for it; there is
//!   no prefetch of later tensors. Unpacked tensors are freed once the
//!   node that used them has run (the side stream waits on an event).
//!
//! Modelled as an asynchronous swap-out of every saved activation of at
//! least [`MIN_OFFLOAD_BYTES`] after its last forward use, run with
//! [`ExecOptions::max_swap_outs_in_flight`](tensile_executor::ExecOptions)
//! at [`OFFLOAD_STASH`] (an op waits while more copies are in flight), no
//! swap-in (the executor fetches on demand and waits, as torchtune's compute
//! stream does), and the vanilla release after the last backward use.
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
//! its copy ends. Copies from pageable memory (`pin_memory=False`) are
//! slower than pinned ones on real hardware; the copy model has one
//! bandwidth. So both models copy less and more quickly than the real hooks
//! and free at least as early: they understate time and memory, not
//! overstate them.

use tensile_planner::{Event, EventKind, Plan, Trigger};

use crate::{BaselineError, BaselineInput, common};

/// How many offloads torchtune's OffloadActivations keeps in flight
/// (`max_fwd_stash_size`).
pub(crate) const OFFLOAD_STASH: usize = 5;

/// torchtune's `min_offload_size`: smaller saved tensors stay on the device.
pub(crate) const MIN_OFFLOAD_BYTES: u64 = 1024;

pub(crate) fn save_on_cpu(input: &BaselineInput<'_>) -> Result<Plan, BaselineError> {
    Ok(offload_saved(input, 0))
}

pub(crate) fn offload_stream(input: &BaselineInput<'_>) -> Result<Plan, BaselineError> {
    Ok(offload_saved(input, MIN_OFFLOAD_BYTES))
}

/// The vanilla releases plus a swap-out of every saved activation of at
/// least `min_bytes` after its last forward use; no swap-in: backward
/// fetches on demand. How the copies block is up to the executor options.
fn offload_saved(input: &BaselineInput<'_>, min_bytes: u64) -> Plan {
    let live = input.live;
    let mut events = common::release_events(live);
    for s in common::saved_activations(input.graph, live) {
        let st = &live.storages[s.storage.index()];
        if st.bytes < min_bytes {
            continue;
        }
        events.push(Event {
            trigger: Trigger::After(s.last_forward),
            delay_ns: 0,
            kind: EventKind::SwapOut,
            tensor: st.root,
        });
    }
    common::assemble(events)
}
