//! Validated configurations: what the raw arguments of `args` become before
//! anything runs (ripgrep's low-level → high-level arguments). Every check
//! of a flag's value, every device and graph lookup happens here, so that
//! a command either starts with a complete configuration or fails with the
//! flag named.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use tensile_baselines::Policy;
use tensile_cli::Mb;
use tensile_experiments::sweep::{self, SweepConfig};
use tensile_experiments::{
    BenchConfig, ColdStart, ColocateCase, ColocateConfig, PlanOptions, SimOptions, device_profile,
};
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Graph, Limits};
use tensile_latency_model::DeviceProfile;

use crate::args::{BenchColocateArgs, BenchPaperArgs, DeviceArgs, PlanArgs, SimArgs};
use crate::input;

/// `tensilectl plan`.
#[derive(Debug)]
pub(crate) struct PlanCommand {
    pub(crate) graph: Graph,
    /// The zoo model's name, or the graph file's graph name.
    pub(crate) model: String,
    /// The zoo batch size; none for a graph file.
    pub(crate) batch: Option<u64>,
    pub(crate) profile: DeviceProfile,
    pub(crate) options: PlanOptions,
    pub(crate) json: bool,
    /// Where the plan file goes.
    pub(crate) output: Option<PathBuf>,
}

impl PlanCommand {
    pub(crate) fn from_args(a: &PlanArgs) -> Result<PlanCommand> {
        let profile = device_profile(&a.device.device)?;
        let (graph, model, batch) = match &a.file {
            Some(path) => {
                let graph = input::graph_file(path, &Limits::default())
                    .with_context(|| path.display().to_string())?;
                let name = graph.name().to_string();
                (graph, name, None)
            }
            None => {
                let graph = input::zoo_graph(&a.model)?;
                let name = a.model.model.clone().unwrap_or_default();
                (graph, name, Some(a.model.batch))
            }
        };
        Ok(PlanCommand {
            graph,
            model,
            batch,
            profile,
            options: PlanOptions {
                seed: a.device.seed,
                exact: a.device.exact,
                budget_bytes: budget_bytes(&a.device),
                stop_at_budget: a.device.stop_at_budget,
                cold_start: ColdStart::parse(&a.device.latency_models),
                recompute: !a.no_recompute,
                ort_library: None,
            },
            json: a.json,
            output: a.output.clone(),
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
        let profile = if a.one_process {
            tensile_experiments::device::one_process(&profile, graphs.len())
        } else {
            profile
        };
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
                coordinate: !a.no_gates,
                recompute_first: a.recompute_first,
                turns: Default::default(),
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
        let (optimizer, step) = input::optimizer(&a.opt)?;
        Ok(BenchCommand {
            config: BenchConfig {
                devices,
                policies,
                iterations: a.iterations,
                seed: a.seed,
                activation_budget: a.activation_budget,
                optimizer,
                step,
                quick: a.quick,
                threads: a.jobs,
            },
            json: a.json,
            plot: a.plot.clone(),
        })
    }
}

/// `tensilectl bench colocate`.
#[derive(Debug)]
pub(crate) struct ColocateCommand {
    pub(crate) mode: ColocateMode,
    pub(crate) json: bool,
    pub(crate) plot: Option<PathBuf>,
    /// The sweep's rows, one JSON line each, appended as they are done.
    pub(crate) out: Option<PathBuf>,
}

/// The given cases, or the sweep (`--sweep`).
#[derive(Debug)]
pub(crate) enum ColocateMode {
    Cases(ColocateConfig),
    Sweep(SweepConfig),
}

const DEFAULT_CASES: &str = "resnet50:32x2,resnet50:32x3,bert_base:16x2,bert_base:16x2:adam-in-backward,bert_base:16x2:adam-on-host";

impl ColocateCommand {
    pub(crate) fn from_args(a: &BenchColocateArgs) -> Result<ColocateCommand> {
        let default_devices = if a.sweep {
            "a6000,h100,h200"
        } else {
            "a6000,h100"
        };
        let devices: Vec<DeviceProfile> = list(a.device.as_deref().unwrap_or(default_devices))
            .map(device_profile)
            .collect::<Result<_, _>>()?;
        if devices.is_empty() {
            bail!("--device is empty");
        }
        let fractions = list(&a.fractions)
            .map(|f| match f.parse::<f64>() {
                Ok(x) if x > 0.0 && x <= 1.0 => Ok(x),
                _ => bail!("--fractions: {f:?} is not a number in (0, 1]"),
            })
            .collect::<Result<Vec<_>>>()?;
        let seeds = seeds(
            a.seeds
                .as_deref()
                .unwrap_or(if a.sweep { "1..8" } else { "1,2,3" }),
        )?;
        if fractions.is_empty() || seeds.is_empty() {
            bail!("--fractions and --seeds need at least one value each");
        }
        if a.iterations > 1000 || a.warmup + 2 > a.iterations {
            bail!(
                "--iterations must be at most 1000 and leave two after --warmup ({} and {})",
                a.iterations,
                a.warmup
            );
        }
        let mode = if a.sweep {
            ColocateMode::Sweep(sweep_config(a, devices, fractions, seeds)?)
        } else {
            let cases = cases(a.cases.as_deref().unwrap_or(DEFAULT_CASES))?;
            ColocateMode::Cases(ColocateConfig {
                devices,
                cases,
                fractions,
                seeds,
                iterations: a.iterations,
                warmup: a.warmup,
                threads: a.jobs.max(1),
                recompute_first: a.recompute_first,
                one_process: a.one_process,
            })
        };
        Ok(ColocateCommand {
            mode,
            json: a.json,
            plot: a.plot.clone(),
            out: a.out.clone(),
        })
    }
}

/// `--cases`: MODEL:BATCHxCOPIES[:OPTIMIZER], comma separated.
fn cases(spec: &str) -> Result<Vec<ColocateCase>> {
    let cases = list(spec)
        .map(|c| {
            let bad = || {
                format!(
                    "--cases: {c:?} is not MODEL:BATCHxCOPIES[:OPTIMIZER] (e.g. resnet50:32x2, bert_base:16x2:adam-in-backward)"
                )
            };
            let (model, rest) = c.split_once(':').with_context(bad)?;
            let (rest, optimizer) = match rest.split_once(':') {
                Some((rest, optimizer)) => (rest, Some(optimizer)),
                None => (rest, None),
            };
            let (batch, copies) = rest.split_once('x').with_context(bad)?;
            let batch: u64 = batch.parse().ok().with_context(bad)?;
            let copies: usize = copies.parse().ok().with_context(bad)?;
            zoo::model(model)?;
            if batch == 0 || !(1..=16).contains(&copies) {
                bail!("--cases: {c:?} needs a batch of 1 or more and 1 to 16 copies");
            }
            let case = ColocateCase::new(model, batch, copies);
            match optimizer {
                Some(o) => case.with_optimizer(o).with_context(|| format!("--cases: {c:?}")),
                None => Ok(case),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    if cases.is_empty() {
        bail!("--cases is empty");
    }
    Ok(cases)
}

/// `--seeds`: seeds and FIRST..LAST ranges, comma separated.
fn seeds(spec: &str) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for x in list(spec) {
        let num = |v: &str| {
            v.trim()
                .parse::<u64>()
                .with_context(|| format!("--seeds: {x:?} is not a seed or FIRST..LAST"))
        };
        match x.split_once("..") {
            Some((first, last)) => {
                let (first, last) = (num(first)?, num(last)?);
                if last < first || last - first >= 10_000 {
                    bail!("--seeds: {x:?} is not a range of 1 to 10000 seeds");
                }
                out.extend(first..=last);
            }
            None => out.push(num(x)?),
        }
    }
    Ok(out)
}

/// `--sweep`'s configuration from `--models`, `--copies` and the rest.
fn sweep_config(
    a: &BenchColocateArgs,
    devices: Vec<DeviceProfile>,
    fractions: Vec<f64>,
    seeds: Vec<u64>,
) -> Result<SweepConfig> {
    let all: Vec<&str> = zoo::MODELS.iter().map(|m| m.name).collect();
    let spec = a.models.clone().unwrap_or_else(|| all.join(","));
    let mut models: Vec<(String, u64)> = Vec::new();
    for m in list(&spec) {
        let (name, batch) = match m.split_once(':') {
            Some((name, b)) => match b.parse::<u64>() {
                Ok(b) if (1..=zoo::MAX_BATCH).contains(&b) => (name, b),
                _ => bail!(
                    "--models: {m:?} is not MODEL[:BATCH] with a batch of 1 to {}",
                    zoo::MAX_BATCH
                ),
            },
            None => (m, sweep::reference_batch(m)),
        };
        zoo::model(name).with_context(|| format!("--models: {m:?}"))?;
        if models.iter().any(|x| x.0 == name) {
            bail!("--models: {name} is given twice");
        }
        models.push((name.to_string(), batch));
    }
    if models.is_empty() {
        bail!("--models is empty");
    }
    let copies = list(a.copies.as_deref().unwrap_or("2,3"))
        .map(|k| match k.parse::<usize>() {
            Ok(k) if (2..=3).contains(&k) => Ok(k),
            _ => bail!("--copies: {k:?} is not 2 or 3"),
        })
        .collect::<Result<Vec<_>>>()?;
    let bound_grid = a.bound_grid.unwrap_or(16);
    if !(1..=256).contains(&bound_grid) {
        bail!("--bound-grid must be 1 to 256, got {bound_grid}");
    }
    if a.one_process {
        bail!("--one-process does not go with --sweep (pairs of models are two processes)");
    }
    Ok(SweepConfig {
        devices,
        models,
        copies,
        pairs: !a.no_pairs,
        fractions,
        seeds,
        iterations: a.iterations,
        warmup: a.warmup,
        threads: a.jobs.max(1),
        recompute_first: a.recompute_first,
        bound_grid,
    })
}

/// The non-empty items of a comma-separated list.
fn list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty())
}

fn budget_bytes(d: &DeviceArgs) -> Option<u64> {
    d.budget_mb.map(Mb::bytes)
}

fn check_activation_budget(b: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&b) {
        bail!("--activation-budget must be in [0, 1], got {b}");
    }
    Ok(())
}

/// One entry of `--jobs`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum JobSpec {
    Zoo { model: String, batch: u64 },
    File(PathBuf),
}

