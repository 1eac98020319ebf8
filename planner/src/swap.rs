//! Greedy swap scheduling: candidates at the peak, largest first;
//! swap-out as early as possible, swap-in as late as possible, on copy
//! channels that never overlap; release + re-prefetch of later gaps once a
//! host copy exists; across-iteration swaps of persistent storage.

use tensile_graph::StorageId;

use crate::job::{Copy, Gap, Job, OUT};

/// The accesses around `step` for storage `s`: `(after, before, wrap)`.
pub(crate) fn gap_around(job: &Job<'_>, s: StorageId, step: usize) -> Option<(usize, usize, bool)> {
    let st = &job.st[s.index()];
    let acc = &st.accesses;
    let i = acc.partition_point(|a| a.step < step);
    let (after, before, wrap) = if i > 0 && i < acc.len() {
        (acc[i - 1].step, acc[i].step, false)
    } else if st.persistent
        && !st.host_master
        && job.settings.across_iteration
        && job.wrap_allowed
        && !acc.is_empty()
    {
        (acc[acc.len() - 1].step, acc[0].step, true)
    } else {
        return None;
    };
    // A copy after a recompute step would need that step as its trigger;
    // a gap holds one swap or recomputation at most.
    if !job.steps[after].is_real() || st.gaps.iter().any(|g| g.after == after && g.wrap == wrap) {
        return None;
    }
    Some((after, before, wrap))
}

/// Whether a valid host copy of `s` exists once access `after` has ended:
/// an earlier gap put it there and nothing wrote the storage since.
pub(crate) fn host_copy_valid(job: &Job<'_>, s: StorageId, after: usize) -> bool {
    let st = &job.st[s.index()];
    // A host op keeps it current on the host.
    if st.host_master {
        return true;
    }
    let writes_in = |lo: usize, hi: usize| {
        st.accesses
            .iter()
            .any(|a| a.write && a.step > lo && a.step <= hi)
    };
    st.gaps.iter().any(|g| {
        g.inn.is_some()
            && if g.wrap {
                !st.accesses.iter().any(|a| a.write && a.step <= after)
            } else {
                g.after < after && !writes_in(g.after, after)
            }
    })
}

/// The latest swap-in of `s` ending by `by` (less the storage's lead) and
/// starting at or after `lo`, whose buffer is allocated at a real op
/// boundary after `min_alloc`.
pub(crate) fn place_in(
    job: &Job<'_>,
    s: StorageId,
    lo: u64,
    by: u64,
    min_alloc: usize,
) -> Option<Copy> {
    let st = &job.st[s.index()];
    let by = by.checked_sub(st.lead)?;
    let dur = job.in_dur(st.bytes);
    let start = job.chan(job.in_chan()).latest_fit(lo, by, dur)?;
    let mut k = job.boundary_at_or_before(start);
    while k > 0 && !job.steps[k - 1].is_real() {
        k -= 1;
    }
    if k < min_alloc {
        return None;
    }
    let trigger = k.checked_sub(1);
    Some(Copy {
        trigger,
        delay: start - job.times[k],
        dur,
    })
}

/// The earliest swap-out in `[lo, hi]`, anchored to the last real op that
/// ends by its start (never before `after`).
pub(crate) fn place_out(job: &Job<'_>, bytes: u64, lo: u64, hi: u64, after: usize) -> Option<Copy> {
    let dur = job.out_dur(bytes);
    let start = job.chan(OUT).earliest_fit(lo, hi, dur)?;
    anchor_out(job, start, dur, after)
}

/// The earliest swap-out starting in `[lo, iteration end)` that may run on
/// into the next iteration (wrapping on the channel's periodic time line).
fn place_out_wrapping(job: &Job<'_>, bytes: u64, lo: u64, after: usize) -> Option<Copy> {
    let dur = job.out_dur(bytes);
    let period = job.period();
    let chan = job.chan(OUT);
    if dur >= period {
        return None;
    }
    if let Some(start) = chan.earliest_fit(lo, period, dur) {
        return anchor_out(job, start, dur, after);
    }
    // Start as early as the tail of the iteration is free up to its end,
    // then continue at the next iteration's start.
    let busy = chan.busy();
    let tail_from = busy.last().map_or(0, |&(_, e)| e).max(lo);
    if tail_from >= period || !chan.is_free(0, tail_from + dur - period) {
        return None;
    }
    anchor_out(job, tail_from, dur, after)
}

