//! What one job of the process trains: from the flags (one job, or its
//! `--copies`), or from a `--job` spec (`model=resnet50,batch=8`), one per
//! job of a process that trains different jobs. Each checked with an error
//! naming the spec and the key.

use std::path::PathBuf;

use anyhow::{Result, bail};

use crate::args::Args;

/// Where a job's graph comes from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Source {
    /// A zoo model at a batch, resolution and optimizer.
    Zoo {
        model: String,
        batch: u64,
        resolution: Option<u64>,
        optimizer: String,
    },
    /// A JSON graph file.
    File(PathBuf),
}

/// One job of the process.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JobSpec {
    pub(crate) source: Source,
    /// Its plan file (else the process's policy: --vanilla or the
    /// scheduler).
    pub(crate) plan: Option<PathBuf>,
    /// Its name at the scheduler (default: the graph's, numbered when the
    /// process trains several).
    pub(crate) name: Option<String>,
    pub(crate) priority: i32,
    pub(crate) seed: i64,
    pub(crate) init_params: Option<PathBuf>,
    pub(crate) inputs: Option<PathBuf>,
    /// Files of its own: as given (a `--job` spec's), or the process's
    /// flag's with the job's number before the extension (see `JobCopy`).
    pub(crate) save_params: Option<PathBuf>,
    pub(crate) memory_trace: Option<PathBuf>,
}

/// The keys a `--job` spec takes.
pub(crate) const KEYS: &str = "model, graph, batch, resolution, optimizer, plan, name, priority, seed, init-params, inputs, save-params, memory-trace";

impl JobSpec {
    /// The job the flags name (`--model` or `--graph` and the rest).
    pub(crate) fn from_args(args: &Args) -> Result<JobSpec> {
        let source = match (&args.model, &args.graph) {
            (_, Some(path)) => Source::File(path.clone()),
            (Some(model), None) => Source::Zoo {
                model: model.clone(),
                batch: args.batch,
                resolution: args.resolution,
                optimizer: args.optimizer.clone(),
            },
            (None, None) => {
                bail!("name a zoo model with --model, give --graph FILE, or --job SPEC")
            }
        };
        Ok(JobSpec {
            source,
            plan: args.plan.clone(),
            name: args.name.clone(),
            priority: args.priority,
            seed: args.seed,
            init_params: args.init_params.clone(),
            inputs: args.inputs.clone(),
            save_params: args.save_params.clone(),
            memory_trace: args.memory_trace.clone(),
        })
    }

