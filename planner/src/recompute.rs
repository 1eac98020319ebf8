//! Recomputation by MSPS: release a tensor after the access
//! before the peak and re-run its producer right before the access after
//! it. Inputs of the producer must be on the device then; an input that is
//! dead by then may itself be recomputed first (a chain), an input that is
//! swapped out never is.

use tensile_graph::{OpId, Phase, StorageId};

use crate::job::{Access, Gap, Job, Step};

/// A recomputation of `target`, rebuilding `chain` (deepest first, ending
/// with `target`) right before step `before`.
#[derive(Debug, Clone)]
pub(crate) struct Recompute {
    pub(crate) target: StorageId,
    pub(crate) after: usize,
    pub(crate) before: usize,
    pub(crate) chain: Vec<StorageId>,
}

/// The op that produces `s`, if re-running it rebuilds exactly `s` with
/// nothing else changed: one output, no aliasing, deterministic.
fn pure_producer(job: &Job<'_>, s: StorageId) -> Option<OpId> {
    let st = &job.st[s.index()];
    if st.persistent {
        return None;
    }
    let op = job.graph.op(job.graph.producer(st.root)?);
    let pure = op.outputs.len() == 1
        && op.aliases.is_empty()
        && op.phase == Phase::Forward
        && op.op_type != "aten::native_dropout";
    pure.then_some(op.id)
}

/// Adds to `chain` what must be rebuilt before step `at` so that `s` can be
/// rebuilt there; false when that is impossible within `depth`.
fn plan_chain(
    job: &Job<'_>,
    s: StorageId,
    at: usize,
    depth: usize,
    chain: &mut Vec<StorageId>,
) -> bool {
    let Some(op) = pure_producer(job, s) else {
        return false;
    };
    for &t in &job.graph.op(op).inputs {
        let u = job.live.storage_of[t.index()];
        if job.present(u, at) || chain.contains(&u) {
            continue;
        }
        let st = &job.st[u.index()];
        let dead = !st.persistent && st.last.is_some_and(|l| l < at) && st.gaps.is_empty();
        if !(dead && depth > 0 && plan_chain(job, u, at, depth - 1, chain)) {
            return false;
        }
    }
    chain.push(s);
    true
}

/// The recomputation of `s` released after step `after` and rebuilt for
/// step `before`, if its producer chain can run there within `depth`.
pub(crate) fn candidate(
    job: &Job<'_>,
    s: StorageId,
    after: usize,
    before: usize,
    depth: usize,
) -> Option<Recompute> {
    let mut chain = Vec::new();
    if !plan_chain(job, s, job.insertion_point(before), depth, &mut chain) {
        return None;
    }
    Some(Recompute {
        target: s,
        after,
        before,
        chain,
    })
}

/// The time the rebuilding steps of `chain` add.
pub(crate) fn cost_ns(job: &Job<'_>, chain: &[StorageId]) -> u64 {
    chain
        .iter()
        .filter_map(|&c| pure_producer(job, c))
        .map(|op| job.op_latency[op.index()])
        .sum()
}

/// Applies `r` to `job`: inserts the rebuilding steps and the release.
pub(crate) fn apply(job: &mut Job<'_>, r: &Recompute) {
    let first = job.insertion_point(r.before);
    for (i, &x) in r.chain.iter().enumerate() {
        let at = first + i;
        let Some(op) = pure_producer(job, x) else {
            continue;
        };
        job.insert_step(
            at,
            Step {
                op,
                rebuilds: Some(x),
                wait: false,
            },
        );
        for &t in &job.graph.op(op).inputs {
            let u = job.live.storage_of[t.index()];
            job.add_access(
                u,
                Access {
                    step: at,
                    write: false,
                },
            );
        }
        job.add_access(
            x,
            Access {
                step: at,
                write: false,
            },
        );
    }
    let last = first + r.chain.len() - 1;
    for &x in &r.chain[..r.chain.len() - 1] {
        let at = first + r.chain.iter().position(|&c| c == x).unwrap_or(0);
        job.st[x.index()].revivals.push((at, last + 1));
    }
    job.st[r.target.index()].gaps.push(Gap {
        after: r.after,
        before: last,
        wrap: false,
        out: None,
        inn: None,
        forced: false,
    });
    job.rebuild();
}
