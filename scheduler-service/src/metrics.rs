//! Prometheus metrics (prometheus-client, OpenMetrics text), served over
//! HTTP on a loopback address at `/metrics`. A scheduler serving GPUs has
//! one registry whose series carry a `gpu` label; the single device's are
//! unlabelled, as they always were.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// A series' labels: `gpu` first when the scheduler serves GPUs, then the
/// metric's own (`reason`, `state`).
pub type Labels = Vec<(&'static str, String)>;

/// What every metric is: (name, help).
const JOBS: (&str, &str) = ("jobs", "Jobs by state");
const REPLANS: (&str, &str) = ("replans", "Re-plans by cause");
const PLANS_PUBLISHED: (&str, &str) = (
    "plans_published",
    "Plan versions published (one per job per re-plan)",
);
const PLANNING_SECONDS: (&str, &str) = ("planning_seconds", "Wall time of one re-plan of all jobs");
const PLANNING_CAPPED: (&str, &str) = (
    "planning_capped",
    "Joint plans whose search stopped at its work bound (or its wall-clock safety net)",
);
const PLANS_WITHHELD: (&str, &str) = (
    "plans_withheld",
    "Plans of a joint plan not published because they would take the plans in force past the budget",
);
const REPORTS: (&str, &str) = ("reports", "Latency reports received");
const STALL_SECONDS: (&str, &str) = (
    "stall_seconds",
    "Reported time ops waited for late prefetches",
);
const PASSIVE_SWAPS: (&str, &str) = ("passive_swaps", "Reported swap-ins no plan event brought");
const LEASES_LAPSED: (&str, &str) = ("leases_lapsed", "Jobs removed because their lease lapsed");
const BUDGET_BYTES: (&str, &str) = ("budget_bytes", "The memory budget");
const SUM_OF_PEAKS_BYTES: (&str, &str) = ("sum_of_peaks_bytes", "Sum of the jobs' planned peaks");
const REPORTED_PEAK_BYTES: (&str, &str) = (
    "reported_peak_bytes",
    "Sum of the jobs' last reported peaks",
);
const QUEUE_LENGTH: (&str, &str) = ("queue_length", "Jobs waiting for admission");
const PUBLISHED_BYTES: (&str, &str) = (
    "published_bytes",
    "What the plans in force hold: their planned peaks, a gated set's aligned peak",
);
const MAX_PUBLISHED_OVER_BUDGET_BYTES: (&str, &str) = (
    "max_published_over_budget_bytes",
    "The largest excess of the plans in force over the budget after any publication",
);
const JOB_TABLE_WAIT_SECONDS: (&str, &str) = (
    "job_table_wait_seconds",
    "Time a handler, the planning task or the lease reaper waited to get at one job in the job table",
);
const JOB_TABLE_WALK_WAIT_SECONDS: (&str, &str) = (
    "job_table_walk_wait_seconds",
    "Time a walk of the whole job table (status, the reaper's scan, the state counts) waited for it",
);

type F64Counter = Counter<f64, std::sync::atomic::AtomicU64>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn planning_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Waits for the job table: 100 ns to about 0.4 s.
pub fn table_wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-7, 4.0, 12))
}

/// Where the job table observes its waits: for one job's entry, and for
/// walks of the whole table.
#[derive(Debug, Clone)]
pub struct TableWaits {
    pub job: Histogram,
    pub walk: Histogram,
}

impl Default for TableWaits {
    fn default() -> TableWaits {
        TableWaits {
            job: table_wait_histogram(),
            walk: table_wait_histogram(),
        }
    }
}

