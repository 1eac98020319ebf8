//! Binding a graph op to an ATen schema: which overload, which input goes to
//! which tensor argument, which attribute to which other argument, and where
//! each output comes from. Everything is decided and checked here, once, at
//! [`crate::Program::new`]; running an op only fills in the tensors.
//!
//! Tensor arguments are bound, in order of preference:
//! 1. explicitly, by reserved attributes `@ARG = Ints([input indices])` that
//!    our tracer records (its inputs are de-duplicated, absent optional
//!    tensors dropped and tensor lists flattened, so the order alone cannot
//!    say; `-1` in a list is a `None` element of a `Tensor?[]`);
//! 2. by a short table of zoo ops whose inputs skip optional arguments in the
//!    middle ([`ZOO_BINDINGS`]) and the zoo's fused optimizers;
//! 3. by position, when the inputs are all the tensor arguments or exactly the
//!    required ones, in schema order (what the zoo emits).
//!
//! Anything else is an error naming the op. Missing arguments without a
//! default are never guessed: only the fused optimizers' flags are filled in
//! ([`OPTIMIZER_FLAGS`]), and documented.

use std::collections::BTreeMap;

use tensile_graph::{AttrValue, Op};

use crate::ffi;
use crate::schema::{Argument, Base, Schema, Type};

/// What one schema argument gets when the op runs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Slot {
    Default,
    None,
    Input(usize),
    Inputs(Vec<usize>),
    OptInputs(Vec<Option<usize>>),
    Int(i64),
    Float(f64),
    Bool(bool),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Bools(Vec<u8>),
    ScalarInt(i64),
    ScalarFloat(f64),
    ScalarBool(bool),
    WrappedInt(i64),
    WrappedFloat(f64),
    WrappedBool(bool),
    Str(String),
    Dtype(i64),
    MemoryFormat(i64),
    Layout(i64),
    /// The program's device.
    Device,
    /// An empty tensor list (`max_exp_avg_sqs` of a non-amsgrad Adam).
    EmptyList,
    /// `[the op's step tensor]`, owned by the program (fused optimizers).
    StepTensor,
    /// `is_first_step` of fused SGD: true on the op's first run only.
    FirstStep,
    /// A step-dependent float recomputed on every run (traced Adam).
    Recomputed(Recompute),
    /// The dtype of input `i` (a `ScalarType` the zoo leaves implicit).
    DtypeOfInput(usize),
}

/// A scalar that depends on the optimizer step, recorded by our tracer as
/// `@scalar.ARG = Str(formula)` with `@step = Ints([input])` (the step
/// tensor, after its increment) and the hyperparameters `@lr`, `@beta1`,
/// `@beta2`. Computed in f64 exactly as PyTorch's per-tensor Adam does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Recompute {
    pub(crate) formula: Formula,
    pub(crate) step_input: usize,
    pub(crate) lr: f64,
    pub(crate) beta1: f64,
    pub(crate) beta2: f64,
    /// How the value is passed: as a float, a Scalar or a wrapped tensor.
    pub(crate) ty: Base,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Formula {
    /// `-(lr / (1 - beta1 ** step))`: the `value` of Adam's `addcdiv_`.
    AdamNegStepSize,
    /// `(1 - beta2 ** step) ** 0.5`: the divisor of Adam's denominator.
    AdamBiasCorrection2Sqrt,
}

impl Formula {
    fn parse(s: &str) -> Option<Formula> {
        match s {
            "adam.neg_step_size" => Some(Formula::AdamNegStepSize),
            "adam.bias_correction2_sqrt" => Some(Formula::AdamBiasCorrection2Sqrt),
            _ => None,
        }
    }
}

impl Recompute {
    /// The value at `step` (PyTorch: `step = step_t.item()`, float math).
    pub(crate) fn value(&self, step: f64) -> f64 {
        match self.formula {
            Formula::AdamNegStepSize => -(self.lr / (1.0 - self.beta1.powf(step))),
            Formula::AdamBiasCorrection2Sqrt => (1.0 - self.beta2.powf(step)).powf(0.5),
        }
    }
}

