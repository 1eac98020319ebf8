//! The tensors of an iteration: the initial ones (seeded, or loaded from
//! safetensors by name), the reference training loop, and saving parameters.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use tch::{Device, Kind, Tensor};
use tensile_graph::{AliasKind, DType, Graph, TensorId, TensorKind};

use crate::{KernelError, Program};

/// Tensors indexed by [`TensorId`]: before an iteration the initial ones
/// (inputs, parameters, buffers, optimizer state); after it, the same ids
/// hold the new versions of the persistent ones, and the graph's outputs
/// (the loss) are set too.
#[derive(Debug)]
pub struct Values {
    tensors: Vec<Option<Tensor>>,
}

impl Values {
    /// No tensor set, room for `n`.
    pub fn empty(n: usize) -> Values {
        Values {
            tensors: (0..n).map(|_| None).collect(),
        }
    }

    pub fn get(&self, id: TensorId) -> Option<&Tensor> {
        self.tensors.get(id.index()).and_then(Option::as_ref)
    }

    /// Sets tensor `id` (ignored past the end).
    pub fn set(&mut self, id: TensorId, t: Tensor) {
        if let Some(slot) = self.tensors.get_mut(id.index()) {
            *slot = Some(t);
        }
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
}

/// The libtorch dtype of a graph dtype.
pub fn kind_of(d: DType) -> Kind {
    match d {
        DType::F32 => Kind::Float,
        DType::F16 => Kind::Half,
        DType::BF16 => Kind::BFloat16,
        DType::F64 => Kind::Double,
        DType::I64 => Kind::Int64,
        DType::I32 => Kind::Int,
        DType::I16 => Kind::Int16,
        DType::I8 => Kind::Int8,
        DType::U8 => Kind::Uint8,
        DType::Bool => Kind::Bool,
    }
}

fn shape_of(t: &tensile_graph::Tensor) -> Vec<i64> {
    t.shape.iter().map(|&d| d as i64).collect()
}

/// Tensors no op produces: the ones an iteration starts from.
fn initial_ids(graph: &Graph) -> impl Iterator<Item = &tensile_graph::Tensor> + '_ {
    graph
        .tensors()
        .iter()
        .filter(|t| t.kind.is_initial() && graph.producer(t.id).is_none())
}

/// Exclusive upper bound of the values of an integer input, from what reads
/// it: an embedding's row count, a classifier's class count; 2 otherwise.
fn int_bound(graph: &Graph, id: TensorId) -> i64 {
    let mut bound = i64::MAX;
    for op in graph.ops() {
        let Some(pos) = op.inputs.iter().position(|&t| t == id) else {
            continue;
        };
        let other = |k: usize| op.inputs.get(k).map(|&t| graph.tensor(t).shape.clone());
        let b = if op.op_type.contains("embedding") {
            // embedding(weight, indices): the weight's rows.
            other(if pos == 0 { 1 } else { 0 }).and_then(|s| s.first().copied())
        } else if op.op_type.contains("nll_loss") || op.op_type.contains("cross_entropy") {
            // nll_loss(self [N, C], target): the classes.
            other(0).and_then(|s| s.get(1).or(s.first()).copied())
        } else {
            None
        };
        if let Some(b) = b {
            bound = bound.min(b as i64);
        }
    }
    if bound == i64::MAX { 2 } else { bound.max(1) }
}

