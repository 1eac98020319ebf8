//! [`Program`]: a graph's ops bound to ATen schemas, and running one op.
//!
//! The zoo's fused optimizers (`_fused_adam_`, `_fused_adamw_`,
//! `_fused_sgd_`) take `[param, grad, state...]` with no step counter, while
//! the real kernels need `state_steps` (Adam) or `is_first_step` (SGD): the
//! program keeps, per such op, a float32 step tensor on the device,
//! incremented before each call as `torch.optim` does (so the first run is
//! step 1), and a first-run flag. That state lives as long as the program:
//! a new program starts over at step 1.

use tch::{Device, Kind, Tensor};
use tensile_graph::{Graph, OpId};

use crate::KernelError;
use crate::bind::{self, Bound, Slot};
use crate::ffi::Arg;
use crate::schema::Base;

/// The `c10::ScalarType` code of a tch kind.
fn dtype_code(k: Kind) -> i64 {
    match k {
        Kind::Uint8 => 0,
        Kind::Int8 => 1,
        Kind::Int16 => 2,
        Kind::Int => 3,
        Kind::Int64 => 4,
        Kind::Half => 5,
        Kind::Float => 6,
        Kind::Double => 7,
        Kind::ComplexHalf => 8,
        Kind::ComplexFloat => 9,
        Kind::ComplexDouble => 10,
        Kind::Bool => 11,
        Kind::QInt8 => 12,
        Kind::QUInt8 => 13,
        Kind::QInt32 => 14,
        Kind::BFloat16 => 15,
        _ => -1,
    }
}

/// A graph's ops bound to ATen schemas, checked up front.
#[derive(Debug)]
pub struct Program {
    device: Device,
    ops: Vec<BoundOp>,
}

#[derive(Debug)]
struct BoundOp {
    name: String,
    op_type: String,
    bound: Bound,
    n_inputs: usize,
    /// Expected shape of each output.
    shapes: Vec<Vec<i64>>,
    /// The fused optimizers' step counter (see the module docs).
    step: Option<Tensor>,
    runs: u64,
}

