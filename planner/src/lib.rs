//! TENSILE's planner as a pure library: graphs, per-op latencies, a copy
//! model and per-job settings in; a versioned plan per job and diagnostics
//! out. No I/O, no async, no wire types (an architecture invariant).
//!
//! # Layout
//! - `config`: the copy link and per-job knobs.
//! - `job`: one job's steps, storages, gaps, memory per step, channels.
//! - `intervals`: copy-channel occupancy (half-open interval sets).
//! - `memtree`: memory per step (segment tree: range add, first maximum).
//! - `swap`: greedy swap scheduling, across-iteration swaps, host-copy reuse.
//! - `recompute`: MSPS recomputation with producer chains.
//! - `plan`: the output types.
//!
//! The loop (SPEC §4.5): swap at every job's peak while anything fits; when
//! nothing does and the sum of the jobs' peaks is over the budget, recompute
//! the best-MSPS tensor and go back to swapping on the new time line.

mod config;
mod intervals;
mod job;
mod memtree;
mod plan;
mod recompute;
mod swap;

use std::collections::{BTreeMap, HashSet};

use tensile_graph::{Graph, Liveness, StorageId, TensorId};

pub use config::{CopyModel, JobSettings, PlannerConfig};
pub use intervals::IntervalSet;
pub use plan::{Diagnostic, Event, EventKind, MultiPlan, Plan, Prediction, Trigger};

use job::Job;

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
}

