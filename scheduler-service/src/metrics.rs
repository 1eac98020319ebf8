//! Prometheus metrics (prometheus-client, OpenMetrics text), served over
//! HTTP on a loopback address at `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

/// The scheduler's metrics; cheap to update from any task.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub jobs: Family<StateLabel, Gauge>,
    pub replans: Family<Reason, Counter>,
    pub plans_published: Counter,
    pub planning_seconds: Histogram,
    pub planning_capped: Counter,
    pub reports: Counter,
    pub stall_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    pub passive_swaps: Counter,
    pub leases_lapsed: Counter,
    pub budget_bytes: Gauge,
    pub sum_of_peaks_bytes: Gauge,
    pub reported_peak_bytes: Gauge,
    pub queue_length: Gauge,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tensile_scheduler");
        let m = Metrics {
            registry: Registry::default(),
            jobs: Family::default(),
            replans: Family::default(),
            plans_published: Counter::default(),
            planning_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            planning_capped: Counter::default(),
            reports: Counter::default(),
            stall_seconds: Counter::default(),
            passive_swaps: Counter::default(),
            leases_lapsed: Counter::default(),
            budget_bytes: Gauge::default(),
            sum_of_peaks_bytes: Gauge::default(),
            reported_peak_bytes: Gauge::default(),
            queue_length: Gauge::default(),
        };
        registry.register("jobs", "Jobs by state", m.jobs.clone());
        registry.register("replans", "Re-plans by cause", m.replans.clone());
        registry.register(
            "plans_published",
            "Plan versions published (one per job per re-plan)",
            m.plans_published.clone(),
        );
        registry.register(
            "planning_seconds",
            "Wall time of one re-plan of all jobs",
            m.planning_seconds.clone(),
        );
        registry.register(
            "planning_capped",
            "Joint plans whose search stopped at the time cap",
            m.planning_capped.clone(),
        );
        registry.register("reports", "Latency reports received", m.reports.clone());
        registry.register(
            "stall_seconds",
            "Reported time ops waited for late prefetches",
            m.stall_seconds.clone(),
        );
        registry.register(
            "passive_swaps",
            "Reported swap-ins no plan event brought",
            m.passive_swaps.clone(),
        );
        registry.register(
            "leases_lapsed",
            "Jobs removed because their lease lapsed",
            m.leases_lapsed.clone(),
        );
        registry.register("budget_bytes", "The memory budget", m.budget_bytes.clone());
        registry.register(
            "sum_of_peaks_bytes",
            "Sum of the jobs' planned peaks",
            m.sum_of_peaks_bytes.clone(),
        );
        registry.register(
            "reported_peak_bytes",
            "Sum of the jobs' last reported peaks",
            m.reported_peak_bytes.clone(),
        );
        registry.register(
            "queue_length",
            "Jobs waiting for admission",
            m.queue_length.clone(),
        );
        Metrics { registry, ..m }
    }

    /// The metrics as OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub fn reason(&self, reason: &str) {
        self.replans
            .get_or_create(&Reason {
                reason: reason.to_string(),
            })
            .inc();
    }
}

/// Serves `/metrics` on `addr` until `cancel`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let m = metrics.clone();
            async move {
                (
                    [(
                        "content-type",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    m.encode(),
                )
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
}

/// Binds the metrics address (loopback only: checked by the config).
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}
