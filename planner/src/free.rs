//! The search of jobs that run free, job by job. Running free, each job
//! plans on its own share of the link: a swap placed on one job reads and
//! changes that job alone, and so does a budget move. What ties the jobs
//! together is only the budget on the sum of their peaks, through which
//! job the next budget move goes to. So the loop of the crate's doc,
//! which after every move scanned every job again (each round's swaps,
//! each budget round's moves tried on copies), does here what that loop
//! does, in the same order per job, but touches only the job a move
//! changed:
//!
//! - each job's swaps that add no time are placed to the end, job by job;
//! - every job's budget moves at its peak are generated once and kept,
//!   ranked together as the loop ranks them; what trying one on a copy of
//!   its job showed is kept until that job changes;
//! - after a budget move only the moved job's swaps are placed again and
//!   only its moves generated and tried again.
//!
//! The plans are those of the loop: a swap that failed on a job that did
//! not change would fail again, and a move tried on a job that did not
//! change would do the same again; a kept result counts as a try, as the
//! try it stands for did. Only the rounds (counted per job here) and what
//! a cap cuts differ.

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashSet};
use std::time::Instant;

use crate::job::Job;
use crate::overhead::{self, MoveKey};
use crate::{
    Deadline, Failed, MAX_TRIES, MultiPlan, PlannerConfig, TRIES, stop_here, swap_round, try_move,
};

