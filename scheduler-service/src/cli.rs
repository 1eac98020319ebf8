//! The binary's configuration: flags (clap, each with a `TENSILE_*`
//! environment equivalent), an optional TOML file (`--config`), defaults;
//! flags and environment win over the file. [`Args::resolve`] turns them
//! into listen addresses and a validated [`Config`] before anything starts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;
use tensile_latency_model::DeviceProfile;

use crate::coldstart::ModelsSpec;
use crate::config::{Config, ListenAddr};

/// The TENSILE Memory Scheduler: plans GPU memory (swaps, prefetches,
/// releases, recomputations) for every training job sharing one GPU and
/// pushes each job its plan over gRPC. With no arguments it listens on a
/// Unix socket under $XDG_RUNTIME_DIR/tensile/ (else /tmp/tensile-$UID/).
#[derive(Debug, Clone, Default, Parser)]
#[command(name = "tensile-scheduler", version)]
pub struct Args {
    /// Where to listen, repeatable: unix:PATH or IP:PORT. A non-loopback
    /// address needs --insecure (no TLS here). Default: the per-user
    /// Unix socket.
    #[arg(long, env = "TENSILE_LISTEN", value_delimiter = ',')]
    pub listen: Vec<String>,
    /// Allow listening on a non-loopback TCP address without TLS.
    #[arg(long, env = "TENSILE_INSECURE")]
    pub insecure: bool,
    /// Device profile: a built-in name (a6000, h100, paper), `cpu`, or a
    /// profile file. Default: the local GPU's memory when nvidia-smi sees
    /// one (with the a6000 link model), else a6000.
    #[arg(long, env = "TENSILE_DEVICE")]
    pub device: Option<String>,
    /// Memory shared by all jobs, MB (10^6 bytes). Default: the device's.
    #[arg(long, env = "TENSILE_BUDGET_MB")]
    pub budget_mb: Option<u64>,
    /// A file holding the admin token that SetMemoryBudget requires
    /// (TENSILE_ADMIN_TOKEN may hold the token itself).
    #[arg(long, env = "TENSILE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Serve Prometheus metrics on this loopback address (IP:PORT).
    #[arg(long, env = "TENSILE_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Directory of the store of learned latencies. Default:
    /// $XDG_STATE_HOME/tensile, else ~/.local/state/tensile; `none`: keep
    /// nothing.
    #[arg(long, env = "TENSILE_STATE")]
    pub state: Option<String>,
    /// Lease, seconds: a job with no open plan stream, report or heartbeat
    /// for this long is removed. Default 10.
    #[arg(long, env = "TENSILE_LEASE_S")]
    pub lease_s: Option<f64>,
    /// Largest graph message accepted, MB. Default 256.
    #[arg(long, env = "TENSILE_MAX_GRAPH_MB")]
    pub max_graph_mb: Option<u64>,
    /// Cold-start latency models: auto, roofline, or a model directory.
    #[arg(long, env = "TENSILE_LATENCY_MODELS")]
    pub latency_models: Option<String>,
    /// Time cap of one joint plan, seconds: the planner stops its search
    /// there and returns the moves made so far (a valid plan). Default 2.
    #[arg(long, env = "TENSILE_PLAN_CAP_S")]
    pub plan_cap_s: Option<f64>,
    /// How long shutdown waits for connections to close, seconds. Default 5.
    #[arg(long, env = "TENSILE_SHUTDOWN_S")]
    pub shutdown_s: Option<f64>,
    /// Never gate jobs: plan every job free-running, the budget on the sum
    /// of their peaks. By default jobs whose iterations are alike and that
    /// do not fit free are given gates (a common period, a phase each) so
    /// that their memory interleaves.
    #[arg(long, env = "TENSILE_NO_GATES")]
    pub no_gates: bool,
    /// How much longer than the longest planned iteration the gates'
    /// period is, as a share of it (0 to 1). Default 0.005; a host whose
    /// iterations jitter by more (a loaded CPU) wants more.
    #[arg(long, env = "TENSILE_GATE_SLACK")]
    pub gate_slack: Option<f64>,
    /// A TOML file with any of the settings above (snake_case keys, e.g.
    /// `budget_mb = 20000`, `listen = ["127.0.0.1:50051"]`).
    #[arg(long, env = "TENSILE_CONFIG")]
    pub config: Option<PathBuf>,
}

