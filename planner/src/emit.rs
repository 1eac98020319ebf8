//! Turning a planned job into the [`Plan`] its executor runs: the events
//! in the order they fire, the host-resident tensors at iteration start,
//! the waits and the prediction.

use crate::job::Job;
use crate::plan::{Event, EventKind, Plan, Prediction, Trigger, Wait};

/// Position of a step's events: recomputes before it, the rest after it.
pub(crate) fn emit(job: &Job<'_>) -> Plan {
    let mut events: Vec<(usize, Event)> = Vec::new();
    let real_after = |step: usize| -> (usize, Trigger) {
        let op = job.steps[step].op;
        (2 * step + 1, Trigger::After(op))
    };
    let next_real = |mut step: usize| {
        while !job.steps[step].is_real() {
            step += 1;
        }
        step
    };
    let mut push = |pos: usize, trigger: Trigger, delay_ns: u64, kind: EventKind, s: usize| {
        events.push((
            pos,
            Event {
                trigger,
                delay_ns,
                kind,
                tensor: job.st[s].root,
            },
        ));
    };
    let mut start_on_host = Vec::new();
    let (mut outs, mut ins, mut bytes) = (0, 0, 0u64);
    for (i, st) in job.st.iter().enumerate() {
        if let Some(l) = st.last {
            let (pos, tr) = real_after(l);
            push(pos, tr, 0, EventKind::Release, i);
        }
        for g in &st.gaps {
            if g.wrap && !g.head_out() && !g.tail_in() {
                start_on_host.push(st.root);
            }
            match g.out {
                Some(c) => {
                    let (pos, tr) = c.trigger.map_or((0, Trigger::IterationStart), real_after);
                    push(pos, tr, c.delay, EventKind::SwapOut, i);
                    outs += 1;
                    bytes += st.bytes;
                }
                None => {
                    let (pos, tr) = real_after(g.after);
                    push(pos, tr, 0, EventKind::Release, i);
                }
            }
            // No swap-in: rebuilt by a recompute step, emitted below.
            if let Some(c) = g.inn {
                let (pos, tr) = c.trigger.map_or((0, Trigger::IterationStart), real_after);
                push(pos, tr, c.delay, EventKind::SwapIn, i);
                ins += 1;
            }
        }
        for &(_, to) in &st.revivals {
            let target = next_real(to - 1);
            let op = job.steps[target].op;
            push(
                2 * target,
                Trigger::Before(op),
                u64::MAX,
                EventKind::Release,
                i,
            );
        }
    }
    for (k, step) in job.steps.iter().enumerate() {
        if let Some(x) = step.rebuilds {
            let target = next_real(k);
            let op = job.steps[target].op;
            push(
                2 * target,
                Trigger::Before(op),
                k as u64,
                EventKind::Recompute,
                x.index(),
            );
        }
    }
    events.sort_by_key(|(pos, e)| (*pos, e.delay_ns, e.kind, e.tensor));
    let recomputed_ops = job.steps.iter().filter(|s| s.rebuilds.is_some()).count();
    let mut waits = Vec::new();
    let mut recomputes = 0;
    for (k, step) in job.steps.iter().enumerate() {
        if step.rebuilds.is_some() {
            recomputes += 1;
        } else if step.wait {
            let ns = job.times[k + 1] - job.times[k];
            if ns > 0 {
                waits.push(Wait {
                    op: job.steps[next_real(k)].op,
                    after_recomputes: recomputes,
                    ns,
                });
            }
        } else {
            recomputes = 0;
        }
    }
    let mut events: Vec<Event> = events.into_iter().map(|(_, e)| e).collect();
    // `Before` events carry their order in `delay_ns` while sorting; the
    // executor runs them in list order, with no delay.
    for e in &mut events {
        if matches!(e.trigger, Trigger::Before(_)) {
            e.delay_ns = 0;
        }
    }
    events.dedup();
    start_on_host.sort();
    start_on_host.dedup();
    Plan {
        version: 0,
        events,
        start_on_host,
        prediction: Prediction {
            planned_peak_bytes: job.peak().0,
            planned_time_ns: job.iteration_ns(),
            swap_outs: outs,
            swap_ins: ins,
            swapped_bytes: bytes,
            recomputed_ops,
            waits,
            timeline: job.timeline(),
            ..Prediction::default()
        },
        gate: None,
    }
}
