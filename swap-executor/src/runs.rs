//! Host runs ([`CopyEngine::run_on_host`]) on the engines that hold real
//! host copies (the host engine and the CUDA engine): an op kept on the
//! host CPU (an optimizer update) runs over the host copies of its
//! storages on one host thread of the engine, one run after another in
//! submission order.
//!
//! The engine knows nothing of kernels: the driver installs one (a
//! [`HostKernel`]) that it calls with the run's op and mutable access to
//! the bytes of each storage. A run is handed to the host thread once every
//! copy it waits for has completed: the copies named in [`HostRun::after`],
//! and every copy submitted before it that touches one of its storages (a
//! swap-out whose bytes become the host copy, a prefetch still reading
//! it). The engine learns of those ends when the driver polls or waits, so
//! a run starts at the driver's first look after its inputs arrived, as
//! prefetches are installed.
//!
//! While it runs, a run holds its storages' host buffers: they leave the
//! engine's map of host copies (still counted against its pool's cap) so
//! that nothing else reads them while the kernel writes them in place. A
//! prefetch of such a storage submitted meanwhile starts once the run has
//! given the buffers back; a [`CopyEngine::discard_host`] or a newer
//! swap-out meanwhile marks the lent buffer stale, and it is given back to
//! the pool when the run ends instead of becoming the host copy again.
//!
//! The queue and its rules live here once ([`RunSite`]'s provided
//! methods); each engine says how its host copies are taken and given
//! back, and which of its copies are in flight.
//!
//! [`CopyEngine::run_on_host`]: crate::CopyEngine::run_on_host
//! [`CopyEngine::discard_host`]: crate::CopyEngine::discard_host
//! [`HostRun::after`]: crate::HostRun::after

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tensile_graph::{OpId, StorageId};

use crate::engine::{Copy, CopyId, CopyState, Dir, HostRun};

/// The host bytes of one storage of a host run, lent to the kernel for the
/// run: [`HostRun::storages`](crate::HostRun::storages) order, each once.
#[derive(Debug)]
pub struct HostBytes<'a, M> {
    pub storage: StorageId,
    /// The storage's whole host copy; the kernel writes updates in place.
    pub bytes: &'a mut [u8],
    /// What the bytes are ([`Payload::meta`](crate::Payload::meta) of the
    /// device payload they were copied from).
    pub meta: &'a M,
}

/// Runs host ops over host bytes: what the driver installs on an engine
/// (`set_host_kernel` of the host or the CUDA engine), called on the
/// engine's host thread, one run at a time. An error fails the run with
/// its message (the bytes may then be written in part). A panic is caught
/// and fails the run too. Closures `FnMut(OpId, &mut [HostBytes<M>]) ->
/// Result<(), String>` are kernels.
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

/// An engine's host copy as a run holds it: its bytes for the kernel.
pub(crate) trait LentBuf<M>: Send + 'static {
    /// The bytes, writable (the run waited for every copy that reads
    /// them), and what they are.
    fn view(&mut self) -> Result<(&mut [u8], &M), String>;
}

/// A run the host thread has ended: the buffers it held come back.
pub(crate) struct RunEnd<B> {
    pub(crate) id: CopyId,
    pub(crate) end: Instant,
    pub(crate) result: Result<(), String>,
    pub(crate) bufs: Vec<(StorageId, B)>,
}

/// What the host thread is sent.
enum HostJob<M, B> {
    /// From now on runs go to this kernel.
    Kernel(Box<dyn HostKernel<M>>),
    Run {
        id: CopyId,
        op: OpId,
        bufs: Vec<(StorageId, B)>,
        not_before: Instant,
    },
}

/// The host thread and what feeds it.
type HostThread<M, B> = (Sender<HostJob<M, B>>, JoinHandle<()>);

/// A run submitted and not yet handed to the host thread.
struct Waiting {
    id: CopyId,
    op: OpId,
    storages: Vec<StorageId>,
    /// Copies that must complete first.
    waits: Vec<CopyId>,
    not_before: Instant,
}

/// An engine's host runs, over its host buffers `B` of metadata `M`; ended
/// runs are reported on the engine's channel of `D`.
pub(crate) struct Runs<M, B, D> {
    /// The host thread, once a kernel is installed.
    thread: Option<HostThread<M, B>>,
    /// Where the host thread reports runs that ended, as `wrap` makes them.
    done: Sender<D>,
    wrap: fn(RunEnd<B>) -> D,
    queue: VecDeque<Waiting>,
    /// Storages whose host buffer a run holds, each with whether the host
    /// copy went stale meanwhile (discarded, or replaced by a newer
    /// swap-out): such a buffer goes back to the pool at the run's end.
    lent: HashMap<StorageId, bool>,
    /// What the runs in `queue` wait for: `None` while in flight, then
    /// whether it completed (its failure's message if not).
    watched: HashMap<CopyId, Option<Result<(), String>>>,
    /// Prefetches of lent storages, started when the run gives them back.
    deferred: Vec<(CopyId, Copy, bool)>,
    /// Runs handed to the host thread and not yet back.
    running: usize,
}

