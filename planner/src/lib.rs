//! TENSILE's planner as a pure library: graphs, per-op latencies, a copy
//! model and per-job settings in; a versioned plan per job and diagnostics
//! out. No I/O, no async, no wire types (an architecture invariant).
//!
//! # Layout
//! - `config`: the copy link and per-job knobs.
//! - `job`: one job's steps, storages, gaps, memory per step, channels.
//! - `host_copies`: the program's own copies around its host ops, placed
//!   before the planner's.
//! - `intervals`: copy-channel occupancy (half-open interval sets).
//! - `memtree`: memory per step (segment tree: range add, first maximum).
//! - `swap`: greedy swap scheduling, across-iteration swaps, host-copy reuse.
//! - `recompute`: MSPS recomputation with producer chains.
//! - `plan`: the output types.
//! - `replan`: re-planning as a library: the jobs' graphs by id, EWMA of
//!   measured latencies, when a re-plan is due, late-prefetch feedback.
//!
//! - `overhead`: what meets a budget at a time cost: recomputations and
//!   swaps whose prefetch the job waits for, by a unified MSPS.
//! - `gate`: iteration gates (a period and a phase per coordinated job) and
//!   the drivers' clock of slots.
//! - `guard`: which resident storages a memory limit's guard moves first
//!   (the executor's and the PyTorch hook's one rule).
//! - `align`: memory curves on one periodic time line, the peak of their
//!   aligned sum, the phases that make it lowest.
//! - `coord`: coordinated jobs planned on one common time line (one cycle,
//!   the link's channels shared by all jobs' copies).
//!
//! The loop: swap at every job's peak while anything fits; when
//! nothing does and the sum of the jobs' peaks is over the budget, take the
//! move that saves the most bytes at a peak per second it adds (a
//! recomputation, or a swap that makes the job wait for its prefetch) and go
//! back to swapping on the new time line. Without a budget, or under it, no
//! time is ever added.
//!
//! Coordinated (`PlannerConfig::coordinate`, two jobs or more whose
//! iterations are within 15% of each other): every job
//! gets a gate, one common period and its own phase, chosen so that the
//! aligned sum of the jobs' curves (each planned alone on the whole link
//! first) peaks lowest; then the loop above runs on the aligned sum's peak
//! instead of each job's, and every job's copies are placed on the whole
//! link around the other jobs' copies (one common time line over both
//! directions, rather than each job on its share of the bandwidth).
//!
//! Turns (`turns`): under a budget, coordinated jobs may instead take
//! turns, on gates whose period is the sum of their iterations alone and
//! whose phases put one job's iterations after another's, so that none
//! runs beside another; they are taken when they fit the budget and their
//! predicted cycle is shorter than sharing's (`PlannerConfig::turns`).

mod align;
mod config;
mod coord;
mod emit;
mod free;
mod gate;
pub mod guard;
mod host_copies;
mod intervals;
mod job;
mod lengthen;
mod memtree;
mod overhead;
mod plan;
mod recompute;
mod replan;
mod rounds;
mod swap;
mod turns;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::Instant;

use tensile_graph::{Graph, Liveness, TensorId};

pub use align::{Curve, aligned_sum_peak, choose_phases};
pub use config::{CopyModel, JobSettings, PlannerConfig, RecomputeFirst, Turns};
pub use gate::{Gate, GateClock};
pub use intervals::IntervalSet;
pub use plan::{
    Diagnostic, DiagnosticKind, Event, EventKind, Layout, MultiPlan, Plan, PlanProfile, Prediction,
    Trigger, Wait,
};
pub use replan::{FixedPlans, JobId, Measurements, Replan, ReplanError, ReplanReason, Replanner};

use align::aligned_peak;
use coord::Coord;
use emit::emit;
use job::Job;
use lengthen::Lengthen;
use rounds::{Failed, MAX_TRIES, TRIES, Tried, budget_round, op_starts, swap_round, try_move};

