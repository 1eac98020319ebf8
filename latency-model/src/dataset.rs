//! Measured samples: one op type on one set of shapes under one background
//! load, with its median latency. Stored as JSON Lines (one sample a line,
//! appended as measured, so a profile run can resume), and split into
//! training and held-out sets by shape, never by row: both load levels of a
//! shape land on the same side.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::features::{FEATURE_LEN, shape_key};

/// One measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// ATen op type, e.g. `aten::convolution`.
    pub op_type: String,
    /// [`crate::op_features`] of the op, utilization included.
    pub features: Vec<f32>,
    /// Background load level (threads or streams running other kernels).
    pub load: u32,
    /// Median latency over the timed runs, in ns (at least 1).
    pub ns: u64,
    /// Timed runs behind the median.
    pub runs: u32,
    /// Where the shapes came from: `model@batch x resolution`.
    pub source: String,
}

impl Sample {
    /// The shape key (op type and every feature but the utilization).
    pub fn shape_key(&self) -> String {
        shape_key(&self.op_type, &self.features)
    }

    /// The key that makes a measurement done: its shapes and its load.
    pub fn done_key(&self) -> String {
        format!("{} @load{}", self.shape_key(), self.load)
    }

    /// Whether this sample belongs to the held-out set: one shape in five,
    /// chosen by a stable hash of the shape key.
    pub fn is_held_out(&self) -> bool {
        fnv1a(self.shape_key().as_bytes()).is_multiple_of(5)
    }

    /// Which of `folds` validation folds of the training shapes this sample
    /// falls in (by the high half of the same hash, so the folds do not
    /// follow the held-out split, and both load levels of a shape share a
    /// fold). Training uses it to stop early without seeing held-out shapes.
    pub fn fold(&self, folds: u64) -> u64 {
        (fnv1a(self.shape_key().as_bytes()) >> 32) % folds.max(1)
    }
}

/// Why a sample file could not be read or written.
#[derive(Debug, Error)]
pub enum DatasetError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}, line {line}: not a sample: {reason}")]
    Parse {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

/// Reads every sample of a JSON Lines file. Blank lines are skipped; a line
/// cut short by an interrupted run, if it is the last, is dropped.
pub fn read_samples(path: &Path) -> Result<Vec<Sample>, DatasetError> {
    let io = |source| DatasetError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let lines: Vec<String> = std::io::BufReader::new(file)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(io)?;
    let mut samples = Vec::with_capacity(lines.len());
    let last = lines.iter().rposition(|l| !l.trim().is_empty());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parsed = serde_json::from_str::<Sample>(line)
            .map_err(|e| e.to_string())
            .and_then(|s| {
                if s.features.len() == FEATURE_LEN {
                    Ok(s)
                } else {
                    Err(format!(
                        "{} features, expected {FEATURE_LEN}",
                        s.features.len()
                    ))
                }
            });
        match parsed {
            Ok(s) => samples.push(s),
            Err(_) if Some(i) == last => {}
            Err(reason) => {
                return Err(DatasetError::Parse {
                    path: path.to_owned(),
                    line: i + 1,
                    reason,
                });
            }
        }
    }
    Ok(samples)
}

/// Appends samples to a JSON Lines file, one line each.
#[derive(Debug)]
pub struct SampleWriter {
    path: PathBuf,
    file: std::fs::File,
}

impl SampleWriter {
    /// Opens `path` for appending, creating it if needed.
    pub fn append(path: &Path) -> Result<SampleWriter, DatasetError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| DatasetError::Io {
                path: path.to_owned(),
                source,
            })?;
        Ok(SampleWriter {
            path: path.to_owned(),
            file,
        })
    }

    /// Writes one sample and flushes it, so an interrupted run loses nothing.
    pub fn write(&mut self, sample: &Sample) -> Result<(), DatasetError> {
        let mut line = serde_json::to_string(sample).map_err(|e| DatasetError::Io {
            path: self.path.clone(),
            source: std::io::Error::other(e),
        })?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|source| DatasetError::Io {
                path: self.path.clone(),
                source,
            })
    }
}

/// Writes samples to a new JSON Lines file (replacing it).
pub fn write_samples(path: &Path, samples: &[Sample]) -> Result<(), DatasetError> {
    let _ = std::fs::remove_file(path);
    let mut w = SampleWriter::append(path)?;
    samples.iter().try_for_each(|s| w.write(s))
}

/// 64-bit FNV-1a: a stable hash (no `std::hash`, whose output may change).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