/// A seeded value for one initial tensor (made on the CPU, so that a seed
/// gives the same numbers on every device).
fn seeded(graph: &Graph, t: &tensile_graph::Tensor) -> Tensor {
    let shape = shape_of(t);
    let kind = kind_of(t.dtype);
    let opts = (kind, Device::Cpu);
    let name = t.name.as_str();
    match t.kind {
        TensorKind::Parameter if shape.len() >= 2 && name.contains("embedding") => {
            Tensor::randn(&shape, opts) * 0.02
        }
        TensorKind::Parameter if shape.len() >= 2 => {
            // PyTorch's default for Linear and Conv: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
            let fan_in: i64 = shape[1..].iter().product();
            let b = 1.0 / (fan_in.max(1) as f64).sqrt();
            Tensor::rand(&shape, opts) * (2.0 * b) - b
        }
        // Norm weights start at one, biases at zero.
        TensorKind::Parameter if name.ends_with("weight") => Tensor::ones(&shape, opts),
        TensorKind::Buffer if name.ends_with("running_var") => Tensor::ones(&shape, opts),
        TensorKind::Input if t.dtype.is_float() => Tensor::randn(&shape, opts),
        TensorKind::Input if t.dtype != DType::Bool => {
            Tensor::randint(int_bound(graph, t.id), &shape, opts)
        }
        _ => Tensor::zeros(&shape, opts),
    }
}

