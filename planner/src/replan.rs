//! Re-planning as a pure library: the re-planner owns every
//! job's graph (`Arc`), keyed by a [`JobId`] the caller chooses, folds each
//! job's [`Measurements`] into an EWMA of its op latencies, says when a
//! re-plan is due, and plans all jobs together. It keeps no clock and does
//! no I/O: the caller decides when to plan (the simulator after an
//! iteration, the service in its planning task, coalescing what arrived
//! meanwhile) and times it.
//!
//! A re-plan is due when a job reports its first measurements (its
//! cold-start plan was made from predictions only), when a job's total
//! latency has changed by more than the threshold since the last plan, or
//! when a planned prefetch arrived late: that tensor's swap-in then gets a
//! lead of the measured lateness plus 5%, growing by 5% at every further
//! miss (Capuchin's feedback). A wait that the plan accepts (to meet a
//! budget) is not a miss; only lateness beyond it is fed back. A gated
//! job is held to its gate's pace instead: its first measurements re-plan
//! only when its first measured iteration did not end on its period (one
//! that ended past it within [`PACE`] keeps every job's plan, on a period
//! stretched to hold it: [`ReplanReason::Stretch`]), and later ones only
//! when it overruns or clearly underruns its period several iterations in
//! a row (a re-plan moves every gated job's phase). Where the iterations
//! that made such a re-plan due ran past the pace but evicted nothing, the
//! plans in use held their memory: the re-plan is taken only if its cycle
//! is shorter than theirs stretched to hold those iterations
//! ([`Replanner::held_or`]).
//! A re-plan asked for while every job is gated and its last iteration
//! ended within [`ON_PERIOD`] of the period (late prefetches the gate
//! absorbed, ops that ran faster) is taken only when it shortens the common
//! period: a longer one would cost every job time to fix what cost none
//! ([`Replanner::plan_due`]). Such a plan is on trial: ops measured while
//! the jobs kept the longer pace ran faster than they do once the jobs are
//! packed closer, so when a job on it (settled) runs past its pace or
//! evicts, the plans before it come back ([`ReplanReason::ShorterMissed`])
//! and no shorter period is tried again until the jobs or the
//! configuration change. When every gated job's ops and prefetch waits
//! took less than [`ROOM`] of the period several iterations in a row (the
//! pace and the gates idle it for the rest), the plans in use are tried on
//! a shorter period ([`ReplanReason::Compress`]). Plans stretched since
//! they were handed out first lose the stretch, after one such iteration
//! of every job, as far as the longest of those iterations (plus the
//! gates' slack) allows and no further than the period they were handed
//! out on: only the gates change, and the cycle in use is kept
//! ([`Replanner::unstretched`]); a switch that moves only the gates
//! leaves out one iteration, not two. Otherwise the period goes a
//! quarter of the way to the ops' and waits' time: the same copies, their
//! phases, pace and delays scaled with it. Either is on trial as above; one
//! that runs past its pace without evicting is stretched once to hold that
//! iteration while that still beats the plans before it, and one that
//! evicts brings them back at once, settling or not.

use std::collections::BTreeMap;
use std::sync::Arc;

use tensile_graph::{Graph, OpId, TensorId};

use control::{Due, Held, InUse, Plans, TrialStretch};
use late::LateStreak;
use period::{first_on_pace, first_on_period, on_pace, on_period, ops_as_planned};

use crate::{
    Gate, JobInput, JobSettings, MeasuredIn, MultiPlan, Plan, PlanError, PlannerConfig, plan,
};

/// A job's key, chosen by the caller (the simulator's job index, the
/// service's job number). Jobs are planned in key order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub u64);

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What one iteration of a job measured, as the planners need it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measurements {
    /// Latency of every op, ns, indexed by op id.
    pub op_ns: Vec<u64>,
    /// Planned prefetches that arrived late: (storage root, how long the
    /// op waited for it), ns.
    pub late_prefetches: Vec<(TensorId, u64)>,
    /// Device memory before the first op (base, persistent state, inputs).
    pub start_bytes: u64,
    /// Storages evicted under a budget, in order: (storage root, the op
    /// that needed the room).
    pub evictions: Vec<(TensorId, OpId)>,
    /// The iteration was the first on a new plan (persistent storage moved
    /// to where that plan wants it): a coordinated job's is left out.
    pub switched: bool,
    /// How long the iteration took, ns (its start to its end).
    pub iteration_ns: u64,
    /// The version of the plan it ran on (0: not known).
    pub plan_version: u64,
}

