//! Activity analysis and the vanilla footprint of one iteration.
//!
//! Memory belongs to *storages*: a tensor and every view or in-place version
//! of it share one block, counted once. A storage is allocated when the op
//! producing its root starts (its TGA) and, unless it is persistent, released
//! when the last op touching any of its tensors ends (after its last TUA) —
//! what a framework that frees at last use does. Persistent storage
//! (parameters, buffers, optimizer state) and outputs the user reads (the
//! loss) are never released inside the iteration.

use crate::ir::{Graph, OpId, TensorId, TensorKind};

/// Index of a storage in [`Liveness::storages`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StorageId(pub u32);

impl StorageId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One block of memory: a root tensor and all its aliases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Storage {
    pub root: TensorId,
    pub bytes: u64,
    /// Lives across iterations.
    pub persistent: bool,
    /// The op whose start allocates it; `None`: resident at iteration start.
    pub born: Option<OpId>,
    /// The op after whose end it is released; `None`: kept to the end of the
    /// iteration (persistent storage, outputs).
    pub freed_after: Option<OpId>,
    /// Only host ops touch it (an optimizer's state kept on the host): it
    /// never takes device memory.
    pub host_only: bool,
    /// A host op writes it: its host copy is the one the update keeps
    /// current, and its device copy, if device ops read it, is a copy of
    /// that (never copied out, dropped at the update, fetched back).
    pub host_master: bool,
}

/// The result of activity analysis over one graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Liveness {
    /// The storage of each tensor, indexed by tensor id.
    pub storage_of: Vec<StorageId>,
    pub storages: Vec<Storage>,
    /// Storages allocated at the start of each op, indexed by op id.
    pub allocs: Vec<Vec<StorageId>>,
    /// Storages released after each op ends, indexed by op id.
    pub frees: Vec<Vec<StorageId>>,
}

impl Liveness {
    /// Analyses `graph`: one pass over the ops, O(ops + operands).
    pub fn analyze(graph: &Graph) -> Liveness {
        let mut storage_of = vec![StorageId(u32::MAX); graph.tensors().len()];
        let mut storages = Vec::new();
        for t in graph.tensors() {
            if graph.storage_root(t.id) == t.id {
                storage_of[t.id.index()] = StorageId(storages.len() as u32);
                storages.push(Storage {
                    root: t.id,
                    bytes: t.bytes,
                    persistent: graph.is_persistent(t.id),
                    born: graph.producer(t.id),
                    freed_after: None, // set below, once the last use is known
                    host_only: true,   // cleared below by a device op's touch
                    host_master: false,
                });
            }
        }
        for t in graph.tensors() {
            storage_of[t.id.index()] = storage_of[graph.storage_root(t.id).index()];
        }
        // Ops run in id order, so the last op to touch a storage is the max id.
        let mut last: Vec<Option<OpId>> = storages.iter().map(|s| s.born).collect();
        for op in graph.ops() {
            for &t in op.inputs.iter().chain(&op.outputs) {
                let s = storage_of[t.index()].index();
                last[s] = Some(op.id);
                if !op.on_host() {
                    storages[s].host_only = false;
                }
            }
            if op.on_host() {
                for &t in &op.outputs {
                    storages[storage_of[t.index()].index()].host_master = true;
                }
            }
        }
        // A storage no op touches is on the device (an unused input).
        for s in storages.iter_mut() {
            s.host_only &= s.host_master;
        }
        let n_ops = graph.ops().len();
        let mut allocs = vec![Vec::new(); n_ops];
        let mut frees = vec![Vec::new(); n_ops];
        for (i, s) in storages.iter_mut().enumerate() {
            let id = StorageId(i as u32);
            if let Some(born) = s.born {
                allocs[born.index()].push(id);
            }
            let kept = s.persistent || graph.tensor(s.root).kind == TensorKind::Output;
            s.freed_after = if kept { None } else { last[i] };
            if let Some(op) = s.freed_after {
                frees[op.index()].push(id);
            }
        }
        Liveness {
            storage_of,
            storages,
            allocs,
            frees,
        }
    }

    pub fn storage(&self, tensor: TensorId) -> &Storage {
        &self.storages[self.storage_of[tensor.index()].index()]
    }

    /// Bytes resident on the device when the iteration starts (inputs and
    /// persistent storage; not what lives on the host only).
    pub fn bytes_at_start(&self) -> u64 {
        self.storages
            .iter()
            .filter(|s| s.born.is_none() && !s.host_only)
            .map(|s| s.bytes)
            .sum()
    }

    /// Bytes of device storage that lives across iterations (not what
    /// lives on the host only).
    pub fn persistent_bytes(&self) -> u64 {
        self.storages
            .iter()
            .filter(|s| s.persistent && !s.host_only)
            .map(|s| s.bytes)
            .sum()
    }

    /// Bytes of storage only host ops touch (an optimizer's state kept on
    /// the host).
    pub fn host_only_bytes(&self) -> u64 {
        self.storages
            .iter()
            .filter(|s| s.host_only)
            .map(|s| s.bytes)
            .sum()
    }

    /// The footprint of a framework that frees every storage after its last use.
    pub fn vanilla_footprint(&self) -> Footprint {
        self.footprint(true)
    }

    /// The largest working set of any one device op of `graph`: the
    /// storages it reads and writes, together. No plan can run the op with
    /// less on the device, so this (plus fixed memory) bounds every plan's
    /// peak. A host op needs nothing on the device.
    pub fn largest_working_set(&self, graph: &Graph) -> u64 {
        graph
            .ops()
            .iter()
            .filter(|op| !op.on_host())
            .map(|op| {
                let mut seen: Vec<usize> = op
                    .inputs
                    .iter()
                    .chain(&op.outputs)
                    .map(|t| self.storage_of[t.index()].index())
                    .collect();
                seen.sort_unstable();
                seen.dedup();
                seen.iter().map(|&s| self.storages[s].bytes).sum::<u64>()
            })
            .max()
            .unwrap_or(0)
    }

    /// The footprint of a framework that frees nothing inside an iteration
    /// (what the TENSILE authors' executors measured as vanilla).
    pub fn keep_all_footprint(&self) -> Footprint {
        self.footprint(false)
    }

    fn footprint(&self, free_at_last_use: bool) -> Footprint {
        let at_start = self.bytes_at_start();
        let mut resident = at_start;
        let mut during = Vec::with_capacity(self.allocs.len());
        let (mut peak, mut peak_op) = (at_start, None);
        for (k, (allocs, frees)) in self.allocs.iter().zip(&self.frees).enumerate() {
            resident += allocs
                .iter()
                .map(|s| self.storages[s.index()].bytes)
                .sum::<u64>();
            during.push(resident);
            if resident > peak {
                peak = resident;
                peak_op = Some(OpId(k as u32));
            }
            if free_at_last_use {
                resident -= frees
                    .iter()
                    .map(|s| self.storages[s.index()].bytes)
                    .sum::<u64>();
            }
        }
        Footprint {
            at_start,
            peak,
            peak_op,
            during,
        }
    }
}

/// Bytes resident along one iteration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footprint {
    /// Resident when the iteration starts.
    pub at_start: u64,
    /// The most ever resident.
    pub peak: u64,
    /// The first op during which the peak is reached (`None`: at the start).
    pub peak_op: Option<OpId>,
    /// Resident while each op runs: its inputs, its outputs and all else alive.
    pub during: Vec<u64>,
}
