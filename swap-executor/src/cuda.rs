//! The CUDA copy engine: real copies between
//! libtorch's device buffers and a capped pool of pinned host buffers, on
//! one non-blocking CUDA stream of its own, through cudarc's driver API
//! (loaded at run time: the build needs no CUDA toolkit).
//!
//! Ordering with the compute stream. The kernels run on the legacy default
//! stream (libtorch's, handle 0, which is cudarc's `default_stream()`); the
//! copy stream does not synchronise with it by itself. So every copy first
//! records an event on the compute stream and makes the copy stream wait
//! on it: a swap-out reads its source only after the kernel that produced
//! it, and a prefetch writes its fresh buffer only after the compute work
//! that last used that memory (the caching allocator hands out blocks
//! freed on the compute stream). A prefetch's completion event is waited
//! on by the compute stream before its buffer is handed out to consumers.
//! All copies go in submission order on the one stream, so a swap-out
//! submitted while a prefetch of the same storage is in flight reads the
//! arriving buffer after it has arrived.
//!
//! Lifetimes. libtorch has no `record_stream` through tch: a copy keeps its
//! own handle to its source (swap-out) or destination (prefetch) tensor and
//! to its pinned buffer until its completion event has been observed, and
//! nothing is released earlier; dropping the engine waits for the stream.
//!
//! The pinned pool is capped as the host engine's is: a swap-out that would
//! take it over the cap fails at once (the executor keeps the device copy).
//! Pinned buffers are allocated with `cuMemHostAlloc` flags 0 (the host
//! reads them back; write-combined memory is slow to read), once per size:
//! buffers given back are kept for reuse while the cap has room.
//!
//! Host runs (ops kept on the host CPU, [`CopyEngine::run_on_host`]) go to
//! a host thread of the engine's over the pinned host copies, by the rules
//! the host engine follows (see `runs`): a run starts once the copies of
//! its storages have been seen complete, and holds their buffers while it
//! writes them; a prefetch of such a storage starts when it gives them
//! back.
//!
//! Faults: a delay makes every copy report its completion that much later
//! (copies report in order, like a lane held busy), and every n-th copy
//! fails without being issued; a failed swap-out leaves the device copy, a
//! failed prefetch leaves the host copy, so no data is lost.
//!
//! With `nvml`, the crate's only module with `unsafe`: the cudarc calls that
//! are unsafe (pinned allocation, raw-pointer async copies, the driver
//! library probe). Each block says why it is sound.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, PinnedHostSlice, result};
use tensile_graph::StorageId;

use crate::engine::{Copy, CopyEngine, CopyId, CopyState, CopyStatus, CopyTable, Dir, HostRun};
use crate::host::Payload;
use crate::runs::{HostKernel, LentBuf, RunEnd, RunSite, Runs, run_site_fields};

/// A device buffer the CUDA engine can copy to and from by address:
/// implemented by the worker for its libtorch tensors.
///
/// # Safety
///
/// The engine hands [`DevicePayload::device_ptr`] to the CUDA driver as
/// raw device memory, so an implementation must guarantee that, for as
/// long as the value lives, the address is the first byte of one
/// allocation of at least [`Payload::byte_len`] contiguous bytes in the
/// primary context of the device that [`DevicePayload::device_ordinal`]
/// names, and that [`DevicePayload::alloc`] returns such a buffer of
/// exactly `len` bytes. The engine checks the ordinal and the length
/// before every copy; the address it has to trust.
pub unsafe trait DevicePayload: Payload {
    /// The device address of the payload's first byte.
    fn device_ptr(&self) -> u64;
    /// The CUDA device the buffer is on; `None`: not on a CUDA device.
    fn device_ordinal(&self) -> Option<usize>;
    /// A new device buffer of `len` bytes, contents unset, allocated for
    /// the compute stream (a prefetch's destination).
    fn alloc(meta: &Self::Meta, len: usize) -> Result<Self, String>
    where
        Self: Sized;
}

