//! Coordinated jobs on one common time line: every job's gate has the same
//! period (the cycle) and its own phase; memory is the aligned sum of the
//! jobs' curves, and copies of all jobs share the link's channels, each job
//! seeing the others' copies as busy time on its own periodic time line.

use crate::align::{Curve, aligned_sum_peak, disjoint_sum_peak};
use crate::intervals::IntervalSet;
use crate::job::Job;

/// The cycle and every job's phase within it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Coord {
    pub(crate) cycle: u64,
    pub(crate) phases: Vec<u64>,
}

/// Where the aligned sum peaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GlobalPeak {
    pub(crate) bytes: u64,
    /// The instant on the shared time line, in `[0, cycle)`.
    pub(crate) at: u64,
    /// Each job's step at that instant (`None`: waiting at its gate).
    pub(crate) steps: Vec<Option<usize>>,
}

/// A job's planned memory over one cycle.
pub(crate) fn curve(job: &Job<'_>) -> Curve {
    job.curve().clone()
}

impl Coord {
    /// The aligned sum's peak and where each job is then.
    pub(crate) fn peak(&self, state: &[Job<'_>]) -> GlobalPeak {
        let (bytes, at) = self.sum_peak(state, None);
        let steps = state
            .iter()
            .zip(&self.phases)
            .map(|(job, &phase)| {
                let local = (at + self.cycle - phase % self.cycle) % self.cycle;
                (local < job.iteration_ns()).then(|| job.boundary_at_or_before(local))
            })
            .collect();
        GlobalPeak { bytes, at, steps }
    }

    /// The aligned peak with job `j` replaced by `job`.
    pub(crate) fn peak_with(&self, state: &[Job<'_>], j: usize, job: &Job<'_>) -> u64 {
        self.sum_peak(state, Some((j, job))).0
    }

    /// [`aligned_sum_peak`] of the jobs' curves (`replace`: job `j`
    /// replaced by another), from each job's memoised curve. Where the jobs'
    /// iterations do not overlap on the shared time line (turns) it reads
    /// each job's idle memory and top alone ([`disjoint_sum_peak`]), which
    /// makes the same peak at the same instant.
    fn sum_peak(&self, state: &[Job<'_>], replace: Option<(usize, &Job<'_>)>) -> (u64, u64) {
        let job = |i: usize| match replace {
            Some((j, x)) if j == i => x,
            _ => &state[i],
        };
        let fast = (self.phases.len() == state.len())
            .then(|| {
                disjoint_sum_peak(
                    |i| job(i).curve(),
                    |i| job(i).curve_top(),
                    &self.phases,
                    self.cycle,
                )
            })
            .flatten();
        // Every test plan checks the disjoint path against the sweep.
        #[cfg(test)]
        if let Some(f) = fast {
            let curves: Vec<&Curve> = (0..state.len()).map(|i| job(i).curve()).collect();
            let swept = aligned_sum_peak(&curves, &self.phases, self.cycle);
            assert_eq!(f, swept, "the disjoint peak differs from the sweep's");
            tests::DISJOINT.set(tests::DISJOINT.get() + 1);
        }
        match fast {
            Some(p) => p,
            None => {
                let curves: Vec<&Curve> = (0..state.len()).map(|i| job(i).curve()).collect();
                aligned_sum_peak(&curves, &self.phases, self.cycle)
            }
        }
    }

    /// Gives every job the cycle and rebuilds it on its new periodic time
    /// line, then the others' copies as busy time on each.
    pub(crate) fn install(&self, state: &mut [Job<'_>]) {
        for job in state.iter_mut() {
            job.cycle = self.cycle;
            job.rebuild();
        }
        self.refresh_foreign(state);
        // The copies around host ops, placed where the others' leave room.
        if state.iter().any(|j| !j.host_ops.is_empty()) {
            for job in state.iter_mut() {
                job.place_host_copies();
            }
            self.refresh_foreign(state);
        }
    }

    /// Recomputes what job `j` alone sees of the other jobs' copies, as
    /// [`Coord::refresh_foreign`] does for every job: after a copy placed
    /// on one job, the job placed on next needs its view, not all of them.
    pub(crate) fn refresh_one(&self, state: &mut [Job<'_>], j: usize) {
        let chans = state.first().map_or(0, |x| x.chans.len());
        let cycle = self.cycle.max(1);
        let phase = self.phases[j] % cycle;
        for ch in 0..chans {
            let mut v = Vec::new();
            let mut global = Vec::new();
            for (i, (other, &p)) in state.iter().zip(&self.phases).enumerate() {
                if i == j {
                    continue;
                }
                global.clear();
                for &(a, b) in other.chans[ch].busy() {
                    shift_into(&mut global, a, b, p, cycle);
                }
                for &(a, b) in &global {
                    shift_into(&mut v, a, b, cycle - phase, cycle);
                }
            }
            state[j].set_foreign(ch, IntervalSet::from_intervals(v).0);
        }
    }

    /// Recomputes what each job sees of the other jobs' copies.
    pub(crate) fn refresh_foreign(&self, state: &mut [Job<'_>]) {
        let chans = state.first().map_or(0, |j| j.chans.len());
        let cycle = self.cycle.max(1);
        // Every job's copies on the shared time line, per channel.
        let global: Vec<Vec<Vec<(u64, u64)>>> = state
            .iter()
            .zip(&self.phases)
            .map(|(job, &phase)| {
                (0..chans)
                    .map(|ch| {
                        let mut v = Vec::new();
                        for &(a, b) in job.chans[ch].busy() {
                            shift_into(&mut v, a, b, phase, cycle);
                        }
                        v
                    })
                    .collect()
            })
            .collect();
        for (j, job) in state.iter_mut().enumerate() {
            let phase = self.phases[j] % cycle;
            for ch in 0..chans {
                let mut v = Vec::new();
                for (i, other) in global.iter().enumerate() {
                    if i != j {
                        for &(a, b) in &other[ch] {
                            shift_into(&mut v, a, b, cycle - phase, cycle);
                        }
                    }
                }
                job.set_foreign(ch, IntervalSet::from_intervals(v).0);
            }
        }
    }
}

/// Adds `[a, b)` moved by `by` on a periodic time line of length `cycle`,
/// split in two where it wraps.
fn shift_into(v: &mut Vec<(u64, u64)>, a: u64, b: u64, by: u64, cycle: u64) {
    let len = b.saturating_sub(a).min(cycle);
    let s = (a % cycle + by % cycle) % cycle;
    if s + len <= cycle {
        v.push((s, s + len));
    } else {
        v.push((s, cycle));
        v.push((0, s + len - cycle));
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;

    use super::shift_into;

    thread_local! {
        /// How many aligned peaks the disjoint path made (each checked
        /// against the sweep).
        pub(crate) static DISJOINT: Cell<usize> = const { Cell::new(0) };
    }

    #[test]
    fn intervals_move_round_the_cycle() {
        let mut v = Vec::new();
        shift_into(&mut v, 10, 20, 5, 100);
        shift_into(&mut v, 90, 99, 5, 100);
        shift_into(&mut v, 0, 10, 195, 100);
        assert_eq!(v, vec![(15, 25), (95, 100), (0, 4), (95, 100), (0, 5)]);
    }
}