/// An op bound to one schema.
#[derive(Debug)]
pub(crate) struct Bound {
    pub(crate) handle: ffi::OpHandle,
    pub(crate) schema: Schema,
    pub(crate) overload: String,
    pub(crate) slots: Vec<Slot>,
    /// `output_mask`: only the returns whose bit is set are graph outputs.
    pub(crate) mask: Option<Vec<bool>>,
    /// Graph outputs past the (masked) returns: in-place outputs, each the
    /// input it overwrote (an argument written but not returned).
    pub(crate) extra: Vec<usize>,
    /// Returned tensors expected (`None`: a list return, known at run time).
    pub(crate) returned: Option<usize>,
}

/// Zoo ops whose inputs skip optional tensor arguments in the middle:
/// `(op type, input count, the argument of each input)`.
pub(crate) const ZOO_BINDINGS: &[(&str, usize, &[&str])] = &[(
    "aten::native_batch_norm_backward",
    5,
    &["grad_out", "input", "weight", "save_mean", "save_invstd"],
)];

/// Arguments without a default that the zoo's fused optimizers omit, and
/// what they are: the zoo's Adam is plain Adam (no AMSGrad, minimizing) and
/// its SGD is heavy-ball momentum without dampening or Nesterov.
pub(crate) const OPTIMIZER_FLAGS: &[(&str, &str, Slot)] = &[
    ("aten::_fused_adam_", "amsgrad", Slot::Bool(false)),
    ("aten::_fused_adam_", "maximize", Slot::Bool(false)),
    ("aten::_fused_adamw_", "amsgrad", Slot::Bool(false)),
    ("aten::_fused_adamw_", "maximize", Slot::Bool(false)),
    ("aten::_fused_sgd_", "dampening", Slot::Float(0.0)),
    ("aten::_fused_sgd_", "nesterov", Slot::Bool(false)),
    ("aten::_fused_sgd_", "maximize", Slot::Bool(false)),
];

/// Attributes the zoo names differently from the schema: `(op type, zoo
/// name, schema name)`.
pub(crate) const ZOO_ATTR_NAMES: &[(&str, &str, &str)] = &[
    ("aten::native_batch_norm_backward", "training", "train"),
    ("aten::view", "size", "shape"),
];

/// `aten::view` (with a `size`) runs as `aten::reshape`: the same view
/// whenever a view is possible, and a copy where it is not. The zoo's
/// backward of a view is a view of the gradient, but PyTorch's autograd
/// reshapes there (`ViewBackward`: `grad.reshape(sizes)`), and BERT's
/// attention hands it gradients that are not contiguous.
const VIEW_AS_RESHAPE: (&str, &str) = ("aten::view", "aten::reshape");

/// Arguments without a default that the zoo leaves implicit because another
/// input says what they are: `(op type, argument, the input whose dtype it
/// is)`. A softmax backward's `input_dtype` is the forward input's dtype,
/// which is its output's dtype (the zoo never uses `half_to_float`).
pub(crate) const ZOO_DTYPE_OF: &[(&str, &str, &str)] = &[
    ("aten::_log_softmax_backward_data", "input_dtype", "output"),
    ("aten::_softmax_backward_data", "input_dtype", "output"),
];

/// The zoo's fused optimizers: their inputs, one tensor per list argument.
const FUSED: &[(&str, &[&str])] = &[
    (
        "aten::_fused_adam_",
        &["self", "grads", "exp_avgs", "exp_avg_sqs"],
    ),
    (
        "aten::_fused_adamw_",
        &["self", "grads", "exp_avgs", "exp_avg_sqs"],
    ),
    (
        "aten::_fused_sgd_",
        &["self", "grads", "momentum_buffer_list"],
    ),
];

/// Overloads tried first when the graph does not name one.
const PREFERRED: &[&str] = &["", "Tensor", "Scalar", "int", "dim", "dim_IntList", "self"];

fn is_reserved(key: &str) -> bool {
    key == "overload" || key.starts_with('@')
}

/// Overload lists and schemas already asked of the dispatcher, so that a
/// graph of thousands of ops asks once per operator.
#[derive(Debug, Default)]
pub(crate) struct Cache {
    overloads: std::collections::HashMap<String, Vec<String>>,
    schemas: std::collections::HashMap<(String, String), Schema>,
}

