//! The binary's configuration: flags (clap, each with a `TENSILE_*`
//! environment equivalent), an optional TOML file (`--config`), defaults;
//! flags and environment win over the file. [`Args::resolve`] turns them
//! into listen addresses and a validated [`Config`] before anything starts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand};
use serde::Deserialize;
use tensile_cli::Mb;
use tensile_latency_model::DeviceProfile;
use tensile_planner::RecomputeFirst;
use tensile_proto::tls::ServerTlsFiles;

use crate::coldstart::ModelsSpec;
use crate::config::{Config, ListenAddr};
use crate::error::ConfigError;
use crate::node::{Gpu, GpuSpec, SmiGpu};

/// The TENSILE Memory Scheduler: plans GPU memory (swaps, prefetches,
/// releases, recomputations) for the training jobs sharing each GPU of the
/// node and pushes each job its plan over gRPC. With no arguments it serves
/// every GPU nvidia-smi sees, GPU N on the Unix socket gpuN.sock under
/// $XDG_RUNTIME_DIR/tensile/ (else /tmp/tensile-$UID/), described in
/// gpus.json there; on a machine without a GPU, one simulated device on
/// scheduler.sock there.
#[derive(Debug, Clone, Default, Parser)]
#[command(name = "tensile-scheduler", version)]
pub struct Args {
    /// The GPUs to serve, one planning domain and one socket
    /// (SOCKET_DIR/gpuN.sock) each: `all` or node-level indices such as
    /// 0,1,3. Default: every GPU nvidia-smi sees (none: one simulated
    /// device on SOCKET_DIR/scheduler.sock). Named GPUs that nvidia-smi
    /// does not list (a machine without one) are simulated with the
    /// --device profile.
    #[arg(long, env = "TENSILE_GPUS")]
    pub gpus: Option<String>,
    /// The directory of the sockets and of gpus.json. Default:
    /// $XDG_RUNTIME_DIR/tensile, else /tmp/tensile-$UID.
    #[arg(long, env = "TENSILE_SOCKET_DIR")]
    pub socket_dir: Option<PathBuf>,
    /// Serve one device on these addresses instead of the node's GPUs,
    /// repeatable: unix:PATH or IP:PORT. A non-loopback address needs TLS
    /// (--tls-cert and --tls-key) or --insecure. Cannot go with --gpus.
    #[arg(long, env = "TENSILE_LISTEN", value_delimiter = ',')]
    pub listen: Vec<String>,
    /// Allow listening on a non-loopback TCP address without TLS.
    #[arg(long, env = "TENSILE_INSECURE")]
    pub insecure: bool,
    /// Serve the TCP listeners with TLS: this certificate (chain), PEM.
    /// Its subject alternative names must list the names or IP addresses
    /// clients connect by. Unix sockets stay plaintext.
    #[arg(long, env = "TENSILE_TLS_CERT", value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, PEM.
    #[arg(long, env = "TENSILE_TLS_KEY", value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS: require every TCP client to present a certificate
    /// signed by this CA (PEM).
    #[arg(long, env = "TENSILE_TLS_CLIENT_CA", value_name = "PEM")]
    pub tls_client_ca: Option<PathBuf>,
    /// Device profile: a built-in name (a6000, h100, h200, paper), `cpu`, or a
    /// profile file; its copy link is every GPU's, its memory a simulated
    /// GPU's (a real GPU's is what nvidia-smi reports). Default: a6000 (with
    /// --listen: the first GPU's memory when nvidia-smi sees one).
    #[arg(long, env = "TENSILE_DEVICE")]
    pub device: Option<String>,
    /// Memory shared by the jobs of each GPU, MB (10^6 bytes; decimals
    /// allowed). Default: each GPU's memory.
    #[arg(long, env = "TENSILE_BUDGET_MB", value_name = "MB",
          value_parser = tensile_cli::parse_positive_mb, allow_negative_numbers = true)]
    pub budget_mb: Option<Mb>,
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
    /// Largest graph message accepted, MB (10^6 bytes), at most 4096.
    /// Default 256 MiB.
    #[arg(long, env = "TENSILE_MAX_GRAPH_MB", value_name = "MB",
          value_parser = tensile_cli::parse_positive_mb, allow_negative_numbers = true)]
    pub max_graph_mb: Option<Mb>,
    /// Cold-start latency models: auto, roofline, or a model directory.
    #[arg(long, env = "TENSILE_LATENCY_MODELS")]
    pub latency_models: Option<String>,
    /// Work bound of one joint plan, in moves tried (every swap the
    /// planner tries to place, every time-for-memory move it tries on a
    /// copy of a job): the planner stops its search there and returns the
    /// moves made so far (a valid plan, with a PLANNING_CAPPED
    /// diagnostic). The same jobs get the same plan however busy the
    /// machine is. Default 400000 (about 2 s on a 2-core machine); a fast
    /// first plan may try 1/80 of it.
    #[arg(long, env = "TENSILE_PLAN_MAX_MOVES")]
    pub plan_max_moves: Option<u64>,
    /// Wall-clock safety net of one joint plan, seconds: should the work
    /// bound take longer than this (a machine far slower or busier than
    /// expected), the search stops here too, and a warning says the plan
    /// then depends on the machine's load. Default 10.
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
    /// period is, as a share of it (0 to 1). Default 0.005 (at least 0.02 for
    /// three jobs or more); a host whose iterations jitter by more (a
    /// loaded CPU) wants more.
    #[arg(long, env = "TENSILE_GATE_SLACK")]
    pub gate_slack: Option<f64>,
    /// Which gated jobs that swaps alone leave over the budget are planned
    /// again recomputing first, then swapping around the recomputations,
    /// keeping the lower plan: a shorter cycle where the link is full, at
    /// several times the planning time (bounded by --plan-max-moves). never,
    /// many-jobs (three jobs or more; the default) or always;
    /// `--recompute-first` alone is always.
    #[arg(long, env = "TENSILE_RECOMPUTE_FIRST", value_parser = RecomputeFirst::parse,
          num_args = 0..=1, default_missing_value = "always")]
    pub recompute_first: Option<RecomputeFirst>,
    /// The mode of the Unix sockets, octal (e.g. 0660: the scheduler's
    /// group may connect; 0666: every local user), set right after each is
    /// bound, before gpus.json names it. Connecting needs write
    /// permission. Default: as created, 0777 less the umask.
    #[arg(long, env = "TENSILE_SOCKET_MODE", value_name = "OCTAL",
          value_parser = parse_socket_mode)]
    pub socket_mode: Option<u32>,
    /// A TOML file with any of the settings above (snake_case keys, e.g.
    /// `budget_mb = 20000`, `gpus = "0,1"` or `gpus = [0, 1]`,
    /// `listen = ["127.0.0.1:50051"]`).
    #[arg(long, env = "TENSILE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Instead of serving: a tool (`endpoint`).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// What the binary does instead of serving.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Print where a job's scheduler listens, by the one rule every client
    /// follows (the deploy scripts call this). Without --gpu or --all: the
    /// address a job on --device connects to (TENSILE_SERVER, else its
    /// GPU's socket in gpus.json through CUDA_VISIBLE_DEVICES, else
    /// scheduler.sock). Exit status 1: gpus.json cannot be read or names no
    /// such GPU for the job; 3: --gpu names a GPU gpus.json does not list.
    Endpoint(EndpointArgs),
}

