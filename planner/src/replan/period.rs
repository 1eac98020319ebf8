//! The re-planner's changes of a gated period that keep the plans in
//! use: a stretch to hold a job's iteration past it (also in place of a
//! re-plan that would need a longer cycle), a compression toward the time
//! the jobs' ops take when every job has room to spare (first undoing
//! stretches, as far as the jobs' iterations allow); and when a job's
//! overruns of its period make a re-plan due.

use crate::turns::SWITCH;

use super::{
    COMPRESS_SHARE, DRIFT_STEP, Due, Gate, Held, JobId, LINK_SHARE, Measurements, MultiPlan,
    ON_PERIOD, OVERRUNS, PACE, ROOM, ReplanJob, ReplanReason, Replanner, UNDERRUN,
};

impl Replanner {
    /// Whether every gated job has kept its period with room to spare for
    /// [`OVERRUNS`] iterations in a row, `id`'s just ended included (for
    /// [`UNSTRETCH`] where that undoes a stretch): then the plans in use
    /// are to be tried on a shorter period ([`ReplanReason::Compress`]),
    /// unless shorter plans did not hold before or another plan is
    /// already due. The streaks start again with every plan taken.
    pub(super) fn room(&mut self, id: JobId, m: &Measurements) -> Option<ReplanReason> {
        // An iteration that began on the plans before (it ended after these
        // were taken) tells nothing of the room these leave: not counted.
        if m.plan_version != 0 && m.plan_version != self.version {
            return None;
        }
        let job = self.jobs.get_mut(&id)?;
        let period = job.gate?.period_ns;
        let active =
            m.op_ns.iter().sum::<u64>() + m.late_prefetches.iter().map(|l| l.1).sum::<u64>();
        if on_period(job.gate?, m.iteration_ns)
            && m.evictions.is_empty()
            && (active as f64) < period as f64 * ROOM
        {
            job.spare += 1;
            job.active_ns = job.active_ns.max(active);
            job.spare_iter_ns = job.spare_iter_ns.max(m.iteration_ns);
        } else {
            job.spare = 0;
            job.active_ns = 0;
            job.spare_iter_ns = 0;
        }
        let streak = self
            .jobs
            .values()
            .map(|j| if j.gate.is_some() { j.spare } else { 0 })
            .min()
            .unwrap_or(0);
        // Turns leave each job idle for the others' turns by design: no
        // room to take back.
        let gated = self.plans.current().is_some_and(|c| {
            c.layout != crate::Layout::Turns && c.plans.iter().all(|p| p.gate.is_some())
        });
        if streak < UNSTRETCH
            || !gated
            || !self.enabled
            || !self.plans.shorter()
            || self.due != Due::Nothing
        {
            return None;
        }
        let active_ns = self.jobs.values().map(|j| j.active_ns).max().unwrap_or(0);
        let iteration_ns = self
            .jobs
            .values()
            .map(|j| j.spare_iter_ns)
            .max()
            .unwrap_or(0);
        if streak < OVERRUNS && self.unstretched(iteration_ns).is_none() {
            return None;
        }
        for j in self.jobs.values_mut() {
            j.spare = 0;
            j.active_ns = 0;
            j.spare_iter_ns = 0;
        }
        self.due.raise(Due::Compress {
            active_ns,
            iteration_ns,
        });
        Some(ReplanReason::Compress)
    }

    /// Whether a coordinated job's re-plan is due: only once it has overrun
    /// its gate's period by more than 3% [`OVERRUNS`] iterations in a row. Its
    /// estimates then grow by what it overran, by [`DRIFT_STEP`] at most. An
    /// op's measured time says little here: while jobs share the GPU an op
    /// runs faster when the others wait (at a gate, for memory, for their
    /// pace), so measurements understate what ops take beside each other,
    /// and a plan made from them would put the job behind its pace. A job
    /// that keeps its pace keeps its plan (its phase, its copies): a re-plan
    /// moves every job.
    pub(super) fn keep_pace(&mut self, id: JobId, m: &Measurements) -> Option<(ReplanReason, u64)> {
        let enabled = self.enabled;
        let job = self.jobs.get_mut(&id)?;
        let period = job.gate?.period_ns as f64;
        let ratio = m.iteration_ns as f64 / period.max(1.0);
        if ratio <= PACE {
            job.overruns = 0;
            return None;
        }
        // The streak's longest iteration, while none of it evicted.
        let before = if job.overruns == 0 { 0 } else { job.overrun_ns };
        job.overrun_ns = if m.evictions.is_empty() && (job.overruns == 0 || before > 0) {
            before.max(m.iteration_ns)
        } else {
            0
        };
        job.overruns += 1;
        if job.overruns < OVERRUNS || !enabled {
            return None;
        }
        job.overruns = 0;
        let ran_ns = std::mem::take(&mut job.overrun_ns);
        let ratio = ratio.min(DRIFT_STEP);
        for e in &mut job.estimates {
            *e *= ratio;
        }
        job.measured = true;
        Some((ReplanReason::Drift, ran_ns))
    }