/// The TOML file: the same settings, all optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<Vec<String>>,
    pub insecure: Option<bool>,
    pub device: Option<String>,
    pub budget_mb: Option<u64>,
    pub admin_token_file: Option<PathBuf>,
    pub metrics_listen: Option<String>,
    pub state: Option<String>,
    pub lease_s: Option<f64>,
    pub max_graph_mb: Option<u64>,
    pub latency_models: Option<String>,
    pub plan_cap_s: Option<f64>,
    pub shutdown_s: Option<f64>,
    pub no_gates: Option<bool>,
    pub gate_slack: Option<f64>,
}

/// What the binary runs with.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub listen: Vec<ListenAddr>,
    pub config: Config,
    /// For the log: choices made for the user (the device, insecure TCP).
    pub notes: Vec<String>,
}

fn seconds(flag: &str, v: f64) -> Result<Duration, String> {
    if v.is_finite() && v > 0.0 && v < 1e7 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(format!(
            "--{flag} must be a positive number of seconds, got {v}"
        ))
    }
}

impl Args {
    /// Flags over the file over defaults, checked.
    pub fn resolve(&self) -> Result<Resolved, String> {
        let file = match &self.config {
            Some(p) => read_file(p)?,
            None => FileConfig::default(),
        };
        let mut notes = Vec::new();
        let listen = if self.listen.is_empty() {
            file.listen.clone().unwrap_or_default()
        } else {
            self.listen.clone()
        };
        let mut listen = listen
            .iter()
            .map(|s| ListenAddr::parse(s))
            .collect::<Result<Vec<_>, _>>()?;
        if listen.is_empty() {
            listen.push(ListenAddr::Unix(
                tensile_proto::endpoint::default_socket_path(),
            ));
        }
        let insecure = self.insecure || file.insecure.unwrap_or(false);
        for a in &listen {
            if !a.is_loopback() {
                if !insecure {
                    return Err(format!(
                        "--listen {a} is not a loopback address: jobs' tokens would cross the network in clear; add --insecure to allow it (there is no TLS here)"
                    ));
                }
                notes.push(format!(
                    "WARNING: listening on {a} without TLS (--insecure)"
                ));
            }
        }
        let (device, note) = match self.device.clone().or(file.device.clone()) {
            Some(name) => (
                tensile_experiments::device_profile(&name).map_err(|e| format!("--device: {e}"))?,
                format!("device {name:?} (--device)"),
            ),
            None => default_device()?,
        };
        notes.push(note);
        let mut config = Config::new(device);
        if let Some(mb) = self.budget_mb.or(file.budget_mb) {
            if mb == 0 {
                return Err("--budget-mb must be positive".into());
            }
            config.budget_bytes = mb.saturating_mul(1_000_000);
        }
        config.admin_token = admin_token(
            self.admin_token_file
                .as_deref()
                .or(file.admin_token_file.as_deref()),
        )?;
        if let Some(m) = self.metrics_listen.clone().or(file.metrics_listen.clone()) {
            let addr: SocketAddr = m
                .replace("localhost:", "127.0.0.1:")
                .parse()
                .map_err(|_| format!("--metrics-listen {m:?}: expected IP:PORT"))?;
            config.metrics_listen = Some(addr);
        }
        config.state_dir = match self.state.clone().or(file.state.clone()).as_deref() {
            Some("none") => None,
            Some(dir) => Some(PathBuf::from(dir)),
            None => default_state_dir(),
        };
        if let Some(s) = self.lease_s.or(file.lease_s) {
            config.lease = seconds("lease-s", s)?;
        }
        if let Some(mb) = self.max_graph_mb.or(file.max_graph_mb) {
            if mb == 0 || mb > 4096 {
                return Err(format!("--max-graph-mb must be in 1..=4096, got {mb}"));
            }
            config.limits.max_input_bytes = mb << 20;
        }
        if let Some(m) = self.latency_models.clone().or(file.latency_models.clone()) {
            config.models = match m.as_str() {
                "auto" => ModelsSpec::Auto,
                "roofline" => ModelsSpec::Roofline,
                dir if Path::new(dir).is_dir() => ModelsSpec::Dir(PathBuf::from(dir)),
                dir => {
                    return Err(format!(
                        "--latency-models {dir:?}: expected auto, roofline or a model directory"
                    ));
                }
            };
        }
        if let Some(s) = self.plan_cap_s.or(file.plan_cap_s) {
            config.plan_cap = seconds("plan-cap-s", s)?;
        }
        if let Some(s) = self.shutdown_s.or(file.shutdown_s) {
            config.shutdown_deadline = seconds("shutdown-s", s)?;
        }
        config.gates = !(self.no_gates || file.no_gates.unwrap_or(false));
        if let Some(s) = self.gate_slack.or(file.gate_slack) {
            if !(s.is_finite() && (0.0..=1.0).contains(&s)) {
                return Err(format!("--gate-slack must be in 0..=1, got {s}"));
            }
            config.gate_slack = s;
        }
        config.validate()?;
        Ok(Resolved {
            listen,
            config,
            notes,
        })
    }
}

