//! A copy channel's occupancy: disjoint half-open intervals `[start, end)` in
//! nanoseconds, with earliest-fit and latest-fit searches for a free slot.

/// Disjoint busy intervals, sorted by start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IntervalSet {
    busy: Vec<(u64, u64)>,
}

impl IntervalSet {
    pub fn new() -> IntervalSet {
        IntervalSet::default()
    }

    pub fn busy(&self) -> &[(u64, u64)] {
        &self.busy
    }

    /// Index of the first interval ending after `t`.
    fn first_ending_after(&self, t: u64) -> usize {
        self.busy.partition_point(|&(_, e)| e <= t)
    }

    /// The earliest `start >= lo` such that `[start, start + len)` is free and
    /// `start + len <= hi`.
    pub fn earliest_fit(&self, lo: u64, hi: u64, len: u64) -> Option<u64> {
        first_fit(
            self.busy[self.first_ending_after(lo)..].iter().copied(),
            lo,
            hi,
            len,
        )
    }

    /// The latest `start >= lo` such that `[start, start + len)` is free and
    /// `start + len <= hi`.
    pub fn latest_fit(&self, lo: u64, hi: u64, len: u64) -> Option<u64> {
        let mut end = hi;
        let upto = self.busy.partition_point(|&(s, _)| s < hi);
        for &(s, e) in self.busy[..upto].iter().rev() {
            let start = end.checked_sub(len)?;
            if start < lo {
                return None;
            }
            if start >= e {
                return Some(start);
            }
            end = end.min(s);
        }
        let start = end.checked_sub(len)?;
        (start >= lo).then_some(start)
    }

    /// The set of the given intervals (empty ones dropped), and whether any
    /// two of them overlap (then the set holds the first of each overlapping
    /// pair only).
    pub fn from_intervals(mut v: Vec<(u64, u64)>) -> (IntervalSet, bool) {
        v.retain(|&(a, b)| a < b);
        v.sort_unstable();
        let mut busy: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        let mut overlap = false;
        for (a, b) in v {
            match busy.last() {
                Some(&(_, e)) if e > a => overlap = true,
                _ => busy.push((a, b)),
            }
        }
        (IntervalSet { busy }, overlap)
    }

    /// Whether `[start, end)` overlaps nothing busy.
    pub fn is_free(&self, start: u64, end: u64) -> bool {
        let i = self.first_ending_after(start);
        self.busy.get(i).is_none_or(|&(s, _)| s >= end)
    }

    /// Marks `[start, end)` busy. Returns false (and changes nothing) when it
    /// overlaps a busy interval.
    pub fn insert(&mut self, start: u64, end: u64) -> bool {
        if start >= end {
            return start == end;
        }
        if !self.is_free(start, end) {
            return false;
        }
        let at = self.busy.partition_point(|&(s, _)| s < start);
        self.busy.insert(at, (start, end));
        true
    }

    /// Total busy time.
    pub fn total(&self) -> u64 {
        self.busy.iter().map(|&(s, e)| e - s).sum()
    }
}

/// The earliest `start >= lo` such that `[start, start + len)` overlaps no
/// interval of `busy` and `start + len <= hi`. `busy` comes in order of start
/// but need not be disjoint (an interval that ends by `start` is passed
/// over), so that the planner's searches can run over a channel's copies as
/// they stand, less the one being moved, without building a set first.
pub(crate) fn first_fit(
    busy: impl IntoIterator<Item = (u64, u64)>,
    lo: u64,
    hi: u64,
    len: u64,
) -> Option<u64> {
    let mut start = lo;
    for (s, e) in busy {
        if e <= start {
            continue;
        }
        if start.checked_add(len)? > hi {
            return None;
        }
        if start + len <= s {
            return Some(start);
        }
        start = e;
    }
    (start.checked_add(len)? <= hi).then_some(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[(u64, u64)]) -> IntervalSet {
        let mut s = IntervalSet::new();
        for &(a, b) in v {
            assert!(s.insert(a, b));
        }
        s
    }

    #[test]
    fn fits_around_busy_intervals() {
        let s = set(&[(10, 20), (30, 40)]);
        assert_eq!(s.earliest_fit(0, 100, 10), Some(0));
        assert_eq!(s.earliest_fit(5, 100, 10), Some(20));
        assert_eq!(s.earliest_fit(5, 100, 11), Some(40));
        assert_eq!(s.earliest_fit(5, 50, 11), None);
        assert_eq!(s.latest_fit(0, 100, 10), Some(90));
        assert_eq!(s.latest_fit(0, 35, 10), Some(20));
        assert_eq!(s.latest_fit(0, 30, 10), Some(20));
        assert_eq!(s.latest_fit(0, 20, 10), Some(0));
        assert_eq!(s.latest_fit(0, 30, 11), None);
        assert_eq!(s.latest_fit(1, 30, 11), None);
        assert_eq!(s.latest_fit(0, 5, 10), None);
    }

    #[test]
    fn first_fit_passes_over_overlapping_and_finished_intervals() {
        // Sorted by start, overlapping: (0, 50) covers (10, 20).
        let busy = [(0, 50), (10, 20), (45, 60), (70, 80)];
        assert_eq!(first_fit(busy, 0, 100, 10), Some(60));
        assert_eq!(first_fit(busy, 0, 100, 11), Some(80));
        assert_eq!(first_fit(busy, 0, 90, 11), None);
        assert_eq!(first_fit(busy, 85, 100, 10), Some(85));
        assert_eq!(first_fit(busy, 0, u64::MAX, 1 << 40), Some(80));
        assert_eq!(first_fit([], 7, 7, 0), Some(7));
        assert_eq!(first_fit([], 7, 7, 1), None);
        assert_eq!(first_fit([], u64::MAX, u64::MAX, 1), None);
    }

    #[test]
    fn earliest_fit_is_first_fit_over_the_set() {
        let s = set(&[(10, 20), (20, 25), (30, 40), (60, 61)]);
        for lo in 0..70 {
            for len in 0..25 {
                for hi in [lo, 35, 50, 70, 100u64] {
                    let want = (lo..=hi.saturating_sub(len))
                        .find(|&t| t + len <= hi && s.is_free(t, t + len));
                    assert_eq!(s.earliest_fit(lo, hi, len), want, "{lo} {hi} {len}");
                }
            }
        }
    }

    #[test]
    fn edges_are_half_open() {
        let mut s = set(&[(10, 20)]);
        assert!(s.is_free(0, 10));
        assert!(s.is_free(20, 30));
        assert!(!s.is_free(19, 21));
        assert!(!s.is_free(0, 100));
        assert!(!s.insert(5, 11));
        assert!(s.insert(20, 25));
        assert_eq!(s.busy(), &[(10, 20), (20, 25)]);
        assert_eq!(s.total(), 15);
    }

    #[test]
    fn from_intervals_sorts_and_reports_overlaps() {
        let (s, overlap) = IntervalSet::from_intervals(vec![(30, 40), (10, 20), (5, 5), (20, 30)]);
        assert_eq!(s.busy(), &[(10, 20), (20, 30), (30, 40)]);
        assert!(!overlap);
        let (s, overlap) = IntervalSet::from_intervals(vec![(10, 20), (15, 25), (25, 30)]);
        assert_eq!(s.busy(), &[(10, 20), (25, 30)]);
        assert!(overlap);
    }

    #[test]
    fn a_task_covering_the_window_leaves_nothing() {
        let s = set(&[(0, 100)]);
        assert_eq!(s.earliest_fit(10, 90, 1), None);
        assert_eq!(s.latest_fit(10, 90, 1), None);
    }
}
