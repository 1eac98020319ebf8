//! Training the model of one op type with tch: a small ensemble of MLPs of
//! 4 dense layers (as the paper), ReLU between them, that predict the
//! natural log of the latency as a correction to a roofline fitted to the
//! op type.
//!
//! - **The base.** Per op type, `launch + max(flops / compute, bytes /
//!   memory)` with the three constants fitted to the training samples by
//!   grid search ([`fit_base`]); the FLOPs and bytes are read back from
//!   features 29 and 30. The networks learn `ln(ns) - ln(base)`, which
//!   carries the product of the dims and the compute/memory kink the MLP
//!   would otherwise have to learn from a few hundred shapes (held-out conv
//!   MAPE 21% -> 17% in a side experiment).
//! - **The loss** is the mean absolute *relative* error of the latency,
//!   `|exp(pred - ln ns) - 1|`, the metric the models are judged on; timings
//!   on a shared machine are skewed upwards (a run slowed 2x by another
//!   process), and this loss weighs a prediction 2x too high as much as one
//!   2x too low would need to be (the L1 of the log it replaces gave 21% ->
//!   17% held-out conv MAPE together with the base).
//! - **The members** ([`TrainConfig::members`], trained together as one
//!   batched network) each hold out one fold of the *training* shapes
//!   ([`Sample::fold`]) and keep the weights of the epoch with the lowest
//!   MAPE on that fold (checked every [`CHECK_EVERY`] epochs): early
//!   stopping that never looks at the held-out set, and an ensemble whose
//!   members saw different data. Their outputs are averaged in log space.
//!   Small op types gain most (avg_pool2d_backward overfits badly without
//!   it); the large ones gain a point or two.
//! - AdamW with weight decay, full batch, the last quarter of the epochs at
//!   a tenth of the rate; deterministic from the seed. Features and target
//!   standardised on the training set (the paper fed raw features, a bug),
//!   normalised features clipped to [`INPUT_CLIP`] standard deviations.
//!
//! The trained ensemble is handed on as an [`Mlp`] (plain `f32` weights with
//! the normalisation, the base and the target's scale folded in as the ONNX
//! graph computes them, see [`crate::onnx`]); [`TrainedNet::forward`] is
//! tch's own output of the same ensemble, which the ONNX round-trip test
//! compares with.

use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use thiserror::Error;

use tensile_latency_model::dataset::Sample;
use tensile_latency_model::features::FEATURE_LEN;

/// How to train.
#[derive(Debug, Clone, Copy)]
pub struct TrainConfig {
    /// Epochs at most (each member keeps its best epoch on its fold).
    pub epochs: u32,
    pub hidden: i64,
    pub learning_rate: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Ensemble members, at most [`FOLDS`]; each validates on its own fold.
    pub members: usize,
    pub seed: u64,
}

impl Default for TrainConfig {
    fn default() -> TrainConfig {
        TrainConfig {
            epochs: 1500,
            hidden: 64,
            learning_rate: 3e-3,
            weight_decay: 1e-3,
            members: 3,
            seed: 1,
        }
    }
}

/// Validation folds the training shapes are split into; member `k`
/// validates on fold `k` and trains on the others.
pub const FOLDS: u64 = 7;

/// Epochs between two checks of the validation MAPE.
pub const CHECK_EVERY: u32 = 20;

/// One dense layer `y = x W^T + b`, `w` row-major `[outputs, inputs]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense {
    pub inputs: usize,
    pub outputs: usize,
    pub w: Vec<f32>,
    pub b: Vec<f32>,
}

/// The roofline of one op type that the networks correct:
/// `ln(launch_ns + max(flops * ns_per_flop, bytes * ns_per_byte))`, with
/// `flops = 2^features[29] - 1` and `bytes = 2^features[30] - 1`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RooflineBase {
    pub launch_ns: f32,
    pub ns_per_flop: f32,
    pub ns_per_byte: f32,
}

/// Feature slots of the FLOPs and bytes (`log2(1 + x)`).
pub const FLOPS_SLOT: usize = 29;
pub const BYTES_SLOT: usize = 30;

/// A trained ensemble as plain numbers: `ln(ns) = clamp(ln(base) + mean_k
/// dense_k,n(relu(...dense_k,1(clip((x - mean) / std)))))`, the target's
/// scale already folded into each member's last layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Mlp {
    pub op_type: String,
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    /// The layers of each member.
    pub members: Vec<Vec<Dense>>,
    pub base: RooflineBase,
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

/// The weights of one layer of every member: `w: [members, in, out]`,
/// `b: [members, 1, out]`.
#[derive(Debug)]
struct Layer {
    w: Tensor,
    b: Tensor,
}

