//! The executor over copy engines that are not the simulator's: one that
//! learns of a copy's end only once it has happened (as a copy thread or a
//! CUDA stream does), and one whose copies fail. Whatever the engine, the
//! executor finishes every iteration, loses no tensor, and never frees a
//! storage while a copy of it is in flight; a plan that does lose a
//! parameter is an error, not a fresh buffer.

use std::collections::{HashMap, HashSet};

use tensile_executor::{
    CopyEngine, Effect, ExecError, Executor, IterationStats, Next, VirtualCopies,
};
use tensile_graph::builder::Optimizer;
use tensile_graph::{Graph, Liveness, OpId, StorageId, TensorId, TensorKind};
use tensile_planner::{
    CopyModel, Event, EventKind, JobInput, JobSettings, Plan, PlannerConfig, Trigger, plan,
};
use tensile_swap_executor::{Copy, CopyError, CopyId, CopyStatus, Dir, HostRun};

use crate::{latencies, mlp};

/// Wraps the virtual engine but says nothing of a copy until the driver
/// has polled at or after its end; every `fail_every`-th copy fails.
struct Opaque {
    inner: VirtualCopies,
    polled: u64,
    copies: HashMap<CopyId, (Copy, u64)>,
    /// Which of `copies` are host runs (they read no device buffer).
    host_runs: HashSet<CopyId>,
    fail_every: Option<u64>,
    submitted: u64,
    /// The storages of the prefetches submitted since the driver last
    /// looked, in order.
    prefetched: Vec<StorageId>,
}

impl Opaque {
    fn new(copy: CopyModel, fail_every: Option<u64>) -> Opaque {
        Opaque {
            inner: VirtualCopies::new(copy, 1.0),
            polled: 0,
            copies: HashMap::new(),
            host_runs: HashSet::new(),
            fail_every,
            submitted: 0,
            prefetched: Vec::new(),
        }
    }

    /// Copies in flight (not ended by the last poll): (id, storage).
    fn in_flight(&self) -> Vec<(CopyId, StorageId)> {
        self.copies
            .iter()
            .filter(|(id, (_, end))| *end > self.polled && !self.host_runs.contains(id))
            .map(|(&id, (c, _))| (id, c.storage))
            .collect()
    }

    /// The end of the next copy still running, for the driver to sleep to.
    fn next_end(&self) -> Option<u64> {
        self.copies
            .values()
            .map(|&(_, end)| end)
            .filter(|&e| e > self.polled)
            .min()
    }
}

impl CopyEngine for Opaque {
    fn submit(&mut self, copy: Copy) -> CopyId {
        let id = self.inner.submit(copy);
        let CopyStatus::Ends(end) = self.inner.status(id) else {
            panic!("virtual time knows the end")
        };
        self.copies.insert(id, (copy, end));
        self.submitted += 1;
        if copy.dir == Dir::ToDevice {
            self.prefetched.push(copy.storage);
        }
        id
    }

    fn run_on_host(&mut self, run: HostRun) -> CopyId {
        let storage = run.storages.first().copied().unwrap_or(StorageId(0));
        let bytes = run.bytes;
        let id = self.inner.run_on_host(run);
        let CopyStatus::Ends(end) = self.inner.status(id) else {
            panic!("virtual time knows the end")
        };
        // Never failed: a host run is not a copy the executor can redo.
        self.host_runs.insert(id);
        let copy = Copy {
            dir: Dir::ToHost,
            storage,
            bytes,
            not_before: 0,
        };
        self.copies.insert(id, (copy, end));
        id
    }

    fn poll(&mut self, now: u64) {
        self.polled = self.polled.max(now);
    }

    fn status(&self, id: CopyId) -> CopyStatus {
        let Some(&(copy, end)) = self.copies.get(&id) else {
            return CopyStatus::Failed(CopyError::Unknown(id));
        };
        if end > self.polled {
            return CopyStatus::Pending;
        }
        if !self.host_runs.contains(&id)
            && self
                .fail_every
                .is_some_and(|k| (id.0 + 1).is_multiple_of(k))
        {
            return CopyStatus::Failed(CopyError::Failed {
                id,
                storage: copy.storage.0,
                why: "injected".into(),
            });
        }
        CopyStatus::Ends(end)
    }