impl Program {
    /// Binds every op of `graph` through the dispatcher; an op that cannot
    /// run is an error naming it (op name, op type, why).
    pub fn new(graph: &Graph, device: Device) -> Result<Program, KernelError> {
        if !matches!(device, Device::Cpu | Device::Cuda(_)) {
            return Err(KernelError::Device {
                device,
                reason: "only cpu and cuda devices are supported".to_string(),
            });
        }
        if let Device::Cuda(n) = device
            && (n >= tch::Cuda::device_count() as usize)
        {
            return Err(KernelError::Device {
                device,
                reason: format!(
                    "this machine has {} CUDA devices",
                    tch::Cuda::device_count()
                ),
            });
        }
        let mut ops = Vec::with_capacity(graph.ops().len());
        let mut cache = bind::Cache::default();
        for op in graph.ops() {
            let bound = bind::bind(op, &mut cache).map_err(|reason| KernelError::Bind {
                op: op.id,
                name: op.name.clone(),
                op_type: op.op_type.clone(),
                reason,
            })?;
            let step = bound
                .slots
                .contains(&Slot::StepTensor)
                .then(|| Tensor::zeros([], (Kind::Float, device)));
            ops.push(BoundOp {
                name: op.name.clone(),
                op_type: op.op_type.clone(),
                n_inputs: op.inputs.len(),
                shapes: op
                    .outputs
                    .iter()
                    .map(|&t| graph.tensor(t).shape.iter().map(|&d| d as i64).collect())
                    .collect(),
                bound,
                step,
                runs: 0,
            });
        }
        Ok(Program { device, ops })
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// The overload op `op` was bound to (`""`: the default one), and its
    /// schema as PyTorch prints it.
    pub fn binding(&self, op: OpId) -> Option<(&str, &str)> {
        self.ops
            .get(op.index())
            .map(|b| (b.bound.overload.as_str(), b.bound.schema.text.as_str()))
    }

    /// Whether op `op` draws random numbers (its schema takes a generator,
    /// or it is a dropout): running it again (recomputation) gives another
    /// result, and it advances the random stream every op after it reads.
    pub fn is_random(&self, op: OpId) -> bool {
        self.ops.get(op.index()).is_some_and(|b| {
            let forward = !b.op_type.ends_with("_backward");
            forward && (b.op_type.contains("dropout") || b.op_type.contains("bernoulli"))
                || b.bound
                    .schema
                    .arguments
                    .iter()
                    .any(|a| a.ty.base == Base::Generator)
        })
    }

    /// Runs op `op` on its inputs (tensors in the order of `op.inputs`) and
    /// returns its outputs in the order of `op.outputs`. In-place outputs
    /// share storage with their input, views are views.
    pub fn run(&mut self, op: OpId, inputs: &[&Tensor]) -> Result<Vec<Tensor>, KernelError> {
        let device = self.device;
        let random = self.is_random(op);
        let Some(b) = self.ops.get_mut(op.index()) else {
            return Err(KernelError::Values(format!(
                "{op} is not an op of this program ({} ops)",
                self.ops.len()
            )));
        };
        let fail = |b: &BoundOp, reason: String| KernelError::Run {
            op,
            name: b.name.clone(),
            op_type: b.op_type.clone(),
            reason,
        };
        if inputs.len() != b.n_inputs {
            let reason = format!("{} inputs given, the op has {}", inputs.len(), b.n_inputs);
            return Err(fail(b, reason));
        }
        if let Some(Err(e)) = b.step.as_mut().map(|s| s.f_add_scalar_(1.0)) {
            return Err(fail(b, format!("incrementing the step tensor: {e}")));
        }
        let first = b.runs == 0;
        let mut args = Vec::with_capacity(b.bound.slots.len());
        for slot in &b.bound.slots {
            args.push(match slot {
                Slot::Default => Arg::Default,
                Slot::None => Arg::None,
                Slot::Input(i) => Arg::Tensor(inputs[*i]),
                Slot::Inputs(v) => Arg::TensorList(v.iter().map(|&i| inputs[i]).collect()),
                Slot::OptInputs(v) => {
                    Arg::OptTensorList(v.iter().map(|i| i.map(|i| inputs[i])).collect())
                }
                Slot::Int(x) => Arg::Int(*x),
                Slot::Float(x) => Arg::Float(*x),
                Slot::Bool(x) => Arg::Bool(*x),
                Slot::Ints(x) => Arg::Ints(x),
                Slot::Floats(x) => Arg::Floats(x),
                Slot::Bools(x) => Arg::Bools(x.clone()),
                Slot::ScalarInt(x) => Arg::ScalarInt(*x),
                Slot::ScalarFloat(x) => Arg::ScalarFloat(*x),
                Slot::ScalarBool(x) => Arg::ScalarBool(*x),
                Slot::WrappedInt(x) => Arg::WrappedInt(*x),
                Slot::WrappedFloat(x) => Arg::WrappedFloat(*x),
                Slot::WrappedBool(x) => Arg::WrappedBool(*x),
                Slot::Str(s) => Arg::Str(s),
                Slot::Dtype(x) => Arg::Dtype(*x),
                Slot::MemoryFormat(x) => Arg::MemoryFormat(*x),
                Slot::Layout(x) => Arg::Layout(*x),
                Slot::Device => match device {
                    Device::Cuda(n) => Arg::Device(1, n as i64),
                    _ => Arg::Device(0, -1),
                },
                Slot::EmptyList => Arg::TensorList(Vec::new()),
                Slot::StepTensor => match &b.step {
                    Some(t) => Arg::TensorList(vec![t]),
                    None => return Err(fail(b, "internal: no step tensor".to_string())),
                },
                Slot::FirstStep => Arg::Bool(first),
                Slot::DtypeOfInput(i) => Arg::Dtype(dtype_code(inputs[*i].kind())),
                Slot::Recomputed(r) => {
                    let step = inputs[r.step_input]
                        .f_double_value(&[])
                        .map_err(|e| fail(b, format!("reading the step tensor: {e}")))?;
                    let v = r.value(step);
                    match r.ty {
                        Base::Scalar => Arg::ScalarFloat(v),
                        Base::Tensor => Arg::WrappedFloat(v),
                        _ => Arg::Float(v),
                    }
                }
            });
        }
        let turn = random.then(crate::rng_turn);
        let flat = b.bound.handle.call(&args).map_err(|e| fail(b, e))?;
        drop(turn);
        drop(args);
        b.runs += 1;
        let flat: Vec<Option<Tensor>> = match &b.bound.mask {
            Some(mask) => flat
                .into_iter()
                .zip(mask)
                .filter(|(_, m)| **m)
                .map(|(t, _)| t)
                .collect(),
            None => flat,
        };
        let returned = b
            .bound
            .returned
            .unwrap_or(b.shapes.len() - b.bound.extra.len());
        if flat.len() != returned {
            let reason = format!("returned {} tensors, expected {returned}", flat.len());
            return Err(fail(b, reason));
        }
        let mut outputs = Vec::with_capacity(b.shapes.len());
        for (j, t) in flat.into_iter().enumerate() {
            match t {
                Some(t) => outputs.push(t),
                None => return Err(fail(b, format!("output {j} is an undefined tensor"))),
            }
        }
        for &i in &b.bound.extra {
            outputs.push(inputs[i].shallow_clone());
        }
        for (j, (t, shape)) in outputs.iter().zip(&b.shapes).enumerate() {
            let got = t.size();
            if got != *shape {
                let reason = format!("output {j} has shape {got:?}, the graph says {shape:?}");
                return Err(fail(b, reason));
            }
        }
        Ok(outputs)
    }
}
