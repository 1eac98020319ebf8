//! Where the scheduler listens by default and how clients reach it, so that
//! `tensile-scheduler` with no arguments, `tensilectl` with no `--server`
//! and a worker with no `--scheduler` meet.
//!
//! A scheduler that serves the GPUs of a node listens on one socket per GPU
//! (`DIR/gpuN.sock`) and describes them in `DIR/gpus.json` ([`GpusFile`]).
//! A client finds its scheduler with [`resolve_server`], the one rule:
//! the Python client calls it through `tensile._core`, and the deploy
//! scripts through `tensile-scheduler endpoint` (tested on
//! `proto/tests/server-resolution.json`):
//! 1. an explicit address wins;
//! 2. else `TENSILE_SERVER`;
//! 3. else, when `DIR/gpus.json` exists (DIR: `TENSILE_SOCKET_DIR`, else
//!    the default directory), the socket of the job's GPU: its CUDA
//!    ordinal, mapped through `CUDA_VISIBLE_DEVICES` (else
//!    `NVIDIA_VISIBLE_DEVICES`) when one is set to a list, matched by
//!    index or by (a unique prefix of) uuid;
//! 4. else `DIR/scheduler.sock`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file a scheduler serving GPUs writes in its socket directory.
pub const GPUS_FILE: &str = "gpus.json";
/// The single-device scheduler's socket, in its socket directory.
pub const SINGLE_SOCKET: &str = "scheduler.sock";
/// The environment variable naming the socket directory.
pub const SOCKET_DIR_ENV: &str = "TENSILE_SOCKET_DIR";
/// The environment variable naming the scheduler's address.
pub const SERVER_ENV: &str = "TENSILE_SERVER";
/// The variables whose lists map a process's CUDA ordinals to the node's
/// GPUs, in the order they are consulted.
pub const VISIBLE_DEVICES_ENV: [&str; 2] = ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"];

/// The scheduler's default Unix socket: `$XDG_RUNTIME_DIR/tensile/scheduler.sock`
/// when `XDG_RUNTIME_DIR` is set (and absolute), else
/// `/tmp/tensile-$UID/scheduler.sock`.
pub fn default_socket_path() -> PathBuf {
    default_socket_dir().join(SINGLE_SOCKET)
}

/// The directory of [`default_socket_path`] (the scheduler creates it with
/// mode 0700).
pub fn default_socket_dir() -> PathBuf {
    default_socket_dir_with(&process_env)
}

/// [`default_socket_dir`] with the environment given.
pub fn default_socket_dir_with(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    match env("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir.join("tensile"),
        _ => PathBuf::from(format!("/tmp/tensile-{}", current_uid())),
    }
}

/// The socket directory clients look in: `TENSILE_SOCKET_DIR` when set
/// (and not empty), else [`default_socket_dir`].
pub fn socket_dir() -> PathBuf {
    socket_dir_with(&process_env)
}

/// [`socket_dir`] with the environment given.
pub fn socket_dir_with(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    match env(SOCKET_DIR_ENV).filter(|d| !d.trim().is_empty()) {
        Some(d) => PathBuf::from(d),
        None => default_socket_dir_with(env),
    }
}

/// The socket file of the node's GPU `index`, in the socket directory.
pub fn gpu_socket_name(index: u32) -> String {
    format!("gpu{index}.sock")
}

fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The real user id of this process, read without `unsafe` as the owner of
/// `/proc/self` (Linux); elsewhere `$USER` stands in.
fn current_uid() -> String {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::metadata("/proc/self") {
            return m.uid().to_string();
        }
    }
    std::env::var("USER").unwrap_or_else(|_| "user".to_string())
}

/// `gpus.json`: the GPUs one scheduler serves, a socket each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpusFile {
    pub gpus: Vec<GpuEntry>,
}

/// One GPU of [`GpusFile`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuEntry {
    /// The node-level index (as `nvidia-smi` numbers the GPUs).
    pub index: u32,
    /// `GPU-...` (`nvidia-smi`'s), or `sim-N` for a simulated GPU.
    pub uuid: String,
    pub name: String,
    /// The memory the scheduler plans this GPU with.
    pub memory_bytes: u64,
    /// The budget its jobs share (as of the last change).
    pub budget_bytes: u64,
    /// Its socket, relative to the file's directory (or absolute).
    pub socket: String,
}

/// A client could not find its scheduler; the message says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ResolveError(pub String);

