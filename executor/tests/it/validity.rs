//! An independent check that a plan is valid on its predicted time line,
//! written from the plan's events alone (not from the planner's internals):
//! every access finds its storage on the device with its data there; a
//! swap-in brings back a host copy that is still current; no copy overlaps
//! an access of its own storage; copies on one channel never overlap (on
//! the periodic time line, where an across-iteration swap-out may run on
//! into the next iteration). The waits a plan declares (for prefetches that
//! cannot be hidden, under a memory budget) are part of the time line, and
//! each must end exactly when a prefetch that the next step reads arrives:
//! a wait for nothing, or too long, is an error. That recomputations find
//! their inputs resident is checked by running the plan (`main.rs`: no lost
//! tensor, exactly the predicted stalls).
//!
//! Ops on the host take no time on the device's line and touch nothing on
//! the device: each runs on the host once the swap-outs of its device
//! inputs and the host op before it have ended, the iteration lasting
//! until the last has; what it rewrites is current on the host throughout
//! except while it runs, and a swap-in of it may not start before then.

use tensile_graph::{Graph, Liveness, OpId, StorageId};
use tensile_planner::{CopyModel, EventKind, Plan, Trigger};

/// The time line of one iteration under a plan: when every op starts and
/// ends; before op k run its recomputations (each taking its producer's
/// latency) and the declared waits, in the order the plan gives.
struct Line {
    start: Vec<u64>,
    end: Vec<u64>,
    /// When each `Before` event fires (by index in the plan's events): a
    /// recomputation when it starts, a release when the executor reaches it.
    before_at: Vec<u64>,
    /// Each declared wait: when the step after it starts, and the storages
    /// that step reads.
    waits: Vec<(u64, Vec<StorageId>)>,
    period: u64,
}

fn line(g: &Graph, live: &Liveness, plan: &Plan, lat: &[u64], bad: &mut Vec<String>) -> Line {
    // `Line::end` of op k is also where its `After` events are anchored.
    let n = g.ops().len();
    let reads = |op: OpId| -> Vec<StorageId> {
        g.op(op)
            .inputs
            .iter()
            .map(|t| live.storage_of[t.index()])
            .collect()
    };
    let mut before: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, e) in plan.events.iter().enumerate() {
        if let Trigger::Before(op) = e.trigger {
            before[op.index()].push(i);
        }
    }
    let mut waits: Vec<Vec<(usize, u64)>> = vec![Vec::new(); n];
    for w in &plan.prediction.waits {
        waits[w.op.index()].push((w.after_recomputes, w.ns));
    }
    let mut l = Line {
        start: vec![0; n],
        end: vec![0; n],
        before_at: vec![0; plan.events.len()],
        waits: Vec::new(),
        period: 0,
    };
    let mut t = 0;
    for k in 0..n {
        let mut done = 0;
        let waited =
            |done: usize| -> u64 { waits[k].iter().filter(|w| w.0 == done).map(|w| w.1).sum() };
        for &i in &before[k] {
            let e = plan.events[i];
            if e.kind != EventKind::Recompute {
                l.before_at[i] = t;
                continue;
            }
            let p = g
                .producer(e.tensor)
                .expect("recomputed tensors have producers");
            let after_wait = t + waited(done);
            if after_wait > t {
                l.waits.push((after_wait, reads(p)));
            }
            t = after_wait;
            l.before_at[i] = t;
            t += lat[p.index()];
            done += 1;
        }
        if let Some(w) = waits[k].iter().find(|w| w.0 > done) {
            bad.push(format!(
                "a wait before op {k} after {} recomputations, but it has {done}",
                w.0
            ));
        }
        let after_wait = t + waited(done);
        if after_wait > t {
            l.waits.push((after_wait, reads(OpId(k as u32))));
        }
        t = after_wait;
        l.start[k] = t;
        if !g.op(OpId(k as u32)).on_host() {
            t += lat[k];
        }
        l.end[k] = t;
    }
    l.period = t;
    l
}