/// Why a re-plan is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplanReason {
    /// The job's first measurements (its plan came from predictions).
    FirstMeasurements,
    /// The job's total latency moved past the threshold.
    Drift,
    /// A planned prefetch arrived later than the plan accepts.
    LatePrefetch,
    /// The job ran free under a budget and the guard evicted to hold it.
    FreeMissed,
    /// Plans taken only to shorten the period did not hold (a job overran
    /// it or evicted): the plans before them, which held, come back.
    ShorterMissed,
    /// A gated job's first measured iteration ran past its period but kept
    /// its pace: the plans stay and the common period grows to hold it.
    Stretch,
    /// Every gated job kept its period with time to spare, iteration after
    /// iteration: the plans stay and the common period shrinks, on trial,
    /// back toward what a stretch added to it or toward the time the jobs'
    /// ops (and their waits for prefetches) took.
    Compress,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplanError {
    #[error("job {0} is already registered with the re-planner")]
    Duplicate(JobId),
    #[error("job {0} is not registered with the re-planner")]
    UnknownJob(JobId),
    #[error("job {job}: {got} latencies for a graph of {ops} ops")]
    LatencyCount { job: JobId, got: usize, ops: usize },
    #[error("job {job}: late prefetch of tensor {tensor}, which the graph does not have")]
    UnknownTensor { job: JobId, tensor: u32 },
    #[error("planning job {job}: {source}")]
    Plan {
        job: JobId,
        #[source]
        source: PlanError,
    },
    #[error("planning: {0}")]
    Planner(PlanError),
}

/// Gets each finished iteration and may hand out new plans. The simulator
/// drives ours ([`Replanner`]) and Capuchin's through it; the service owns
/// one in its planning task.
pub trait Replan {
    fn after_iteration(
        &mut self,
        job: JobId,
        measured: &Measurements,
    ) -> Result<Vec<(JobId, Plan)>, ReplanError>;

    /// The job whose next slot the gates last handed out are to put at the
    /// time they are taken ([`MultiPlan::anchor_job`]); `None`: they keep
    /// the cycle of the gates in use.
    fn anchor_job(&self) -> Option<JobId> {
        None
    }
}

/// Never re-plans.
#[derive(Debug)]
pub struct FixedPlans;

impl Replan for FixedPlans {
    fn after_iteration(
        &mut self,
        _: JobId,
        _: &Measurements,
    ) -> Result<Vec<(JobId, Plan)>, ReplanError> {
        Ok(Vec::new())
    }
}

#[derive(Debug, Clone)]
struct ReplanJob {
    graph: Arc<Graph>,
    settings: JobSettings,
    estimates: Vec<f64>,
    /// Σ estimates when the last plan was made.
    at_plan: f64,
    /// Whether the job has reported measurements yet.
    measured: bool,
    /// Prefetch leads of tensors whose swap-in came late.
    leads: BTreeMap<TensorId, u64>,
    /// The waits the current plan accepts (to meet a budget), by storage
    /// root of the inputs waited for.
    planned_late: BTreeMap<TensorId, u64>,
    /// The gate of the current plan, kept by the next one when it still
    /// fits (coordinated planning).
    gate: Option<Gate>,
    /// Iterations of the job still to leave out (its first, and the first
    /// two after a switch of plans).
    settling: usize,
    /// Iterations in a row that overran the gate's period.
    overruns: usize,
    /// The longest iteration of the current streak of overruns, ns; 0
    /// once one of them evicted.
    overrun_ns: u64,
    /// How long its last iteration on the current plan took, settling
    /// ones included (0: none yet).
    last_iteration_ns: u64,
    /// Iterations in a row whose ops took less than [`UNDERRUN`] of the
    /// estimates the plan was made from.
    underruns: usize,
    /// Iterations in a row that ended on the period with its ops and
    /// prefetch waits taking less than [`ROOM`] of it.
    spare: usize,
    /// The longest such active time (ops and prefetch waits) in the
    /// streak, ns.
    active_ns: u64,
    /// The longest iteration in that streak, ns.
    spare_iter_ns: u64,
    /// Its iterations late beyond the plan since the last on time.
    late: LateStreak,
    /// It ran free under the budget and the guard evicted
    /// ([`JobInput::free_missed`]); cleared when the jobs change.
    free_missed: bool,
    /// Its current plan is a free one.
    runs_free: bool,
    /// Its current plan takes turns.
    turns: bool,
    /// Where its estimates come from ([`JobInput::latencies`]): taken as
    /// sharing's while predicted, then the layout of the plan they were
    /// measured on. Set when they are folded in, not when a plan is
    /// handed out: until a job has run on a plan that takes turns, its
    /// estimates are what they were (three cold jobs put in turns were
    /// planned again, before any measurement, as if their predictions had
    /// been measured alone: a period 4.7 times longer).
    estimates_from: MeasuredIn,
    /// It has not yet reported an iteration on its current plan.
    switch_pending: bool,
}

