//! Virtual-time copy channels: FIFO queues with a bandwidth and a fixed
//! per-copy latency, one per direction (or one shared, half duplex).

use tensile_planner::CopyModel;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    ToHost,
    ToDevice,
}

/// One job's share of the host link.
#[derive(Debug, Clone)]
pub struct Channels {
    copy: CopyModel,
    d2h: f64,
    h2d: f64,
    free_at: [u64; 2],
    /// Busy intervals, for checks and plots.
    pub log: Vec<(Dir, u64, u64)>,
}

impl Channels {
    /// The share `share` (0..=1) of the link described by `copy`.
    pub fn new(copy: CopyModel, share: f64) -> Channels {
        Channels {
            copy,
            d2h: copy.d2h_bytes_per_s * share,
            h2d: copy.h2d_bytes_per_s * share,
            free_at: [0; 2],
            log: Vec::new(),
        }
    }

    /// Queues a copy that may start at `not_before`; returns its end.
    pub fn submit(&mut self, dir: Dir, bytes: u64, not_before: u64) -> u64 {
        let (lane, bw) = match dir {
            Dir::ToHost => (0, self.d2h),
            Dir::ToDevice => (usize::from(!self.copy.half_duplex), self.h2d),
        };
        let start = not_before.max(self.free_at[lane]);
        let end = start + self.copy.duration_ns(bytes, bw);
        self.free_at[lane] = end;
        self.log.push((dir, start, end));
        end
    }
}