/// When each host op ends (by op id; 0 for device ops): one after another,
/// each after the swap-outs of its inputs the plan fires before it.
fn host_ends(
    g: &Graph,
    live: &Liveness,
    plan: &Plan,
    l: &Line,
    copy: CopyModel,
    share: f64,
) -> Vec<u64> {
    let mut ends = vec![0; g.ops().len()];
    let mut free = 0;
    for op in g.ops().iter().filter(|o| o.on_host()) {
        let k = op.id.index();
        let mut ready = l.start[k];
        for &t in &op.inputs {
            let s = live.storage_of[t.index()];
            for e in &plan.events {
                if e.kind != EventKind::SwapOut || live.storage_of[e.tensor.index()] != s {
                    continue;
                }
                let at = match e.trigger {
                    Trigger::After(o) if o.index() < k => l.end[o.index()] + e.delay_ns,
                    Trigger::IterationStart => e.delay_ns,
                    _ => continue,
                };
                let bytes = live.storages[s.index()].bytes;
                ready = ready.max(at + copy.duration_ns(bytes, copy.d2h_bytes_per_s * share));
            }
        }
        free = ready.max(free) + copy.host_ns(g.host_traffic_bytes(op.id));
        ends[k] = free;
    }
    ends
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum What {
    // At equal times: copies and releases after an op's end come before the
    // next op's accesses (frees before allocations).
    Release,
    Out {
        end: u64,
    },
    In {
        end: u64,
    },
    Recompute,
    /// A host op rewrites it on the host until `end`.
    HostWrite {
        end: u64,
    },
    Access {
        op: u32,
        write: bool,
    },
}

/// Checks `plan` for `g` with predicted latencies `lat`; `share` is the job's
/// part of the link. Returns the problems found.
pub(crate) fn check_plan(
    g: &Graph,
    live: &Liveness,
    plan: &Plan,
    lat: &[u64],
    copy: CopyModel,
    share: f64,
) -> Vec<String> {
    let mut bad = Vec::new();
    let mut l = line(g, live, plan, lat, &mut bad);
    let host_end = host_ends(g, live, plan, &l, copy, share);
    l.period = host_end.iter().copied().fold(l.period, u64::max);
    let mut arrivals: Vec<(StorageId, u64)> = Vec::new();
    let nst = live.storages.len();
    let mut items: Vec<Vec<(u64, What)>> = vec![Vec::new(); nst];
    for op in g.ops() {
        let k = op.id.index();
        if op.on_host() {
            for &t in &op.outputs {
                let end = host_end[k];
                items[live.storage_of[t.index()].index()]
                    .push((l.start[k], What::HostWrite { end }));
            }
            continue;
        }
        for &t in &op.inputs {
            items[live.storage_of[t.index()].index()].push((
                l.start[k],
                What::Access {
                    op: op.id.0,
                    write: false,
                },
            ));
        }
        for &t in &op.outputs {
            items[live.storage_of[t.index()].index()].push((
                l.start[k],
                What::Access {
                    op: op.id.0,
                    write: true,
                },
            ));
        }
    }
    // Channel 0: device to host; the last: host to device.
    let lanes = if copy.half_duplex { 1 } else { 2 };
    let mut chans: Vec<Vec<(u64, u64)>> = vec![Vec::new(); lanes];
    for (i, e) in plan.events.iter().enumerate() {
        let s = live.storage_of[e.tensor.index()];
        let bytes = live.storages[s.index()].bytes;
        let at = match e.trigger {
            Trigger::IterationStart => e.delay_ns,
            Trigger::After(op) => l.end[op.index()] + e.delay_ns,
            Trigger::Before(_) => l.before_at[i],
        };
        let what = match e.kind {
            EventKind::Release => What::Release,
            EventKind::Recompute => What::Recompute,
            EventKind::SwapOut => {
                let end = at + copy.duration_ns(bytes, copy.d2h_bytes_per_s * share);
                chans[0].push((at, end));
                What::Out { end }
            }
            EventKind::SwapIn => {
                let end = at + copy.duration_ns(bytes, copy.h2d_bytes_per_s * share);
                chans[lanes - 1].push((at, end));
                arrivals.push((s, end));
                What::In { end }
            }
        };
        items[s.index()].push((at, what));
    }
    // Every wait ends when a prefetch of what the next step reads arrives
    // (the executor waits for exactly that).
    for (until, reads) in &l.waits {
        if !arrivals
            .iter()
            .any(|(s, end)| end == until && reads.contains(s))
        {
            bad.push(format!(
                "a wait until {until} that no prefetch of the next step's inputs ends"
            ));
        }
    }
    for (c, spans) in chans.iter_mut().enumerate() {
        let mut cut = Vec::new();
        for &(a, b) in spans.iter() {
            if b > l.period && a < l.period {
                cut.push((a, l.period));
                cut.push((0, b - l.period));
            } else {
                cut.push((a, b));
            }
        }
        cut.sort_unstable();
        for w in cut.windows(2) {
            if w[0].1 > w[1].0 {
                bad.push(format!(
                    "channel {c}: copies {:?} and {:?} overlap",
                    w[0], w[1]
                ));
            }
        }
    }
    for (i, mut its) in items.into_iter().enumerate() {
        its.sort();
        check_storage(g, live, plan, StorageId(i as u32), &its, &l, &mut bad);
    }
    bad
}

fn check_storage(
    g: &Graph,
    live: &Liveness,
    plan: &Plan,
    s: StorageId,
    its: &[(u64, What)],
    l: &Line,
    bad: &mut Vec<String>,
) {
    let st = &live.storages[s.index()];
    let name = &g.tensor(st.root).name;
    let on_host = plan.start_on_host.contains(&st.root);
    // Whether the device holds the data, from when, and whether the host
    // copy is current.
    let mut device = (st.persistent && !on_host) || (!st.persistent && st.born.is_none());
    let mut ready = 0u64;
    let mut host_valid = on_host || st.host_master;
    let mut host_from = 0u64;
    let mut out_until = 0u64;
    let mut tail_out_end = None;
    for &(t, what) in its {
        match what {
            What::Access { op, write } => {
                let born_here = write && st.born == Some(OpId(op)) && !device;
                if !device && !born_here {
                    bad.push(format!("{name}: op {op} needs it but it is off the device"));
                }
                if device && ready > t {
                    bad.push(format!("{name}: op {op} starts before its swap-in ends"));
                }
                if out_until > t {
                    bad.push(format!("{name}: op {op} overlaps its swap-out"));
                }
                // What a host op rewrites, device ops only view.
                if write && !st.host_master {
                    host_valid = false;
                }
                device = true;
            }
            What::HostWrite { end } => host_from = end,
            What::Out { end } => {
                if !device {
                    bad.push(format!(
                        "{name}: swap-out at {t} of a storage not on the device"
                    ));
                }
                if end > l.period {
                    tail_out_end = Some(end - l.period);
                }
                out_until = end;
                host_valid = true;
            }
            // Freed now, or at the first boundary after a copy in flight.
            What::Release => device = false,
            What::In { end } => {
                if !host_valid {
                    bad.push(format!("{name}: swap-in at {t} with no current host copy"));
                }
                if t < out_until {
                    bad.push(format!("{name}: swap-in at {t} before its swap-out ends"));
                }
                if t < host_from {
                    bad.push(format!(
                        "{name}: swap-in at {t} before its host update ends at {host_from}"
                    ));
                }
                device = true;
                ready = end;
            }
            What::Recompute => {
                device = true;
                ready = t;
            }
        }
    }
    // An across-iteration swap-out that runs on into the next iteration
    // must end before that iteration brings the storage back.
    if let Some(e) = tail_out_end
        && let Some(&(t, _)) = its.iter().find(|x| matches!(x.1, What::In { .. }))
        && t < e
    {
        bad.push(format!(
            "{name}: swap-in at {t} before the previous iteration's swap-out ends at {e}"
        ));
    }
}

/// The check itself: a good plan passes, and each way of breaking it is
/// reported.
#[test]
fn check_catches_broken_plans() {
    use tensile_graph::zoo::{self, ZooConfig};
    use tensile_planner::{JobInput, JobSettings, PlannerConfig, plan};

    let g = zoo::build("resnet50", &ZooConfig::new(4)).expect("zoo");
    let live = Liveness::analyze(&g);
    let lat = crate::latencies(&g);
    let copy = CopyModel::duplex(24e9, 24e9, 5_000);
    let mp = plan(
        &[JobInput::new(&g, lat.clone(), JobSettings::default())],
        &PlannerConfig::new(copy),
    )
    .expect("plans");
    let good = &mp.plans[0];
    assert!(check_plan(&g, &live, good, &lat, copy, 1.0).is_empty());
    let find = |kind: EventKind| {
        good.events
            .iter()
            .position(|e| e.kind == kind && matches!(e.trigger, Trigger::After(_)))
            .expect("the plan has such an event")
    };
    let broken = |edit: &dyn Fn(&mut Plan)| {
        let mut p = good.clone();
        edit(&mut p);
        check_plan(&g, &live, &p, &lat, copy, 1.0).join("\n")
    };
    let late_in = broken(&|p| p.events[find(EventKind::SwapIn)].delay_ns += 50_000_000);
    assert!(
        late_in.contains("before its swap-in ends") || late_in.contains("off the device"),
        "{late_in}"
    );
    let no_out = broken(&|p| {
        p.events.remove(find(EventKind::SwapOut));
    });
    assert!(no_out.contains("no current host copy"), "{no_out}");
    let no_in = broken(&|p| {
        p.events.remove(find(EventKind::SwapIn));
    });
    assert!(no_in.contains("off the device"), "{no_in}");
    let crowded = broken(&|p| {
        let i = find(EventKind::SwapOut);
        let mut e = p.events[i];
        e.delay_ns += 1;
        p.events.push(e);
    });
    assert!(crowded.contains("overlap"), "{crowded}");
}
