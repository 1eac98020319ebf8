//! `guard_victims()`: the memory guard's choice of what to move off the
//! device (`tensile_planner::guard`, the executor's rule), for the PyTorch
//! hook's `budget_mb`.

use pyo3::prelude::*;
use tensile_planner::guard::{Candidate, victims};

/// The storages to move off the device, in the order to move them, so
/// that `held + need` bytes fit under `limit`: from `candidates`, each
/// `(storage, bytes, next_use)` (when it is needed next in the caller's
/// clock), the one used again last first, ties by storage id. All of them
/// when even that does not fit; none when it fits already.
#[pyfunction]
pub(crate) fn guard_victims(
    candidates: Vec<(u32, u64, u64)>,
    held: u64,
    need: u64,
    limit: u64,
) -> Vec<u32> {
    let candidates = candidates
        .into_iter()
        .map(|(storage, bytes, next_use)| Candidate::used_again_last(storage, bytes, next_use))
        .collect();
    victims(candidates, held, need, limit)
        .into_iter()
        .map(|c| c.storage)
        .collect()
}
