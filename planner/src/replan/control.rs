//! The re-planner's controller state, in two parts: which plans are in
//! use and how far they are trusted ([`Plans`]), and what the measurements
//! since the last plan ask of the next one ([`Due`], with [`Held`]). Their
//! transitions are the methods here, taken on the re-planner's events:
//!
//! - measurements folded in ([`Replanner::observe`]): [`Due::raise`] to
//!   what the iteration asks for, [`Held::asked`], and, for plans on trial,
//!   [`Plans::set_trial_stretch`] or a [`Due::Revert`];
//! - a plan handed out ([`Replanner::plan_due`], `plan_all`): the fallback
//!   taken back ([`Plans::take_fallback`]), or the new plans
//!   [`Plans::handed_out`] and put on trial where they only shorten or
//!   compress the period ([`Plans::shorter_on_trial`],
//!   [`Plans::compressed`]); [`Due::Nothing`] and [`Held::Nothing`] again;
//! - a job added or removed, the configuration or a job's base changed:
//!   [`Plans::start_over`], [`Due::start_over`], [`Held::Void`].
//!
//! What stays per job (settling after a switch, streaks of overruns,
//! underruns and room to spare, late prefetches) is in `ReplanJob`.
//!
//! [`Replanner::observe`]: super::Replanner::observe
//! [`Replanner::plan_due`]: super::Replanner::plan_due

use crate::MultiPlan;

/// The plans in use, as handed out.
#[derive(Debug, Clone)]
pub(super) struct InUse {
    /// The plans, without their anchor: plans handed out again later (a
    /// fallback, a stretch) take the anchor of their own time.
    pub(super) plans: MultiPlan,
    /// The gates' period they were handed out on before any stretch of
    /// them (0: not gated): how far [`Replanner::unstretched`] may take
    /// them back. A stretch is sized from one early iteration: three
    /// ResNet-50 copies at 0.75 of the batch (seed 1) were stretched from
    /// 233.2 to 251.0 ms and then ran 232 ms iterations (`d9fdeeb`).
    ///
    /// [`Replanner::unstretched`]: super::Replanner::unstretched
    pub(super) origin_ns: u64,
    /// They are those before them with only their gates moved (a stretch,
    /// an undone one): a switch to them moves no storage, so the jobs
    /// leave out one iteration after it, not two
    /// ([`SETTLE_GATES`](super::SETTLE_GATES), `dba98cb`).
    pub(super) gates_only: bool,
}

/// The plans in use and how far they are trusted.
///
/// ```text
/// Unplanned --plan--> Holding{shorter: true}
/// Holding --plan taken only because it shortens the period--> ShorterOnTrial
/// Holding --compression / stretch undone--> Compressed{Fresh}
/// ShorterOnTrial, Compressed --a settled job past its pace or evicting,
///                              then a plan--> Holding{shorter: false} (the fallback)
/// Compressed{Fresh} --past its pace, nothing evicted, the stretch shorter
///                    than the fallback--> Compressed{Due}
///                   --the stretch handed out--> Compressed{Done}
/// (any other miss of Compressed{Fresh}: Compressed{Done} and a revert)
/// any --another plan--> Holding (shorter kept)
/// any --jobs or configuration changed--> Holding{shorter: true}, or
///                                       Compressed with no fallback
/// ```
#[derive(Debug, Clone)]
pub(super) enum Plans {
    /// No plan handed out yet.
    Unplanned,
    /// The plans in use are not on trial. `shorter`: whether a shorter
    /// period is still tried; false once shorter plans did not hold, until
    /// the jobs or the configuration change.
    Holding { in_use: InUse, shorter: bool },
    /// Plans taken only because they shorten the period (asked for while
    /// every job was gated and on its period): on trial. Ops measured while
    /// the gated jobs keep a longer pace run faster than they do once the
    /// jobs are packed closer (each waits less for the others' kernels), so
    /// a shorter plan from them may not hold; then `fallback`, the plans
    /// before them, which held, comes back. Three ResNet-50 b24 copies in
    /// one process (seed 6) ran a 233 ms plan with no stall, and the
    /// 210 ms plan their first measurements gave stalled and evicted; with
    /// the trial the worst EOR of three copies fell from 0.458 to 0.158
    /// (`a68b328`).
    ShorterOnTrial { in_use: InUse, fallback: MultiPlan },
    /// The plans in use moved onto a shorter period (compressed, or a
    /// stretch undone): on trial like [`Plans::ShorterOnTrial`]. `fallback`
    /// is `None` once the jobs or the configuration changed: a job that
    /// evicts on them then still asks for a re-plan at once
    /// ([`ReplanReason::ShorterMissed`](super::ReplanReason::ShorterMissed)),
    /// settling or not: compressed plans that evict ran the jobs into each
    /// other (`1de5654`).
    Compressed {
        in_use: InUse,
        fallback: Option<MultiPlan>,
        stretch: TrialStretch,
    },
}

