//! The simulator's copy engine: FIFO lanes in virtual time with a bandwidth
//! and a fixed per-copy latency, one per direction (or one shared, half
//! duplex), for one job's share of the host link. A copy's end is known as
//! soon as it is queued.

use std::collections::HashMap;

use tensile_planner::CopyModel;

use crate::engine::{Copy, CopyEngine, CopyError, CopyId, CopyStatus, Dir};

#[derive(Debug, Clone)]
pub struct VirtualCopies {
    copy: CopyModel,
    d2h: f64,
    h2d: f64,
    free_at: [u64; 2],
    ends: HashMap<CopyId, u64>,
    next_id: u64,
    /// Every copy as (direction, start, end), for checks and plots.
    pub log: Vec<(Dir, u64, u64)>,
}

impl VirtualCopies {
    /// The share `share` (0..=1) of the link described by `copy`.
    pub fn new(copy: CopyModel, share: f64) -> VirtualCopies {
        VirtualCopies {
            copy,
            d2h: copy.d2h_bytes_per_s * share,
            h2d: copy.h2d_bytes_per_s * share,
            free_at: [0; 2],
            ends: HashMap::new(),
            next_id: 0,
            log: Vec::new(),
        }
    }
}

impl CopyEngine for VirtualCopies {
    fn submit(&mut self, c: Copy) -> CopyId {
        let (lane, bw) = match c.dir {
            Dir::ToHost => (0, self.d2h),
            Dir::ToDevice => (usize::from(!self.copy.half_duplex), self.h2d),
        };
        let start = c.not_before.max(self.free_at[lane]);
        let end = start + self.copy.duration_ns(c.bytes, bw);
        self.free_at[lane] = end;
        self.log.push((c.dir, start, end));
        let id = CopyId(self.next_id);
        self.next_id += 1;
        self.ends.insert(id, end);
        id
    }

    fn poll(&mut self, _now: u64) {}

    fn status(&self, id: CopyId) -> CopyStatus {
        match self.ends.get(&id) {
            Some(&end) => CopyStatus::Ends(end),
            None => CopyStatus::Failed(CopyError::Unknown(id)),
        }
    }

    fn forget(&mut self, id: CopyId) {
        self.ends.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use tensile_graph::StorageId;

    use super::*;

    fn link(half_duplex: bool) -> VirtualCopies {
        let model = CopyModel {
            half_duplex,
            ..CopyModel::duplex(1e9, 1e9, 0)
        };
        VirtualCopies::new(model, 1.0)
    }

    fn copy(dir: Dir, bytes: u64, not_before: u64) -> Copy {
        Copy {
            dir,
            storage: StorageId(0),
            bytes,
            not_before,
        }
    }

    #[test]
    fn copies_queue_per_direction_and_report_their_end() {
        let mut e = link(false);
        let a = e.submit(copy(Dir::ToHost, 1000, 0));
        let b = e.submit(copy(Dir::ToHost, 1000, 0));
        let c = e.submit(copy(Dir::ToDevice, 1000, 500));
        assert_eq!(e.status(a), CopyStatus::Ends(1000));
        assert_eq!(e.status(b), CopyStatus::Ends(2000));
        assert_eq!(e.status(c), CopyStatus::Ends(1500));
        e.forget(a);
        assert!(matches!(
            e.status(a),
            CopyStatus::Failed(CopyError::Unknown(_))
        ));
    }

    #[test]
    fn half_duplex_shares_one_queue() {
        let mut e = link(true);
        e.submit(copy(Dir::ToHost, 1000, 0));
        let b = e.submit(copy(Dir::ToDevice, 1000, 0));
        assert_eq!(e.status(b), CopyStatus::Ends(2000));
        assert_eq!(e.log.len(), 2);
    }
}