/// Whether `p` is a buffer of at least `len` bytes on CUDA device
/// `served`: what the engine can check of a payload before it hands its
/// address to the driver.
fn check_payload<P: DevicePayload>(p: &P, served: usize, len: usize) -> Result<(), String> {
    match p.device_ordinal() {
        Some(o) if o == served => {}
        Some(o) => {
            return Err(format!(
                "the buffer is on CUDA device {o}; this engine serves device {served}"
            ));
        }
        None => {
            return Err(format!(
                "the buffer is not on a CUDA device; this engine serves device {served}"
            ));
        }
    }
    if p.byte_len() < len {
        return Err(format!(
            "the device buffer has {} bytes; the copy moves {len}",
            p.byte_len()
        ));
    }
    Ok(())
}

/// How the CUDA engine runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CudaConfig {
    /// The CUDA device (its primary context is libtorch's).
    pub ordinal: usize,
    /// The most bytes of pinned host copies held at once.
    pub pool_cap_bytes: u64,
    /// Extra time every copy takes to report (fault injection).
    pub fault_delay: Duration,
    /// Every n-th submitted copy fails (fault injection).
    pub fail_every: Option<u64>,
}

impl Default for CudaConfig {
    fn default() -> Self {
        CudaConfig {
            ordinal: 0,
            pool_cap_bytes: u64::MAX,
            fault_delay: Duration::ZERO,
            fail_every: None,
        }
    }
}

/// Why the CUDA engine cannot run here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaUnavailable {
    #[error(
        "no CUDA driver library (libcuda.so) could be loaded: this machine has no NVIDIA driver"
    )]
    NoDriver,
    #[error("CUDA device {ordinal} does not exist ({count} found)")]
    NoDevice { ordinal: usize, count: usize },
    #[error("the CUDA driver failed: {0}")]
    Driver(String),
}

/// Whether the driver library loads and has device `ordinal`; never
/// panics (cudarc's `CudaContext::new` does without a driver).
pub fn cuda_available(ordinal: usize) -> Result<(), CudaUnavailable> {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library
    // by its usual names and drops what it opened; it has no preconditions.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaUnavailable::NoDriver);
    }
    let count = CudaContext::device_count().map_err(|e| CudaUnavailable::Driver(e.to_string()))?;
    let count = usize::try_from(count).unwrap_or(0);
    if ordinal >= count {
        return Err(CudaUnavailable::NoDevice { ordinal, count });
    }
    Ok(())
}

/// A pinned host buffer of `len` bytes (allocated at least one byte long).
struct Pinned {
    buf: PinnedHostSlice<u8>,
    len: usize,
}

impl Pinned {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Pinned, String> {
        // SAFETY: flags 0 is plain page-locked memory; its bytes are unset,
        // which is a valid `u8` for every byte; the slice frees itself.
        let buf = unsafe { ctx.alloc_pinned_with_flags::<u8>(len.max(1), 0) }
            .map_err(|e| format!("allocating {len} B of pinned host memory: {e}"))?;
        Ok(Pinned { buf, len })
    }

    fn bytes(&self) -> Result<&[u8], String> {
        let all = self
            .buf
            .as_slice()
            .map_err(|e| format!("reading pinned memory: {e}"))?;
        Ok(&all[..self.len])
    }

    fn bytes_mut(&mut self) -> Result<&mut [u8], String> {
        let len = self.len;
        let all = self
            .buf
            .as_mut_slice()
            .map_err(|e| format!("writing pinned memory: {e}"))?;
        Ok(&mut all[..len])
    }
}

/// A host copy: its pinned bytes and what it takes to rebuild the payload.
pub(crate) struct HostBuf<M> {
    bytes: Arc<Pinned>,
    meta: M,
}

impl<M: Send + 'static> LentBuf<M> for HostBuf<M> {
    fn view(&mut self) -> Result<(&mut [u8], &M), String> {
        // Unique: the run waited for every copy that reads the buffer (a
        // prefetch holds it until its completion has been observed).
        let pinned = Arc::get_mut(&mut self.bytes)
            .ok_or_else(|| "the host copy is still read by a prefetch".to_string())?;
        Ok((pinned.bytes_mut()?, &self.meta))
    }
}

/// A host run the host thread has ended.
type CudaRunEnd<M> = RunEnd<HostBuf<M>>;

/// What a copy in flight holds until its completion has been observed.
enum Held<P: Payload> {
    Out { src: P, buf: Pinned, meta: P::Meta },
    In { dst: P, src: Arc<Pinned> },
}

