//! Prometheus metrics (prometheus-client, OpenMetrics text), served over
//! HTTP on a loopback address at `/metrics`. A scheduler serving GPUs has
//! one registry whose series carry a `gpu` label; the single device's are
//! unlabelled, as they always were.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::{MetricType, TypedMetric};
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
const PLANS_UNCHANGED: (&str, &str) = (
    "plans_unchanged",
    "Plans of a joint plan not sent because the job runs the same one (the same copies, gate and peak)",
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

/// One metric's series, keyed by their labels: a [`Family`] whose series
/// without labels (the single device's) is written bare (`name 3`, as a
/// plain metric is, not `name{} 3`). A registry holds either the single
/// device's series or GPUs' ones, never both.
#[derive(Debug, Clone)]
struct Series<M>(Family<Labels, M, fn() -> M>);

impl<M: EncodeMetric + TypedMetric + Clone + std::fmt::Debug + Send + Sync + 'static> Series<M> {
    /// A new metric `name` in `registry`, its series made by `make`.
    fn register(registry: &mut Registry, (name, help): (&str, &str), make: fn() -> M) -> Self {
        let s = Series(Family::new_with_constructor(make));
        registry.register(name, help, s.clone());
        s
    }

    /// The series labelled `labels`, created (at zero) if new.
    fn of(&self, labels: &Labels) -> M {
        self.0.get_or_create_owned(labels)
    }
}

impl<M: TypedMetric> TypedMetric for Series<M> {
    const TYPE: MetricType = M::TYPE;
}