/// Whether compressed plans on trial were stretched
/// ([`ReplanReason::Stretch`](super::ReplanReason::Stretch)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TrialStretch {
    /// Not stretched yet.
    Fresh,
    /// They missed their pace with nothing evicted, and a stretch to hold
    /// that iteration still beats the plans before them: the stretch asked
    /// for stays on trial, with the same plans to come back. One stretch
    /// only: one more miss brings the plans before back (`1de5654`).
    Due,
    /// Stretched once (or their one stretch was refused).
    Done,
}

impl Plans {
    /// The plans in use, with what they were made from.
    pub(super) fn in_use(&self) -> Option<&InUse> {
        match self {
            Plans::Unplanned => None,
            Plans::Holding { in_use, .. }
            | Plans::ShorterOnTrial { in_use, .. }
            | Plans::Compressed { in_use, .. } => Some(in_use),
        }
    }

    fn in_use_mut(&mut self) -> Option<&mut InUse> {
        match self {
            Plans::Unplanned => None,
            Plans::Holding { in_use, .. }
            | Plans::ShorterOnTrial { in_use, .. }
            | Plans::Compressed { in_use, .. } => Some(in_use),
        }
    }

    /// The plans just handed out keep the period that those before them
    /// were handed out on, `origin_ns`: only their gates moved (a stretch,
    /// an undone one).
    pub(super) fn regated_from(&mut self, origin_ns: u64) {
        if let Some(in_use) = self.in_use_mut() {
            in_use.origin_ns = origin_ns;
            in_use.gates_only = true;
        }
    }

    /// Compressed plans on trial are stretched as `stretch` says.
    pub(super) fn set_trial_stretch(&mut self, to: TrialStretch) {
        if let Plans::Compressed { stretch, .. } = self {
            *stretch = to;
        }
    }

    /// The plans in use, as handed out.
    pub(super) fn current(&self) -> Option<&MultiPlan> {
        self.in_use().map(|u| &u.plans)
    }

    /// The plans that come back if those on trial miss.
    pub(super) fn fallback(&self) -> Option<&MultiPlan> {
        match self {
            Plans::ShorterOnTrial { fallback, .. } => Some(fallback),
            Plans::Compressed { fallback, .. } => fallback.as_ref(),
            Plans::Unplanned | Plans::Holding { .. } => None,
        }
    }

    /// Whether a shorter period is still tried.
    pub(super) fn shorter(&self) -> bool {
        !matches!(self, Plans::Holding { shorter: false, .. })
    }

    /// Plans just handed out (by [`Replanner::adopt`]) are in use, not on
    /// trial; the caller puts them on trial where they are.
    ///
    /// [`Replanner::adopt`]: super::Replanner::adopt
    pub(super) fn handed_out(&mut self, in_use: InUse) {
        *self = Plans::Holding {
            shorter: self.shorter(),
            in_use,
        };
    }

