//! The simulator's copy engine: FIFO lanes in virtual time with a bandwidth
//! and a fixed per-copy latency, one per direction (or one shared, half
//! duplex), for one job's share of the host link, or lanes that several
//! jobs' engines share at the link's full bandwidth (coordinated jobs, whose
//! plans place every job's copies on one common time line). A copy's end is
//! known as soon as it is queued.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;

use tensile_planner::CopyModel;

use crate::engine::{Copy, CopyEngine, CopyError, CopyId, CopyStatus, Dir, HostRun};

#[derive(Debug, Clone)]
pub struct VirtualCopies {
    copy: CopyModel,
    d2h: f64,
    h2d: f64,
    /// When each lane is free next; shared by the engines of one link.
    free_at: Rc<Cell<[u64; 2]>>,
    /// When this job's host is free next: its host ops run one after
    /// another on its own CPU threads, not shared with other jobs.
    host_free_at: u64,
    ends: HashMap<CopyId, u64>,
    next_id: u64,
    /// Every copy as (direction, start, end), for checks and plots.
    pub log: Vec<(Dir, u64, u64)>,
    /// Every host run as (start, end).
    pub host_log: Vec<(u64, u64)>,
}

impl VirtualCopies {
    /// The share `share` (0..=1) of the link described by `copy`.
    pub fn new(copy: CopyModel, share: f64) -> VirtualCopies {
        VirtualCopies {
            copy,
            d2h: copy.d2h_bytes_per_s * share,
            h2d: copy.h2d_bytes_per_s * share,
            free_at: Rc::new(Cell::new([0; 2])),
            host_free_at: 0,
            ends: HashMap::new(),
            next_id: 0,
            log: Vec::new(),
            host_log: Vec::new(),
        }
    }

    /// An engine on the same lanes as `self`, at the same bandwidth: copies
    /// of both queue behind each other (FIFO per lane across the engines).
    pub fn sharing_lanes(&self) -> VirtualCopies {
        VirtualCopies {
            free_at: Rc::clone(&self.free_at),
            host_free_at: 0,
            ends: HashMap::new(),
            next_id: 0,
            log: Vec::new(),
            host_log: Vec::new(),
            ..*self
        }
    }
}

impl CopyEngine for VirtualCopies {
    fn submit(&mut self, c: Copy) -> CopyId {
        let (lane, bw) = match c.dir {
            Dir::ToHost => (0, self.d2h),
            Dir::ToDevice => (usize::from(!self.copy.half_duplex), self.h2d),
        };
        let mut free_at = self.free_at.get();
        let start = c.not_before.max(free_at[lane]);
        let end = start + self.copy.duration_ns(c.bytes, bw);
        free_at[lane] = end;
        self.free_at.set(free_at);
        self.log.push((c.dir, start, end));
        let id = CopyId(self.next_id);
        self.next_id += 1;
        self.ends.insert(id, end);
        id
    }

    fn run_on_host(&mut self, run: HostRun) -> CopyId {
        let ready = run
            .after
            .iter()
            .filter_map(|c| self.ends.get(c).copied())
            .fold(run.not_before, u64::max);
        let start = ready.max(self.host_free_at);
        let end = start + self.copy.host_ns(run.bytes);
        self.host_free_at = end;
        self.host_log.push((start, end));
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
    fn engines_sharing_lanes_queue_behind_each_other() {
        let mut a = link(false);
        let mut b = a.sharing_lanes();
        let x = a.submit(copy(Dir::ToHost, 1000, 0));
        let y = b.submit(copy(Dir::ToHost, 1000, 0));
        let z = b.submit(copy(Dir::ToDevice, 1000, 0));
        assert_eq!(a.status(x), CopyStatus::Ends(1000));
        assert_eq!(b.status(y), CopyStatus::Ends(2000));
        assert_eq!(b.status(z), CopyStatus::Ends(1000));
        // Each engine keeps its own copies apart.
        assert_eq!((a.log.len(), b.log.len()), (1, 2));
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
