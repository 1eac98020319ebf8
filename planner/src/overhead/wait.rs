//! Applying a move to its job, and the waits that carry moves: a pause of
//! the job's compute before a step, made by a prefetch of something the
//! step reads that arrives late on purpose.

use tensile_graph::StorageId;

use super::channel::{Late, Slot, anchor, channel, in_lo, late_in, out_for_pause, out_free};
use super::{Action, Move};
use crate::intervals::first_fit;
use crate::job::{Gap, Job, OUT};
use crate::recompute;
use crate::swap;

/// Applies `m` to its job; false when it turned out impossible (the job is
/// then left half changed: apply moves to a copy).
pub(crate) fn apply(job: &mut Job<'_>, m: &Move) -> bool {
    let s = m.target;
    match &m.action {
        Action::Recompute { r, replace } => {
            if let Some(k) = *replace {
                let g = job.st[s.index()].gaps.remove(k);
                if g.out.is_some() {
                    job.swap_outs -= 1;
                }
            }
            recompute::apply(job, r);
            true
        }
        Action::Swap { gap, late, replace } => {
            apply_swap(job, s, *gap, late, *replace);
            true
        }
        &Action::Stall { q, until, then } => {
            let p = m.peak;
            let mut out_view = channel(job, OUT);
            // The swap-out that the wait is for, placed first: it keeps its
            // time (anchored before the wait) and the carrier comes after it.
            let mut out = None;
            if let Some((after, _, gap)) = then {
                if let Some(k) = gap {
                    out_view.retain(|x| x.id != (s, k));
                }
                let bytes = job.st[s.index()].bytes;
                let lo = job.times[after + 1];
                let Some(start) = out_for_pause(job, &out_view, bytes, lo, after, q) else {
                    return false;
                };
                let w = job.insertion_point(q);
                let c = anchor(job, start, w, job.out_dur(bytes));
                out_view.push(Slot {
                    start,
                    end: start + c.dur,
                    trigger: c.trigger,
                    id: (s, usize::MAX),
                });
                out_view.sort_by_key(|s| (s.start, s.end));
                out = Some(c);
            }
            let mut view = channel(job, job.in_chan());
            if job.in_chan() == OUT {
                view = out_view.clone();
            }
            let Some(stall) = stall_at(job, &view, &out_view, q, until) else {
                return false;
            };
            let n = job.n();
            apply_swap(job, stall.carrier, stall.gap, &stall.late, stall.replace);
            let (Some((after, before, existing)), Some(out)) = (then, out) else {
                return true;
            };
            // Indices from `q` on moved one on if a wait step went in.
            let at = |k: usize| if k >= q { k + job.n() - n } else { k };
            let (p, before) = (at(p), at(before));
            if let Some(k) = existing {
                // The gap keeps its prefetch (after the peak) and gets the
                // earlier swap-out.
                job.st[s.index()].gaps[k].out = Some(out);
                job.rebuild();
                let g = job.st[s.index()].gaps[k];
                return job.absent(&g).iter().any(|&(a, b)| (a..b).contains(&p));
            }
            let mut gap = Gap {
                after,
                before,
                wrap: false,
                out: Some(out),
                inn: None,
                forced: false,
            };
            let mut view = channel(job, job.in_chan());
            if job.in_chan() == OUT {
                view.push(Slot {
                    start: out.start(&job.times),
                    end: out.end(&job.times),
                    trigger: None,
                    id: (s, usize::MAX),
                });
                view.sort_by_key(|s| (s.start, s.end));
            }
            let bytes = job.st[s.index()].bytes;
            let end = out.end(&job.times);
            let Some(late) = late_in(job, &view, bytes, before, end, p + 1, None, Some(end)) else {
                return false;
            };
            gap.inn = Some(late.copy);
            let clears = job.absent(&gap).iter().any(|&(a, b)| (a..b).contains(&p));
            if !clears {
                return false;
            }
            apply_swap(job, s, gap, &late, None);
            true
        }
    }
}

/// Adds (or, with `replace`, puts in place of that gap) a swap gap of `s`
/// whose prefetch may be late, moving the copies `late` shifts and waiting
/// for it before its consumer.
fn apply_swap(job: &mut Job<'_>, s: StorageId, gap: Gap, late: &Late, replace: Option<usize>) {
    if late.delta > 0 {
        pause(job, late.pause, late.delta);
    }
    match replace {
        Some(k) => job.st[s.index()].gaps[k] = gap,
        None => {
            if gap.out.is_some() {
                job.swap_outs += 1;
            }
            job.st[s.index()].gaps.push(gap);
        }
    }
    if late.delta > 0 {
        job.wait_before(gap.before);
    }
    job.rebuild();
}

/// Delays by `delta` every prefetch triggered before step `w` that starts
/// at `at` or later: with a pause of `delta` inserted at `at` (a wait at
/// `w`), the job's time line and its prefetches move on together, and the
/// prefetch that the wait is for goes first. Swap-outs keep their times and
/// run during the pause, ending sooner relative to compute (on a half-duplex
/// link they share the prefetches' queue and move with them).
fn pause(job: &mut Job<'_>, (at, w): (u64, usize), delta: u64) {
    let times = job.times.clone();
    let half = job.in_chan() == OUT;
    for st in &mut job.st {
        for g in &mut st.gaps {
            let outs = if half { g.out.as_mut() } else { None };
            for c in [outs, g.inn.as_mut()].into_iter().flatten() {
                if c.trigger.is_none_or(|t| t < w) && c.start(&times) >= at {
                    c.delay += delta;
                }
            }
        }
    }
}

