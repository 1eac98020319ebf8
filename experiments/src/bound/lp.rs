//! The linear program of one instant: the most bytes that the idle storages
//! of all jobs can have off the device then, given the link.
//!
//! Every swap-out window ends at the instant and every swap-in window
//! starts there, so the windows of each direction are nested, and
//! preemptive fluid copies fit their windows exactly when, for every
//! window length `d`, the copies whose windows are at most `d` long fit in
//! `d` at that direction's bandwidth (what must leave within `[t - d, t]`
//! is what only has that much room). With one channel for both directions
//! (half duplex) the two sets of copies are apart in time within a period,
//! and together they must fit in one period. Each storage `s` is absent by
//! a fraction `x_s` in `[0, 1]`; the program maximises `Σ x_s bytes_s`.
//!
//! The program is kept small: a window constraint that the shorter ones
//! and the storages' sizes already imply is dropped, storages are merged
//! when they fall under the same constraints, and storages under none are
//! counted as absent outright. The nested sums are written with one
//! cumulative variable per constraint, so every storage appears in at most
//! two rows (three with the period's) and the matrix stays sparse.
//!
//! Two answers come without solving: [`Program::most`], each direction on
//! its own (exact for one chain of nested constraints), above the optimum,
//! and [`Program::greedy`], a feasible point, below it. The caller solves
//! only where the two leave the bound undecided.

use std::collections::BTreeMap;

use good_lp::{
    Expression, ProblemVariables, ResolutionError, Solution, SolverModel, Variable, microlp,
    variable,
};
use tensile_planner::CopyModel;

use super::model::Candidate;

/// The program's unit of bytes (a MiB), so that its numbers stay near 1.
const UNIT: f64 = (1u64 << 20) as f64;

/// Whole bytes that `x` (give or take `slack`) can be at most: a fraction
/// of a byte off the device saves nothing in a whole peak.
fn up(x: f64, slack: f64) -> u64 {
    (x + slack + 1e-6).floor() as u64
}

/// Which constraints of one direction a storage falls under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Side {
    /// Under the window constraint of this index and every later one.
    Level(usize),
    /// Under none that can bind, but it takes a copy (the period's row).
    Free,
    /// No copy that way.
    None,
}

/// The window constraints of one direction that can bind, and where each
/// candidate falls: returns each candidate's side, each constraint's
/// capacity in bytes, and the most bytes with a window that this
/// direction allows on its own.
fn chain(windows: &[Option<u64>], bytes: &[u64], bytes_per_s: f64) -> (Vec<Side>, Vec<f64>, f64) {
    let mut order: Vec<usize> = (0..windows.len())
        .filter(|&i| windows[i].is_some())
        .collect();
    order.sort_by_key(|&i| windows[i]);
    let mut levels: Vec<u64> = Vec::new();
    let mut caps = Vec::new();
    // The most that can be under the window being looked at, given the
    // constraints kept so far and the storages' sizes: a constraint that
    // this does not exceed is implied, and dropped.
    let mut most = 0.0f64;
    let mut i = 0;
    while i < order.len() {
        let d = windows[order[i]].unwrap_or(0);
        while i < order.len() && windows[order[i]] == Some(d) {
            most += bytes[order[i]] as f64;
            i += 1;
        }
        let cap = bytes_per_s * d as f64 / 1e9;
        if cap < most {
            levels.push(d);
            caps.push(cap);
            most = cap;
        }
    }
    let sides = windows
        .iter()
        .map(|w| match *w {
            None => Side::None,
            Some(d) => {
                let l = levels.partition_point(|&x| x < d);
                if l < levels.len() {
                    Side::Level(l)
                } else {
                    Side::Free
                }
            }
        })
        .collect();
    (sides, caps, most)
}

