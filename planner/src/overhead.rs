//! Meeting a memory budget at a time cost, once no swap fits without one
//! (SPEC §4.4 generalised, as Capuchin does). Every way of taking a storage
//! off the device at a job's peak is a [`Move`] with the bytes it saves
//! there and an upper bound of the time it adds; the planner takes the one
//! with the most bytes per second (a unified MSPS, see `budget_round`).
//!
//! The moves at a peak, for each storage resident there and not used by the
//! op at the peak:
//! - with no gap around the peak: recompute it (its producer chain before
//!   its next access), or swap it with a prefetch that the job may wait
//!   for, its swap-out fitting before the peak (or a host copy existing);
//!   when even the swap-out does not fit, a wait before the peak lets it;
//! - with a swap gap around the peak: recompute it instead, when its
//!   prefetch comes before the peak (the host-to-device channel was too
//!   busy to bring it later) move the prefetch after the peak, and when its
//!   swap-out ends after the peak wait for it (or bring it forward into a
//!   wait).
//!
//! A wait is a pause of the job's compute at a step: its prefetches after
//! that point move on with it (the one it waits for goes first), its
//! swap-outs keep their times and run during the pause, so the
//! device-to-host queue catches up with compute. The executor only waits
//! for an op's inputs, so a wait for swap-outs is carried by a prefetch of
//! something the step reads that arrives late on purpose: one already
//! planned for the step, moved later, or a new across-iteration swap of a
//! parameter the step reads first in the iteration.

use tensile_graph::StorageId;

use crate::job::{Copy, Gap, Job, OUT};
use crate::recompute::{self, Recompute};
use crate::swap;

