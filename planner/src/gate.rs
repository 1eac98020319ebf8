//! Iteration gates (phase coordination, Zico's TimeShift for k jobs): the
//! planner gives each coordinated job a period and a phase so that one
//! job's rising forward pass meets another's falling backward pass; the
//! driver (the simulator in virtual time, the worker and the hook on the
//! host's monotonic clock, which every process on one host shares) holds
//! each iteration until its slot. A late job does not wait: it starts at
//! once and catches up on later slots.
//!
//! The planner is pure and owns no clock: it fills in `period_ns` and
//! `phase_ns`; whoever publishes the plans sets `epoch_ns`, the same for
//! every job of one joint plan, on the clock the drivers share.

/// When a coordinated job may start its iterations: the slots
/// `epoch + phase + n * period` for every integer `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Gate {
    pub period_ns: u64,
    /// Offset of this job's slots within the period, `< period_ns`.
    pub phase_ns: u64,
    /// A time on the drivers' shared clock at which the cycle begins.
    pub epoch_ns: u64,
}

impl Gate {
    /// The epoch to give the gates of a joint plan published at `now`: the
    /// start of the cycle of the gates in use (`previous`, any job's: they
    /// share epoch and period) nearest to `now`, so that a job whose phase
    /// did not change finds its slots about where they were; `now` when no
    /// job had a gate.
    pub fn epoch_at(previous: Option<Gate>, now: u64) -> u64 {
        match previous {
            Some(g) => Gate { phase_ns: 0, ..g }.nearest_slot(now),
            None => now,
        }
    }

    /// The epoch to give the gates of plans published at `now` whose
    /// `anchor` job's next slot is to be at `now` (it stands where the new
    /// cycle begins); without one, [`Gate::epoch_at`] the gates in use.
    pub fn epoch_for(previous: Option<Gate>, anchor: Option<Gate>, now: u64) -> u64 {
        match anchor {
            Some(g) => {
                let period = g.period_ns.max(1);
                let phase = g.phase_ns % period;
                now.checked_sub(phase).unwrap_or(now + period - phase)
            }
            None => Gate::epoch_at(previous, now),
        }
    }

    /// The slot nearest to `now` (ties go to the earlier one); slots before
    /// the clock's zero do not exist, so near zero it may be a later one.
    pub fn nearest_slot(&self, now: u64) -> u64 {
        let period = i128::from(self.period_ns.max(1));
        let origin = i128::from(self.epoch_ns) + i128::from(self.phase_ns) % period;
        let offset = (i128::from(now) - origin).rem_euclid(period);
        let mut slot = i128::from(now) - offset;
        if offset > period / 2 {
            slot += period;
        }
        while slot < 0 {
            slot += period;
        }
        u64::try_from(slot).unwrap_or(u64::MAX)
    }
}

/// A driver's position on its job's slots: where the next iteration may
/// start. One per job; the simulator, the worker and the hook all keep
/// their gates through this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateClock {
    gate: Gate,
    /// The slot of the iteration about to start (`None`: not placed yet).
    next: Option<u64>,
}

impl GateClock {
    pub fn new(gate: Gate) -> GateClock {
        GateClock { gate, next: None }
    }

    pub fn gate(&self) -> Gate {
        self.gate
    }

    /// The slot of the iteration about to start, once placed (`None`
    /// before the first start on this gate).
    pub fn next_slot(&self) -> Option<u64> {
        self.next
    }

    /// Takes a new gate (a new plan). The slots are placed afresh at the
    /// next start: on the slot just passed when it passed less than a tenth
    /// of a period ago (a grid that did not move costs no wait), else on
    /// the next one (the job waits, at most a period, and is on its phase
    /// from the start instead of late for several iterations).
    pub fn set_gate(&mut self, gate: Gate) {
        if gate != self.gate {
            self.gate = gate;
            self.next = None;
        }
    }

    /// When the iteration that is ready to start at `now` may start (`now`
    /// itself when its slot has passed). Call once per iteration.
    pub fn start_at(&mut self, now: u64) -> u64 {
        let period = self.gate.period_ns.max(1);
        let slot = match self.next {
            None => {
                let n = self.gate.nearest_slot(now);
                // The slot at or before now, if the clock has one, and the
                // one after it.
                let (last, next) = if n <= now {
                    (Some(n), n.saturating_add(period))
                } else {
                    (n.checked_sub(period), n)
                };
                match last {
                    Some(l) if now - l <= period / 10 => l,
                    _ => next,
                }
            }
            // More than a period behind: skip the slots missed rather than
            // run iterations back to back to make them up.
            Some(s) if now > s.saturating_add(period) => {
                let n = self.gate.nearest_slot(now);
                if n > now { n - period } else { n }
            }
            Some(s) => s,
        };
        self.next = Some(slot.saturating_add(period));
        slot.max(now)
    }
}

