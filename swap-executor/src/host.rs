//! The host copy engine: real bytes between "device" buffers and a capped
//! pool of host buffers, on two copy threads (one per direction, or one
//! shared when half duplex), each FIFO and paced at a configured bandwidth.
//!
//! The engine knows nothing of tensors: it moves the bytes of a
//! [`Payload`], which the worker implements for its device tensors. It holds
//! the device payload of every resident storage the driver told it of
//! ([`HostCopies::set_device`]), so that a swap-out submitted by the
//! executor finds its source; the copy keeps its own handle to the source
//! until it has completed, whatever the driver drops meanwhile. A prefetch
//! builds a new device payload from the host bytes on the copy thread; it
//! is installed as the storage's device payload when the driver polls.
//!
//! The host pool is capped: a swap-out that would take the pool over its
//! cap is not started and reports [`CopyStatus::Failed`] (the executor then
//! keeps the device copy), so the pool never overcommits and nothing waits
//! on a buffer that may never be given back. Faults can be injected: a
//! delay on every copy and a failure of every n-th one.
//!
//! Device buffers that prefetches built are reused: when the executor
//! frees one, the engine keeps it (up to [`HostConfig::reuse_cap_bytes`])
//! and refills it for a later prefetch of the same size and kind, once the
//! swap-outs submitted before the free (which may still read it) are done.
//! A fresh allocation of 32 MB or more is mapped anew by the allocator and
//! page-faults on first touch, which halves a prefetch's rate or worse.
//! Only payloads that say they may be reused ([`Payload::reusable`]: the
//! worker's CPU tensors) are; kept buffers are the engine's, not the
//! device's resident bytes, as a caching allocator's free blocks are.
//!
//! Host runs (ops kept on the host CPU) go to a host thread of their own,
//! over the host copies, through a kernel the driver installs: see
//! `runs`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tensile_graph::StorageId;

use crate::engine::{Copy, CopyEngine, CopyId, CopyState, CopyStatus, CopyTable, Dir, HostRun};

use crate::runs::{HostKernel, LentBuf, RunEnd, RunSite, Runs, run_site_fields, sleep_until};

/// A device buffer whose bytes the engine can move: implemented by the
/// worker for its tensors (a shallow handle: cloning shares the memory).
pub trait Payload: Send + 'static {
    /// What it takes to build a payload from bytes (element type, device).
    type Meta: Clone + PartialEq + Send + 'static;
    fn meta(&self) -> Self::Meta;
    /// Another handle to the same memory (kept by a copy in flight).
    fn share(&self) -> Self;
    fn byte_len(&self) -> usize;
    /// Copies the payload's bytes into `dst` (exactly `byte_len` long).
    fn read(&self, dst: &mut [u8]) -> Result<(), String>;
    /// A new payload holding `src`.
    fn write(meta: &Self::Meta, src: &[u8]) -> Result<Self, String>
    where
        Self: Sized;
    /// Whether an engine may keep this buffer once nothing else uses it
    /// and refill it ([`Payload::overwrite`]) for a later prefetch: for
    /// memory that is slow to allocate afresh. No by default.
    fn reusable(&self) -> bool {
        false
    }
    /// Writes `src` (exactly `byte_len` long) into this buffer's memory.
    fn overwrite(&mut self, _src: &[u8]) -> Result<(), String> {
        Err("this payload cannot be refilled".to_string())
    }
}

/// How the host engine runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostConfig {
    /// Bytes per second per direction; `None`: as fast as memory goes.
    pub bytes_per_s: Option<f64>,
    /// Both directions share one copy thread.
    pub half_duplex: bool,
    /// The most bytes of host copies held at once.
    pub pool_cap_bytes: u64,
    /// Extra time every copy takes (fault injection).
    pub fault_delay: Duration,
    /// Every n-th submitted copy fails (fault injection).
    pub fail_every: Option<u64>,
    /// The most bytes of freed device buffers kept for reuse by later
    /// prefetches (0: none kept; a prefetch then allocates afresh).
    pub reuse_cap_bytes: u64,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            bytes_per_s: None,
            half_duplex: false,
            pool_cap_bytes: u64::MAX,
            fault_delay: Duration::ZERO,
            fail_every: None,
            reuse_cap_bytes: 512 << 20,
        }
    }
}

