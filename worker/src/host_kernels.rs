//! Ops the graph places on the host ([`tensile_graph::Placement::Host`]:
//! optimizer updates kept on the host CPU, with their state) run on the
//! copy engine's host thread (the host engine's or the CUDA engine's), over
//! the host copies of their storages (pinned, on the CUDA engine).
//! The engine hands the kernel each storage's bytes ([`HostBytes`]); this
//! module views them as CPU tensors without copying
//! ([`tensile_kernels::with_cpu_tensors`]), each graph tensor at its
//! [`Layout`] in its storage, and runs the op through [`Kernels`] (the
//! real ones: a CPU [`tensile_kernels::Program`], whose fused optimizers
//! keep their step counters as on the device). The update writes the
//! parameter's and the state's host bytes in place.
//!
//! The layouts come from the worker, which learns them as it installs
//! initial values and as kernels produce tensors (a gradient's, say):
//! [`HostLayouts`] is what the two threads share.

use std::sync::{Arc, Mutex, PoisonError};

use tch::Tensor;
use tensile_graph::{Graph, Liveness, OpId, StorageId, TensorId};
use tensile_swap_executor::{HostBytes, HostKernel};

use crate::error::WorkerError;
use crate::payload::{Flat, FlatMeta, Layout};
use crate::runtime::Kernels;

/// The layouts of the tensors host ops read, by tensor id: written by the
/// worker's thread, read by the engine's host thread when a run starts
/// (after the kernel that produced its input has run).
#[derive(Debug, Clone)]
pub(crate) struct HostLayouts {
    /// Which tensors a host op reads.
    wanted: Arc<Vec<bool>>,
    layouts: Arc<Mutex<Vec<Option<Layout>>>>,
}

impl HostLayouts {
    /// `None` for a graph without host ops.
    pub(crate) fn new(graph: &Graph) -> Option<HostLayouts> {
        if !graph.has_host_ops() {
            return None;
        }
        let n = graph.tensors().len();
        let mut wanted = vec![false; n];
        for op in graph.ops().iter().filter(|o| o.on_host()) {
            for &t in &op.inputs {
                wanted[t.index()] = true;
            }
        }
        Some(HostLayouts {
            wanted: Arc::new(wanted),
            layouts: Arc::new(Mutex::new(vec![None; n])),
        })
    }

    /// Tensor `t` lies at `layout` in its storage.
    pub(crate) fn note(&self, t: TensorId, layout: &Layout) {
        if self.wanted.get(t.index()).copied().unwrap_or(false) {
            let mut all = self.layouts.lock().unwrap_or_else(PoisonError::into_inner);
            all[t.index()] = Some(layout.clone());
        }
    }

    fn get(&self, t: TensorId) -> Option<Layout> {
        let all = self.layouts.lock().unwrap_or_else(PoisonError::into_inner);
        all.get(t.index()).cloned().flatten()
    }
}

/// A host op's operands: its inputs with their storages, and for each
/// output the input it updates in place (every host op's outputs are such
/// updates: see `tensile_graph::validate`).
#[derive(Debug)]
struct HostOp {
    inputs: Vec<(TensorId, StorageId)>,
    updates: Vec<Option<usize>>,
}

/// The engine's host kernel: `K` run over CPU tensors on the host bytes.
pub(crate) struct HostOps<K> {
    kernels: K,
    /// By op id; `None` for device ops.
    ops: Vec<Option<HostOp>>,
    layouts: HostLayouts,
}

impl<K> HostOps<K> {
    pub(crate) fn new(graph: &Graph, live: &Liveness, kernels: K, layouts: HostLayouts) -> Self {
        let ops = graph
            .ops()
            .iter()
            .map(|op| {
                op.on_host().then(|| HostOp {
                    inputs: op
                        .inputs
                        .iter()
                        .map(|&t| (t, live.storage_of[t.index()]))
                        .collect(),
                    updates: (0..op.outputs.len())
                        .map(|i| op.alias_of_output(i).map(|a| a.input as usize))
                        .collect(),
                })
            })
            .collect();
        HostOps {
            kernels,
            ops,
            layouts,
        }
    }
}

impl<K: Kernels + Send + 'static> HostKernel<FlatMeta> for HostOps<K> {
    fn run(&mut self, op: OpId, bufs: &mut [HostBytes<'_, FlatMeta>]) -> Result<(), String> {
        let Some(info) = self.ops.get(op.index()).and_then(Option::as_ref) else {
            return Err(format!("op {} is not a host op of this graph", op.0));
        };
        let mut at = Vec::with_capacity(info.inputs.len());
        for &(t, s) in &info.inputs {
            let layout = self
                .layouts
                .get(t)
                .ok_or_else(|| format!("tensor {} was never produced", t.0))?;
            let i = bufs
                .iter()
                .position(|b| b.storage == s)
                .ok_or_else(|| format!("storage {} of tensor {} was not handed over", s.0, t.0))?;
            at.push((i, layout));
        }
        let kernels = &mut self.kernels;
        let mut lent: Vec<(&mut [u8], tch::Kind)> = bufs
            .iter_mut()
            .map(|b| (&mut *b.bytes, b.meta.kind))
            .collect();
        tensile_kernels::with_cpu_tensors(&mut lent, |flats| {
            let inputs = at
                .iter()
                .map(|(i, layout)| Flat(flats[*i].shallow_clone()).derive(layout))
                .collect::<Result<Vec<Tensor>, String>>()?;
            let refs: Vec<&Tensor> = inputs.iter().collect();
            let outs = kernels.run(op, &refs)?;
            if outs.len() != info.updates.len() {
                return Err(format!(
                    "{} outputs, the graph has {}",
                    outs.len(),
                    info.updates.len()
                ));
            }
            for (out, update) in outs.iter().zip(&info.updates) {
                // A kernel that returns its update in a new tensor: the
                // host copy is where it must land.
                if let Some(i) = *update
                    && out.data_ptr() != inputs[i].data_ptr()
                {
                    inputs[i]
                        .shallow_clone()
                        .f_copy_(out)
                        .map_err(|e| format!("writing output into its input {i}: {e}"))?;
                }
            }
            Ok(())
        })?
    }
}

/// The first host op of a graph, for a worker that has no host kernels
/// installed.
pub(crate) fn no_kernels(graph: &Graph) -> Result<(), WorkerError> {
    match graph.ops().iter().find(|o| o.on_host()) {
        Some(op) => Err(WorkerError::NoHostKernels {
            op: op.id.0,
            name: op.name.clone(),
        }),
        None => Ok(()),
    }
}
