//! Turns: jobs that take turns on the device instead of sharing it, as a
//! gate layout. Every job gets a window as long as its iteration alone
//! (plus slack); the gates' period is the sum of the windows and each
//! job's phase the sum of the windows before it, so that one job's
//! iterations run while the others wait at their gates holding what they
//! keep across iterations (which the coordinated search may swap out for
//! the wait). Nothing runs beside anything: each job runs at its speed
//! alone, and the cycle is the sum of the jobs' iterations alone.
//!
//! Sharing the device pays only while the jobs' iterations beside each
//! other, under the budget, take less than their iterations alone added
//! up. [`choose`] plans the turns beside the shared plan (free or gated)
//! and keeps the one with the shorter predicted cycle among those that fit
//! the budget, so that, by the planner's prediction, jobs never run slower
//! than one after another.

use std::borrow::Cow;
use std::time::Instant;

use tensile_graph::Liveness;

use crate::coord::Coord;
use crate::job::Job;
use crate::{
    Deadline, JobInput, Layout, MeasuredIn, MultiPlan, PlannerConfig, Turns, gate_slack,
    global_peak, lengthen, plan_with,
};

/// The least slack of a turn beyond the job's planned iteration alone: a
/// job that runs a little past its turn runs beside the next one (both
/// slower) until it ends.
pub(crate) const TURNS_SLACK: f64 = 0.02;

/// How much wider than the jobs' iterations alone (with slack) their turns
/// are tried in turn while the jobs do not fit the budget: a wider turn
/// lets a job recompute or wait for its prefetches within it.
const WIDEN: &[f64] = &[1.0, 1.1, 1.25, 1.5, 2.0, 3.0];

/// How much shorter one layout's predicted cycle must be for the jobs to
/// switch to it (from sharing to turns or back): each switch costs every
/// job a realignment, and the predictions are not exact.
pub(crate) const SWITCH: f64 = 0.02;

/// How much shorter than the turns' cycle a free plan's must be predicted
/// for the jobs to share the device free under a budget that binds (their
/// vanilla peaks add up to more): free jobs drift against each other, and
/// their copies meet on the link at moments no plan chose, so that such a
/// plan runs slower than predicted and its guard evicts (two ResNet-50 b32
/// on the h100 under one copy's peak: predicted 71.8 ms a cycle, ran 115
/// to 200 ms; the turns, predicted 74.5 ms, ran on it).
const FREE_MARGIN: f64 = 0.10;

/// The jobs' latencies as the two layouts need them: beside the other
/// jobs for sharing, alone for turns (each job's as it was measured,
/// [`MeasuredIn`]).
pub(crate) struct Latencies<'a, 'g> {
    jobs: &'a [JobInput<'g>],
    /// Every job's latencies were measured taking turns: the jobs take
    /// turns now.
    alone_now: bool,
    /// How much slower a job runs beside the others than alone.
    factor: f64,
}

impl<'a, 'g> Latencies<'a, 'g> {
    pub(crate) fn new(jobs: &'a [JobInput<'g>], config: &PlannerConfig) -> Latencies<'a, 'g> {
        let k = jobs.len();
        Latencies {
            jobs,
            alone_now: k >= 2 && jobs.iter().all(|j| j.latencies == MeasuredIn::Turns),
            factor: 1.0 + config.sharing_slowdown.max(0.0) * k.saturating_sub(1) as f64,
        }
    }

    /// The jobs as sharing plans them: latencies beside the others, and
    /// no gate or free run of turns to keep.
    pub(crate) fn shared(&self) -> Cow<'a, [JobInput<'g>]> {
        if self.jobs.iter().all(|j| j.latencies != MeasuredIn::Turns) {
            return Cow::Borrowed(self.jobs);
        }
        Cow::Owned(
            self.jobs
                .iter()
                .map(|j| match j.latencies {
                    MeasuredIn::Turns => JobInput {
                        gate: None,
                        runs_free: false,
                        latencies: MeasuredIn::Sharing,
                        ..scaled(j, self.factor)
                    },
                    _ => j.clone(),
                })
                .collect(),
        )
    }

    /// The jobs as turns plan them: latencies alone.
    fn alone(&self) -> Cow<'a, [JobInput<'g>]> {
        if self.jobs.iter().all(|j| j.latencies == MeasuredIn::Turns) {
            return Cow::Borrowed(self.jobs);
        }
        Cow::Owned(
            self.jobs
                .iter()
                .map(|j| match j.latencies {
                    MeasuredIn::Sharing => scaled(j, 1.0 / self.factor),
                    MeasuredIn::Turns => j.clone(),
                })
                .collect(),
        )
    }
}