impl ReplanJob {
    /// How much later than its plan accepts tensor `t`'s prefetch came:
    /// a planned wait is no miss; only what comes on top of it (with 5%
    /// slack) counts.
    fn late_beyond_plan(&self, t: TensorId, wait: u64) -> u64 {
        let planned = self.planned_late.get(&t).copied().unwrap_or(0);
        wait.saturating_sub(planned + planned / 20)
    }

    /// Folds measured op latencies into the EWMA estimates.
    fn fold(&mut self, op_ns: &[u64], weight: f64) {
        for (e, &x) in self.estimates.iter_mut().zip(op_ns) {
            *e = weight * x as f64 + (1.0 - weight) * *e;
        }
        self.estimates_from = if self.turns {
            MeasuredIn::Turns
        } else {
            MeasuredIn::Sharing
        };
    }
}

/// Iterations a coordinated job leaves out after a switch of plans: the
/// jobs take their new phases and move persistent storage.
const SETTLE: usize = 2;
/// [`SETTLE`] after a switch that moved only the gates: persistent
/// storage stays where it is; the jobs only take their new phases. With
/// one roomy iteration undoing a stretch it took three ResNet-50 copies as processes
/// (a6000, seeds 1-32, five fractions) from 86 to 90 runs of 160 that fit
/// (`dba98cb`).
const SETTLE_GATES: usize = 1;
/// Overruns in a row that re-plan a coordinated job (no dated trial: it
/// came with the colocation bench, `4388ba3`, where it was 2 before).
const OVERRUNS: usize = 3;
/// How much longer than its gate's period a coordinated job's iteration
/// may run and still keep its pace (`4388ba3`; no dated trial). The gates'
/// slack is sized under it ([`crate::gate_slack`]).
const PACE: f64 = 1.03;
/// The most one overrun re-plan scales a coordinated job's estimates by.
/// An overrun is mostly stalls (prefetches late, waits for the memory of a
/// job that drifted into the same phase), not slower ops: scaling by all of
/// it once gave a cycle 69% longer than the plan's, with ops that fit in
/// 205 ms paced to 345 ms. A job that still overruns re-plans again.
const DRIFT_STEP: f64 = 1.1;
/// How much longer than its gate's period a coordinated job's iteration
/// may run and still count as on it: a re-plan that would lengthen the
/// period is taken when some job runs past it by more. Three ResNet-50
/// b16 copies (a6000, seed 1) ran their first gated plan on its 157 ms
/// period, prefetches late but absorbed; the re-plan that asked for
/// needed 173 ms, 11% more for every job (`bf8b5f4`: 30 -> 37 of 64
/// runs at EOR <= 0.05 over 16 seeds).
const ON_PERIOD: f64 = 1.005;
/// What share of its estimated op time a coordinated job's ops may take,
/// [`OVERRUNS`] iterations in a row, before its measurements replace the
/// estimates: ops run a little faster while the other jobs wait at their
/// gates, so only a clear gap counts. Without it a gated job never
/// learned estimates that were too slow: two ResNet-50 copies on the CPU
/// demo's profile ran 993 ms iterations against 472 ms vanilla, EOR 1.17;
/// with it 510-600 ms (`ff815e1`).
const UNDERRUN: f64 = 0.8;
/// What share of the period a gated job's ops and prefetch waits may take,
/// [`OVERRUNS`] iterations in a row for every job, for the plans in use to
/// be tried on a shorter period ([`ReplanReason::Compress`]). Two
/// ResNet-50 b32 copies in one process (seed 10) had ops and waits of
/// 178 ms in a 205 ms period, EOR 0.061; compressing plans whose jobs
/// fill 90-97% of the period ran them into each other's memory more
/// often than it saved (`1de5654`).
const ROOM: f64 = 0.9;
/// How much of the gap between the period and the longest active time
/// (ops and prefetch waits) a compression closes. Ops measured while the
/// jobs wait for their pace and gates ran faster than they will once the
/// jobs are packed closer (each waits less for the others' kernels), so
/// the period moves only part of the way, and again once that holds:
/// half the gap collided more often than it saved (`1de5654`).
const COMPRESS_SHARE: f64 = 0.25;
/// The most of a compressed period the plans' copies may take on the
/// link (in one direction): copies take as long on a shorter period
/// (`1de5654`; no dated trial of the share itself).
const LINK_SHARE: f64 = 0.7;