impl Cache {
    fn overloads(&mut self, name: &str) -> Result<Vec<String>, String> {
        if let Some(v) = self.overloads.get(name) {
            return Ok(v.clone());
        }
        let v = ffi::overloads(name)?;
        self.overloads.insert(name.to_string(), v.clone());
        Ok(v)
    }

    fn schema(
        &mut self,
        name: &str,
        overload: &str,
        handle: &ffi::OpHandle,
    ) -> Result<Schema, String> {
        let key = (name.to_string(), overload.to_string());
        if let Some(s) = self.schemas.get(&key) {
            return Ok(s.clone());
        }
        let s = crate::schema::parse(&handle.schema_text()?)?;
        self.schemas.insert(key, s.clone());
        Ok(s)
    }
}

/// Binds `op`; the error says why it cannot run.
pub(crate) fn bind(op: &Op, cache: &mut Cache) -> Result<Bound, String> {
    let mut name = op.op_type.as_str();
    if name == VIEW_AS_RESHAPE.0
        && !op.attrs.contains_key("overload")
        && op.attrs.contains_key("size")
    {
        name = VIEW_AS_RESHAPE.1;
    }
    if !name.contains("::") {
        return Err(format!(
            "{name:?} is not an operator name (expected a namespace, as in aten::add)"
        ));
    }
    let mut explicit = match op.attrs.get("overload") {
        Some(AttrValue::Str(s)) => Some(s.clone()),
        Some(other) => return Err(format!("attribute \"overload\" is {other:?}, not a string")),
        None => None,
    };
    // `aten::add.Tensor`: the overload written into the name.
    if let Some((ns, rest)) = name.split_once("::")
        && let Some((base, overload)) = rest.split_once('.')
    {
        if explicit.as_deref().is_some_and(|e| e != overload) {
            return Err(format!(
                "the name says overload {overload:?}, the attribute {explicit:?}"
            ));
        }
        explicit = Some(overload.to_string());
        name = &op.op_type[..ns.len() + 2 + base.len()];
    }
    let mut candidates = match &explicit {
        Some(o) => vec![if o == "default" {
            String::new()
        } else {
            o.clone()
        }],
        None => cache.overloads(name)?,
    };
    if candidates.is_empty() {
        return Err("no such operator in this libtorch".to_string());
    }
    candidates.sort_by_key(|o| {
        (
            PREFERRED
                .iter()
                .position(|p| p == o)
                .unwrap_or(PREFERRED.len()),
            o.clone(),
        )
    });
    let mut best: Option<(usize, Bound)> = None;
    let mut reasons = Vec::new();
    for overload in candidates {
        let handle = ffi::OpHandle::find(name, &overload)?;
        let schema = cache.schema(name, &overload, &handle)?;
        if explicit.is_none() && schema.is_out_variant() {
            continue;
        }
        let bound = bind_schema(op, &schema)
            .and_then(|(slots, wraps)| outputs(op, &schema).map(|out| (slots, wraps, out)));
        match bound {
            Ok((slots, wraps, (mask, extra, returned))) => {
                if best.as_ref().is_none_or(|(w, _)| wraps < *w) {
                    best = Some((
                        wraps,
                        Bound {
                            handle,
                            schema,
                            overload,
                            slots,
                            mask,
                            extra,
                            returned,
                        },
                    ));
                }
            }
            Err(why) => reasons.push(format!("{}: {why}", schema.text)),
        }
    }
    match best {
        Some((_, b)) => Ok(b),
        None if reasons.len() == 1 => Err(reasons.remove(0)),
        None => Err(format!(
            "no overload takes its inputs and attributes ({})",
            reasons.join("; ")
        )),
    }
}