impl<M: EncodeMetric + TypedMetric> EncodeMetric for Series<M> {
    fn encode(&self, encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        match self.0.get(&Labels::new()) {
            Some(bare) => bare.encode(encoder),
            None => self.0.encode(encoder),
        }
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Every metric of a scheduler, registered once; each planning domain
/// takes its series from them ([`MetricsRegistry::domain`]).
#[derive(Debug)]
struct Families {
    jobs: Series<Gauge>,
    replans: Series<Counter>,
    plans_published: Series<Counter>,
    planning_seconds: Series<Histogram>,
    planning_capped: Series<Counter>,
    plans_withheld: Series<Counter>,
    plans_unchanged: Series<Counter>,
    reports: Series<Counter>,
    stall_seconds: Series<F64Counter>,
    passive_swaps: Series<Counter>,
    leases_lapsed: Series<Counter>,
    budget_bytes: Series<Gauge>,
    sum_of_peaks_bytes: Series<Gauge>,
    reported_peak_bytes: Series<Gauge>,
    queue_length: Series<Gauge>,
    published_bytes: Series<Gauge>,
    max_published_over_budget_bytes: Series<Gauge>,
    table_wait_job: Series<Histogram>,
    table_wait_walk: Series<Histogram>,
}

/// The metrics of one scheduler: one registry (prefix
/// `tensile_scheduler`), served at `/metrics`, with a series per planning
/// domain. The single device's series are unlabelled; a scheduler serving
/// GPUs labels each GPU's `gpu="N"` (the node's index).
#[derive(Debug, Clone)]
pub struct MetricsRegistry {
    registry: Arc<Registry>,
    families: Arc<Families>,
}

impl Default for MetricsRegistry {
    fn default() -> MetricsRegistry {
        MetricsRegistry::new()
    }
}

impl MetricsRegistry {
    pub fn new() -> MetricsRegistry {
        let mut registry = Registry::with_prefix("tensile_scheduler");
        let r = &mut registry;
        let families = Families {
            jobs: Series::register(r, JOBS, Gauge::default),
            replans: Series::register(r, REPLANS, Counter::default),
            plans_published: Series::register(r, PLANS_PUBLISHED, Counter::default),
            planning_seconds: Series::register(r, PLANNING_SECONDS, planning_histogram),
            planning_capped: Series::register(r, PLANNING_CAPPED, Counter::default),
            plans_withheld: Series::register(r, PLANS_WITHHELD, Counter::default),
            plans_unchanged: Series::register(r, PLANS_UNCHANGED, Counter::default),
            reports: Series::register(r, REPORTS, Counter::default),
            stall_seconds: Series::register(r, STALL_SECONDS, F64Counter::default),
            passive_swaps: Series::register(r, PASSIVE_SWAPS, Counter::default),
            leases_lapsed: Series::register(r, LEASES_LAPSED, Counter::default),
            budget_bytes: Series::register(r, BUDGET_BYTES, Gauge::default),
            sum_of_peaks_bytes: Series::register(r, SUM_OF_PEAKS_BYTES, Gauge::default),
            reported_peak_bytes: Series::register(r, REPORTED_PEAK_BYTES, Gauge::default),
            queue_length: Series::register(r, QUEUE_LENGTH, Gauge::default),
            table_wait_job: Series::register(r, JOB_TABLE_WAIT_SECONDS, table_wait_histogram),
            table_wait_walk: Series::register(r, JOB_TABLE_WALK_WAIT_SECONDS, table_wait_histogram),
            published_bytes: Series::register(r, PUBLISHED_BYTES, Gauge::default),
            max_published_over_budget_bytes: Series::register(
                r,
                MAX_PUBLISHED_OVER_BUDGET_BYTES,
                Gauge::default,
            ),
        };
        registry.register_collector(Box::new(Heap));
        MetricsRegistry {
            registry: Arc::new(registry),
            families: Arc::new(families),
        }
    }

    /// The handles of a planning domain's series, created at zero now so
    /// that each shows from the start: `None`, the single device
    /// (unlabelled); `Some(index)`, GPU `index` of the node (`gpu` label).
    pub fn domain(&self, gpu: Option<u32>) -> Metrics {
        let base: Labels = gpu.map(|i| ("gpu", i.to_string())).into_iter().collect();
        let f = &self.families;
        Metrics {
            registry: self.registry.clone(),
            jobs: f.jobs.clone(),
            replans: f.replans.clone(),
            plans_published: f.plans_published.of(&base),
            planning_seconds: f.planning_seconds.of(&base),
            planning_capped: f.planning_capped.of(&base),
            plans_withheld: f.plans_withheld.of(&base),
            plans_unchanged: f.plans_unchanged.of(&base),
            reports: f.reports.of(&base),
            stall_seconds: f.stall_seconds.of(&base),
            passive_swaps: f.passive_swaps.of(&base),
            leases_lapsed: f.leases_lapsed.of(&base),
            budget_bytes: f.budget_bytes.of(&base),
            sum_of_peaks_bytes: f.sum_of_peaks_bytes.of(&base),
            reported_peak_bytes: f.reported_peak_bytes.of(&base),
            queue_length: f.queue_length.of(&base),
            published_bytes: f.published_bytes.of(&base),
            max_published_over_budget_bytes: f.max_published_over_budget_bytes.of(&base),
            table_wait_seconds: TableWaits {
                job: f.table_wait_job.of(&base),
                walk: f.table_wait_walk.of(&base),
            },
            base,
        }
    }

    /// The registry every domain's series are in.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// The metrics as OpenMetrics text.
    pub fn encode(&self) -> String {
        encode(&self.registry)
    }
}

/// One planning domain's metrics (the single device's, or one GPU's):
/// handles into its scheduler's [`MetricsRegistry`], cheap to update from
/// any task.
#[derive(Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// `[("gpu", N)]`, or nothing for the single device.
    base: Labels,
    jobs: Series<Gauge>,
    replans: Series<Counter>,
    pub plans_published: Counter,
    pub planning_seconds: Histogram,
    pub planning_capped: Counter,
    pub plans_withheld: Counter,
    pub plans_unchanged: Counter,
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
    /// The single device's metrics, in a registry of their own.
    pub fn new() -> Metrics {
        MetricsRegistry::new().domain(None)
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
        self.replans.of(&self.labels("reason", reason)).inc();
    }

    /// `n` jobs are in `state`.
    pub fn set_jobs(&self, state: &str, n: i64) {
        self.jobs.of(&self.labels("state", state)).set(n);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The sample lines of an OpenMetrics page: (series, value).
    fn samples(text: &str) -> Vec<(&str, &str)> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .collect()
    }

    /// A series' metric name, without its labels.
    fn name(series: &str) -> &str {
        series.split('{').next().unwrap_or(series)
    }

    #[test]
    fn the_single_device_is_unlabelled_and_gpus_labelled_by_one_registry() {
        let single = MetricsRegistry::new();
        let device = single.domain(None);
        device.reports.inc();
        device.budget_bytes.set(7);
        device.reason("budget");
        let node = MetricsRegistry::new();
        let (gpu0, gpu3) = (node.domain(Some(0)), node.domain(Some(3)));
        gpu3.reports.inc();
        gpu3.budget_bytes.set(9);
        gpu0.reason("budget");

        let text = single.encode();
        assert_eq!(text, device.encode());
        let lines = samples(&text);
        assert!(
            lines.contains(&("tensile_scheduler_reports_total", "1")),
            "{text}"
        );
        assert!(
            lines.contains(&("tensile_scheduler_budget_bytes", "7")),
            "{text}"
        );
        assert!(
            lines.contains(&("tensile_scheduler_replans_total{reason=\"budget\"}", "1")),
            "{text}"
        );
        assert!(
            lines
                .iter()
                .all(|(s, _)| !s.contains("gpu=") && !s.contains("{}")),
            "{text}"
        );

        let text = node.encode();
        let lines = samples(&text);
        for want in [
            ("tensile_scheduler_reports_total{gpu=\"3\"}", "1"),
            ("tensile_scheduler_reports_total{gpu=\"0\"}", "0"),
            ("tensile_scheduler_budget_bytes{gpu=\"3\"}", "9"),
            (
                "tensile_scheduler_replans_total{gpu=\"0\",reason=\"budget\"}",
                "1",
            ),
        ] {
            assert!(lines.contains(&want), "no {want:?} in\n{text}");
        }
        // Every series but the heap's, which is the process's.
        assert!(
            lines
                .iter()
                .all(|(s, _)| s.contains("gpu=\"") || s.starts_with("tensile_scheduler_heap_")),
            "{text}"
        );
        // The same metrics either way, each one family.
        let names = |t: &str| {
            let mut n: Vec<String> = samples(t)
                .iter()
                .map(|(s, _)| name(s).to_string())
                .collect();
            n.dedup();
            n.sort();
            n.dedup();
            n
        };
        assert_eq!(names(&single.encode()), names(&text));
        assert_eq!(
            text.matches("# TYPE tensile_scheduler_reports counter")
                .count(),
            1
        );
    }
}

/// The scheduler's heap as jemalloc (the `tensile-scheduler` binary's
/// allocator) counts it, read at each scrape: what the scheduler's data
/// holds (`heap_allocated_bytes`) and the memory the allocator keeps for
/// it (`heap_resident_bytes`, with its free pages not yet returned). In a
/// program that allocates with another allocator both stay near zero.
#[derive(Debug)]
struct Heap;

impl prometheus_client::collector::Collector for Heap {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::gauge::ConstGauge;
        // The statistics are a snapshot taken when the epoch advances; an
        // error leaves them out of this scrape.
        if tikv_jemalloc_ctl::epoch::advance().is_err() {
            return Ok(());
        }
        let figures = [
            (
                "heap_allocated_bytes",
                "Bytes the scheduler's data holds on its heap (jemalloc stats.allocated)",
                tikv_jemalloc_ctl::stats::allocated::read(),
            ),
            (
                "heap_resident_bytes",
                "Bytes of memory the heap's allocator holds, its free pages not yet returned included (jemalloc stats.resident)",
                tikv_jemalloc_ctl::stats::resident::read(),
            ),
        ];
        for (name, help, value) in figures {
            let Ok(value) = value else { continue };
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}
