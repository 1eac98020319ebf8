//! Eviction, for Capuchin's passive mode
//! ([`ExecOptions::evict_budget_bytes`]) and for the guard of the job's
//! memory limit: when an allocation would take the job over its budget,
//! evict resident storages to the host, least recently used first, and
//! fetch them back on demand.
//!
//! [`ExecOptions::evict_budget_bytes`]: crate::ExecOptions::evict_budget_bytes

use tensile_graph::{OpId, StorageId};
use tensile_planner::guard::{Candidate, victims};
use tensile_swap_executor::{CopyEngine, Dir};

use crate::guard::Room;
use crate::machine::Executor;
use crate::state::{Device, Host, Wake};

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

    /// The next op from the current one on that reads or writes `s` (the
    /// number of ops when none does before the iteration ends).
    pub(crate) fn next_use(&self, s: StorageId) -> u64 {
        let uses = &self.uses[s.index()];
        let i = uses.partition_point(|&k| (k as usize) < self.pc);
        uses.get(i)
            .map_or(self.graph.ops().len() as u64, |&k| u64::from(k))
    }

    pub(crate) fn touch(&mut self, op: OpId, now: u64) {
        for s in self.storages_of(op) {
            self.last_use[s.index()] = now;
        }
    }

    /// Before `op` (the op itself, or a recomputation for `current`)
    /// allocates its outputs and the passive swap-ins of its inputs: if that
    /// would take the job over its budget (Capuchin's) or its limit (the
    /// guard's, [`Executor::set_limit`]), evicts resident storages that
    /// neither op touches, least recently used first, until what is being
    /// freed makes room. Under Capuchin's budget only non-persistent
    /// storages go; the guard takes persistent ones too. A victim with a
    /// valid host copy is dropped at once; any other is copied out first
    /// and freed when its copy ends (never lose data, never free under a
    /// copy). Says when to look again while frees are in flight. With
    /// nothing left to evict or wait for, Capuchin's op runs over its budget
    /// (a budget below the op's working set must not deadlock), while the
    /// guard's waits for memory to free elsewhere ([`Room::Full`]).
    ///
    /// [`Executor::set_limit`]: crate::Executor::set_limit
    pub(crate) fn make_room(&mut self, op: OpId, current: OpId, now: u64) -> Room {
        let capuchin = self.options.evict_budget_bytes;
        let Some(budget) = capuchin.into_iter().chain(self.limit).min() else {
            return Room::Go;
        };
        // The guard's limit binds (it is at or under Capuchin's budget).
        let guard = self.limit.is_some_and(|l| capuchin.is_none_or(|c| l <= c));
        let mine = self.storages_of(op);
        let need: u64 = mine
            .iter()
            .filter(|s| !self.slots[s.index()].on_device())
            .map(|&s| self.bytes(s))
            .sum();
        if need == 0 || self.mem + need <= budget {
            return Room::Go;
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
        if guard && self.limit_may_rise && self.mem.saturating_sub(freeing) + need > budget {
            // Other jobs will free memory: wait for them (or for the frees
            // in flight) rather than evict.
            self.blocked = Some((op, need, budget));
            return Room::Full;
        }
        let candidates: Vec<Candidate> = (0..self.slots.len())
            .map(|i| StorageId(i as u32))
            .filter(|s| {
                let slot = &self.slots[s.index()];
                let st = &self.live.storages[s.index()];
                slot.on_device()
                    && slot.writing().is_none()
                    && !slot.release_pending
                    && slot.ready(now)
                    && (guard || !st.persistent)
                    && st.bytes > 0
                    && !touched.contains(s)
            })
            // Capuchin: least recently used first. The guard: the one used
            // again last first (`tensile_planner::guard`, the hook's rule too).
            .map(|s| {
                let bytes = self.bytes(s);
                if guard {
                    Candidate::used_again_last(s.0, bytes, self.next_use(s))
                } else {
                    Candidate::least_recently_used(s.0, bytes, self.last_use[s.index()])
                }
            })
            .collect();
        for c in victims(candidates, self.mem.saturating_sub(freeing), need, budget) {
            let s = StorageId(c.storage);
            let bytes = c.bytes;
            self.cur
                .evictions
                .push((self.live.storages[s.index()].root, op));
            if guard {
                self.cur.guard_evictions += 1;
            }
            if self.slots[s.index()].host_valid() {
                self.free(s);
                continue;
            }
            let copy = self.submit(s, Dir::ToHost, now);
            self.slots[s.index()].host = Host::Writing { copy, keep: false };
            self.cur.passive_swaps += 1;
            self.cur.swapped_bytes += bytes;
            let end = Wake::of(copy);
            soonest = Some(soonest.map_or(end, |x| x.min(end)));
        }
        if self.mem + need <= budget {
            return Room::Go;
        }
        if guard && soonest.is_none() {
            // Prefetches on their way become evictable once they land.
            soonest = self
                .slots
                .iter()
                .enumerate()
                .filter(|(i, s)| {
                    matches!(s.device, Device::Arriving(_))
                        && !touched.contains(&StorageId(*i as u32))
                })
                .filter_map(|(_, s)| s.ready_at())
                .min();
        }
        match soonest {
            Some(w) => Room::Wait(w),
            None if guard => {
                self.blocked = Some((op, need, budget));
                Room::Full
            }
            None => Room::Go,
        }
    }
}
