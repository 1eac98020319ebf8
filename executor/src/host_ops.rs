//! Ops that run on the host ([`tensile_graph::Placement::Host`]): an
//! optimizer update kept on the host CPU. The executor does not run them
//! as kernels: when its op cursor reaches one it makes sure every input
//! has a host copy (copying a device input out if no copy is on its way),
//! hands the op to the engine's host ([`CopyEngine::run_on_host`], after
//! those copies) and goes on with the next op at once, so the device's
//! compute never waits for the host. The storages the op writes are the
//! host's ([`tensile_graph::Storage::host_master`]): their host copy is
//! being rewritten until the run ends, their device copy is stale and is
//! dropped at the op, and a prefetch of them waits for the run. When a
//! plan does not fetch such a storage back itself, the executor does as
//! soon as the run ends (what a program that steps its optimizer on the
//! host does: it copies the new parameter back). An iteration ends only
//! once its host runs have.

use tensile_graph::{OpId, StorageId};
use tensile_planner::{Event, EventKind, Trigger};
use tensile_swap_executor::{CopyEngine, CopyError, CopyId, CopyStatus, HostRun};

use crate::interface::{ExecError, Next};
use crate::machine::Executor;
use crate::state::{Device, Host, InFlight, Wake};

/// A host run in flight.
#[derive(Debug, Clone)]
pub(crate) struct HostInFlight {
    pub(crate) op: OpId,
    pub(crate) copy: InFlight,
    /// The storages it writes.
    writes: Vec<StorageId>,
    /// The swap-outs of its inputs it waits for.
    after: Vec<CopyId>,
}