/// `tensile-scheduler endpoint`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EndpointArgs {
    /// The socket directory. Default: TENSILE_SOCKET_DIR, else
    /// $XDG_RUNTIME_DIR/tensile, else /tmp/tensile-$UID.
    #[arg(long)]
    pub socket_dir: Option<PathBuf>,
    /// A GPU's node-level index: print its socket's path (the one
    /// gpus.json gives it; without gpus.json, SOCKET_DIR/gpuN.sock).
    #[arg(long, conflicts_with_all = ["all", "device"])]
    pub gpu: Option<u32>,
    /// Print the path of every socket gpus.json names, one a line.
    #[arg(long, conflicts_with = "device")]
    pub all: bool,
    /// The job's device (cuda:N; default cuda:0): print the address a job
    /// there connects to.
    #[arg(long)]
    pub device: Option<String>,
    /// With --gpu: print the GPU as JSON: index, socket, and from gpus.json
    /// (null without one) budget_bytes and memory_bytes.
    #[arg(long, requires = "gpu")]
    pub json: bool,
}

/// The TOML file: the same settings, all optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub gpus: Option<GpusValue>,
    pub socket_dir: Option<PathBuf>,
    pub listen: Option<Vec<String>>,
    pub insecure: Option<bool>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    pub device: Option<String>,
    pub budget_mb: Option<u64>,
    pub admin_token_file: Option<PathBuf>,
    pub metrics_listen: Option<String>,
    pub state: Option<String>,
    pub lease_s: Option<f64>,
    pub max_graph_mb: Option<u64>,
    pub latency_models: Option<String>,
    pub plan_max_moves: Option<u64>,
    pub plan_cap_s: Option<f64>,
    pub shutdown_s: Option<f64>,
    pub no_gates: Option<bool>,
    pub gate_slack: Option<f64>,
    pub recompute_first: Option<RecomputeFirstValue>,
    /// Octal, as a string: `socket_mode = "0660"`.
    pub socket_mode: Option<String>,
}

