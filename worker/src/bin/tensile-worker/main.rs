//! `tensile-worker`: trains one job with real kernels, standalone: a zoo
//! model or a graph file, under a plan file (`tensilectl plan -o`) or none
//! (`--vanilla`), for K iterations, with real copies to a capped host pool
//! at a configured link bandwidth and a device memory budget. Prints one
//! line (or one JSON object) per iteration; progress goes to stderr. With
//! `--copies N` it trains N copies of the job at once, and with `--job
//! SPEC` repeated it trains different jobs at once, each on a thread of its
//! own, as jobs that share this one process (on a GPU: one CUDA context,
//! one set of library handles, one caching allocator), which they register
//! at the scheduler so that it counts the process's base once.

mod args;
mod copy;
mod setup;
mod spec;

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Parser;
use indicatif::MultiProgress;
use tensile_graph::{Graph, Liveness};

use crate::args::Args;
use crate::copy::{JobCopy, Kind, Shared, run_copy};
use crate::spec::JobSpec;

fn main() -> Result<()> {
    let args = Args::parse();
    // The jobs first: a bad --job spec is an error before anything loads.
    let (specs, kind) = if args.jobs.is_empty() {
        (vec![JobSpec::from_args(&args)?], Kind::Copy)
    } else {
        let specs = args
            .jobs
            .iter()
            .enumerate()
            .map(|(i, text)| JobSpec::parse(text, i, &args))
            .collect::<Result<Vec<_>>>()?;
        (specs, Kind::Job)
    };
    let device = setup::device(&args.device)?;
    if device.is_cuda() {
        setup::allocator_settings(&args.cuda_alloc_conf)?;
    }
    let engine = setup::engine(&args, device)?;
    if let Some(n) = args.threads {
        tch::set_num_threads(n);
    }
    let host = setup::host_config(&args)?;
    if let Some(dir) = &args.ledger {
        // Before the graph and the kernels load: a directory that cannot be
        // made or listed fails at once.
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::read_dir(dir).map(drop))
            .with_context(|| format!("--ledger {}: cannot use the directory", dir.display()))?;
    }
    let graphs: Vec<(Graph, Liveness)> = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let g = setup::graph(&spec.source).with_context(|| match kind {
                Kind::Job => format!("--job {:?}", args.jobs[i]),
                Kind::Copy => "the job".to_string(),
            })?;
            let live = Liveness::analyze(&g);
            Ok((g, live))
        })
        .collect::<Result<_>>()?;
    // The process's jobs: each spec once, or the one spec's copies.
    let of = match kind {
        Kind::Job => specs.len(),
        Kind::Copy => usize::from(args.copies),
    };
    let units: Vec<(usize, JobCopy)> = (0..of)
        .map(|index| {
            let spec = if kind == Kind::Job { index } else { 0 };
            (spec, JobCopy { index, of, kind })
        })
        .collect();
    // Jobs under one budget and no ledger named share a private one,
    // removed when they are done.
    let private = match (&args.ledger, args.memory_mb) {
        (None, Some(_)) if of > 1 => Some(setup::private_ledger()?),
        _ => None,
    };
    let bars = MultiProgress::new();
    let shared = Shared {
        process: setup::process_key(),
        device,
        engine,
        host,
        ledger: args
            .ledger
            .clone()
            .or_else(|| private.as_ref().map(|d| d.path().to_path_buf())),
        base: Arc::new(setup::base_meter(device, of, &bars)),
        bars,
    };
    if let [(spec, copy)] = units[..] {
        let (g, live) = &graphs[spec];
        return run_copy(&args, &specs[spec], g, live, &shared, copy);
    }
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let threads: Vec<_> = units
            .iter()
            .map(|&(spec, copy)| {
                let (args, shared) = (&args, &shared);
                let (spec, (g, live)) = (&specs[spec], &graphs[spec]);
                let word = if kind == Kind::Job { "job" } else { "copy" };
                std::thread::Builder::new()
                    .name(format!("{word}-{}", copy.index))
                    .spawn_scoped(s, move || run_copy(args, spec, g, live, shared, copy))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| match t {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("its thread panicked"))),
                Err(e) => Err(anyhow::Error::new(e).context("starting its thread")),
            })
            .collect()
    });
    // Every job ran to its end (one that fails does not stop the others);
    // each failure is named.
    let word = if kind == Kind::Job { "job" } else { "copy" };
    let failed: Vec<String> = results
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().err().map(|e| format!("{word} {i}: {e:#}")))
        .collect();
    if !failed.is_empty() {
        let what = if kind == Kind::Job { "jobs" } else { "copies" };
        bail!(
            "{} of {of} {what} failed:\n{}",
            failed.len(),
            failed.join("\n")
        );
    }
    Ok(())
}
