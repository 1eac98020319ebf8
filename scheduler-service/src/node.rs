//! Every GPU of a node: which GPUs to serve (`--gpus`, `nvidia-smi`), one
//! planning domain and one socket (`DIR/gpuN.sock`) per GPU, and
//! `DIR/gpus.json` ([`Manifest`]), from which clients pick their GPU's
//! socket (`tensile_proto::endpoint::resolve_server`).

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tensile_latency_model::DeviceProfile;
use tensile_proto::endpoint::{GPUS_FILE, GpuEntry, GpusFile, gpu_socket_name};
use tracing::warn;

use crate::config::{Config, ListenAddr};
use crate::error::ConfigError;
use crate::server::{Domain, Listener, RunError, run_domains};

/// Which GPUs to serve: `--gpus all` or `--gpus 0,1,3`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSpec {
    All,
    /// Node-level indices, in the order given, without repeats.
    List(Vec<u32>),
}

impl GpuSpec {
    /// `all`, or indices separated by commas.
    pub fn parse(s: &str) -> Result<GpuSpec, ConfigError> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("all") {
            return Ok(GpuSpec::All);
        }
        if s.is_empty() {
            return Err(ConfigError::NoGpus);
        }
        let mut list = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let i: u32 = part.parse().map_err(|_| ConfigError::NotAGpuIndex {
                spec: s.to_string(),
                part: part.to_string(),
            })?;
            if list.contains(&i) {
                return Err(ConfigError::GpuTwice {
                    spec: s.to_string(),
                    index: i,
                });
            }
            list.push(i);
        }
        Ok(GpuSpec::List(list))
    }
}

/// A GPU `nvidia-smi` lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmiGpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_bytes: u64,
}

/// The GPUs `nvidia-smi` lists on this node; none when it is missing or
/// fails (a machine without a GPU).
pub fn nvidia_smi() -> Vec<SmiGpu> {
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=index,uuid,name,memory.total",
            "--format=csv,noheader,nounits",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => parse_smi(&String::from_utf8_lossy(&o.stdout)),
        _ => Vec::new(),
    }
}

/// `index, uuid, name, memory MiB` lines; a line that is not one is
/// skipped.
pub fn parse_smi(text: &str) -> Vec<SmiGpu> {
    text.lines()
        .filter_map(|line| {
            let (index, rest) = line.split_once(',')?;
            let (uuid, rest) = rest.split_once(',')?;
            let (name, mib) = rest.rsplit_once(',')?;
            Some(SmiGpu {
                index: index.trim().parse().ok()?,
                uuid: uuid.trim().to_string(),
                name: name.trim().to_string(),
                memory_bytes: mib.trim().parse::<u64>().ok()? << 20,
            })
        })
        .collect()
}

/// A GPU the scheduler serves, with its budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// What it is planned with: the GPU's memory, or the profile's for a
    /// simulated one.
    pub memory_bytes: u64,
    pub budget_bytes: u64,
    pub simulated: bool,
}

/// The GPUs `spec` names among those `nvidia-smi` lists. Where it lists
/// none, each named GPU is simulated with `profile` (`all`: GPU 0).
/// `budget`: each GPU's, else its memory.
pub fn select(
    spec: &GpuSpec,
    seen: &[SmiGpu],
    profile: &DeviceProfile,
    budget: Option<u64>,
) -> Result<Vec<Gpu>, ConfigError> {
    let real = |g: &SmiGpu| Gpu {
        index: g.index,
        uuid: g.uuid.clone(),
        name: g.name.clone(),
        memory_bytes: g.memory_bytes,
        budget_bytes: budget.unwrap_or(g.memory_bytes),
        simulated: false,
    };
    let simulated = |index: u32| Gpu {
        index,
        uuid: format!("sim-{index}"),
        name: format!("simulated {}", profile.name),
        memory_bytes: profile.memory_bytes,
        budget_bytes: budget.unwrap_or(profile.memory_bytes),
        simulated: true,
    };
    match (spec, seen.is_empty()) {
        (GpuSpec::All, false) => Ok(seen.iter().map(real).collect()),
        (GpuSpec::All, true) => Ok(vec![simulated(0)]),
        (GpuSpec::List(list), true) => Ok(list.iter().map(|&i| simulated(i)).collect()),
        (GpuSpec::List(list), false) => {
            list.iter()
                .map(|&i| {
                    seen.iter().find(|g| g.index == i).map(real).ok_or_else(|| {
                        ConfigError::NoSuchGpu {
                            index: i,
                            seen: seen
                                .iter()
                                .map(|g| format!("{} ({})", g.index, g.name))
                                .collect::<Vec<_>>()
                                .join(", "),
                        }
                    })
                })
                .collect()
        }
    }
}