fn read_file(path: &Path) -> Result<FileConfig, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--config {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("--config {}: {e}", path.display()))
}

/// The admin token: from the file, else `TENSILE_ADMIN_TOKEN`; never a
/// flag value (it would show in `ps`).
fn admin_token(file: Option<&Path>) -> Result<Option<String>, String> {
    if let Some(p) = file {
        let t = std::fs::read_to_string(p)
            .map_err(|e| format!("--admin-token-file {}: {e}", p.display()))?;
        let t = t.trim().to_string();
        if t.is_empty() {
            return Err(format!(
                "--admin-token-file {}: the file is empty",
                p.display()
            ));
        }
        return Ok(Some(t));
    }
    Ok(std::env::var("TENSILE_ADMIN_TOKEN")
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty()))
}

fn default_state_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").map(PathBuf::from)
        && d.is_absolute()
    {
        return Some(d.join("tensile"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state/tensile"))
}

/// The local GPU's memory when `nvidia-smi` sees one (the a6000 profile's
/// link model), else the a6000 profile; the note says which.
fn default_device() -> Result<(DeviceProfile, String), String> {
    let mut p = DeviceProfile::builtin("a6000").map_err(|e| e.to_string())?;
    let smi = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=name,memory.total",
            "--format=csv,noheader,nounits",
        ])
        .output();
    if let Ok(out) = smi
        && out.status.success()
        && let Some(line) = String::from_utf8_lossy(&out.stdout).lines().next()
        && let Some((name, mib)) = line.rsplit_once(',')
        && let Ok(mib) = mib.trim().parse::<u64>()
    {
        p.memory_bytes = mib << 20;
        return Ok((
            p,
            format!(
                "device: the local GPU {:?} ({mib} MiB), with the a6000 profile's copy link",
                name.trim()
            ),
        ));
    }
    Ok((
        p,
        "device: no GPU visible (nvidia-smi), using the a6000 profile".to_string(),
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn flags_win_over_the_file_and_bad_values_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s.toml");
        std::fs::write(
            &file,
            "budget_mb = 1000\nlease_s = 3.0\nlisten = [\"127.0.0.1:0\"]\nstate = \"none\"\ndevice = \"h100\"\n",
        )
        .unwrap();
        let args = Args {
            config: Some(file.clone()),
            budget_mb: Some(2000),
            ..Args::default()
        };
        let r = args.resolve().unwrap();
        assert_eq!(r.config.budget_bytes, 2_000_000_000);
        assert_eq!(r.config.lease, Duration::from_secs(3));
        assert_eq!(r.config.device.name, "h100");
        assert_eq!(r.config.state_dir, None);
        assert_eq!(r.listen, vec![ListenAddr::parse("127.0.0.1:0").unwrap()]);

        let bad = |a: Args| a.resolve().unwrap_err();
        assert!(
            bad(Args {
                listen: vec!["0.0.0.0:1".into()],
                device: Some("a6000".into()),
                ..Args::default()
            })
            .contains("--insecure")
        );
        assert!(
            bad(Args {
                lease_s: Some(-1.0),
                device: Some("a6000".into()),
                ..Args::default()
            })
            .contains("--lease-s")
        );
        assert!(
            bad(Args {
                device: Some("nosuch".into()),
                ..Args::default()
            })
            .contains("--device")
        );
        assert!(
            bad(Args {
                metrics_listen: Some("0.0.0.0:9000".into()),
                device: Some("a6000".into()),
                ..Args::default()
            })
            .contains("loopback")
        );
        std::fs::write(&file, "budget_mbb = 1\n").unwrap();
        assert!(
            bad(Args {
                config: Some(file),
                ..Args::default()
            })
            .contains("unknown field")
        );
    }
}
