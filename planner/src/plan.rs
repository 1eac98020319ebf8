//! The planner's output: one versioned plan per job, and diagnostics.

use tensile_graph::{Liveness, OpId, TensorId};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    /// Copy to host; the device memory is freed once the copy has completed,
    /// at the next op boundary.
    SwapOut,
    /// Allocate on the device and copy back from the host.
    SwapIn,
    /// Drop the device copy (dead, or a valid host copy exists).
    Release,
    /// Re-run the tensor's producer right before the trigger op.
    Recompute,
}

impl EventKind {
    pub fn name(self) -> &'static str {
        match self {
            EventKind::SwapOut => "swap_out",
            EventKind::SwapIn => "swap_in",
            EventKind::Release => "release",
            EventKind::Recompute => "recompute",
        }
    }
}

/// When an event fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Trigger {
    /// `delay` after the iteration starts.
    IterationStart,
    /// `delay` after this op ends.
    After(OpId),
    /// Right before this op starts (recomputations; in order).
    Before(OpId),
}

/// One action on one storage, named by its root tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Event {
    pub trigger: Trigger,
    pub delay_ns: u64,
    pub kind: EventKind,
    pub tensor: TensorId,
}

impl Event {
    /// Free after last use, as PyTorch does with no plan ("vanilla"): a
    /// release after the last access of every storage that has one, in
    /// storage order. Here, beside [`Event`], so that the baselines and the
    /// executor's tests build it the same way.
    pub fn releases_after_last_use(live: &Liveness) -> Vec<Event> {
        live.storages
            .iter()
            .filter_map(|st| {
                st.freed_after.map(|op| Event {
                    trigger: Trigger::After(op),
                    delay_ns: 0,
                    kind: EventKind::Release,
                    tensor: st.root,
                })
            })
            .collect()
    }
}

/// A wait of the job's compute for prefetches that cannot be hidden behind
/// it, which the plan accepts to meet a memory budget: the executor waits
/// for an op's inputs to arrive before it runs the op (or one of the
/// recomputations before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// The op before which the job waits.
    pub op: OpId,
    /// How many of the recomputations that run before `op` run before the
    /// wait.
    pub after_recomputes: usize,
    /// How long, on the predicted time line.
    pub ns: u64,
}

/// What the planner predicts for the job under its plan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prediction {
    pub vanilla_peak_bytes: u64,
    pub planned_peak_bytes: u64,
    pub vanilla_time_ns: u64,
    pub planned_time_ns: u64,
    pub swap_outs: usize,
    pub swap_ins: usize,
    pub swapped_bytes: u64,
    pub recomputed_ops: usize,
    /// Where the job waits for late prefetches, in order (empty unless a
    /// budget could not be met otherwise). Their sum is part of
    /// `planned_time_ns`.
    pub waits: Vec<Wait>,
    /// Memory during each step of the planned iteration: (start ns, bytes).
    pub timeline: Vec<(u64, u64)>,
    /// The same for the vanilla iteration.
    pub vanilla_timeline: Vec<(u64, u64)>,
    /// For a coordinated job, when each op (by id) is to start within the
    /// iteration, the recomputations before it included: its executor does
    /// not start an op earlier (paces itself to the plan), since the plan's
    /// copies, and the other jobs' memory, are timed on it. Empty: no
    /// pacing.
    pub op_start_ns: Vec<u64>,
}

impl Prediction {
    /// How long the job waits for late prefetches in one iteration.
    pub fn stall_ns(&self) -> u64 {
        self.waits.iter().map(|w| w.ns).sum()
    }
}

/// A job's plan. The worker switches plans only at iteration boundaries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub version: u64,
    /// Sorted by trigger position, then delay.
    pub events: Vec<Event>,
    /// Persistent storages that are swapped across the iteration boundary:
    /// they begin every iteration on the host.
    pub start_on_host: Vec<TensorId>,
    pub prediction: Prediction,
    /// When the job may start its iterations, for a job coordinated with
    /// others (`PlannerConfig::coordinate`); `None`: it runs free.
    pub gate: Option<crate::Gate>,
}

impl Plan {
    pub fn count(&self, kind: EventKind) -> usize {
        self.events.iter().filter(|e| e.kind == kind).count()
    }
}

/// What kind of thing the planner could not do. Mirrors the contract's
/// `DiagnosticKind` (`proto/src/convert.rs` maps one to the other), so that
/// a client can act on the kind instead of parsing the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DiagnosticKind {
    /// No copy window on the link fits between the tensor's accesses.
    NoSwapWindow,
    /// The job's maximum swapping rate is reached.
    SwapRateLimit,
    /// The producer's inputs are not resident across the gap.
    NotRecomputable,
    /// The budget still does not hold after swapping and recomputing.
    OverBudget,
    /// Planning stopped at a cap (its round limit, its work bound or its
    /// time cap): the plan is valid, but may save less than it could.
    PlanningCapped,
}

impl DiagnosticKind {
    pub const ALL: [DiagnosticKind; 5] = [
        DiagnosticKind::NoSwapWindow,
        DiagnosticKind::SwapRateLimit,
        DiagnosticKind::NotRecomputable,
        DiagnosticKind::OverBudget,
        DiagnosticKind::PlanningCapped,
    ];

