//! The real kernels: `tensile-kernels`' [`Program`] (every ATen op through
//! one boxed dispatch path) as the worker's [`Kernels`], its initial values
//! as the worker's, and the worker's parameters saved through it.

use std::path::Path;

use tch::Tensor;
use tensile_graph::{Graph, OpId, TensorId};
use tensile_kernels::{KernelError, Program, Values};

use crate::runtime::Kernels;

impl Kernels for Program {
    fn run(&mut self, op: OpId, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        Program::run(self, op, inputs).map_err(|e| e.to_string())
    }
}

/// The initial tensors in `values` (those no op produces), for
/// [`crate::Worker::new`].
pub fn initial_of(graph: &Graph, values: &Values) -> Vec<(TensorId, Tensor)> {
    graph
        .tensors()
        .iter()
        .filter(|t| graph.producer(t.id).is_none())
        .filter_map(|t| values.get(t.id).map(|v| (t.id, v.shallow_clone())))
        .collect()
}

/// Writes the parameters and buffers among `values` (from
/// [`crate::Worker::persistent_values`]) to a safetensors file, by name.
pub fn save_params(
    graph: &Graph,
    values: Vec<(TensorId, Tensor)>,
    path: &Path,
) -> Result<(), KernelError> {
    let mut all = Values::empty(graph.tensors().len());
    for (t, v) in values {
        all.set(t, v);
    }
    tensile_kernels::save_params(graph, &all, path)
}