/// One planning domain's metrics (the single device's, or one GPU's):
/// handles, cheap to update from any task. Those of the GPUs of one
/// scheduler are series of one registry ([`NodeMetrics`]), told apart by
/// their `gpu` label.
#[derive(Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// `[("gpu", N)]`, or nothing for the single device.
    base: Labels,
    jobs: Family<Labels, Gauge>,
    replans: Family<Labels, Counter>,
    pub plans_published: Counter,
    pub planning_seconds: Histogram,
    pub planning_capped: Counter,
    pub plans_withheld: Counter,
    pub reports: Counter,
    pub stall_seconds: F64Counter,
    pub passive_swaps: Counter,
    pub leases_lapsed: Counter,
    pub budget_bytes: Gauge,
    pub sum_of_peaks_bytes: Gauge,
    pub reported_peak_bytes: Gauge,
    pub queue_length: Gauge,
    pub published_bytes: Gauge,
    pub max_published_over_budget_bytes: Gauge,
    /// Handed to the job table ([`crate::state::Shared::timing_waits`]).
    pub table_wait_seconds: TableWaits,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    /// The single device's metrics, in a registry of their own, unlabelled.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tensile_scheduler");
        let jobs = Family::<Labels, Gauge>::default();
        let replans = Family::<Labels, Counter>::default();
        registry.register(JOBS.0, JOBS.1, jobs.clone());
        registry.register(REPLANS.0, REPLANS.1, replans.clone());
        fn plain<M: prometheus_client::registry::Metric + Clone>(
            r: &mut Registry,
            (name, help): (&str, &str),
            m: M,
        ) -> M {
            r.register(name, help, m.clone());
            m
        }
        let r = &mut registry;
        let plans_published = plain(r, PLANS_PUBLISHED, Counter::default());
        let planning_seconds = plain(r, PLANNING_SECONDS, planning_histogram());
        let planning_capped = plain(r, PLANNING_CAPPED, Counter::default());
        let plans_withheld = plain(r, PLANS_WITHHELD, Counter::default());
        let reports = plain(r, REPORTS, Counter::default());
        let stall_seconds = plain(r, STALL_SECONDS, F64Counter::default());
        let passive_swaps = plain(r, PASSIVE_SWAPS, Counter::default());
        let leases_lapsed = plain(r, LEASES_LAPSED, Counter::default());
        let budget_bytes = plain(r, BUDGET_BYTES, Gauge::default());
        let sum_of_peaks_bytes = plain(r, SUM_OF_PEAKS_BYTES, Gauge::default());
        let reported_peak_bytes = plain(r, REPORTED_PEAK_BYTES, Gauge::default());
        let queue_length = plain(r, QUEUE_LENGTH, Gauge::default());
        let table_wait_seconds = TableWaits {
            job: plain(r, JOB_TABLE_WAIT_SECONDS, table_wait_histogram()),
            walk: plain(r, JOB_TABLE_WALK_WAIT_SECONDS, table_wait_histogram()),
        };
        let published_bytes = plain(r, PUBLISHED_BYTES, Gauge::default());
        let max_published_over_budget_bytes =
            plain(r, MAX_PUBLISHED_OVER_BUDGET_BYTES, Gauge::default());
        Metrics {
            registry: Arc::new(registry),
            base: Labels::new(),
            jobs,
            replans,
            plans_published,
            planning_seconds,
            planning_capped,
            plans_withheld,
            reports,
            stall_seconds,
            passive_swaps,
            leases_lapsed,
            budget_bytes,
            sum_of_peaks_bytes,
            reported_peak_bytes,
            queue_length,
            published_bytes,
            max_published_over_budget_bytes,
            table_wait_seconds,
        }
    }

    /// The registry these metrics are served from.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// The metrics as OpenMetrics text (of the whole registry: every GPU's
    /// when these are one GPU's).
    pub fn encode(&self) -> String {
        encode(&self.registry)
    }

    fn labels(&self, key: &'static str, value: &str) -> Labels {
        let mut l = self.base.clone();
        l.push((key, value.to_string()));
        l
    }

    /// One more re-plan for `reason`.
    pub fn reason(&self, reason: &str) {
        self.replans
            .get_or_create(&self.labels("reason", reason))
            .inc();
    }

    /// `n` jobs are in `state`.
    pub fn set_jobs(&self, state: &str, n: i64) {
        self.jobs.get_or_create(&self.labels("state", state)).set(n);
    }
}

/// The metrics of a scheduler serving GPUs: one registry, every series
/// labelled with its GPU (`gpu="N"`, the node's index).
#[derive(Debug)]
pub struct NodeMetrics {
    registry: Arc<Registry>,
    jobs: Family<Labels, Gauge>,
    replans: Family<Labels, Counter>,
    counters: [Family<Labels, Counter>; 6],
    gauges: [Family<Labels, Gauge>; 6],
    stall_seconds: Family<Labels, F64Counter>,
    planning_seconds: HistogramFamily,
    table_wait_seconds: [HistogramFamily; 2],
}

