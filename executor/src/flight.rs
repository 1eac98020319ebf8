//! Copies in flight: submitting them to the engine, learning of their
//! ends and failures, and starting the swap events the Execution Queue
//! releases.

use tensile_graph::StorageId;
use tensile_planner::EventKind;
use tensile_swap_executor::{Copy, CopyEngine, CopyStatus, Dir};

use crate::machine::Executor;
use crate::state::{Device, Host, InFlight, Wake};

impl<C: CopyEngine> Executor<'_, C> {
    /// A copy no storage waits for any more: the engine may still be moving
    /// its bytes, so it is forgotten only once it has ended.
    pub(crate) fn retire(&mut self, copy: InFlight) {
        self.retired.push(copy);
    }

    /// Queues a copy of `s` on the engine.
    pub(crate) fn submit(&mut self, s: StorageId, dir: Dir, not_before: u64) -> InFlight {
        let bytes = self.bytes(s);
        let id = self.engine.submit(Copy {
            dir,
            storage: s,
            bytes,
            not_before,
        });
        let end = match self.engine.status(id) {
            CopyStatus::Ends(t) => Some(t),
            CopyStatus::Pending | CopyStatus::Failed(_) => None,
        };
        if !self.flying.contains(&s) {
            self.flying.push(s);
        }
        InFlight { id, end }
    }

    /// Learns from the engine what has completed or failed by `now`: ends
    /// that were not known, finished prefetches (which then no longer need
    /// the engine), and failures, which never lose data: a failed swap-out
    /// keeps the device buffer (and any release waits for nothing), a failed
    /// prefetch gives its buffer back so the op fetches the data on demand.
    pub(crate) fn refresh(&mut self, now: u64) {
        if self.flying.is_empty()
            && self.retired.is_empty()
            && self.host_runs.is_empty()
            && self.host_retry.is_empty()
        {
            return;
        }
        self.engine.poll(now);
        self.refresh_host(now);
        let engine = &mut self.engine;
        self.retired.retain(|c| match engine.status(c.id) {
            CopyStatus::Ends(t) if t <= now => {
                engine.forget(c.id);
                false
            }
            CopyStatus::Failed(_) => {
                engine.forget(c.id);
                false
            }
            CopyStatus::Ends(_) | CopyStatus::Pending => true,
        });
        let flying = std::mem::take(&mut self.flying);
        for s in flying {
            let i = s.index();
            if let Device::Arriving(mut c) = self.slots[i].device {
                match self.engine.status(c.id) {
                    CopyStatus::Ends(t) if t <= now => {
                        self.engine.forget(c.id);
                        self.slots[i].device = Device::Ready { since: t };
                    }
                    CopyStatus::Ends(t) => {
                        c.end = Some(t);
                        self.slots[i].device = Device::Arriving(c);
                    }
                    CopyStatus::Pending => {}
                    CopyStatus::Failed(_) => {
                        self.cur.failed_copies += 1;
                        self.engine.forget(c.id);
                        // A swap-out queued behind it may read the buffer:
                        // then it goes when that copy is done.
                        self.slots[i].device = Device::Invalid;
                        if self.slots[i].writing().is_none() {
                            self.free(s);
                        }
                    }
                }
            }
            if let Host::Writing { mut copy, keep } = self.slots[i].host {
                match self.engine.status(copy.id) {
                    CopyStatus::Ends(t) => {
                        copy.end = Some(t);
                        self.slots[i].host = Host::Writing { copy, keep };
                    }
                    CopyStatus::Pending => {}
                    CopyStatus::Failed(_) => {
                        self.cur.failed_copies += 1;
                        self.engine.forget(copy.id);
                        self.engine.discard_host(s);
                        self.slots[i].host = Host::None;
                        self.slots[i].release_pending = false;
                        self.slots[i].out_failed = true;
                    }
                }
            }
            let slot = self.slots[i];
            if matches!(slot.device, Device::Arriving(_)) || slot.writing().is_some() {
                self.flying.push(s);
            }
        }
        self.retry_host(now);
        for (at, s) in std::mem::take(&mut self.deferred_outs) {
            match self.slots[s.index()].device {
                Device::Arriving(InFlight { end: None, .. }) => self.deferred_outs.push((at, s)),
                _ => self.start_swap_out(s, at),
            }
        }
    }

    /// Starts the swap events that are due, in fire order, on the engine.
    pub(crate) fn run_queue(&mut self, now: u64) {
        for (at, e) in self.queue.pop_due(now) {
            let s = self.live.storage_of[e.tensor.index()];
            match e.kind {
                EventKind::SwapOut => {
                    // Behind a prefetch whose end is not known yet: start
                    // it once the data is there (virtual time knows the end
                    // and queues it after).
                    if let Device::Arriving(InFlight { end: None, .. }) =
                        self.slots[s.index()].device
                    {
                        self.deferred_outs.push((at, s));
                    } else {
                        self.start_swap_out(s, at);
                    }
                }
                EventKind::SwapIn => {
                    let slot = self.slots[s.index()];
                    if let Host::Updating(_) = slot.host {
                        // A host run rewrites its data: the copy starts
                        // once it has ended.
                        self.parked_ins.push(e);
                        continue;
                    }
                    if let Host::Writing { copy, .. } = slot.host {
                        self.slots[s.index()].host = Host::Writing { copy, keep: true };
                        continue;
                    }
                    if slot.on_device() && slot.device != Device::Awaiting {
                        continue;
                    }
                    // Fired while its buffer was still there (a release
                    // waiting for a swap-out), the prefetch is due after
                    // that buffer went (the swap-out ended and freed it, or
                    // its op ran first, fetched the data on demand and
                    // released it after its last use). Still wanted, it
                    // needs a buffer again, as a prefetch into storage not
                    // on the device does; else it is dropped. Never a copy
                    // into no buffer: a real engine takes what a prefetch
                    // brings for the storage's buffer, which would then be
                    // one the executor neither counts nor frees.
                    if !slot.on_device() {
                        let used_again = self.live.storages[s.index()].persistent
                            || self.next_use(s) < self.graph.ops().len() as u64;
                        if !used_again || !slot.host_valid() || !self.prefetch_buffer(e, s, now) {
                            continue;
                        }
                    }
                    let copy = self.submit(s, Dir::ToDevice, at);
                    let slot = &mut self.slots[s.index()];
                    slot.device = Device::Arriving(copy);
                    slot.release_pending = false;
                }
                _ => {}
            }
        }
    }

    /// Copies `s` to the host, if its data is on the device (or arriving).
    /// Never a storage a host op writes: its host copy is the current one.
    pub(crate) fn start_swap_out(&mut self, s: StorageId, at: u64) {
        let slot = self.slots[s.index()];
        // Copied even when a host copy exists: the plan counted the copy's
        // time and the buffer until it completes.
        if !slot.on_device()
            || slot.device == Device::Invalid
            || self.live.storages[s.index()].host_master
        {
            return;
        }
        let not_before = match slot.ready_at() {
            Some(Wake::At(t)) => at.max(t),
            _ => at,
        };
        let copy = self.submit(s, Dir::ToHost, not_before);
        self.slots[s.index()].out_failed = false;
        // A second swap-out while one is in flight: the host copy is
        // complete when the later one is; a prefetch that came meanwhile
        // still keeps the buffer.
        let keep = match slot.host {
            Host::Writing { copy: old, keep } => {
                self.retire(old);
                keep
            }
            Host::None | Host::Valid | Host::Updating(_) => false,
        };
        self.slots[s.index()].host = Host::Writing { copy, keep };
        self.cur.swapped_bytes += self.bytes(s);
    }
}