/// The program of one instant, reduced.
#[derive(Debug, Clone)]
pub(super) struct Program {
    /// Merged storages: where they fall each way, and their bytes.
    groups: Vec<((Side, Side), u64)>,
    /// Bytes under no constraint that can bind: absent outright.
    fixed: u64,
    total: u64,
    out_caps: Vec<f64>,
    in_caps: Vec<f64>,
    /// The most each direction allows on its own (all bytes counted).
    out_most: f64,
    in_most: f64,
    /// Half duplex, when both directions' copies may not fit in a period:
    /// the fraction of the period one byte of a group takes, out and in.
    period: Option<(f64, f64)>,
}

impl Program {
    /// The program for the idle storages `cands` of all jobs, over a
    /// period of `period_ns`, on `link` (shared by every job).
    pub(super) fn new(cands: &[Candidate], link: &CopyModel, period_ns: u64) -> Program {
        let bytes: Vec<u64> = cands.iter().map(|c| c.bytes).collect();
        let total: u64 = bytes.iter().sum();
        let outs: Vec<Option<u64>> = cands.iter().map(|c| c.out_ns).collect();
        let ins: Vec<Option<u64>> = cands.iter().map(|c| c.in_ns).collect();
        let (out_side, out_caps, out_most) = chain(&outs, &bytes, link.d2h_bytes_per_s);
        let (in_side, in_caps, in_most) = chain(&ins, &bytes, link.h2d_bytes_per_s);
        // The fraction of the period one byte's copy takes, each way.
        let period_s = period_ns as f64 / 1e9;
        let (out_p, in_p) = (
            1.0 / link.d2h_bytes_per_s / period_s,
            1.0 / link.h2d_bytes_per_s / period_s,
        );
        let busy: f64 = cands
            .iter()
            .map(|c| {
                let b = c.bytes as f64;
                c.out_ns.map_or(0.0, |_| b * out_p) + c.in_ns.map_or(0.0, |_| b * in_p)
            })
            .sum();
        let period = (link.half_duplex && busy > 1.0).then_some((out_p, in_p));
        let mut groups: BTreeMap<(Side, Side), u64> = BTreeMap::new();
        let mut fixed = 0u64;
        for (i, &b) in bytes.iter().enumerate() {
            let key = (out_side[i], in_side[i]);
            let chained = matches!(key.0, Side::Level(_)) || matches!(key.1, Side::Level(_));
            let timed = key.0 != Side::None || key.1 != Side::None;
            if chained || (period.is_some() && timed) {
                *groups.entry(key).or_default() += b;
            } else {
                fixed += b;
            }
        }
        let unwindowed = |w: &[Option<u64>]| -> f64 {
            w.iter()
                .zip(&bytes)
                .filter(|(w, _)| w.is_none())
                .map(|(_, &b)| b as f64)
                .sum()
        };
        Program {
            groups: groups.into_iter().collect(),
            fixed,
            total,
            out_most: out_most + unwindowed(&outs),
            in_most: in_most + unwindowed(&ins),
            out_caps,
            in_caps,
            period,
        }
    }

    /// The fraction of the period's row one byte of a group takes.
    fn per_byte(&self, o: Side, i: Side) -> f64 {
        let Some((po, pi)) = self.period else {
            return 0.0;
        };
        let way = |side: Side, x: f64| if side == Side::None { 0.0 } else { x };
        way(o, po) + way(i, pi)
    }

    /// Merged storages in the program.
    pub(super) fn storages(&self) -> usize {
        self.groups.len()
    }

    /// No more than this can be absent: each direction on its own (a
    /// nested chain alone is solved by filling it in any order).
    pub(super) fn most(&self) -> u64 {
        // Sums and products of whole numbers: exact but for rounding.
        let most = self.out_most.min(self.in_most);
        self.total.min(up(most, most * 1e-12))
    }

    /// This much can be absent: storages taken whole or in part, one by
    /// one, as far as the constraints still allow; the loosest first (by
    /// the direction whose windows are looked at first), the better of the
    /// two orders. On the zoo's programs it is within bytes of the optimum.
    pub(super) fn greedy(&self) -> u64 {
        let rank = |s: Side| match s {
            Side::Level(l) => l,
            Side::Free => usize::MAX - 1,
            Side::None => usize::MAX,
        };
        let mut order: Vec<usize> = (0..self.groups.len()).collect();
        let mut best = 0;
        for in_first in [false, true] {
            order.sort_by_key(|&g| {
                let (o, i) = self.groups[g].0;
                let key = if in_first {
                    (rank(i), rank(o))
                } else {
                    (rank(o), rank(i))
                };
                std::cmp::Reverse(key)
            });
            best = best.max(self.fill(&order));
        }
        best
    }