/// Our re-planner: EWMA latencies, feedback of late prefetches, all jobs
/// planned together.
#[derive(Debug, Clone)]
pub struct Replanner {
    config: PlannerConfig,
    jobs: BTreeMap<JobId, ReplanJob>,
    /// Weight of a new measurement.
    pub weight: f64,
    /// Re-plan when |Σ now − Σ at last plan| / Σ at last plan exceeds this.
    pub threshold: f64,
    /// False: measurements are folded in but a re-plan is never due.
    pub enabled: bool,
    version: u64,
    /// Re-plans made because one was due (not counting the first plan).
    pub replans: usize,
    /// What the measurements since the last plan ask of the next one.
    due: Due,
    /// Whether the re-plan due may lose to a stretch of the plans in use.
    held: Held,
    /// The plans in use and how far they are trusted.
    plans: Plans,
    /// The last job whose measurements made a plan due: it just ended the
    /// iteration that asked, and the next gated plans' new cycle begins
    /// where it stands.
    asked: Option<JobId>,
    /// The anchor of the plans `replan_after` last handed out.
    handed_anchor: Option<JobId>,
}

impl Replanner {
    pub fn new(config: PlannerConfig) -> Replanner {
        Replanner {
            config,
            jobs: BTreeMap::new(),
            weight: 0.9,
            threshold: 0.3,
            enabled: true,
            version: 0,
            replans: 0,
            due: Due::Needed { stretch_ns: 0 },
            held: Held::Nothing,
            plans: Plans::Unplanned,
            asked: None,
            handed_anchor: None,
        }
    }

    pub fn config(&self) -> &PlannerConfig {
        &self.config
    }

    /// Changes the planner's configuration (a new budget, say); the next
    /// plan uses it.
    pub fn set_config(&mut self, config: PlannerConfig) {
        self.config = config;
        self.start_over();
    }

    /// A new plan is needed whatever it is, and a shorter period is worth
    /// trying again.
    fn start_over(&mut self) {
        self.due.start_over();
        self.held = Held::Void;
        self.plans.start_over();
    }

    /// Adds a job whose op latencies are first `predicted` (ns per op).
    pub fn add_job(
        &mut self,
        id: JobId,
        graph: Arc<Graph>,
        predicted: &[u64],
        settings: JobSettings,
    ) -> Result<(), ReplanError> {
        if self.jobs.contains_key(&id) {
            return Err(ReplanError::Duplicate(id));
        }
        if predicted.len() != graph.ops().len() {
            return Err(ReplanError::LatencyCount {
                job: id,
                got: predicted.len(),
                ops: graph.ops().len(),
            });
        }
        let estimates: Vec<f64> = predicted.iter().map(|&x| x as f64).collect();
        self.jobs.insert(
            id,
            ReplanJob {
                graph,
                settings,
                at_plan: estimates.iter().sum(),
                estimates,
                measured: false,
                leads: BTreeMap::new(),
                planned_late: BTreeMap::new(),
                gate: None,
                settling: 1,
                overruns: 0,
                overrun_ns: 0,
                underruns: 0,
                spare: 0,
                active_ns: 0,
                spare_iter_ns: 0,
                last_iteration_ns: 0,
                late: LateStreak::default(),
                free_missed: false,
                runs_free: false,
                turns: false,
                estimates_from: MeasuredIn::Sharing,
                switch_pending: true,
            },
        );
        self.jobs_changed();
        Ok(())
    }

    /// The base a job is planned with ([`JobSettings::base_bytes`]).
    pub fn base_bytes(&self, id: JobId) -> Option<u64> {
        self.jobs.get(&id).map(|j| j.settings.base_bytes)
    }

    /// Plans job `id` with `bytes` of device memory outside its graph from
    /// now on (a base measured in its process): the next plan is due
    /// whatever it is, as after a change of configuration. The same base
    /// again changes nothing.
    pub fn set_base_bytes(&mut self, id: JobId, bytes: u64) -> Result<(), ReplanError> {
        let job = self.jobs.get_mut(&id).ok_or(ReplanError::UnknownJob(id))?;
        if job.settings.base_bytes != bytes {
            job.settings.base_bytes = bytes;
            self.start_over();
        }
        Ok(())
    }

