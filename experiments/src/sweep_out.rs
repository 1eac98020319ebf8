//! A sweep's `--out` file: one JSON line per run, appended as each run
//! finishes, so that a sweep of hours survives being stopped. The first
//! line says the settings the rows were made with; a sweep given the file
//! again reads the rows back, skips their runs, and appends the rest
//! ([`crate::sweep::SweepConfig::plan`]).
//!
//! A line cut short at the end (the process killed while writing it) is
//! dropped; any other line that is not a row is an error naming it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tensile_planner::RecomputeFirst;

use crate::ExperimentError;
use crate::colocate::EOR_TARGET;
use crate::sweep::{BOUND_STRETCH, SweepConfig, SweepRow};

/// The first line's `format`.
pub const FORMAT: &str = "tensile-sweep/v1";

/// The first line: the settings every row of the file was made with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Header {
    format: String,
    iterations: usize,
    warmup: usize,
    bound_grid: u64,
    recompute_first: String,
    eor_target: f64,
    bound_stretch: f64,
}

impl Header {
    fn of(config: &SweepConfig) -> Header {
        Header {
            format: FORMAT.to_string(),
            iterations: config.iterations,
            warmup: config.warmup,
            bound_grid: config.bound_grid,
            recompute_first: match config.recompute_first {
                RecomputeFirst::Never => "never",
                RecomputeFirst::ManyJobs => "many-jobs",
                RecomputeFirst::Always => "always",
            }
            .to_string(),
            eor_target: EOR_TARGET,
            bound_stretch: BOUND_STRETCH,
        }
    }

    /// The first setting in which `self` (the file's) differs from `now`.
    fn differs(&self, now: &Header) -> Option<String> {
        let pairs = [
            ("format", self.format.clone(), now.format.clone()),
            (
                "--iterations",
                self.iterations.to_string(),
                now.iterations.to_string(),
            ),
            ("--warmup", self.warmup.to_string(), now.warmup.to_string()),
            (
                "--bound-grid",
                self.bound_grid.to_string(),
                now.bound_grid.to_string(),
            ),
            (
                "--recompute-first",
                self.recompute_first.clone(),
                now.recompute_first.clone(),
            ),
            (
                "the EOR target",
                self.eor_target.to_string(),
                now.eor_target.to_string(),
            ),
            (
                "the bound's stretch",
                self.bound_stretch.to_string(),
                now.bound_stretch.to_string(),
            ),
        ];
        pairs
            .into_iter()
            .find(|(_, was, is)| was != is)
            .map(|(what, was, is)| format!("its rows were made with {what} {was}, not {is}"))
    }
}

/// An open `--out` file, appended to as rows come (from any thread).
#[derive(Debug)]
pub struct SweepOut {
    path: PathBuf,
    file: Mutex<File>,
}

impl SweepOut {
    /// Opens `path` for `config`, creating it with its first line, or
    /// reading back the rows it has (made with the same settings, else an
    /// error saying which differs).
    pub fn open(
        path: &Path,
        config: &SweepConfig,
    ) -> Result<(SweepOut, Vec<SweepRow>), ExperimentError> {
        let io = |source| ExperimentError::SweepOutIo {
            path: path.to_path_buf(),
            source,
        };
        let bad = |what: String| ExperimentError::SweepOut {
            path: path.to_path_buf(),
            what,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(io)?;
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(io)?;
        let header = Header::of(config);
        let mut rows = Vec::new();
        if text.is_empty() {
            let line = serde_json::to_string(&header).map_err(|e| bad(e.to_string()))?;
            file.write_all(format!("{line}\n").as_bytes()).map_err(io)?;
        } else {
            // A last line with no newline was cut short: drop it, so the
            // next row starts a line of its own.
            let whole = text.rfind('\n').map_or(0, |i| i + 1);
            if whole < text.len() {
                file.set_len(whole as u64).map_err(io)?;
                text.truncate(whole);
            }
            let mut lines = text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty());
            let (_, first) = lines
                .next()
                .ok_or_else(|| bad("it has no first line (the settings)".to_string()))?;
            let was: Header = serde_json::from_str(first).map_err(|e| {
                bad(format!(
                    "its first line is not a sweep's settings ({FORMAT}): {e}"
                ))
            })?;
            if let Some(d) = was.differs(&header) {
                return Err(bad(format!(
                    "{d}: give another --out, or the same settings to go on with it"
                )));
            }
            for (i, line) in lines {
                let row: SweepRow = serde_json::from_str(line)
                    .map_err(|e| bad(format!("line {} is not a row of the sweep: {e}", i + 1)))?;
                rows.push(row);
            }
        }
        Ok((
            SweepOut {
                path: path.to_path_buf(),
                file: Mutex::new(file),
            },
            rows,
        ))
    }

    /// Appends `row` as one line, written at once.
    pub fn append(&self, row: &SweepRow) -> Result<(), ExperimentError> {
        let mut line = serde_json::to_string(row).map_err(|e| ExperimentError::SweepOut {
            path: self.path.clone(),
            what: e.to_string(),
        })?;
        line.push('\n');
        let mut file = self.file.lock().map_err(|_| ExperimentError::SweepOut {
            path: self.path.clone(),
            what: "a thread writing it panicked".to_string(),
        })?;
        file.write_all(line.as_bytes())
            .and_then(|()| file.flush())
            .map_err(|source| ExperimentError::SweepOutIo {
                path: self.path.clone(),
                source,
            })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}
