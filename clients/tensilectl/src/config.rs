//! Validated configurations: what the raw arguments of `args` become before
//! anything runs (ripgrep's low-level → high-level arguments). Every check
//! of a flag's value, every device and graph lookup happens here, so that
//! a command either starts with a complete configuration or fails with the
//! flag named.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use tensile_baselines::Policy;
use tensile_experiments::{BenchConfig, ColdStart, PlanOptions, SimOptions, device_profile};
use tensile_graph::Graph;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_latency_model::DeviceProfile;

use crate::args::{BenchPaperArgs, DeviceArgs, PlanArgs, SimArgs};
use crate::input;

/// `tensilectl plan`.
#[derive(Debug)]
pub(crate) struct PlanCommand {
    pub(crate) graph: Graph,
    /// The zoo model's name.
    pub(crate) model: String,
    pub(crate) batch: Option<u64>,
    pub(crate) profile: DeviceProfile,
    pub(crate) options: PlanOptions,
    pub(crate) json: bool,
}

impl PlanCommand {
    pub(crate) fn from_args(a: &PlanArgs) -> Result<PlanCommand> {
        let profile = device_profile(&a.device.device)?;
        let graph = input::zoo_graph(&a.model)?;
        Ok(PlanCommand {
            graph,
            model: a.model.model.clone().unwrap_or_default(),
            batch: Some(a.model.batch),
            profile,
            options: PlanOptions {
                seed: a.device.seed,
                exact: a.device.exact,
                budget_bytes: budget_bytes(&a.device),
                stop_at_budget: a.device.stop_at_budget,
                cold_start: ColdStart::parse(&a.device.latency_models),
            },
            json: a.json,
        })
    }
}

/// `tensilectl sim`.
#[derive(Debug)]
pub(crate) struct SimCommand {
    pub(crate) graphs: Vec<Graph>,
    pub(crate) policy: Policy,
    pub(crate) profile: DeviceProfile,
    pub(crate) options: SimOptions,
    pub(crate) json: bool,
    pub(crate) plot: Option<PathBuf>,
}

impl SimCommand {
    pub(crate) fn from_args(a: &SimArgs) -> Result<SimCommand> {
        if a.iterations == 0 || a.iterations > 10_000 {
            bail!("--iterations must be in 1..=10000, got {}", a.iterations);
        }
        let profile = device_profile(&a.device.device)?;
        let graphs = parse_jobs(&a.jobs, a)?;
        let policy = Policy::parse(&a.policy)?;
        check_activation_budget(a.activation_budget)?;
        Ok(SimCommand {
            graphs,
            policy,
            profile,
            options: SimOptions {
                iterations: a.iterations,
                seed: a.device.seed,
                exact: a.device.exact,
                no_sharing: a.no_sharing,
                budget_bytes: budget_bytes(&a.device),
                stop_at_budget: a.device.stop_at_budget,
                activation_budget: a.activation_budget,
                starts: Vec::new(),
                cold_start: ColdStart::parse(&a.device.latency_models),
            },
            json: a.json,
            plot: a.plot.clone(),
        })
    }
}

/// `tensilectl bench paper`.
#[derive(Debug)]
pub(crate) struct BenchCommand {
    pub(crate) config: BenchConfig,
    pub(crate) json: bool,
    pub(crate) plot: Option<PathBuf>,
}

impl BenchCommand {
    pub(crate) fn from_args(a: &BenchPaperArgs) -> Result<BenchCommand> {
        if a.iterations < 2 || a.iterations > 1000 {
            bail!(
                "--iterations must be in 2..=1000 (the first is the cold start), got {}",
                a.iterations
            );
        }
        let devices: Vec<DeviceProfile> = list(&a.device)
            .map(device_profile)
            .collect::<Result<_, _>>()?;
        if devices.is_empty() {
            bail!("--device is empty");
        }
        let policies: Vec<Policy> = list(&a.policies)
            .map(Policy::parse)
            .collect::<Result<_, _>>()?;
        check_activation_budget(a.activation_budget)?;
        Ok(BenchCommand {
            config: BenchConfig {
                devices,
                policies,
                iterations: a.iterations,
                seed: a.seed,
                activation_budget: a.activation_budget,
                optimizer: input::optimizer(&a.opt)?,
                quick: a.quick,
                threads: a.jobs,
            },
            json: a.json,
            plot: a.plot.clone(),
        })
    }
}

/// The non-empty items of a comma-separated list.
fn list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty())
}

fn budget_bytes(d: &DeviceArgs) -> Option<u64> {
    d.budget_mb.map(|mb| mb * 1_000_000)
}

fn check_activation_budget(b: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&b) {
        bail!("--activation-budget must be in [0, 1], got {b}");
    }
    Ok(())
}

/// `--jobs`: MODEL:BATCH entries, comma separated.
fn parse_jobs(spec: &str, a: &SimArgs) -> Result<Vec<Graph>> {
    let optimizer = input::optimizer(&a.opt)?;
    let mut out = Vec::new();
    for item in list(spec) {
        let (name, batch) = item
            .split_once(':')
            .with_context(|| format!("job {item:?}: expected MODEL:BATCH"))?;
        let batch: u64 = batch
            .parse()
            .with_context(|| format!("job {item:?}: batch {batch:?} is not a number"))?;
        let mut cfg = ZooConfig::new(batch);
        cfg.optimizer = optimizer;
        out.push(zoo::build(name, &cfg).with_context(|| format!("job {item:?}"))?);
    }
    if out.is_empty() {
        bail!("--jobs is empty");
    }
    Ok(out)
}
