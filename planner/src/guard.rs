//! The memory guard's choice: which resident storages to move off the
//! device, and in what order, when an allocation would take a job over its
//! limit. One rule for every runtime that guards a limit: the executor
//! (the simulator and the worker) and the PyTorch hook, through
//! `tensile._core`. The drivers decide what may move (nothing the op at
//! hand uses, nothing with a copy in flight) and carry the moves out; this
//! decides which of those go.

/// A storage the guard may move, with its rank: lower ranks go first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub storage: u32,
    pub bytes: u64,
    pub rank: u64,
}

impl Candidate {
    /// Ranked for a memory limit: the storage used again last goes first
    /// (for a storage the plan swaps anyway that is its swap-out done
    /// early, and nothing comes back sooner than it must). `next_use` is
    /// when it is needed next in the driver's clock (an op index, a hook
    /// point); never needed again is the largest.
    pub fn used_again_last(storage: u32, bytes: u64, next_use: u64) -> Candidate {
        Candidate {
            storage,
            bytes,
            rank: u64::MAX - next_use,
        }
    }

    /// Ranked least recently used first (Capuchin's passive eviction),
    /// `last_use` in the driver's clock.
    pub fn least_recently_used(storage: u32, bytes: u64, last_use: u64) -> Candidate {
        Candidate {
            storage,
            bytes,
            rank: last_use,
        }
    }
}

/// The candidates to move, in the order to move them (by rank, then by
/// storage id), until `held + need` fits under `limit`: `held` is what the
/// job holds now (less what is already being freed), `need` what the
/// allocation adds. All of them when even that does not fit; none when it
/// fits already.
pub fn victims(mut candidates: Vec<Candidate>, held: u64, need: u64, limit: u64) -> Vec<Candidate> {
    candidates.sort_unstable_by_key(|c| (c.rank, c.storage));
    let mut held = held;
    let mut out = Vec::new();
    for c in candidates {
        if held.saturating_add(need) <= limit {
            break;
        }
        held = held.saturating_sub(c.bytes);
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[Candidate]) -> Vec<u32> {
        v.iter().map(|c| c.storage).collect()
    }

    #[test]
    fn the_storage_used_again_last_goes_first_until_the_allocation_fits() {
        let c = vec![
            Candidate::used_again_last(1, 100, 10),
            Candidate::used_again_last(2, 100, 50),
            Candidate::used_again_last(3, 100, 30),
            Candidate::used_again_last(4, 100, u64::MAX),
        ];
        // 400 held, 100 more wanted under 300: two must go, the last used first.
        assert_eq!(ids(&victims(c.clone(), 400, 100, 300)), vec![4, 2]);
        // It fits already: nothing moves.
        assert!(victims(c.clone(), 100, 100, 300).is_empty());
        // Even with every candidate moved it does not fit: all of them, in order.
        assert_eq!(ids(&victims(c, 400, 500, 300)), vec![4, 2, 3, 1]);
    }

    #[test]
    fn ties_go_by_storage_id_and_lru_ranks_the_oldest_first() {
        let tied = vec![
            Candidate::used_again_last(7, 10, 5),
            Candidate::used_again_last(3, 10, 5),
        ];
        assert_eq!(ids(&victims(tied, 20, 0, 5)), vec![3, 7]);
        let lru = vec![
            Candidate::least_recently_used(1, 10, 900),
            Candidate::least_recently_used(2, 10, 100),
        ];
        assert_eq!(ids(&victims(lru, 20, 0, 10)), vec![2]);
    }
}
