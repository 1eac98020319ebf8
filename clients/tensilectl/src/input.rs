//! Reading graphs: from zoo arguments or from JSON files, size-limited.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use anyhow::{Result, bail};
use tensile_graph::builder::{Optimizer, Step};
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Graph, GraphError, Limits, json};

use crate::args::{ModelArgs, OptimizerArg};

pub(crate) fn optimizer(arg: &OptimizerArg) -> Result<(Optimizer, Step)> {
    Ok(Optimizer::with_step_from_name(&arg.optimizer)?)
}

/// Builds the zoo model the arguments name.
pub(crate) fn zoo_graph(args: &ModelArgs) -> Result<Graph> {
    let Some(name) = &args.model else {
        bail!("name a zoo model with --model (see `tensilectl zoo`) or give a graph file");
    };
    let (optimizer, step) = optimizer(&args.opt)?;
    let config = ZooConfig {
        batch: args.batch,
        resolution: args.resolution,
        optimizer,
        step,
        classes: args.classes,
    };
    Ok(zoo::build(name, &config)?)
}

/// Reads at most `limit` bytes from a file or `-` (stdin); a larger input is
/// refused before it is read whole.
pub(crate) fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, GraphError> {
    let too_large = |bytes| GraphError::InputTooLarge { bytes, limit };
    let io = |e: std::io::Error| GraphError::Malformed {
        reason: format!("cannot read {}: {e}", path.display()),
    };
    let mut reader: Box<dyn Read> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let file = File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if meta.is_dir() {
            return Err(GraphError::Malformed {
                reason: format!("{} is a directory", path.display()),
            });
        }
        if meta.len() > limit {
            return Err(too_large(meta.len()));
        }
        Box::new(file)
    };
    let mut bytes = Vec::new();
    reader
        .by_ref()
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Reads and validates a JSON graph file.
pub(crate) fn graph_file(path: &Path, limits: &Limits) -> Result<Graph, GraphError> {
    let bytes = read_limited(path, limits.max_input_bytes)?;
    json::parse(&bytes, limits)
}
