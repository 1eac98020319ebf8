//! The rounds of the joint search: a swap round places swaps at the peak
//! (each job's, or the aligned sum's of coordinated jobs), a budget round
//! tries time-for-memory moves on copies of the jobs and keeps the one
//! with the most bytes per second; `try_move` prices one move.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use tensile_graph::StorageId;

use crate::coord::Coord;
use crate::job::Job;
use crate::{Deadline, PlannerConfig, global_peak, overhead, swap};

/// A fast hash of the search's small integer keys: the swaps that failed
/// are looked up for every candidate of every round (tens of thousands a
/// round for 64 jobs), where the standard hasher showed in the profile.
/// Nothing reads the sets' order.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FastHash(u64);

impl FastHash {
    fn add(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for FastHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.add(u64::from(b));
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.add(u64::from(v));
    }

    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }

    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
}

/// The swaps that failed, by job, storage and the access their gap
/// follows: a swap that failed on a job that did not change fails again.
pub(crate) type Failed = HashSet<(usize, StorageId, usize), BuildHasherDefault<FastHash>>;

/// One greedy round at the peak (each job's, or the aligned sum's for
/// coordinated jobs); returns how many swaps it placed. With `fits`, it
/// stops as soon as the peak is no more than that.
pub(crate) fn swap_round(
    state: &mut [Job<'_>],
    failed: &mut Failed,
    fits: Option<u64>,
    deadline: Deadline<'_>,
    coord: Option<&Coord>,
) -> usize {
    let (peaks, mut at, mut aligned): (Vec<usize>, Option<u64>, u64) = match coord {
        None => (state.iter().map(|j| j.peak().1).collect(), None, 0),
        Some(c) => {
            let g = c.peak(state);
            // A job waiting at its gate holds its first step's memory.
            let steps = g.steps.iter().map(|s| s.unwrap_or(0)).collect();
            (steps, Some(g.at), g.bytes)
        }
    };
    let mut cands = Vec::new();
    for (j, job) in state.iter_mut().enumerate() {
        if !job.settings.swap || job.n() == 0 {
            continue;
        }
        for &(bytes, s, after) in job.swap_candidates(peaks[j]) {
            if !failed.contains(&(j, s, after)) {
                cands.push((bytes, Reverse(j), Reverse(s), after));
            }
        }
    }
    // Largest first, then by job and storage (one candidate per job and
    // storage: no two tie). A heap, not a sort: a coordinated round ends
    // at the first swap that moves the aligned peak, having taken a few of
    // the thousands of candidates, which the next round gathers again.
    let mut cands = BinaryHeap::from(cands);
    let mut placed = 0;
    // Coordinated: the jobs whose view of the others' copies is stale (a
    // copy placed on another job since it was made); a job's view is made
    // again only when a swap is placed on it, and every stale one at the
    // end of the round (a full refresh after every placement cost the
    // square of the job count per placement).
    let mut stale_view = vec![false; state.len()];
    while let Some((_, Reverse(j), Reverse(s), after)) = cands.pop() {
        // Coordinated: the aligned peak is known since the last placement.
        let now = if coord.is_some() {
            aligned
        } else {
            fits.map_or(0, |_| global_peak(state, None))
        };
        if fits.is_some_and(|b| now <= b) || deadline.past() {
            break;
        }
        let stale = match coord {
            None => state[j].peak().1 != peaks[j],
            // The aligned sum peaks elsewhere now: the candidates are
            // another instant's; the next round gathers that one's.
            Some(_) => false,
        };
        if stale || !rate_allows(state, j) {
            continue;
        }
        deadline.tried();
        if let Some(c) = coord
            && std::mem::take(&mut stale_view[j])
        {
            c.refresh_one(state, j);
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
                if let Some(c) = coord {
                    for (k, v) in stale_view.iter_mut().enumerate() {
                        *v |= k != j;
                    }
                    let g = c.peak(state);
                    aligned = g.bytes;
                    if at.replace(g.at) != Some(g.at) {
                        break;
                    }
                }
            }
            None => {
                failed.insert((j, s, after));
            }
        }
    }
    if let Some(c) = coord {
        for (j, stale) in stale_view.into_iter().enumerate() {
            if stale {
                c.refresh_one(state, j);
            }
        }
    }
    placed
}