/// An ensemble trained by tch, with its normalisation and base.
#[derive(Debug)]
pub struct TrainedNet {
    op_type: String,
    layers: Vec<Layer>,
    mean: Tensor,
    std: Tensor,
    y_mean: f64,
    y_std: f64,
    y_range: (f32, f32),
    base: RooflineBase,
    /// Training loss (mean relative error over the members' training
    /// rows) at the last epoch.
    pub final_loss: f64,
    /// Each member's MAPE on its validation fold at its kept epoch, in
    /// percent (`NaN` when the op type had too few shapes for a fold).
    pub validation_mape: Vec<f64>,
    /// Each member's kept epoch.
    pub best_epoch: Vec<u32>,
}

/// Trains the model of one op type on `samples` (all of that op type).
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

/// The FLOPs and bytes of a feature row, from their `log2(1 + x)` slots.
fn work(features: &[f32]) -> (f64, f64) {
    let back = |x: f32| f64::from(x).exp2() - 1.0;
    (back(features[FLOPS_SLOT]), back(features[BYTES_SLOT]))
}

/// The roofline base of an op type: the launch cost, compute rate and
/// memory rate that minimise the mean absolute log error over `samples`, by
/// grid search (the roofline is not differentiable at its kink).
pub fn fit_base(samples: &[&Sample]) -> RooflineBase {
    const LAUNCH: [f64; 8] = [100.0, 250.0, 500.0, 1000.0, 2000.0, 4000.0, 8000.0, 16000.0];
    let geom = |lo: f64, hi: f64, n: usize| -> Vec<f64> {
        (0..n)
            .map(|i| lo * (hi / lo).powf(i as f64 / (n - 1) as f64))
            .collect()
    };
    // FLOP/s and byte/s tried: from far below to a little above what one
    // core of the build machines reaches.
    let compute = geom(1e8, 2e11, 60);
    let memory = geom(1e8, 1e11, 60);
    let pts: Vec<(f64, f64, f64)> = samples
        .iter()
        .map(|s| {
            let (flops, bytes) = work(&s.features);
            (flops, bytes, (s.ns.max(1) as f64).ln())
        })
        .collect();
    let mut best = (f64::INFINITY, 1000.0, 1e10, 1e10);
    let mut compute_ns = vec![0.0; pts.len()];
    for &c in &compute {
        for (t, p) in compute_ns.iter_mut().zip(&pts) {
            *t = p.0 / c * 1e9;
        }
        for &m in &memory {
            for launch in LAUNCH {
                let err: f64 = pts
                    .iter()
                    .zip(&compute_ns)
                    .map(|(&(_, bytes, ln_ns), &cns)| {
                        ((launch + cns.max(bytes / m * 1e9)).ln() - ln_ns).abs()
                    })
                    .sum();
                if err < best.0 {
                    best = (err, launch, c, m);
                }
            }
        }
    }
    RooflineBase {
        launch_ns: best.1 as f32,
        ns_per_flop: (1e9 / best.2) as f32,
        ns_per_byte: (1e9 / best.3) as f32,
    }
}

/// `ln(base)` of feature rows `x: [n, FEATURE_LEN]`, `[n, 1]`, with the
/// operations (and so the rounding) of the ONNX graph: a matrix product
/// picks the two slots and scales them by `ln 2`, then `exp - 1`, the
/// per-element costs, the larger, the launch, the log.
pub(crate) fn base_ln(x: &Tensor, base: &RooflineBase) -> Result<Tensor, tch::TchError> {
    let select = Tensor::from_slice(&base_select()).f_view([FEATURE_LEN as i64, 2])?;
    let cost = Tensor::from_slice(&[base.ns_per_flop, base.ns_per_byte]).f_view([1, 2])?;
    x.f_matmul(&select)?
        .f_exp()?
        .f_sub_scalar(1.0)?
        .f_mul(&cost)?
        .f_amax([1i64].as_slice(), true)?
        .f_add_scalar(f64::from(base.launch_ns))?
        .f_log()
}