impl JobSpec {
    /// A path when it looks like one (a `/`, a `.json` ending) or names an
    /// existing file; else MODEL:BATCH.
    fn parse(item: &str) -> Result<JobSpec> {
        if item.contains('/') || item.ends_with(".json") || Path::new(item).is_file() {
            return Ok(JobSpec::File(PathBuf::from(item)));
        }
        let (model, batch) = item.split_once(':').with_context(|| {
            format!("job {item:?}: expected MODEL:BATCH or a graph file (a path with a / or ending in .json)")
        })?;
        let batch = batch
            .parse()
            .with_context(|| format!("job {item:?}: batch {batch:?} is not a number"))?;
        Ok(JobSpec::Zoo {
            model: model.to_string(),
            batch,
        })
    }
}

/// `--jobs`: every entry's graph, built from the zoo or read from its file.
fn parse_jobs(spec: &str, a: &SimArgs) -> Result<Vec<Graph>> {
    let (optimizer, step) = input::optimizer(&a.opt)?;
    let mut out = Vec::new();
    for item in list(spec) {
        let graph = match JobSpec::parse(item)? {
            JobSpec::Zoo { model, batch } => {
                let mut cfg = ZooConfig::new(batch);
                cfg.optimizer = optimizer;
                cfg.step = step;
                zoo::build(&model, &cfg).map_err(anyhow::Error::from)
            }
            JobSpec::File(path) => {
                input::graph_file(&path, &Limits::default()).map_err(anyhow::Error::from)
            }
        };
        out.push(graph.with_context(|| format!("job {item:?}"))?);
    }
    if out.is_empty() {
        bail!("--jobs is empty");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::JobSpec;

    #[test]
    fn jobs_are_zoo_models_or_graph_files() {
        let zoo = |m: &str, b| JobSpec::Zoo {
            model: m.into(),
            batch: b,
        };
        let file = |p: &str| JobSpec::File(p.into());
        assert_eq!(JobSpec::parse("resnet50:16").unwrap(), zoo("resnet50", 16));
        assert_eq!(
            JobSpec::parse("traced/r18.json").unwrap(),
            file("traced/r18.json")
        );
        assert_eq!(JobSpec::parse("r18.json").unwrap(), file("r18.json"));
        assert_eq!(JobSpec::parse("/tmp/graph").unwrap(), file("/tmp/graph"));
        // The crate's manifest exists, so it is taken as a (bad) graph file.
        assert_eq!(JobSpec::parse("Cargo.toml").unwrap(), file("Cargo.toml"));
        let err = JobSpec::parse("resnet50").unwrap_err().to_string();
        assert!(
            err.contains("expected MODEL:BATCH or a graph file"),
            "{err}"
        );
        let err = JobSpec::parse("resnet50:x").unwrap_err().to_string();
        assert!(err.contains("is not a number"), "{err}");
    }
}