    /// The snake-case name files and reports use.
    pub fn name(self) -> &'static str {
        match self {
            DiagnosticKind::NoSwapWindow => "no_swap_window",
            DiagnosticKind::SwapRateLimit => "swap_rate_limit",
            DiagnosticKind::NotRecomputable => "not_recomputable",
            DiagnosticKind::OverBudget => "over_budget",
            DiagnosticKind::PlanningCapped => "planning_capped",
        }
    }

    pub fn from_name(name: &str) -> Option<DiagnosticKind> {
        DiagnosticKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Something the planner could not do, and why: an infeasible plan is
/// data, not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The job (index into the planned jobs); 0 for what concerns all jobs
    /// together (the budget, the round limit).
    pub job: usize,
    pub kind: DiagnosticKind,
    /// The tensor concerned, if any (a storage root of the job's graph).
    pub tensor: Option<TensorId>,
    /// For people; the kind and the tensor say the same for programs.
    pub message: String,
}

impl std::fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// How the planned jobs share the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// Every job runs free, beside the others, with no gate.
    #[default]
    Free,
    /// Gated jobs with one period, their iterations overlapping
    /// (coordinated: their memory curves interleave).
    Gated,
    /// Gated jobs taking turns: one job's iterations at a time, the
    /// period the sum of their turns, so that none runs beside another.
    Turns,
}

impl Layout {
    /// `free`, `gated` or `turns`.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Free => "free",
            Layout::Gated => "gated",
            Layout::Turns => "turns",
        }
    }
}

/// The result of planning all jobs on one device.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MultiPlan {
    pub plans: Vec<Plan>,
    /// The paper's global peak: the sum of the jobs' peaks.
    pub sum_of_peaks_bytes: u64,
    /// The peak of the jobs' memory curves added on one time line, all jobs
    /// starting together and repeating their iterations, over the longest
    /// job's first iteration (what phase-aligned jobs would reach; free-running
    /// jobs drift and may reach up to the sum of peaks).
    pub aligned_peak_bytes: u64,
    /// The gates' common period for coordinated jobs (0: none); their
    /// aligned peak (`aligned_peak_bytes`) is then at their gates' phases.
    pub cycle_ns: u64,
    /// How the plans share the device.
    pub layout: Layout,
    /// The predicted time for every job to run one iteration while they
    /// share the device (free or gated; `k / sum of 1 / iteration`), ns;
    /// 0: not predicted (no budget, or one job).
    pub shared_cycle_ns: u64,
    /// The predicted cycle of the jobs taking turns (the sum of their
    /// turns), ns; 0: turns were not planned, or could not beat sharing
    /// (the sum of the jobs' vanilla iterations alone was already longer
    /// than `shared_cycle_ns`).
    pub turns_cycle_ns: u64,
    /// One line for people: which layout was taken and why.
    pub layout_note: String,
    pub vanilla_sum_of_peaks_bytes: u64,
    pub rounds: usize,
    pub diagnostics: Vec<Diagnostic>,
    /// Where the planning time went.
    pub profile: PlanProfile,
    /// The job (an index into `plans`) whose next slot the gates' epoch is
    /// to put at the time the plans are published: the job whose
    /// measurements asked for them just ended that iteration and stands
    /// where the new cycle begins. `None`: the epoch keeps the cycle of
    /// the gates in use.
    pub anchor_job: Option<usize>,
}

impl MultiPlan {
    /// Gives every gate one epoch on the drivers' shared clock for plans
    /// published at `now`, `previous` being any gate in use: the anchor
    /// job's next slot at `now` when there is one, else the cycle in use
    /// kept ([`crate::Gate::epoch_for`]).
    pub fn set_epoch(&mut self, previous: Option<crate::Gate>, now: u64) {
        let anchor = self
            .anchor_job
            .and_then(|k| self.plans.get(k))
            .and_then(|p| p.gate);
        let epoch = crate::Gate::epoch_for(previous, anchor, now);
        for g in self.plans.iter_mut().filter_map(|p| p.gate.as_mut()) {
            g.epoch_ns = epoch;
        }
    }
}

/// Where one planning call's wall-clock time went, for logs and benches.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlanProfile {
    /// Liveness analysis and the jobs' vanilla time lines.
    pub setup: std::time::Duration,
    /// Greedy swap rounds (placing swaps that add no time).
    pub swap: std::time::Duration,
    pub swap_rounds: usize,
    /// Budget rounds (recomputations and waited-for swaps, tried on copies).
    pub budget: std::time::Duration,
    pub budget_rounds: usize,
    /// Building the plans from the planned jobs.
    pub emit: std::time::Duration,
    /// The phase-aligned peak of all jobs' curves.
    pub aligned: std::time::Duration,
    pub total: std::time::Duration,
    /// Whether the search stopped at `PlannerConfig::max_moves` or
    /// `PlannerConfig::time_cap`.
    pub capped: bool,
    /// Whether it stopped at `PlannerConfig::time_cap` (the safety net):
    /// where the plan then stopped depends on the machine's load.
    pub time_capped: bool,
    /// Moves the whole call tried: swaps it tried to place and budget
    /// moves it tried on a copy of a job, in every layout it planned.
    pub moves_tried: u64,
}

#[cfg(test)]
mod tests {
    use super::DiagnosticKind;

    #[test]
    fn diagnostic_kinds_round_trip_by_name() {
        for k in DiagnosticKind::ALL {
            assert_eq!(DiagnosticKind::from_name(k.name()), Some(k));
        }
        assert_eq!(DiagnosticKind::from_name("unspecified"), None);
    }
}
