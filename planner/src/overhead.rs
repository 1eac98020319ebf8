//! Meeting a memory budget at a time cost, once no swap fits without one
//! (generalised, as Capuchin does). Every way of taking a storage
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
//!
//! # Layout
//! - here: the moves ([`Move`], [`Action`]) and where they are found
//!   ([`moves`]);
//! - `channel`: the copy channels as these searches see them, and where a
//!   late prefetch or a swap-out for a wait fits on them;
//! - `wait`: applying a move ([`apply`]), and the waits that carry moves.

mod channel;
mod wait;

use tensile_graph::StorageId;

use crate::job::{Copy, Gap, Job, OUT};
use crate::recompute::{self, Recompute};
use crate::swap;
use channel::{Late, Slot, channel, in_lo, late_in, out_for_pause, out_free};
use wait::{carrier_steps, stall_at};

pub(crate) use wait::apply;

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

/// Identifies a move, to remember that it did not help: its job, storage,
/// the access after which the storage leaves, and its kind.
pub(crate) type MoveKey = (usize, StorageId, usize, MoveKind);

/// What kind of move a [`Move`] is, as [`Move::key`] tells moves apart;
/// between moves of equal worth the earlier kind goes first (the derived
/// order, which the planner's results depend on: keep it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum MoveKind {
    /// Recompute a storage with no gap around the peak.
    Recompute,
    /// Recompute a storage instead of its swap gap.
    RecomputeInsteadOfSwap,
    /// A new swap, its prefetch perhaps waited for.
    Swap,
    /// A swap gap whose too-early prefetch moves after the peak.
    LaterPrefetch,
    /// A wait that lets the swap-outs in flight end before the peak.
    Wait,
    /// A wait, and a new swap-out in the time it wins.
    WaitForNewSwapOut,
    /// A wait, and a gap's too-late swap-out brought forward into it.
    WaitForEarlierSwapOut,
}

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
            Action::Recompute { replace: None, .. } => MoveKind::Recompute,
            Action::Recompute { .. } => MoveKind::RecomputeInsteadOfSwap,
            Action::Swap { replace: None, .. } => MoveKind::Swap,
            Action::Swap { .. } => MoveKind::LaterPrefetch,
            Action::Stall { then: None, .. } => MoveKind::Wait,
            Action::Stall {
                then: Some((_, _, None)),
                ..
            } => MoveKind::WaitForNewSwapOut,
            Action::Stall { .. } => MoveKind::WaitForEarlierSwapOut,
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
            (g.inn.is_some() && !g.forced && spans).then_some((k, by))
        })
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
            forced: false,
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

/// A swap-out still in flight at the peak: the storage is resident there
/// only because the copy ends later.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    end: u64,
    start: u64,
    trigger: Option<usize>,
    bytes: u64,
    storage: StorageId,
    /// The index of its gap among the storage's.
    gap: usize,
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
    let mut in_flight: Vec<InFlight> = Vec::new();
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
            in_flight.push(InFlight {
                end: c.end(t),
                start: c.start(t),
                trigger: c.trigger,
                bytes: st.bytes,
                storage: s,
                gap: k,
            });
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
    in_flight.sort_by_key(|x| (x.end, x.start));
    for (n, x) in in_flight.iter().enumerate() {
        let InFlight {
            end,
            start,
            trigger,
            bytes,
            storage: s,
            gap: k,
        } = *x;
        let after = job.st[s.index()].gaps[k].after;
        let freed: u64 = in_flight[..=n]
            .iter()
            .filter(|y| y.trigger <= trigger)
            .map(|y| y.bytes)
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