/// A copy on the channel that prefetches use, as the search for a late
/// prefetch sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    start: u64,
    end: u64,
    trigger: Option<usize>,
    /// The storage and the index of the gap the copy belongs to.
    id: (StorageId, usize),
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
fn anchor(job: &Job<'_>, start: u64, w: usize, dur: u64) -> Copy {
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
    let mut start = lo;
    for x in others(view.partition_point(|x| x.end <= lo)) {
        if x.end <= start {
            continue;
        }
        if start + dur <= x.start || start + dur > t_c {
            break;
        }
        start = x.end;
    }
    if start + dur <= t_c {
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

/// What a move does.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// Recompute the storage; `replace`: instead of its swap gap at this
    /// index.
    Recompute {
        r: Recompute,
        replace: Option<usize>,
    },
    /// Swap the storage with a late prefetch; `replace`: the gap at this
    /// index, whose prefetch comes too early, gives way to `gap`.
    Swap {
        gap: Gap,
        late: Late,
        replace: Option<usize>,
    },
    /// Make the job wait before step `q` until `until` (a late prefetch of
    /// something `q` reads), so that swap-outs in flight end before the
    /// peak; `then`: and swap the storage out in the time won, its gap
    /// being (after, before): a new gap, or the gap at that index whose
    /// swap-out came too late.
    Stall {
        q: usize,
        until: u64,
        then: Option<(usize, usize, Option<usize>)>,
    },
}

/// One way of taking a storage off the device at a job's peak.
#[derive(Debug, Clone)]
pub(crate) struct Move {
    pub(crate) job: usize,
    /// The peak step it is for.
    pub(crate) peak: usize,
    pub(crate) target: StorageId,
    /// The access after which the storage leaves the device.
    pub(crate) after: usize,
    pub(crate) bytes: u64,
    /// At most this much time added, ns.
    pub(crate) cost_ns: u64,
    pub(crate) action: Action,
}

/// Identifies a move, to remember that it did not help.
pub(crate) type MoveKey = (usize, StorageId, usize, u8);

impl Move {
    /// Bytes saved at the peak per second added (infinite at no cost).
    pub(crate) fn msps(&self) -> f64 {
        if self.cost_ns == 0 {
            f64::INFINITY
        } else {
            self.bytes as f64 / self.cost_ns as f64
        }
    }

    pub(crate) fn key(&self) -> MoveKey {
        let kind = match &self.action {
            Action::Recompute { replace: None, .. } => 0,
            Action::Recompute { .. } => 1,
            Action::Swap { replace: None, .. } => 2,
            Action::Swap { .. } => 3,
            Action::Stall { then: None, .. } => 4,
            Action::Stall {
                then: Some((_, _, None)),
                ..
            } => 5,
            Action::Stall { .. } => 6,
        };
        (self.job, self.target, self.after, kind)
    }
}

/// The swap gap of `s` that spans step `p` (the storage is away for part of
/// it, not at `p`), and the step that needs the storage back.
fn gap_at(job: &Job<'_>, s: StorageId, p: usize) -> Option<(usize, usize)> {
    job.st[s.index()]
        .gaps
        .iter()
        .enumerate()
        .find_map(|(k, g)| {
            let by = job.needed_by(s, g);
            let spans = if g.wrap {
                p > g.after || p < g.before
            } else {
                g.after < p && p < by
            };
            (g.inn.is_some() && spans).then_some((k, by))
        })
}

/// When the swap-out of gap `g` ends (in the next iteration, from its
/// start, for one that runs past the iteration's end).
fn out_free(job: &Job<'_>, g: &Gap) -> Option<u64> {
    g.out.is_some().then(|| in_lo(job, g))
}

/// Where a prefetch after `out` may start: after the copy ends, on the
/// periodic time line for a swap-out that runs past the iteration's end.
fn in_lo(job: &Job<'_>, g: &Gap) -> u64 {
    match g.out {
        Some(out) => {
            let end = out.end(&job.times);
            if g.wrap && !g.head_out() {
                end.saturating_sub(job.iteration_ns())
            } else {
                end
            }
        }
        None => job.times[g.after + 1],
    }
}

/// A new swap of `s` at peak `p` whose prefetch may be late: the swap-out
/// as the greedy scheduler would place it (or none, with a valid host copy).
fn late_swap(
    job: &Job<'_>,
    view: &[Slot],
    s: StorageId,
    p: usize,
    (after, before, wrap): (usize, usize, bool),
) -> Option<(Gap, Late)> {
    let bytes = job.st[s.index()].bytes;
    let outs: Vec<Option<Copy>> = if wrap {
        swap::wrap_outs(job, s, p, after, before)
    } else if swap::host_copy_valid(job, s, after) {
        vec![None]
    } else {
        vec![Some(swap::place_out(
            job,
            bytes,
            job.times[after + 1],
            job.times[p],
            after,
        )?)]
    };
    let min_alloc = if wrap && p > before { 0 } else { p + 1 };
    for out in outs {
        let mut gap = Gap {
            after,
            before,
            wrap,
            out,
            inn: None,
        };
        let Some(late) = late_in(
            job,
            view,
            bytes,
            before,
            in_lo(job, &gap),
            min_alloc,
            None,
            out_free(job, &gap),
        ) else {
            continue;
        };
        gap.inn = Some(late.copy);
        let clears = job.absent(&gap).iter().any(|&(a, b)| (a..b).contains(&p));
        if clears {
            return Some((gap, late));
        }
    }
    None
}

/// The moves at job `j`'s peak `p`. `depth`: how deep recomputations reach.
pub(crate) fn moves(job: &Job<'_>, j: usize, p: usize, depth: usize) -> Vec<Move> {
    let view = channel(job, job.in_chan());
    let out_view = channel(job, OUT);
    let half = job.in_chan() == OUT;
    let t = &job.times;
    let carriers = carrier_steps(job, p);
    // Whether a wait can be made before each of them (found out lazily).
    let mut can_wait: Vec<Option<bool>> = vec![None; carriers.len()];
    // The latest step at or before `upto` where a wait can be made that the
    // copies triggered at `trigger` (and before) do not move with.
    let mut wait_at = |trigger: Option<usize>, upto: usize| {
        for (i, &q) in carriers.iter().enumerate().rev() {
            if q > upto {
                continue;
            }
            if trigger.is_some_and(|t| job.insertion_point(q) <= t) {
                return None;
            }
            let ok = *can_wait[i].get_or_insert_with(|| {
                stall_at(job, &view, &out_view, q, job.times[q] + 1).is_some()
            });
            if ok {
                return Some(q);
            }
        }
        None
    };
    // Taking `b` bytes off the peak takes them off every step of the climb
    // to it above `peak - b`: where that climb starts. A swap-out must end
    // before it does to lower the peak by `b` (and not just move it back a
    // step).
    let mem: Vec<u64> = (0..=p).map(|k| job.tree.at(k).max(0) as u64).collect();
    let mut low = mem.clone();
    for k in (0..p).rev() {
        low[k] = low[k].min(low[k + 1]);
    }
    let climb = |b: u64| {
        let level = mem[p].saturating_sub(b);
        low.partition_point(|&m| m <= level).min(p)
    };
    // The wait before step `q` (at or before `from`) that lets a swap-out
    // ending at `end` end before step `from` starts (see [`pause`]). On a
    // half-duplex link the copies after the pause move on with it, so the
    // pause must also hold the whole copy.
    let pause_len =
        |q: usize, from: usize, end: u64| end.saturating_sub(if half { t[q] } else { t[from] });
    // Swap-outs still in flight at the peak: (end, start, trigger, bytes,
    // storage, gap).
    let mut in_flight: Vec<(u64, u64, Option<usize>, u64, StorageId, usize)> = Vec::new();
    let mut out = Vec::new();
    let (swap_ok, recompute_ok) = (job.settings.swap, job.settings.recompute);
    for (i, st) in job.st.iter().enumerate() {
        let s = StorageId(i as u32);
        if st.bytes == 0 || !job.resident(s, p) || job.accessed_at(s, p) {
            continue;
        }
        let mv = |after: usize, cost_ns: u64, action: Action| Move {
            job: j,
            peak: p,
            target: s,
            after,
            bytes: st.bytes,
            cost_ns,
            action,
        };
        if let Some(around) = swap::gap_around(job, s, p) {
            let (after, before, wrap) = around;
            if recompute_ok
                && !wrap
                && let Some(r) = recompute::candidate(job, s, after, before, depth)
            {
                let cost = recompute::cost_ns(job, &r.chain);
                out.push(mv(after, cost, Action::Recompute { r, replace: None }));
            }
            if !swap_ok {
                continue;
            }
            if let Some((gap, late)) = late_swap(job, &view, s, p, around) {
                out.push(mv(
                    after,
                    late.delta,
                    Action::Swap {
                        gap,
                        late,
                        replace: None,
                    },
                ));
            } else if !wrap && !swap::host_copy_valid(job, s, after) {
                // The swap-out does not fit before the peak: wait for it.
                let from = climb(st.bytes).max(after + 1);
                if let Some(q) = wait_at(Some(after), from)
                    && let Some(start) =
                        out_for_pause(job, &out_view, st.bytes, t[after + 1], after, q)
                {
                    let end = start + job.out_dur(st.bytes);
                    let delta = pause_len(q, from, end);
                    if delta > 0 {
                        let back =
                            late_in(job, &view, st.bytes, before, end, p + 1, None, Some(end))
                                .map_or(job.in_dur(st.bytes), |l| l.delta);
                        out.push(mv(
                            after,
                            delta + back,
                            Action::Stall {
                                q,
                                until: t[q] + delta,
                                then: Some((after, before, None)),
                            },
                        ));
                    }
                }
            }
            continue;
        }
        let Some((k, by)) = gap_at(job, s, p) else {
            continue;
        };
        let g = Gap {
            before: by,
            ..st.gaps[k]
        };
        // The host copy that later gaps of the storage rely on must stay.
        let relied_on = st.gaps.iter().any(|h| h.out.is_none() && h.after > g.after);
        if recompute_ok
            && !g.wrap
            && !relied_on
            && let Some(r) = recompute::candidate(job, s, g.after, g.before, depth)
        {
            let cost = recompute::cost_ns(job, &r.chain);
            out.push(mv(
                g.after,
                cost,
                Action::Recompute {
                    r,
                    replace: Some(k),
                },
            ));
        }
        let Some(inn) = g.inn else { continue };
        let alloc = inn.trigger.map_or(0, |t| t + 1);
        if swap_ok
            && !g.wrap
            && alloc > p
            && let Some(c) = g.out
            && c.end(t) > t[p]
        {
            // Resident at the peak only because its swap-out ends later.
            in_flight.push((c.end(t), c.start(t), c.trigger, st.bytes, s, k));
        }
        if swap_ok
            && alloc <= p
            && p < g.before
            && let Some(late) = late_in(
                job,
                &view,
                st.bytes,
                g.before,
                in_lo(job, &g),
                p + 1,
                Some((s, k)),
                out_free(job, &g),
            )
        {
            let gap = Gap {
                inn: Some(late.copy),
                ..g
            };
            out.push(mv(
                g.after,
                late.delta,
                Action::Swap {
                    gap,
                    late,
                    replace: Some(k),
                },
            ));
        }
    }
    // Swap-outs in flight at the peak: a wait lets them end before the
    // climb to it (and the ones that end sooner too); a swap-out that a
    // wait there would still not let end in time comes forward into it.
    in_flight.sort_by_key(|x| (x.0, x.1));
    for (n, &(end, start, trigger, bytes, s, k)) in in_flight.iter().enumerate() {
        let after = job.st[s.index()].gaps[k].after;
        let freed: u64 = in_flight[..=n]
            .iter()
            .filter(|y| y.2 <= trigger)
            .map(|y| y.3)
            .sum();
        let from = climb(freed).max(after + 1);
        let mv = |bytes: u64, cost_ns: u64, action: Action| Move {
            job: j,
            peak: p,
            target: s,
            after,
            bytes,
            cost_ns,
            action,
        };
        match wait_at(trigger, from) {
            Some(q) if !half || t[q] > start => {
                let delta = pause_len(q, from, end);
                out.push(mv(
                    freed,
                    delta,
                    Action::Stall {
                        q,
                        until: t[q] + delta,
                        then: None,
                    },
                ));
            }
            _ => {
                let mut others = out_view.clone();
                others.retain(|x| x.id != (s, k));
                let from = climb(bytes).max(after + 1);
                if let Some(q) = wait_at(Some(after), from)
                    && let Some(start) = out_for_pause(job, &others, bytes, t[after + 1], after, q)
                {
                    let end = start + job.out_dur(bytes);
                    let delta = pause_len(q, from, end);
                    let by = job.needed_by(s, &job.st[s.index()].gaps[k]);
                    out.push(mv(
                        bytes,
                        delta,
                        Action::Stall {
                            q,
                            until: t[q] + delta,
                            then: Some((after, by, Some(k))),
                        },
                    ));
                }
            }
        }
    }
    out
}

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
struct Carrier {
    carrier: StorageId,
    replace: Option<usize>,
    gap: Gap,
    late: Late,
}

fn stall_at(
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
            .position(|g| g.inn.is_some() && job.needed_by(x, g) == q)
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
    let mut start = 0;
    for y in out_view.iter().filter(|y| y.trigger.is_none_or(|t| t < w)) {
        if y.end <= start {
            continue;
        }
        if start + d <= y.start {
            break;
        }
        start = y.end;
    }
    outs.push(Some(anchor(job, start, w, d)));
    for out in outs {
        let mut gap = Gap {
            after,
            before: q,
            wrap: true,
            out,
            inn: None,
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
fn carrier_steps(job: &Job<'_>, p: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let fresh_ok = job.settings.across_iteration && job.wrap_allowed;
    for (i, st) in job.st.iter().enumerate() {
        let x = StorageId(i as u32);
        if st.bytes == 0 {
            continue;
        }
        for g in &st.gaps {
            let q = job.needed_by(x, g);
            if g.inn.is_some() && q <= p && job.reads(q, x) {
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

/// Where a swap-out of `bytes` that a pause before step `q` is for starts:
/// at or after `lo`, anchored to a real op from `after` on, before the
/// wait. Swap-outs keep their times during a pause (see [`pause`]): it takes
/// the first free slot on its channel; on a half-duplex link, where the
/// copies after the pause move on with it, it goes right after the ones in
/// flight when the pause starts.
fn out_for_pause(
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
        let mut start = lo;
        for x in view {
            if x.end <= start {
                continue;
            }
            if start + d <= x.start {
                break;
            }
            start = x.end;
        }
        start
    };
    let k = if start >= job.times[w] {
        w
    } else {
        job.boundary_at_or_before(start).min(w)
    };
    let trig = (0..k).rev().find(|&j| job.steps[j].is_real())?;
    (trig >= after).then_some(start)
}
