//! Greedy swap scheduling (SPEC §4.3): candidates at the peak, largest first;
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
    } else if st.persistent && job.settings.across_iteration && !acc.is_empty() {
        (acc[acc.len() - 1].step, acc[0].step, true)
    } else {
        return None;
    };
    // A copy after a recompute step would need that step as its trigger;
    // a gap holds one swap or recomputation at most.
    if job.steps[after].rebuilds.is_some()
        || st.gaps.iter().any(|g| g.after == after && g.wrap == wrap)
    {
        return None;
    }
    Some((after, before, wrap))
}

/// Whether a valid host copy of `s` exists once access `after` has ended:
/// an earlier gap put it there and nothing wrote the storage since.
fn host_copy_valid(job: &Job<'_>, s: StorageId, after: usize) -> bool {
    let st = &job.st[s.index()];
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

/// The latest swap-in of `bytes` ending by `by` and starting at or after
/// `lo`, whose buffer is allocated at a real op boundary after `min_alloc`.
fn place_in(job: &Job<'_>, bytes: u64, lo: u64, by: u64, min_alloc: usize) -> Option<Copy> {
    let dur = job.in_dur(bytes);
    let start = job.chans[job.in_chan()].latest_fit(lo, by, dur)?;
    let mut k = job.boundary_at_or_before(start);
    while k > 0 && job.steps[k - 1].rebuilds.is_some() {
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
fn place_out(job: &Job<'_>, bytes: u64, lo: u64, hi: u64, after: usize) -> Option<Copy> {
    let dur = job.out_dur(bytes);
    let start = job.chans[OUT].earliest_fit(lo, hi, dur)?;
    let mut j = job.boundary_at_or_before(start).checked_sub(1)?;
    while job.steps[j].rebuilds.is_some() {
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

/// Places a swap of `s` so that it is off the device during `peak`.
pub(crate) fn place(job: &Job<'_>, s: StorageId, peak: usize) -> Option<Gap> {
    let (after, before, wrap) = gap_around(job, s, peak)?;
    let bytes = job.st[s.index()].bytes;
    let t = &job.times;
    let n = job.n();
    if wrap {
        let out = place_out(job, bytes, t[after + 1], t[n], after)?;
        if peak > after && job.boundary_at_or_after(out.end(t)) > peak {
            return None;
        }
        let min_alloc = if peak < before { peak + 1 } else { 0 };
        let inn = place_in(job, bytes, 0, t[before], min_alloc)?;
        return Some(Gap {
            after,
            before,
            wrap,
            out: Some(out),
            inn: Some(inn),
        });
    }
    let (out, in_lo) = if host_copy_valid(job, s, after) {
        (None, t[after + 1])
    } else {
        let out = place_out(job, bytes, t[after + 1], t[peak], after)?;
        (Some(out), out.end(t))
    };
    let inn = place_in(job, bytes, in_lo, t[before], peak + 1)?;
    Some(Gap {
        after,
        before,
        wrap,
        out,
        inn: Some(inn),
    })
}

/// Once `s` has a host copy, releases it in each later idle gap and
/// prefetches it back, until something writes it. Returns how many.
pub(crate) fn reuse_host_copy(job: &mut Job<'_>, s: StorageId, from: usize) -> usize {
    let mut placed = 0;
    let acc = job.st[s.index()].accesses.clone();
    let bytes = job.st[s.index()].bytes;
    for w in acc.windows(2) {
        let (x, y) = (w[0], w[1]);
        if x.step < from {
            continue;
        }
        if x.write {
            break;
        }
        if job.steps[x.step].rebuilds.is_some()
            || job.st[s.index()].gaps.iter().any(|g| g.after == x.step)
        {
            continue;
        }
        let t = &job.times;
        if let Some(inn) = place_in(job, bytes, t[x.step + 1], t[y.step], x.step + 2) {
            job.apply_gap(
                s,
                Gap {
                    after: x.step,
                    before: y.step,
                    wrap: false,
                    out: None,
                    inn: Some(inn),
                },
            );
            placed += 1;
        }
    }
    placed
}