    /// A `--job` spec: `KEY=VALUE` pairs joined by commas, `model=` or
    /// `graph=` among them; `priority`, `seed`, `init-params` and `inputs`
    /// default to the process's flags; `save-params` and `memory-trace`
    /// to the process's `--save-params` and `--memory-trace` with the job's
    /// number `index` before the extension.
    pub(crate) fn parse(text: &str, index: usize, args: &Args) -> Result<JobSpec> {
        let mut model = None;
        let mut graph = None;
        let mut batch = None;
        let mut resolution = None;
        let mut optimizer = None;
        let mut spec = JobSpec {
            source: Source::File(PathBuf::new()),
            plan: None,
            name: None,
            priority: args.priority,
            seed: args.seed,
            init_params: args.init_params.clone(),
            inputs: args.inputs.clone(),
            save_params: args.save_params.as_ref().map(|p| numbered(p, index)),
            memory_trace: args.memory_trace.as_ref().map(|p| numbered(p, index)),
        };
        let mut seen = Vec::new();
        for pair in text.split(',') {
            let Some((key, value)) = pair.split_once('=') else {
                bail!("--job {text:?}: {pair:?} is not KEY=VALUE (keys: {KEYS})");
            };
            let (key, value) = (key.trim(), value.trim());
            if value.is_empty() {
                bail!("--job {text:?}: {key} has no value");
            }
            if seen.contains(&key) {
                bail!("--job {text:?}: {key} is given twice");
            }
            seen.push(key);
            let whole = |what: &str| -> Result<u64> {
                match value.parse::<u64>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => bail!(
                        "--job {text:?}: {key}={value}: {what} must be a whole number above 0"
                    ),
                }
            };
            match key {
                "model" => model = Some(value.to_string()),
                "graph" => graph = Some(PathBuf::from(value)),
                "batch" => batch = Some(whole("the batch")?),
                "resolution" => resolution = Some(whole("the resolution")?),
                "optimizer" => optimizer = Some(value.to_string()),
                "plan" => spec.plan = Some(PathBuf::from(value)),
                "name" => spec.name = Some(value.to_string()),
                "priority" => {
                    spec.priority = value.parse().map_err(|_| {
                        anyhow::anyhow!("--job {text:?}: priority={value}: not a whole number")
                    })?;
                }
                "seed" => {
                    spec.seed = value.parse().map_err(|_| {
                        anyhow::anyhow!("--job {text:?}: seed={value}: not a whole number")
                    })?;
                }
                "init-params" => spec.init_params = Some(PathBuf::from(value)),
                "inputs" => spec.inputs = Some(PathBuf::from(value)),
                "save-params" => spec.save_params = Some(PathBuf::from(value)),
                "memory-trace" => spec.memory_trace = Some(PathBuf::from(value)),
                other => bail!("--job {text:?}: unknown key {other:?} (keys: {KEYS})"),
            }
        }
        spec.source = match (model, graph) {
            (Some(model), None) => Source::Zoo {
                model,
                batch: batch.unwrap_or(16),
                resolution,
                optimizer: optimizer.unwrap_or_else(|| "adam".into()),
            },
            (None, Some(path)) => {
                if batch.is_some() || resolution.is_some() || optimizer.is_some() {
                    bail!(
                        "--job {text:?}: batch, resolution and optimizer are a zoo model's (model=); a graph file has its own"
                    );
                }
                Source::File(path)
            }
            (Some(_), Some(_)) => bail!("--job {text:?}: model= or graph=, not both"),
            (None, None) => {
                bail!("--job {text:?}: name a zoo model (model=NAME) or a graph file (graph=FILE)")
            }
        };
        Ok(spec)
    }
}

/// `path` with `index` before its extension (trace.csv: trace.1.csv).
pub(crate) fn numbered(path: &std::path::Path, index: usize) -> PathBuf {
    let mut name = path
        .file_stem()
        .map_or_else(Default::default, |s| s.to_os_string());
    name.push(format!(".{index}"));
    if let Some(ext) = path.extension() {
        name.push(".");
        name.push(ext);
    }
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["tensile-worker", "--job", "model=x", "--vanilla"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).expect("flags")
    }

    #[test]
    fn a_spec_names_its_job_and_takes_the_rest_from_the_flags() {
        let a = args(&["--seed", "3", "--memory-trace", "out/t.csv"]);
        let s = JobSpec::parse("model=resnet50, batch=8,resolution=64,name=r", 1, &a).expect("ok");
        assert_eq!(
            s.source,
            Source::Zoo {
                model: "resnet50".into(),
                batch: 8,
                resolution: Some(64),
                optimizer: "adam".into()
            }
        );
        assert_eq!((s.name.as_deref(), s.seed), (Some("r"), 3));
        assert_eq!(s.memory_trace, Some(PathBuf::from("out/t.1.csv")));
        let s = JobSpec::parse("graph=g.json,plan=p.json,memory-trace=m.csv,seed=9", 0, &a)
            .expect("ok");
        assert_eq!(s.source, Source::File("g.json".into()));
        assert_eq!(s.plan, Some(PathBuf::from("p.json")));
        assert_eq!(s.memory_trace, Some(PathBuf::from("m.csv")));
        assert_eq!(s.seed, 9);
    }

    #[test]
    fn a_bad_spec_says_what_is_wrong() {
        let a = args(&[]);
        for (spec, says) in [
            ("batch=8", "name a zoo model"),
            ("model=a,graph=b", "not both"),
            ("model=a,batch=0", "batch=0"),
            ("model=a,batch=x", "whole number"),
            ("model=a,colour=red", "unknown key \"colour\""),
            ("model=a,model=b", "model is given twice"),
            ("model", "not KEY=VALUE"),
            ("model=", "model has no value"),
            ("graph=g.json,batch=2", "a zoo model's"),
            ("model=a,seed=1.5", "seed=1.5"),
        ] {
            let e = JobSpec::parse(spec, 0, &a).expect_err(spec).to_string();
            assert!(e.contains(says) && e.contains("--job"), "{spec}: {e}");
        }
    }
}
