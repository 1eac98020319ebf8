//! Phase alignment: the jobs' memory curves on one periodic time line, the
//! peak of their sum for given phases, and the phases that make it lowest
//! (Zico's TimeShift for k jobs). Pure functions over plain curves, so that
//! the planner, the simulator's checks and the benches share them.

use std::borrow::Borrow;

/// One job's memory over one cycle of its gate: `points` are (start ns,
/// bytes) of each step of its iteration, from 0, sorted; the iteration ends
/// at `end`; from then until the cycle's end the job waits at its gate
/// holding `idle` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Curve {
    pub points: Vec<(u64, u64)>,
    pub end: u64,
    pub idle: u64,
}

impl Curve {
    /// A curve whose gate wait holds what the iteration begins with (the
    /// first step's memory: persistent state, inputs and base, a little
    /// more than the wait really holds).
    pub fn new(points: Vec<(u64, u64)>, end: u64) -> Curve {
        let idle = points.first().map_or(0, |p| p.1);
        Curve { points, end, idle }
    }

    /// Memory at local time `t` (`t < cycle`).
    pub fn at(&self, t: u64) -> u64 {
        if t >= self.end {
            return self.idle;
        }
        let i = self.points.partition_point(|p| p.0 <= t);
        i.checked_sub(1).map_or(self.idle, |i| self.points[i].1)
    }

    pub fn peak(&self) -> u64 {
        self.points
            .iter()
            .map(|p| p.1)
            .chain(std::iter::once(self.idle))
            .max()
            .unwrap_or(0)
    }
}

/// The peak of the curves' sum, job `j` shifted by `phases[j]`, over one
/// cycle, and the first instant (on the shared time line, in `[0, cycle)`)
/// where it is reached.
pub fn aligned_sum_peak<C: Borrow<Curve>>(curves: &[C], phases: &[u64], cycle: u64) -> (u64, u64) {
    let cycle = cycle.max(1);
    // (global time, job, bytes from then on)
    let mut changes: Vec<(u64, usize, u64)> = Vec::new();
    for (j, c) in curves.iter().enumerate() {
        let c = c.borrow();
        let phase = phases.get(j).copied().unwrap_or(0) % cycle;
        let to_global = |t: u64| (t % cycle + phase) % cycle;
        changes.push((0, j, c.at((cycle - phase) % cycle)));
        for &(t, m) in &c.points {
            if t < cycle {
                changes.push((to_global(t), j, m));
            }
        }
        if c.end < cycle {
            changes.push((to_global(c.end), j, c.idle));
        }
    }
    changes.sort_by_key(|c| (c.0, c.1));
    let mut cur = vec![0u64; curves.len()];
    let (mut sum, mut best, mut at) = (0u64, 0u64, 0u64);
    let mut i = 0;
    while i < changes.len() {
        let t = changes[i].0;
        while i < changes.len() && changes[i].0 == t {
            let (_, j, m) = changes[i];
            sum = sum - cur[j] + m;
            cur[j] = m;
            i += 1;
        }
        if sum > best {
            best = sum;
            at = t;
        }
    }
    (best, at)
}

/// The most memory a curve holds during its iteration, `[0, end)`, and
/// the first instant it holds it, as [`aligned_sum_peak`] sees the curve
/// (of several points at one instant the last counts); `None` where a
/// point lies at or past the end, or the iteration is empty.
pub(crate) fn top(c: &Curve) -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64)> = None;
    let mut consider = |v: u64, t: u64| {
        if best.is_none_or(|b| v > b.0) {
            best = Some((v, t));
        }
    };
    if c.points.first().map_or(c.end, |p| p.0) > 0 {
        consider(c.idle, 0);
    }
    for (i, &(t, v)) in c.points.iter().enumerate() {
        let next = c.points.get(i + 1).map_or(c.end, |p| p.0);
        if t >= c.end || next < t {
            return None;
        }
        if next > t {
            consider(v, t);
        }
    }
    best
}