/// The per-job cap on its share of all swapped tensors.
pub(crate) fn rate_allows(state: &[Job<'_>], j: usize) -> bool {
    let total: usize = state.iter().map(|x| x.swap_outs).sum();
    let limit = state[j].settings.max_swap_rate;
    limit >= 1.0 || (state[j].swap_outs + 1) as f64 <= (limit * (total + 1) as f64).max(1.0)
}

/// Over budget: applies the move with the most bytes saved at a job's peak
/// per second added (recomputations, swaps with a late prefetch, waits for
/// swap-outs) that lowers that job's peak, or flattens it (fewer steps at
/// the peak), and keeps its iteration within `limits`; the job it moved, if
/// applied. Moves are ranked by an estimate (the bytes they take off the
/// peak step, an upper bound of the time they add); the best ones are tried
/// on a copy of the job and measured, and one is taken as soon as what it
/// really does per second is at least what the next one promises (lazy
/// greedy): a move whose peak only moves to the step next to it is not
/// taken for what it promised.
/// Moves tried on a copy per budget round once one helps, at most.
pub(crate) const TRIES: usize = 4;
/// Moves tried per budget round, at most, when none helps: every try
/// rebuilds a job's time line, and on DenseNet at batch 32 thousands of
/// failing moves made one plan take minutes.
pub(crate) const MAX_TRIES: usize = 48;

/// Tries budget move `m` on a copy of its job: bytes it saves at the peak
/// per ns it adds (infinite at no time) and the copy, where it lowers the
/// job's potential within its limit; else whether only the limit (the
/// job's iteration longer than `limits` allows) stood in its way.
pub(crate) fn try_move<'g>(
    state: &[Job<'g>],
    m: &overhead::Move,
    limits: &[u64],
    coord: Option<&Coord>,
) -> Result<(f64, Job<'g>), bool> {
    let j = m.job;
    let was = potential(state, j, &state[j], coord);
    let mut next = state[j].clone();
    let applied = overhead::apply(&mut next, m);
    // A coordinated job's iteration must still fit its gate's cycle.
    let outgrows = coord.is_some_and(|c| next.iteration_ns() > c.cycle);
    if !applied || next.clash || outgrows {
        return Err(false);
    }
    let now = potential(state, j, &next, coord);
    if now >= was {
        return Err(false);
    }
    if next.iteration_ns() > limits[j] {
        return Err(true);
    }
    let added = next.iteration_ns().saturating_sub(state[j].iteration_ns());
    let saved = (was.0 - now.0) as f64;
    let real = if added == 0 {
        f64::INFINITY
    } else {
        saved / added as f64
    };
    Ok((real, next))
}

/// The moves that budget rounds tried and that did not help, since the
/// last move made.
#[derive(Debug, Default)]
pub(crate) struct Tried {
    failed: HashSet<overhead::MoveKey>,
}

pub(crate) fn budget_round(
    state: &mut [Job<'_>],
    config: &PlannerConfig,
    limits: &[u64],
    tried: &mut Tried,
    capped: &mut bool,
    deadline: Deadline<'_>,
    coord: Option<&Coord>,
) -> Option<usize> {
    let mut moves = Vec::new();
    let at_peak: Vec<Option<usize>> = match coord {
        None => state.iter().map(|j| Some(j.peak().1)).collect(),
        Some(c) => c.peak(state).steps,
    };
    for (j, job) in state.iter().enumerate() {
        if let (true, Some(p)) = (job.n() > 0, at_peak[j]) {
            moves.extend(overhead::moves(job, j, p, config.max_recompute_depth));
        }
    }
    let mut moves: Vec<(f64, overhead::Move)> = moves.into_iter().map(|m| (m.msps(), m)).collect();
    moves.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.key().cmp(&b.1.key())));
    let failed = &mut tried.failed;
    let mut best: Option<(f64, usize, Job<'_>)> = None;
    let mut tries = 0;
    for (worth, m) in &moves {
        if failed.contains(&m.key()) {
            continue;
        }
        if best
            .as_ref()
            .is_some_and(|b| b.0 >= *worth || tries >= TRIES)
            || tries >= MAX_TRIES
            || deadline.past()
        {
            break;
        }
        tries += 1;
        deadline.tried();
        match try_move(state, m, limits, coord) {
            Ok((real, next)) => {
                if best.as_ref().is_none_or(|b| real > b.0) {
                    best = Some((real, m.job, next));
                }
            }
            Err(over_limit) => {
                *capped |= over_limit;
                failed.insert(m.key());
            }
        }
    }
    match best {
        Some((_, j, next)) => {
            state[j] = next;
            tried.failed.clear();
            Some(j)
        }
        None => None,
    }
}

/// What a budget move on job `j` (`job`, its state after the move) must
/// lower: the peak, then how many steps reach it; for coordinated jobs the
/// aligned sum's peak, then the job's steps at its own peak.
pub(crate) fn potential(
    state: &[Job<'_>],
    j: usize,
    job: &Job<'_>,
    coord: Option<&Coord>,
) -> (u64, usize) {
    let (peak, _) = job.peak();
    let count = job.tree.count_of(peak as i64);
    match coord {
        None => (peak, count),
        Some(c) => (c.peak_with(state, j, job), count),
    }
}

/// When each op starts on the job's planned time line, the steps inserted
/// right before it (recomputations, waits) included.
pub(crate) fn op_starts(job: &Job<'_>) -> Vec<u64> {
    let mut starts = vec![0; job.graph.ops().len()];
    let mut group = 0;
    for (k, step) in job.steps.iter().enumerate() {
        if k == 0 || job.steps[k - 1].is_real() {
            group = job.times[k];
        }
        if step.is_real() {
            starts[step.op.index()] = group;
        }
    }
    starts
}