impl Default for NodeMetrics {
    fn default() -> NodeMetrics {
        NodeMetrics::new()
    }
}

impl NodeMetrics {
    pub fn new() -> NodeMetrics {
        let mut registry = Registry::with_prefix("tensile_scheduler");
        let jobs = Family::<Labels, Gauge>::default();
        let replans = Family::<Labels, Counter>::default();
        registry.register(JOBS.0, JOBS.1, jobs.clone());
        registry.register(REPLANS.0, REPLANS.1, replans.clone());
        let counters: [Family<Labels, Counter>; 6] = Default::default();
        for (f, (name, help)) in counters.iter().zip([
            PLANS_PUBLISHED,
            PLANNING_CAPPED,
            REPORTS,
            PASSIVE_SWAPS,
            LEASES_LAPSED,
            PLANS_WITHHELD,
        ]) {
            registry.register(name, help, f.clone());
        }
        let gauges: [Family<Labels, Gauge>; 6] = Default::default();
        for (f, (name, help)) in gauges.iter().zip([
            BUDGET_BYTES,
            SUM_OF_PEAKS_BYTES,
            REPORTED_PEAK_BYTES,
            QUEUE_LENGTH,
            PUBLISHED_BYTES,
            MAX_PUBLISHED_OVER_BUDGET_BYTES,
        ]) {
            registry.register(name, help, f.clone());
        }
        let stall_seconds = Family::<Labels, F64Counter>::default();
        registry.register(STALL_SECONDS.0, STALL_SECONDS.1, stall_seconds.clone());
        let planning_seconds = Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(
            planning_histogram,
        );
        registry.register(
            PLANNING_SECONDS.0,
            PLANNING_SECONDS.1,
            planning_seconds.clone(),
        );
        let table_wait_seconds =
            [JOB_TABLE_WAIT_SECONDS, JOB_TABLE_WALK_WAIT_SECONDS].map(|(name, help)| {
                let f = HistogramFamily::new_with_constructor(table_wait_histogram);
                registry.register(name, help, f.clone());
                f
            });
        NodeMetrics {
            registry: Arc::new(registry),
            jobs,
            replans,
            counters,
            gauges,
            stall_seconds,
            planning_seconds,
            table_wait_seconds,
        }
    }

    /// The handles of GPU `index`'s series (created at 0 now, so that
    /// every GPU shows from the start).
    pub fn gpu(&self, index: u32) -> Metrics {
        let base: Labels = vec![("gpu", index.to_string())];
        let counter = |i: usize| self.counters[i].get_or_create(&base).clone();
        let gauge = |i: usize| self.gauges[i].get_or_create(&base).clone();
        Metrics {
            registry: self.registry.clone(),
            jobs: self.jobs.clone(),
            replans: self.replans.clone(),
            plans_published: counter(0),
            planning_capped: counter(1),
            reports: counter(2),
            passive_swaps: counter(3),
            leases_lapsed: counter(4),
            plans_withheld: counter(5),
            budget_bytes: gauge(0),
            sum_of_peaks_bytes: gauge(1),
            reported_peak_bytes: gauge(2),
            queue_length: gauge(3),
            published_bytes: gauge(4),
            max_published_over_budget_bytes: gauge(5),
            stall_seconds: self.stall_seconds.get_or_create(&base).clone(),
            planning_seconds: self.planning_seconds.get_or_create(&base).clone(),
            table_wait_seconds: TableWaits {
                job: self.table_wait_seconds[0].get_or_create(&base).clone(),
                walk: self.table_wait_seconds[1].get_or_create(&base).clone(),
            },
            base,
        }
    }

    /// The registry every GPU's series are in.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }
}

/// A registry as OpenMetrics text.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// Serves `/metrics` on `addr` until `cancel`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let r = registry.clone();
            async move {
                (
                    [(
                        "content-type",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    encode(&r),
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
