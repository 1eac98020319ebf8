//! How good and how fast the predictor is: per op type, the absolute
//! percentage error of the predicted latency on held-out samples (mean,
//! median, 90th percentile), and the wall time to predict every op of each
//! zoo model, split into feature extraction, ONNX Runtime calls and the
//! rest.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tensile_graph::zoo::{self, ZooConfig};

use crate::dataset::Sample;
use crate::predict::{PredictError, Predictor, Source};

/// Accuracy on one op type's samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Accuracy {
    pub samples: usize,
    /// Mean absolute percentage error, in percent.
    pub mape: f64,
    pub median_ape: f64,
    pub p90_ape: f64,
    /// Whether a learned model (not the roofline) predicted these.
    pub model: bool,
}

/// Time to predict one zoo model's graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Speed {
    pub model: String,
    pub batch: u64,
    pub ops: usize,
    pub from_model: usize,
    pub from_roofline: usize,
    /// Median over the timed calls, ms.
    pub predict_ms: f64,
    /// Medians of the parts of a call ([`crate::predict::PredictTiming`]),
    /// each over the timed calls (so they need not add up to
    /// `predict_ms` exactly), ms.
    pub features_ms: f64,
    pub runs_ms: f64,
    pub other_ms: f64,
    /// ONNX Runtime calls per prediction (one per op type with a model).
    pub run_calls: usize,
    /// Rows sent to the models: distinct feature vectors per op type.
    pub rows: usize,
}

/// Accuracy per op type of `predictor` on `samples` (one batched call per
/// op type; op types without a model are scored with the roofline).
pub fn accuracy(
    predictor: &Predictor,
    samples: &[Sample],
) -> Result<BTreeMap<String, Accuracy>, PredictError> {
    let mut by_type: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        by_type.entry(&s.op_type).or_default().push(s);
    }
    let mut out = BTreeMap::new();
    for (op_type, group) in by_type {
        let rows: Vec<f32> = group
            .iter()
            .flat_map(|s| s.features.iter().copied())
            .collect();
        let (predicted, model): (Vec<f64>, bool) = match predictor.predict_rows(op_type, &rows)? {
            Some(ln) => (ln.iter().map(|&x| f64::from(x).exp()).collect(), true),
            None => (
                group.iter().map(|s| roofline_of(predictor, s)).collect(),
                false,
            ),
        };
        let mut ape: Vec<f64> = group
            .iter()
            .zip(&predicted)
            .map(|(s, &p)| 100.0 * (p / s.ns.max(1) as f64 - 1.0).abs())
            .collect();
        ape.sort_by(f64::total_cmp);
        let n = ape.len();
        let pick = |q: f64| {
            ape.get(
                ((n as f64 * q).ceil() as usize)
                    .saturating_sub(1)
                    .min(n - 1),
            )
            .copied()
            .unwrap_or(0.0)
        };
        out.insert(
            op_type.to_owned(),
            Accuracy {
                samples: n,
                mape: ape.iter().sum::<f64>() / n as f64,
                median_ape: pick(0.5),
                p90_ape: pick(0.9),
                model,
            },
        );
    }
    Ok(out)
}

/// The fallback roofline's time for a sample, from its FLOPs and bytes features.
fn roofline_of(predictor: &Predictor, s: &Sample) -> f64 {
    let p = predictor.fallback_profile();
    let class = crate::roofline::op_class_of_type(&s.op_type);
    let Some(e) = p.efficiency.of(class) else {
        return 0.0;
    };
    let back = |x: f32| f64::from(x).exp2() - 1.0;
    let cost = crate::roofline::OpCost {
        flops: back(s.features[29]),
        bytes: back(s.features[30]),
    };
    crate::roofline::kernel_ns(p, &cost, e.compute, e.memory) as f64
}

/// Median time of `repeats` calls of [`Predictor::predict_graph`] on every
/// zoo model at `batch` (after one warm-up call), graph building excluded,
/// and the medians of its parts.
pub fn speed(
    predictor: &Predictor,
    batch: u64,
    repeats: usize,
) -> Result<Vec<Speed>, PredictError> {
    let mut out = Vec::new();
    for m in zoo::MODELS {
        let Ok(graph) = zoo::build(m.name, &ZooConfig::new(batch)) else {
            continue;
        };
        let (first, timing) = predictor.predict_graph_timed(&graph, 0.0)?;
        let n = repeats.max(1);
        let (mut total, mut features, mut runs, mut other) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for _ in 0..n {
            let t = Instant::now();
            let (p, parts) = predictor.predict_graph_timed(&graph, 0.0)?;
            total.push(t.elapsed());
            drop(p);
            features.push(parts.features);
            runs.push(parts.runs);
            other.push(parts.other);
        }
        let count = |src| first.source_per_op.iter().filter(|&&s| s == src).count();
        out.push(Speed {
            model: m.name.to_owned(),
            batch,
            ops: graph.ops().len(),
            from_model: count(Source::Model),
            from_roofline: count(Source::Roofline),
            predict_ms: median_ms(total),
            features_ms: median_ms(features),
            runs_ms: median_ms(runs),
            other_ms: median_ms(other),
            run_calls: timing.run_calls,
            rows: timing.rows,
        });
    }
    Ok(out)
}

fn median_ms(mut times: Vec<Duration>) -> f64 {
    times.sort();
    times
        .get(times.len() / 2)
        .map_or(0.0, |t| t.as_secs_f64() * 1e3)
}