    /// Removes a job; the others are re-planned when the caller next plans.
    pub fn remove_job(&mut self, id: JobId) -> Result<Arc<Graph>, ReplanError> {
        let job = self.jobs.remove(&id).ok_or(ReplanError::UnknownJob(id))?;
        self.jobs_changed();
        Ok(job.graph)
    }

    /// Another mix of jobs: a new plan is needed, and whether free plans
    /// hold for it is not known yet.
    fn jobs_changed(&mut self) {
        self.start_over();
        for j in self.jobs.values_mut() {
            j.free_missed = false;
        }
    }

    /// The jobs, in planning order.
    pub fn job_ids(&self) -> Vec<JobId> {
        self.jobs.keys().copied().collect()
    }

    /// The current latency estimates of a job's ops, ns.
    pub fn estimates(&self, id: JobId) -> Option<Vec<u64>> {
        let j = self.jobs.get(&id)?;
        Some(j.estimates.iter().map(|&x| x.round() as u64).collect())
    }

    /// The version the next plan will carry.
    pub fn next_version(&self) -> u64 {
        self.version + 1
    }

    /// Folds a job's measurements in; says whether (and why) a re-plan of
    /// all jobs is due.
    pub fn observe(
        &mut self,
        id: JobId,
        m: &Measurements,
    ) -> Result<Option<ReplanReason>, ReplanError> {
        let (reason, ran_ns) = self.fold_in(id, m)?;
        if reason.is_some() {
            self.asked = Some(id);
        }
        match reason {
            // `fold_in` raised what is due with the stretch or the
            // compression asked for.
            None | Some(ReplanReason::Stretch | ReplanReason::Compress) => {}
            Some(r) => {
                self.held.asked(ran_ns);
                // Every job gated, and its last iteration on the current
                // plan (this one's included) within its period: a plan with
                // a longer period would only cost time.
                let on_period = self
                    .jobs
                    .values()
                    .all(|j| j.gate.is_some_and(|g| on_period(g, j.last_iteration_ns)));
                self.due.raise(if on_period && m.evictions.is_empty() {
                    Due::Shorter
                } else {
                    Due::Needed { stretch_ns: 0 }
                });
                if r == ReplanReason::ShorterMissed {
                    self.due.raise(Due::Revert { stretch_ns: 0 });
                }
            }
        }
        Ok(reason)
    }