/// [`aligned_sum_peak`] where no two curves' iterations overlap on the
/// shared time line (jobs taking turns), from each curve's idle memory and
/// [`top`] alone: during job `j`'s iteration the others wait holding their
/// idle memory, so the sum there is all the idle memory with `j`'s replaced
/// by its curve, and elsewhere all the idle memory. `None` where the
/// iterations overlap or run past the cycle's end (then every change must
/// be swept).
pub(crate) fn disjoint_sum_peak<'c>(
    curves: impl Fn(usize) -> &'c Curve,
    tops: impl Fn(usize) -> Option<(u64, u64)>,
    phases: &[u64],
    cycle: u64,
) -> Option<(u64, u64)> {
    let cycle = cycle.max(1);
    let k = phases.len();
    let mut order: Vec<(u64, usize)> = (0..k).map(|j| (phases[j] % cycle, j)).collect();
    order.sort_unstable();
    let mut idle: u64 = 0;
    let mut cursor = 0;
    let mut gap = None;
    for &(p, j) in &order {
        let c = curves(j);
        if p < cursor || c.end == 0 || c.end > cycle - p {
            return None;
        }
        if p > cursor && gap.is_none() {
            gap = Some(cursor);
        }
        cursor = p + c.end;
        idle += c.idle;
    }
    if cursor < cycle && gap.is_none() {
        gap = Some(cursor);
    }
    // (bytes, first instant)
    let mut best: Option<(u64, u64)> = gap.map(|t| (idle, t));
    for &(p, j) in &order {
        let (v, t) = tops(j)?;
        let bytes = idle - curves(j).idle + v;
        let at = p + t;
        if best.is_none_or(|b| bytes > b.0 || (bytes == b.0 && at < b.1)) {
            best = Some((bytes, at));
        }
    }
    Some(match best {
        Some((bytes, at)) if bytes > 0 => (bytes, at),
        _ => (0, 0),
    })
}

/// Cells per cycle of the search's sampled curves.
const GRID: usize = 256;
/// Passes of coordinate descent after the greedy start.
const PASSES: usize = 3;

/// The phases (job 0 at 0) that make the peak of the curves' sum lowest, as
/// far as a search on a grid of the cycle finds: each curve is sampled per
/// cell by its maximum over the cell (so the grid never hides a peak), the
/// jobs are added one by one at their best shift, then each is moved again
/// while that lowers the peak. `hint`: phases in use; they are kept unless
/// the new ones are lower by more than 1%, so that re-plans do not move
/// gates for nothing.
pub fn choose_phases(curves: &[Curve], cycle: u64, hint: Option<&[u64]>) -> Vec<u64> {
    let k = curves.len();
    if k < 2 || cycle == 0 {
        return vec![0; k];
    }
    let cell = |c: usize| (cycle as u128 * c as u128 / GRID as u128) as u64;
    let sampled: Vec<Vec<u64>> = curves
        .iter()
        .map(|curve| {
            (0..GRID)
                .map(|c| {
                    let (a, b) = (cell(c), cell(c + 1));
                    let inside = curve
                        .points
                        .iter()
                        .filter(|p| p.0 > a && p.0 < b)
                        .map(|p| p.1);
                    let idle = (curve.end > a && curve.end < b).then_some(curve.idle);
                    inside
                        .chain(idle)
                        .chain(std::iter::once(curve.at(a)))
                        .max()
                        .unwrap_or(0)
                })
                .collect()
        })
        .collect();
    let mut shift = vec![0usize; k];
    let mut acc: Vec<u64> = sampled[0].clone();
    let best_shift = |acc: &[u64], s: &[u64]| -> usize {
        (0..GRID)
            .min_by_key(|&d| {
                let peak = (0..GRID)
                    .map(|c| acc[c] + s[(c + GRID - d) % GRID])
                    .max()
                    .unwrap_or(0);
                (peak, d)
            })
            .unwrap_or(0)
    };
    let add = |acc: &mut [u64], s: &[u64], d: usize, sign: bool| {
        for c in 0..GRID {
            let v = s[(c + GRID - d) % GRID];
            acc[c] = if sign { acc[c] + v } else { acc[c] - v };
        }
    };
    for j in 1..k {
        shift[j] = best_shift(&acc, &sampled[j]);
        add(&mut acc, &sampled[j], shift[j], true);
    }
    for _ in 0..PASSES {
        let mut moved = false;
        for j in 1..k {
            add(&mut acc, &sampled[j], shift[j], false);
            let d = best_shift(&acc, &sampled[j]);
            moved |= d != shift[j];
            shift[j] = d;
            add(&mut acc, &sampled[j], d, true);
        }
        if !moved {
            break;
        }
    }
    let phases: Vec<u64> = shift.iter().map(|&d| cell(d)).collect();
    match hint {
        Some(h) if h.len() == k => {
            let h: Vec<u64> = h.iter().map(|p| p % cycle).collect();
            let new = aligned_sum_peak(curves, &phases, cycle).0;
            let old = aligned_sum_peak(curves, &h, cycle).0;
            if (old as f64) <= new as f64 * 1.01 {
                h
            } else {
                phases
            }
        }
        _ => phases,
    }
}

