//! `tensilectl graph stats | export | check`.

use anyhow::{Context, Result, bail};
use tensile_graph::{Limits, json};

use crate::args::{CheckArgs, ExportArgs, StatsArgs};
use crate::input;
use crate::report::GraphStats;

pub(crate) fn stats(args: &StatsArgs) -> Result<()> {
    let graph = match &args.file {
        Some(path) => input::graph_file(path, &Limits::default())
            .with_context(|| format!("{}", path.display()))?,
        None => input::zoo_graph(&args.model)?,
    };
    let stats = GraphStats::of(&graph);
    if args.json {
        tensile_cli::outln!("{}", serde_json::to_string_pretty(&stats)?);
    } else {
        stats.print_text();
    }
    Ok(())
}

pub(crate) fn export(args: &ExportArgs) -> Result<()> {
    let graph = input::zoo_graph(&args.model)?;
    let text = if args.compact {
        json::to_string(&graph)
    } else {
        json::to_string_pretty(&graph)
    };
    match &args.output {
        Some(path) => std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => tensile_cli::outln!("{text}"),
    }
    Ok(())
}

pub(crate) fn check(args: &CheckArgs) -> Result<()> {
    let limits = Limits {
        max_input_bytes: args.max_bytes,
        ..Limits::default()
    };
    match input::graph_file(&args.file, &limits) {
        Ok(graph) => {
            tensile_cli::outln!(
                "ok: {} is a valid graph ({} ops, {} tensors, {} params)",
                args.file.display(),
                graph.ops().len(),
                graph.tensors().len(),
                graph.param_count()
            );
            Ok(())
        }
        Err(e) => bail!("{}: {e}", args.file.display()),
    }
}