/// `DIR/gpus.json`: written whole and atomically (a temporary file renamed
/// over it) once every socket listens, again when a GPU's budget changes
/// (by that GPU's planning task, the owner of its budget), removed at
/// shutdown.
#[derive(Debug)]
pub struct Manifest {
    dir: PathBuf,
    file: Mutex<Kept>,
}

/// The file's contents, and whether it is on disk (written, not yet
/// removed).
#[derive(Debug)]
struct Kept {
    file: GpusFile,
    on_disk: bool,
}

impl Manifest {
    pub fn new(dir: PathBuf, file: GpusFile) -> Manifest {
        Manifest {
            dir,
            file: Mutex::new(Kept {
                file,
                on_disk: false,
            }),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(GPUS_FILE)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        // Every change replaces a field whole: a poisoned lock holds a
        // consistent file.
        self.file.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the file (mode 0644: it holds no secret, and clients of other
    /// users that may reach the sockets must read it).
    pub fn write(&self) -> Result<(), RunError> {
        let mut kept = self.lock();
        self.write_locked(&kept.file)?;
        kept.on_disk = true;
        Ok(())
    }

    fn write_locked(&self, file: &GpusFile) -> Result<(), RunError> {
        let path = self.path();
        let io = |source| RunError::Io {
            what: format!("writing {}", path.display()),
            source,
        };
        let mut text = serde_json::to_string_pretty(file)
            .map_err(|e| RunError::Config(format!("gpus.json: {e}")))?;
        text.push('\n');
        let mut tmp = tempfile::Builder::new()
            .prefix(".gpus.json.")
            .tempfile_in(&self.dir)
            .map_err(io)?;
        std::io::Write::write_all(&mut tmp, text.as_bytes()).map_err(io)?;
        tmp.as_file().sync_all().map_err(io)?;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(io)?;
        tmp.persist(&path).map_err(|e| io(e.error))?;
        Ok(())
    }

    /// GPU `index`'s budget is now `bytes`: the file is rewritten if it is
    /// on disk, else the budget waits for its first writing (none after its
    /// removal).
    pub fn set_budget(&self, index: u32, bytes: u64) -> Result<(), RunError> {
        let mut kept = self.lock();
        let Some(g) = kept.file.gpus.iter_mut().find(|g| g.index == index) else {
            return Ok(());
        };
        if g.budget_bytes == bytes {
            return Ok(());
        }
        g.budget_bytes = bytes;
        if kept.on_disk {
            self.write_locked(&kept.file)?;
        }
        Ok(())
    }

    pub fn remove(&self) {
        let mut kept = self.lock();
        kept.on_disk = false;
        let _ = std::fs::remove_file(self.path());
    }
}

/// Before a single-device scheduler listens in `dir`: a `gpus.json` there
/// would send clients to GPU sockets. One whose sockets all are dead (a
/// scheduler killed without its shutdown) is removed; one with a live
/// socket is an error.
pub async fn clear_stale_manifest(dir: &Path) -> Result<(), RunError> {
    let file = match GpusFile::read(dir) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(()),
        Err(e) => {
            warn!("{e}; removing it");
            let _ = std::fs::remove_file(dir.join(GPUS_FILE));
            return Ok(());
        }
    };
    for g in &file.gpus {
        let socket = GpusFile::socket_path(dir, g);
        if tokio::net::UnixStream::connect(&socket).await.is_ok() {
            return Err(RunError::Config(format!(
                "{}: a scheduler serving GPUs {} listens there ({}); clients of this directory would go to it",
                dir.join(GPUS_FILE).display(),
                file.describe(),
                socket.display()
            )));
        }
    }
    warn!(
        "{}: no scheduler answers on its sockets; removing it",
        dir.join(GPUS_FILE).display()
    );
    let _ = std::fs::remove_file(dir.join(GPUS_FILE));
    Ok(())
}

/// Serves `gpus`, one planning domain each on `dir/gpuN.sock`, with
/// `config`'s profile (each GPU's memory and budget set from it), until
/// `shutdown`; writes `dir/gpus.json` once all listen and removes it and
/// the sockets at shutdown. Metrics carry a `gpu` label.
pub async fn run_gpus(
    dir: &Path,
    gpus: &[Gpu],
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    if gpus.is_empty() {
        return Err(RunError::Config("no GPU to serve".into()));
    }
    let mut domains = Vec::new();
    let mut entries = Vec::new();
    for g in gpus {
        let socket = gpu_socket_name(g.index);
        let listener =
            Listener::bind_with_mode(&ListenAddr::Unix(dir.join(&socket)), config.socket_mode)
                .await?;
        let mut device = config.device.clone();
        device.memory_bytes = g.memory_bytes;
        domains.push(Domain {
            gpu: Some(g.index),
            listeners: vec![listener],
            device,
            budget_bytes: g.budget_bytes,
        });
        entries.push(GpuEntry {
            index: g.index,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            memory_bytes: g.memory_bytes,
            budget_bytes: g.budget_bytes,
            socket,
        });
    }
    let manifest = Arc::new(Manifest::new(dir.to_path_buf(), GpusFile { gpus: entries }));
    run_domains(domains, config, Some(manifest), shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a6000() -> DeviceProfile {
        DeviceProfile::builtin("a6000").unwrap()
    }

    #[test]
    fn specs_parse_or_name_the_bad_entry() {
        let err = |s| GpuSpec::parse(s).unwrap_err().to_string();
        assert_eq!(GpuSpec::parse("all").unwrap(), GpuSpec::All);
        assert_eq!(
            GpuSpec::parse(" 0, 1,3").unwrap(),
            GpuSpec::List(vec![0, 1, 3])
        );
        assert!(err("0,x").contains("\"x\""));
        assert!(err("1,1").contains("twice"));
        assert!(err("").contains("empty"));
        assert!(GpuSpec::parse("-1").is_err());
    }

    #[test]
    fn nvidia_smi_lines_parse() {
        let text = "0, GPU-aa11, NVIDIA A100-SXM4-80GB, 81920\n1, GPU-bb22, NVIDIA H100, 80, GB, 1024\nnot a line\n";
        let seen = parse_smi(text);
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].uuid, "GPU-aa11");
        assert_eq!(seen[0].memory_bytes, 81920 << 20);
        // A comma in the name stays in the name.
        assert_eq!(seen[1].name, "NVIDIA H100, 80, GB");
    }

    #[test]
    fn real_gpus_are_chosen_and_missing_ones_named_else_simulated() {
        let seen = parse_smi("0, GPU-aa, A, 1000\n2, GPU-cc, C, 2000\n");
        let p = a6000();
        let all = select(&GpuSpec::All, &seen, &p, None).unwrap();
        assert_eq!(all.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 2]);
        assert_eq!(all[1].budget_bytes, 2000 << 20);
        let two = select(&GpuSpec::List(vec![2]), &seen, &p, Some(5)).unwrap();
        assert_eq!((two[0].uuid.as_str(), two[0].budget_bytes), ("GPU-cc", 5));
        let err = select(&GpuSpec::List(vec![1]), &seen, &p, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no GPU 1") && err.contains("0 (A), 2 (C)"),
            "{err}"
        );
        let sim = select(&GpuSpec::List(vec![0, 1]), &[], &p, None).unwrap();
        assert_eq!(sim[1].uuid, "sim-1");
        assert!(
            sim.iter()
                .all(|g| g.simulated && g.memory_bytes == p.memory_bytes)
        );
        assert_eq!(select(&GpuSpec::All, &[], &p, None).unwrap().len(), 1);
    }