/// Whether `state`'s jobs may be searched job by job: running free (no
/// gates), with no early stop at the budget (it reads every job's peak
/// between two swaps) and no cap on a job's share of all swaps (it reads
/// every job's count).
pub(crate) fn separable(state: &[Job<'_>], config: &PlannerConfig) -> bool {
    #[cfg(test)]
    if tests::LOOP_ONLY.get() {
        return false;
    }
    !(config.stop_at_budget && config.budget_bytes.is_some())
        && state.iter().all(|j| j.settings.max_swap_rate >= 1.0)
}

/// The loop on free-running `state`, job by job (see the module's doc);
/// returns whether a move was refused for `max_overhead`.
pub(crate) fn search(
    state: &mut [Job<'_>],
    config: &PlannerConfig,
    limits: &[u64],
    deadline: Deadline<'_>,
    out: &mut MultiPlan,
    add_time: bool,
) -> bool {
    let mut failed: Vec<Failed> = vec![Failed::default(); state.len()];
    let mut capped = false;
    for (j, failed) in failed.iter_mut().enumerate() {
        if !swaps(state, j, failed, config, deadline, out) {
            return capped;
        }
    }
    let Some(budget) = config.budget_bytes.filter(|_| add_time) else {
        return capped;
    };
    let mut book = Book::new(state, config);
    while state.iter().map(|j| j.peak().0).sum::<u64>() > budget {
        if stop_here(config, deadline, out) {
            break;
        }
        let t = Instant::now();
        let moved = book.round(state, limits, &mut capped, deadline);
        out.profile.budget_rounds += 1;
        out.profile.budget += t.elapsed();
        let Some(j) = moved else { break };
        // Its swaps that failed may fit around the move.
        failed[j].clear();
        if !swaps(state, j, &mut failed[j], config, deadline, out) {
            break;
        }
        book.refresh(state, j, config);
    }
    capped
}

/// Places job `j`'s swaps that add no time until none fits, wrap-around
/// ones too once no other does; false when planning must stop (its cap).
fn swaps(
    state: &mut [Job<'_>],
    j: usize,
    failed: &mut Failed,
    config: &PlannerConfig,
    deadline: Deadline<'_>,
    out: &mut MultiPlan,
) -> bool {
    let one = &mut state[j..=j];
    loop {
        if stop_here(config, deadline, out) {
            return false;
        }
        let t = Instant::now();
        let placed = swap_round(one, failed, None, deadline, None);
        out.profile.swap_rounds += 1;
        out.profile.swap += t.elapsed();
        if placed > 0 {
            continue;
        }
        if !one[0].wrap_allowed {
            one[0].wrap_allowed = true;
            continue;
        }
        return true;
    }
}

/// A move's place in the ranking: the most bytes per second first, then
/// by key, then in the order its job's moves were generated (the loop's
/// stable sort of every job's moves, generated job after job).
#[derive(Debug, Clone, Copy)]
struct Rank {
    worth: f64,
    key: MoveKey,
    index: usize,
}

impl Ord for Rank {
    fn cmp(&self, o: &Rank) -> Ordering {
        o.worth
            .total_cmp(&self.worth)
            .then_with(|| self.key.cmp(&o.key))
            .then(self.index.cmp(&o.index))
    }
}

impl PartialOrd for Rank {
    fn partial_cmp(&self, o: &Rank) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl PartialEq for Rank {
    fn eq(&self, o: &Rank) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}

impl Eq for Rank {}

/// Every job's budget moves at its peak, ranked together, and what trying
/// each on its job as it is now showed.
struct Book {
    moves: Vec<Vec<overhead::Move>>,
    /// Per move: `Some(Ok(worth))` it helps at that many bytes per ns,
    /// `Some(Err(over_limit))` it does not; `None`: not tried yet.
    tried: Vec<Vec<Option<Result<f64, bool>>>>,
    ranked: BTreeSet<Rank>,
}

impl Book {
    fn new(state: &[Job<'_>], config: &PlannerConfig) -> Book {
        let mut book = Book {
            moves: vec![Vec::new(); state.len()],
            tried: vec![Vec::new(); state.len()],
            ranked: BTreeSet::new(),
        };
        for j in 0..state.len() {
            book.refresh(state, j, config);
        }
        book
    }

    /// Job `j` changed: its moves again, at its peak now.
    fn refresh(&mut self, state: &[Job<'_>], j: usize, config: &PlannerConfig) {
        for (index, m) in self.moves[j].iter().enumerate() {
            self.ranked.remove(&Rank {
                worth: m.msps(),
                key: m.key(),
                index,
            });
        }
        let job = &state[j];
        self.moves[j] = if job.n() > 0 {
            overhead::moves(job, j, job.peak().1, config.max_recompute_depth)
        } else {
            Vec::new()
        };
        self.tried[j] = vec![None; self.moves[j].len()];
        for (index, m) in self.moves[j].iter().enumerate() {
            self.ranked.insert(Rank {
                worth: m.msps(),
                key: m.key(),
                index,
            });
        }
    }

    /// One budget round as the loop's (`crate::budget_round`): the job it
    /// moved, if any.
    fn round(
        &mut self,
        state: &mut [Job<'_>],
        limits: &[u64],
        capped: &mut bool,
        deadline: Deadline<'_>,
    ) -> Option<usize> {
        let mut failed: HashSet<MoveKey> = HashSet::new();
        // The best so far: its worth, job, index, and the job after it if
        // it was tried in this round.
        let mut best: Option<(f64, usize, usize)> = None;
        let mut best_job = None;
        let mut tries = 0;
        for r in &self.ranked {
            if failed.contains(&r.key) {
                continue;
            }
            if best.is_some_and(|b| b.0 >= r.worth || tries >= TRIES)
                || tries >= MAX_TRIES
                || deadline.past()
            {
                break;
            }
            tries += 1;
            let j = r.key.0;
            let outcome = match self.tried[j][r.index] {
                Some(o) => o,
                None => {
                    deadline.tried();
                    let (o, next) = match try_move(state, &self.moves[j][r.index], limits, None) {
                        Ok((real, next)) => (Ok(real), Some(next)),
                        Err(over) => (Err(over), None),
                    };
                    self.tried[j][r.index] = Some(o);
                    if let (Ok(real), Some(next)) = (o, next)
                        && best.is_none_or(|b| real > b.0)
                    {
                        best = Some((real, j, r.index));
                        best_job = Some(next);
                        continue;
                    }
                    o
                }
            };
            match outcome {
                Ok(real) => {
                    if best.is_none_or(|b| real > b.0) {
                        best = Some((real, j, r.index));
                        best_job = None;
                    }
                }
                Err(over_limit) => {
                    *capped |= over_limit;
                    failed.insert(r.key);
                }
            }
        }
        let (_, j, index) = best?;
        let next = match best_job {
            Some(next) => next,
            None => try_move(state, &self.moves[j][index], limits, None).ok()?.1,
        };
        state[j] = next;
        Some(j)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]

    use std::cell::Cell;

    use tensile_graph::Graph;
    use tensile_graph::zoo::{self, ZooConfig};

    use crate::{CopyModel, JobInput, JobSettings, MultiPlan, PlannerConfig, plan};

    thread_local! {
        /// Plan with the loop over every job instead (what this module
        /// must match).
        pub(super) static LOOP_ONLY: Cell<bool> = const { Cell::new(false) };
    }

    fn graphs() -> Vec<Graph> {
        zoo_graphs(&["resnet50", "vgg16", "bert_base", "resnet50"])
    }

    /// Zoo models at batch 2 and a small resolution (64 where they allow).
    pub(crate) fn zoo_graphs(models: &[&str]) -> Vec<Graph> {
        models
            .iter()
            .map(|m| {
                let mut c = ZooConfig::new(2);
                c.resolution = Some(zoo::model(m).unwrap().min_resolution.max(64));
                zoo::build(m, &c).unwrap()
            })
            .collect()
    }

    /// A job of each graph with a 300 MB base and unequal latencies, so
    /// that the jobs' moves rank apart.
    pub(crate) fn unequal_jobs(graphs: &[Graph]) -> Vec<JobInput<'_>> {
        let settings = JobSettings {
            base_bytes: 300_000_000,
            ..JobSettings::default()
        };
        graphs
            .iter()
            .enumerate()
            .map(|(k, g)| {
                let lat = (0..g.ops().len())
                    .map(|i| 2_000 + ((i * 7_919 + k * 104_729) % 40_000) as u64)
                    .collect();
                JobInput::new(g, lat, settings)
            })
            .collect()
    }

    fn plan_both(graphs: &[Graph], budget: f64) -> (MultiPlan, MultiPlan) {
        let inputs = unequal_jobs(graphs);
        let mut config = PlannerConfig::new(CopyModel::duplex(12e9, 12e9, 5_000));
        let vanilla = plan(&inputs, &config).unwrap().vanilla_sum_of_peaks_bytes;
        config.budget_bytes = Some((vanilla as f64 * budget) as u64);
        let free = plan(&inputs, &config).unwrap();
        LOOP_ONLY.set(true);
        let looped = plan(&inputs, &config).unwrap();
        LOOP_ONLY.set(false);
        (free, looped)
    }

    #[test]
    fn job_by_job_plans_what_the_loop_over_every_job_plans() {
        let graphs = graphs();
        // No budget moves needed, some, and more than can be made.
        for budget in [2.0, 0.96, 0.5] {
            let (free, looped) = plan_both(&graphs, budget);
            if budget < 1.0 {
                assert!(
                    free.profile.budget_rounds > 0,
                    "budget {budget}: no budget round"
                );
            }
            assert_eq!(free.plans.len(), graphs.len());
            for (k, (a, b)) in free.plans.iter().zip(&looped.plans).enumerate() {
                assert_eq!(a, b, "budget {budget}: job {k}'s plans differ");
            }
            assert_eq!(free.sum_of_peaks_bytes, looped.sum_of_peaks_bytes);
            assert_eq!(free.diagnostics, looped.diagnostics, "budget {budget}");
            // And it tried fewer moves to get there, where there were
            // budget moves to make.
            if budget < 1.0 {
                assert!(
                    free.profile.moves_tried < looped.profile.moves_tried,
                    "budget {budget}: {} moves tried job by job, {} by the loop",
                    free.profile.moves_tried,
                    looped.profile.moves_tried
                );
            }
        }
    }
}