/// One job to plan.
#[derive(Debug, Clone)]
pub struct JobInput<'g> {
    pub graph: &'g Graph,
    /// Predicted (or measured) latency of every op, ns, indexed by op id.
    pub latency_ns: Vec<u64>,
    pub settings: JobSettings,
    /// Extra lead for the prefetch of these tensors' storages: a swap-in
    /// must end this long before the access that needs it (Capuchin's
    /// feedback for prefetches that arrived late).
    pub prefetch_lead_ns: BTreeMap<TensorId, u64>,
    /// The gate the job runs with now, if any: coordinated planning keeps
    /// the jobs' phases unless new ones are clearly better.
    pub gate: Option<Gate>,
    /// The job ran free under the budget and its executor's guard had to
    /// evict to hold the budget: the free plans' sum of peaks did not hold
    /// on the run (the jobs' copies, sharing the link at moments no plan
    /// chose, came later than each plan's share of it promised). A
    /// coordinated plan is then taken whenever one fits.
    pub free_missed: bool,
    /// The job runs free now: it has run iterations on a free plan.
    pub runs_free: bool,
    /// Where `latency_ns` comes from, which says how sharing and turns
    /// take it (`PlannerConfig::sharing_slowdown` converts one to the
    /// other).
    pub latencies: MeasuredIn,
}

/// Where a job's latencies come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MeasuredIn {
    /// Measured beside the other jobs, sharing the device, or predicted
    /// and not yet measured: sharing takes them as they are, turns as
    /// slower than alone by the sharing slowdown. (A prediction is in fact
    /// of the job alone and belongs to no number of jobs: taken as beside
    /// `k - 1` others, the same predictions mean a job `1 + s (k - 1)`
    /// times faster alone, so that three cold jobs in turns re-planned as
    /// two before any measurement get a period 7/6 of the three's at
    /// `s = 3`. Taking predictions as alone ones instead moved 9 of the 135
    /// simulator goldens, the paper bench's dominated baselines 38 -> 30:
    /// a rule to weigh on the colocate sweep.)
    #[default]
    Sharing,
    /// Measured while the job took turns (its plan's layout
    /// [`Layout::Turns`]), with no other job beside it: turns take them as
    /// they are, sharing as faster than beside the others.
    Turns,
}