    /// What filling the groups in `order` gets off the device.
    fn fill(&self, order: &[usize]) -> u64 {
        let mut out_left = self.out_caps.clone();
        let mut in_left = self.in_caps.clone();
        let mut period_left = 1.0f64;
        let mut sum = 0.0f64;
        for &g in order {
            let ((o, i), b) = self.groups[g];
            let mut y = b as f64;
            for (side, left) in [(o, &out_left), (i, &in_left)] {
                if let Side::Level(l) = side {
                    y = left[l..].iter().fold(y, |y, &x| y.min(x));
                }
            }
            let per = self.per_byte(o, i);
            if per > 0.0 {
                y = y.min(period_left / per);
            }
            let y = y.max(0.0);
            for (side, left) in [(o, &mut out_left), (i, &mut in_left)] {
                if let Side::Level(l) = side {
                    left[l..].iter_mut().for_each(|x| *x -= y);
                }
            }
            period_left -= y * per;
            sum += y;
        }
        // Round down: this must stay feasible.
        self.fixed + (sum * (1.0 - 1e-9)).floor().max(0.0) as u64
    }

    /// Solves the program: the most bytes off the device (rounded up).
    pub(super) fn solve(&self) -> Result<u64, ResolutionError> {
        if self.groups.is_empty() {
            return Ok(self.total);
        }
        let mut vars = ProblemVariables::new();
        let ys: Vec<Variable> = self
            .groups
            .iter()
            .map(|&(_, b)| vars.add(variable().min(0).max(b as f64 / UNIT)))
            .collect();
        let cumulative = |vars: &mut ProblemVariables, caps: &[f64]| -> Vec<Variable> {
            caps.iter()
                .map(|&c| vars.add(variable().min(0).max(c / UNIT)))
                .collect()
        };
        let c_out = cumulative(&mut vars, &self.out_caps);
        let c_in = cumulative(&mut vars, &self.in_caps);
        let objective: Expression = ys.iter().sum();
        // Row l: c[l - 1] + (what falls under constraint l first) - c[l] <= 0.
        let rows = |cs: &[Variable]| -> Vec<Expression> {
            cs.iter()
                .enumerate()
                .map(|(l, &c)| {
                    let mut row = Expression::from(0.0) - c;
                    if l > 0 {
                        row += cs[l - 1];
                    }
                    row
                })
                .collect()
        };
        let (mut out_rows, mut in_rows) = (rows(&c_out), rows(&c_in));
        let mut period_row = Expression::from(0.0);
        for (&y, &((o, i), _)) in ys.iter().zip(&self.groups) {
            if let Side::Level(l) = o {
                out_rows[l] += y;
            }
            if let Side::Level(l) = i {
                in_rows[l] += y;
            }
            if self.period.is_some() {
                period_row.add_mul(self.per_byte(o, i) * UNIT, y);
            }
        }
        let mut model = vars.maximise(objective).using(microlp);
        for row in out_rows.into_iter().chain(in_rows) {
            model.add_constraint(row.leq(0.0));
        }
        if self.period.is_some() {
            model.add_constraint(period_row.leq(1.0));
        }
        let solution = model.solve()?;
        let lp: f64 = ys
            .iter()
            .zip(&self.groups)
            .map(|(&y, &(_, b))| (solution.value(y) * UNIT).clamp(0.0, b as f64))
            .sum();
        // The solver is exact only to its tolerance: round up by more, so
        // that this stays an upper bound of what can be absent.
        let slack = lp * 1e-7 + 1e-3 * ys.len() as f64;
        Ok(self.total.min(self.fixed + up(lp, slack)))
    }
}
