//! Host runs on the host engine ([`CopyEngine::run_on_host`]): an op kept
//! on the host CPU (an optimizer update) runs over the host copies of its
//! storages on one host thread of the engine, one run after another in
//! submission order.
//!
//! The engine knows nothing of kernels: the driver installs one
//! ([`HostCopies::set_host_kernel`], a [`HostKernel`]) that it calls with
//! the run's op and mutable access to the bytes of each storage. A run is
//! handed to the host thread once every copy it waits for has completed:
//! the copies named in [`HostRun::after`], and every copy submitted before
//! it that touches one of its storages (a swap-out whose bytes become the
//! host copy, a prefetch still reading it). The engine learns of those ends
//! when the driver polls or waits, so a run starts at the driver's first
//! look after its inputs arrived, as prefetches are installed.
//!
//! While it runs, a run holds its storages' host buffers: they leave the
//! pool's map (still counted against its cap) so that nothing else reads
//! them while the kernel writes them in place. A prefetch of such a storage
//! submitted meanwhile starts once the run has given the buffers back; a
//! [`CopyEngine::discard_host`] or a newer swap-out meanwhile marks the
//! lent buffer stale, and it is given back to the pool when the run ends
//! instead of becoming the host copy again.
//!
//! [`CopyEngine::run_on_host`]: crate::CopyEngine::run_on_host
//! [`CopyEngine::discard_host`]: crate::CopyEngine::discard_host
//! [`HostRun::after`]: crate::HostRun::after

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tensile_graph::{OpId, StorageId};

use super::{Done, HostBuf, HostCopies, Payload, sleep_until};
use crate::engine::{Copy, CopyId, CopyState, Dir, HostRun};

/// The host bytes of one storage of a host run, lent to the kernel for the
/// run: [`HostRun::storages`](crate::HostRun::storages) order, each once.
#[derive(Debug)]
pub struct HostBytes<'a, M> {
    pub storage: StorageId,
    /// The storage's whole host copy; the kernel writes updates in place.
    pub bytes: &'a mut [u8],
    /// What the bytes are ([`Payload::meta`] of the device payload they
    /// were copied from).
    pub meta: &'a M,
}