/// The earliest swap-out of a persistent storage at the head of the
/// iteration, ending by `hi`, anchored before the storage's first access.
fn place_out_head(job: &Job<'_>, bytes: u64, hi: u64, first: usize) -> Option<Copy> {
    let dur = job.out_dur(bytes);
    let start = job.chan(OUT).earliest_fit(0, hi, dur)?;
    let mut k = job.boundary_at_or_before(start);
    while k > 0 && !job.steps[k - 1].is_real() {
        k -= 1;
    }
    if k > first {
        return None;
    }
    Some(Copy {
        trigger: k.checked_sub(1),
        delay: start - job.times[k],
        dur,
    })
}

/// A swap-out starting at `start`, anchored to the last real op that ends
/// by then (never before `after`).
fn anchor_out(job: &Job<'_>, start: u64, dur: u64, after: usize) -> Option<Copy> {
    let mut j = job.boundary_at_or_before(start).checked_sub(1)?;
    while !job.steps[j].is_real() {
        j = j.checked_sub(1)?;
    }
    if j < after {
        return None;
    }
    Some(Copy {
        trigger: Some(j),
        delay: start - job.times[j + 1],
        dur,
    })
}

/// The swap-outs of an across-iteration gap of `s` (accesses `after`, the
/// last of the iteration, and `before`, the first) that the greedy
/// scheduler would try at `peak`: after the last access, running on into
/// the next iteration if need be, then at the head of the iteration.
pub(crate) fn wrap_outs(
    job: &Job<'_>,
    s: StorageId,
    peak: usize,
    after: usize,
    before: usize,
) -> Vec<Option<Copy>> {
    let bytes = job.st[s.index()].bytes;
    let t = &job.times;
    let mut outs = Vec::new();
    if let Some(out) = place_out_wrapping(job, bytes, t[after + 1], after) {
        outs.push(Some(out));
    }
    if peak < before
        && let Some(out) = place_out_head(job, bytes, t[peak], before)
    {
        outs.push(Some(out));
    }
    outs
}

/// Places a swap of `s` so that it is off the device during `peak`.
pub(crate) fn place(job: &Job<'_>, s: StorageId, peak: usize) -> Option<Gap> {
    let (after, before, wrap) = gap_around(job, s, peak)?;
    let bytes = job.st[s.index()].bytes;
    let t = &job.times;
    let n = job.n();
    if wrap {
        // The swap-out either follows the last access (the update), running
        // on into the next iteration if need be, or it comes at the head of
        // the next iteration, before the peak: the data is final either way.
        let min_alloc = if peak < before { peak + 1 } else { 0 };
        let try_out = |out: Copy| {
            let lo = out.end(t).saturating_sub(t[n]);
            let inn = place_in(job, s, lo, t[before], min_alloc)?;
            let gap = Gap {
                after,
                before,
                wrap,
                out: Some(out),
                inn: Some(inn),
                forced: false,
            };
            let clears = job
                .absent(&gap)
                .iter()
                .any(|&(a, b)| (a..b).contains(&peak));
            clears.then_some(gap)
        };
        let tail = place_out_wrapping(job, bytes, t[after + 1], after).and_then(try_out);
        let head = || {
            (peak < before)
                .then(|| place_out_head(job, bytes, t[peak], before))
                .flatten()
                .and_then(try_out)
        };
        return tail.or_else(head);
    }
    let (out, in_lo) = if host_copy_valid(job, s, after) {
        (None, t[after + 1])
    } else {
        let out = place_out(job, bytes, t[after + 1], t[peak], after)?;
        (Some(out), out.end(t))
    };
    let inn = place_in(job, s, in_lo, t[before], peak + 1)?;
    Some(Gap {
        after,
        before,
        wrap,
        out,
        inn: Some(inn),
        forced: false,
    })
}

/// Once `s` has a host copy, releases it in each later idle gap and
/// prefetches it back, until something writes it. Returns how many.
pub(crate) fn reuse_host_copy(job: &mut Job<'_>, s: StorageId, from: usize) -> usize {
    let mut placed = 0;
    let acc = job.st[s.index()].accesses.clone();
    for w in acc.windows(2) {
        let (x, y) = (w[0], w[1]);
        if x.step < from {
            continue;
        }
        if x.write {
            break;
        }
        if !job.steps[x.step].is_real() || job.st[s.index()].gaps.iter().any(|g| g.after == x.step)
        {
            continue;
        }
        let t = &job.times;
        if let Some(inn) = place_in(job, s, t[x.step + 1], t[y.step], x.step + 2) {
            job.apply_gap(
                s,
                Gap {
                    after: x.step,
                    before: y.step,
                    wrap: false,
                    out: None,
                    inn: Some(inn),
                    forced: false,
                },
            );
            placed += 1;
        }
    }
    placed
}
