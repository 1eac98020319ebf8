//! Capuchin's hybrid policy for one job under its budget, and its feedback.
//!
//! While the predicted peak is over the budget: of the saved activations
//! that are resident at the peak and idle across it, swap the one with the
//! largest free time (FT: from the end of its swap-out right after its last
//! forward access to the latest start of a swap-in that ends before its
//! first backward access) whose swap can be hidden, its copies fitting the
//! job's copy engines with no stall. The swap-in's trigger is the latest op
//! end that lets the copy finish before the access (Capuchin's in-trigger
//! is a tensor access, so there is no delay after it). When no swap can be
//! hidden, Capuchin weighs the overheads: recompute the tensor with the
//! largest MSPS (bytes saved per ns of recomputation) whose producer's
//! inputs are still on the device when it re-runs, or swap one out and let
//! its backward op fetch it on demand, whichever the prediction says adds
//! less time to the iteration.
//!
//! Feedback: a swap-in that arrived late gets a lead 5% longer (the time
//! from its start to the access it serves), so each miss moves it earlier.

use std::collections::HashSet;

use tensile_graph::{OpId, StorageId};

use crate::common::Saved;

use super::timeline::{Choices, Fetch, JobModel, Prediction, Recompute, Swap, predict};

/// The choices that bring the job's predicted peak within `budget`, or as
/// close as swapping and recomputation can get.
pub(crate) fn select(m: &JobModel<'_>, budget: u64) -> Choices {
    let mut c = Choices::default();
    // Swaps that found no room on the copy engines; the engines only get
    // busier until a recomputation or a fetch moves the time line.
    let mut no_room: HashSet<StorageId> = HashSet::new();
    loop {
        let pr = predict(m, &c);
        let Some(ps) = pr.peak_step.filter(|_| pr.peak > budget) else {
            break;
        };
        if let Some(w) = best_swap(m, &c, &pr, ps, &mut no_room) {
            c.swaps.push(w);
            continue;
        }
        // No swap can be hidden: recompute or swap with a stall, whichever
        // costs the iteration less time.
        let r = best_recompute(m, &c, &pr, ps);
        let f = best_fetch(m, &c, &pr, ps);
        match (r, f) {
            (Some((r, rc)), f) if f.is_none_or(|(_, fc)| rc <= fc) => c.recomputes.push(r),
            (_, Some((f, _))) => c.fetches.push(f),
            _ => break,
        }
        no_room.clear();
    }
    c
}

/// Whether a tensor away over ops `(after, before)` exclusive is away at
/// step `ps`; a recomputation step right before `before` still counts.
fn spans(pr: &Prediction, ps: usize, after: OpId, before: OpId) -> bool {
    let step = pr.steps[ps];
    let k = pr.op_step.partition_point(|&i| i < ps);
    let at = OpId(k as u32);
    after < at && (at < before || (at == before && step.rebuilds.is_some()))
}

/// Whether some chosen recomputation reads `s` while `(after, before]`
/// would keep it away.
fn needed_by_recompute(
    m: &JobModel<'_>,
    c: &Choices,
    s: StorageId,
    after: OpId,
    before: OpId,
) -> bool {
    c.recomputes.iter().any(|r| {
        after < r.before
            && r.before <= before
            && m.graph
                .op(r.producer)
                .inputs
                .iter()
                .any(|t| m.live.storage_of[t.index()] == s)
    })
}

fn best_swap(
    m: &JobModel<'_>,
    c: &Choices,
    pr: &Prediction,
    ps: usize,
    no_room: &mut HashSet<StorageId>,
) -> Option<Swap> {
    let mut cands: Vec<(i128, StorageId, OpId, OpId)> = m
        .saved
        .iter()
        .filter(|v| !c.has(v.storage) && !no_room.contains(&v.storage))
        .filter(|v| spans(pr, ps, v.last_forward, v.first_backward))
        .filter(|v| !needed_by_recompute(m, c, v.storage, v.last_forward, v.first_backward))
        .map(|v| {
            let ft = free_time(m, pr, v);
            (ft, v.storage, v.last_forward, v.first_backward)
        })
        .filter(|x| x.0 > 0)
        .collect();
    cands.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let last_lane = pr.lanes.len() - 1;
    for (_, s, after, before) in cands {
        let (out_ns, in_ns) = (m.out_ns(s), m.in_ns(s));
        let from = pr.end_of(after);
        let deadline = pr.start_of(before);
        let Some(os) = pr.lanes[0].earliest_fit(from, deadline, out_ns) else {
            no_room.insert(s);
            continue;
        };
        let oe = os + out_ns;
        // The latest op end that leaves the swap-in room on its lane.
        let mut trigger = None;
        for k in (after.index() + 1..before.index()).rev() {
            let t = pr.end_of(OpId(k as u32));
            if t < oe {
                break;
            }
            if t + in_ns <= deadline && pr.lanes[last_lane].is_free(t, t + in_ns) {
                trigger = Some(OpId(k as u32));
                break;
            }
        }
        let Some(in_after) = trigger else {
            no_room.insert(s);
            continue;
        };
        // It must be away at the peak: freed by then, not yet back.
        let freed = pr.first_step_from(oe);
        if !(freed <= ps && ps < pr.op_step[in_after.index()] + 1) {
            continue;
        }
        return Some(Swap {
            s,
            after,
            out_delay: os - from,
            in_after,
            before,
        });
    }
    None
}

