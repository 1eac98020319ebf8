//! `tensile-worker`: trains one job with real kernels, standalone: a zoo
//! model or a graph file, under a plan file (`tensilectl plan -o`) or none
//! (`--vanilla`), for K iterations, with real copies to a capped host pool
//! at a configured link bandwidth and a device memory budget. Prints one
//! line (or one JSON object) per iteration; progress goes to stderr. With
//! `--copies N` it trains N copies of the job at once, each on a thread of
//! its own, as N jobs that share this one process (on a GPU: one CUDA
//! context, one set of library handles, one caching allocator).

mod args;
mod copy;
mod setup;

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Parser;
use indicatif::MultiProgress;
use tensile_graph::Liveness;

use crate::args::Args;
use crate::copy::{JobCopy, Shared, run_copy};

fn main() -> Result<()> {
    let args = Args::parse();
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
    let g = setup::graph(&args)?;
    let live = Liveness::analyze(&g);
    let copies = usize::from(args.copies);
    // Copies under one budget and no ledger named share a private one,
    // removed when they are done.
    let private = match (&args.ledger, args.memory_mb) {
        (None, Some(_)) if copies > 1 => Some(setup::private_ledger()?),
        _ => None,
    };
    let bars = MultiProgress::new();
    let shared = Shared {
        device,
        engine,
        host,
        ledger: args
            .ledger
            .clone()
            .or_else(|| private.as_ref().map(|d| d.path().to_path_buf())),
        base: Arc::new(setup::base_meter(device, copies, &bars)),
        bars,
    };
    if copies == 1 {
        return run_copy(&args, &g, &live, &shared, JobCopy { index: 0, of: 1 });
    }
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..copies)
            .map(|index| {
                let copy = JobCopy { index, of: copies };
                let (args, g, live, shared) = (&args, &g, &live, &shared);
                std::thread::Builder::new()
                    .name(format!("copy-{index}"))
                    .spawn_scoped(s, move || run_copy(args, g, live, shared, copy))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| match t {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("the copy's thread panicked"))),
                Err(e) => Err(anyhow::Error::new(e).context("starting the copy's thread")),
            })
            .collect()
    });
    // Every copy ran to its end (one that fails does not stop the others);
    // each failure is named.
    let failed: Vec<String> = results
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().err().map(|e| format!("copy {i}: {e:#}")))
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} of {copies} copies failed:\n{}",
            failed.len(),
            failed.join("\n")
        );
    }
    Ok(())
}