/// A Unix socket's mode in octal: `0660`, `660` or `0o660`, at most 0777,
/// and with read and write for the owner (the scheduler's own clients, and
/// its check for a live scheduler at start, connect as it).
pub fn parse_socket_mode(s: &str) -> Result<u32, ConfigError> {
    let t = s.trim();
    let digits = t.strip_prefix("0o").unwrap_or(t);
    let mode = (!digits.is_empty() && digits.bytes().all(|b| (b'0'..=b'7').contains(&b)))
        .then(|| u32::from_str_radix(digits, 8).ok())
        .flatten()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| ConfigError::NotAMode(t.to_string()))?;
    if mode & 0o600 != 0o600 {
        return Err(ConfigError::OwnerCannotConnect(t.to_string()));
    }
    Ok(mode)
}

/// `recompute_first` in the TOML file: `"never"`, `"many-jobs"`,
/// `"always"`, or a boolean (`true` is always, `false` never).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RecomputeFirstValue {
    Flag(bool),
    Name(String),
}

impl RecomputeFirstValue {
    fn resolve(&self) -> Result<RecomputeFirst, ConfigError> {
        match self {
            RecomputeFirstValue::Flag(true) => Ok(RecomputeFirst::Always),
            RecomputeFirstValue::Flag(false) => Ok(RecomputeFirst::Never),
            RecomputeFirstValue::Name(s) => RecomputeFirst::parse(s).map_err(ConfigError::Invalid),
        }
    }
}

/// `gpus` in the TOML file: `"all"`, `"0,1"` or `[0, 1]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum GpusValue {
    Text(String),
    List(Vec<u32>),
}

impl GpusValue {
    fn spec(&self) -> Result<GpuSpec, ConfigError> {
        match self {
            GpusValue::Text(s) => GpuSpec::parse(s),
            GpusValue::List(l) => {
                GpuSpec::parse(&l.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
            }
        }
    }
}

/// What the scheduler serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Serve {
    /// One device on these addresses.
    Listen(Vec<ListenAddr>),
    /// These GPUs, `dir/gpuN.sock` each, described in `dir/gpus.json`.
    Gpus { dir: PathBuf, gpus: Vec<Gpu> },
}

/// What the binary runs with.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub serve: Serve,
    /// The device profile, budget and the rest; with GPUs, each GPU's
    /// domain takes its memory and budget from its [`Gpu`].
    pub config: Config,
    /// For the log: choices made for the user (the device, insecure TCP).
    pub notes: Vec<String>,
}

fn seconds(flag: &'static str, v: f64) -> Result<Duration, ConfigError> {
    if v.is_finite() && v > 0.0 && v < 1e7 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(ConfigError::NotSeconds { flag, value: v })
    }
}

impl Args {
    /// Flags over the file over defaults, checked; the GPUs are those
    /// `nvidia-smi` lists.
    pub fn resolve(&self) -> Result<Resolved, ConfigError> {
        self.resolve_with(&crate::node::nvidia_smi)
    }