struct InFlight<P: Payload> {
    id: CopyId,
    storage: StorageId,
    /// Recorded on the copy stream after the copy; `None`: not issued (an
    /// injected failure).
    done: Option<CudaEvent>,
    /// Not reported before this (injected delay).
    report_at: Instant,
    held: Held<P>,
    failed: Option<String>,
}

/// The CUDA copy engine over payloads `P`. Times are ns since `epoch`.
pub struct CudaCopies<P: DevicePayload> {
    config: CudaConfig,
    epoch: Instant,
    ctx: Arc<CudaContext>,
    /// The copy stream (non-blocking).
    stream: Arc<CudaStream>,
    /// libtorch's compute stream: the legacy default stream.
    compute: Arc<CudaStream>,
    /// Copies in flight, in submission (= stream) order.
    flight: VecDeque<InFlight<P>>,
    copies: CopyTable,
    device: HashMap<StorageId, P>,
    host: HashMap<StorageId, HostBuf<P::Meta>>,
    /// The prefetch whose buffer becomes the storage's device payload.
    wanted_in: HashMap<StorageId, CopyId>,
    pool_used: u64,
    pool_peak: u64,
    spare: Vec<Pinned>,
    spare_bytes: u64,
    next_id: u64,
    /// When the last copy reports at the earliest (faults delay in order).
    last_report: Instant,
    /// Host runs (ops kept on the host CPU), over the pinned host copies.
    runs: Runs<P::Meta, HostBuf<P::Meta>, CudaRunEnd<P::Meta>>,
    /// Where the host thread reports runs that ended.
    run_rx: Receiver<CudaRunEnd<P::Meta>>,
}

impl<P: DevicePayload> std::fmt::Debug for CudaCopies<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaCopies")
            .field("config", &self.config)
            .field("in_flight", &self.flight.len())
            .field("device", &self.device.len())
            .field("host", &self.host.len())
            .field("pool_used", &self.pool_used)
            .finish()
    }
}