    fn fold_in(
        &mut self,
        id: JobId,
        m: &Measurements,
    ) -> Result<(Option<ReplanReason>, u64), ReplanError> {
        let weight = self.weight;
        let threshold = self.threshold;
        let budget = self.config.budget_bytes.is_some() && self.config.coordinate;
        let job = self.jobs.get_mut(&id).ok_or(ReplanError::UnknownJob(id))?;
        let ops = job.graph.ops().len();
        if m.op_ns.len() != ops {
            return Err(ReplanError::LatencyCount {
                job: id,
                got: m.op_ns.len(),
                ops,
            });
        }
        let tensors = job.graph.tensors().len();
        if let Some(&(t, _)) = m.late_prefetches.iter().find(|l| l.0.index() >= tensors) {
            return Err(ReplanError::UnknownTensor {
                job: id,
                tensor: t.0,
            });
        }
        // A coordinated job's first iteration on a plan is not its plan's:
        // it starts alone or beside jobs that start later (its kernels run
        // faster than when they all run), and after a switch persistent
        // storage moves to where the new plan wants it. Its measurements
        // would mislead the next plan, so they are left out; the others
        // only tell whether it keeps its pace.
        if m.switched {
            job.switch_pending = false;
        }
        // A gated job's ops ran under UNDERRUN of its estimates OVERRUNS
        // iterations in a row: a re-plan is due whatever the drift
        // threshold says.
        let mut underran = false;
        // The iteration that asks for a re-plan ran past its pace with its
        // memory held (0: not such an iteration).
        let mut ran_ns = 0;
        if job.gate.is_some() {
            if m.switched {
                let gates_only = self.plans.in_use().is_some_and(|u| u.gates_only);
                job.settling = if gates_only { SETTLE_GATES } else { SETTLE };
            }
            job.last_iteration_ns = m.iteration_ns;
            // Compressed plans that evict, settling or not, ran the jobs
            // into each other: the plans before them come back at once.
            if matches!(self.plans, Plans::Compressed { .. })
                && !job.switch_pending
                && !m.evictions.is_empty()
            {
                job.overruns = 0;
                return Ok((Some(ReplanReason::ShorterMissed), 0));
            }
            if job.settling > 0 {
                job.settling -= 1;
                job.overruns = 0;
                return Ok((None, 0));
            }
            // On plans taken only to shorten the period, one iteration
            // past its pace or with evictions brings the plans before them
            // back.
            let missed_pace = job.gate.is_some_and(|g| !on_pace(g, m));
            if self.plans.fallback().is_some() && !job.switch_pending && missed_pace {
                job.fold(&m.op_ns, weight);
                job.measured = true;
                job.overruns = 0;
                // Plans compressed further than the jobs run, with nothing
                // evicted, get one stretch to hold the iteration while
                // that still beats the plans before them.
                let slack = crate::gate_slack(&self.config, self.jobs.len());
                let before = self.plans.fallback().and_then(|f| f.plans.first()?.gate);
                let held = (m.iteration_ns as f64 * (1.0 + slack)).ceil();
                let fresh = matches!(
                    self.plans,
                    Plans::Compressed {
                        stretch: TrialStretch::Fresh,
                        ..
                    }
                );
                if fresh {
                    self.plans.set_trial_stretch(TrialStretch::Done);
                }
                if fresh
                    && self.enabled
                    && m.evictions.is_empty()
                    && before.is_some_and(|g| held < g.period_ns as f64 * 0.99)
                {
                    self.due.raise(Due::Stretch {
                        iteration_ns: m.iteration_ns,
                    });
                    self.plans.set_trial_stretch(TrialStretch::Due);
                    return Ok((Some(ReplanReason::Stretch), 0));
                }
                return Ok((Some(ReplanReason::ShorterMissed), 0));
            }
            // A job whose first measured iteration ended on its period
            // (ops not clearly faster than planned, nothing evicted) keeps
            // its plan: the measurements replace the estimates for the
            // next plan, but a re-plan now would move every job's phase
            // and copies away from a plan that works, and each job would
            // pay a realignment for it. Prefetches that came late cost it
            // only time its period had to spare.
            if !job.measured && first_on_period(job, m) {
                job.fold(&m.op_ns, weight);
                job.measured = true;
                return Ok((None, 0));
            }
            // One that ended past its period but within its pace (late
            // prefetches, ops a little slower than planned) keeps its plan
            // too, on a longer period: every job's plan stays, the gates'
            // period grows to hold that iteration and their phases spread
            // with it. A re-plan from its measurements would move every
            // job's phase and copies, and those measurements, taken at this
            // alignment, need not hold at the next; a plan left on a period
            // too short for it slides into the other jobs' phases.
            if !job.measured && self.enabled && first_on_pace(job, m) {
                job.fold(&m.op_ns, weight);
                job.measured = true;
                self.due.raise(Due::Stretch {
                    iteration_ns: m.iteration_ns,
                });
                return Ok((Some(ReplanReason::Stretch), 0));
            }
            // Past its pace too, but with its memory held: the re-plan due
            // may yet lose to a stretch.
            if !job.measured && m.evictions.is_empty() && ops_as_planned(job, m) {
                ran_ns = m.iteration_ns;
            }
            // Otherwise its first measurements replace the predictions the
            // plan came from, and ops that run well under their estimates
            // iteration after iteration shorten the period: the pace holds
            // a job to its plan, so a plan from estimates that are too slow
            // would otherwise never end.
            if job.measured {
                if !ops_as_planned(job, m) {
                    job.underruns += 1;
                } else {
                    job.underruns = 0;
                }
                if job.underruns < OVERRUNS {
                    if let Some((reason, ran_ns)) = self.keep_pace(id, m) {
                        return Ok((Some(reason), ran_ns));
                    }
                    return Ok((self.room(id, m), 0));
                }
                underran = true;
            }
            job.underruns = 0;
            job.overruns = 0;
        }
        // A free job the guard had to evict for: the free plans did not
        // hold, and the next plan gates the jobs if it can.
        let missed = job.gate.is_none()
            && budget
            && !m.evictions.is_empty()
            && !std::mem::replace(&mut job.free_missed, true);
        job.fold(&m.op_ns, weight);
        let now: f64 = job.estimates.iter().sum();
        let base = job.at_plan.max(1.0);
        let first = !std::mem::replace(&mut job.measured, true);
        let mut late_ns = 0;
        for &(t, wait) in &m.late_prefetches {
            let beyond = job.late_beyond_plan(t, wait);
            if beyond == 0 {
                continue;
            }
            late_ns += beyond;
            let lead = job.leads.entry(t).or_insert(0);
            *lead = ((*lead + beyond) as f64 * 1.05).ceil() as u64;
        }
        let late = job.late.due(late_ns);
        let drift = underran || (now - base).abs() / base > threshold;
        if !self.enabled {
            return Ok((None, 0));
        }
        let reason = if first {
            Some(ReplanReason::FirstMeasurements)
        } else if drift {
            Some(ReplanReason::Drift)
        } else if late {
            Some(ReplanReason::LatePrefetch)
        } else if missed {
            Some(ReplanReason::FreeMissed)
        } else {
            None
        };
        Ok((reason, ran_ns))
    }