    fn forget(&mut self, id: CopyId) {
        // Only once ended or failed: the source and the destination are
        // the executor's again.
        let (_, end) = self.copies[&id];
        assert!(end <= self.polled, "copy {id:?} forgotten in flight");
        self.copies.remove(&id);
    }
}

/// Runs `iterations` of `g` under `plan` over `engine` with every op taking
/// its latency; checks every free against the copies in flight, and every
/// prefetch against the buffers the executor holds.
fn run(g: &Graph, live: &Liveness, plan: &Plan, engine: Opaque) -> Vec<IterationStats> {
    try_run(g, live, plan, engine).expect("no tensor lost")
}

/// [`run`], or the executor's error.
fn try_run(
    g: &Graph,
    live: &Liveness,
    plan: &Plan,
    engine: Opaque,
) -> Result<Vec<IterationStats>, ExecError> {
    let lat = latencies(g);
    let mut ex = Executor::new(g, live, plan, engine, 3);
    let mut now = 0u64;
    // A free is wrong if a copy of the storage that was in flight before
    // the call still runs after it, or if a copy of it runs and the
    // storage was not allocated again after the free. A prefetch is wrong
    // if the executor holds no buffer for its data after the call that
    // submitted it: a real engine takes what the copy brings for the
    // storage's buffer, which would then be one the executor does not
    // count, nor free.
    let check = |ex: &mut Executor<'_, Opaque>, before: &[(CopyId, StorageId)]| {
        let resident = ex.resident();
        for s in std::mem::take(&mut ex.engine_mut().prefetched) {
            assert!(
                resident.contains(&s),
                "storage {s:?} prefetched into no buffer: {}",
                ex.whereabouts(s)
            );
        }
        let effects = ex.take_effects();
        let after = ex.engine().in_flight();
        for (i, e) in effects.iter().enumerate() {
            let Effect::Free(s) = *e else { continue };
            let realloc = effects[i..].contains(&Effect::Alloc(s));
            for &(id, t) in &after {
                let old = before.contains(&(id, t));
                assert!(
                    t != s || (!old && realloc),
                    "storage {s:?} freed under copy {id:?}"
                );
            }
        }
    };
    loop {
        let before = ex.engine().in_flight();
        let next = ex.step(now)?;
        check(&mut ex, &before);
        match next {
            Next::Kernel { op } => {
                now += lat[op.index()];
                let before = ex.engine().in_flight();
                ex.kernel_done(now);
                check(&mut ex, &before);
            }
            Next::WaitUntil(t) => now = t.max(now + 1),
            Next::WaitForCopy => {
                now = ex.engine().next_end().expect("a copy to wait for").max(now);
            }
            Next::IterationDone => {}
            Next::WaitForMemory => panic!("no limit was set"),
            Next::Done => break,
        }
    }
    Ok(ex.iterations_done().to_vec())
}

/// Frees after last use, and `extra`: (kind, after op, delay ns, tensor).
fn vanilla_with(live: &Liveness, extra: &[(EventKind, OpId, u64, TensorId)]) -> Plan {
    let mut events = Event::releases_after_last_use(live);
    events.extend(extra.iter().map(|&(kind, op, delay_ns, tensor)| Event {
        trigger: Trigger::After(op),
        delay_ns,
        kind,
        tensor,
    }));
    Plan {
        events,
        ..Plan::default()
    }
}

/// The tensor of `g` called `name`.
fn named(g: &Graph, name: &str) -> TensorId {
    g.tensors().iter().find(|t| t.name == name).unwrap().id
}

fn planned(g: &Graph, copy: CopyModel) -> Plan {
    let input = JobInput::new(g, latencies(g), JobSettings::default());
    plan(&[input], &PlannerConfig::new(copy))
        .unwrap()
        .plans
        .remove(0)
}

#[test]
fn an_engine_that_learns_ends_late_runs_the_plan_to_the_same_peak() {
    let g = mlp(2048, 512, 6, Optimizer::adam());
    let live = Liveness::analyze(&g);
    let copy = CopyModel::duplex(4e9, 4e9, 5_000);
    let p = planned(&g, copy);
    assert!(p.prediction.swap_outs > 0, "the plan swaps");
    let its = run(&g, &live, &p, Opaque::new(copy, None));
    assert_eq!(its.len(), 3);
    for it in &its {
        assert_eq!(it.failed_copies, 0);
        // Learning of a copy's end only once it has happened can delay
        // frees to the next boundary, never add memory beyond a passive
        // swap's worth: the peak stays under vanilla's.
        assert!(it.peak_bytes < p.prediction.vanilla_peak_bytes);
    }
}