impl<M, B, D> Runs<M, B, D> {
    pub(crate) fn new(done: Sender<D>, wrap: fn(RunEnd<B>) -> D) -> Runs<M, B, D> {
        Runs {
            thread: None,
            done,
            wrap,
            queue: VecDeque::new(),
            lent: HashMap::new(),
            watched: HashMap::new(),
            deferred: Vec::new(),
            running: 0,
        }
    }

    /// Runs submitted and not yet ended.
    pub(crate) fn outstanding(&self) -> usize {
        self.queue.len() + self.running
    }

    /// Whether a run holds the storage's host buffer now.
    pub(crate) fn is_lent(&self, s: StorageId) -> bool {
        self.lent.contains_key(&s)
    }

    /// The storage's host copy went stale; true if a run holds it (the run
    /// gives it back to the pool when it ends).
    pub(crate) fn stale(&mut self, s: StorageId) -> bool {
        match self.lent.get_mut(&s) {
            Some(stale) => {
                *stale = true;
                true
            }
            None => false,
        }
    }

    /// A copy completed (or failed): runs that wait for it take note.
    pub(crate) fn copy_done(&mut self, id: CopyId, outcome: Result<(), String>) {
        if let Some(slot) = self.watched.get_mut(&id) {
            *slot = Some(outcome);
        }
    }

    /// A prefetch of a storage a run holds: it starts when the run ends.
    pub(crate) fn defer(&mut self, id: CopyId, copy: Copy, fail: bool) {
        self.deferred.push((id, copy, fail));
    }

    /// Prefetches deferred and not yet started, with their storages.
    fn deferred_storages(&self) -> impl Iterator<Item = (CopyId, StorageId)> + '_ {
        self.deferred.iter().map(|(c, copy, _)| (*c, copy.storage))
    }

    /// Forgets what no queued run waits for any more.
    fn prune(&mut self) {
        let queue = &self.queue;
        self.watched
            .retain(|c, _| queue.iter().any(|w| w.waits.contains(c)));
    }

    /// Whether the head of the queue may go: `None` while a copy it waits
    /// for is in flight, else whether they all completed.
    fn head_ready(&self) -> Option<Result<(), String>> {
        let w = self.queue.front()?;
        let mut ready = true;
        for c in &w.waits {
            match self.watched.get(c) {
                Some(Some(Ok(()))) | None => {}
                Some(Some(Err(why))) => {
                    return Some(Err(format!("copy {} that it waits for failed: {why}", c.0)));
                }
                Some(None) => ready = false,
            }
        }
        ready.then_some(Ok(()))
    }
}

impl<M, B, D> Drop for Runs<M, B, D> {
    fn drop(&mut self) {
        // Closing the channel ends the host thread once its runs are done.
        if let Some((tx, handle)) = self.thread.take() {
            drop(tx);
            let _ = handle.join();
        }
    }
}

