//! The scheduler's validated configuration (what `run` takes) and its
//! listen addresses. Raw flags, environment and the TOML file become this
//! in [`crate::cli`]; tests build it directly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tensile_graph::Limits;
use tensile_latency_model::DeviceProfile;
use tensile_planner::RecomputeFirst;

use crate::coldstart::ModelsSpec;
use crate::error::ConfigError;

/// Where to listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl ListenAddr {
    /// `unix:PATH` or `HOST:PORT` (an IP address; `localhost` is taken
    /// as 127.0.0.1).
    pub fn parse(s: &str) -> Result<ListenAddr, ConfigError> {
        if let Some(path) = s.strip_prefix("unix:") {
            let path = path.trim_start_matches("//");
            if path.is_empty() {
                return Err(ConfigError::UnixWithoutPath(s.to_string()));
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        let s2 = s.replace("localhost:", "127.0.0.1:");
        s2.parse::<SocketAddr>()
            .map(ListenAddr::Tcp)
            .map_err(|_| ConfigError::NotAnAddress(s.to_string()))
    }

    pub fn is_loopback(&self) -> bool {
        match self {
            ListenAddr::Unix(_) => true,
            ListenAddr::Tcp(a) => a.ip().is_loopback(),
        }
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp(a) => write!(f, "{a}"),
        }
    }
}

/// Everything `run` needs, checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// The GPU's profile (copy link, memory) the planner plans for.
    pub device: DeviceProfile,
    /// The memory all jobs share, bytes.
    pub budget_bytes: u64,
    /// Guards SetMemoryBudget; none: anyone who can reach the socket may.
    pub admin_token: Option<String>,
    /// A job whose lease is not renewed for this long is removed.
    pub lease: Duration,
    /// The real guard on graphs (the gRPC decode limit is set above
    /// `limits.max_input_bytes`).
    pub limits: Limits,
    /// The embedded store's directory; none: nothing persists.
    pub state_dir: Option<PathBuf>,
    /// Cold-start latency models.
    pub models: ModelsSpec,
    /// The planner's work bound for one joint plan, in moves tried
    /// (`PlannerConfig::max_moves`): its search stops there and returns the
    /// moves made so far (a valid plan; log, metric and a PLANNING_CAPPED
    /// diagnostic say so). Work, not time: the same jobs get the same plan
    /// however busy the machine is. A fast first plan may try
    /// [`FAST_SHARE`] of it.
    pub plan_max_moves: u64,
    /// The wall-clock safety net of one joint plan
    /// (`PlannerConfig::time_cap`): a plan stopped by it depends on the
    /// machine's load, and a warning says so.
    pub plan_cap: Duration,
    /// Re-plan when a job's total latency moves more than this fraction.
    pub replan_threshold: f64,
    /// Weight of a new measurement in the per-op EWMA.
    pub ewma_weight: f64,
    /// How long shutdown waits for connections after ending every stream.
    pub shutdown_deadline: Duration,
    /// Prometheus metrics, on this loopback HTTP address.
    pub metrics_listen: Option<SocketAddr>,
    /// Coordinate jobs whose iterations are alike when they do not fit the
    /// budget running free: gates (a common period, a phase each) so that
    /// their memory interleaves (`PlannerConfig::coordinate`).
    pub gates: bool,
    /// How much longer than the longest planned iteration the gates'
    /// period is (`PlannerConfig::gate_slack`): room for iterations that
    /// run a little long before a job falls off its phase.
    pub gate_slack: f64,
    /// Which gated jobs are planned recomputing first too
    /// (`PlannerConfig::recompute_first`).
    pub recompute_first: RecomputeFirst,
    /// The mode set on each Unix socket after it is bound (`None`: as
    /// created, 0777 less the umask).
    pub socket_mode: Option<u32>,
    /// TLS for the TCP listeners (Unix sockets stay plaintext); with a
    /// client CA, clients must present a certificate it signed.
    pub tls: Option<tensile_proto::tls::ServerTls>,
}

/// The default work bound of one joint plan, in moves tried: on the
/// 2-core development machine (release build) about what 2 s of planning
/// tried (`tensilectl bench planner`).
pub const DEFAULT_PLAN_MAX_MOVES: u64 = 400_000;

/// The share of the joint plan's work bound a fast first plan may use.
pub const FAST_SHARE: f64 = 1.0 / 80.0;

impl Config {
    /// Defaults for `device`: its whole memory as the budget, a 10 s lease,
    /// no store, no metrics.
    pub fn new(device: DeviceProfile) -> Config {
        Config {
            budget_bytes: device.memory_bytes,
            device,
            admin_token: None,
            lease: Duration::from_secs(10),
            limits: Limits::default(),
            state_dir: None,
            models: ModelsSpec::Auto,
            plan_max_moves: DEFAULT_PLAN_MAX_MOVES,
            plan_cap: Duration::from_secs(10),
            replan_threshold: 0.3,
            ewma_weight: 0.9,
            shutdown_deadline: Duration::from_secs(5),
            metrics_listen: None,
            gates: true,
            recompute_first: RecomputeFirst::default(),
            gate_slack: 0.005,
            socket_mode: None,
            tls: None,
        }
    }

    /// The checks `run` relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if !(self.gate_slack.is_finite() && (0.0..=1.0).contains(&self.gate_slack)) {
            return invalid(format!(
                "the gate slack must be in 0..=1 (a share of the period), got {}",
                self.gate_slack
            ));
        }
        if self.budget_bytes == 0 {
            return invalid("the memory budget must be positive".into());
        }
        if self.lease < Duration::from_millis(100) {
            return invalid(format!(
                "the lease must be at least 0.1 s, got {:?}",
                self.lease
            ));
        }
        if !(self.replan_threshold.is_finite() && self.replan_threshold >= 0.0) {
            return invalid(format!(
                "the re-plan threshold must be finite and >= 0, got {}",
                self.replan_threshold
            ));
        }
        if !(self.ewma_weight > 0.0 && self.ewma_weight <= 1.0) {
            return invalid(format!(
                "the EWMA weight must be in (0, 1], got {}",
                self.ewma_weight
            ));
        }
        if let Some(m) = self.metrics_listen
            && !m.ip().is_loopback()
        {
            return invalid(format!(
                "--metrics-listen {m}: metrics are served on loopback only"
            ));
        }
        if let Some(t) = &self.admin_token
            && t.trim().is_empty()
        {
            return invalid("the admin token is empty".into());
        }
        Ok(self.device.validate()?)
    }

    /// The gRPC decode limit: the graph limit plus room for the rest of
    /// the message.
    pub fn max_message_bytes(&self) -> usize {
        usize::try_from(self.limits.max_input_bytes)
            .unwrap_or(usize::MAX)
            .saturating_add(1 << 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse_or_say_what_is_expected() {
        assert_eq!(
            ListenAddr::parse("unix:/tmp/s.sock").unwrap(),
            ListenAddr::Unix("/tmp/s.sock".into())
        );
        assert_eq!(
            ListenAddr::parse("127.0.0.1:5000")
                .map(|a| a.is_loopback())
                .ok(),
            Some(true)
        );
        assert_eq!(
            ListenAddr::parse("0.0.0.0:5000")
                .map(|a| a.is_loopback())
                .ok(),
            Some(false)
        );
        assert!(
            ListenAddr::parse("nowhere")
                .unwrap_err()
                .to_string()
                .contains("expected unix:PATH or IP:PORT")
        );
        assert!(ListenAddr::parse("unix:").is_err());
    }
}