/// Slots for every argument, and how many numbers had to be wrapped as
/// tensors (fewer is a better match).
fn bind_schema(op: &Op, schema: &Schema) -> Result<(Vec<Slot>, usize), String> {
    let rename = |k: &str| -> String {
        ZOO_ATTR_NAMES
            .iter()
            .find(|(o, from, _)| *o == op.op_type && *from == k)
            .map_or_else(|| k.to_string(), |(_, _, to)| to.to_string())
    };
    let renamed: Vec<(String, &AttrValue)> = op
        .attrs
        .iter()
        .filter(|(k, _)| !is_reserved(k))
        .map(|(k, v)| (rename(k), v))
        .collect();
    let attrs: BTreeMap<&str, &AttrValue> = renamed.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    for key in attrs.keys() {
        if !schema.arguments.iter().any(|a| a.name == *key) {
            return Err(format!("no argument named {key:?}"));
        }
    }
    let n_in = op.inputs.len();
    let tensors = tensor_binding(op, schema)?;
    let mut used = vec![false; n_in];
    let mut slots = Vec::with_capacity(schema.arguments.len());
    let mut wraps = 0;
    let recompute = recomputed(op)?;
    for arg in &schema.arguments {
        let slot = if let Some(slot) = tensors.get(arg.name.as_str()) {
            slot.clone()
        } else if let Some(value) = attrs.get(arg.name.as_str()) {
            let slot = from_attr(arg, value)?;
            if matches!(
                slot,
                Slot::WrappedInt(_) | Slot::WrappedFloat(_) | Slot::WrappedBool(_)
            ) {
                wraps += 1;
            }
            match recompute.get(arg.name.as_str()) {
                Some(r) => {
                    if r.step_input >= n_in {
                        return Err(format!("@step names input {} of {n_in}", r.step_input));
                    }
                    used[r.step_input] = true;
                    Slot::Recomputed(Recompute {
                        ty: arg.ty.base.clone(),
                        ..r.clone()
                    })
                }
                None => slot,
            }
        } else if let Some(slot) = filled(op, arg) {
            slot
        } else if let Some((_, _, of)) = ZOO_DTYPE_OF
            .iter()
            .find(|(o, a, _)| *o == op.op_type && *a == arg.name)
        {
            match tensors.get(of) {
                Some(Slot::Input(i)) => Slot::DtypeOfInput(*i),
                _ => return Err(format!("{:?} needs the input {of:?}", arg.name)),
            }
        } else if arg.ty.base == Base::Device {
            Slot::Device
        } else if arg.has_default {
            Slot::Default
        } else if arg.ty.optional {
            Slot::None
        } else {
            return Err(format!(
                "required argument {:?} ({}) is missing",
                arg.name, arg.ty
            ));
        };
        match &slot {
            Slot::Input(i) => used[*i] = true,
            Slot::Inputs(v) => v.iter().for_each(|&i| used[i] = true),
            Slot::OptInputs(v) => v.iter().flatten().for_each(|&i| used[i] = true),
            _ => {}
        }
        slots.push(slot);
    }
    if let Some(i) = used.iter().position(|u| !u) {
        return Err(format!("input {i} binds to no argument"));
    }
    if recompute.keys().any(|k| !attrs.contains_key(k)) {
        return Err("a recomputed @scalar names no attribute of the op".to_string());
    }
    Ok((slots, wraps))
}

/// The step-dependent scalars of an op (`@scalar.ARG`), by argument.
fn recomputed(op: &Op) -> Result<BTreeMap<&str, Recompute>, String> {
    let mut out = BTreeMap::new();
    for (key, value) in &op.attrs {
        let Some(arg) = key.strip_prefix("@scalar.") else {
            continue;
        };
        let AttrValue::Str(f) = value else {
            return Err(format!("{key} is not a string"));
        };
        let formula = Formula::parse(f).ok_or_else(|| format!("{key}: unknown formula {f:?}"))?;
        let step_input = match op.attrs.get("@step") {
            Some(AttrValue::Ints(v)) if v.len() == 1 && v[0] >= 0 => v[0] as usize,
            _ => {
                return Err(format!(
                    "{key} needs @step = [the step tensor's input index]"
                ));
            }
        };
        let hyper = |k: &str| {
            op.float_attr(k)
                .ok_or_else(|| format!("{key} needs the hyperparameter {k}"))
        };
        out.insert(
            arg,
            Recompute {
                formula,
                step_input,
                lr: hyper("@lr")?,
                beta1: hyper("@beta1")?,
                beta2: hyper("@beta2")?,
                ty: Base::Float,
            },
        );
    }
    Ok(out)
}