#[test]
fn failed_copies_lose_nothing() {
    let g = mlp(2048, 512, 6, Optimizer::adam());
    let live = Liveness::analyze(&g);
    let copy = CopyModel::duplex(4e9, 4e9, 5_000);
    let p = planned(&g, copy);
    for k in [2, 3, 5] {
        let its = run(&g, &live, &p, Opaque::new(copy, Some(k)));
        assert_eq!(
            its.len(),
            3,
            "every iteration ran with every {k}th copy failing"
        );
        let failed: usize = its.iter().map(|i| i.failed_copies).sum();
        assert!(failed > 0, "copies failed (every {k}th)");
    }
}

#[test]
fn a_release_after_a_failed_swap_out_keeps_the_only_copy() {
    // ResNet-50's plan at a tight budget releases parameters after their
    // swap-out and fetches them again from the host copy before the
    // optimizer: when that swap-out fails, the release must not drop the
    // only copy of the data.
    let config = tensile_graph::zoo::ZooConfig {
        resolution: Some(64),
        optimizer: Optimizer::sgd(),
        ..tensile_graph::zoo::ZooConfig::new(1)
    };
    let g = tensile_graph::zoo::build("resnet50", &config).unwrap();
    let live = Liveness::analyze(&g);
    let copy = CopyModel::duplex(4e9, 4e9, 5_000);
    let vanilla = live.vanilla_footprint().peak;
    let mut pc = PlannerConfig::new(copy);
    pc.budget_bytes = Some(vanilla / 2);
    let input = JobInput::new(&g, latencies(&g), JobSettings::default());
    let p = plan(&[input], &pc).unwrap().plans.remove(0);
    for k in [2, 3, 4, 5] {
        let its = run(&g, &live, &p, Opaque::new(copy, Some(k)));
        let failed: usize = its.iter().map(|i| i.failed_copies).sum();
        assert!(failed > 0, "copies failed (every {k}th)");
    }
}

#[test]
fn a_parameter_released_with_no_host_copy_is_an_error_at_the_next_iteration() {
    // A plan that drops a parameter after its update, with no swap-out:
    // the next iteration must not start on a fresh buffer of garbage.
    let g = mlp(16, 64, 2, Optimizer::sgd());
    let live = Liveness::analyze(&g);
    let param = g
        .tensors()
        .iter()
        .find(|t| t.kind == TensorKind::Parameter)
        .unwrap()
        .id;
    let last = g.ops().last().unwrap().id;
    let p = vanilla_with(&live, &[(EventKind::Release, last, 0, param)]);
    let copy = CopyModel::duplex(4e9, 4e9, 5_000);
    let err = try_run(&g, &live, &p, Opaque::new(copy, None))
        .expect_err("ran to the end on a lost parameter");
    let storage = live.storage_of[param.index()];
    assert_eq!(
        err,
        ExecError::LostPersistent {
            tensor: live.storages[storage.index()].root.0,
            iteration: 1
        },
        "{err}"
    );
}

#[test]
fn a_release_while_its_swap_out_is_still_queued_waits_for_the_copy() {
    // Ops that run ahead of the plan reach a release before the planned
    // start of the swap-out it follows (here: a swap-out delayed by 5 ms,
    // released one op later). The release must not drop the only copy:
    // the backward pass still reads the weight.
    let g = mlp(16, 64, 2, Optimizer::sgd());
    let live = Liveness::analyze(&g);
    let w = named(&g, "fc1.weight");
    let first = g.ops().iter().find(|o| o.inputs.contains(&w)).unwrap().id;
    let next = OpId(first.0 + 1);
    let p = vanilla_with(
        &live,
        &[
            (EventKind::SwapOut, first, 5_000_000, w),
            (EventKind::Release, next, 0, w),
        ],
    );
    let copy = CopyModel::duplex(4e9, 4e9, 5_000);
    let its = run(&g, &live, &p, Opaque::new(copy, None));
    assert_eq!(its.len(), 3);
    assert!(
        its.iter().all(|i| i.passive_swaps > 0),
        "the weight was not fetched back: {its:?}"
    );
}

