//! Mock kernels for any graph: every output is a deterministic function of
//! the op's inputs (a fresh tensor filled from their means, an in-place
//! update of the input it overwrites, a view of the input it views), so a
//! run that reads the wrong bytes anywhere ends with different parameters.
//! Host ops run the same arithmetic over the host copies ([`Mock::owned`]
//! for the host engine's thread).

use std::borrow::Cow;
use std::time::{Duration, Instant};

use tch::{Device, Kind, Scalar, Tensor};
use tensile_graph::{AliasKind, Graph, OpId, TensorId};
use tensile_kernels::kind_of as kind;
use tensile_worker::Kernels;

fn is_float(k: Kind) -> bool {
    matches!(k, Kind::Float | Kind::Double | Kind::Half | Kind::BFloat16)
}

fn shape(g: &Graph, t: TensorId) -> Vec<i64> {
    g.tensor(t).shape.iter().map(|&d| d as i64).collect()
}

fn contiguous_strides(size: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; size.len()];
    for i in (0..size.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * size[i + 1].max(1);
    }
    s
}

/// Initial values: a fixed pattern per tensor (no RNG).
pub(crate) fn initial(g: &Graph) -> Vec<(TensorId, Tensor)> {
    g.tensors()
        .iter()
        .filter(|t| g.producer(t.id).is_none())
        .map(|t| {
            let size = shape(g, t.id);
            let n: i64 = size.iter().product();
            let v = (Tensor::arange(n, (Kind::Double, Device::Cpu)) * 0.37 + t.id.0 as f64)
                .sin()
                .reshape(size.as_slice());
            let v = match kind(t.dtype) {
                Kind::Int64 | Kind::Int | Kind::Int16 | Kind::Int8 | Kind::Uint8 => {
                    (v.abs() * 7.0).to_kind(kind(t.dtype))
                }
                k => v.to_kind(k),
            };
            (t.id, v)
        })
        .collect()
}

#[derive(Debug)]
pub(crate) struct Mock<'g> {
    graph: Cow<'g, Graph>,
    /// Every op takes at least this long (a kernel of known latency).
    floor: Duration,
}

impl<'g> Mock<'g> {
    pub(crate) fn new(graph: &'g Graph, floor: Duration) -> Mock<'g> {
        Mock {
            graph: Cow::Borrowed(graph),
            floor,
        }
    }
}

impl Mock<'static> {
    /// Kernels that own their graph, for the host engine's thread (host
    /// ops: `Worker::set_host_kernels`).
    pub(crate) fn owned(graph: Graph, floor: Duration) -> Mock<'static> {
        Mock {
            graph: Cow::Owned(graph),
            floor,
        }
    }
}

impl Kernels for Mock<'_> {
    fn run(&mut self, op: OpId, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let start = Instant::now();
        let o = self.graph.op(op);
        let mut acc = f64::from(op.0) * 1e-3;
        for x in inputs {
            if x.numel() > 0 {
                acc += x.to_kind(Kind::Double).mean(Kind::Double).double_value(&[]);
            }
        }
        let v = (acc * 0.5).sin();
        let mut outs = Vec::new();
        for (i, &t) in o.outputs.iter().enumerate() {
            let size = shape(&self.graph, t);
            let k = kind(self.graph.tensor(t).dtype);
            let out = match o.alias_of_output(i) {
                Some(a) if a.kind == AliasKind::InPlace => {
                    let mut x = inputs[a.input as usize].shallow_clone();
                    if is_float(x.kind()) {
                        let _ = x
                            .f_mul_scalar_(Scalar::float(0.5))
                            .map_err(|e| e.to_string())?;
                        let _ = x
                            .f_add_scalar_(Scalar::float(v))
                            .map_err(|e| e.to_string())?;
                    }
                    x
                }
                Some(a) => {
                    let x = inputs[a.input as usize];
                    let n: i64 = size.iter().product();
                    let strides = if n as usize <= x.numel() {
                        contiguous_strides(&size)
                    } else {
                        vec![0; size.len()]
                    };
                    x.f_as_strided(size.as_slice(), strides.as_slice(), None::<i64>)
                        .map_err(|e| e.to_string())?
                }
                None => {
                    let scalar = match k {
                        Kind::Bool => Scalar::int(i64::from(v > 0.0)),
                        k if is_float(k) => Scalar::float(v + i as f64),
                        _ => Scalar::int((v * 100.0) as i64),
                    };
                    Tensor::f_full(size.as_slice(), scalar, (k, Device::Cpu))
                        .map_err(|e| e.to_string())?
                }
            };
            outs.push(out);
        }
        if let Some(left) = self.floor.checked_sub(start.elapsed()) {
            std::thread::sleep(left);
        }
        Ok(outs)
    }
}