    /// Plans every job from the current estimates; the plans carry a new
    /// version and come in [`Replanner::job_ids`] order.
    pub fn plan_all(&mut self) -> Result<MultiPlan, ReplanError> {
        let mut out = self.propose()?;
        self.adopt(&mut out);
        Ok(out)
    }

    /// Plans every job as [`Replanner::plan_all`] does, unless it was asked
    /// for since the last plan only while every job was gated and its last
    /// iteration ended within 0.5% of the period, and the new plan would
    /// not shorten that period: then `None`, the current plans stay, and
    /// the measurements wait in the estimates for the next plan.
    pub fn plan_due(&mut self) -> Result<Option<MultiPlan>, ReplanError> {
        if matches!(self.due, Due::Revert { .. })
            && let Some(mut out) = self.plans.take_fallback()
        {
            self.adopt(&mut out);
            return Ok(Some(out));
        }
        if matches!(self.due, Due::Stretch { .. })
            && let Some(mut out) = self.stretched()
        {
            // A stretch asked for on trial stays on trial.
            let held = match &self.plans {
                Plans::Compressed {
                    fallback,
                    stretch: TrialStretch::Due,
                    ..
                } => Some(fallback.clone()),
                _ => None,
            };
            self.adopt_regated(&mut out);
            if let Some(fallback) = held {
                self.plans.compressed(fallback, TrialStretch::Done);
            }
            return Ok(Some(out));
        }
        if let Due::Compress {
            active_ns,
            iteration_ns,
        } = self.due
        {
            let held = self.plans.current().cloned();
            // A stretch undone keeps the cycle in use (no anchor): every
            // job's next slot comes a little earlier than on the longer
            // period, where the asking job's would be at once, up to its
            // wait at the gate earlier, into the memory of the job before
            // it.
            if let Some(mut out) = self.unstretched(iteration_ns) {
                self.asked = None;
                self.adopt_regated(&mut out);
                self.plans.compressed(held, TrialStretch::Fresh);
                return Ok(Some(out));
            }
            return Ok(match self.compressed(active_ns) {
                Some(mut out) => {
                    self.adopt(&mut out);
                    self.plans.compressed(held, TrialStretch::Fresh);
                    Some(out)
                }
                None => {
                    self.due = Due::Nothing;
                    self.asked = None;
                    None
                }
            });
        }
        if self.due == Due::Shorter && !self.plans.shorter() {
            self.due = Due::Nothing;
            self.asked = None;
            return Ok(None);
        }
        let mut out = self.propose()?;
        let period = self.jobs.values().find_map(|j| j.gate).map(|g| g.period_ns);
        let shorter = matches!(period, Some(p) if out.cycle_ns > 0 && out.cycle_ns < p);
        let optional = self.due == Due::Shorter;
        if optional && !shorter {
            self.due = Due::Nothing;
            self.asked = None;
            return Ok(None);
        }
        // `held_or` hands back the proposal or a stretch of the plans in
        // use, which is shorter.
        let proposed = out.cycle_ns;
        if !optional {
            out = self.held_or(out);
        }
        let held = self.plans.current().cloned();
        if out.cycle_ns == proposed {
            self.adopt(&mut out);
        } else {
            self.adopt_regated(&mut out);
        }
        if optional {
            self.plans.shorter_on_trial(held);
        }
        Ok(Some(out))
    }

