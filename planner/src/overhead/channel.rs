//! The copy channels as the searches for moves see them: every copy on a
//! channel with the gap it belongs to ([`Slot`]), and where a prefetch that
//! may be late, or a swap-out that a wait is for, fits on them.

use tensile_graph::StorageId;

use crate::intervals::first_fit;
use crate::job::{Copy, Gap, Job, OUT};

/// A copy on the channel that prefetches use, as the search for a late
/// prefetch sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) trigger: Option<usize>,
    /// The storage and the index of the gap the copy belongs to.
    pub(super) id: (StorageId, usize),
}

/// The busy time of copy channel `ch` (swap-outs use `OUT`, prefetches
/// `job.in_chan()`, one and the same when the link is half duplex), sorted
/// by start.
pub(crate) fn channel(job: &Job<'_>, ch: usize) -> Vec<Slot> {
    let in_chan = job.in_chan();
    let mut out = Vec::new();
    for (i, st) in job.st.iter().enumerate() {
        for (k, g) in st.gaps.iter().enumerate() {
            let id = (StorageId(i as u32), k);
            let mut push = |c: &Copy| {
                let [first, head] = job.spans(c);
                out.push(Slot {
                    start: first.0,
                    end: first.1,
                    trigger: c.trigger,
                    id,
                });
                // The part of a swap-out that runs on into the next
                // iteration stays at its head whatever moves.
                if head.0 < head.1 {
                    out.push(Slot {
                        start: head.0,
                        end: head.1,
                        trigger: None,
                        id,
                    });
                }
            };
            if let Some(c) = &g.inn
                && ch == in_chan
            {
                push(c);
            }
            if let Some(c) = &g.out
                && ch == OUT
            {
                push(c);
            }
        }
    }
    out.sort_by_key(|s| (s.start, s.end));
    out
}

/// A prefetch that may end after its consumer would start.
#[derive(Debug, Clone)]
pub(crate) struct Late {
    /// The copy, anchored on the current time line.
    pub(crate) copy: Copy,
    /// How much later the consumer starts: the wait before it grows by this.
    pub(crate) delta: u64,
    /// When the consumer starts now, and the index of the wait before it:
    /// the copies triggered before the wait that start then or later move
    /// `delta` later with everything after the wait (the job pauses there
    /// for `delta`, its copies in flight go on).
    pub(crate) pause: (u64, usize),
}

/// The copy starting at `start` anchored to the last real op that ends by
/// then, before step `w` (a copy starting later, during the wait before
/// `w`'s successor, is anchored to the last real op before `w`).
pub(super) fn anchor(job: &Job<'_>, start: u64, w: usize, dur: u64) -> Copy {
    let mut k = if start >= job.times[w] {
        w
    } else {
        job.boundary_at_or_before(start).min(w)
    };
    while k > 0 && !job.steps[k - 1].is_real() {
        k -= 1;
    }
    let trigger = k.checked_sub(1);
    Copy {
        trigger,
        delay: start - trigger.map_or(0, |t| job.times[t + 1]),
        dur,
    }
}

/// The earliest prefetch of `bytes` for step `c` that starts at or after
/// `lo` and whose buffer is allocated at boundary `min_alloc` or later (and
/// after the boundary where a swap-out ending at `free_at` is freed);
/// `exclude`: a copy on the channel that the prefetch replaces. Hidden if a
/// free slot ends by the time `c` starts; otherwise `c` waits for it: the
/// job pauses where `c` starts, its copies in flight go on, and the
/// prefetch takes the channel after the last of them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn late_in(
    job: &Job<'_>,
    view: &[Slot],
    bytes: u64,
    c: usize,
    lo: u64,
    min_alloc: usize,
    exclude: Option<(StorageId, usize)>,
    free_at: Option<u64>,
) -> Option<Late> {
    // The executor allocates a prefetch's buffer when its trigger op ends;
    // the storage's swap-out must have been freed by then (at that same
    // boundary at the latest), or the executor keeps the old buffer and
    // skips the copy, and nothing waits.
    let min_alloc = free_at.map_or(min_alloc, |f| min_alloc.max(job.boundary_at_or_after(f)));
    let dur = job.in_dur(bytes);
    let w = job.insertion_point(c);
    let t_c = job.times[c];
    // The copies on the channel are disjoint, sorted by start and so by end.
    let others = |from: usize| view[from..].iter().filter(|x| Some(x.id) != exclude);
    // The buffer must be allocated late enough: the copy starts after the
    // first real op boundary at or after `min_alloc`.
    let first = (min_alloc..=w).find(|&k| k == 0 || job.steps[k - 1].is_real())?;
    let lo = lo.max(job.times[first]);
    let ok = |copy: &Copy| copy.trigger.map_or(0, |t| t + 1) >= min_alloc;
    // Hidden: a free slot that ends by the time `c` starts.
    let busy = others(view.partition_point(|x| x.end <= lo)).map(|x| (x.start, x.end));
    if let Some(start) = first_fit(busy, lo, t_c, dur) {
        let copy = anchor(job, start, w, dur);
        if ok(&copy) {
            return Some(Late {
                copy,
                delta: 0,
                pause: (t_c, w),
            });
        }
    }
    // Late: after every copy that starts before `c` does.
    let before = view.partition_point(|x| x.start < t_c);
    let start = view[..before]
        .iter()
        .rev()
        .find(|x| Some(x.id) != exclude)
        .map_or(lo, |x| x.end.max(lo));
    let copy = anchor(job, start, w, dur);
    ok(&copy).then(|| Late {
        copy,
        delta: (start + dur).saturating_sub(t_c),
        pause: (t_c, w),
    })
}

/// When the swap-out of gap `g` ends (in the next iteration, from its
/// start, for one that runs past the iteration's end).
pub(super) fn out_free(job: &Job<'_>, g: &Gap) -> Option<u64> {
    g.out.is_some().then(|| in_lo(job, g))
}

/// Where a prefetch after `out` may start: after the copy ends, on the
/// periodic time line for a swap-out that runs past the iteration's end.
pub(super) fn in_lo(job: &Job<'_>, g: &Gap) -> u64 {
    match g.out {
        Some(out) => {
            let end = out.end(&job.times);
            if g.wrap && !g.head_out() {
                end.saturating_sub(job.period())
            } else {
                end
            }
        }
        None => job.times[g.after + 1],
    }
}

/// Where a swap-out of `bytes` that a pause before step `q` is for starts:
/// at or after `lo`, anchored to a real op from `after` on, before the
/// wait. Swap-outs keep their times during a pause (see `wait::pause`): it takes
/// the first free slot on its channel; on a half-duplex link, where the
/// copies after the pause move on with it, it goes right after the ones in
/// flight when the pause starts.
pub(super) fn out_for_pause(
    job: &Job<'_>,
    view: &[Slot],
    bytes: u64,
    lo: u64,
    after: usize,
    q: usize,
) -> Option<u64> {
    let d = job.out_dur(bytes);
    let w = job.insertion_point(q);
    let t_q = job.times[q];
    let start = if job.in_chan() == OUT {
        view.iter()
            .filter(|x| x.start < t_q)
            .map(|x| x.end)
            .fold(lo, u64::max)
    } else {
        first_fit(view.iter().map(|x| (x.start, x.end)), lo, u64::MAX, d)?
    };
    let k = if start >= job.times[w] {
        w
    } else {
        job.boundary_at_or_before(start).min(w)
    };
    let trig = (0..k).rev().find(|&j| job.steps[j].is_real())?;
    (trig >= after).then_some(start)
}
