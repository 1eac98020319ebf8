//! Training one small MLP per op type with tch: 4 dense layers (as the
//! paper), ReLU between them, on the natural log of the latency, with the
//! features and the target standardised on the training set (the paper fed
//! raw features, a bug). Full-batch Adam, the last quarter of the epochs at
//! a tenth of the rate; deterministic from the seed. The loss is the mean
//! absolute error of the log: timings on a shared machine have heavy tails
//! (a few runs slowed 2x by other processes), and an L1 fit follows the
//! typical time rather than the outliers (held-out conv MAPE 24% -> 21%
//! with it, in a side experiment on the shipped profile).
//!
//! The trained network is handed on as an [`Mlp`] (plain `f32` weights with
//! the normalisation and the target's scale folded in as the ONNX graph
//! computes them, see [`crate::onnx`]); [`TrainedNet::forward`] is tch's own
//! output of the same network, which the ONNX round-trip test compares with.

use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use thiserror::Error;

use crate::dataset::Sample;
use crate::features::FEATURE_LEN;

/// How to train.
#[derive(Debug, Clone, Copy)]
pub struct TrainConfig {
    pub epochs: u32,
    pub hidden: i64,
    pub learning_rate: f64,
    pub seed: u64,
}

impl Default for TrainConfig {
    fn default() -> TrainConfig {
        TrainConfig {
            epochs: 1500,
            hidden: 64,
            learning_rate: 3e-3,
            seed: 1,
        }
    }
}

/// One dense layer `y = x W^T + b`, `w` row-major `[outputs, inputs]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense {
    pub inputs: usize,
    pub outputs: usize,
    pub w: Vec<f32>,
    pub b: Vec<f32>,
}

/// A trained MLP as plain numbers: `ln(ns) = dense_n(relu(...dense_1((x -
/// mean) / std)))`, the target's scale already folded into the last layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Mlp {
    pub op_type: String,
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    pub layers: Vec<Dense>,
    /// The output is clipped to this range of `ln(ns)`.
    pub clamp: (f32, f32),
}

/// Normalised features are clipped to `[-INPUT_CLIP, INPUT_CLIP]` standard
/// deviations, in training and in the ONNX graph: a feature rare in training
/// (VGG's conv bias among mostly bias-free convolutions) otherwise lands far
/// out and the MLP extrapolates it wildly (held-out conv MAPE 21% -> 19%,
/// mm 73% -> 63% in a side experiment).
pub const INPUT_CLIP: f64 = 3.0;

/// Predictions are clipped to the training targets' range widened by this
/// much of `ln(ns)` (a factor of 4 either way): an MLP extrapolates
/// exponentially badly, and a shape far outside the training set is better
/// served by a bounded guess.
pub const CLAMP_MARGIN: f64 = std::f64::consts::LN_2 * 2.0;

#[derive(Debug, Error)]
pub enum TrainError {
    #[error("{op_type}: no training samples")]
    Empty { op_type: String },
    #[error("{op_type}: libtorch failed: {source}")]
    Torch {
        op_type: String,
        #[source]
        source: tch::TchError,
    },
}

/// A network trained by tch, with its normalisation.
#[derive(Debug)]
pub struct TrainedNet {
    op_type: String,
    _vs: nn::VarStore,
    layers: Vec<nn::Linear>,
    mean: Tensor,
    std: Tensor,
    y_mean: f64,
    y_std: f64,
    y_range: (f32, f32),
    /// Mean absolute error (standardised target) at the last epoch.
    pub final_loss: f64,
}

/// Trains the MLP of one op type on `samples` (all of that op type).
pub fn train(samples: &[&Sample], config: &TrainConfig) -> Result<TrainedNet, TrainError> {
    let op_type = samples
        .first()
        .map(|s| s.op_type.clone())
        .unwrap_or_default();
    if samples.is_empty() {
        return Err(TrainError::Empty { op_type });
    }
    let torch = |source| TrainError::Torch {
        op_type: op_type.clone(),
        source,
    };
    fit(&op_type, samples, config).map_err(torch)
}