/// Runs host ops over host bytes: what the driver installs on the host
/// engine ([`HostCopies::set_host_kernel`]), called on the engine's host
/// thread, one run at a time. An error fails the run with its message (the
/// bytes may then be written in part). A panic is caught and fails the run
/// too. Closures `FnMut(OpId, &mut [HostBytes<M>]) -> Result<(), String>`
/// are kernels.
pub trait HostKernel<M>: Send + 'static {
    fn run(&mut self, op: OpId, bufs: &mut [HostBytes<'_, M>]) -> Result<(), String>;
}

impl<M, F> HostKernel<M> for F
where
    F: FnMut(OpId, &mut [HostBytes<'_, M>]) -> Result<(), String> + Send + 'static,
{
    fn run(&mut self, op: OpId, bufs: &mut [HostBytes<'_, M>]) -> Result<(), String> {
        self(op, bufs)
    }
}

/// What the host thread is sent.
pub(super) enum HostJob<M> {
    /// From now on runs go to this kernel.
    Kernel(Box<dyn HostKernel<M>>),
    Run {
        id: CopyId,
        op: OpId,
        bufs: Vec<(StorageId, HostBuf<M>)>,
        not_before: Instant,
    },
}

/// The host thread and what feeds it.
type HostThread<M> = (Sender<HostJob<M>>, JoinHandle<()>);

/// A run submitted and not yet handed to the host thread.
struct Waiting {
    id: CopyId,
    op: OpId,
    storages: Vec<StorageId>,
    /// Copies that must complete first.
    waits: Vec<CopyId>,
    not_before: Instant,
}

/// A storage whose host buffer a run holds.
struct Lent {
    /// The host copy went stale meanwhile (discarded, or replaced by a
    /// newer swap-out): the buffer goes back to the pool at the run's end.
    stale: bool,
}

/// The engine's host runs.
pub(super) struct Runs<P: Payload> {
    /// The host thread, once a kernel is installed.
    thread: Option<HostThread<P::Meta>>,
    /// Where the host thread reports runs that ended.
    done: Sender<Done<P>>,
    queue: VecDeque<Waiting>,
    lent: HashMap<StorageId, Lent>,
    /// What the runs in `queue` wait for: `None` while in flight, then
    /// whether it completed (its failure's message if not).
    watched: HashMap<CopyId, Option<Result<(), String>>>,
    /// Prefetches of lent storages, started when the run gives them back.
    deferred: Vec<(CopyId, Copy, bool)>,
    /// Runs handed to the host thread and not yet back.
    running: usize,
}

impl<P: Payload> Runs<P> {
    pub(super) fn new(done: Sender<Done<P>>) -> Runs<P> {
        Runs {
            thread: None,
            done,
            queue: VecDeque::new(),
            lent: HashMap::new(),
            watched: HashMap::new(),
            deferred: Vec::new(),
            running: 0,
        }
    }

    /// Runs submitted and not yet ended.
    pub(super) fn outstanding(&self) -> usize {
        self.queue.len() + self.running
    }

    /// Whether a run holds the storage's host buffer now.
    pub(super) fn is_lent(&self, s: StorageId) -> bool {
        self.lent.contains_key(&s)
    }

    /// The storage's host copy went stale; true if a run holds it (the run
    /// gives it back to the pool when it ends).
    pub(super) fn stale(&mut self, s: StorageId) -> bool {
        match self.lent.get_mut(&s) {
            Some(l) => {
                l.stale = true;
                true
            }
            None => false,
        }
    }

    /// A copy completed (or failed): runs that wait for it take note.
    pub(super) fn copy_done(&mut self, id: CopyId, outcome: Result<(), String>) {
        if let Some(slot) = self.watched.get_mut(&id) {
            *slot = Some(outcome);
        }
    }

    /// A prefetch of a storage a run holds: it starts when the run ends.
    pub(super) fn defer(&mut self, id: CopyId, copy: Copy, fail: bool) {
        self.deferred.push((id, copy, fail));
    }

    /// Forgets what no queued run waits for any more.
    fn prune(&mut self) {
        let queue = &self.queue;
        self.watched
            .retain(|c, _| queue.iter().any(|w| w.waits.contains(c)));
    }
}

impl<P: Payload> Drop for Runs<P> {
    fn drop(&mut self) {
        // Closing the channel ends the host thread once its runs are done.
        if let Some((tx, handle)) = self.thread.take() {
            drop(tx);
            let _ = handle.join();
        }
    }
}

/// The host thread: runs one after another, in the order sent.
fn host_lane<P: Payload>(
    rx: Receiver<HostJob<P::Meta>>,
    done: Sender<Done<P>>,
    mut kernel: Box<dyn HostKernel<P::Meta>>,
) {
    for job in rx {
        match job {
            HostJob::Kernel(k) => kernel = k,
            HostJob::Run {
                id,
                op,
                mut bufs,
                not_before,
            } => {
                sleep_until(not_before);
                let result = {
                    let mut views: Vec<HostBytes<'_, P::Meta>> = bufs
                        .iter_mut()
                        .map(|(s, HostBuf { bytes, meta })| HostBytes {
                            storage: *s,
                            // Unique: the run waited for every copy that
                            // read it; were it shared, the run writes a copy.
                            bytes: Arc::make_mut(bytes).as_mut_slice(),
                            meta,
                        })
                        .collect();
                    catch_unwind(AssertUnwindSafe(|| kernel.run(op, &mut views)))
                        .unwrap_or_else(|p| Err(format!("the host kernel panicked: {}", why(&p))))
                };
                let msg = Done::Run {
                    id,
                    end: Instant::now(),
                    result,
                    bufs,
                };
                if done.send(msg).is_err() {
                    return;
                }
            }
        }
    }
}

/// A panic's message.
fn why(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_string())
}

impl<P: Payload> HostCopies<P> {
    /// Installs the kernel that host runs call (see [`HostKernel`]); runs
    /// submitted before keep the one they were submitted under. Without
    /// one, a host run fails at once, saying so.
    pub fn set_host_kernel(&mut self, kernel: impl HostKernel<P::Meta>) {
        let kernel: Box<dyn HostKernel<P::Meta>> = Box::new(kernel);
        if let Some((tx, _)) = &self.runs.thread {
            // The thread only goes when the engine does.
            let _ = tx.send(HostJob::Kernel(kernel));
            return;
        }
        let (tx, rx) = mpsc::channel();
        let done = self.runs.done.clone();
        let handle = std::thread::Builder::new()
            .name("tensile-host-run".to_string())
            .spawn(move || host_lane::<P>(rx, done, kernel))
            .expect("spawning the host-run thread");
        self.runs.thread = Some((tx, handle));
    }

    /// Host runs submitted and not yet ended.
    pub fn host_runs_in_flight(&self) -> usize {
        self.runs.outstanding()
    }

    /// [`CopyEngine::run_on_host`](crate::CopyEngine::run_on_host).
    pub(super) fn submit_run(&mut self, run: HostRun) -> CopyId {
        let first = run.storages.first().copied().unwrap_or(StorageId(0));
        if self.runs.thread.is_none() {
            return self.fail_now(
                first,
                format!(
                    "op {} runs on the host, and no host kernel is installed on the host copy engine",
                    run.op.0
                ),
            );
        }
        let mut waits = Vec::new();
        for &c in &run.after {
            match self.copies.get(c) {
                Some(CopyState::Pending { .. }) => waits.push(c),
                Some(CopyState::Failed(why, _)) => {
                    let why = format!("copy {} that it waits for failed: {why}", c.0);
                    return self.fail_now(first, why);
                }
                // Ended, or forgotten once ended.
                Some(CopyState::Ended(_)) | None => {}
            }
        }
        let deferred = self
            .runs
            .deferred
            .iter()
            .map(|(c, copy, _)| (c, &copy.storage));
        for (&c, s) in self.touching.iter().chain(deferred) {
            if run.storages.contains(s) && !waits.contains(&c) {
                waits.push(c);
            }
        }
        let id = self.fresh_id();
        for &c in &waits {
            self.runs.watched.entry(c).or_insert(None);
        }
        self.runs.queue.push_back(Waiting {
            id,
            op: run.op,
            storages: run.storages,
            waits,
            not_before: self.epoch + Duration::from_nanos(run.not_before),
        });
        // The engine's record: never a copy of one direction or the
        // other, but `Pending` carries one.
        self.copies.set(
            id,
            CopyState::Pending {
                dir: Dir::ToHost,
                storage: first,
            },
        );
        self.dispatch_runs();
        id
    }

    /// Hands the runs at the head of the queue whose copies have completed
    /// to the host thread, in order; fails those whose copies failed.
    pub(super) fn dispatch_runs(&mut self) {
        while let Some(w) = self.runs.queue.front() {
            let first = w.storages.first().copied().unwrap_or(StorageId(0));
            let mut ready = true;
            let mut failed = None;
            for c in &w.waits {
                match self.runs.watched.get(c) {
                    Some(Some(Ok(()))) => {}
                    Some(Some(Err(why))) => {
                        failed = Some(format!("copy {} that it waits for failed: {why}", c.0));
                        break;
                    }
                    Some(None) => ready = false,
                    None => {}
                }
            }
            if failed.is_none() && !ready {
                return;
            }
            if failed.is_none() && w.storages.iter().any(|s| self.runs.is_lent(*s)) {
                // An earlier run still holds one of its buffers.
                return;
            }
            let failed = failed.or_else(|| {
                w.storages
                    .iter()
                    .find(|s| !self.host.contains_key(s))
                    .map(|s| format!("storage {} has no host copy", s.0))
            });
            let Some(w) = self.runs.queue.pop_front() else {
                return;
            };
            self.runs.prune();
            if let Some(why) = failed {
                self.copies.set(w.id, CopyState::Failed(why, first));
                continue;
            }
            let mut bufs = Vec::with_capacity(w.storages.len());
            for &s in &w.storages {
                if let Some(h) = self.host.remove(&s) {
                    self.runs.lent.insert(s, Lent { stale: false });
                    bufs.push((s, h));
                }
            }
            let job = HostJob::Run {
                id: w.id,
                op: w.op,
                bufs,
                not_before: w.not_before,
            };
            let sent = match &self.runs.thread {
                Some((tx, _)) => tx.send(job).map_err(|e| e.0),
                None => Err(job),
            };
            match sent {
                Ok(()) => self.runs.running += 1,
                Err(HostJob::Run { id, bufs, .. }) => {
                    self.give_back(bufs);
                    let why = "the host-run thread is gone".to_string();
                    self.copies.set(id, CopyState::Failed(why, first));
                }
                Err(HostJob::Kernel(_)) => unreachable!("a run was sent"),
            }
        }
    }

    /// A run ended on the host thread: its buffers come back (as the host
    /// copies, or to the pool when they went stale meanwhile), prefetches
    /// that waited for them start, and the next runs may go.
    pub(super) fn run_returned(
        &mut self,
        id: CopyId,
        end: Instant,
        result: Result<(), String>,
        bufs: Vec<(StorageId, HostBuf<P::Meta>)>,
    ) {
        self.runs.running -= 1;
        let first = bufs.first().map_or(StorageId(0), |b| b.0);
        self.give_back(bufs);
        let state = match result {
            Ok(()) => CopyState::Ended(self.ns(end)),
            Err(why) => CopyState::Failed(why, first),
        };
        self.copies.set(id, state);
        let deferred = std::mem::take(&mut self.runs.deferred);
        for (c, copy, fail) in deferred {
            if self.runs.is_lent(copy.storage) {
                self.runs.deferred.push((c, copy, fail));
            } else {
                self.start(c, copy, fail);
            }
        }
        self.dispatch_runs();
    }

    /// Buffers a run held: each becomes its storage's host copy again,
    /// unless it went stale meanwhile.
    fn give_back(&mut self, bufs: Vec<(StorageId, HostBuf<P::Meta>)>) {
        for (s, h) in bufs {
            let stale = self.runs.lent.remove(&s).is_none_or(|l| l.stale);
            if stale {
                self.pool_used -= h.bytes.len() as u64;
                if let Ok(buf) = Arc::try_unwrap(h.bytes) {
                    self.keep_spare(buf);
                }
            } else {
                self.host.insert(s, h);
            }
        }
    }
}