fn load(path: &Path) -> Result<BTreeMap<String, Tensor>, KernelError> {
    let named = Tensor::read_safetensors(path).map_err(|e| KernelError::File {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok(named.into_iter().collect())
}

/// Takes tensor `t`'s value from `file` when there, checking shape and dtype.
fn take(
    file: &mut BTreeMap<String, Tensor>,
    path: &Path,
    t: &tensile_graph::Tensor,
) -> Result<Option<Tensor>, KernelError> {
    let Some(v) = file.remove(&t.name) else {
        return Ok(None);
    };
    let bad = |reason: String| KernelError::File {
        path: path.to_path_buf(),
        reason,
    };
    if v.size() != shape_of(t) {
        return Err(bad(format!(
            "tensor {:?} has shape {:?}, the graph says {:?}",
            t.name,
            v.size(),
            t.shape
        )));
    }
    if v.kind() != kind_of(t.dtype) {
        return Err(bad(format!(
            "tensor {:?} is {:?}, the graph says {}",
            t.name,
            v.kind(),
            t.dtype.name()
        )));
    }
    Ok(Some(v))
}

/// The initial tensors of `graph` (inputs, parameters, buffers, optimizer
/// state) on `device`: seeded (`tch::manual_seed(seed)`, then in graph
/// order; other threads' random ops wait meanwhile), except parameters (and buffers or optimizer state, when present)
/// read from `init_params` by name, and graph inputs read from `inputs` by
/// name. Every parameter must be in `init_params` and every input in
/// `inputs` when given; a name there that is no such tensor is an error.
pub fn initial_values(
    graph: &Graph,
    device: Device,
    seed: i64,
    init_params: Option<&Path>,
    inputs: Option<&Path>,
) -> Result<Values, KernelError> {
    let _turn = crate::rng_turn();
    tch::manual_seed(seed);
    let mut params = init_params.map(load).transpose()?;
    let mut batch = inputs.map(load).transpose()?;
    let mut values = Values::empty(graph.tensors().len());
    for t in initial_ids(graph) {
        let mut v = seeded(graph, t);
        let source = match t.kind {
            TensorKind::Input => batch.as_mut().zip(inputs),
            _ => params.as_mut().zip(init_params),
        };
        if let Some((file, path)) = source {
            match take(file, path, t)? {
                Some(loaded) => v = loaded,
                None if matches!(t.kind, TensorKind::Input | TensorKind::Parameter) => {
                    return Err(KernelError::File {
                        path: path.to_path_buf(),
                        reason: format!("no tensor named {:?} ({})", t.name, t.kind.name()),
                    });
                }
                None => {}
            }
        }
        let v = v.f_to_device(device).map_err(|e| KernelError::Device {
            device,
            reason: e.to_string(),
        })?;
        values.set(t.id, v);
    }
    for (file, path) in [(params, init_params), (batch, inputs)] {
        if let (Some(file), Some(path)) = (file, path)
            && let Some(name) = file.keys().next()
        {
            return Err(KernelError::File {
                path: path.to_path_buf(),
                reason: format!(
                    "tensor {name:?} is no initial tensor of graph {:?}",
                    graph.name()
                ),
            });
        }
    }
    Ok(values)
}

/// For each tensor, the last op that reads it.
fn last_reads(graph: &Graph) -> Vec<Option<usize>> {
    let mut last = vec![None; graph.tensors().len()];
    for op in graph.ops() {
        for &t in &op.inputs {
            last[t.index()] = Some(op.id.index());
        }
    }
    last
}

/// The newest in-place version of each tensor at the end of the iteration.
fn final_versions(graph: &Graph) -> Vec<TensorId> {
    let mut newest: Vec<TensorId> = graph.tensors().iter().map(|t| t.id).collect();
    for op in graph.ops() {
        for a in &op.aliases {
            if a.kind == AliasKind::InPlace {
                newest[op.inputs[a.input as usize].index()] = op.outputs[a.output as usize];
            }
        }
    }
    // Follow chains: a version overwritten again.
    (0..newest.len())
        .map(|i| {
            let mut t = newest[i];
            let mut steps = 0;
            while newest[t.index()] != t && steps < newest.len() {
                t = newest[t.index()];
                steps += 1;
            }
            t
        })
        .collect()
}

/// The reference loop: one iteration, ops back to back in id order, no
/// executor, no plan. Reads the initial tensors from `values`; afterwards each
/// persistent initial tensor (parameters, optimizer state, buffers) holds its
/// final version, the next iteration's initial tensor, and the graph's
/// outputs are set. Inputs are left as they are (used every iteration).
pub fn run_iteration(
    program: &mut Program,
    graph: &Graph,
    values: &mut Values,
) -> Result<(), KernelError> {
    if values.len() != graph.tensors().len() {
        return Err(KernelError::Values(format!(
            "{} values for a graph of {} tensors",
            values.len(),
            graph.tensors().len()
        )));
    }
    let last = last_reads(graph);
    let finals = final_versions(graph);
    let mut keep = vec![false; graph.tensors().len()];
    let mut live: HashMap<TensorId, Tensor> = HashMap::new();
    for t in initial_ids(graph) {
        let v = values.get(t.id).ok_or_else(|| {
            KernelError::Values(format!("initial tensor {} {:?} has no value", t.id, t.name))
        })?;
        live.insert(t.id, v.shallow_clone());
        keep[finals[t.id.index()].index()] = true;
    }
    for t in graph.tensors() {
        if t.kind == TensorKind::Output {
            keep[t.id.index()] = true;
        }
    }
    for op in graph.ops() {
        let mut inputs = Vec::with_capacity(op.inputs.len());
        for &t in &op.inputs {
            inputs.push(live.get(&t).ok_or_else(|| {
                KernelError::Values(format!("{}: input {t} has no value", op.name))
            })?);
        }
        let outputs = program.run(op.id, &inputs)?;
        for (&t, v) in op.outputs.iter().zip(outputs) {
            live.insert(t, v);
        }
        for &t in op.inputs.iter().chain(&op.outputs) {
            if last[t.index()].is_none_or(|l| l <= op.id.index()) && !keep[t.index()] {
                live.remove(&t);
            }
        }
    }
    for t in initial_ids(graph) {
        if t.kind.is_persistent() {
            let f = finals[t.id.index()];
            if let Some(v) = live.get(&f) {
                values.set(t.id, v.shallow_clone());
            }
        }
    }
    for t in graph.tensors() {
        if t.kind == TensorKind::Output
            && let Some(v) = live.remove(&t.id)
        {
            values.set(t.id, v);
        }
    }
    Ok(())
}

/// Writes the parameters and buffers (their current values in `values`, by
/// name, on the CPU) to a safetensors file.
pub fn save_params(graph: &Graph, values: &Values, path: &Path) -> Result<(), KernelError> {
    let mut named = Vec::new();
    for t in initial_ids(graph) {
        if matches!(t.kind, TensorKind::Parameter | TensorKind::Buffer) {
            let v = values.get(t.id).ok_or_else(|| {
                KernelError::Values(format!("parameter {:?} has no value", t.name))
            })?;
            named.push((t.name.clone(), v.to_device(Device::Cpu).contiguous()));
        }
    }
    Tensor::write_safetensors(&named, path).map_err(|e| KernelError::File {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}