fn scaled<'g>(j: &JobInput<'g>, by: f64) -> JobInput<'g> {
    JobInput {
        latency_ns: j
            .latency_ns
            .iter()
            .map(|&x| (x as f64 * by).round() as u64)
            .collect(),
        ..j.clone()
    }
}

/// The time for every job to run one iteration under `mp`, ns: the gates'
/// period for gated jobs, else `k` over the jobs' iterations per ns added
/// up.
fn cycle_of(mp: &MultiPlan) -> u64 {
    if mp.cycle_ns > 0 {
        return mp.cycle_ns;
    }
    let rate: f64 = mp
        .plans
        .iter()
        .map(|p| 1.0 / p.prediction.planned_time_ns.max(1) as f64)
        .sum();
    (mp.plans.len() as f64 / rate.max(f64::MIN_POSITIVE)).round() as u64
}

fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

/// `shared` (the jobs' shared plan: free or gated) or the jobs planned to
/// take turns, whichever fits the budget with the shorter predicted cycle
/// (`PlannerConfig::turns`); with the cycles and the reason on the plans.
/// Turns are not planned when sharing fits and its cycle is no longer than
/// the jobs' vanilla iterations alone added up, which no turns beat.
pub(crate) fn choose(
    at: &Latencies<'_, '_>,
    lives: &[Liveness],
    config: &PlannerConfig,
    mut shared: MultiPlan,
    started: Instant,
    deadline: Deadline<'_>,
) -> MultiPlan {
    let k = at.jobs.len();
    let Some(budget) = config
        .budget_bytes
        .filter(|_| config.coordinate && k >= 2 && config.turns != Turns::Never)
    else {
        return shared;
    };
    let s = cycle_of(&shared);
    shared.shared_cycle_ns = s;
    let gated = shared.cycle_ns > 0;
    let shared_peak = if gated {
        shared.aligned_peak_bytes
    } else {
        shared.sum_of_peaks_bytes
    };
    let shared_fits = shared_peak <= budget && (gated || !at.jobs.iter().any(|j| j.free_missed));
    let what = shared.layout.name();
    let alone = at.alone();
    let least: u64 = alone.iter().map(|j| j.latency_ns.iter().sum::<u64>()).sum();
    let margin = if !gated && shared.vanilla_sum_of_peaks_bytes > budget {
        FREE_MARGIN
    } else {
        0.0
    };
    if config.turns == Turns::WhenFaster
        && !at.alone_now
        && shared_fits
        && s as f64 * (1.0 + margin) <= least as f64
    {
        shared.layout_note = format!(
            "{what}: sharing's predicted cycle ({}) is no longer than the jobs' iterations alone added up ({}), which taking turns cannot beat",
            ms(s),
            ms(least)
        );
        return shared;
    }
    let mut turns = plan_with(&alone, lives, config, Layout::Turns, started, deadline);
    let t = turns.cycle_ns;
    let turns_fits = turns.aligned_peak_bytes <= budget;
    let (sf, tf) = (s as f64, t as f64);
    let take = match (config.turns, shared_fits, turns_fits) {
        (Turns::Always, _, _) => true,
        (_, true, true) if at.alone_now => tf <= sf * (1.0 + SWITCH + margin),
        (_, true, true) => tf < sf * (1.0 + margin) / (1.0 + SWITCH),
        (_, false, true) => true,
        (_, true, false) => false,
        (_, false, false) => turns.aligned_peak_bytes < shared_peak,
    };
    let over = |fits: bool| if fits { "" } else { ", over the budget" };
    let note = format!(
        "{}: predicted cycle sharing ({what}) {}{}, taking turns {}{}",
        if take { "turns" } else { what },
        ms(s),
        over(shared_fits),
        ms(t),
        over(turns_fits)
    );
    let mut out = if take {
        turns.profile.total = started.elapsed();
        turns
    } else {
        shared
    };
    out.shared_cycle_ns = s;
    out.turns_cycle_ns = t;
    out.layout_note = note;
    out
}

/// The turns of jobs whose turns last `windows`: the period their sum,
/// each job's phase the sum of the windows before it.
pub(crate) fn layout(windows: &[u64]) -> Coord {
    let mut phases = Vec::with_capacity(windows.len());
    let mut at = 0;
    for &w in windows {
        phases.push(at);
        at += w;
    }
    Coord {
        cycle: at.max(1),
        phases,
    }
}

