//! A longer cycle for coordinated jobs that do not fit the budget: every
//! job waits longer at its gate, so their peaks overlap less and the link
//! has more time. Steps of growing length are tried in turn (as long as no
//! job's cycle passes its max_overhead) until the jobs fit. Each step
//! stretches the first choice's cycle and phases alike. (Halving the gap
//! between the last step over the budget and the first within it finds
//! shorter cycles, but they leave the runs less slack: fewer runs of
//! `bench colocate` fit at EOR <= 0.05.)

use crate::coord::Coord;
use crate::job::Job;
use crate::{Deadline, MultiPlan, PlannerConfig, global_peak, search};

/// How much longer than its first choice a coordinated cycle may become,
/// tried in turn while the jobs do not fit the budget.
const CYCLE_STEPS: &[f64] = &[1.025, 1.05, 1.1, 1.2, 1.35, 1.5, 2.0, 2.5, 3.0, 4.0];

/// What lengthening plans from: the jobs before any swap, the cycle and
/// phases first chosen, and the planner's bounds.
pub(crate) struct Lengthen<'a, 'g> {
    pub(crate) fresh: &'a [Job<'g>],
    pub(crate) base: Coord,
    pub(crate) budget: u64,
    pub(crate) config: &'a PlannerConfig,
    pub(crate) limits: &'a [u64],
    pub(crate) deadline: Deadline,
}

/// The jobs planned at one cycle: their state, the cycle and phases,
/// whether the search stopped at its time cap, and what it reported.
type Trial<'g> = (Vec<Job<'g>>, Coord, bool, MultiPlan);

impl<'g> Lengthen<'_, 'g> {
    /// Lengthens `c` while `state` (planned at `c`) is over the budget,
    /// taking a longer cycle only where it lowers the aligned peak. Returns
    /// whether the search that made the final state was capped (`capped`
    /// if none was taken).
    pub(crate) fn lengthen(
        &self,
        state: &mut Vec<Job<'g>>,
        c: &mut Coord,
        mut capped: bool,
        out: &mut MultiPlan,
    ) -> bool {
        let most = self.limits.iter().copied().max().unwrap_or(0);
        for &f in CYCLE_STEPS {
            let now = global_peak(state, Some(c));
            if now <= self.budget || self.deadline.past() || self.cycle(f) > most {
                break;
            }
            let (trial, next, cap, tried) = self.at(f);
            if global_peak(&trial, Some(&next)) < now {
                (*state, *c, capped) = (trial, next, cap);
                out.diagnostics = tried.diagnostics;
                out.rounds += tried.rounds;
            }
        }
        capped
    }

    fn cycle(&self, f: f64) -> u64 {
        (self.base.cycle as f64 * f).round() as u64
    }

    /// The jobs planned afresh at the first cycle stretched by `f`, their
    /// phases stretched with it.
    fn at(&self, f: f64) -> Trial<'g> {
        let cycle = self.cycle(f);
        let next = Coord {
            cycle,
            phases: self
                .base
                .phases
                .iter()
                .map(|&p| ((p as f64 * f).round() as u64).min(cycle - 1))
                .collect(),
        };
        let mut trial = self.fresh.to_vec();
        next.install(&mut trial);
        let mut tried = MultiPlan::default();
        let cap = search(
            &mut trial,
            self.config,
            Some(&next),
            self.limits,
            self.deadline,
            &mut tried,
        );
        (trial, next, cap, tried)
    }
}