impl GpusFile {
    /// `dir/gpus.json`, or `None` when there is none.
    pub fn read(dir: &Path) -> Result<Option<GpusFile>, ResolveError> {
        let path = dir.join(GPUS_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ResolveError(format!("{}: {e}", path.display()))),
        };
        GpusFile::parse(&text)
            .map(Some)
            .map_err(|why| ResolveError(format!("{}: {why}", path.display())))
    }

    /// The file's text, checked: at least one GPU, indices unique.
    pub fn parse(text: &str) -> Result<GpusFile, String> {
        let file: GpusFile =
            serde_json::from_str(text).map_err(|e| format!("not a gpus file: {e}"))?;
        if file.gpus.is_empty() {
            return Err("it lists no GPU".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for g in &file.gpus {
            if !seen.insert(g.index) {
                return Err(format!("GPU {} is listed twice", g.index));
            }
            if g.socket.is_empty() {
                return Err(format!("GPU {} has no socket", g.index));
            }
        }
        Ok(file)
    }

    /// The GPU an entry of `CUDA_VISIBLE_DEVICES` names: digits are an
    /// index, anything else a uuid or a prefix of exactly one.
    pub fn find(&self, entry: &str) -> Result<&GpuEntry, String> {
        let entry = entry.trim();
        if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
            return self
                .gpus
                .iter()
                .find(|g| entry.parse::<u32>().is_ok_and(|i| i == g.index))
                .ok_or_else(|| format!("no GPU has index {entry}"));
        }
        let low = entry.to_ascii_lowercase();
        if let Some(g) = self
            .gpus
            .iter()
            .find(|g| g.uuid.to_ascii_lowercase() == low)
        {
            return Ok(g);
        }
        let hits: Vec<&GpuEntry> = self
            .gpus
            .iter()
            .filter(|g| !low.is_empty() && g.uuid.to_ascii_lowercase().starts_with(&low))
            .collect();
        match hits.as_slice() {
            [g] => Ok(g),
            [] => Err(format!("no GPU has uuid {entry:?} (or one starting so)")),
            many => Err(format!(
                "{entry:?} starts the uuids of more than one GPU ({})",
                many.iter()
                    .map(|g| g.index.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// One line per GPU's worth: `0 GPU-... (NAME), 1 ...`.
    pub fn describe(&self) -> String {
        self.gpus
            .iter()
            .map(|g| format!("{} {} ({})", g.index, g.uuid, g.name))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Where `gpu`'s socket is, for a file read from `dir`.
    pub fn socket_path(dir: &Path, gpu: &GpuEntry) -> PathBuf {
        dir.join(&gpu.socket)
    }
}

/// A node GPU's socket in a socket directory, as the node's scripts look
/// it up by the GPU's node-level index ([`gpu_socket`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSocket {
    pub index: u32,
    pub socket: PathBuf,
    /// The GPU's entry in `gpus.json`; `None` where the directory has no
    /// `gpus.json` (one scheduler per GPU, each on `gpuN.sock`).
    pub entry: Option<GpuEntry>,
}

/// Why a GPU has no socket in a socket directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuSocketError {
    #[error("GPU {index} is not served by the scheduler of {} (it lists {})", file.display(), listed.iter().map(u32::to_string).collect::<Vec<_>>().join(", "))]
    NotServed {
        index: u32,
        file: PathBuf,
        listed: Vec<u32>,
    },
    #[error(transparent)]
    File(#[from] ResolveError),
}

/// The socket of the node's GPU `index` in `dir`: the one `dir/gpus.json`
/// gives it, or, without a `gpus.json`, `dir/gpuN.sock` (schedulers
/// started one per GPU, as `tensile.ray` does).
pub fn gpu_socket(dir: &Path, index: u32) -> Result<GpuSocket, GpuSocketError> {
    let Some(file) = GpusFile::read(dir)? else {
        return Ok(GpuSocket {
            index,
            socket: dir.join(gpu_socket_name(index)),
            entry: None,
        });
    };
    match file.gpus.iter().find(|g| g.index == index) {
        Some(g) => Ok(GpuSocket {
            index,
            socket: GpusFile::socket_path(dir, g),
            entry: Some(g.clone()),
        }),
        None => Err(GpuSocketError::NotServed {
            index,
            file: dir.join(GPUS_FILE),
            listed: file.gpus.iter().map(|g| g.index).collect(),
        }),
    }
}

/// Every socket `dir/gpus.json` names, in its order; an error when there
/// is no such file or it is not one.
pub fn gpu_sockets(dir: &Path) -> Result<Vec<PathBuf>, ResolveError> {
    let file = GpusFile::read(dir)?
        .ok_or_else(|| ResolveError(format!("no {}", dir.join(GPUS_FILE).display())))?;
    Ok(file
        .gpus
        .iter()
        .map(|g| GpusFile::socket_path(dir, g))
        .collect())
}

/// The CUDA ordinal of a device name: `cuda:N` is N; `cuda`, `cpu` and
/// anything else are 0 (the job's first visible GPU).
pub fn device_ordinal(device: &str) -> u32 {
    device
        .trim()
        .strip_prefix("cuda:")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The node's GPU a process's CUDA ordinal is: the ordinal's entry of the
/// first of [`VISIBLE_DEVICES_ENV`] set to a list (values `all`, `none`,
/// `void` or empty map nothing), else the ordinal itself. Also returns the
/// variable it came from.
pub fn visible_entry(
    ordinal: u32,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, Option<&'static str>), ResolveError> {
    for var in VISIBLE_DEVICES_ENV {
        let Some(value) = env(var) else { continue };
        let value = value.trim();
        if value.is_empty()
            || ["all", "none", "void"].contains(&value.to_ascii_lowercase().as_str())
        {
            continue;
        }
        let list: Vec<&str> = value.split(',').map(str::trim).collect();
        return match list.get(ordinal as usize) {
            Some(entry) => Ok(((*entry).to_string(), Some(var))),
            None => Err(ResolveError(format!(
                "device cuda:{ordinal}: {var}={value:?} lists {} device(s), so there is no cuda:{ordinal}",
                list.len()
            ))),
        };
    }
    Ok((ordinal.to_string(), None))
}

/// The scheduler a client of CUDA ordinal `ordinal` talks to, by the rule
/// in this module's header, from the process's environment: an address
/// (`unix:PATH`, `HOST:PORT`, ...) for [`client_uri`].
pub fn resolve_server(explicit: Option<&str>, ordinal: u32) -> Result<String, ResolveError> {
    resolve_server_with(explicit, ordinal, &process_env)
}

/// [`resolve_server`] with the environment given.
pub fn resolve_server_with(
    explicit: Option<&str>,
    ordinal: u32,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ResolveError> {
    if let Some(s) = explicit.map(str::trim).filter(|s| !s.is_empty()) {
        return Ok(s.to_string());
    }
    if let Some(s) = env(SERVER_ENV).map(|s| s.trim().to_string())
        && !s.is_empty()
    {
        return Ok(s);
    }
    let dir = socket_dir_with(env);
    let Some(file) = GpusFile::read(&dir)? else {
        return Ok(format!("unix:{}", dir.join(SINGLE_SOCKET).display()));
    };
    let (entry, var) = visible_entry(ordinal, env)?;
    let gpu = file.find(&entry).map_err(|why| {
        let named = match var {
            Some(var) => format!("{var} entry {entry:?} (device cuda:{ordinal})"),
            None => format!("GPU {entry} (device cuda:{ordinal})"),
        };
        ResolveError(format!(
            "{named} is not served by the scheduler of {}: {why}; it serves GPUs {}",
            dir.join(GPUS_FILE).display(),
            file.describe()
        ))
    })?;
    Ok(format!(
        "unix:{}",
        GpusFile::socket_path(&dir, gpu).display()
    ))
}

/// A client's target: `unix:PATH` (or an absolute path) for a Unix socket,
/// `http://HOST:PORT` or `HOST:PORT` for TCP; empty means the single
/// device's default socket (clients resolve with [`resolve_server`]
/// first). Returns the URI tonic's `Endpoint` takes.
pub fn client_uri(server: Option<&str>) -> String {
    match server.map(str::trim).filter(|s| !s.is_empty()) {
        None => format!("unix://{}", default_socket_path().display()),
        Some(s) if s.starts_with("unix:") => {
            let path = s.trim_start_matches("unix:").trim_start_matches("//");
            format!("unix://{path}")
        }
        Some(s) if s.starts_with('/') => format!("unix://{s}"),
        Some(s) if s.starts_with("http://") || s.starts_with("https://") => s.to_string(),
        Some(s) => format!("http://{s}"),
    }
}

/// Why the scheduler at `server` cannot be reached, once, with what to
/// do: what every client says (tensilectl, the worker, the Python
/// session). The transport's error repeats its cause at every layer ("No such
/// file or directory" three times); the innermost says it.
pub fn unreachable(
    server: &str,
    e: &(dyn std::error::Error + 'static),
    tls: Option<&crate::tls::ClientTls>,
) -> String {
    if let Some(why) = crate::tls::explain(e, tls) {
        return format!("cannot reach the scheduler at {server}: {why}");
    }
    let mut innermost = e;
    let mut io = None;
    let mut cause = Some(e);
    while let Some(c) = cause {
        innermost = c;
        if let Some(i) = c.downcast_ref::<std::io::Error>() {
            io = Some(i);
        }
        cause = c.source();
    }
    use std::io::ErrorKind;
    const START: &str = "start tensile-scheduler, or give its address (--server; a worker's --scheduler; TENSILE_SERVER)";
    let (why, what_to_do) = match io.map(std::io::Error::kind) {
        Some(ErrorKind::NotFound) => ("no such socket".to_string(), START),
        Some(ErrorKind::ConnectionRefused) => {
            ("nothing listens there (connection refused)".into(), START)
        }
        Some(ErrorKind::PermissionDenied) => (
            "Permission denied: this user may not connect to the socket".into(),
            "the scheduler's operator opens it to you (tensile-scheduler --socket-mode 0660 and its group, or 0666 for every local user)",
        ),
        _ => (innermost.to_string(), START),
    };
    format!("cannot reach the scheduler at {server}: {why}; {what_to_do}")
}

#[cfg(test)]
mod tests;
