//! `tensilectl zoo`: every built-in model, its parameter count, and the
//! statistics of one training iteration at the given batch size.

use anyhow::Result;
use serde::Serialize;
use tensile_graph::zoo::{self, ZooConfig};

use crate::args::ZooArgs;
use crate::input;
use crate::report::GraphStats;
use tensile_cli::format_mb;

#[derive(Debug, Serialize)]
struct ZooEntry {
    model: &'static str,
    description: &'static str,
    /// The reference implementation's parameter count.
    reference_params: u64,
    batch: u64,
    resolution: u64,
    optimizer: &'static str,
    #[serde(flatten)]
    stats: GraphStats,
}

pub(crate) fn run(args: &ZooArgs) -> Result<()> {
    let (optimizer, step) = input::optimizer(&args.opt)?;
    let mut entries = Vec::new();
    for m in &zoo::MODELS {
        let config = ZooConfig {
            optimizer,
            step,
            ..ZooConfig::new(args.batch)
        };
        let graph = m.build(&config)?;
        entries.push(ZooEntry {
            model: m.name,
            description: m.description,
            reference_params: m.params,
            batch: args.batch,
            resolution: m.default_resolution,
            optimizer: optimizer.name(),
            stats: GraphStats::of(&graph),
        });
    }
    if args.json {
        tensile_cli::outln!("{}", serde_json::to_string_pretty(&entries)?);
        return Ok(());
    }
    tensile_cli::outln!(
        "one training iteration per model, batch {}, {} optimizer; peaks free tensors after last use (vanilla) or never (keep-all)\n",
        args.batch,
        optimizer.name()
    );
    tensile_cli::outln!(
        "{:<13} {:>12} {:>6} {:>6} {:>7} {:>12} {:>12} {:>12}",
        "model",
        "params",
        "input",
        "ops",
        "tensors",
        "persistent",
        "vanilla peak",
        "keep-all"
    );
    for e in &entries {
        tensile_cli::outln!(
            "{:<13} {:>12} {:>6} {:>6} {:>7} {:>12} {:>12} {:>12}",
            e.model,
            e.stats.params,
            e.resolution,
            e.stats.ops,
            e.stats.tensors,
            format_mb(e.stats.persistent_bytes),
            format_mb(e.stats.vanilla_peak_bytes),
            format_mb(e.stats.keep_all_peak_bytes),
        );
    }
    Ok(())
}