    /// `proposed`, a re-plan made due by iterations that ran past their
    /// pace, or the plans in use stretched to hold the longest of them
    /// where that gives the shorter period: those plans held their memory
    /// (nothing evicted) and only ran long, while a re-plan from
    /// measurements taken as the jobs collided may need a much longer
    /// cycle to fit (two ResNet-50 copies at full batch: 313.7 ms, where
    /// the plans in use held on 217.2 ms). Only gated proposals compare,
    /// and only when nothing else made the re-plan due.
    ///
    /// A proposal in another layout than the plans in use (turns for
    /// gates that share the device, or back) must be shorter than the
    /// stretch by the margin [`crate::turns::choose`] asks of a switch:
    /// the two cycles are predicted from latencies measured in one layout
    /// and converted to the other, and the switch itself costs every job
    /// a realignment. The stretch is the plans that held; the turns
    /// predicted 1.8% shorter (216.6 ms against a 220.5 ms stretch, two
    /// ResNet-50 b32 on the a6000, seed 8) ran 250 to 435 ms iterations,
    /// evicting, where the same jobs planned in turns from the start ran
    /// 117 and 125 ms ones.
    pub(super) fn held_or(&self, proposed: MultiPlan) -> MultiPlan {
        let Held::Ran(held_ns) = self.held else {
            return proposed;
        };
        if proposed.cycle_ns == 0 {
            return proposed;
        }
        match self.stretched_to(self.due.stretch_ns().max(held_ns)) {
            Some(st) if st.cycle_ns < proposed.cycle_ns => st,
            Some(st)
                if st.layout != proposed.layout
                    && st.cycle_ns as f64 <= proposed.cycle_ns as f64 * (1.0 + SWITCH) =>
            {
                st
            }
            _ => proposed,
        }
    }

    /// The plans in use with the gates' period stretched to hold the
    /// longest iteration that asked for it (plus the gates' slack), every
    /// phase scaled with it so that the jobs stay as far apart, in shares
    /// of the period, as they were planned; `None` when a plan in use is
    /// not gated or the period already holds it. The plans keep their
    /// predictions (the aligned peak at the old phases).
    pub(super) fn stretched(&self) -> Option<MultiPlan> {
        self.stretched_to(self.due.stretch_ns())
    }

    /// [`Replanner::stretched`] to hold an iteration of `iteration_ns`.
    fn stretched_to(&self, iteration_ns: u64) -> Option<MultiPlan> {
        let (old, new) = self.period_to_hold(iteration_ns)?;
        if new <= old {
            return None;
        }
        self.regated(old, new)
    }

    /// The plans in use, stretched since they were handed out (on
    /// `origin_ns`), back on the period that holds the longest iteration
    /// of the streak that asked for a compression (plus the gates' slack),
    /// and no shorter than `origin_ns`; `None` when that is not 1% shorter
    /// than the period in use or a plan in use is not gated. A stretch is
    /// sized from one iteration, often one of the first, when jobs that
    /// start one after another run slower than they do once settled
    /// (three ResNet-50 copies: iterations of 237.5 and 246.1 ms on a
    /// 233.2 ms period stretched it twice, to 251.0 ms, on which all three
    /// then ran 232 ms). Only the gates change, as in a stretch: the pace
    /// and the copies are those handed out on `origin_ns`, so they fit the
    /// link as they did there, and no link rule applies.
    pub(super) fn unstretched(&self, iteration_ns: u64) -> Option<MultiPlan> {
        let origin_ns = self.plans.in_use().map_or(0, |u| u.origin_ns);
        if origin_ns == 0 || iteration_ns == 0 {
            return None;
        }
        let (old, need) = self.period_to_hold(iteration_ns)?;
        let new = need.max(origin_ns);
        if new as f64 >= old as f64 * 0.99 {
            return None;
        }
        self.regated(old, new)
    }

    /// The period of the gates in use and the one that holds an
    /// iteration of `iteration_ns` plus the gates' slack; `None` when a
    /// plan in use is not gated.
    fn period_to_hold(&self, iteration_ns: u64) -> Option<(u64, u64)> {
        let current = self.plans.current()?;
        let old = current.plans.first()?.gate?.period_ns;
        if current.plans.iter().any(|p| p.gate.is_none()) {
            return None;
        }
        let slack = crate::gate_slack(&self.config, current.plans.len());
        Some((old, (iteration_ns as f64 * (1.0 + slack)).ceil() as u64))
    }

    /// The plans in use with every gate moved from the period `old` onto
    /// `new` ([`rescale_gates`]), nothing else changed.
    fn regated(&self, old: u64, new: u64) -> Option<MultiPlan> {
        let mut out = self.plans.current().cloned()?;
        rescale_gates(&mut out, old, new);
        Some(out)
    }

