//! Op latencies on a CUDA device, from CUDA events on the compute stream.
//!
//! A kernel launch returns before the kernel runs, so the wall clock around
//! an op measures its launch, not its work. [`CudaOpClock`] records a
//! timing event on the compute stream (libtorch's legacy default stream)
//! before and after each op; at the end of an iteration it waits for the
//! last one and reads each op's time between its two events. A wait the
//! compute stream makes for a prefetch is enqueued before the op's start
//! event, so a late copy does not count as the op's time.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use crate::cuda::{cuda_available, driver};

/// Per-op times on CUDA device `ordinal`'s compute stream (see the module).
pub struct CudaOpClock {
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    /// Events whose times were read, to record again.
    spare: Vec<CudaEvent>,
    /// This iteration's ops: (op index, start event, end event).
    marks: Vec<(usize, CudaEvent, CudaEvent)>,
    /// The op begun and not yet ended, with its start event.
    open: Option<(usize, CudaEvent)>,
}

impl std::fmt::Debug for CudaOpClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaOpClock")
            .field("marks", &self.marks.len())
            .finish_non_exhaustive()
    }
}

impl CudaOpClock {
    /// A clock on device `ordinal`; a clear error without a driver or
    /// without such a device.
    pub fn new(ordinal: usize) -> Result<CudaOpClock, String> {
        cuda_available(ordinal).map_err(|e| e.to_string())?;
        let ctx = CudaContext::new(ordinal).map_err(driver("opening the CUDA context"))?;
        let compute = ctx.default_stream();
        Ok(CudaOpClock {
            ctx,
            compute,
            spare: Vec::new(),
            marks: Vec::new(),
            open: None,
        })
    }

    fn record(&mut self) -> Result<CudaEvent, String> {
        let e = match self.spare.pop() {
            Some(e) => e,
            None => self
                .ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(driver("creating a timing event"))?,
        };
        e.record(&self.compute)
            .map_err(driver("recording a timing event on the compute stream"))?;
        Ok(e)
    }

    /// Op `op` is about to be launched on the compute stream.
    pub fn begin(&mut self, op: usize) -> Result<(), String> {
        let start = self.record()?;
        if let Some((_, stale)) = self.open.replace((op, start)) {
            self.spare.push(stale);
        }
        Ok(())
    }

    /// The op begun last has been launched.
    pub fn end(&mut self) -> Result<(), String> {
        let Some((op, start)) = self.open.take() else {
            return Ok(());
        };
        let end = self.record()?;
        self.marks.push((op, start, end));
        Ok(())
    }

    /// Waits for the ops timed since the last call and returns each one's
    /// time in ns, indexed by op (`n` ops; an op timed twice, recomputed,
    /// keeps its last time; an op not timed is `None`).
    pub fn take(&mut self, n: usize) -> Result<Vec<Option<u64>>, String> {
        let mut out = vec![None; n];
        if let Some((_, _, last)) = self.marks.last() {
            last.synchronize()
                .map_err(driver("waiting for the compute stream"))?;
        }
        for (op, start, end) in self.marks.drain(..) {
            let ms = start
                .elapsed_ms(&end)
                .map_err(driver("reading a timing event"))?;
            if let Some(slot) = out.get_mut(op) {
                *slot = Some((f64::from(ms.max(0.0)) * 1e6).round() as u64);
            }
            self.spare.push(start);
            self.spare.push(end);
        }
        Ok(out)
    }
}