/// What the fused optimizers' omitted arguments are.
fn filled(op: &Op, arg: &Argument) -> Option<Slot> {
    let fused = FUSED.iter().any(|(n, _)| *n == op.op_type);
    if !fused || op.attrs.keys().any(|k| k.starts_with('@')) {
        return None;
    }
    match arg.name.as_str() {
        "max_exp_avg_sqs" => return Some(Slot::EmptyList),
        "state_steps" => return Some(Slot::StepTensor),
        "is_first_step" => return Some(Slot::FirstStep),
        _ => {}
    }
    OPTIMIZER_FLAGS
        .iter()
        .find(|(o, a, _)| *o == op.op_type && *a == arg.name)
        .map(|(_, _, s)| s.clone())
}

fn index(i: i64, n: usize) -> Result<usize, String> {
    usize::try_from(i)
        .ok()
        .filter(|&i| i < n)
        .ok_or_else(|| format!("input index {i} is out of range (the op has {n} inputs)"))
}

/// The tensor arguments bound to inputs, by argument name.
fn tensor_binding<'s>(op: &Op, schema: &'s Schema) -> Result<BTreeMap<&'s str, Slot>, String> {
    let n = op.inputs.len();
    let mut out = BTreeMap::new();
    let tensor_args: Vec<&Argument> = schema
        .arguments
        .iter()
        .filter(|a| a.ty.is_tensor() && !op.attrs.contains_key(&a.name))
        .collect();
    // 1. Explicit binding recorded by the tracer.
    if op.attrs.keys().any(|k| {
        k.starts_with('@') && !k.starts_with("@scalar.") && !is_hyper(k) && !is_annotation(k)
    }) {
        for arg in &schema.arguments {
            let Some(value) = op.attrs.get(&format!("@{}", arg.name)) else {
                continue;
            };
            let AttrValue::Ints(idx) = value else {
                return Err(format!("@{} is not a list of input indices", arg.name));
            };
            if !arg.ty.is_tensor() {
                return Err(format!(
                    "@{} binds inputs to a {} argument",
                    arg.name, arg.ty
                ));
            }
            let slot = if arg.ty.list {
                if arg.ty.elem_optional {
                    let v = idx
                        .iter()
                        .map(|&i| {
                            if i < 0 {
                                Ok(None)
                            } else {
                                index(i, n).map(Some)
                            }
                        })
                        .collect::<Result<_, _>>()?;
                    Slot::OptInputs(v)
                } else {
                    Slot::Inputs(idx.iter().map(|&i| index(i, n)).collect::<Result<_, _>>()?)
                }
            } else if let [i] = idx[..] {
                Slot::Input(index(i, n)?)
            } else {
                return Err(format!(
                    "@{} holds {} inputs for one tensor",
                    arg.name,
                    idx.len()
                ));
            };
            out.insert(arg.name.as_str(), slot);
        }
        for key in op.attrs.keys() {
            if let Some(a) = key.strip_prefix('@')
                && !key.starts_with("@scalar.")
                && !is_hyper(key)
                && !is_annotation(key)
                && !schema.arguments.iter().any(|x| x.name == a)
            {
                return Err(format!("{key} names no argument"));
            }
        }
        return Ok(out);
    }
    // 2. The zoo's fused optimizers and the table.
    if let Some((_, names)) = FUSED.iter().find(|(o, _)| *o == op.op_type) {
        if n != names.len() {
            return Err(format!(
                "expected {} inputs ({}), got {n}",
                names.len(),
                names.join(", ")
            ));
        }
        for (i, name) in names.iter().enumerate() {
            let arg = tensor_args
                .iter()
                .find(|a| a.name == *name)
                .ok_or_else(|| format!("the schema has no tensor list {name:?}"))?;
            out.insert(arg.name.as_str(), Slot::Inputs(vec![i]));
        }
        return Ok(out);
    }
    if let Some((_, _, names)) = ZOO_BINDINGS
        .iter()
        .find(|(o, k, _)| *o == op.op_type && *k == n)
    {
        for (i, name) in names.iter().enumerate() {
            let arg = tensor_args
                .iter()
                .find(|a| a.name == *name)
                .ok_or_else(|| format!("the schema has no tensor argument {name:?}"))?;
            out.insert(arg.name.as_str(), Slot::Input(i));
        }
        return Ok(out);
    }
    // 3. By position.
    if let [arg] = tensor_args[..]
        && arg.ty.list
    {
        if arg.ty.elem_optional {
            out.insert(
                arg.name.as_str(),
                Slot::OptInputs((0..n).map(Some).collect()),
            );
        } else {
            out.insert(arg.name.as_str(), Slot::Inputs((0..n).collect()));
        }
        return Ok(out);
    }
    if let Some(a) = tensor_args.iter().find(|a| a.ty.list) {
        return Err(format!(
            "the tensor list {:?} cannot be bound by position among other tensor arguments: \
             record the binding (@ARG attributes)",
            a.name
        ));
    }
    let required: Vec<&Argument> = tensor_args
        .iter()
        .copied()
        .filter(|a| !a.ty.optional && !a.has_default)
        .collect();
    let chosen = if n == tensor_args.len() {
        tensor_args
    } else if n == required.len() {
        required
    } else {
        return Err(format!(
            "{n} inputs for {} tensor arguments ({} required): which input is which is \
             ambiguous; record the binding (@ARG attributes)",
            tensor_args.len(),
            required.len()
        ));
    };
    for (i, arg) in chosen.iter().enumerate() {
        out.insert(arg.name.as_str(), Slot::Input(i));
    }
    Ok(out)
}