/// A wait before step `q` until at least `until` (on the current time
/// line), carried by a late prefetch of something `q` reads: one already
/// planned for `q`, moved later, or a new across-iteration swap of a
/// persistent storage that `q` reads first in the iteration.
#[derive(Debug, Clone)]
pub(super) struct Carrier {
    carrier: StorageId,
    replace: Option<usize>,
    gap: Gap,
    late: Late,
}

pub(super) fn stall_at(
    job: &Job<'_>,
    view: &[Slot],
    out_view: &[Slot],
    q: usize,
    until: u64,
) -> Option<Carrier> {
    let step = job.steps[q];
    if step.wait {
        return None;
    }
    let mut best: Option<Carrier> = None;
    let mut seen: Vec<StorageId> = Vec::new();
    for &t in &job.graph.op(step.op).inputs {
        let x = job.live.storage_of[t.index()];
        let st = &job.st[x.index()];
        if seen.contains(&x) || st.bytes == 0 {
            continue;
        }
        seen.push(x);
        let lo_end = until.saturating_sub(job.in_dur(st.bytes));
        let found = if let Some(k) = st
            .gaps
            .iter()
            .position(|g| g.inn.is_some() && !g.forced && job.needed_by(x, g) == q)
        {
            let g = Gap {
                before: q,
                ..st.gaps[k]
            };
            let min_alloc = g.inn.and_then(|c| c.trigger).map_or(0, |t| t + 1);
            late_in(
                job,
                view,
                st.bytes,
                q,
                in_lo(job, &g).max(lo_end),
                min_alloc,
                Some((x, k)),
                out_free(job, &g),
            )
            .map(|late| Carrier {
                carrier: x,
                replace: Some(k),
                gap: Gap {
                    inn: Some(late.copy),
                    ..g
                },
                late,
            })
        } else {
            fresh_carrier(job, view, out_view, x, q, until)
        };
        if let Some(c) = found
            && best.as_ref().is_none_or(|b| c.late.delta < b.late.delta)
        {
            best = Some(c);
        }
    }
    best
}

/// A new across-iteration swap of persistent `x`, first read by step `q`,
/// whose prefetch ends at `until` or later: swapped out after its last
/// access (running on into the next iteration if need be) or, when the
/// channel is full there, anywhere before `q`, waited for too.
fn fresh_carrier(
    job: &Job<'_>,
    view: &[Slot],
    out_view: &[Slot],
    x: StorageId,
    q: usize,
    until: u64,
) -> Option<Carrier> {
    let st = &job.st[x.index()];
    let allowed = st.persistent
        && job.settings.swap
        && job.settings.across_iteration
        && job.wrap_allowed
        && st.gaps.is_empty();
    if !allowed || st.accesses.first().is_none_or(|a| a.step != q) {
        return None;
    }
    let after = st.accesses.last()?.step;
    if !job.steps[after].is_real() {
        return None;
    }
    let mut outs = swap::wrap_outs(job, x, q, after, q);
    // At the head of the iteration, in the first slot the copies that keep
    // their times leave (the wait lets it end).
    let w = job.insertion_point(q);
    let d = job.out_dur(st.bytes);
    let before_wait = out_view.iter().filter(|y| y.trigger.is_none_or(|t| t < w));
    let start = first_fit(before_wait.map(|y| (y.start, y.end)), 0, u64::MAX, d)?;
    outs.push(Some(anchor(job, start, w, d)));
    for out in outs {
        let mut gap = Gap {
            after,
            before: q,
            wrap: true,
            out,
            inn: None,
            forced: false,
        };
        let mut view = view.to_vec();
        if job.in_chan() == OUT
            && let Some(c) = &out
        {
            for (start, end) in job.spans(c) {
                view.push(Slot {
                    start,
                    end,
                    trigger: None,
                    id: (x, usize::MAX),
                });
            }
            view.sort_by_key(|s| (s.start, s.end));
        }
        let lo = in_lo(job, &gap).max(until.saturating_sub(job.in_dur(st.bytes)));
        if let Some(late) = late_in(job, &view, st.bytes, q, lo, 0, None, out_free(job, &gap)) {
            gap.inn = Some(late.copy);
            return Some(Carrier {
                carrier: x,
                replace: None,
                gap,
                late,
            });
        }
    }
    None
}

/// The steps up to `p` before which a wait can be made: they read a storage
/// with a prefetch for them, or a persistent storage that they read first
/// in the iteration (and that could be swapped across iterations).
pub(super) fn carrier_steps(job: &Job<'_>, p: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let fresh_ok = job.settings.across_iteration && job.wrap_allowed;
    for (i, st) in job.st.iter().enumerate() {
        let x = StorageId(i as u32);
        if st.bytes == 0 {
            continue;
        }
        for g in &st.gaps {
            let q = job.needed_by(x, g);
            if g.inn.is_some() && !g.forced && q <= p && job.reads(q, x) {
                out.push(q);
            }
        }
        if fresh_ok
            && st.persistent
            && st.gaps.is_empty()
            && let Some(a) = st.accesses.first()
            && a.step <= p
            && job.reads(a.step, x)
        {
            out.push(a.step);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}
