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
    pub(crate) deadline: Deadline<'a>,
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
        let cap = search_coordinated(
            &mut trial,
            self.config,
            &next,
            self.limits,
            self.deadline,
            &mut tried,
        );
        (trial, next, cap, tried)
    }
}

/// How many times [`search_coordinated`] tries recomputing more first.
const RECOMPUTE_FIRST_TRIES: usize = 4;

/// [`search`] for coordinated jobs, `state` installed at `coord` and not
/// yet planned: swaps alone first (they add no time); where
/// `recompute_first` applies to this many jobs and the swaps leave the jobs
/// over the budget, the jobs are planned again from `state` as it came,
/// recomputing first what the swaps fell short by, then swapping around
/// the recomputations, and the lowest is kept; while that is still over
/// the budget, the recomputations' share grows by what it fell short by.
/// On a link the coordinated jobs' swaps fill, a recomputation inserted
/// after the swaps moves their copies into one another's and is refused;
/// inserted first, the swaps are placed around it.
pub(crate) fn search_coordinated(
    state: &mut Vec<Job<'_>>,
    config: &PlannerConfig,
    coord: &Coord,
    limits: &[u64],
    deadline: Deadline<'_>,
    out: &mut MultiPlan,
) -> bool {
    let installed = config
        .recompute_first
        .applies(state.len())
        .then(|| state.clone());
    let mut capped = search(state, config, Some(coord), limits, deadline, out);
    let (Some(budget), Some(installed)) = (config.budget_bytes, installed) else {
        return capped;
    };
    let mut best = global_peak(state, Some(coord));
    let mut short = 0;
    let start = global_peak(&installed, Some(coord));
    let mut last = best;
    for _ in 0..RECOMPUTE_FIRST_TRIES {
        if last <= budget || deadline.past() {
            break;
        }
        // Recomputation takes what the last plan fell short by, on top of
        // what it took then.
        short += last - budget;
        let mut trial = installed.clone();
        let swap: Vec<bool> = trial.iter().map(|j| j.settings.swap).collect();
        for j in trial.iter_mut() {
            j.settings.swap = false;
        }
        let first = PlannerConfig {
            budget_bytes: Some(start.saturating_sub(short)),
            stop_at_budget: true,
            ..*config
        };
        let mut tried = MultiPlan::default();
        search(
            &mut trial,
            &first,
            Some(coord),
            limits,
            deadline,
            &mut tried,
        );
        for (j, s) in trial.iter_mut().zip(swap) {
            j.settings.swap = s;
        }
        coord.refresh_foreign(&mut trial);
        let cap = search(
            &mut trial,
            config,
            Some(coord),
            limits,
            deadline,
            &mut tried,
        );
        last = global_peak(&trial, Some(coord));
        if last < best {
            best = last;
            *state = trial;
            out.diagnostics = tried.diagnostics;
            out.rounds += tried.rounds;
            capped = cap;
        }
    }
    capped
}