/// The `[FEATURE_LEN, 2]` matrix (row-major) that picks the FLOPs and bytes
/// slots times `ln 2`.
pub(crate) fn base_select() -> Vec<f32> {
    let mut m = vec![0f32; FEATURE_LEN * 2];
    m[FLOPS_SLOT * 2] = std::f32::consts::LN_2;
    m[BYTES_SLOT * 2 + 1] = std::f32::consts::LN_2;
    m
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
    let k = config.members.clamp(1, FOLDS as usize) as i64;
    let base = fit_base(samples);
    let xs: Vec<f32> = samples
        .iter()
        .flat_map(|s| s.features.iter().copied())
        .collect();
    let ys: Vec<f32> = samples.iter().map(|s| (s.ns.max(1) as f32).ln()).collect();
    let x = Tensor::from_slice(&xs).f_view([n, f])?;
    let y = Tensor::from_slice(&ys).f_view([n, 1])?;
    let target = y.f_sub(&base_ln(&x, &base)?)?;
    let mean = x.f_mean_dim(Some([0i64].as_slice()), false, Kind::Float)?;
    let std = x.f_std_correction(Some([0i64].as_slice()), 0, false)?;
    // A constant feature divides by 1, not by 0.
    let std = std.f_where_scalarother(&std.f_gt(1e-6)?, 1.0)?;
    let y_mean = target.f_mean(Kind::Float)?.f_double_value(&[])?;
    let y_std = target.f_std(false)?.f_double_value(&[])?.max(1e-3);
    let y_lo = f64::from(ys.iter().copied().fold(f32::INFINITY, f32::min)) - CLAMP_MARGIN;
    let y_hi = f64::from(ys.iter().copied().fold(f32::NEG_INFINITY, f32::max)) + CLAMP_MARGIN;
    let xn = x
        .f_sub(&mean)?
        .f_div(&std)?
        .f_clamp(-INPUT_CLIP, INPUT_CLIP)?;
    let tn = target.f_sub_scalar(y_mean)?.f_div_scalar(y_std)?;

    // Member k trains on every fold but k and validates on fold k; with too
    // few shapes for that (a fold or its complement empty), on everything.
    let folds: Vec<u64> = samples.iter().map(|s| s.fold(FOLDS)).collect();
    let mut train_mask = vec![0f32; (k * n) as usize];
    let mut stops = Vec::with_capacity(k as usize);
    for m in 0..k as usize {
        let held = folds.iter().filter(|&&x| x == m as u64).count();
        let early = held > 0 && held < folds.len();
        for (i, &fold) in folds.iter().enumerate() {
            train_mask[m * n as usize + i] = if early && fold == m as u64 { 0.0 } else { 1.0 };
        }
        stops.push(early);
    }
    let train_mask = Tensor::from_slice(&train_mask).f_view([k, n, 1])?;
    let val_mask = train_mask.f_neg()?.f_add_scalar(1.0)?;
    let train_rows = train_mask.f_sum_dim_intlist([1i64, 2].as_slice(), false, Kind::Float)?;
    let val_rows = val_mask
        .f_sum_dim_intlist([1i64, 2].as_slice(), false, Kind::Float)?
        .f_clamp_min(1.0)?;

    let vs = nn::VarStore::new(Device::Cpu);
    let h = config.hidden;
    let dims = [(f, h), (h, h), (h, h), (h, 1)];
    // PyTorch's default for a linear layer: weights and biases uniform in
    // +-1/sqrt(fan_in).
    let layers: Vec<Layer> = dims
        .iter()
        .enumerate()
        .map(|(i, &(a, b))| {
            let bound = 1.0 / (a as f64).sqrt();
            let root = vs.root();
            Layer {
                w: root.uniform(&format!("w{i}"), &[k, a, b], -bound, bound),
                b: root.uniform(&format!("b{i}"), &[k, 1, b], -bound, bound),
            }
        })
        .collect();
    let mut opt = nn::AdamW {
        wd: config.weight_decay,
        ..Default::default()
    }
    .build(&vs, config.learning_rate)?;
    let xk = xn.f_unsqueeze(0)?.f_expand([k, n, f], false)?;
    let ln_y = y.f_unsqueeze(0)?;
    let ln_base = base_ln(&x, &base)?.f_unsqueeze(0)?;
    let mut best: Vec<Layer> = layers
        .iter()
        .map(|l| Layer {
            w: l.w.detach().copy(),
            b: l.b.detach().copy(),
        })
        .collect();
    let mut best_val = vec![f64::INFINITY; k as usize];
    let mut best_epoch = vec![config.epochs; k as usize];
    let mut final_loss = f64::NAN;
    for epoch in 0..config.epochs {
        if epoch == config.epochs * 3 / 4 {
            opt.set_lr(config.learning_rate / 10.0);
        }
        let pred = run_layers(&layers, &xk)?;
        // |exp(pred_ln - y_ln) - 1|, the relative error of the latency.
        let rel = pred
            .f_sub(&tn)?
            .f_mul_scalar(y_std)?
            .f_exp()?
            .f_sub_scalar(1.0)?
            .f_abs()?;
        let per_member = rel
            .f_mul(&train_mask)?
            .f_sum_dim_intlist([1i64, 2].as_slice(), false, Kind::Float)?
            .f_div(&train_rows)?;
        let loss = per_member.f_mean(Kind::Float)?;
        opt.zero_grad();
        loss.f_backward()?;
        opt.step();
        final_loss = loss.f_double_value(&[])?;
        let last = epoch + 1 == config.epochs;
        if (epoch + 1) % CHECK_EVERY == 0 || last {
            let _guard = tch::no_grad_guard();
            let val: Vec<f64> = run_layers(&layers, &xk)?
                .f_mul_scalar(y_std)?
                .f_add_scalar(y_mean)?
                .f_add(&ln_base)?
                .f_clamp(y_lo, y_hi)?
                .f_sub(&ln_y)?
                .f_exp()?
                .f_sub_scalar(1.0)?
                .f_abs()?
                .f_mul(&val_mask)?
                .f_sum_dim_intlist([1i64, 2].as_slice(), false, Kind::Double)?
                .f_div(&val_rows)?
                .f_mul_scalar(100.0)?
                .try_into()?;
            for m in 0..k as usize {
                // A member without a fold keeps its last epoch.
                let better = if stops[m] { val[m] < best_val[m] } else { last };
                if better {
                    best_val[m] = if stops[m] { val[m] } else { f64::NAN };
                    best_epoch[m] = epoch + 1;
                    for (b, l) in best.iter_mut().zip(&layers) {
                        b.w.get(m as i64).f_copy_(&l.w.get(m as i64))?;
                        b.b.get(m as i64).f_copy_(&l.b.get(m as i64))?;
                    }
                }
            }
        }
    }
    Ok(TrainedNet {
        op_type: op_type.to_owned(),
        layers: best,
        mean,
        std,
        y_mean,
        y_std,
        y_range: (y_lo as f32, y_hi as f32),
        base,
        final_loss,
        validation_mape: best_val,
        best_epoch,
    })
}