/// A driver error as a message that says what was being done.
pub(crate) fn driver(what: &str) -> impl FnOnce(result::DriverError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl<P: DevicePayload> CudaCopies<P> {
    /// An engine on device `config.ordinal` whose times are ns since
    /// `epoch`; a clear error when there is no driver or no such device.
    pub fn new(config: CudaConfig, epoch: Instant) -> Result<CudaCopies<P>, CudaUnavailable> {
        cuda_available(config.ordinal)?;
        let err = |e: result::DriverError| CudaUnavailable::Driver(e.to_string());
        let ctx = CudaContext::new(config.ordinal).map_err(err)?;
        let stream = ctx.new_stream().map_err(err)?;
        let compute = ctx.default_stream();
        let (run_tx, run_rx) = mpsc::channel();
        Ok(CudaCopies {
            config,
            epoch,
            ctx,
            stream,
            compute,
            flight: VecDeque::new(),
            copies: CopyTable::default(),
            device: HashMap::new(),
            host: HashMap::new(),
            wanted_in: HashMap::new(),
            pool_used: 0,
            pool_peak: 0,
            spare: Vec::new(),
            spare_bytes: 0,
            next_id: 0,
            last_report: epoch,
            runs: Runs::new(run_tx, |end| end),
            run_rx,
        })
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// The storage's device payload is `payload` (a kernel produced it).
    pub fn set_device(&mut self, s: StorageId, payload: P) {
        self.wanted_in.remove(&s);
        self.device.insert(s, payload);
    }

    /// The storage's device payload, once produced or prefetched.
    pub fn device(&self, s: StorageId) -> Option<&P> {
        self.device.get(&s)
    }

    /// The storage left the device (a copy in flight keeps its own handle).
    pub fn drop_device(&mut self, s: StorageId) {
        self.device.remove(&s);
        self.wanted_in.remove(&s);
    }

    /// Puts `payload`'s bytes in the pool as the storage's host copy, now.
    pub fn put_host(&mut self, s: StorageId, payload: &P) -> Result<(), String> {
        let len = payload.byte_len();
        self.discard(s);
        self.reserve(len as u64, s)?;
        let filled = self.take_buffer(len).and_then(|mut buf| {
            payload.read(buf.bytes_mut()?)?;
            Ok(buf)
        });
        match filled {
            Ok(buf) => {
                self.host.insert(
                    s,
                    HostBuf {
                        bytes: Arc::new(buf),
                        meta: payload.meta(),
                    },
                );
                Ok(())
            }
            Err(why) => {
                self.pool_used -= len as u64;
                Err(why)
            }
        }
    }

    /// A payload rebuilt from the storage's host copy, if it has one.
    pub fn host_payload(&self, s: StorageId) -> Option<Result<P, String>> {
        self.host
            .get(&s)
            .map(|h| h.bytes.bytes().and_then(|b| P::write(&h.meta, b)))
    }

    /// Bytes of pinned host copies held now, and at most so far.
    pub fn pool_bytes(&self) -> (u64, u64) {
        (self.pool_used, self.pool_peak)
    }

    /// Copies in flight.
    pub fn in_flight(&self) -> usize {
        self.flight.len()
    }

    fn reserve(&mut self, len: u64, s: StorageId) -> Result<(), String> {
        if self.pool_used.saturating_add(len) > self.config.pool_cap_bytes {
            return Err(format!(
                "pinned pool full: storage {} needs {len} B, {} of {} B in use",
                s.0, self.pool_used, self.config.pool_cap_bytes
            ));
        }
        self.pool_used += len;
        self.pool_peak = self.pool_peak.max(self.pool_used);
        while self.pool_used.saturating_add(self.spare_bytes) > self.config.pool_cap_bytes {
            let Some(buf) = self.spare.pop() else { break };
            self.spare_bytes -= buf.len as u64;
        }
        Ok(())
    }

    /// A spare pinned buffer of `len` bytes, or a new one.
    fn take_buffer(&mut self, len: usize) -> Result<Pinned, String> {
        match self.spare.iter().position(|b| b.len == len) {
            Some(i) => {
                self.spare_bytes -= len as u64;
                Ok(self.spare.swap_remove(i))
            }
            None => Pinned::new(&self.ctx, len),
        }
    }

    fn keep_spare(&mut self, buf: Pinned) {
        let len = buf.len as u64;
        if len > 0 && self.pool_used + self.spare_bytes + len <= self.config.pool_cap_bytes {
            self.spare_bytes += len;
            self.spare.push(buf);
        }
    }

    /// Drops the storage's host copy (a host run holding it gives it back
    /// to the pool when it ends).
    fn discard(&mut self, s: StorageId) {
        self.runs.stale(s);
        if let Some(h) = self.host.remove(&s) {
            self.release(h);
        }
    }

    /// Gives a host copy's bytes back to the pool (kept for reuse unless a
    /// copy still reads them; it gives them back then).
    fn release(&mut self, h: HostBuf<P::Meta>) {
        self.pool_used -= h.bytes.len as u64;
        if let Ok(buf) = Arc::try_unwrap(h.bytes) {
            self.keep_spare(buf);
        }
    }

    fn fresh_id(&mut self) -> CopyId {
        let id = CopyId(self.next_id);
        self.next_id += 1;
        id
    }

    /// Makes the copy stream wait for the work on the compute stream so far.
    fn after_compute(&self) -> Result<(), String> {
        let ev = self
            .compute
            .record_event(None)
            .map_err(driver("recording an event on the compute stream"))?;
        self.stream
            .wait(&ev)
            .map_err(driver("ordering the copy stream after the compute stream"))
    }

    /// Issues a swap-out of `src` into `buf`; its completion event.
    fn issue_out(&self, src: &P, buf: &mut Pinned) -> Result<CudaEvent, String> {
        self.after_compute()?;
        let dptr: CUdeviceptr = src.device_ptr();
        let dst = buf.bytes_mut()?;
        check_payload(src, self.config.ordinal, dst.len())?;
        if !dst.is_empty() {
            // SAFETY: `dptr` is the start of `src`'s device buffer of at
            // least `dst.len()` bytes on this engine's device (the
            // `DevicePayload` contract; ordinal and length checked above), kept alive by
            // the copy's own handle until its completion event is observed;
            // `dst` is pinned memory owned by the copy until then too, and
            // not touched by the host meanwhile. Raw bytes: any bits are
            // valid. The stream belongs to the context `dptr` lives in (the
            // device's primary context, libtorch's).
            unsafe { result::memcpy_dtoh_async(dst, dptr, self.stream.cu_stream()) }
                .map_err(driver("starting a device-to-host copy"))?;
        }
        self.stream
            .record_event(None)
            .map_err(driver("recording a copy's event"))
    }

    /// Issues a prefetch of `src` into `dst`; its completion event.
    fn issue_in(&self, src: &Pinned, dst: &P) -> Result<CudaEvent, String> {
        self.after_compute()?;
        let dptr: CUdeviceptr = dst.device_ptr();
        let bytes = src.bytes()?;
        check_payload(dst, self.config.ordinal, bytes.len())?;
        if !bytes.is_empty() {
            // SAFETY: `dptr` is the start of `dst`'s freshly allocated
            // device buffer of at least `bytes.len()` bytes on this engine's
            // device (the `DevicePayload` contract; checked above), which nothing reads
            // before the copy's event is observed, and which the copy's own
            // handle keeps alive until then; `bytes` is pinned memory held
            // (behind an `Arc`) by the copy until then and never written
            // while shared. The stream belongs to `dptr`'s context.
            unsafe { result::memcpy_htod_async(dptr, bytes, self.stream.cu_stream()) }
                .map_err(driver("starting a host-to-device copy"))?;
        }
        self.stream
            .record_event(None)
            .map_err(driver("recording a copy's event"))
    }

    /// When a copy submitted now may report at the earliest.
    fn report_time(&mut self) -> Instant {
        let now = Instant::now();
        let t = if self.config.fault_delay.is_zero() {
            now
        } else {
            now.max(self.last_report) + self.config.fault_delay
        };
        self.last_report = t;
        t
    }

    /// Whether the oldest copies have completed; applies those that have,
    /// in order, then the host runs that ended. Says whether any did.
    fn collect(&mut self) -> bool {
        let mut any = false;
        while let Some(f) = self.flight.front() {
            if Instant::now() < f.report_at {
                break;
            }
            let complete = match &f.done {
                None => Ok(true),
                Some(ev) => ev.try_is_complete(),
            };
            let f = match complete {
                Ok(false) => break,
                Ok(true) => self.flight.pop_front().expect("front"),
                Err(e) => {
                    let mut f = self.flight.pop_front().expect("front");
                    // The stream is in error: wait it out before the
                    // buffers go, then report the copy failed.
                    let _ = self.stream.synchronize();
                    f.failed = Some(format!("the copy failed on the device: {e}"));
                    f
                }
            };
            self.apply(f);
            any = true;
        }
        if any {
            // Runs that waited for those copies may go.
            self.dispatch_runs();
        }
        self.collect_runs() || any
    }

    /// A copy has completed (or failed): its result takes effect and what
    /// it held goes.
    fn apply(&mut self, f: InFlight<P>) {
        let now = self.ns(Instant::now());
        let s = f.storage;
        let state = match (f.held, f.failed) {
            (Held::Out { src, buf, meta }, None) => {
                drop(src);
                // The new copy replaces any older one; its bytes were
                // reserved at submission.
                let len = buf.len as u64;
                self.pool_used -= len;
                self.discard(s);
                self.pool_used += len;
                self.host.insert(
                    s,
                    HostBuf {
                        bytes: Arc::new(buf),
                        meta,
                    },
                );
                CopyState::Ended(now)
            }
            (Held::Out { src, buf, .. }, Some(why)) => {
                drop(src);
                self.pool_used -= buf.len as u64;
                self.keep_spare(buf);
                CopyState::Failed(why, s)
            }
            (Held::In { dst, src }, failed) => {
                if let Ok(buf) = Arc::try_unwrap(src) {
                    // The host copy was discarded while this read it.
                    self.keep_spare(buf);
                }
                let wanted = self.wanted_in.get(&s) == Some(&f.id);
                if wanted {
                    self.wanted_in.remove(&s);
                }
                // The compute stream waits for the copy before any
                // consumer: the executor hands the buffer out only once the
                // copy was seen complete, so this orders nothing new, but
                // keeps the order explicit on the device.
                let ordered = match (&f.done, failed) {
                    (Some(ev), None) => self
                        .compute
                        .wait(ev)
                        .map_err(driver("ordering the compute stream after a prefetch")),
                    (_, Some(why)) => Err(why),
                    (None, None) => Ok(()),
                };
                match ordered {
                    Ok(()) => {
                        if wanted {
                            self.device.insert(s, dst);
                        }
                        CopyState::Ended(now)
                    }
                    Err(why) => CopyState::Failed(why, s),
                }
            }
        };
        let outcome = match &state {
            CopyState::Failed(why, _) => Err(why.clone()),
            _ => Ok(()),
        };
        self.runs.copy_done(f.id, outcome);
        self.copies.set(f.id, state);
    }

    /// Host runs the host thread has ended: their buffers come back. Says
    /// whether any did.
    fn collect_runs(&mut self) -> bool {
        let mut any = false;
        while let Ok(end) = self.run_rx.try_recv() {
            let ns = self.ns(end.end);
            self.run_returned(end, ns);
            any = true;
        }
        any
    }

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

    /// Waits up to `timeout` for a copy or a host run to complete; says
    /// whether one did.
    pub fn wait(&mut self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        loop {
            if self.flight.is_empty() && self.runs.outstanding() == 0 {
                return false;
            }
            if self.collect() {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            std::thread::sleep((until - now).min(Duration::from_micros(50)));
        }
    }

    /// Waits for every copy and host run in flight to complete.
    pub fn drain(&mut self) {
        while !self.flight.is_empty() || self.runs.outstanding() > 0 {
            self.wait(Duration::from_millis(100));
        }
    }

    fn submit_out(
        &mut self,
        id: CopyId,
        s: StorageId,
        fail: bool,
    ) -> Result<InFlight<P>, (StorageId, String)> {
        // The storage's buffer, or the one a prefetch in flight fills (the
        // stream orders this copy after it).
        let src = match self.device.get(&s) {
            Some(p) => p.share(),
            None => match self.flight.iter().rev().find_map(|f| match &f.held {
                Held::In { dst, .. } if f.storage == s && self.wanted_in.get(&s) == Some(&f.id) => {
                    Some(dst.share())
                }
                _ => None,
            }) {
                Some(p) => p,
                None => return Err((s, format!("storage {} has no device data", s.0))),
            },
        };
        let len = src.byte_len();
        self.reserve(len as u64, s).map_err(|why| (s, why))?;
        let mut buf = match self.take_buffer(len) {
            Ok(b) => b,
            Err(why) => {
                self.pool_used -= len as u64;
                return Err((s, why));
            }
        };
        let (done, failed) = if fail {
            (None, Some("injected copy failure".to_string()))
        } else {
            match self.issue_out(&src, &mut buf) {
                Ok(ev) => (Some(ev), None),
                Err(why) => {
                    // Nothing may be in flight on `buf`: wait the stream out.
                    let _ = self.stream.synchronize();
                    (None, Some(why))
                }
            }
        };
        let meta = src.meta();
        Ok(InFlight {
            id,
            storage: s,
            done,
            report_at: self.report_time(),
            held: Held::Out { src, buf, meta },
            failed,
        })
    }

    fn submit_in(
        &mut self,
        id: CopyId,
        s: StorageId,
        fail: bool,
    ) -> Result<InFlight<P>, (StorageId, String)> {
        let Some(h) = self.host.get(&s) else {
            return Err((s, format!("storage {} has no host copy", s.0)));
        };
        let (src, meta) = (Arc::clone(&h.bytes), h.meta.clone());
        let dst = P::alloc(&meta, src.len).map_err(|why| (s, why))?;
        let (done, failed) = if fail {
            (None, Some("injected copy failure".to_string()))
        } else {
            match self.issue_in(&src, &dst) {
                Ok(ev) => (Some(ev), None),
                Err(why) => {
                    let _ = self.stream.synchronize();
                    (None, Some(why))
                }
            }
        };
        Ok(InFlight {
            id,
            storage: s,
            done,
            report_at: self.report_time(),
            held: Held::In { dst, src },
            failed,
        })
    }
}

impl<P: DevicePayload> CudaCopies<P> {
    /// Issues copy `id` on the stream (or fails it, for want of data or
    /// room).
    fn start(&mut self, id: CopyId, copy: Copy, fail: bool) {
        let s = copy.storage;
        let flight = match copy.dir {
            Dir::ToHost => self.submit_out(id, s, fail),
            Dir::ToDevice => self.submit_in(id, s, fail),
        };
        match flight {
            Ok(f) => {
                self.copies.set(
                    id,
                    CopyState::Pending {
                        dir: copy.dir,
                        storage: s,
                    },
                );
                self.flight.push_back(f);
            }
            Err((s, why)) => {
                if self.wanted_in.get(&s) == Some(&id) {
                    self.wanted_in.remove(&s);
                }
                // A host run may wait for it (a prefetch that was deferred).
                self.runs.copy_done(id, Err(why.clone()));
                self.copies.set(id, CopyState::Failed(why, s));
            }
        }
    }
}

impl<P: DevicePayload> RunSite for CudaCopies<P> {
    type Meta = P::Meta;
    type Buf = HostBuf<P::Meta>;
    type Done = CudaRunEnd<P::Meta>;

    run_site_fields!(CudaCopies, HostBuf<P::Meta>, CudaRunEnd<P::Meta>);

    fn copies_in_flight(&self) -> Vec<(CopyId, StorageId)> {
        self.flight.iter().map(|f| (f.id, f.storage)).collect()
    }
}

impl<P: DevicePayload> CopyEngine for CudaCopies<P> {
    fn submit(&mut self, copy: Copy) -> CopyId {
        // `copy.not_before` needs no wait here: the executor submits at the
        // fire time, and a copy after a prefetch is ordered on the stream.
        self.submit_copy(copy, self.config.fail_every)
    }

    fn run_on_host(&mut self, run: HostRun) -> CopyId {
        self.submit_run(run, "CUDA copy engine")
    }

    fn poll(&mut self, now: u64) {
        self.copies.polled(now);
        self.collect();
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

impl<P: DevicePayload> Drop for CudaCopies<P> {
    fn drop(&mut self) {
        // Copies in flight hold device and pinned buffers: wait them out.
        let _ = self.stream.synchronize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload that says where it is and how long it is, never copied:
    /// these tests run without a GPU.
    struct Claims(Option<usize>, usize);

    impl Payload for Claims {
        type Meta = ();
        fn meta(&self) {}
        fn share(&self) -> Self {
            Claims(self.0, self.1)
        }
        fn byte_len(&self) -> usize {
            self.1
        }
        fn read(&self, _: &mut [u8]) -> Result<(), String> {
            Err("no bytes".into())
        }
        fn write(_: &(), _: &[u8]) -> Result<Self, String> {
            Err("no bytes".into())
        }
    }

    // SAFETY: never handed to the driver: it is on no device or reaches
    // only `check_payload` and engines that fail to start, and `alloc`
    // always fails.
    unsafe impl DevicePayload for Claims {
        fn device_ptr(&self) -> u64 {
            0
        }
        fn device_ordinal(&self) -> Option<usize> {
            self.0
        }
        fn alloc(_: &(), _: usize) -> Result<Self, String> {
            Err("no device".into())
        }
    }

    #[test]
    fn a_buffer_on_another_device_or_too_short_is_refused_before_the_driver_sees_it() {
        assert_eq!(check_payload(&Claims(Some(0), 64), 0, 64), Ok(()));
        let e = check_payload(&Claims(Some(1), 64), 0, 64).unwrap_err();
        assert!(
            e.contains("CUDA device 1") && e.contains("serves device 0"),
            "{e}"
        );
        let e = check_payload(&Claims(None, 64), 0, 64).unwrap_err();
        assert!(e.contains("not on a CUDA device"), "{e}");
        let e = check_payload(&Claims(Some(0), 32), 0, 64).unwrap_err();
        assert!(e.contains("has 32 bytes") && e.contains("moves 64"), "{e}");
    }

    #[test]
    fn without_a_driver_or_device_the_engine_is_a_clear_error_not_a_panic() {
        // A device no machine has: an error on every machine.
        let far = CudaConfig {
            ordinal: 1 << 20,
            ..CudaConfig::default()
        };
        let err = CudaCopies::<Claims>::new(far, Instant::now()).expect_err("no such device");
        let msg = err.to_string();
        assert!(
            msg.contains("no CUDA driver library") || msg.contains("does not exist"),
            "{msg}"
        );
        match cuda_available(0) {
            Ok(()) => eprintln!("SKIPPED (the no-driver half): this machine has a CUDA device"),
            Err(why) => {
                let err = CudaCopies::<Claims>::new(CudaConfig::default(), Instant::now())
                    .expect_err("no GPU here");
                assert_eq!(err, why);
            }
        }
    }
}