/// A host copy: its bytes and what it takes to rebuild the device payload.
pub(crate) struct HostBuf<M> {
    bytes: Arc<Vec<u8>>,
    meta: M,
}

impl<M: Send + 'static> LentBuf<M> for HostBuf<M> {
    fn view(&mut self) -> Result<(&mut [u8], &M), String> {
        // Unique: the run waited for every copy that read it; were it
        // shared, the run writes a copy.
        Ok((Arc::make_mut(&mut self.bytes).as_mut_slice(), &self.meta))
    }
}

enum Job<P: Payload> {
    Out {
        id: CopyId,
        src: P,
        buf: Vec<u8>,
        not_before: Instant,
        fail: bool,
    },
    In {
        id: CopyId,
        src: Arc<Vec<u8>>,
        meta: P::Meta,
        /// A kept device buffer to refill instead of allocating.
        reuse: Option<P>,
        not_before: Instant,
        fail: bool,
    },
}

pub(crate) enum Done<P: Payload> {
    Out {
        id: CopyId,
        end: Instant,
        result: Result<Vec<u8>, String>,
    },
    In {
        id: CopyId,
        end: Instant,
        result: Result<P, String>,
    },
    /// A host run ended; the host buffers it held come back.
    Run(RunEnd<HostBuf<P::Meta>>),
}

/// What the engine knows of one copy.
/// The host copy engine over payloads `P`. Times are ns since `epoch`, the
/// driver's clock.
pub struct HostCopies<P: Payload> {
    config: HostConfig,
    epoch: Instant,
    lanes: Vec<(Sender<Job<P>>, JoinHandle<()>)>,
    done_rx: Receiver<Done<P>>,
    copies: CopyTable,
    device: HashMap<StorageId, P>,
    host: HashMap<StorageId, HostBuf<P::Meta>>,
    /// The metadata of swap-outs in flight, by copy.
    out_meta: HashMap<CopyId, (StorageId, P::Meta, u64)>,
    /// The prefetch whose result becomes the storage's device payload.
    wanted_in: HashMap<StorageId, CopyId>,
    /// Bytes of the pool in use: host copies and swap-outs in flight.
    pool_used: u64,
    pool_peak: u64,
    next_id: u64,
    in_flight: usize,
    /// Buffers given back, reused by later swap-outs of the same size
    /// (storages are swapped again every iteration): they count against
    /// the cap, and go first when a copy needs the room.
    spare: Vec<Vec<u8>>,
    spare_bytes: u64,
    /// Storages whose device payload a prefetch built (the engine's own,
    /// shared only through views of the same storage).
    built_here: HashSet<StorageId>,
    /// Freed device buffers kept for reuse, oldest first, each with the
    /// number of swap-outs that must be done before it may be written.
    reuse: VecDeque<(P, u64)>,
    reuse_bytes: u64,
    outs_submitted: u64,
    outs_done: u64,
    /// The storage of every copy on a lane (host runs wait for those of
    /// their storages).
    touching: HashMap<CopyId, StorageId>,
    runs: Runs<P::Meta, HostBuf<P::Meta>, Done<P>>,
}

impl<P: Payload> std::fmt::Debug for HostCopies<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCopies")
            .field("config", &self.config)
            .field("copies", &self.copies.len())
            .field("device", &self.device.len())
            .field("host", &self.host.len())
            .field("pool_used", &self.pool_used)
            .finish()
    }
}