/// Every member on `x: [members, n, in]`: `[members, n, 1]`.
fn run_layers(layers: &[Layer], x: &Tensor) -> Result<Tensor, tch::TchError> {
    let mut h = x.shallow_clone();
    for (i, l) in layers.iter().enumerate() {
        h = h.f_bmm(&l.w)?.f_add(&l.b)?;
        if i + 1 < layers.len() {
            h = h.f_relu()?;
        }
    }
    Ok(h)
}

impl TrainedNet {
    /// tch's prediction of `ln(ns)` for rows of [`FEATURE_LEN`] features.
    pub fn forward(&self, features: &[f32]) -> Result<Vec<f32>, tch::TchError> {
        let _guard = tch::no_grad_guard();
        let n = (features.len() / FEATURE_LEN) as i64;
        let k = self.layers[0].w.size()[0];
        let x = Tensor::from_slice(features).f_view([n, FEATURE_LEN as i64])?;
        let xn = x
            .f_sub(&self.mean)?
            .f_div(&self.std)?
            .f_clamp(-INPUT_CLIP, INPUT_CLIP)?
            .f_unsqueeze(0)?
            .f_expand([k, n, FEATURE_LEN as i64], false)?;
        // Each member in ln units (the scale folded in as in the export),
        // then their mean, then the base, as the ONNX graph adds them.
        let members = run_layers(&self.layers, &xn)?
            .f_mul_scalar(self.y_std)?
            .f_add_scalar(self.y_mean)?;
        let y = members
            .f_sum_dim_intlist([0i64].as_slice(), false, Kind::Float)?
            .f_mul_scalar(1.0 / k as f64)?
            .f_add(&base_ln(&x, &self.base)?)?
            .f_clamp(f64::from(self.y_range.0), f64::from(self.y_range.1))?;
        Vec::<f32>::try_from(y.f_view([-1])?)
    }

    /// The ensemble as plain numbers, the target's scale folded into each
    /// member's last layer (`w * y_std`, `b * y_std + y_mean`).
    pub fn to_mlp(&self) -> Result<Mlp, tch::TchError> {
        let _guard = tch::no_grad_guard();
        let vec = |t: &Tensor| Vec::<f32>::try_from(t.f_contiguous()?.f_view([-1])?);
        let last = self.layers.len() - 1;
        let k = self.layers[0].w.size()[0];
        let mut members = Vec::with_capacity(k as usize);
        for m in 0..k {
            let mut layers = Vec::with_capacity(self.layers.len());
            for (i, l) in self.layers.iter().enumerate() {
                // Stored [in, out] for x W; Dense is [out, in].
                let w_t = l.w.get(m).f_transpose(0, 1)?;
                let size = w_t.size();
                let (mut w, mut b) = (vec(&w_t)?, vec(&l.b.get(m))?);
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
            members.push(layers);
        }
        Ok(Mlp {
            op_type: self.op_type.clone(),
            mean: vec(&self.mean)?,
            std: vec(&self.std)?,
            members,
            base: self.base,
            clamp: self.y_range,
        })
    }
}