    /// The plans in use on a shorter period: [`COMPRESS_SHARE`] of the
    /// way from the period to the longest active time that asked for it
    /// (plus the gates' slack), each phase, pace (`op_start_ns`) and event
    /// delay scaled with it, so that the jobs stay as far apart, in shares
    /// of the period, as they were planned. `None` when a plan in use is
    /// not gated or the period would shrink by less than 1%.
    pub(super) fn compressed(&self, active_ns: u64) -> Option<MultiPlan> {
        let mut out = self.plans.current().cloned()?;
        let old = out.plans.first()?.gate?.period_ns;
        let slack = crate::gate_slack(&self.config, out.plans.len());
        let target = active_ns as f64 * (1.0 + slack);
        let new = (old as f64 - (old as f64 - target) * COMPRESS_SHARE).ceil();
        let copies: u64 = out.plans.iter().map(|p| p.prediction.swapped_bytes).sum();
        let link = self
            .config
            .copy
            .h2d_bytes_per_s
            .min(self.config.copy.d2h_bytes_per_s);
        if new >= old as f64 * 0.99
            || out.plans.iter().any(|p| p.gate.is_none())
            || copies as f64 / link.max(1.0) * 1e9 > new * LINK_SHARE
        {
            return None;
        }
        let new = new as u64;
        rescale_gates(&mut out, old, new);
        for p in &mut out.plans {
            for t in &mut p.prediction.op_start_ns {
                *t = scaled(*t, old, new);
            }
            for e in &mut p.events {
                e.delay_ns = scaled(e.delay_ns, old, new);
            }
        }
        Some(out)
    }
}

/// Iterations in a row with room to spare, for every gated job, that undo
/// a stretch ([`Replanner::unstretched`]). Fewer than a compression needs:
/// only the gates move, no further than the longest of those iterations
/// allows, and the plans are on trial; at three ResNet-50 copies a
/// stretch to 251.0 ms on which all three ran 232 ms cost its jobs 8% for
/// five iterations before [`OVERRUNS`] of them undid it.
const UNSTRETCH: usize = 1;

/// Whether a gated job's first measured iteration kept its plan: it ended
/// within [`ON_PERIOD`] of its period, nothing was evicted, and its ops ran
/// no faster than [`UNDERRUN`] of the estimates (a plan from estimates that
/// are too slow is re-planned at once). Prefetches late within the period
/// do not count. An iteration past its period does, even within [`PACE`]:
/// one that overruns by 2% each time slides into the other jobs' phases
/// ([`first_on_pace`] then stretches the period).
pub(super) fn first_on_period(job: &ReplanJob, m: &Measurements) -> bool {
    job.gate.is_some_and(|g| on_period(g, m.iteration_ns))
        && m.evictions.is_empty()
        && ops_as_planned(job, m)
}

/// Whether a gated job's first measured iteration, past its period (not
/// [`first_on_period`]), may keep its plan on a longer period: it kept its
/// pace ([`on_pace`]) and its ops ran no faster than [`UNDERRUN`] of the
/// estimates.
pub(super) fn first_on_pace(job: &ReplanJob, m: &Measurements) -> bool {
    job.gate.is_some_and(|g| on_pace(g, m)) && ops_as_planned(job, m)
}

/// Whether a job's ops took at least [`UNDERRUN`] of the estimates its
/// plan was made from.
pub(super) fn ops_as_planned(job: &ReplanJob, m: &Measurements) -> bool {
    let planned: f64 = job.estimates.iter().sum();
    m.op_ns.iter().sum::<u64>() as f64 >= planned * UNDERRUN
}

/// Whether an iteration of `iteration_ns` ended on its gate's period:
/// within [`ON_PERIOD`] of it.
pub(super) fn on_period(gate: Gate, iteration_ns: u64) -> bool {
    iteration_ns as f64 <= gate.period_ns as f64 * ON_PERIOD
}

/// Whether a gated job's iteration kept its gate's pace: it ended within
/// [`PACE`] of the period and nothing was evicted.
pub(super) fn on_pace(gate: Gate, m: &Measurements) -> bool {
    m.iteration_ns as f64 <= gate.period_ns as f64 * PACE && m.evictions.is_empty()
}

/// `x` scaled by `new / old` (`x` itself where that does not fit).
fn scaled(x: u64, old: u64, new: u64) -> u64 {
    u64::try_from(u128::from(x) * u128::from(new) / u128::from(old)).unwrap_or(x)
}

/// Puts every gate of `out` on the period `new` instead of `old`, each
/// phase at the same share of it.
fn rescale_gates(out: &mut MultiPlan, old: u64, new: u64) {
    for g in out.plans.iter_mut().filter_map(|p| p.gate.as_mut()) {
        g.phase_ns = scaled(g.phase_ns % old, old, new);
        g.period_ns = new;
    }
    out.cycle_ns = new;
}