// The cases of the one gate clock: the hook runs these types themselves
// (`tensile._core.Gate`, `GateClock`), whose binding
// `tests/python/test_hook_gates.py` checks.
#[cfg(test)]
mod tests {
    use super::*;

    fn gate(period: u64, phase: u64, epoch: u64) -> Gate {
        Gate {
            period_ns: period,
            phase_ns: phase,
            epoch_ns: epoch,
        }
    }

    #[test]
    fn the_nearest_slot_is_on_the_grid_on_both_sides_of_the_epoch() {
        let g = gate(100, 30, 1_000);
        assert_eq!(g.nearest_slot(1_030), 1_030);
        assert_eq!(g.nearest_slot(1_070), 1_030);
        assert_eq!(g.nearest_slot(1_081), 1_130);
        assert_eq!(g.nearest_slot(990), 1_030);
        assert_eq!(g.nearest_slot(960), 930);
        assert_eq!(g.nearest_slot(0), 30);
        // Near the clock's zero the slot before would be negative.
        let g = gate(211, 144, 0);
        assert_eq!(g.nearest_slot(0), 144);
        assert_eq!(g.nearest_slot(10), 144);
        let g = gate(211, 67, 0);
        assert_eq!(g.nearest_slot(0), 67);
        assert_eq!(g.nearest_slot(1_000_000_000_000_000_000) % 211, 67);
    }

    #[test]
    fn a_new_epoch_keeps_the_cycle_of_the_gates_in_use() {
        assert_eq!(Gate::epoch_at(None, 1_234), 1_234);
        let old = gate(100, 30, 1_000);
        assert_eq!(Gate::epoch_at(Some(old), 1_520), 1_500);
        assert_eq!(Gate::epoch_at(Some(old), 1_570), 1_600);
    }

    #[test]
    fn an_anchored_epoch_puts_the_anchor_jobs_slot_at_now() {
        let old = gate(100, 30, 1_000);
        // The anchor's slot is now, whatever the old grid.
        let anchor = gate(120, 40, 0);
        let epoch = Gate::epoch_for(Some(old), Some(anchor), 1_567);
        assert_eq!(epoch, 1_527);
        assert_eq!(gate(120, 40, epoch).nearest_slot(1_567), 1_567);
        // Near the clock's zero the epoch goes a period on.
        let epoch = Gate::epoch_for(None, Some(anchor), 10);
        assert_eq!(epoch, 90);
        assert_eq!(gate(120, 40, epoch).nearest_slot(10), 10);
        // No anchor: the old cycle, as `epoch_at`.
        assert_eq!(Gate::epoch_for(Some(old), None, 1_570), 1_600);
    }

    #[test]
    fn an_early_job_waits_for_its_slot_and_a_late_one_does_not() {
        let mut c = GateClock::new(gate(100, 40, 0));
        // First start: the next slot (the one before passed too long ago).
        assert_eq!(c.start_at(10), 40);
        // Early for the next slot: waits.
        assert_eq!(c.start_at(120), 140);
        // Late by 15: starts at once, the slot after stays on the grid.
        assert_eq!(c.start_at(255), 255);
        assert_eq!(c.start_at(300), 340);
    }

    #[test]
    fn a_job_more_than_a_period_behind_skips_the_missed_slots() {
        let mut c = GateClock::new(gate(100, 0, 0));
        assert_eq!(c.start_at(0), 0);
        // Next slot 100; the job comes at 450: slots 100..400 are gone.
        assert_eq!(c.start_at(450), 450);
        // It is back on the grid: the next slot is 500.
        assert_eq!(c.start_at(480), 500);
    }

    #[test]
    fn a_new_gate_replaces_the_slots_and_the_same_gate_keeps_them() {
        let mut c = GateClock::new(gate(100, 0, 0));
        assert_eq!(c.start_at(0), 0);
        c.set_gate(gate(100, 0, 0));
        assert_eq!(c.start_at(90), 100);
        c.set_gate(gate(100, 50, 0));
        // The new grid's slot 150 passed 30 ago, over a tenth of the
        // period: the job waits for 250.
        assert_eq!(c.start_at(180), 250);
        c.set_gate(gate(100, 70, 0));
        // 370 passed 5 ago: taken, late, no wait; then 470.
        assert_eq!(c.start_at(375), 375);
        assert_eq!(c.start_at(400), 470);
    }
}