fn is_hyper(key: &str) -> bool {
    matches!(key, "@step" | "@lr" | "@beta1" | "@beta2")
}

/// Annotations the tracer records for others than the kernels: `@grad_fn`,
/// a backward op's autograd node (the hook's memory prediction reads it).
fn is_annotation(key: &str) -> bool {
    key == "@grad_fn"
}

fn float_of(v: &AttrValue) -> Option<f64> {
    match v {
        AttrValue::Float(f) => Some(*f),
        AttrValue::Int(i) => Some(*i as f64),
        // The tracer writes non-finite floats as strings.
        AttrValue::Str(s) => match s.as_str() {
            "inf" => Some(f64::INFINITY),
            "-inf" => Some(f64::NEG_INFINITY),
            "nan" => Some(f64::NAN),
            _ => None,
        },
        _ => None,
    }
}

/// An attribute as the argument's type wants it.
fn from_attr(arg: &Argument, v: &AttrValue) -> Result<Slot, String> {
    let bad = || {
        format!(
            "attribute {:?} = {v:?} does not fit its type {}",
            arg.name, arg.ty
        )
    };
    let ty: &Type = &arg.ty;
    if ty.list {
        return match (&ty.base, v) {
            (Base::Int, AttrValue::Ints(x)) => Ok(Slot::Ints(x.clone())),
            (Base::Int, AttrValue::Int(x)) => Ok(Slot::Ints(vec![*x])),
            (Base::Float, AttrValue::Floats(x)) => Ok(Slot::Floats(x.clone())),
            (Base::Float, AttrValue::Ints(x)) => {
                Ok(Slot::Floats(x.iter().map(|&i| i as f64).collect()))
            }
            (Base::Bool, AttrValue::Ints(x)) if x.iter().all(|&b| b == 0 || b == 1) => {
                Ok(Slot::Bools(x.iter().map(|&b| b as u8).collect()))
            }
            _ => Err(bad()),
        };
    }
    match (&ty.base, v) {
        (Base::Int, AttrValue::Int(x)) => Ok(Slot::Int(*x)),
        (Base::Float, v) => float_of(v).map(Slot::Float).ok_or_else(bad),
        (Base::Bool, AttrValue::Bool(b)) => Ok(Slot::Bool(*b)),
        (Base::Bool, AttrValue::Int(b @ (0 | 1))) => Ok(Slot::Bool(*b == 1)),
        (Base::Scalar, AttrValue::Int(x)) => Ok(Slot::ScalarInt(*x)),
        (Base::Scalar, AttrValue::Bool(b)) => Ok(Slot::ScalarBool(*b)),
        (Base::Scalar, v) => float_of(v).map(Slot::ScalarFloat).ok_or_else(bad),
        (Base::Tensor, AttrValue::Int(x)) => Ok(Slot::WrappedInt(*x)),
        (Base::Tensor, AttrValue::Bool(b)) => Ok(Slot::WrappedBool(*b)),
        (Base::Tensor, v) => float_of(v).map(Slot::WrappedFloat).ok_or_else(bad),
        (Base::Str, AttrValue::Str(s)) => Ok(Slot::Str(s.clone())),
        (Base::ScalarType, AttrValue::Str(s)) => dtype_code(s).map(Slot::Dtype).ok_or_else(bad),
        (Base::ScalarType, AttrValue::Int(x)) => Ok(Slot::Dtype(*x)),
        (Base::MemoryFormat, AttrValue::Str(s)) => memory_format_code(s)
            .map(Slot::MemoryFormat)
            .ok_or_else(bad),
        (Base::Layout, AttrValue::Str(s)) if s == "torch.strided" || s == "strided" => {
            Ok(Slot::Layout(0))
        }
        (Base::Device, _) => Ok(Slot::Device),
        _ => Err(bad()),
    }
}

