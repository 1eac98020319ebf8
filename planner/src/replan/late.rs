//! When a job that stays late beyond its plan asks for a re-plan: at
//! once at first, then after more and more late iterations while the
//! re-plans do not make it clearly less late.

/// A job's iterations late beyond its plan since the last on time. A
/// re-plan that does not make the job clearly less late (on a host whose
/// copies contend with its kernels, say) is not repeated at every
/// iteration: each such re-plan doubles the late iterations the next one
/// waits for, up to 2^[`LATE_BACKOFF`]. The leads keep growing meanwhile,
/// so the next plan carries every late prefetch seen.
#[derive(Debug, Clone, Default)]
pub(super) struct LateStreak {
    /// How late the least late iteration of the streak was, ns.
    least_ns: u64,
    /// Late iterations since the last re-plan asked for.
    since: u32,
    /// Re-plans asked for in a row that did not make the job clearly
    /// less late.
    futile: u32,
}

/// At most this many doublings of the late iterations a late-prefetch
/// re-plan waits for (16 iterations).
const LATE_BACKOFF: u32 = 4;

impl LateStreak {
    /// One iteration `late_ns` late beyond its plan (0: on time); true
    /// when a re-plan for it is due.
    pub(super) fn due(&mut self, late_ns: u64) -> bool {
        if late_ns == 0 {
            *self = LateStreak::default();
            return false;
        }
        self.since += 1;
        // Not 10% less late than the least late iteration of the streak
        // (jitter makes single iterations look better or worse).
        let futile = self.least_ns > 0 && late_ns * 10 >= self.least_ns * 9;
        self.least_ns = if self.least_ns == 0 {
            late_ns
        } else {
            self.least_ns.min(late_ns)
        };
        let wait = if futile {
            1 << self.futile.min(LATE_BACKOFF)
        } else {
            1
        };
        if self.since < wait {
            return false;
        }
        self.futile = if futile { self.futile + 1 } else { 0 };
        self.since = 0;
        true
    }
}