/// Plans `state` (installed at no cycle yet, not planned) to take turns:
/// each job's turn its iteration alone plus slack, widened step by step
/// while the jobs do not fit the budget (and no turn passes the job's
/// `limits`); within a turn the job's moves may take its time up to the
/// turn's end, never beyond (it would run beside the next job). Keeps the
/// lowest plan; returns its turns and whether its search was capped.
pub(crate) fn search(
    state: &mut Vec<Job<'_>>,
    config: &PlannerConfig,
    limits: &[u64],
    deadline: Deadline<'_>,
    out: &mut MultiPlan,
) -> (Coord, bool) {
    let fresh = state.clone();
    let alone: Vec<u64> = fresh.iter().map(Job::iteration_ns).collect();
    let slack = gate_slack(config, fresh.len()).max(TURNS_SLACK);
    let mut best: Option<(u64, Vec<Job<'_>>, Coord, bool, MultiPlan)> = None;
    for (i, &widen) in WIDEN.iter().enumerate() {
        let windows: Vec<u64> = alone
            .iter()
            .map(|&t| ((t as f64 * (1.0 + slack) * widen).ceil() as u64).max(1))
            .collect();
        if i > 0 && (deadline.past() || windows.iter().zip(limits).any(|(w, l)| w > l)) {
            break;
        }
        let coord = layout(&windows);
        let within: Vec<u64> = windows
            .iter()
            .zip(limits)
            .map(|(&w, &l)| w.min(l))
            .collect();
        let mut trial = fresh.clone();
        coord.install(&mut trial);
        let mut tried = MultiPlan::default();
        let capped =
            lengthen::search_coordinated(&mut trial, config, &coord, &within, deadline, &mut tried);
        let peak = global_peak(&trial, Some(&coord));
        if best.as_ref().is_none_or(|b| peak < b.0) {
            best = Some((peak, trial, coord, capped, tried));
        }
        if config.budget_bytes.is_none_or(|b| peak <= b) {
            break;
        }
    }
    let (_, planned, coord, capped, tried) = best.expect("the first turns are always planned");
    *state = planned;
    out.diagnostics = tried.diagnostics;
    out.rounds += tried.rounds;
    out.profile.swap_rounds += tried.profile.swap_rounds;
    out.profile.budget_rounds += tried.profile.budget_rounds;
    (coord, capped)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tensile_graph::builder::{Builder, Optimizer};
    use tensile_graph::{DType, Graph};

    use super::layout;
    use crate::{CopyModel, JobInput, JobSettings, Layout, MultiPlan, PlannerConfig, Turns, plan};

    #[test]
    fn turns_follow_one_another_round_the_cycle() {
        let c = layout(&[30, 50, 20]);
        assert_eq!(c.cycle, 100);
        assert_eq!(c.phases, vec![0, 30, 80]);
    }

    fn mlp() -> Graph {
        let mut b = Builder::new("mlp");
        let x = b.input("x", vec![1024, 512], DType::F32);
        let y = b.input("y", vec![1024], DType::I64);
        let h = b.linear("fc1", x, 1024, false);
        let h = b.relu("act1", h);
        let h = b.linear("fc2", h, 1024, false);
        let h = b.relu("act2", h);
        let logits = b.linear("head", h, 10, false);
        let loss = b.cross_entropy("loss", logits, y);
        b.finish(loss, Optimizer::adam()).unwrap()
    }

    /// Two copies of `g` at 100 us an op (`turns`: measured alone, else
    /// beside each other), under a budget that binds nothing, on a device
    /// where sharing slows each job by `1 + slowdown`.
    fn two(g: &Graph, slowdown: f64, turns: Turns, op_ns: u64, alone: bool) -> MultiPlan {
        let mut config = PlannerConfig::new(CopyModel::duplex(1e10, 1e10, 1_000));
        config.coordinate = true;
        config.budget_bytes = Some(1 << 40);
        config.sharing_slowdown = slowdown;
        config.turns = turns;
        let lat = vec![op_ns; g.ops().len()];
        let input = JobInput {
            latencies: if alone {
                crate::MeasuredIn::Turns
            } else {
                crate::MeasuredIn::Sharing
            },
            ..JobInput::new(g, lat, JobSettings::default())
        };
        plan(&[input.clone(), input], &config).unwrap()
    }

    /// Whether each job's planned iteration ends before the next job's
    /// turn begins, round the cycle.
    fn one_at_a_time(mp: &MultiPlan) -> bool {
        let gates: Vec<_> = mp.plans.iter().map(|p| p.gate.unwrap()).collect();
        let period = gates[0].period_ns;
        let mut turns: Vec<(u64, u64)> = mp
            .plans
            .iter()
            .zip(&gates)
            .map(|(p, g)| (g.phase_ns, p.prediction.planned_time_ns))
            .collect();
        turns.sort();
        gates.iter().all(|g| g.period_ns == period)
            && turns
                .iter()
                .zip(turns.iter().cycle().skip(1))
                .all(|(a, b)| (b.0 + period - a.0) % period >= a.1 || turns.len() == 1)
    }

    #[test]
    fn turns_replace_a_share_slower_than_the_jobs_alone_one_after_another() {
        let g = mlp();
        let op = 100_000;
        let alone: u64 = op * g.ops().len() as u64;
        // Sharing slows each job 2.5 times: one iteration each beside the
        // other takes longer than both alone one after another.
        let mp = two(&g, 1.5, Turns::WhenFaster, op, false);
        assert_eq!(mp.layout, Layout::Turns, "{}", mp.layout_note);
        assert!(
            mp.shared_cycle_ns > 2 * alone * 10 / 25,
            "{}",
            mp.layout_note
        );
        assert_eq!(mp.cycle_ns, mp.turns_cycle_ns);
        assert!(mp.turns_cycle_ns < mp.shared_cycle_ns);
        // Each job's turn is its iteration alone (the latencies given
        // beside the other, over 2.5) with the gates' pad and slack.
        assert!(mp.turns_cycle_ns >= 2 * alone * 10 / 25);
        assert!(mp.turns_cycle_ns <= 2 * alone * 10 / 25 * 110 / 100);
        assert!(
            one_at_a_time(&mp),
            "{:?}",
            mp.plans.iter().map(|p| p.gate).collect::<Vec<_>>()
        );
        assert!(mp.layout_note.starts_with("turns:"), "{}", mp.layout_note);
        // Re-planned from latencies measured alone (taking turns), the
        // jobs keep the same turns.
        let again = two(&g, 1.5, Turns::WhenFaster, op * 10 / 25, true);
        assert_eq!(again.layout, Layout::Turns);
        let near = |a: u64, b: u64| a.abs_diff(b) <= b / 100;
        assert!(near(again.turns_cycle_ns, mp.turns_cycle_ns));
        assert!(near(again.shared_cycle_ns, mp.shared_cycle_ns));
    }

    /// Zoo mixes planned to take turns under budgets that bind: every
    /// aligned peak the search asks for comes from the jobs' idle memory
    /// and tops alone, and each is checked against the sweep of every
    /// curve's changes (in `Coord::sum_peak`), as every memoised channel is
    /// against a fresh merge (in `Job::chan`): the plans are the sweep's.
    #[test]
    fn turns_plans_take_the_disjoint_peak_which_is_the_sweeps() {
        // (mix, budgets as shares of the vanilla sum of peaks)
        let mixes: [(&[&str], &[f64]); 2] = [
            (&["resnet50", "vgg16", "bert_base"], &[0.9, 0.6]),
            (&["inception_v3", "resnet50"], &[0.6]),
        ];
        for (mix, budgets) in mixes {
            let graphs = crate::free::tests::zoo_graphs(mix);
            let inputs = crate::free::tests::unequal_jobs(&graphs);
            let mut config = PlannerConfig::new(CopyModel::duplex(12e9, 12e9, 5_000));
            let vanilla = plan(&inputs, &config).unwrap().vanilla_sum_of_peaks_bytes;
            config.coordinate = true;
            config.turns = Turns::Always;
            for &budget in budgets {
                config.budget_bytes = Some((vanilla as f64 * budget) as u64);
                crate::coord::tests::DISJOINT.set(0);
                let mp = plan(&inputs, &config).unwrap();
                assert_eq!(mp.layout, Layout::Turns, "{mix:?} at {budget}");
                assert!(
                    crate::coord::tests::DISJOINT.get() > 0,
                    "{mix:?} at {budget}: no aligned peak took the disjoint path"
                );
            }
        }
    }

    #[test]
    fn sharing_that_beats_the_turns_is_kept() {
        let g = mlp();
        // Sharing slows each job 1.2 times: both beside each other beat
        // both one after another, which is not even planned.
        let mp = two(&g, 0.2, Turns::WhenFaster, 100_000, false);
        assert_eq!(mp.layout, Layout::Free, "{}", mp.layout_note);
        assert!(mp.plans.iter().all(|p| p.gate.is_none()));
        assert_eq!(mp.turns_cycle_ns, 0);
        assert!(mp.shared_cycle_ns > 0);
        // Made to, the jobs take turns, on a longer cycle.
        let turns = two(&g, 0.2, Turns::Always, 100_000, false);
        assert_eq!(turns.layout, Layout::Turns);
        assert!(turns.turns_cycle_ns > mp.shared_cycle_ns);
        assert!(one_at_a_time(&turns));
        // Never: no turns even where they would win.
        let never = two(&g, 1.5, Turns::Never, 100_000, false);
        assert_ne!(never.layout, Layout::Turns);
    }
}
