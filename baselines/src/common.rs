//! What every plan generator needs: the vanilla releases, which storages
//! are saved for backward, where they are used, and the plan's assembly.

use tensile_graph::{Graph, Liveness, OpId, Phase, StorageId};
use tensile_planner::{Event, EventKind, Plan, Trigger};

/// Free after last use: a release after each storage's last access.
pub fn vanilla(live: &Liveness) -> Plan {
    assemble(Event::releases_after_last_use(live))
}

/// The ops that read or write each storage, in execution order, indexed by
/// storage id.
pub fn accesses(graph: &Graph, live: &Liveness) -> Vec<Vec<OpId>> {
    let mut out = vec![Vec::new(); live.storages.len()];
    for op in graph.ops() {
        for &t in op.inputs.iter().chain(&op.outputs) {
            let s = live.storage_of[t.index()].index();
            if out[s].last() != Some(&op.id) {
                out[s].push(op.id);
            }
        }
    }
    out
}

/// Activations saved for backward: non-persistent storages made by a
/// forward op and read by a backward op, with their last forward access
/// and first backward access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saved {
    pub storage: StorageId,
    pub last_forward: OpId,
    pub first_backward: OpId,
}

pub fn saved_activations(graph: &Graph, live: &Liveness) -> Vec<Saved> {
    let acc = accesses(graph, live);
    let mut out = Vec::new();
    for (i, st) in live.storages.iter().enumerate() {
        let Some(born) = st.born else { continue };
        if st.persistent || graph.op(born).phase != Phase::Forward {
            continue;
        }
        let ops = &acc[i];
        let last_forward = ops
            .iter()
            .copied()
            .rfind(|&o| graph.op(o).phase == Phase::Forward);
        let first_backward = ops
            .iter()
            .copied()
            .find(|&o| graph.op(o).phase == Phase::Backward);
        if let (Some(last_forward), Some(first_backward)) = (last_forward, first_backward) {
            out.push(Saved {
                storage: StorageId(i as u32),
                last_forward,
                first_backward,
            });
        }
    }
    out
}

/// A plan from events in any order: sorted by where they fire (releases
/// first after an op, `Before` events keep their given order), duplicates
/// dropped. The prediction is left empty: baselines are measured, not
/// predicted.
pub fn assemble(mut events: Vec<Event>) -> Plan {
    let key = |e: &Event| match e.trigger {
        Trigger::IterationStart => (0u64, 0u8),
        Trigger::Before(op) => (2 * u64::from(op.0) + 1, 0),
        Trigger::After(op) => (
            2 * u64::from(op.0) + 2,
            u8::from(e.kind != EventKind::Release),
        ),
    };
    events.sort_by_key(key);
    let mut out: Vec<Event> = Vec::with_capacity(events.len());
    for e in events {
        if !out.contains(&e) {
            out.push(e);
        }
    }
    Plan {
        events: out,
        ..Plan::default()
    }
}