impl<C: CopyEngine> Executor<'_, C> {
    /// The host op at the op cursor: `Some` when the executor must wait
    /// first (its pace, an input still arriving), `None` once the op is on
    /// the engine's host and the cursor has moved past it.
    pub(crate) fn host_op(&mut self, now: u64) -> Result<Option<Next>, ExecError> {
        let op = OpId(self.pc as u32);
        self.boundary_frees(now);
        self.retry_deferred(now);
        if let Some(next) = self.pace(now) {
            return Ok(Some(next));
        }
        // A host op has no recomputations; releases planned before it go.
        while self.before_idx < self.schedule.before[self.pc].len() {
            let e = self.schedule.before[self.pc][self.before_idx];
            self.before_idx += 1;
            if e.kind == EventKind::Release {
                self.fire(e, now);
            }
        }
        let graph = self.graph;
        let o = graph.op(op);
        // Swap-outs of its inputs still waiting in the queue start now: the
        // copy lane keeps them behind what it already carries.
        let live = self.live;
        let inputs: Vec<StorageId> = o
            .inputs
            .iter()
            .map(|t| live.storage_of[t.index()])
            .collect();
        if self.queue.bring_forward(now, |e| {
            e.kind == EventKind::SwapOut && inputs.contains(&live.storage_of[e.tensor.index()])
        }) {
            self.run_queue(now);
        }
        let after = match self.host_inputs(op, now)? {
            Ok(after) => after,
            Err(w) => return Ok(Some(self.wait(w, now))),
        };
        self.submit_host(op, after, now)?;
        self.cur.host_runs += 1;
        self.op_ended(op, now);
        Ok(None)
    }

    /// The copies a host run at `op` must wait for: each input's swap-out
    /// on its way, started here for a device input that has none (`keep`
    /// when a later device op reads it). `Err`: an input is not yet
    /// anywhere it could be copied from, wait for it.
    fn host_inputs(&mut self, op: OpId, now: u64) -> Result<Result<Vec<CopyId>, Wake>, ExecError> {
        let o = self.graph.op(op);
        let mut after = Vec::new();
        let mut wait: Option<Wake> = None;
        for &t in &o.inputs {
            let s = self.live.storage_of[t.index()];
            let slot = self.slots[s.index()];
            match slot.host {
                Host::Valid => {}
                Host::Writing { copy, .. } => after.push(copy.id),
                // An earlier host run still writes it.
                Host::Updating(c) => wait = wait.max(Some(Wake::of(c))),
                Host::None => match slot.device {
                    _ if self.live.storages[s.index()].host_master => {
                        return Err(self.lost(op, t.0));
                    }
                    Device::Ready { .. } => {
                        let keep = self.used_on_device_after(s, op);
                        let copy = self.copy_out(s, now, keep);
                        after.push(copy.id);
                    }
                    Device::Arriving(c) if c.done(now) => {
                        let keep = self.used_on_device_after(s, op);
                        let copy = self.copy_out(s, now, keep);
                        after.push(copy.id);
                    }
                    Device::Arriving(c) => wait = wait.max(Some(Wake::of(c))),
                    Device::Awaiting => {
                        let due = Wake::At(self.queue.next_due().unwrap_or(now).max(now));
                        wait = wait.max(Some(due));
                    }
                    Device::Absent | Device::Invalid => return Err(self.lost(op, t.0)),
                },
            }
        }
        Ok(match wait {
            Some(w) => Err(w),
            None => Ok(after),
        })
    }

    /// Hands the host op `op` to the engine's host, after `after`, and
    /// marks what it writes as being rewritten there.
    fn submit_host(&mut self, op: OpId, after: Vec<CopyId>, now: u64) -> Result<(), ExecError> {
        let o = self.graph.op(op);
        let mut storages: Vec<StorageId> = Vec::new();
        for &t in o.inputs.iter().chain(&o.outputs) {
            let s = self.live.storage_of[t.index()];
            if !storages.contains(&s) {
                storages.push(s);
            }
        }
        let mut writes: Vec<StorageId> = Vec::new();
        for &t in &o.outputs {
            let s = self.live.storage_of[t.index()];
            if !writes.contains(&s) {
                writes.push(s);
            }
        }
        let id = self.engine.run_on_host(HostRun {
            op,
            storages,
            bytes: self.graph.host_traffic_bytes(op),
            after: after.clone(),
            not_before: now,
        });
        let end = match self.engine.status(id) {
            CopyStatus::Ends(t) => Some(t),
            CopyStatus::Pending => None,
            CopyStatus::Failed(why) => {
                self.engine.forget(id);
                return Err(self.host_failed(op, why.to_string()));
            }
        };
        let copy = InFlight { id, end };
        for &w in &writes {
            self.slots[w.index()].host = Host::Updating(copy);
            self.drop_stale(w, now);
        }
        self.host_runs.push(HostInFlight {
            op,
            copy,
            writes,
            after,
        });
        Ok(())
    }

    /// Host runs that failed because a swap-out of an input failed (an
    /// engine fails such a run before it starts: nothing was written) go
    /// again, the input copied out anew from its device buffer, which a
    /// failed swap-out keeps. Runs after the failed swap-outs were learned
    /// of and before anything else can free those buffers.
    pub(crate) fn retry_host(&mut self, now: u64) {
        for op in std::mem::take(&mut self.host_retry) {
            let again = match self.host_inputs(op, now) {
                Ok(Ok(after)) => self.submit_host(op, after, now),
                // An input still on its way: next time.
                Ok(Err(_)) => {
                    self.host_retry.push(op);
                    continue;
                }
                Err(e) => Err(e),
            };
            if let Err(e) = again {
                self.host_error.get_or_insert(e);
            }
        }
    }

    /// Whether a device op after `op` touches `s`.
    fn used_on_device_after(&self, s: StorageId, op: OpId) -> bool {
        self.uses[s.index()]
            .iter()
            .any(|&u| u > op.0 && !self.graph.op(OpId(u)).on_host())
    }

    /// Copies `s` out for a host op; `keep`: a later device op reads it, so
    /// its device buffer stays.
    fn copy_out(&mut self, s: StorageId, now: u64, keep: bool) -> InFlight {
        self.start_swap_out(s, now);
        let Host::Writing { copy, .. } = self.slots[s.index()].host else {
            unreachable!("a swap-out of a resident storage that is not the host's starts")
        };
        self.slots[s.index()].host = Host::Writing { copy, keep };
        copy
    }

    /// The device copy of `s`, which a host op is rewriting on the host,
    /// is stale: it goes once no copy reads it.
    fn drop_stale(&mut self, s: StorageId, now: u64) {
        let slot = self.slots[s.index()];
        if !slot.on_device() {
            return;
        }
        if slot.ready(now) {
            self.free(s);
        } else {
            self.slots[s.index()].release_pending = true;
        }
    }

    /// Learns which host runs have ended by `now`: their storages' host
    /// copies are current again; what waits for them is fetched.
    pub(crate) fn refresh_host(&mut self, now: u64) {
        if self.host_runs.is_empty() {
            return;
        }
        let mut ended = Vec::new();
        for mut run in std::mem::take(&mut self.host_runs) {
            match self.engine.status(run.copy.id) {
                CopyStatus::Ends(t) if t <= now => {
                    self.engine.forget(run.copy.id);
                    for &w in &run.writes {
                        self.slots[w.index()].host = Host::Valid;
                    }
                    ended.extend(run.writes);
                }
                CopyStatus::Ends(t) => {
                    run.copy.end = Some(t);
                    for &w in &run.writes {
                        self.slots[w.index()].host = Host::Updating(run.copy);
                    }
                    self.host_runs.push(run);
                }
                CopyStatus::Pending => self.host_runs.push(run),
                // A copy it waited for failed (one that ended is forgotten
                // once learned of, and then `Unknown`: not a failure).
                CopyStatus::Failed(_)
                    if run.after.iter().any(|&c| {
                        matches!(
                            self.engine.status(c),
                            CopyStatus::Failed(CopyError::Failed { .. })
                        )
                    }) =>
                {
                    // It never started: what it writes is as it was on the
                    // host. It goes again once the failed copies are
                    // learned of (`retry_host`).
                    self.engine.forget(run.copy.id);
                    for &w in &run.writes {
                        self.slots[w.index()].host = Host::Valid;
                    }
                    self.host_retry.push(run.op);
                }
                CopyStatus::Failed(why) => {
                    self.engine.forget(run.copy.id);
                    // Its storages were written in part: their data is gone.
                    for &w in &run.writes {
                        self.slots[w.index()].host = Host::None;
                    }
                    let err = self.host_failed(run.op, why.to_string());
                    self.host_error.get_or_insert(err);
                }
            }
        }
        for w in ended {
            let parked = std::mem::take(&mut self.parked_ins);
            let (mine, rest): (Vec<Event>, Vec<Event>) = parked
                .into_iter()
                .partition(|e| self.live.storage_of[e.tensor.index()] == w);
            self.parked_ins = rest;
            let st = &self.live.storages[w.index()];
            let refetch = mine.is_empty()
                && !st.host_only
                && !self.schedule.fetched[w.index()]
                && !self.slots[w.index()].on_device();
            let root = st.root;
            for e in mine {
                self.queue.push(now, e);
            }
            if refetch {
                self.fire(
                    Event {
                        trigger: Trigger::IterationStart,
                        delay_ns: 0,
                        kind: EventKind::SwapIn,
                        tensor: root,
                    },
                    now,
                );
            }
        }
    }

    /// Tells the driver to wait at the end of an iteration while its host
    /// ops run, counting the time as theirs (not a stall).
    pub(crate) fn wait_for_host(&mut self, w: Wake, now: u64) -> Next {
        match w {
            Wake::At(t) => {
                self.cur.host_wait_ns += t.saturating_sub(now);
                Next::WaitUntil(t)
            }
            Wake::Unknown => {
                self.host_since.get_or_insert(now);
                Next::WaitForCopy
            }
        }
    }

    /// When the last host run in flight ends.
    pub(crate) fn host_runs_end(&self) -> Option<Wake> {
        let retry = (!self.host_retry.is_empty()).then_some(Wake::Unknown);
        self.host_runs
            .iter()
            .map(|r| Wake::of(r.copy))
            .chain(retry)
            .max()
    }

    fn lost(&self, op: OpId, tensor: u32) -> ExecError {
        ExecError::Lost {
            op: op.0,
            name: self.graph.op(op).name.clone(),
            tensor,
        }
    }

    fn host_failed(&self, op: OpId, why: String) -> ExecError {
        ExecError::HostOpFailed {
            op: op.0,
            name: self.graph.op(op).name.clone(),
            why,
        }
    }
}