    /// [`Args::resolve`], with the node's GPUs listed by `smi`.
    pub fn resolve_with(&self, smi: &dyn Fn() -> Vec<SmiGpu>) -> Result<Resolved, ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
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
        let listen = listen
            .iter()
            .map(|s| ListenAddr::parse(s))
            .collect::<Result<Vec<_>, _>>()?;
        let spec = match (&self.gpus, &file.gpus) {
            (Some(s), _) => Some(GpuSpec::parse(s)?),
            (None, Some(v)) => Some(v.spec()?),
            (None, None) => None,
        };
        if spec.is_some()
            && let Some(first) = listen.first()
        {
            return Err(ConfigError::ListenWithGpus(first.clone()));
        }
        let socket_dir = self
            .socket_dir
            .clone()
            .or(file.socket_dir.clone())
            .unwrap_or_else(tensile_proto::endpoint::default_socket_dir);
        // No --listen: the node's GPUs (all when --gpus is not given and
        // nvidia-smi sees any).
        let seen = if listen.is_empty() { smi() } else { Vec::new() };
        let spec = spec.or((listen.is_empty() && !seen.is_empty()).then_some(GpuSpec::All));
        let listen = if listen.is_empty() && spec.is_none() {
            vec![ListenAddr::Unix(
                socket_dir.join(tensile_proto::endpoint::SINGLE_SOCKET),
            )]
        } else {
            listen
        };
        let insecure = self.insecure || file.insecure.unwrap_or(false);
        let tls = ServerTlsFiles::from_parts(
            self.tls_cert.clone().or(file.tls_cert.clone()),
            self.tls_key.clone().or(file.tls_key.clone()),
            self.tls_client_ca.clone().or(file.tls_client_ca.clone()),
        )
        .and_then(|f| f.map(|f| f.load()).transpose())?;
        let tcp: Vec<&ListenAddr> = listen
            .iter()
            .filter(|a| matches!(a, ListenAddr::Tcp(_)))
            .collect();
        for a in &tcp {
            match &tls {
                Some(t) => notes.push(format!(
                    "TLS on {a} ({}{})",
                    t.files.cert.display(),
                    t.files
                        .client_ca
                        .as_ref()
                        .map_or_else(String::new, |ca| format!(
                            "; clients need a certificate signed by {}",
                            ca.display()
                        ))
                )),
                None if a.is_loopback() => {}
                None if insecure => notes.push(format!(
                    "WARNING: listening on {a} without TLS (--insecure)"
                )),
                None => return Err(ConfigError::PlaintextOffHost((*a).clone())),
            }
        }
        if let Some(t) = &tls
            && tcp.is_empty()
        {
            notes.push(format!(
                "--tls-cert {}: no TCP listener, so no TLS (Unix sockets stay plaintext)",
                t.files.cert.display()
            ));
        }
        let (device, note) = match self.device.clone().or(file.device.clone()) {
            Some(name) => (
                tensile_latency_model::device_profile(&name).map_err(ConfigError::Device)?,
                format!("device {name:?} (--device)"),
            ),
            None if spec.is_some() => (
                DeviceProfile::builtin("a6000")?,
                "device profile a6000 (the copy link of every GPU)".to_string(),
            ),
            None => default_device()?,
        };
        notes.push(note);
        let mut config = Config::new(device);
        let budget = match self.budget_mb.or(file.budget_mb.map(Mb::whole)) {
            Some(mb) if mb.bytes() == 0 => {
                return invalid("budget_mb must be positive".into());
            }
            Some(mb) => Some(mb.bytes()),
            None => None,
        };
        if let Some(b) = budget {
            config.budget_bytes = b;
        }
        let serve = match &spec {
            None => Serve::Listen(listen),
            Some(spec) => {
                let gpus = crate::node::select(spec, &seen, &config.device, budget)?;
                notes.push(format!(
                    "serving GPUs {} in {}",
                    gpus.iter()
                        .map(|g| format!(
                            "{} ({}{}, budget {} MB)",
                            g.index,
                            g.name,
                            if g.simulated { "" } else { ", real" },
                            g.budget_bytes / 1_000_000
                        ))
                        .collect::<Vec<_>>()
                        .join(", "),
                    socket_dir.display()
                ));
                Serve::Gpus {
                    dir: socket_dir,
                    gpus,
                }
            }
        };
        config.admin_token = admin_token(
            self.admin_token_file
                .as_deref()
                .or(file.admin_token_file.as_deref()),
        )?;
        if let Some(m) = self.metrics_listen.clone().or(file.metrics_listen.clone()) {
            let addr: SocketAddr = m.replace("localhost:", "127.0.0.1:").parse().map_err(|_| {
                ConfigError::Invalid(format!("--metrics-listen {m:?}: expected IP:PORT"))
            })?;
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
        if let Some(mb) = self.max_graph_mb.or(file.max_graph_mb.map(Mb::whole)) {
            if mb.bytes() == 0 || mb > Mb::whole(4096) {
                return invalid(format!(
                    "--max-graph-mb must be above 0 and at most 4096, got {mb}"
                ));
            }
            config.limits.max_input_bytes = mb.bytes();
        }
        if let Some(m) = self.latency_models.clone().or(file.latency_models.clone()) {
            config.models = match m.as_str() {
                "auto" => ModelsSpec::Auto,
                "roofline" => ModelsSpec::Roofline,
                dir if Path::new(dir).is_dir() => ModelsSpec::Dir(PathBuf::from(dir)),
                dir => {
                    return invalid(format!(
                        "--latency-models {dir:?}: expected auto, roofline or a model directory"
                    ));
                }
            };
        }
        if let Some(m) = self.plan_max_moves.or(file.plan_max_moves) {
            if m == 0 {
                return invalid("--plan-max-moves must be at least 1, got 0".to_string());
            }
            config.plan_max_moves = m;
        }
        if let Some(s) = self.plan_cap_s.or(file.plan_cap_s) {
            config.plan_cap = seconds("plan-cap-s", s)?;
        }
        if let Some(s) = self.shutdown_s.or(file.shutdown_s) {
            config.shutdown_deadline = seconds("shutdown-s", s)?;
        }
        config.gates = !(self.no_gates || file.no_gates.unwrap_or(false));
        config.recompute_first = match (self.recompute_first, &file.recompute_first) {
            (Some(r), _) => r,
            (None, Some(v)) => v.resolve()?,
            (None, None) => RecomputeFirst::default(),
        };
        if let Some(s) = self.gate_slack.or(file.gate_slack) {
            if !(s.is_finite() && (0.0..=1.0).contains(&s)) {
                return invalid(format!("--gate-slack must be in 0..=1, got {s}"));
            }
            config.gate_slack = s;
        }
        config.tls = tls;
        config.socket_mode = match (self.socket_mode, &file.socket_mode) {
            (Some(m), _) => Some(m),
            (None, Some(s)) => Some(
                parse_socket_mode(s)
                    .map_err(|e| ConfigError::Invalid(format!("socket_mode: {e}")))?,
            ),
            (None, None) => None,
        };
        config.validate()?;
        Ok(Resolved {
            serve,
            config,
            notes,
        })
    }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::ParseFile {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

/// The admin token: from the file, else `TENSILE_ADMIN_TOKEN`; never a
/// flag value (it would show in `ps`).
fn admin_token(file: Option<&Path>) -> Result<Option<String>, ConfigError> {
    if let Some(p) = file {
        let t = std::fs::read_to_string(p).map_err(|source| ConfigError::ReadAdminToken {
            path: p.to_path_buf(),
            source,
        })?;
        let t = t.trim().to_string();
        if t.is_empty() {
            return Err(ConfigError::EmptyAdminToken(p.to_path_buf()));
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
fn default_device() -> Result<(DeviceProfile, String), ConfigError> {
    let mut p = DeviceProfile::builtin("a6000")?;
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
            "budget_mb = 1000\nlease_s = 3.0\nlisten = [\"127.0.0.1:0\"]\nstate = \"none\"\ndevice = \"h100\"\nrecompute_first = true\nplan_max_moves = 1234\n",
        )
        .unwrap();
        let args = Args {
            config: Some(file.clone()),
            budget_mb: Some(Mb::whole(2000)),
            ..Args::default()
        };
        let r = args.resolve().unwrap();
        assert_eq!(r.config.budget_bytes, 2_000_000_000);
        assert_eq!(r.config.plan_max_moves, 1234);
        assert_eq!(
            Args::default().resolve().unwrap().config.plan_max_moves,
            crate::config::DEFAULT_PLAN_MAX_MOVES
        );
        assert_eq!(r.config.lease, Duration::from_secs(3));
        assert_eq!(r.config.device.name, "h100");
        assert_eq!(r.config.recompute_first, RecomputeFirst::Always);
        assert_eq!(
            Args::default().resolve().unwrap().config.recompute_first,
            RecomputeFirst::ManyJobs
        );
        // The flag wins over the file; the file names a mode too.
        let never = Args {
            config: Some(file.clone()),
            recompute_first: Some(RecomputeFirst::Never),
            ..Args::default()
        };
        assert_eq!(
            never.resolve().unwrap().config.recompute_first,
            RecomputeFirst::Never
        );
        let from_file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            Args {
                config: Some(path),
                ..Args::default()
            }
            .resolve()
        };
        let named = from_file("named.toml", "recompute_first = \"many-jobs\"\n");
        assert_eq!(
            named.unwrap().config.recompute_first,
            RecomputeFirst::ManyJobs
        );
        let err = from_file("odd.toml", "recompute_first = \"sometimes\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("recompute-first") && err.contains("sometimes"),
            "{err}"
        );
        assert_eq!(r.config.state_dir, None);
        assert_eq!(
            r.serve,
            Serve::Listen(vec![ListenAddr::parse("127.0.0.1:0").unwrap()])
        );

        let bad = |a: Args| a.resolve().unwrap_err().to_string();
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
                plan_max_moves: Some(0),
                device: Some("a6000".into()),
                ..Args::default()
            })
            .contains("--plan-max-moves")
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
        let err = Args {
            config: Some(file.clone()),
            ..Args::default()
        }
        .resolve()
        .unwrap_err();
        assert!(
            matches!(&err, ConfigError::ParseFile { path, .. } if *path == file),
            "{err:?}"
        );
        assert!(err.to_string().contains("unknown field"), "{err}");
    }

