//! The embedded store of learned latencies: SQLite (rusqlite, bundled
//! library), one row per (graph fingerprint, device) holding the per-op
//! EWMA in ns. WAL mode: a write is on disk when its transaction commits,
//! so a scheduler killed with SIGKILL loses nothing committed.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};
use tensile_graph::Graph;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{path}: cannot create the state directory: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A graph's identity across runs: SHA-256 of its canonical JSON (names,
/// shapes, ops, attributes in key order), as 32 hex digits. Not of the
/// protobuf encoding: prost encodes an op's attribute map in hash order,
/// which differs from process to process.
pub fn fingerprint(graph: &Graph) -> String {
    let text = tensile_graph::json::to_string(graph);
    let digest = Sha256::digest(text.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// The store. A std `Mutex` (not tokio's): every call is short and runs
/// on a blocking thread, never across an `.await`.
#[derive(Debug)]
pub struct Store {
    conn: Mutex<Connection>,
    path: PathBuf,
}

impl Store {
    /// Opens (or creates) `dir/latencies.sqlite3`.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join("latencies.sqlite3");
        let failed = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let conn = Connection::open(&path).map_err(failed)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(failed)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(failed)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS latencies (
                 fingerprint TEXT NOT NULL,
                 device TEXT NOT NULL,
                 ops INTEGER NOT NULL,
                 ns BLOB NOT NULL,
                 updated_unix_s INTEGER NOT NULL,
                 PRIMARY KEY (fingerprint, device)
             )",
        )
        .map_err(failed)?;
        Ok(Store {
            conn: Mutex::new(conn),
            path,
        })
    }

    fn err(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// The learned latencies of a graph on a device, if any were kept and
    /// they have `ops` entries.
    pub fn load(
        &self,
        fingerprint: &str,
        device: &str,
        ops: usize,
    ) -> Result<Option<Vec<u64>>, StoreError> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let row: Option<Vec<u8>> = conn
            .query_row(
                "SELECT ns FROM latencies WHERE fingerprint = ?1 AND device = ?2",
                params![fingerprint, device],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        Ok(row.and_then(|blob| {
            let ns: Vec<u64> = blob
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect();
            (ns.len() == ops).then_some(ns)
        }))
    }

    /// Keeps the latencies of a graph on a device (replacing older ones).
    pub fn save(&self, fingerprint: &str, device: &str, ns: &[u64]) -> Result<(), StoreError> {
        let blob: Vec<u8> = ns.iter().flat_map(|x| x.to_le_bytes()).collect();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        conn.execute(
            "INSERT OR REPLACE INTO latencies (fingerprint, device, ops, ns, updated_unix_s)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![fingerprint, device, ns.len() as i64, blob, now],
        )
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Checkpoints the WAL into the database file (at shutdown).
    pub fn flush(&self) -> Result<(), StoreError> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .map_err(|e| self.err(e))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn latencies_survive_reopening_and_are_keyed_by_graph_and_device() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.load("f", "a6000", 3).unwrap(), None);
        s.save("f", "a6000", &[1, 2, u64::MAX]).unwrap();
        s.save("f", "a6000", &[4, 5, 6]).unwrap();
        drop(s);
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.load("f", "a6000", 3).unwrap(), Some(vec![4, 5, 6]));
        assert_eq!(s.load("f", "h100", 3).unwrap(), None);
        // A row of another length is not this graph's.
        assert_eq!(s.load("f", "a6000", 4).unwrap(), None);
    }

    #[test]
    fn a_fingerprint_is_the_graph_not_its_encoding() {
        use tensile_graph::zoo::{self, ZooConfig};
        let a = zoo::build("resnet50", &ZooConfig::new(2)).unwrap();
        let b = zoo::build("resnet50", &ZooConfig::new(2)).unwrap();
        let c = zoo::build("resnet50", &ZooConfig::new(4)).unwrap();
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&c));
        assert_eq!(fingerprint(&a).len(), 32);
    }
}