fn fit(
    op_type: &str,
    samples: &[&Sample],
    config: &TrainConfig,
) -> Result<TrainedNet, tch::TchError> {
    // Small matrices: more threads only add synchronisation.
    tch::set_num_threads(1);
    tch::manual_seed(config.seed as i64);
    let n = samples.len() as i64;
    let f = FEATURE_LEN as i64;
    let xs: Vec<f32> = samples
        .iter()
        .flat_map(|s| s.features.iter().copied())
        .collect();
    let ys: Vec<f32> = samples.iter().map(|s| (s.ns.max(1) as f32).ln()).collect();
    let x = Tensor::from_slice(&xs).f_view([n, f])?;
    let y = Tensor::from_slice(&ys).f_view([n, 1])?;
    let mean = x.f_mean_dim(Some([0i64].as_slice()), false, Kind::Float)?;
    let std = x.f_std_correction(Some([0i64].as_slice()), 0, false)?;
    // A constant feature divides by 1, not by 0.
    let std = std.f_where_scalarother(&std.f_gt(1e-6)?, 1.0)?;
    let y_mean = y.f_mean(Kind::Float)?.f_double_value(&[])?;
    let y_lo = f64::from(ys.iter().copied().fold(f32::INFINITY, f32::min)) - CLAMP_MARGIN;
    let y_hi = f64::from(ys.iter().copied().fold(f32::NEG_INFINITY, f32::max)) + CLAMP_MARGIN;
    let y_std = y.f_std(false)?.f_double_value(&[])?.max(1e-3);
    let xn = x
        .f_sub(&mean)?
        .f_div(&std)?
        .f_clamp(-INPUT_CLIP, INPUT_CLIP)?;
    let yn = y.f_sub_scalar(y_mean)?.f_div_scalar(y_std)?;

    let vs = nn::VarStore::new(Device::Cpu);
    let h = config.hidden;
    let dims = [(f, h), (h, h), (h, h), (h, 1)];
    let layers: Vec<nn::Linear> = dims
        .iter()
        .enumerate()
        .map(|(i, &(a, b))| nn::linear(vs.root() / format!("l{i}"), a, b, Default::default()))
        .collect();
    let mut opt = nn::Adam::default().build(&vs, config.learning_rate)?;
    let mut final_loss = f64::NAN;
    for epoch in 0..config.epochs {
        if epoch == config.epochs * 3 / 4 {
            opt.set_lr(config.learning_rate / 10.0);
        }
        let pred = run_layers(&layers, &xn);
        let loss = pred.f_sub(&yn)?.f_abs()?.f_mean(Kind::Float)?;
        opt.zero_grad();
        loss.f_backward()?;
        opt.step();
        final_loss = loss.f_double_value(&[])?;
    }
    Ok(TrainedNet {
        op_type: op_type.to_owned(),
        _vs: vs,
        layers,
        mean,
        std,
        y_mean,
        y_std,
        y_range: (y_lo as f32, y_hi as f32),
        final_loss,
    })
}

fn run_layers(layers: &[nn::Linear], x: &Tensor) -> Tensor {
    let mut h = x.shallow_clone();
    for (i, l) in layers.iter().enumerate() {
        h = l.forward(&h);
        if i + 1 < layers.len() {
            h = h.relu();
        }
    }
    h
}

impl TrainedNet {
    /// tch's prediction of `ln(ns)` for rows of [`FEATURE_LEN`] features.
    pub fn forward(&self, features: &[f32]) -> Result<Vec<f32>, tch::TchError> {
        let _guard = tch::no_grad_guard();
        let n = (features.len() / FEATURE_LEN) as i64;
        let x = Tensor::from_slice(features).f_view([n, FEATURE_LEN as i64])?;
        let xn = x
            .f_sub(&self.mean)?
            .f_div(&self.std)?
            .f_clamp(-INPUT_CLIP, INPUT_CLIP)?;
        let y = run_layers(&self.layers, &xn)
            .f_mul_scalar(self.y_std)?
            .f_add_scalar(self.y_mean)?
            .f_clamp(f64::from(self.y_range.0), f64::from(self.y_range.1))?;
        Vec::<f32>::try_from(y.f_view([-1])?)
    }

    /// The network as plain numbers, the target's scale folded into the
    /// last layer (`w * y_std`, `b * y_std + y_mean`).
    pub fn to_mlp(&self) -> Result<Mlp, tch::TchError> {
        let _guard = tch::no_grad_guard();
        let vec = |t: &Tensor| Vec::<f32>::try_from(t.f_contiguous()?.f_view([-1])?);
        let last = self.layers.len() - 1;
        let mut layers = Vec::with_capacity(self.layers.len());
        for (i, l) in self.layers.iter().enumerate() {
            let size = l.ws.size();
            let (mut w, mut b) = (
                vec(&l.ws)?,
                l.bs.as_ref().map(vec).transpose()?.unwrap_or_default(),
            );
            b.resize(size[0] as usize, 0.0);
            if i == last {
                w.iter_mut().for_each(|v| *v *= self.y_std as f32);
                b.iter_mut()
                    .for_each(|v| *v = *v * self.y_std as f32 + self.y_mean as f32);
            }
            layers.push(Dense {
                inputs: size[1] as usize,
                outputs: size[0] as usize,
                w,
                b,
            });
        }
        Ok(Mlp {
            op_type: self.op_type.clone(),
            mean: vec(&self.mean)?,
            std: vec(&self.std)?,
            layers,
            clamp: self.y_range,
        })
    }
}