    /// Puts the plans just handed out on trial as compressed ones, with
    /// `fallback` to come back, stretched as `stretch` says.
    pub(super) fn compressed(&mut self, fallback: Option<MultiPlan>, stretch: TrialStretch) {
        if let Some(in_use) = self.take().into_in_use() {
            *self = Plans::Compressed {
                in_use,
                fallback,
                stretch,
            };
        }
    }

    /// Puts the plans just handed out on trial as shorter ones, with
    /// `fallback` to come back (none: they are simply in use).
    pub(super) fn shorter_on_trial(&mut self, fallback: Option<MultiPlan>) {
        let Some(fallback) = fallback else {
            return;
        };
        if let Some(in_use) = self.take().into_in_use() {
            *self = Plans::ShorterOnTrial { in_use, fallback };
        }
    }

    /// The plans before those on trial come back: taken out, and no shorter
    /// period is tried with the plans to be handed out next.
    pub(super) fn take_fallback(&mut self) -> Option<MultiPlan> {
        let (in_use, fallback) = match self.take() {
            Plans::ShorterOnTrial { in_use, fallback } => (in_use, fallback),
            Plans::Compressed {
                in_use,
                fallback: Some(fallback),
                ..
            } => (in_use, fallback),
            other => {
                *self = other;
                return None;
            }
        };
        *self = Plans::Holding {
            in_use,
            shorter: false,
        };
        Some(fallback)
    }

    /// The jobs or the configuration changed: no plans come back (those
    /// before were for other jobs or another configuration), a stretch
    /// asked for on trial is taken as any, and a shorter period is worth
    /// trying again.
    pub(super) fn start_over(&mut self) {
        *self = match self.take() {
            Plans::Unplanned => Plans::Unplanned,
            Plans::Compressed {
                in_use, stretch, ..
            } => Plans::Compressed {
                in_use,
                fallback: None,
                stretch: match stretch {
                    TrialStretch::Due => TrialStretch::Done,
                    s => s,
                },
            },
            Plans::Holding { in_use, .. } | Plans::ShorterOnTrial { in_use, .. } => {
                Plans::Holding {
                    in_use,
                    shorter: true,
                }
            }
        };
    }

    /// The state, taken out ([`Plans::Unplanned`] left in its place).
    fn take(&mut self) -> Plans {
        std::mem::replace(self, Plans::Unplanned)
    }

    fn into_in_use(self) -> Option<InUse> {
        match self {
            Plans::Unplanned => None,
            Plans::Holding { in_use, .. }
            | Plans::ShorterOnTrial { in_use, .. }
            | Plans::Compressed { in_use, .. } => Some(in_use),
        }
    }
}

/// What the measurements since the last plan ask of the next one, from
/// the least to the most pressing, with what each needs. Requests only
/// raise it ([`Due::raise`]); a plan handed out sets it back to
/// [`Due::Nothing`], and so does a request for a shorter or compressed
/// plan that finds none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Due {
    /// Nothing asked for one.
    Nothing,
    /// Only jobs that are all gated and on their period
    /// ([`ON_PERIOD`](super::ON_PERIOD)): worth taking if it shortens the
    /// common period; a longer one would cost every job time to fix what
    /// cost none (`bf8b5f4`: 157 ms re-planned to 173 ms).
    Shorter,
    /// Every gated job kept its period with room to spare: the plans in
    /// use on a shorter period, on trial
    /// ([`ReplanReason::Compress`](super::ReplanReason::Compress)), toward
    /// the longest active time (ops and prefetch waits) of the streak that
    /// asked, `active_ns`, or, undoing a stretch, to hold its longest
    /// iteration, `iteration_ns`.
    Compress { active_ns: u64, iteration_ns: u64 },
    /// Gated jobs' first iterations ran past the period within their pace:
    /// the plans in use on a period that holds the longest of them,
    /// `iteration_ns` ([`ReplanReason::Stretch`](super::ReplanReason::Stretch)).
    /// A re-plan from latencies measured at one alignment often ran worse
    /// at the next: three ResNet-50 b28 copies (seed 2) stalled up to
    /// 166 ms an iteration, 920 evictions, EOR 0.215 (`b5e17f3`).
    Stretch { iteration_ns: u64 },
    /// A job was added or removed, the configuration changed, a job
    /// overran, evicted or is not gated: whatever the plan is. A stretch
    /// asked for meanwhile (`stretch_ns`, 0: none) may still win over it
    /// ([`Replanner::held_or`](super::Replanner::held_or)).
    Needed { stretch_ns: u64 },
    /// Plans on trial missed
    /// ([`ReplanReason::ShorterMissed`](super::ReplanReason::ShorterMissed)):
    /// the plans before them come back; where none are kept, as
    /// [`Due::Needed`].
    Revert { stretch_ns: u64 },
}