    fn two_gpus() -> Vec<SmiGpu> {
        crate::node::parse_smi("0, GPU-aa, NVIDIA A100, 81920\n1, GPU-bb, NVIDIA A100, 40960\n")
    }

    #[test]
    fn gpus_come_from_flags_the_file_or_nvidia_smi() {
        let dir = tempfile::tempdir().unwrap();
        let none = || Vec::new();
        // Nothing given, no GPU: the single device on DIR/scheduler.sock.
        let args = Args {
            socket_dir: Some(dir.path().to_path_buf()),
            device: Some("a6000".into()),
            ..Args::default()
        };
        assert_eq!(
            args.resolve_with(&none).unwrap().serve,
            Serve::Listen(vec![ListenAddr::Unix(dir.path().join("scheduler.sock"))])
        );
        // Nothing given, two GPUs: both, real, each its memory as budget.
        let r = args.resolve_with(&two_gpus).unwrap();
        let Serve::Gpus { dir: d, gpus } = r.serve else {
            panic!("{:?}", r.serve)
        };
        assert_eq!(d, dir.path());
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[1].budget_bytes, 40960 << 20);
        assert!(!gpus[1].simulated);
        // --gpus without a GPU: simulated, the budget per GPU.
        let args = Args {
            gpus: Some("0,1".into()),
            budget_mb: Some(Mb::whole(700)),
            ..args
        };
        let Serve::Gpus { gpus, .. } = args.resolve_with(&none).unwrap().serve else {
            panic!()
        };
        assert_eq!(
            gpus.iter()
                .map(|g| (g.uuid.as_str(), g.budget_bytes))
                .collect::<Vec<_>>(),
            [("sim-0", 700_000_000), ("sim-1", 700_000_000)]
        );
        // With --listen: refused, naming both.
        let err = Args {
            listen: vec!["unix:/tmp/x.sock".into()],
            ..args.clone()
        }
        .resolve_with(&none)
        .unwrap_err();
        assert!(matches!(err, ConfigError::ListenWithGpus(_)), "{err:?}");
        let err = err.to_string();
        assert!(err.contains("--listen") && err.contains("--gpus"), "{err}");
        // A GPU nvidia-smi does not list.
        let err = Args {
            gpus: Some("3".into()),
            ..args
        }
        .resolve_with(&two_gpus)
        .unwrap_err();
        assert!(
            matches!(err, ConfigError::NoSuchGpu { index: 3, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("no GPU 3"), "{err}");
        // The file: a list, or text.
        let toml = dir.path().join("s.toml");
        for text in ["gpus = [1]\n", "gpus = \"1\"\n"] {
            std::fs::write(&toml, text).unwrap();
            let r = Args {
                config: Some(toml.clone()),
                socket_dir: Some(dir.path().to_path_buf()),
                ..Args::default()
            }
            .resolve_with(&two_gpus)
            .unwrap();
            let Serve::Gpus { gpus, .. } = r.serve else {
                panic!()
            };
            assert_eq!(gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [1]);
        }
        std::fs::write(&toml, "gpus = \"1,one\"\n").unwrap();
        let err = Args {
            config: Some(toml),
            ..Args::default()
        }
        .resolve_with(&two_gpus)
        .unwrap_err()
        .to_string();
        assert!(err.contains("\"one\""), "{err}");
    }
}