impl<'g> JobInput<'g> {
    pub fn new(graph: &'g Graph, latency_ns: Vec<u64>, settings: JobSettings) -> JobInput<'g> {
        JobInput {
            graph,
            latency_ns,
            settings,
            prefetch_lead_ns: BTreeMap::new(),
            gate: None,
            free_missed: false,
            runs_free: false,
            latencies: MeasuredIn::Sharing,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("job {job}: {got} latencies for a graph of {ops} ops")]
    LatencyCount { job: usize, got: usize, ops: usize },
    #[error("job {job}: max_swap_rate {rate} is not in [0, 1]")]
    SwapRate { job: usize, rate: f64 },
    #[error("job {job}: prefetch lead for tensor {tensor}, which the graph does not have")]
    LeadTensor { job: usize, tensor: u32 },
    #[error("copy bandwidths must be positive and finite (h2d {h2d}, d2h {d2h})")]
    Bandwidth { h2d: f64, d2h: f64 },
}

/// How far one planning call may go (`PlannerConfig::max_moves`, and
/// `time_cap` as a safety net), and the work it has done: the moves it
/// tried (every swap it tried to place, every budget move it tried on a
/// copy of a job).
#[derive(Debug)]
struct Bound {
    max_moves: Option<u64>,
    at: Option<Instant>,
    moves: Cell<u64>,
    /// The time cap was reached (sticky: once past, every check says so).
    timed_out: Cell<bool>,
    /// A check found the bound reached: some search stopped short.
    cut: Cell<bool>,
}

impl Bound {
    fn new(config: &PlannerConfig, started: Instant) -> Bound {
        Bound {
            max_moves: config.max_moves,
            at: config.time_cap.map(|c| started + c),
            moves: Cell::new(0),
            timed_out: Cell::new(false),
            cut: Cell::new(false),
        }
    }

    /// Whether the search must stop: its work bound reached, or (the
    /// safety net) its time cap.
    fn past(&self) -> bool {
        if self.max_moves.is_some_and(|m| self.moves.get() >= m) {
            self.cut.set(true);
            return true;
        }
        if !self.timed_out.get() && self.at.is_some_and(|d| Instant::now() >= d) {
            self.timed_out.set(true);
            self.cut.set(true);
        }
        self.timed_out.get()
    }

    /// Counts one move tried.
    fn tried(&self) {
        self.moves.set(self.moves.get() + 1);
        #[cfg(test)]
        tests::slow_move();
    }
}

/// The bound of the planning call in progress, shared by its searches.
type Deadline<'a> = &'a Bound;

/// Plans all `jobs` together for one device.
pub fn plan(jobs: &[JobInput<'_>], config: &PlannerConfig) -> Result<MultiPlan, PlanError> {
    let started = Instant::now();
    let bound = Bound::new(config, started);
    let deadline = &bound;
    let c = &config.copy;
    for bw in [c.h2d_bytes_per_s, c.d2h_bytes_per_s] {
        if !(bw.is_finite() && bw > 0.0) {
            return Err(PlanError::Bandwidth {
                h2d: c.h2d_bytes_per_s,
                d2h: c.d2h_bytes_per_s,
            });
        }
    }
    for (j, input) in jobs.iter().enumerate() {
        if input.latency_ns.len() != input.graph.ops().len() {
            return Err(PlanError::LatencyCount {
                job: j,
                got: input.latency_ns.len(),
                ops: input.graph.ops().len(),
            });
        }
        let tensors = input.graph.tensors().len();
        if let Some((t, _)) = input
            .prefetch_lead_ns
            .iter()
            .find(|(t, _)| t.index() >= tensors)
        {
            return Err(PlanError::LeadTensor {
                job: j,
                tensor: t.0,
            });
        }
        let rate = input.settings.max_swap_rate;
        if !(0.0..=1.0).contains(&rate) {
            return Err(PlanError::SwapRate { job: j, rate });
        }
    }
    let lives: Vec<Liveness> = jobs.iter().map(|j| Liveness::analyze(j.graph)).collect();
    let at = turns::Latencies::new(jobs, config);
    let shared = plan_shared(&at.shared(), &lives, config, started, deadline);
    let mut mp = turns::choose(&at, &lives, config, shared, started, deadline);
    mp.profile.moves_tried = bound.moves.get();
    mp.profile.time_capped = bound.timed_out.get();
    // Whichever layout was kept, a search that stopped short says so.
    mp.profile.capped |= bound.cut.get();
    if mp.profile.capped
        && !mp
            .diagnostics
            .iter()
            .any(|d| d.kind == DiagnosticKind::PlanningCapped)
    {
        let mut scratch = MultiPlan::default();
        stop_here(config, &bound, &mut scratch);
        mp.diagnostics.extend(scratch.diagnostics);
    }
    Ok(mp)
}

/// [`plan`] of jobs that share the device: free, or gated when that fits
/// the budget better.
fn plan_shared(
    jobs: &[JobInput<'_>],
    lives: &[Liveness],
    config: &PlannerConfig,
    started: Instant,
    deadline: Deadline<'_>,
) -> MultiPlan {
    let free = plan_with(jobs, lives, config, Layout::Free, started, deadline);
    // Gates are for fitting a budget that the jobs do not fit running free
    // without time: a coordinated plan paces its jobs (a few percent of
    // their time) and is taken only when it fits the budget at less cost.
    // Jobs that already run gated stay gated while a gated plan fits, even
    // when their iterations now look further apart: their measured
    // latencies come from running gated (a job's ops run faster while the
    // others wait at their gates, and the first re-plan may mix one job's
    // measurements with the others' cold-start estimates), so a free plan
    // made from them promises more than running free gives, and every
    // switch costs each job a realignment.
    let gated_now = jobs.iter().all(|j| j.gate.is_some());
    let Some(budget) = config.budget_bytes.filter(|_| {
        config.coordinate && jobs.len() >= 2 && (gated_now || similar_iterations(jobs))
    }) else {
        return free;
    };
    // A free plan the run has already contradicted does not fit, whatever
    // it predicts.
    let free_fits = free.sum_of_peaks_bytes <= budget && !jobs.iter().any(|j| j.free_missed);
    // Jobs that run free stay free while a free plan fits and the runs
    // have not contradicted it: a switch to gates costs every job a
    // realignment, and while the jobs take their phases the link carries
    // the copies of both plans at once.
    let free_now = jobs.iter().all(|j| j.runs_free);
    // Jobs with host ops (updates kept on the host) take gates whenever a
    // gated plan fits: their copies come in bursts tied to the update
    // order (every gradient out in the backward pass, every parameter back
    // in the forward), which free-running jobs' bursts meet on the link as
    // their phases drift, so that a free plan counting each job on its
    // share of the link misses (two BERT-base copies at 0.75 of the batch
    // on the a6000: steady-state EOR 0.04 to 0.40 free, -0.04 to 0.01
    // gated); gates also put one job's wait for its host updates beside
    // the other's compute.
    let host_ops = jobs.iter().any(|j| j.graph.has_host_ops());
    if free_fits && (time_cost(&free) == 0.0 || free_now) && !gated_now && !host_ops {
        return free;
    }
    let gated = plan_with(jobs, lives, config, Layout::Gated, started, deadline);
    let gated_fits = gated.aligned_peak_bytes <= budget;
    let take_gated = match (free_fits, gated_fits) {
        (_, false) if free_fits => false,
        (false, false) => gated.aligned_peak_bytes < free.sum_of_peaks_bytes,
        (true, true) => gated_now || host_ops || time_cost(&gated) < time_cost(&free),
        (false, true) => true,
        _ => false,
    };
    if take_gated { gated } else { free }
}

/// The most any job's planned iteration is longer than its vanilla one (a
/// coordinated job's: its gate's period), as a share of the vanilla one.
fn time_cost(mp: &MultiPlan) -> f64 {
    mp.plans
        .iter()
        .map(|p| {
            let planned = p.gate.map_or(p.prediction.planned_time_ns, |g| g.period_ns);
            planned as f64 / p.prediction.vanilla_time_ns.max(1) as f64 - 1.0
        })
        .fold(0.0, f64::max)
}

/// [`plan`] on validated jobs in one layout: running free, coordinated, or
/// taking turns (coordinated on the turns' gates).
fn plan_with(
    jobs: &[JobInput<'_>],
    lives: &[Liveness],
    config: &PlannerConfig,
    layout: Layout,
    started: Instant,
    deadline: Deadline<'_>,
) -> MultiPlan {
    let coordinate = layout != Layout::Free;
    // Coordinated jobs plan for a little less than the budget and save only
    // what they must: the headroom and the fewer copies absorb what a run
    // does differently from its plan (the executor's guard holds the
    // budget itself).
    let coordinated = PlannerConfig {
        budget_bytes: config
            .budget_bytes
            .map(|b| (b as f64 * (1.0 - config.coordinated_margin.clamp(0.0, 1.0))) as u64),
        stop_at_budget: config.stop_at_budget || config.budget_bytes.is_some(),
        ..*config
    };
    let config = if coordinate { &coordinated } else { config };
    let c = &config.copy;
    // Coordinated jobs share the whole link on one time line; free-running
    // ones each plan on their share of it.
    let share = if coordinate {
        config.coordinated_link.clamp(0.01, 1.0)
    } else if !c.shared_by_jobs {
        1.0
    } else {
        1.0 / jobs.len().max(1) as f64
    };
    let mut state: Vec<Job<'_>> = jobs
        .iter()
        .zip(lives)
        .map(|(input, live)| {
            // A coordinated job plans on its latencies padded a little, and
            // its executor paces itself to the plan: jitter is absorbed by
            // the padding instead of moving the job off its phase.
            let latency = if coordinate {
                let pad = 1.0 + config.pace_pad.max(0.0);
                input
                    .latency_ns
                    .iter()
                    .map(|&x| (x as f64 * pad).round() as u64)
                    .collect()
            } else {
                input.latency_ns.clone()
            };
            let mut job = Job::new(input.graph, live, latency, input.settings, *c, share);
            for (&t, &lead) in &input.prefetch_lead_ns {
                let s = live.storage_of[t.index()].index();
                job.st[s].lead = job.st[s].lead.max(lead);
            }
            job
        })
        .collect();
    type Curve = (u64, u64, Vec<(u64, u64)>);
    let vanilla: Vec<Curve> = state
        .iter()
        .map(|j| (j.peak().0, j.iteration_ns(), j.timeline()))
        .collect();

    let limits: Vec<u64> = vanilla
        .iter()
        .map(|v| (v.1 as f64 * (1.0 + config.max_overhead.max(0.0))) as u64)
        .collect();
    let mut out = MultiPlan {
        layout,
        ..MultiPlan::default()
    };
    let fresh = (layout == Layout::Gated).then(|| state.clone());
    let mut coord = match layout {
        Layout::Gated => {
            let coord = choose_gates(&state, jobs, config, &limits, deadline);
            coord.install(&mut state);
            Some(coord)
        }
        Layout::Free | Layout::Turns => None,
    };
    out.profile.setup = started.elapsed();
    let mut capped = match (&coord, layout) {
        (Some(c), _) => {
            lengthen::search_coordinated(&mut state, config, c, &limits, deadline, &mut out)
        }
        (None, Layout::Turns) => {
            let (c, capped) = turns::search(&mut state, config, &limits, deadline, &mut out);
            coord = Some(c);
            capped
        }
        (None, _) => search(&mut state, config, None, &limits, deadline, &mut out),
    };
    if let (Some(c), Some(fresh), Some(budget)) = (&mut coord, &fresh, config.budget_bytes) {
        let at = Lengthen {
            fresh,
            base: c.clone(),
            budget,
            config,
            limits: &limits,
            deadline,
        };
        capped = at.lengthen(&mut state, c, capped, &mut out);
    }
    let total = global_peak(&state, coord.as_ref());
    if let Some(b) = config.budget_bytes.filter(|&b| total > b) {
        let floor: u64 = state.iter().map(Job::lower_bound).sum();
        let why = if capped {
            format!(
                "going lower would make a job more than {:.0}% slower than vanilla (max_overhead)",
                config.max_overhead * 100.0
            )
        } else {
            "nothing more could be swapped or recomputed".to_string()
        };
        let what = if coord.is_some() {
            "the aligned sum of the gated jobs' planned memory peaks at"
        } else {
            "the planned peaks add up to"
        };
        out.diagnostics.push(Diagnostic {
            job: 0,
            kind: DiagnosticKind::OverBudget,
            tensor: None,
            message: format!(
                "{what} {total} bytes, over the budget of {b} bytes: {why} (no plan goes under {floor} bytes, the largest working set of one op plus the base, per job)"
            ),
        });
    }
    let t = Instant::now();
    for (j, (job, (vpeak, vtime, vline))) in state.iter().zip(vanilla).enumerate() {
        let mut p = emit(job);
        p.prediction.vanilla_peak_bytes = vpeak;
        p.prediction.vanilla_time_ns = vtime;
        p.prediction.vanilla_timeline = vline;
        p.version = 1;
        p.gate = coord.as_ref().map(|c| Gate {
            period_ns: c.cycle,
            phase_ns: c.phases[j],
            epoch_ns: 0,
        });
        if coord.is_some() {
            p.prediction.op_start_ns = op_starts(job);
        }
        if job.swap_outs == 0 && job.settings.swap && job.n() > 0 {
            out.diagnostics.push(Diagnostic {
                job: j,
                kind: DiagnosticKind::NoSwapWindow,
                tensor: None,
                message:
                    "no swap could be placed: no idle tensor at the peak fits the copy channels"
                        .into(),
            });
        }
        out.plans.push(p);
    }
    out.sum_of_peaks_bytes = out
        .plans
        .iter()
        .map(|p| p.prediction.planned_peak_bytes)
        .sum();
    out.vanilla_sum_of_peaks_bytes = out
        .plans
        .iter()
        .map(|p| p.prediction.vanilla_peak_bytes)
        .sum();
    out.profile.emit = t.elapsed();
    let t = Instant::now();
    out.cycle_ns = coord.as_ref().map_or(0, |c| c.cycle);
    out.aligned_peak_bytes = match &coord {
        Some(c) => c.peak(&state).bytes,
        None => aligned_peak(
            &out.plans
                .iter()
                .map(|p| {
                    (
                        p.prediction.planned_time_ns,
                        p.prediction.timeline.as_slice(),
                    )
                })
                .collect::<Vec<_>>(),
        ),
    };
    out.profile.aligned = t.elapsed();
    out.profile.total = started.elapsed();
    out
}

/// How much shorter than the longest a job's iteration may be for the jobs
/// to be coordinated: they share one gate period, so a shorter job waits
/// at its gate what it is shorter.
const SIMILAR_ITERATIONS: f64 = 0.85;

/// Whether the jobs' iterations (their latencies added up) are close enough
/// for one gate period: within [`SIMILAR_ITERATIONS`] of the longest.
fn similar_iterations(jobs: &[JobInput<'_>]) -> bool {
    let times: Vec<u64> = jobs.iter().map(|j| j.latency_ns.iter().sum()).collect();
    let longest = times.iter().copied().max().unwrap_or(0) as f64;
    times
        .iter()
        .all(|&t| t as f64 >= longest * SIMILAR_ITERATIONS)
}

/// The loop (see the crate's doc) on `state`, coordinated on `coord` when
/// given; returns whether a move was refused for `max_overhead`.
fn search(
    state: &mut [Job<'_>],
    config: &PlannerConfig,
    coord: Option<&Coord>,
    limits: &[u64],
    deadline: Deadline<'_>,
    out: &mut MultiPlan,
) -> bool {
    search_with(state, config, coord, limits, deadline, out, true)
}

/// [`search`], with moves that add time only when `add_time`.
fn search_with(
    state: &mut [Job<'_>],
    config: &PlannerConfig,
    coord: Option<&Coord>,
    limits: &[u64],
    deadline: Deadline<'_>,
    out: &mut MultiPlan,
    add_time: bool,
) -> bool {
    if coord.is_none() && free::separable(state, config) {
        return free::search(state, config, limits, deadline, out, add_time);
    }
    let mut failed = Failed::default();
    let mut tried = Tried::default();
    let mut capped = false;
    loop {
        if stop_here(config, deadline, out) {
            break;
        }
        let fits = config.budget_bytes.filter(|_| config.stop_at_budget);
        if fits.is_some_and(|b| global_peak(state, coord) <= b) {
            break;
        }
        let t = Instant::now();
        let placed = swap_round(state, &mut failed, fits, deadline, coord);
        out.profile.swap_rounds += 1;
        out.profile.swap += t.elapsed();
        // A round cut short by the deadline placed what it could: the top
        // of the loop stops (nothing placed then does not mean done).
        if placed > 0 || deadline.past() {
            continue;
        }
        if state.iter().any(|j| !j.wrap_allowed) {
            for j in state.iter_mut() {
                j.wrap_allowed = true;
            }
            continue;
        }
        if add_time
            && config
                .budget_bytes
                .is_some_and(|b| global_peak(state, coord) > b)
        {
            let t = Instant::now();
            let moved = budget_round(
                state,
                config,
                limits,
                &mut tried,
                &mut capped,
                deadline,
                coord,
            );
            out.profile.budget_rounds += 1;
            out.profile.budget += t.elapsed();
            if let Some(j) = moved {
                // Only job `j` changed: a swap that failed on another job
                // (placing one reads that job alone) would fail again,
                // unless its channels changed with `j`'s copies.
                match coord {
                    Some(c) => {
                        c.refresh_foreign(state);
                        failed.clear();
                    }
                    None => failed.retain(|&(k, _, _)| k != j),
                }
                continue;
            }
            if deadline.past() {
                continue;
            }
        }
        break;
    }
    capped
}

/// Counts a round of the search; true, with a `PlanningCapped`
/// diagnostic, where the search must stop before it: past its cap, or past
/// `max_rounds`.
fn stop_here(config: &PlannerConfig, deadline: Deadline<'_>, out: &mut MultiPlan) -> bool {
    if deadline.past() {
        let at = if deadline.timed_out.get() {
            format!(
                "the time cap of {:.3} s (a safety net: where it stops depends on the machine's load)",
                config.time_cap.unwrap_or_default().as_secs_f64()
            )
        } else {
            format!(
                "the work bound of {} moves tried",
                config.max_moves.unwrap_or_default()
            )
        };
        out.diagnostics.push(Diagnostic {
            job: 0,
            kind: DiagnosticKind::PlanningCapped,
            tensor: None,
            message: format!(
                "stopped at {at} after {} rounds: the plans hold every move made until then",
                out.rounds
            ),
        });
        out.profile.capped = true;
        return true;
    }
    out.rounds += 1;
    if out.rounds > config.max_rounds {
        out.diagnostics.push(Diagnostic {
            job: 0,
            kind: DiagnosticKind::PlanningCapped,
            tensor: None,
            message: format!("stopped after {} rounds", config.max_rounds),
        });
        return true;
    }
    false
}

/// What the budget bounds: the aligned sum's peak for coordinated jobs,
/// else the sum of the jobs' peaks.
fn global_peak(state: &[Job<'_>], coord: Option<&Coord>) -> u64 {
    match coord {
        Some(c) => c.peak(state).bytes,
        None => state.iter().map(|j| j.peak().0).sum(),
    }
}

/// Phases tried per job by the search in [`choose_gates`], evenly spread
/// over the cycle: for two jobs, and for more (each try plans them all).
const PHASE_STEPS: u64 = 12;
const PHASE_STEPS_MANY: u64 = 8;
/// Passes of that search over the jobs (coordinate descent) beyond two.
const PHASE_PASSES: usize = 2;
/// The least slack of the gates' period for three coordinated jobs or
/// more (`PlannerConfig::gate_slack` for two). Their phases are a third of
/// the period apart or less, and a job whose iterations each overrun by 1%
/// (prefetches a little late, under the 3% a re-plan waits for) falls
/// behind its slot until its peak meets a neighbour's; two jobs, half a
/// period apart, lose more to a longer period than to that drift.
pub const MANY_JOBS_SLACK: f64 = 0.02;

/// From how many coordinated jobs the planner treats them as many: the
/// gates' slack is at least [`MANY_JOBS_SLACK`], and by default they are
/// planned recomputing first too ([`RecomputeFirst::ManyJobs`]).
pub const MANY_JOBS: usize = 3;

/// The gates' slack for `jobs` coordinated jobs: `config.gate_slack`, at
/// least [`MANY_JOBS_SLACK`] from [`MANY_JOBS`] jobs on.
pub(crate) fn gate_slack(config: &PlannerConfig, jobs: usize) -> f64 {
    let slack = if jobs >= MANY_JOBS {
        config.gate_slack.max(MANY_JOBS_SLACK)
    } else {
        config.gate_slack
    };
    slack.max(0.0)
}

/// The cycle and phases of coordinated jobs. Each job is planned alone on
/// the whole link (swaps that add no time); the cycle is the longest of
/// those iterations plus `gate_slack` (at least [`MANY_JOBS_SLACK`] for
/// three jobs or more). The phases are searched with the
/// real objective: the aligned peak of the jobs planned together (swaps
/// that add no time) at those phases, starting from the phases at which
/// the curves planned alone interleave best, then trying for each job in
/// turn `PHASE_STEPS` phases spread over the cycle while the others stay.
/// The jobs' current phases (`hint`) are kept unless others are lower by
/// more than 1%, so that re-plans do not move gates for nothing. The
/// search stops at the deadline with the best phases found so far.
fn choose_gates(
    state: &[Job<'_>],
    jobs: &[JobInput<'_>],
    config: &PlannerConfig,
    limits: &[u64],
    deadline: Deadline<'_>,
) -> Coord {
    let free = PlannerConfig {
        budget_bytes: None,
        stop_at_budget: false,
        ..*config
    };
    let mut scratch = MultiPlan::default();
    let curves: Vec<align::Curve> = state
        .iter()
        .enumerate()
        .map(|(j, job)| {
            let mut one = vec![job.clone()];
            search(
                &mut one,
                &free,
                None,
                &limits[j..=j],
                deadline,
                &mut scratch,
            );
            coord::curve(&one[0])
        })
        .collect();
    let longest = curves.iter().map(|c| c.end).max().unwrap_or(0);
    let slack = gate_slack(config, state.len());
    let cycle = ((longest as f64) * (1.0 + slack.max(0.0))).ceil() as u64;
    let cycle = cycle.max(longest).max(1);
    // The gates in use stay as long as every job still fits its period and
    // the period is not much longer than needed (re-plans must not move
    // gates for every small change of the measured latencies: each move
    // costs the jobs a realignment).
    if let Some(kept) = kept_gates(jobs, longest, cycle) {
        return kept;
    }
    let hint: Option<Vec<u64>> = jobs
        .iter()
        .map(|j| j.gate.filter(|g| g.period_ns == cycle))
        .map(|g| g.map(|g| g.phase_ns % cycle))
        .collect();
    // The aligned peak of the jobs planned together at `phases`.
    let mut tried: Vec<(Vec<u64>, u64)> = Vec::new();
    let mut evaluate = |phases: &[u64]| -> u64 {
        if let Some((_, peak)) = tried.iter().find(|(p, _)| p == phases) {
            return *peak;
        }
        let coord = Coord {
            cycle,
            phases: phases.to_vec(),
        };
        let mut jobs = state.to_vec();
        coord.install(&mut jobs);
        search_with(
            &mut jobs,
            config,
            Some(&coord),
            limits,
            deadline,
            &mut scratch,
            false,
        );
        let peak = coord.peak(&jobs).bytes;
        tried.push((phases.to_vec(), peak));
        peak
    };
    // Phases at which the jobs fit the budget without time end the search.
    let fits = |peak: u64| config.budget_bytes.is_some_and(|b| peak <= b);
    let mut best = choose_phases(&curves, cycle, None);
    let mut best_peak = evaluate(&best);
    for _ in 0..PHASE_PASSES {
        if fits(best_peak) {
            break;
        }
        let mut moved = false;
        for j in 1..state.len() {
            let steps = if state.len() == 2 {
                PHASE_STEPS
            } else {
                PHASE_STEPS_MANY
            };
            for step in 0..steps {
                if deadline.past() {
                    break;
                }
                let mut phases = best.clone();
                phases[j] = cycle * step / steps;
                let peak = evaluate(&phases);
                if peak < best_peak {
                    (best, best_peak, moved) = (phases, peak, true);
                }
                if fits(best_peak) {
                    break;
                }
            }
        }
        if !moved || state.len() == 2 {
            break;
        }
    }
    if let Some(h) = hint
        && (evaluate(&h) as f64 <= best_peak as f64 * 1.01 || fits(evaluate(&h)))
    {
        best = h;
    }
    Coord {
        cycle,
        phases: best,
    }
}

/// The jobs' current gates, if they share one period that every job's
/// iteration (`longest` the longest) fits and that is at most 10% longer
/// than `cycle`, the one planning would choose now.
fn kept_gates(jobs: &[JobInput<'_>], longest: u64, cycle: u64) -> Option<Coord> {
    let gates: Vec<Gate> = jobs.iter().map(|j| j.gate).collect::<Option<_>>()?;
    let period = gates.first()?.period_ns;
    let ok = gates.iter().all(|g| g.period_ns == period)
        && period >= longest
        && period as f64 <= cycle as f64 * 1.1;
    ok.then(|| Coord {
        cycle: period,
        phases: gates.iter().map(|g| g.phase_ns % period).collect(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::cell::Cell;
    use std::time::Duration;

    use tensile_graph::Graph;
    use tensile_graph::zoo::{self, ZooConfig};

    use crate::{CopyModel, JobInput, JobSettings, MultiPlan, PlannerConfig, plan};

    thread_local! {
        /// An artificial slowdown: every move tried takes this much longer.
        static SLOW: Cell<Option<Duration>> = const { Cell::new(None) };
    }

    pub(super) fn slow_move() {
        if let Some(d) = SLOW.get() {
            std::thread::sleep(d);
        }
    }

    fn graphs() -> Vec<Graph> {
        ["resnet50", "vgg16"]
            .iter()
            .map(|m| {
                let mut c = ZooConfig::new(2);
                c.resolution = Some(zoo::model(m).unwrap().min_resolution.max(32));
                zoo::build(m, &c).unwrap()
            })
            .collect()
    }

    fn run(graphs: &[Graph], config: &PlannerConfig, slow: Option<Duration>) -> MultiPlan {
        let inputs: Vec<JobInput<'_>> = graphs
            .iter()
            .map(|g| {
                let lat = (0..g.ops().len())
                    .map(|i| 2_000 + ((i * 7_919) % 40_000) as u64)
                    .collect();
                JobInput::new(g, lat, JobSettings::default())
            })
            .collect();
        SLOW.set(slow);
        let mp = plan(&inputs, config).unwrap();
        SLOW.set(None);
        mp
    }

    #[test]
    fn a_work_bound_plans_the_same_however_slow_the_machine() {
        let graphs = graphs();
        let mut config = PlannerConfig::new(CopyModel::duplex(12e9, 12e9, 5_000));
        let free = run(&graphs, &config, None);
        // A budget that budget moves must work towards.
        config.budget_bytes = Some(free.sum_of_peaks_bytes * 7 / 10);
        let whole = run(&graphs, &config, None);
        assert!(!whole.profile.capped && whole.profile.moves_tried > 400);
        config.max_moves = Some(whole.profile.moves_tried / 2);
        let bounded = run(&graphs, &config, None);
        let slowed = run(&graphs, &config, Some(Duration::from_millis(1)));
        assert!(bounded.profile.capped && !bounded.profile.time_capped);
        assert_eq!(bounded.profile.moves_tried, config.max_moves.unwrap());
        assert_eq!(bounded.plans, slowed.plans);
        assert_eq!(bounded.diagnostics, slowed.diagnostics);
        assert_ne!(bounded.plans, whole.plans, "the bound cut nothing");
        // What a wall-clock cap does instead: the slowed machine gets less
        // far (so the test above would fail under it).
        config.max_moves = None;
        config.time_cap = Some(Duration::from_millis(40));
        let timed = run(&graphs, &config, None);
        let timed_slow = run(&graphs, &config, Some(Duration::from_millis(1)));
        assert!(timed_slow.profile.time_capped && timed_slow.profile.capped);
        assert!(
            timed_slow.profile.moves_tried < timed.profile.moves_tried,
            "{} moves slowed, {} not",
            timed_slow.profile.moves_tried,
            timed.profile.moves_tried
        );
    }
}