/// `c10::ScalarType` codes of the dtypes graphs use.
pub(crate) fn dtype_code(s: &str) -> Option<i64> {
    let s = s.strip_prefix("torch.").unwrap_or(s);
    Some(match s {
        "uint8" | "u8" => 0,
        "int8" | "i8" => 1,
        "int16" | "i16" => 2,
        "int32" | "i32" => 3,
        "int64" | "i64" => 4,
        "float16" | "f16" => 5,
        "float32" | "f32" => 6,
        "float64" | "f64" => 7,
        "bool" => 11,
        "bfloat16" | "bf16" => 15,
        _ => return None,
    })
}

fn memory_format_code(s: &str) -> Option<i64> {
    let s = s.strip_prefix("torch.").unwrap_or(s);
    Some(match s {
        "contiguous_format" | "contiguous" => 0,
        "preserve_format" | "preserve" => 1,
        "channels_last" => 2,
        "channels_last_3d" => 3,
        _ => return None,
    })
}

type OutputMap = (Option<Vec<bool>>, Vec<usize>, Option<usize>);

/// Where each output comes from: the masked returns first, then in-place
/// outputs of arguments the op writes without returning them.
fn outputs(op: &Op, schema: &Schema) -> Result<OutputMap, String> {
    if let Some(r) = schema.returns.iter().find(|r| !r.is_tensor()) {
        return Err(format!("it returns a {r}, not tensors"));
    }
    let list_return = schema.returns.iter().any(|r| r.list);
    let mask = match op.attrs.get("output_mask") {
        Some(AttrValue::Ints(m)) if !list_return && m.len() == schema.returns.len() => {
            Some(m.iter().map(|&b| b != 0).collect::<Vec<bool>>())
        }
        Some(_) if schema.returns.iter().all(|r| r.is_tensor()) && !list_return => {
            return Err("output_mask does not have one bit per return".to_string());
        }
        _ => None,
    };
    let n_ret = if list_return {
        None
    } else {
        let tensors = schema.returns.iter().filter(|r| r.is_tensor()).count();
        Some(
            mask.as_ref()
                .map_or(tensors, |m| m.iter().filter(|b| **b).count()),
        )
    };
    let n_out = op.outputs.len();
    let first_extra = match n_ret {
        Some(r) if r > n_out => {
            return Err(format!("{n_out} outputs, but the op returns {r} tensors"));
        }
        Some(r) => r,
        None => {
            // A list return: every output up to the first in-place alias of
            // an argument that is not returned comes from the list.
            (0..n_out)
                .rev()
                .take_while(|&j| {
                    op.alias_of_output(j)
                        .is_some_and(|a| a.kind == tensile_graph::AliasKind::InPlace)
                })
                .last()
                .unwrap_or(n_out)
        }
    };
    let mut extra = Vec::new();
    for j in first_extra..n_out {
        match op.alias_of_output(j) {
            Some(a) if a.kind == tensile_graph::AliasKind::InPlace => extra.push(a.input as usize),
            _ => {
                return Err(format!(
                    "output {j} is neither returned by the op nor an in-place output of an input"
                ));
            }
        }
    }
    Ok((mask, extra, n_ret))
}