impl Due {
    fn rank(self) -> u8 {
        match self {
            Due::Nothing => 0,
            Due::Shorter => 1,
            Due::Compress { .. } => 2,
            Due::Stretch { .. } => 3,
            Due::Needed { .. } => 4,
            Due::Revert { .. } => 5,
        }
    }

    /// The longest iteration a stretch was asked for, ns (0: none).
    pub(super) fn stretch_ns(self) -> u64 {
        match self {
            Due::Stretch { iteration_ns: ns }
            | Due::Needed { stretch_ns: ns }
            | Due::Revert { stretch_ns: ns } => ns,
            Due::Nothing | Due::Shorter | Due::Compress { .. } => 0,
        }
    }

    /// Another request: the more pressing of the two, keeping the longest
    /// stretch either asked for.
    pub(super) fn raise(&mut self, to: Due) {
        let ns = self.stretch_ns().max(to.stretch_ns());
        let mut next = if to.rank() > self.rank() { to } else { *self };
        if let Due::Stretch { iteration_ns: s }
        | Due::Needed { stretch_ns: s }
        | Due::Revert { stretch_ns: s } = &mut next
        {
            *s = ns;
        }
        *self = next;
    }

    /// The jobs or the configuration changed: a plan is needed whatever
    /// it is, and no plans come back.
    pub(super) fn start_over(&mut self) {
        *self = Due::Needed {
            stretch_ns: self.stretch_ns(),
        };
    }
}

/// Whether a re-plan made due by iterations past their pace may lose to a
/// stretch of the plans in use ([`Replanner::held_or`](super::Replanner::held_or)).
/// Two ResNet-50 b32 copies as processes (seed 8) were re-planned from a
/// 205.1 ms period to 313.7 ms (EOR 0.589) where the plans in use, which
/// evicted nothing and ran 5% long, held on 217.2 ms (EOR 0.046;
/// `a2a190f`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// No re-plan asked for since the last plan.
    Nothing,
    /// Every re-plan asked for since the last plan was made due by an
    /// iteration past its gate's pace with nothing evicted (a job's first
    /// measured one, or the longest of a streak of overruns): the plans in
    /// use held their memory and only ran long, the longest of those
    /// iterations this long, ns.
    Ran(u64),
    /// Something else made a plan due since the last plan (an iteration
    /// that evicted, drifting latencies, the jobs or the configuration
    /// changed): the next one is a re-plan whatever a stretch would give.
    Void,
}

impl Held {
    /// A re-plan asked for by an iteration that held its memory and ran
    /// `ran_ns` (0: asked for by anything else).
    pub(super) fn asked(&mut self, ran_ns: u64) {
        *self = match *self {
            Held::Void => Held::Void,
            _ if ran_ns == 0 => Held::Void,
            Held::Nothing => Held::Ran(ran_ns),
            Held::Ran(ns) => Held::Ran(ns.max(ran_ns)),
        };
    }
}