/// The recomputation with the largest MSPS that lowers the peak, and its
/// cost: the time it adds to the iteration.
fn best_recompute(
    m: &JobModel<'_>,
    c: &Choices,
    pr: &Prediction,
    ps: usize,
) -> Option<(Recompute, u64)> {
    let mut cands: Vec<(f64, Recompute)> = Vec::new();
    for v in &m.saved {
        let s = v.storage;
        if c.has(s) || !spans(pr, ps, v.last_forward, v.first_backward) {
            continue;
        }
        if needed_by_recompute(m, c, s, v.last_forward, v.first_backward) {
            continue;
        }
        let Some(p) = m.pure_producer(s) else {
            continue;
        };
        if !inputs_resident(m, c, p, s, v.first_backward) {
            continue;
        }
        let msps = m.bytes(s) as f64 / m.lat[p.index()].max(1) as f64;
        cands.push((
            msps,
            Recompute {
                s,
                after: v.last_forward,
                before: v.first_backward,
                producer: p,
            },
        ));
    }
    cands.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.s.cmp(&b.1.s)));
    for (_, r) in cands {
        let mut tried = c.clone();
        tried.recomputes.push(r);
        let next = predict(m, &tried);
        // The new step goes right before `r.before`: later steps move by one.
        let same = ps + usize::from(ps >= pr.op_step[r.before.index()]);
        if next.valid && next.mem[same] < pr.mem[ps] {
            return Some((r, next.time_ns.saturating_sub(pr.time_ns)));
        }
    }
    None
}

/// The swap, largest free time first, that lowers the peak if its op
/// fetches it on demand, and its cost: the time the waits add to the
/// iteration (its own, and that of swap-ins it delays).
fn best_fetch(m: &JobModel<'_>, c: &Choices, pr: &Prediction, ps: usize) -> Option<(Fetch, u64)> {
    let mut cands: Vec<(i128, &Saved)> = m
        .saved
        .iter()
        .filter(|v| !c.has(v.storage) && spans(pr, ps, v.last_forward, v.first_backward))
        .filter(|v| !needed_by_recompute(m, c, v.storage, v.last_forward, v.first_backward))
        .map(|v| (free_time(m, pr, v), v))
        .collect();
    cands.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.storage.cmp(&b.1.storage)));
    for (_, v) in cands {
        let s = v.storage;
        let from = pr.end_of(v.last_forward);
        let Some(os) = pr.lanes[0].earliest_fit(from, pr.start_of(v.first_backward), m.out_ns(s))
        else {
            continue;
        };
        if pr.first_step_from(os + m.out_ns(s)) > ps {
            continue;
        }
        let f = Fetch {
            s,
            after: v.last_forward,
            out_delay: os - from,
            before: v.first_backward,
        };
        let mut tried = c.clone();
        tried.fetches.push(f);
        let next = predict(m, &tried);
        if next.valid && next.mem[ps] < pr.mem[ps] {
            return Some((f, next.time_ns.saturating_sub(pr.time_ns)));
        }
    }
    None
}

/// Capuchin's free time: from the end of a swap-out right after the last
/// forward access to the latest start of a swap-in that ends by the first
/// backward access, copy engines assumed free.
fn free_time(m: &JobModel<'_>, pr: &Prediction, v: &Saved) -> i128 {
    let out_end = pr.end_of(v.last_forward) + m.out_ns(v.storage);
    let in_start = pr.start_of(v.first_backward) as i128 - m.in_ns(v.storage) as i128;
    in_start - out_end as i128
}

/// Whether every input of `producer` is on the device, with the version it
/// read, when the recomputation before `at` runs.
fn inputs_resident(m: &JobModel<'_>, c: &Choices, producer: OpId, s: StorageId, at: OpId) -> bool {
    m.graph.op(producer).inputs.iter().all(|t| {
        let u = m.live.storage_of[t.index()];
        let st = &m.live.storages[u.index()];
        let born_before = st.born.is_none_or(|b| b < at);
        let still_there = st.freed_after.is_none_or(|f| f >= at);
        let unchanged = !m.in_place[u.index()]
            .iter()
            .any(|&w| producer < w && w < at);
        u != s && born_before && still_there && unchanged && !c.away(u, at)
    })
}

/// Moves the swap-ins of the `late` storages earlier: each one's lead over
/// the access it serves grows by 5%, and its trigger becomes the latest op
/// that ends by then (never before its swap-out ends). Returns how many
/// moved.
pub(crate) fn feedback(m: &JobModel<'_>, c: &mut Choices, late: &[StorageId]) -> usize {
    let pr = predict(m, c);
    let mut moved = 0;
    for (i, w) in c.swaps.iter_mut().enumerate() {
        if !late.contains(&w.s) {
            continue;
        }
        let use_at = pr.start_of(w.before);
        let lead = use_at - pr.end_of(w.in_after).min(use_at);
        let longer = ((lead as f64 * 1.05).ceil() as u64).max(lead + 1);
        let Some(want) = use_at.checked_sub(longer) else {
            continue;
        };
        let earlier = (w.after.index() + 1..w.in_after.index())
            .rev()
            .map(|k| OpId(k as u32))
            .take_while(|&k| pr.end_of(k) >= pr.out_end[i])
            .find(|&k| pr.end_of(k) <= want);
        if let Some(k) = earlier {
            w.in_after = k;
            moved += 1;
        }
    }
    moved
}