/// Sleeps until `t` (returns at once if it has passed).
pub(crate) fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// The host thread: runs one after another, in the order sent.
fn host_lane<M: 'static, B: LentBuf<M>, D>(
    rx: Receiver<HostJob<M, B>>,
    done: Sender<D>,
    wrap: fn(RunEnd<B>) -> D,
    mut kernel: Box<dyn HostKernel<M>>,
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
                let result = (|| {
                    let mut views = Vec::with_capacity(bufs.len());
                    for (s, buf) in &mut bufs {
                        let (bytes, meta) = buf.view()?;
                        views.push(HostBytes {
                            storage: *s,
                            bytes,
                            meta,
                        });
                    }
                    catch_unwind(AssertUnwindSafe(|| kernel.run(op, &mut views)))
                        .unwrap_or_else(|p| Err(format!("the host kernel panicked: {}", why(&p))))
                })();
                let end = RunEnd {
                    id,
                    end: Instant::now(),
                    result,
                    bufs,
                };
                if done.send(wrap(end)).is_err() {
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

/// What an engine gives its host runs; the queue's rules are the provided
/// methods, the same for every engine.
pub(crate) trait RunSite {
    type Meta: Send + 'static;
    type Buf: LentBuf<Self::Meta>;
    type Done: Send + 'static;

    fn runs(&mut self) -> &mut Runs<Self::Meta, Self::Buf, Self::Done>;
    fn runs_ref(&self) -> &Runs<Self::Meta, Self::Buf, Self::Done>;
    /// When the engine's times count from (ns).
    fn epoch(&self) -> Instant;
    fn copy_state(&self, id: CopyId) -> Option<&CopyState>;
    fn set_state(&mut self, id: CopyId, state: CopyState);
    fn fresh_id(&mut self) -> CopyId;
    /// The engine's copies in flight (submitted and not yet ended), with
    /// their storages.
    fn copies_in_flight(&self) -> Vec<(CopyId, StorageId)>;
    /// Whether the storage has a host copy.
    fn has_host(&self, s: StorageId) -> bool;
    /// Takes the storage's host copy out of the engine's map for a run
    /// (it stays counted against the pool).
    fn take_host(&mut self, s: StorageId) -> Option<Self::Buf>;
    /// Puts a host copy a run held back as the storage's.
    fn restore_host(&mut self, s: StorageId, buf: Self::Buf);
    /// Gives a host buffer nothing holds any more back to the pool.
    fn release_host(&mut self, buf: Self::Buf);
    /// The prefetch `id` of `s` is the one whose buffer becomes the
    /// storage's device payload.
    fn want_in(&mut self, s: StorageId, id: CopyId);
    /// Starts copy `id` (or fails it, for want of data or room).
    fn start_copy(&mut self, id: CopyId, copy: Copy, fail: bool);

    /// [`CopyEngine::submit`](crate::CopyEngine::submit), every
    /// `fail_every`-th copy failing by injection: a prefetch of a storage
    /// a run holds starts when the run gives the buffer back (it reads
    /// what the run leaves).
    fn submit_copy(&mut self, copy: Copy, fail_every: Option<u64>) -> CopyId {
        let id = self.fresh_id();
        let fail = fail_every.is_some_and(|k| (id.0 + 1).is_multiple_of(k));
        let s = copy.storage;
        if copy.dir == Dir::ToDevice {
            self.want_in(s, id);
            if self.runs_ref().is_lent(s) {
                self.set_state(
                    id,
                    CopyState::Pending {
                        dir: copy.dir,
                        storage: s,
                    },
                );
                self.runs().defer(id, copy, fail);
                return id;
            }
        }
        self.start_copy(id, copy, fail);
        id
    }

    /// Installs the kernel that host runs call (see [`HostKernel`]); runs
    /// submitted before keep the one they were submitted under. Without
    /// one, a host run fails at once, saying so.
    fn install_kernel(&mut self, kernel: Box<dyn HostKernel<Self::Meta>>) {
        let runs = self.runs();
        if let Some((tx, _)) = &runs.thread {
            // The thread only goes when the engine does.
            let _ = tx.send(HostJob::Kernel(kernel));
            return;
        }
        let (tx, rx) = mpsc::channel();
        let (done, wrap) = (runs.done.clone(), runs.wrap);
        let handle = std::thread::Builder::new()
            .name("tensile-host-run".to_string())
            .spawn(move || host_lane(rx, done, wrap, kernel))
            .expect("spawning the host-run thread");
        runs.thread = Some((tx, handle));
    }

    /// A failed run, known at once.
    fn fail_run(&mut self, s: StorageId, why: String) -> CopyId {
        let id = self.fresh_id();
        self.set_state(id, CopyState::Failed(why, s));
        id
    }

    /// [`CopyEngine::run_on_host`](crate::CopyEngine::run_on_host).
    fn submit_run(&mut self, run: HostRun, engine: &str) -> CopyId {
        let first = run.storages.first().copied().unwrap_or(StorageId(0));
        if self.runs_ref().thread.is_none() {
            return self.fail_run(
                first,
                format!(
                    "op {} runs on the host, and no host kernel is installed on the {engine}",
                    run.op.0
                ),
            );
        }
        let mut waits = Vec::new();
        for &c in &run.after {
            match self.copy_state(c) {
                Some(CopyState::Pending { .. }) => waits.push(c),
                Some(CopyState::Failed(why, _)) => {
                    let why = format!("copy {} that it waits for failed: {why}", c.0);
                    return self.fail_run(first, why);
                }
                // Ended, or forgotten once ended.
                Some(CopyState::Ended(_)) | None => {}
            }
        }
        let touching = self.copies_in_flight();
        let deferred: Vec<(CopyId, StorageId)> = self.runs_ref().deferred_storages().collect();
        for (c, s) in touching.into_iter().chain(deferred) {
            if run.storages.contains(&s) && !waits.contains(&c) {
                waits.push(c);
            }
        }
        let id = self.fresh_id();
        let not_before = self.epoch() + Duration::from_nanos(run.not_before);
        let runs = self.runs();
        for &c in &waits {
            runs.watched.entry(c).or_insert(None);
        }
        runs.queue.push_back(Waiting {
            id,
            op: run.op,
            storages: run.storages,
            waits,
            not_before,
        });
        // The engine's record: never a copy of one direction or the
        // other, but `Pending` carries one.
        self.set_state(
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
    fn dispatch_runs(&mut self) {
        loop {
            let runs = self.runs_ref();
            let Some(w) = runs.queue.front() else { return };
            let first = w.storages.first().copied().unwrap_or(StorageId(0));
            let mut failed = match runs.head_ready() {
                None => return,
                Some(r) => r.err(),
            };
            if failed.is_none() && w.storages.iter().any(|s| runs.is_lent(*s)) {
                // An earlier run still holds one of its buffers.
                return;
            }
            if failed.is_none() {
                failed = w
                    .storages
                    .iter()
                    .find(|s| !self.has_host(**s))
                    .map(|s| format!("storage {} has no host copy", s.0));
            }
            let runs = self.runs();
            let Some(w) = runs.queue.pop_front() else {
                return;
            };
            runs.prune();
            if let Some(why) = failed {
                self.set_state(w.id, CopyState::Failed(why, first));
                continue;
            }
            let mut bufs = Vec::with_capacity(w.storages.len());
            for &s in &w.storages {
                if let Some(h) = self.take_host(s) {
                    self.runs().lent.insert(s, false);
                    bufs.push((s, h));
                }
            }
            let job = HostJob::Run {
                id: w.id,
                op: w.op,
                bufs,
                not_before: w.not_before,
            };
            let runs = self.runs();
            let sent = match &runs.thread {
                Some((tx, _)) => tx.send(job).map_err(|e| e.0),
                None => Err(job),
            };
            match sent {
                Ok(()) => runs.running += 1,
                Err(HostJob::Run { id, bufs, .. }) => {
                    self.give_back(bufs);
                    let why = "the host-run thread is gone".to_string();
                    self.set_state(id, CopyState::Failed(why, first));
                }
                Err(HostJob::Kernel(_)) => unreachable!("a run was sent"),
            }
        }
    }

    /// A run ended on the host thread: its buffers come back (as the host
    /// copies, or to the pool when they went stale meanwhile), prefetches
    /// that waited for them start, and the next runs may go. `end_ns` is
    /// its end on the engine's clock.
    fn run_returned(&mut self, end: RunEnd<Self::Buf>, end_ns: u64) {
        self.runs().running -= 1;
        let first = end.bufs.first().map_or(StorageId(0), |b| b.0);
        self.give_back(end.bufs);
        let state = match end.result {
            Ok(()) => CopyState::Ended(end_ns),
            Err(why) => CopyState::Failed(why, first),
        };
        self.set_state(end.id, state);
        let deferred = std::mem::take(&mut self.runs().deferred);
        for (c, copy, fail) in deferred {
            if self.runs_ref().is_lent(copy.storage) {
                self.runs().deferred.push((c, copy, fail));
            } else {
                self.start_copy(c, copy, fail);
            }
        }
        self.dispatch_runs();
    }

    /// Buffers a run held: each becomes its storage's host copy again,
    /// unless it went stale meanwhile.
    fn give_back(&mut self, bufs: Vec<(StorageId, Self::Buf)>) {
        for (s, h) in bufs {
            if self.runs().lent.remove(&s).unwrap_or(true) {
                self.release_host(h);
            } else {
                self.restore_host(s, h);
            }
        }
    }
}

/// The [`RunSite`] methods both engines implement alike, over fields of
/// the same names (`runs`, `epoch`, `copies`, `host`, `wanted_in`) and
/// their own `fresh_id`, `release` and `start`; each engine adds
/// `copies_in_flight`.
macro_rules! run_site_fields {
    ($engine:ident, $buf:ty, $done:ty) => {
        fn runs(&mut self) -> &mut Runs<Self::Meta, $buf, $done> {
            &mut self.runs
        }
        fn runs_ref(&self) -> &Runs<Self::Meta, $buf, $done> {
            &self.runs
        }
        fn epoch(&self) -> Instant {
            self.epoch
        }
        fn copy_state(&self, id: CopyId) -> Option<&CopyState> {
            self.copies.get(id)
        }
        fn set_state(&mut self, id: CopyId, state: CopyState) {
            self.copies.set(id, state);
        }
        fn fresh_id(&mut self) -> CopyId {
            $engine::fresh_id(self)
        }
        fn has_host(&self, s: StorageId) -> bool {
            self.host.contains_key(&s)
        }
        fn take_host(&mut self, s: StorageId) -> Option<$buf> {
            self.host.remove(&s)
        }
        fn restore_host(&mut self, s: StorageId, h: $buf) {
            self.host.insert(s, h);
        }
        fn release_host(&mut self, h: $buf) {
            self.release(h);
        }
        fn want_in(&mut self, s: StorageId, id: CopyId) {
            self.wanted_in.insert(s, id);
        }
        fn start_copy(&mut self, id: CopyId, copy: Copy, fail: bool) {
            self.start(id, copy, fail);
        }
    };
}
pub(crate) use run_site_fields;
