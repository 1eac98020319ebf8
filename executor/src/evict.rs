//! Capuchin's passive mode ([`ExecOptions::evict_budget_bytes`]): when an
//! allocation would take the job over its budget, evict resident storages
//! to the host, least recently used first, and fetch them back on demand.
//!
//! [`ExecOptions::evict_budget_bytes`]: crate::ExecOptions::evict_budget_bytes

use tensile_graph::{OpId, StorageId};
use tensile_swap_executor::{CopyEngine, Dir};

use crate::machine::Executor;
use crate::state::{Host, Wake};

impl<C: CopyEngine> Executor<'_, C> {
    /// The storages `op` reads or writes, each once.
    fn storages_of(&self, op: OpId) -> Vec<StorageId> {
        let o = self.graph.op(op);
        let mut out: Vec<StorageId> = o
            .inputs
            .iter()
            .chain(&o.outputs)
            .map(|t| self.live.storage_of[t.index()])
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    pub(crate) fn touch(&mut self, op: OpId, now: u64) {
        for s in self.storages_of(op) {
            self.last_use[s.index()] = now;
        }
    }

    /// Before `op` (the op itself, or a recomputation for `current`)
    /// allocates its outputs and the passive swap-ins of its inputs: if that
    /// would take the job over the budget, evicts resident non-persistent
    /// storages that neither op touches, least recently used first, until
    /// what is being freed makes room. A victim with a valid host copy is
    /// dropped at once; any other is copied out first and freed when its
    /// copy ends (never lose data, never free under a copy). Returns when to
    /// look again while frees are in flight; `None` when the op may run:
    /// within the budget, or over it with nothing left to evict or wait for
    /// (a budget below the op's working set must not deadlock).
    pub(crate) fn make_room(&mut self, op: OpId, current: OpId, now: u64) -> Option<Wake> {
        let budget = self.options.evict_budget_bytes?;
        let mine = self.storages_of(op);
        let need: u64 = mine
            .iter()
            .filter(|s| !self.slots[s.index()].on_device())
            .map(|&s| self.bytes(s))
            .sum();
        if need == 0 || self.mem + need <= budget {
            return None;
        }
        let mut touched = mine;
        touched.extend(self.storages_of(current));
        // Frees already under way: finished swap-outs and releases that
        // wait for a copy (a prefetch still in the queue has no end yet).
        let mut freeing = 0u64;
        let mut soonest = None::<Wake>;
        for (i, slot) in self.slots.iter().enumerate() {
            let end = match (slot.host, slot.release_pending) {
                (Host::Writing { copy, keep: false }, _) => Some(Wake::of(copy)),
                (Host::Writing { .. }, _) => None,
                (_, true) => slot.ready_at(),
                (_, false) => None,
            };
            if let (Some(end), true) = (end, slot.on_device()) {
                freeing += self.live.storages[i].bytes;
                soonest = Some(soonest.map_or(end, |x| x.min(end)));
            }
        }
        let mut victims: Vec<(u64, StorageId)> = (0..self.slots.len())
            .map(|i| StorageId(i as u32))
            .filter(|s| {
                let slot = &self.slots[s.index()];
                let st = &self.live.storages[s.index()];
                slot.on_device()
                    && slot.writing().is_none()
                    && !slot.release_pending
                    && slot.ready(now)
                    && !st.persistent
                    && st.bytes > 0
                    && !touched.contains(s)
            })
            .map(|s| (self.last_use[s.index()], s))
            .collect();
        victims.sort_unstable();
        for (_, s) in victims {
            if self.mem.saturating_sub(freeing) + need <= budget {
                break;
            }
            let bytes = self.bytes(s);
            self.cur
                .evictions
                .push((self.live.storages[s.index()].root, op));
            if self.slots[s.index()].host_valid() {
                self.free(s);
                continue;
            }
            let copy = self.submit(s, Dir::ToHost, now);
            self.slots[s.index()].host = Host::Writing { copy, keep: false };
            self.cur.passive_swaps += 1;
            self.cur.swapped_bytes += bytes;
            freeing += bytes;
            let end = Wake::of(copy);
            soonest = Some(soonest.map_or(end, |x| x.min(end)));
        }
        if self.mem + need <= budget {
            return None;
        }
        soonest
    }
}
