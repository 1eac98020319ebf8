//! The copy-engine trait: a copy is submitted, then learned of. Engines
//! differ in what moves (nothing, in virtual time; real bytes, on a copy
//! thread or a CUDA stream), never in what the executor may assume.

use std::collections::HashMap;

use tensile_graph::{OpId, StorageId};

/// Which way a copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    /// Device to host: a swap-out.
    ToHost,
    /// Host to device: a prefetch or a swap-in on demand.
    ToDevice,
}

/// One copy of a storage's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy {
    pub dir: Dir,
    pub storage: StorageId,
    pub bytes: u64,
    /// The copy may not start before this time: the end of the copy that
    /// brings the data (a swap-out right after a prefetch), or its fire
    /// time. A real engine orders such copies on its queue instead.
    pub not_before: u64,
}

/// An op that runs on the host over host copies of its storages (an
/// optimizer update kept on the host CPU), learned of like a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRun {
    pub op: OpId,
    /// The storages whose host copies it reads or writes, each once.
    pub storages: Vec<StorageId>,
    /// The bytes it moves through host memory (its time on a virtual host).
    pub bytes: u64,
    /// It starts once these copies (the swap-outs that bring its inputs to
    /// the host) have completed. If one fails, the run fails before it
    /// starts, having written nothing (the executor submits it again).
    pub after: Vec<CopyId>,
    /// Nor before this time.
    pub not_before: u64,
}

/// A submitted copy, unique within its engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CopyId(pub u64);

/// What an engine knows of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyStatus {
    /// The copy ends (or ended) at this time. Virtual time knows this at
    /// submission; a real engine once the copy has completed.
    Ends(u64),
    /// In flight, end unknown: look again after [`CopyEngine::poll`].
    Pending,
    /// The copy failed: the destination holds nothing usable, the source is
    /// untouched.
    Failed(CopyError),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CopyError {
    #[error("copy {id:?} of storage {storage} failed: {why}")]
    Failed {
        id: CopyId,
        storage: u32,
        why: String,
    },
    #[error("copy {0:?} is not known to this engine")]
    Unknown(CopyId),
}

/// Carries out copies between device and host, in submission order per
/// direction (or on one queue, half duplex).
pub trait CopyEngine {
    /// Queues `copy`; its completion is learned later.
    fn submit(&mut self, copy: Copy) -> CopyId;
    /// Takes note of what has completed by `now` (real engines look at
    /// their copy thread or stream; virtual time has nothing to do).
    fn poll(&mut self, now: u64);
    /// Runs `run` on the host, after the copies it names and after the
    /// host runs submitted before it (one after another, in submission
    /// order); its end is learned as a copy's. While it runs, the host
    /// copies of its storages stay, even if [`CopyEngine::discard_host`]
    /// comes meanwhile. An engine that cannot run host ops reports the
    /// run failed, saying why.
    fn run_on_host(&mut self, run: HostRun) -> CopyId;
    /// What is known of `id` after the last [`CopyEngine::poll`].
    fn status(&self, id: CopyId) -> CopyStatus;
    /// The executor is done with `id`: its bookkeeping may go. Called only
    /// once the copy has ended or failed.
    fn forget(&mut self, id: CopyId);
    /// The storage's host copy is stale (its data changed on the device,
    /// or its iteration ended): an engine that holds host buffers gives it
    /// back. Never called while a swap-out of the storage is in flight.
    fn discard_host(&mut self, _storage: StorageId) {}
    /// The executor freed the storage's device buffer: an engine that holds
    /// device buffers lets go of it (a copy in flight keeps its own
    /// handle), and a prefetch into it, if one is still running, is no
    /// longer wanted. Called in order with [`CopyEngine::submit`].
    fn device_freed(&mut self, _storage: StorageId) {}
}

/// Where a real engine's copy stands.
#[derive(Debug)]
pub(crate) enum CopyState {
    Pending {
        dir: Dir,
        storage: StorageId,
    },
    /// Ended at this time (ns on the engine's clock).
    Ended(u64),
    Failed(String, StorageId),
}

/// A real engine's record of its copies and what the executor is told of
/// them: one for the host and CUDA engines alike.
#[derive(Debug, Default)]
pub(crate) struct CopyTable {
    copies: HashMap<CopyId, CopyState>,
    /// The latest `now` given to [`CopyEngine::poll`].
    polled: u64,
}

impl CopyTable {
    pub(crate) fn set(&mut self, id: CopyId, state: CopyState) {
        self.copies.insert(id, state);
    }

    pub(crate) fn get(&self, id: CopyId) -> Option<&CopyState> {
        self.copies.get(&id)
    }

    pub(crate) fn len(&self) -> usize {
        self.copies.len()
    }

    /// Takes note of a poll at `now`.
    pub(crate) fn polled(&mut self, now: u64) {
        self.polled = self.polled.max(now);
    }

    /// [`CopyEngine::status`].
    pub(crate) fn status(&self, id: CopyId) -> CopyStatus {
        match self.copies.get(&id) {
            // Observed at a poll: it ended by then, whatever the engine's
            // clock read a moment later.
            Some(CopyState::Ended(t)) => CopyStatus::Ends((*t).min(self.polled)),
            Some(CopyState::Pending { .. }) => CopyStatus::Pending,
            Some(CopyState::Failed(why, s)) => CopyStatus::Failed(CopyError::Failed {
                id,
                storage: s.0,
                why: why.clone(),
            }),
            None => CopyStatus::Failed(CopyError::Unknown(id)),
        }
    }

    /// [`CopyEngine::forget`]: only ended copies may be forgotten; one in
    /// flight is kept so that its end is still applied.
    pub(crate) fn forget(&mut self, id: CopyId) {
        if let Some(CopyState::Pending { dir, storage }) = self.copies.get(&id) {
            debug_assert!(
                false,
                "copy {id:?} ({dir:?}, {storage:?}) forgotten in flight"
            );
            return;
        }
        self.copies.remove(&id);
    }
}