    #[test]
    fn the_manifest_is_replaced_whole_and_keeps_budgets() {
        let dir = tempfile::tempdir().unwrap();
        let entry = |index| GpuEntry {
            index,
            uuid: format!("sim-{index}"),
            name: "simulated a6000".into(),
            memory_bytes: 10,
            budget_bytes: 10,
            socket: gpu_socket_name(index),
        };
        let m = Manifest::new(
            dir.path().to_path_buf(),
            GpusFile {
                gpus: vec![entry(0), entry(1)],
            },
        );
        // A budget set before the first writing waits for it.
        m.set_budget(0, 9).unwrap();
        assert!(GpusFile::read(dir.path()).unwrap().is_none());
        m.write().unwrap();
        assert_eq!(
            GpusFile::read(dir.path()).unwrap().unwrap().gpus[0].budget_bytes,
            9
        );
        m.set_budget(0, 10).unwrap();
        m.set_budget(1, 7).unwrap();
        let back = GpusFile::read(dir.path()).unwrap().unwrap();
        assert_eq!(back.gpus[0].budget_bytes, 10);
        assert_eq!(back.gpus[1].budget_bytes, 7);
        let mode = std::fs::metadata(m.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
        // Nothing but the file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        m.remove();
        assert!(GpusFile::read(dir.path()).unwrap().is_none());
        // Nor is it written again after its removal (at shutdown).
        m.set_budget(1, 8).unwrap();
        assert!(GpusFile::read(dir.path()).unwrap().is_none());
    }
}
