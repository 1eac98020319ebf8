//! A plan as the executor fires it: its events indexed by where they
//! fire, and what else the executor looks up by storage.

use tensile_graph::{Graph, Liveness, StorageId};
use tensile_planner::{Event, EventKind, Plan, Trigger};

/// Plan events indexed by where they fire.
#[derive(Debug, Clone, Default)]
pub(crate) struct Schedule {
    pub(crate) at_start: Vec<Event>,
    pub(crate) before: Vec<Vec<Event>>,
    pub(crate) after: Vec<Vec<Event>>,
    pub(crate) start_on_host: Vec<StorageId>,
    /// Planned start of every op within the iteration (a coordinated
    /// plan's pace); empty: ops start as soon as they can.
    pub(crate) op_start: Vec<u64>,
    /// Per storage, whether the plan brings it to the device itself (a
    /// swap-in, or it starts the iteration on the host): a storage a host
    /// op rewrites is otherwise fetched back when the host op ends.
    pub(crate) fetched: Vec<bool>,
}

impl Schedule {
    pub(crate) fn new(plan: &Plan, live: &Liveness, n: usize) -> Schedule {
        let mut s = Schedule {
            before: vec![Vec::new(); n],
            after: vec![Vec::new(); n],
            fetched: vec![false; live.storages.len()],
            ..Schedule::default()
        };
        for e in &plan.events {
            if e.kind == EventKind::SwapIn {
                s.fetched[live.storage_of[e.tensor.index()].index()] = true;
            }
            match e.trigger {
                Trigger::IterationStart => s.at_start.push(*e),
                Trigger::Before(op) => s.before[op.index()].push(*e),
                Trigger::After(op) => s.after[op.index()].push(*e),
            }
        }
        s.start_on_host = plan
            .start_on_host
            .iter()
            .map(|t| live.storage_of[t.index()])
            .collect();
        for &h in &s.start_on_host {
            s.fetched[h.index()] = true;
        }
        if plan.prediction.op_start_ns.len() == n {
            s.op_start = plan.prediction.op_start_ns.clone();
        }
        s
    }
}

/// Per storage, the ops that touch it, in order.
pub(crate) fn uses(graph: &Graph, live: &Liveness) -> Vec<Vec<u32>> {
    let mut uses = vec![Vec::new(); live.storages.len()];
    for op in graph.ops() {
        for &t in op.inputs.iter().chain(&op.outputs) {
            let u: &mut Vec<u32> = &mut uses[live.storage_of[t.index()].index()];
            if u.last() != Some(&op.id.0) {
                u.push(op.id.0);
            }
        }
    }
    uses
}