fn lane<P: Payload>(
    rx: Receiver<Job<P>>,
    done: Sender<Done<P>>,
    bytes_per_s: Option<f64>,
    delay: Duration,
) {
    let mut free_at = Instant::now();
    for job in rx {
        let (not_before, len) = match &job {
            Job::Out {
                not_before, src, ..
            } => (*not_before, src.byte_len()),
            Job::In {
                not_before, src, ..
            } => (*not_before, src.len()),
        };
        let start = Instant::now().max(free_at).max(not_before);
        sleep_until(start);
        let paced = bytes_per_s.map_or(Duration::ZERO, |bw| {
            Duration::from_secs_f64(len as f64 / bw.max(1.0))
        });
        let msg = match job {
            Job::Out {
                id,
                src,
                mut buf,
                fail,
                ..
            } => {
                let result = if fail {
                    Err("injected copy failure".to_string())
                } else {
                    if buf.len() != len {
                        // Zeroed pages come from the allocator untouched.
                        buf = vec![0u8; len];
                    }
                    src.read(&mut buf).map(|()| buf)
                };
                // The source is dropped only now, after the copy.
                drop(src);
                let end = finish(start, paced, delay);
                Done::Out { id, end, result }
            }
            Job::In {
                id,
                src,
                meta,
                reuse,
                fail,
                ..
            } => {
                let result = if fail {
                    Err("injected copy failure".to_string())
                } else {
                    // A kept buffer that cannot be refilled is dropped and
                    // a fresh one built.
                    reuse
                        .and_then(|mut p| p.overwrite(&src).ok().map(|()| p))
                        .map_or_else(|| P::write(&meta, &src), Ok)
                };
                let end = finish(start, paced, delay);
                Done::In { id, end, result }
            }
        };
        free_at = Instant::now();
        if done.send(msg).is_err() {
            return;
        }
    }
}

/// Waits out the pace and the injected delay of a copy started at `start`.
fn finish(start: Instant, paced: Duration, delay: Duration) -> Instant {
    sleep_until(start + paced);
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    Instant::now()
}