#[test]
fn a_parameter_written_while_a_release_waits_for_its_swap_out_is_kept() {
    // A parameter is copied out, released while that copy runs (the release
    // waits for it) and prefetched again (so the buffer stays). The
    // optimizer then waits for the copy and updates the parameter in place:
    // the release still waiting was for the old value and must not free the
    // new one, of which no copy exists anywhere.
    let g = mlp(16, 64, 2, Optimizer::sgd());
    let live = Liveness::analyze(&g);
    let w = named(&g, "fc1.weight");
    let storage = live.storage_of[w.index()];
    let update = g
        .ops()
        .iter()
        .rev()
        .find(|o| {
            o.outputs
                .iter()
                .any(|t| live.storage_of[t.index()] == storage)
        })
        .unwrap()
        .id;
    let (out, release) = (OpId(update.0 - 2), OpId(update.0 - 1));
    let p = vanilla_with(
        &live,
        &[
            (EventKind::SwapOut, out, 0, w),
            (EventKind::Release, release, 0, w),
            (EventKind::SwapIn, release, 0, w),
        ],
    );
    // A link slow enough that the copy outlasts the two ops before the
    // update.
    let copy = CopyModel::duplex(4e7, 4e7, 5_000);
    let its = run(&g, &live, &p, Opaque::new(copy, None));
    assert_eq!(its.len(), 3);
}

#[test]
fn a_prefetch_due_after_the_swap_out_it_fired_behind_freed_its_buffer_gets_a_new_one() {
    // An activation is copied out after its forward use and released one
    // op later, while that copy runs (the release waits for it). Its
    // prefetch fires at the same op, when the buffer is still there, and
    // is due 30 us later; the swap-out (15 us) ends first and frees the
    // buffer. The prefetch must then bring the data into a buffer of its
    // own, as at any prefetch into a storage not on the device, in time
    // for the backward pass: not a copy into no buffer, which a real
    // engine takes for the storage's buffer (one the executor neither
    // counts nor frees, which the worker once measured a new tensor
    // against), nor a fetch on demand by the op.
    let g = mlp(16, 64, 3, Optimizer::sgd());
    let live = Liveness::analyze(&g);
    let act = named(&g, "act1");
    let uses: Vec<OpId> = g
        .ops()
        .iter()
        .filter(|o| o.inputs.contains(&act))
        .map(|o| o.id)
        .collect();
    // Read by fc2 in the forward pass, by the backward pass much later.
    assert!(uses.len() >= 2 && uses[1].0 > uses[0].0 + 10, "{uses:?}");
    let (out, release) = (uses[0], OpId(uses[0].0 + 1));
    let p = vanilla_with(
        &live,
        &[
            (EventKind::SwapOut, out, 0, act),
            (EventKind::Release, release, 0, act),
            (EventKind::SwapIn, release, 30_000, act),
        ],
    );
    // 4096 B at 400 MB/s and 5 us: about 15 us a copy.
    let copy = CopyModel::duplex(4e8, 4e8, 5_000);
    let its = run(&g, &live, &p, Opaque::new(copy, None));
    assert_eq!(its.len(), 3);
    for it in &its {
        assert_eq!(it.passive_swaps, 0, "the prefetch was lost: {it:?}");
        assert_eq!(it.swapped_bytes, g.tensor(act).bytes, "{it:?}");
    }
}

#[test]
fn a_prefetch_due_after_its_storage_was_last_used_copies_nothing() {
    // As above, but the prefetch is due only after the backward pass has
    // fetched the activation on demand and released it after its last
    // use: it has nothing left to bring the data for, and copies nothing
    // (a copy into no buffer would outlive the iteration on a real engine,
    // which the next iteration's kernel producing the activation anew then
    // found: "lies outside its storage").
    let g = mlp(16, 64, 3, Optimizer::sgd());
    let live = Liveness::analyze(&g);
    let act = named(&g, "act1");
    let first = g.ops().iter().find(|o| o.inputs.contains(&act)).unwrap().id;
    let release = OpId(first.0 + 1);
    let p = vanilla_with(
        &live,
        &[
            (EventKind::SwapOut, first, 0, act),
            (EventKind::Release, release, 0, act),
            (EventKind::SwapIn, release, 1_000_000, act),
        ],
    );
    let copy = CopyModel::duplex(4e8, 4e8, 5_000);
    let its = run(&g, &live, &p, Opaque::new(copy, None));
    assert_eq!(its.len(), 3);
    for it in &its {
        assert_eq!(it.passive_swaps, 1, "fetched on demand: {it:?}");
    }
}
