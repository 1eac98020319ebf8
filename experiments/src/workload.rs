//! The TENSILE paper's experiments (section V) as workloads:
//! - Table III ([`Experiment::Single`]): one job at batch 16, each of the
//!   five models (and BERT-base);
//! - Fig. 6 ([`Experiment::Copies`]): 1-3 copies of one model at batch 2,
//!   all started together;
//! - Table IV ([`Experiment::Mixed`]): the five models at batch 2, launched
//!   one by one in a random order (seeded), [`MIXED_GAP_NS`] apart;
//! - Fig. 7 ([`Experiment::Batch`]): each model alone at batch 2-32.

use rand::SeedableRng;
use rand::rngs::ChaCha8Rng;
use rand::seq::SliceRandom;
use serde::Serialize;
use tensile_graph::Graph;
use tensile_graph::builder::{Optimizer, Step};
use tensile_graph::zoo::{self, ZooConfig};

use crate::ExperimentError;

/// The paper's five models.
pub const MODELS: [&str; 5] = [
    "vgg16",
    "resnet50",
    "inception_v3",
    "inception_v4",
    "densenet121",
];
/// Fig. 7's batch sizes.
pub const BATCHES: [u64; 5] = [2, 4, 8, 16, 32];
/// Launch interval of the mixed workload's jobs.
pub const MIXED_GAP_NS: u64 = 10_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Experiment {
    /// Table III: one job at batch 16.
    Single,
    /// Fig. 6: 1-3 copies of one model at batch 2.
    Copies,
    /// Table IV: the five models at batch 2, launched one by one.
    Mixed,
    /// Fig. 7: one job, batch 2-32.
    Batch,
}

impl Experiment {
    pub const ALL: [Experiment; 4] = [
        Experiment::Single,
        Experiment::Copies,
        Experiment::Mixed,
        Experiment::Batch,
    ];
}

/// One job of a workload: a zoo model at a batch size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZooJob {
    pub model: String,
    pub batch: u64,
}

/// One workload of one experiment.
#[derive(Debug, Clone)]
pub struct Workload {
    pub experiment: Experiment,
    /// For people: `resnet50 x2 b2`.
    pub name: String,
    pub jobs: Vec<ZooJob>,
    /// When each job starts, ns (empty: all at 0).
    pub starts: Vec<u64>,
    /// How the workload was run, where that needs saying.
    pub note: String,
}

impl Workload {
    /// `k` copies of `model` at `batch`, started together.
    fn copies(experiment: Experiment, model: &str, batch: u64, k: usize) -> Workload {
        Workload {
            experiment,
            name: if k == 1 {
                format!("{model} b{batch}")
            } else {
                format!("{model} x{k} b{batch}")
            },
            jobs: vec![
                ZooJob {
                    model: model.to_string(),
                    batch,
                };
                k
            ],
            starts: Vec::new(),
            note: String::new(),
        }
    }

    /// Builds every job's graph.
    pub fn build(&self, optimizer: Optimizer, step: Step) -> Result<Vec<Graph>, ExperimentError> {
        self.jobs
            .iter()
            .map(|j| {
                let mut cfg = ZooConfig::new(j.batch);
                cfg.optimizer = optimizer;
                cfg.step = step;
                zoo::build(&j.model, &cfg).map_err(|e| ExperimentError::Zoo {
                    what: format!("{}:{}", j.model, j.batch),
                    source: Box::new(e),
                })
            })
            .collect()
    }
}

/// Every workload of the paper's experiments; `quick`: only ResNet-50 (and
/// the mixed five) at fewer batch sizes, a smoke run.
pub fn paper_workloads(seed: u64, quick: bool) -> Vec<Workload> {
    let models: &[&str] = if quick { &MODELS[1..2] } else { &MODELS };
    let mut out = Vec::new();
    for m in models
        .iter()
        .copied()
        .chain((!quick).then_some("bert_base"))
    {
        out.push(Workload::copies(Experiment::Single, m, 16, 1));
    }
    for &m in models {
        for k in 1..=3 {
            out.push(Workload::copies(Experiment::Copies, m, 2, k));
        }
    }
    let order = mixed_order(seed);
    out.push(Workload {
        experiment: Experiment::Mixed,
        name: "mixed five b2".into(),
        note: format!(
            "launched {} ms apart in the order {}",
            MIXED_GAP_NS / 1_000_000,
            order.join(", ")
        ),
        jobs: order
            .iter()
            .map(|m| ZooJob {
                model: m.to_string(),
                batch: 2,
            })
            .collect(),
        starts: (0..order.len() as u64).map(|k| k * MIXED_GAP_NS).collect(),
    });
    let batches: &[u64] = if quick { &BATCHES[..2] } else { &BATCHES };
    for &m in models {
        for &b in batches {
            out.push(Workload::copies(Experiment::Batch, m, b, 1));
        }
    }
    out
}

/// The paper launched the five one by one in a random order: a shuffle
/// by a ChaCha8 stream seeded with `seed` (reproducible on every platform;
/// the shuffle itself is rand's, pinned by the lock file).
pub fn mixed_order(seed: u64) -> Vec<&'static str> {
    let mut order: Vec<&str> = MODELS.to_vec();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    order
}
