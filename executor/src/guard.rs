//! The guard of a job's memory limit ([`Executor::set_limit`]): what an
//! allocation does when the limit has no room for it. The run then never
//! holds more than the limit, whatever the latencies do: an op waits for
//! the job's own frees in flight, evicts (`evict.rs`), or waits for memory
//! to free elsewhere; a prefetch is held back until there is room, or its
//! op fetches it.

use tensile_graph::{OpId, StorageId};
use tensile_swap_executor::CopyEngine;

use crate::interface::{ExecError, Next};
use crate::machine::Executor;
use crate::state::{Device, Host, Wake};

/// Whether an allocation may go ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Room {
    Go,
    /// Not yet: look again then (a free in flight ends).
    Wait(Wake),
    /// Not until memory frees elsewhere.
    Full,
}

impl<C: CopyEngine> Executor<'_, C> {
    /// Before an iteration begins: room under the limit for its inputs (and,
    /// in the first iteration, its persistent state).
    pub(crate) fn start_room(&mut self, now: u64) -> Room {
        let Some(limit) = self.limit else {
            return Room::Go;
        };
        self.boundary_frees(now);
        // What the first iteration starts on the host is put there, not
        // on the device.
        let on_host = self.starts_on_host();
        let first = self.iteration == 0;
        let need: u64 = self
            .live
            .storages
            .iter()
            .enumerate()
            .filter(|(i, st)| {
                let slot = &self.slots[*i];
                if st.host_only {
                    false
                } else if st.persistent {
                    let starts_on_host = first && on_host.contains(&StorageId(*i as u32));
                    !(slot.on_device() || slot.host_valid() || starts_on_host)
                } else {
                    st.born.is_none()
                }
            })
            .map(|(_, st)| st.bytes)
            .sum();
        if self.mem + need <= limit {
            return Room::Go;
        }
        // Across-iteration swap-outs still in flight free their buffers.
        let soonest = self
            .slots
            .iter()
            .filter_map(|s| match s.host {
                Host::Writing { copy, keep: false } if !copy.done(now) => Some(Wake::of(copy)),
                _ => None,
            })
            .min();
        match soonest {
            Some(w) => Room::Wait(w),
            None => {
                self.blocked = Some((OpId(0), need, limit));
                Room::Full
            }
        }
    }

    /// Tells the driver to wait for memory, counting the stall.
    pub(crate) fn wait_for_memory(&mut self, now: u64) -> Next {
        self.memory_since.get_or_insert(now);
        Next::WaitForMemory
    }

    /// Starts the prefetches the limit held back, in the order they fired,
    /// where there is room now; drops those whose storage is back already
    /// (its op fetched it) or has no host copy to fetch.
    pub(crate) fn retry_deferred(&mut self, now: u64) {
        if self.deferred_ins.is_empty() {
            return;
        }
        for e in std::mem::take(&mut self.deferred_ins) {
            let s: StorageId = self.live.storage_of[e.tensor.index()];
            let slot = self.slots[s.index()];
            if slot.on_device() || !slot.host_valid() {
                continue;
            }
            if self.limit.is_some_and(|l| self.mem + self.bytes(s) > l) {
                self.deferred_ins.push(e);
                continue;
            }
            self.alloc(s, now);
            self.slots[s.index()].device = Device::Awaiting;
            self.queue.push(now, e);
        }
    }

    /// Why the job waits for memory, as an error, for a driver whose limit
    /// will not rise (the worker's `--memory-mb`): the op, the bytes it
    /// needs and the limit.
    pub fn no_memory(&self) -> Option<ExecError> {
        let (op, need, limit) = self.blocked?;
        Some(ExecError::NoMemory {
            op: op.0,
            name: self.graph.op(op).name.clone(),
            need,
            limit,
        })
    }
}