impl<P: Payload> HostCopies<P> {
    /// An engine whose times are ns since `epoch`.
    pub fn new(config: HostConfig, epoch: Instant) -> HostCopies<P> {
        let (done_tx, done_rx) = mpsc::channel();
        let n = if config.half_duplex { 1 } else { 2 };
        let lanes = (0..n)
            .map(|i| {
                let (tx, rx) = mpsc::channel();
                let done = done_tx.clone();
                let (bw, delay) = (config.bytes_per_s, config.fault_delay);
                let handle = std::thread::Builder::new()
                    .name(format!("tensile-copy-{i}"))
                    .spawn(move || lane::<P>(rx, done, bw, delay))
                    .expect("spawning a copy thread");
                (tx, handle)
            })
            .collect();
        HostCopies {
            config,
            epoch,
            lanes,
            done_rx,
            copies: CopyTable::default(),
            device: HashMap::new(),
            host: HashMap::new(),
            out_meta: HashMap::new(),
            wanted_in: HashMap::new(),
            pool_used: 0,
            pool_peak: 0,
            next_id: 0,
            in_flight: 0,
            spare: Vec::new(),
            spare_bytes: 0,
            built_here: HashSet::new(),
            reuse: VecDeque::new(),
            reuse_bytes: 0,
            outs_submitted: 0,
            outs_done: 0,
            touching: HashMap::new(),
            runs: Runs::new(done_tx, Done::Run),
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// The storage's device payload is `payload` (a kernel produced it).
    pub fn set_device(&mut self, s: StorageId, payload: P) {
        self.wanted_in.remove(&s);
        self.built_here.remove(&s);
        self.device.insert(s, payload);
    }

    /// The storage's device payload, once produced or prefetched.
    pub fn device(&self, s: StorageId) -> Option<&P> {
        self.device.get(&s)
    }

    /// The storage left the device: its payload goes (a copy in flight
    /// keeps its own handle), and a prefetch into it is no longer wanted.
    pub fn drop_device(&mut self, s: StorageId) {
        self.wanted_in.remove(&s);
        if let Some(p) = self.device.remove(&s)
            && self.built_here.remove(&s)
        {
            // Swap-outs submitted so far may still read it.
            self.keep_device(p, self.outs_submitted);
        }
    }

    /// Keeps a device buffer nothing else uses for a later prefetch, once
    /// `outs` swap-outs are done; the oldest go past the cap.
    fn keep_device(&mut self, p: P, outs: u64) {
        let len = p.byte_len() as u64;
        if !p.reusable() || len == 0 || len > self.config.reuse_cap_bytes {
            return;
        }
        self.reuse_bytes += len;
        self.reuse.push_back((p, outs));
        while self.reuse_bytes > self.config.reuse_cap_bytes {
            let Some((old, _)) = self.reuse.pop_front() else {
                break;
            };
            self.reuse_bytes -= old.byte_len() as u64;
        }
    }

    /// A kept device buffer for `len` bytes of `meta` that no copy reads.
    fn take_device(&mut self, meta: &P::Meta, len: usize) -> Option<P> {
        let i = self.reuse.iter().position(|(p, outs)| {
            *outs <= self.outs_done && p.byte_len() == len && p.meta() == *meta
        })?;
        let (p, _) = self.reuse.remove(i)?;
        self.reuse_bytes -= len as u64;
        Some(p)
    }

    /// Bytes of freed device buffers kept for reuse.
    pub fn reuse_bytes(&self) -> u64 {
        self.reuse_bytes
    }

    /// Puts `payload`'s bytes in the pool as the storage's host copy, now
    /// (storage that starts an iteration on the host).
    pub fn put_host(&mut self, s: StorageId, payload: &P) -> Result<(), String> {
        let len = payload.byte_len() as u64;
        self.discard(s);
        self.reserve(len, s)?;
        let mut buf = vec![0u8; len as usize];
        payload.read(&mut buf)?;
        self.host.insert(
            s,
            HostBuf {
                bytes: Arc::new(buf),
                meta: payload.meta(),
            },
        );
        Ok(())
    }

    /// A payload rebuilt from the storage's host copy, if it has one.
    pub fn host_payload(&self, s: StorageId) -> Option<Result<P, String>> {
        self.host.get(&s).map(|h| P::write(&h.meta, &h.bytes))
    }

    /// Bytes of host copies held now, and at most so far.
    pub fn pool_bytes(&self) -> (u64, u64) {
        (self.pool_used, self.pool_peak)
    }

    fn reserve(&mut self, len: u64, s: StorageId) -> Result<(), String> {
        if self.pool_used.saturating_add(len) > self.config.pool_cap_bytes {
            return Err(format!(
                "host pool full: storage {} needs {len} B, {} of {} B in use",
                s.0, self.pool_used, self.config.pool_cap_bytes
            ));
        }
        self.pool_used += len;
        self.pool_peak = self.pool_peak.max(self.pool_used);
        while self.pool_used.saturating_add(self.spare_bytes) > self.config.pool_cap_bytes {
            let Some(buf) = self.spare.pop() else { break };
            self.spare_bytes -= buf.len() as u64;
        }
        Ok(())
    }

    /// Keeps `buf` for reuse while the pool's cap has room for it.
    fn keep_spare(&mut self, buf: Vec<u8>) {
        let len = buf.len() as u64;
        if len > 0 && self.pool_used + self.spare_bytes + len <= self.config.pool_cap_bytes {
            self.spare_bytes += len;
            self.spare.push(buf);
        }
    }

    /// A spare buffer of exactly `len` bytes, if one was given back.
    fn take_spare(&mut self, len: usize) -> Vec<u8> {
        match self.spare.iter().position(|b| b.len() == len) {
            Some(i) => {
                let buf = self.spare.swap_remove(i);
                self.spare_bytes -= len as u64;
                buf
            }
            None => Vec::new(),
        }
    }

    /// Drops the storage's host copy, giving its bytes back to the pool (a
    /// host run holding them gives them back when it ends).
    fn discard(&mut self, s: StorageId) {
        self.runs.stale(s);
        if let Some(h) = self.host.remove(&s) {
            self.release(h);
        }
    }

    /// Gives a host copy's bytes back to the pool (kept for reuse unless a
    /// copy still reads them; it gives them back then).
    fn release(&mut self, h: HostBuf<P::Meta>) {
        self.pool_used -= h.bytes.len() as u64;
        if let Ok(buf) = Arc::try_unwrap(h.bytes) {
            self.keep_spare(buf);
        }
    }

    fn fresh_id(&mut self) -> CopyId {
        let id = CopyId(self.next_id);
        self.next_id += 1;
        id
    }

    fn lane_for(&self, dir: Dir) -> usize {
        match dir {
            Dir::ToHost => 0,
            Dir::ToDevice => usize::from(!self.config.half_duplex),
        }
    }

    fn apply(&mut self, done: Done<P>) {
        if let Done::Run(end) = done {
            let ns = self.ns(end.end);
            self.run_returned(end, ns);
            return;
        }
        self.in_flight -= 1;
        match done {
            Done::Run(_) => {}
            Done::Out { id, end, result } => {
                self.touching.remove(&id);
                self.runs
                    .copy_done(id, result.as_ref().map(drop).map_err(Clone::clone));
                self.outs_done += 1;
                let Some((s, meta, len)) = self.out_meta.remove(&id) else {
                    return;
                };
                let state = match result {
                    Ok(buf) => {
                        // The new copy replaces any older one.
                        self.discard(s);
                        self.host.insert(
                            s,
                            HostBuf {
                                bytes: Arc::new(buf),
                                meta,
                            },
                        );
                        CopyState::Ended(self.ns(end))
                    }
                    Err(why) => {
                        self.pool_used -= len;
                        CopyState::Failed(why, s)
                    }
                };
                self.copies.set(id, state);
            }
            Done::In { id, end, result } => {
                self.touching.remove(&id);
                self.runs
                    .copy_done(id, result.as_ref().map(drop).map_err(Clone::clone));
                let Some(CopyState::Pending { storage: s, .. }) = self.copies.get(id) else {
                    return;
                };
                let s = *s;
                let state = match result {
                    Ok(p) => {
                        if self.wanted_in.get(&s) == Some(&id) {
                            self.wanted_in.remove(&s);
                            self.device.insert(s, p);
                            self.built_here.insert(s);
                        } else {
                            // Nobody saw it: the engine's to keep.
                            self.keep_device(p, 0);
                        }
                        CopyState::Ended(self.ns(end))
                    }
                    Err(why) => {
                        if self.wanted_in.get(&s) == Some(&id) {
                            self.wanted_in.remove(&s);
                        }
                        CopyState::Failed(why, s)
                    }
                };
                self.copies.set(id, state);
            }
        }
        self.dispatch_runs();
    }

    /// Waits up to `timeout` for a copy to complete; says whether one did.
    /// The driver calls this instead of spinning while the executor waits
    /// for a copy.
    pub fn wait(&mut self, timeout: Duration) -> bool {
        if self.in_flight == 0 && self.runs.outstanding() == 0 {
            return false;
        }
        match self.done_rx.recv_timeout(timeout) {
            Ok(d) => {
                self.apply(d);
                true
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => false,
        }
    }

    /// Waits for every copy and host run in flight to complete.
    pub fn drain(&mut self) {
        while self.in_flight > 0 || self.runs.outstanding() > 0 {
            match self.done_rx.recv() {
                Ok(d) => self.apply(d),
                Err(_) => return,
            }
        }
    }

    /// Copies storages `0..n`, `bytes` each, in direction `dir` as fast as
    /// the engine goes, waits for all and forgets them; the bytes per
    /// second of wall time they took (for the copy-rate benchmarks).
    ///
    /// # Panics
    /// When a copy fails (a benchmark's setup is wrong).
    pub fn timed_batch(&mut self, dir: Dir, n: u32, bytes: u64) -> f64 {
        let t0 = Instant::now();
        let ids: Vec<CopyId> = (0..n)
            .map(|s| {
                self.submit(Copy {
                    dir,
                    storage: StorageId(s),
                    bytes,
                    not_before: 0,
                })
            })
            .collect();
        self.drain();
        self.poll(self.ns(Instant::now()));
        let secs = t0.elapsed().as_secs_f64();
        for id in ids {
            let st = self.status(id);
            assert!(matches!(st, CopyStatus::Ends(_)), "{st:?}");
            self.forget(id);
        }
        bytes as f64 * f64::from(n) / secs
    }

    /// Puts copy `id` on its lane (or fails it, for want of data or room).
    fn start(&mut self, id: CopyId, copy: Copy, fail: bool) {
        let s = copy.storage;
        let not_before = self.epoch + Duration::from_nanos(copy.not_before);
        let failed = |e: &mut Self, why: String| {
            if e.wanted_in.get(&s) == Some(&id) {
                e.wanted_in.remove(&s);
            }
            // A host run may wait for it (a prefetch that was deferred).
            e.runs.copy_done(id, Err(why.clone()));
            e.copies.set(id, CopyState::Failed(why, s));
        };
        let job = match copy.dir {
            Dir::ToHost => {
                let Some(src) = self.device.get(&s).map(P::share) else {
                    return failed(self, format!("storage {} has no device data", s.0));
                };
                let len = src.byte_len() as u64;
                let buf = self.take_spare(len as usize);
                if let Err(why) = self.reserve(len, s) {
                    self.keep_spare(buf);
                    return failed(self, why);
                }
                self.out_meta.insert(id, (s, src.meta(), len));
                Job::Out {
                    id,
                    src,
                    buf,
                    not_before,
                    fail,
                }
            }
            Dir::ToDevice => {
                let Some(h) = self.host.get(&s) else {
                    return failed(self, format!("storage {} has no host copy", s.0));
                };
                let (src, meta) = (Arc::clone(&h.bytes), h.meta.clone());
                let reuse = self.take_device(&meta, src.len());
                Job::In {
                    id,
                    src,
                    meta,
                    reuse,
                    not_before,
                    fail,
                }
            }
        };
        let lane = self.lane_for(copy.dir);
        if self.lanes[lane].0.send(job).is_err() {
            if let Some((_, _, len)) = self.out_meta.remove(&id) {
                self.pool_used -= len;
            }
            return failed(self, "the copy thread is gone".into());
        }
        self.in_flight += 1;
        self.touching.insert(id, s);
        if copy.dir == Dir::ToHost {
            self.outs_submitted += 1;
        }
        self.copies.set(
            id,
            CopyState::Pending {
                dir: copy.dir,
                storage: s,
            },
        );
    }

    /// Copies in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl<P: Payload> HostCopies<P> {
    /// Installs the kernel that host runs call (see [`HostKernel`]); runs
    /// submitted before keep the one they were submitted under. Without
    /// one, a host run fails at once, saying so.
    pub fn set_host_kernel(&mut self, kernel: impl HostKernel<P::Meta>) {
        self.install_kernel(Box::new(kernel));
    }

    /// Host runs submitted and not yet ended.
    pub fn host_runs_in_flight(&self) -> usize {
        self.runs.outstanding()
    }
}

impl<P: Payload> RunSite for HostCopies<P> {
    type Meta = P::Meta;
    type Buf = HostBuf<P::Meta>;
    type Done = Done<P>;

    run_site_fields!(HostCopies, HostBuf<P::Meta>, Done<P>);

    fn copies_in_flight(&self) -> Vec<(CopyId, StorageId)> {
        self.touching.iter().map(|(&c, &s)| (c, s)).collect()
    }
}

impl<P: Payload> CopyEngine for HostCopies<P> {
    fn submit(&mut self, copy: Copy) -> CopyId {
        self.submit_copy(copy, self.config.fail_every)
    }

    fn run_on_host(&mut self, run: HostRun) -> CopyId {
        self.submit_run(run, "host copy engine")
    }

    fn poll(&mut self, now: u64) {
        self.copies.polled(now);
        while let Ok(d) = self.done_rx.try_recv() {
            self.apply(d);
        }
    }

    fn status(&self, id: CopyId) -> CopyStatus {
        self.copies.status(id)
    }

    fn forget(&mut self, id: CopyId) {
        self.copies.forget(id);
    }

    fn discard_host(&mut self, s: StorageId) {
        self.discard(s);
    }

    fn device_freed(&mut self, s: StorageId) {
        self.drop_device(s);
    }
}

impl<P: Payload> Drop for HostCopies<P> {
    fn drop(&mut self) {
        // Closing the job channels ends the copy threads once they are done
        // (the host thread goes with `runs`, after).
        for (tx, handle) in std::mem::take(&mut self.lanes) {
            drop(tx);
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
#[path = "host_tests.rs"]
mod tests;