    /// Folds a job's measurements in and, when they make a re-plan due,
    /// plans with `plan` (which calls [`Replanner::plan_due`], timing it
    /// say): the plans to hand out, none when no new plan is taken.
    pub fn replan_after(
        &mut self,
        job: JobId,
        measured: &Measurements,
        plan: impl FnOnce(&mut Replanner) -> Result<Option<MultiPlan>, ReplanError>,
    ) -> Result<Vec<(JobId, Plan)>, ReplanError> {
        if self.observe(job, measured)?.is_none() {
            return Ok(Vec::new());
        }
        let Some(out) = plan(self)? else {
            return Ok(Vec::new());
        };
        self.replans += 1;
        let ids = self.job_ids();
        self.handed_anchor = out.anchor_job.and_then(|k| ids.get(k).copied());
        Ok(ids.into_iter().zip(out.plans).collect())
    }

    fn propose(&self) -> Result<MultiPlan, ReplanError> {
        let ids = self.job_ids();
        let inputs: Vec<JobInput<'_>> = self
            .jobs
            .values()
            .map(|j| JobInput {
                prefetch_lead_ns: j.leads.clone(),
                gate: j.gate,
                free_missed: j.free_missed,
                runs_free: j.runs_free,
                latencies: j.estimates_from,
                ..JobInput::new(
                    &j.graph,
                    j.estimates.iter().map(|&x| x.round() as u64).collect(),
                    j.settings,
                )
            })
            .collect();
        plan(&inputs, &self.config).map_err(|e| match e {
            PlanError::LatencyCount { job, .. }
            | PlanError::SwapRate { job, .. }
            | PlanError::LeadTensor { job, .. } => ReplanError::Plan {
                job: ids[job],
                source: e,
            },
            PlanError::Bandwidth { .. } => ReplanError::Planner(e),
        })
    }

    /// [`Replanner::adopt`] for the plans in use with only their gates
    /// moved (a stretch, an undone one): they keep the period they were
    /// handed out on, which [`Replanner::unstretched`] goes back toward.
    fn adopt_regated(&mut self, out: &mut MultiPlan) {
        let origin = self.plans.in_use().map_or(0, |u| u.origin_ns);
        self.adopt(out);
        self.plans.regated_from(origin);
    }

    /// Makes `out` the current plans: a new version, the gates and the
    /// waits the plans accept. Gated plans made due by a job's
    /// measurements (all but an undone stretch, whose caller clears
    /// `asked`) are anchored on that job ([`MultiPlan::anchor_job`]):
    /// it just ended the iteration that asked, and the new cycle begins
    /// where it stands. On the old cycle's grid its next slot could be
    /// already past (it was late: it would start at once, short of the
    /// others' phases by as much as it was late) or most of a period away.
    fn adopt(&mut self, out: &mut MultiPlan) {
        self.due = Due::Nothing;
        self.held = Held::Nothing;
        out.anchor_job = self
            .asked
            .take()
            .filter(|_| out.cycle_ns > 0)
            .and_then(|id| self.jobs.keys().position(|&k| k == id));
        self.version += 1;
        for p in &mut out.plans {
            p.version = self.version;
        }
        // Kept without its anchor: plans handed out again later (a
        // fallback, a stretch) take the anchor of their own time.
        self.plans.handed_out(InUse {
            plans: MultiPlan {
                anchor_job: None,
                ..out.clone()
            },
            origin_ns: out.cycle_ns,
            gates_only: false,
        });
        for (j, p) in self.jobs.values_mut().zip(&out.plans) {
            j.at_plan = j.estimates.iter().sum();
            j.last_iteration_ns = 0;
            j.gate = p.gate;
            j.runs_free = p.gate.is_none();
            j.turns = out.layout == crate::Layout::Turns;
            j.switch_pending = true;
            j.spare = 0;
            j.active_ns = 0;
            j.spare_iter_ns = 0;
            j.planned_late.clear();
            for w in &p.prediction.waits {
                for &t in &j.graph.op(w.op).inputs {
                    let wait = j.planned_late.entry(j.graph.storage_root(t)).or_insert(0);
                    *wait = (*wait).max(w.ns);
                }
            }
        }
    }
}

impl Replan for Replanner {
    fn after_iteration(
        &mut self,
        job: JobId,
        measured: &Measurements,
    ) -> Result<Vec<(JobId, Plan)>, ReplanError> {
        self.replan_after(job, measured, Replanner::plan_due)
    }

    fn anchor_job(&self) -> Option<JobId> {
        self.handed_anchor
    }
}

mod control;
mod late;
mod period;
#[cfg(test)]
mod tests;