impl<'g> JobInput<'g> {
    pub fn new(graph: &'g Graph, latency_ns: Vec<u64>, settings: JobSettings) -> JobInput<'g> {
        JobInput {
            graph,
            latency_ns,
            settings,
            prefetch_lead_ns: BTreeMap::new(),
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

/// Plans all `jobs` together for one device.
pub fn plan(jobs: &[JobInput<'_>], config: &PlannerConfig) -> Result<MultiPlan, PlanError> {
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
    let share = if c.shared_by_jobs {
        1.0 / jobs.len().max(1) as f64
    } else {
        1.0
    };
    let mut state: Vec<Job<'_>> = jobs
        .iter()
        .zip(&lives)
        .map(|(input, live)| {
            let mut job = Job::new(
                input.graph,
                live,
                input.latency_ns.clone(),
                input.settings,
                *c,
                share,
            );
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

    let mut out = MultiPlan::default();
    let mut failed: HashSet<(usize, StorageId, usize)> = HashSet::new();
    let mut failed_recompute: HashSet<(usize, StorageId, usize)> = HashSet::new();
    loop {
        out.rounds += 1;
        if out.rounds > config.max_rounds {
            out.diagnostics.push(Diagnostic {
                job: 0,
                message: format!("stopped after {} rounds", config.max_rounds),
            });
            break;
        }
        let fits = config.budget_bytes.filter(|_| config.stop_at_budget);
        if fits.is_some_and(|b| sum_of_peaks(&state) <= b) {
            break;
        }
        if swap_round(&mut state, &mut failed, fits) > 0 {
            continue;
        }
        if state.iter().any(|j| !j.wrap_allowed) {
            for j in &mut state {
                j.wrap_allowed = true;
            }
            continue;
        }
        let total: u64 = state.iter().map(|j| j.peak().0).sum();
        if config.budget_bytes.is_some_and(|b| total > b)
            && recompute_round(&mut state, config, &mut failed_recompute)
        {
            failed.clear();
            continue;
        }
        break;
    }
    let total: u64 = state.iter().map(|j| j.peak().0).sum();
    if let Some(b) = config.budget_bytes.filter(|&b| total > b) {
        out.diagnostics.push(Diagnostic {
            job: 0,
            message: format!(
                "the planned peaks add up to {total} bytes, over the budget of {b} bytes: nothing more could be swapped or recomputed"
            ),
        });
    }
    for (j, (job, (vpeak, vtime, vline))) in state.iter().zip(vanilla).enumerate() {
        let mut p = emit(job);
        p.prediction.vanilla_peak_bytes = vpeak;
        p.prediction.vanilla_time_ns = vtime;
        p.prediction.vanilla_timeline = vline;
        p.version = 1;
        if job.swap_outs == 0 && job.settings.swap && job.n() > 0 {
            out.diagnostics.push(Diagnostic {
                job: j,
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
    out.aligned_peak_bytes = aligned_peak(
        &out.plans
            .iter()
            .map(|p| {
                (
                    p.prediction.planned_time_ns,
                    p.prediction.timeline.as_slice(),
                )
            })
            .collect::<Vec<_>>(),
    );
    Ok(out)
}

fn sum_of_peaks(state: &[Job<'_>]) -> u64 {
    state.iter().map(|j| j.peak().0).sum()
}

/// One greedy round over all jobs' peaks; returns how many swaps it placed.
/// With `fits`, it stops as soon as the peaks add up to no more than that.
fn swap_round(
    state: &mut [Job<'_>],
    failed: &mut HashSet<(usize, StorageId, usize)>,
    fits: Option<u64>,
) -> usize {
    let peaks: Vec<usize> = state.iter().map(|j| j.peak().1).collect();
    let mut cands = Vec::new();
    for (j, job) in state.iter().enumerate() {
        if !job.settings.swap || job.n() == 0 {
            continue;
        }
        let p = peaks[j];
        for (i, st) in job.st.iter().enumerate() {
            let s = StorageId(i as u32);
            if st.bytes == 0 || !job.resident(s, p) || job.accessed_at(s, p) {
                continue;
            }
            let Some((after, _, _)) = swap::gap_around(job, s, p) else {
                continue;
            };
            if !failed.contains(&(j, s, after)) {
                cands.push((st.bytes, j, s, after));
            }
        }
    }
    cands.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut placed = 0;
    for (_, j, s, after) in cands {
        if fits.is_some_and(|b| sum_of_peaks(state) <= b) {
            break;
        }
        if state[j].peak().1 != peaks[j] || !rate_allows(state, j) {
            continue;
        }
        match swap::place(&state[j], s, peaks[j]) {
            Some(gap) => {
                let before = gap.before;
                let wrap = gap.wrap;
                state[j].apply_gap(s, gap);
                if !wrap {
                    swap::reuse_host_copy(&mut state[j], s, before);
                }
                placed += 1;
            }
            None => {
                failed.insert((j, s, after));
            }
        }
    }
    placed
}

/// The per-job cap on its share of all swapped tensors.
fn rate_allows(state: &[Job<'_>], j: usize) -> bool {
    let total: usize = state.iter().map(|x| x.swap_outs).sum();
    let limit = state[j].settings.max_swap_rate;
    limit >= 1.0 || (state[j].swap_outs + 1) as f64 <= (limit * (total + 1) as f64).max(1.0)
}

/// Recomputes the best-MSPS candidate of the job with the largest peak that
/// has one; true when something was applied.
fn recompute_round(
    state: &mut [Job<'_>],
    config: &PlannerConfig,
    failed: &mut HashSet<(usize, StorageId, usize)>,
) -> bool {
    let mut order: Vec<usize> = (0..state.len()).collect();
    order.sort_by_key(|&j| std::cmp::Reverse(state[j].peak().0));
    for j in order {
        if !state[j].settings.recompute {
            continue;
        }
        let (old_peak, p) = state[j].peak();
        for r in recompute::candidates(&state[j], p, config.max_recompute_depth) {
            if failed.contains(&(j, r.target, r.after)) {
                continue;
            }
            let saved = state[j].clone();
            recompute::apply(&mut state[j], &r);
            if state[j].peak().0 < old_peak {
                return true;
            }
            state[j] = saved;
            failed.insert((j, r.target, r.after));
        }
    }
    false
}

/// Position of a step's events: recomputes before it, the rest after it.
fn emit(job: &Job<'_>) -> Plan {
    let mut events: Vec<(usize, Event)> = Vec::new();
    let real_after = |step: usize| -> (usize, Trigger) {
        let op = job.steps[step].op;
        (2 * step + 1, Trigger::After(op))
    };
    let next_real = |mut step: usize| {
        while job.steps[step].rebuilds.is_some() {
            step += 1;
        }
        step
    };
    let mut push = |pos: usize, trigger: Trigger, delay_ns: u64, kind: EventKind, s: usize| {
        events.push((
            pos,
            Event {
                trigger,
                delay_ns,
                kind,
                tensor: job.st[s].root,
            },
        ));
    };
    let mut start_on_host = Vec::new();
    let (mut outs, mut ins, mut bytes) = (0, 0, 0u64);
    for (i, st) in job.st.iter().enumerate() {
        if let Some(l) = st.last {
            let (pos, tr) = real_after(l);
            push(pos, tr, 0, EventKind::Release, i);
        }
        for g in &st.gaps {
            if g.wrap && !g.head_out() {
                start_on_host.push(st.root);
            }
            match g.out {
                Some(c) => {
                    let (pos, tr) = c.trigger.map_or((0, Trigger::IterationStart), real_after);
                    push(pos, tr, c.delay, EventKind::SwapOut, i);
                    outs += 1;
                    bytes += st.bytes;
                }
                None => {
                    let (pos, tr) = real_after(g.after);
                    push(pos, tr, 0, EventKind::Release, i);
                }
            }
            // No swap-in: rebuilt by a recompute step, emitted below.
            if let Some(c) = g.inn {
                let (pos, tr) = c.trigger.map_or((0, Trigger::IterationStart), real_after);
                push(pos, tr, c.delay, EventKind::SwapIn, i);
                ins += 1;
            }
        }
        for &(_, to) in &st.revivals {
            let target = next_real(to - 1);
            let op = job.steps[target].op;
            push(
                2 * target,
                Trigger::Before(op),
                u64::MAX,
                EventKind::Release,
                i,
            );
        }
    }
    for (k, step) in job.steps.iter().enumerate() {
        if let Some(x) = step.rebuilds {
            let target = next_real(k);
            let op = job.steps[target].op;
            push(
                2 * target,
                Trigger::Before(op),
                k as u64,
                EventKind::Recompute,
                x.index(),
            );
        }
    }
    events.sort_by_key(|(pos, e)| (*pos, e.delay_ns, e.kind, e.tensor));
    let recomputed_ops = job.steps.iter().filter(|s| s.rebuilds.is_some()).count();
    let mut events: Vec<Event> = events.into_iter().map(|(_, e)| e).collect();
    // `Before` events carry their order in `delay_ns` while sorting; the
    // executor runs them in list order, with no delay.
    for e in &mut events {
        if matches!(e.trigger, Trigger::Before(_)) {
            e.delay_ns = 0;
        }
    }
    events.dedup();
    start_on_host.sort();
    start_on_host.dedup();
    Plan {
        version: 0,
        events,
        start_on_host,
        prediction: Prediction {
            planned_peak_bytes: job.peak().0,
            planned_time_ns: job.iteration_ns(),
            swap_outs: outs,
            swap_ins: ins,
            swapped_bytes: bytes,
            recomputed_ops,
            timeline: job.timeline(),
            ..Prediction::default()
        },
    }
}

/// The peak of the jobs' memory curves on one time line, each job starting
/// at 0 and repeating its iteration, over the longest iteration.
fn aligned_peak(curves: &[(u64, &[(u64, u64)])]) -> u64 {
    let horizon = curves.iter().map(|c| c.0).max().unwrap_or(0);
    let mut changes: Vec<(u64, i64)> = Vec::new();
    for &(period, line) in curves {
        if line.is_empty() {
            continue;
        }
        if period == 0 {
            let peak = line.iter().map(|p| p.1).max().unwrap_or(0) as i64;
            changes.push((0, peak));
            continue;
        }
        let mut prev = 0i64;
        let mut base = 0;
        while base < horizon.max(1) {
            for &(t, m) in line {
                changes.push((base + t, m as i64 - prev));
                prev = m as i64;
            }
            base += period;
        }
    }
    changes.sort_by_key(|c| c.0);
    let (mut cur, mut best) = (0i64, 0i64);
    let mut i = 0;
    while i < changes.len() {
        let t = changes[i].0;
        while i < changes.len() && changes[i].0 == t {
            cur += changes[i].1;
            i += 1;
        }
        best = best.max(cur);
    }
    best.max(0) as u64
}