/// How many times a job's iteration may repeat within the longest one
/// before [`aligned_peak`] counts it at its peak throughout.
const MAX_REPEATS: u64 = 256;

/// The peak of the jobs' memory curves on one time line, each job starting
/// at 0 and repeating its iteration, over the longest iteration.
pub(crate) fn aligned_peak(curves: &[(u64, &[(u64, u64)])]) -> u64 {
    let horizon = curves.iter().map(|c| c.0).max().unwrap_or(0);
    let mut changes: Vec<(u64, i64)> = Vec::new();
    for &(period, line) in curves {
        if line.is_empty() {
            continue;
        }
        // A job whose iteration repeats very often within the longest one
        // counts at its peak throughout: an upper bound, and the work
        // stays bounded whatever the iterations' lengths.
        if period == 0 || horizon / period > MAX_REPEATS {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A triangle-ish curve: rises over the first third, falls over the rest.
    fn job(end: u64, peak: u64) -> Curve {
        let steps = 30u64;
        let points = (0..steps)
            .map(|i| {
                let t = end * i / steps;
                let m = if i < steps / 3 {
                    peak * (i + 1) / (steps / 3)
                } else {
                    peak * (steps - i) / (steps - steps / 3)
                };
                (t, m.max(1))
            })
            .collect();
        Curve::new(points, end)
    }

    #[test]
    fn the_aligned_peak_of_shifted_curves_is_found_exactly() {
        let a = Curve::new(vec![(0, 1), (10, 5), (20, 2)], 30);
        let b = Curve::new(vec![(0, 4), (15, 1)], 30);
        assert_eq!(
            aligned_sum_peak(&[a.clone(), b.clone()], &[0, 0], 30),
            (9, 10)
        );
        // b shifted by 15: its high part covers [15, 30), over a's 5 at
        // [15, 20); by 20 it covers [20, 30) and [0, 5), beside a's lows.
        assert_eq!(
            aligned_sum_peak(&[a.clone(), b.clone()], &[0, 15], 30),
            (9, 15)
        );
        assert_eq!(
            aligned_sum_peak(&[a.clone(), b.clone()], &[0, 20], 30),
            (6, 10)
        );
        // Gate waits: in a cycle of 40 each job holds its first step's
        // memory from 30 on (a: 1; b, shifted by 30: 4 over [20, 30)).
        assert_eq!(aligned_sum_peak(&[a, b], &[0, 30], 40), (6, 10));
    }

    #[test]
    fn two_equal_jobs_go_half_a_cycle_apart_and_beat_the_sum_of_peaks() {
        let c = job(1_000, 100);
        let phases = choose_phases(&[c.clone(), c.clone()], 1_000, None);
        let (peak, _) = aligned_sum_peak(&[c.clone(), c.clone()], &phases, 1_000);
        let (together, _) = aligned_sum_peak(&[c.clone(), c.clone()], &[0, 0], 1_000);
        assert_eq!(together, 200);
        assert!(peak <= 140, "aligned {peak} at {phases:?}");
        // A hint that is as good stays; a much worse one does not.
        let kept = choose_phases(&[c.clone(), c.clone()], 1_000, Some(&phases));
        assert_eq!(kept, phases);
        let moved = choose_phases(&[c.clone(), c.clone()], 1_000, Some(&[0, 0]));
        assert_ne!(moved, vec![0, 0]);
    }

    #[test]
    fn three_jobs_spread_over_the_cycle() {
        let c = job(900, 90);
        let curves = vec![c.clone(), c.clone(), c];
        let phases = choose_phases(&curves, 900, None);
        let (peak, _) = aligned_sum_peak(&curves, &phases, 900);
        assert!(peak < 200, "aligned {peak} at {phases:?}");
        assert_eq!(phases[0], 0);
    }
}
