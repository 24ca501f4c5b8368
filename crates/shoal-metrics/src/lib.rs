//! `shoal-metrics`: Prometheus metrics for Shoal's broker, name server and client, on the
//! [`prometheus_client`] crate (re-exported, so users need not depend on it themselves).
//!
//! - [`Metrics`]: a process's registry behind a handle; registering a metric from any module
//!   is one line (`let c = metrics.counter("shoal_broker_x", "what it counts");`) and returns
//!   the metric, which the module keeps and updates without touching the registry again.
//! - [`LatencyHistogram`]: a histogram whose `observe` is two relaxed atomic adds.
//! - [`Keyed`]: per-key metric handles (per topic, per group) found by `&str` without
//!   allocating, for modules that cannot keep a pre-resolved handle.
//! - [`RequestMetrics`]: request latency by request code and response code, with a bounded
//!   label set (unknown codes share one series).
//! - [`encode_family`]: helpers for collectors that compute their values at scrape time.
//!
//! Naming: counters are registered without the `_total` suffix (the encoder adds it);
//! durations are in seconds and their names end in `_seconds`.

#![warn(missing_docs)]

pub mod histogram;
pub mod keyed;
pub mod request;

pub use histogram::{LatencyHistogram, LATENCY_BUCKETS, SLOW_BUCKETS};
pub use keyed::Keyed;
pub use prometheus_client;
pub use request::RequestMetrics;

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};
use std::hash::Hash;

/// The `Content-Type` of [`Metrics::encode_text`] (Prometheus text format 0.0.4).
pub const TEXT_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
/// The `Content-Type` of [`Metrics::encode_openmetrics`].
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A registry of metrics. Share it as `Arc<Metrics>`; registration takes a short lock,
/// updating a registered metric takes none.
#[derive(Debug, Default)]
pub struct Metrics {
    registry: Mutex<Registry>,
}

/// Label sets usable in families: `#[derive(Clone, Debug, Hash, PartialEq, Eq,
/// EncodeLabelSet)]` structs, or `Vec<(String, String)>`.
pub trait Labels:
    Clone + Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static
{
}
impl<T: Clone + Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static> Labels for T {}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers any `prometheus_client` metric (or a clone of one the caller keeps).
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry.lock().register(name, help, metric);
    }

    /// Registers a collector, asked for its values at every scrape.
    pub fn collector(&self, collector: impl Collector) {
        self.registry.lock().register_collector(Box::new(collector));
    }

    /// A new counter (`name` without `_total`).
    pub fn counter(&self, name: &str, help: &str) -> Counter {
        let c = Counter::default();
        self.register(name, help, c.clone());
        c
    }

    /// A new gauge.
    pub fn gauge(&self, name: &str, help: &str) -> Gauge {
        let g = Gauge::default();
        self.register(name, help, g.clone());
        g
    }

    /// A new latency histogram (seconds, 50 µs to 10 s).
    pub fn histogram(&self, name: &str, help: &str) -> LatencyHistogram {
        let h = LatencyHistogram::default();
        self.register(name, help, h.clone());
        h
    }

    /// A new histogram of slow durations (seconds, 10 ms to 5 min), e.g. convergence times.
    pub fn slow_histogram(&self, name: &str, help: &str) -> LatencyHistogram {
        let h = LatencyHistogram::with_buckets(SLOW_BUCKETS);
        self.register(name, help, h.clone());
        h
    }

    /// A new counter family; `family.get_or_create(&labels).inc()`.
    pub fn counter_family<L: Labels>(&self, name: &str, help: &str) -> Family<L, Counter> {
        let f = Family::<L, Counter>::default();
        self.register(name, help, f.clone());
        f
    }

    /// A new gauge family.
    pub fn gauge_family<L: Labels>(&self, name: &str, help: &str) -> Family<L, Gauge> {
        let f = Family::<L, Gauge>::default();
        self.register(name, help, f.clone());
        f
    }

    /// A new latency histogram family.
    pub fn histogram_family<L: Labels>(
        &self,
        name: &str,
        help: &str,
    ) -> Family<L, LatencyHistogram> {
        let f = Family::<L, LatencyHistogram>::default();
        self.register(name, help, f.clone());
        f
    }

    /// A gauge whose value `f` computes at each scrape (queue sizes, table lengths).
    pub fn gauge_fn(
        &self,
        name: &'static str,
        help: &'static str,
        f: impl Fn() -> i64 + Send + Sync + 'static,
    ) {
        self.collector(FnGauge {
            name,
            help,
            f: Box::new(f),
        });
    }

    /// Everything registered, in the Prometheus text format 0.0.4 ([`TEXT_CONTENT_TYPE`]).
    pub fn encode_text(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ =
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry.lock());
        out
    }

    /// Everything registered, in the OpenMetrics text format, without the closing `# EOF`
    /// line (so several registries can be concatenated; see [`openmetrics_eof`]).
    pub fn encode_openmetrics(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, &self.registry.lock());
        out
    }
}

/// Ends an OpenMetrics exposition (appends `# EOF`).
pub fn openmetrics_eof(out: &mut String) {
    let _ = prometheus_client::encoding::text::encode_eof(out);
}

struct FnGauge {
    name: &'static str,
    help: &'static str,
    f: Box<dyn Fn() -> i64 + Send + Sync>,
}

impl std::fmt::Debug for FnGauge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnGauge").field("name", &self.name).finish()
    }
}

impl Collector for FnGauge {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let value = (self.f)();
        let e = encoder.encode_descriptor(self.name, self.help, None, MetricType::Gauge)?;
        prometheus_client::metrics::gauge::ConstGauge::new(value).encode(e)
    }
}

/// Encodes one metric family from rows computed at scrape time (for [`Collector`]s): a
/// descriptor, then each `(labels, metric)` row. `M` is e.g. `ConstGauge`, `ConstCounter` or a
/// [`LatencyHistogram`].
pub fn encode_family<'a, L, M>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (&'a L, &'a M)>,
) -> Result<(), std::fmt::Error>
where
    L: EncodeLabelSet + 'a,
    M: EncodeMetric + TypedMetric + 'a,
{
    let mut rows = rows.into_iter().peekable();
    if rows.peek().is_none() {
        return Ok(());
    }
    let mut me: MetricEncoder<'_> = encoder.encode_descriptor(name, help, None, M::TYPE)?;
    for (labels, metric) in rows {
        metric.encode(me.encode_family(labels)?)?;
    }
    Ok(())
}

/// [`encode_family`] for gauges given as plain values.
pub fn encode_gauges<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, i64)>,
) -> Result<(), std::fmt::Error> {
    let rows: Vec<(L, prometheus_client::metrics::gauge::ConstGauge<i64>)> = rows
        .into_iter()
        .map(|(l, v)| (l, prometheus_client::metrics::gauge::ConstGauge::new(v)))
        .collect();
    encode_family(encoder, name, help, rows.iter().map(|(l, g)| (l, g)))
}

/// [`encode_family`] for counters given as plain values.
pub fn encode_counters<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, u64)>,
) -> Result<(), std::fmt::Error> {
    let rows: Vec<(L, prometheus_client::metrics::counter::ConstCounter<u64>)> = rows
        .into_iter()
        .map(|(l, v)| (l, prometheus_client::metrics::counter::ConstCounter::new(v)))
        .collect();
    encode_family(encoder, name, help, rows.iter().map(|(l, g)| (l, g)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn registered_metrics_are_encoded() {
        let m = Metrics::new();
        let c = m.counter("shoal_test_things", "Things counted.");
        c.inc_by(3);
        let g = m.gauge("shoal_test_level", "A level.");
        g.set(-2);
        let h = m.histogram("shoal_test_latency_seconds", "A latency.");
        h.observe(Duration::from_millis(3));
        m.gauge_fn("shoal_test_computed", "Computed at scrape.", || 42);
        let f = m.counter_family::<Vec<(String, String)>>("shoal_test_by_topic", "Per topic.");
        f.get_or_create(&vec![("topic".into(), "T".into())]).inc();
        let text = m.encode_text();
        assert!(text.contains("shoal_test_things_total 3\n"), "{text}");
        assert!(text.contains("shoal_test_level -2\n"), "{text}");
        assert!(
            text.contains("shoal_test_latency_seconds_bucket{le=\"0.005\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("shoal_test_latency_seconds_count 1\n"),
            "{text}"
        );
        assert!(text.contains("shoal_test_computed 42\n"), "{text}");
        assert!(
            text.contains("shoal_test_by_topic_total{topic=\"T\"} 1\n"),
            "{text}"
        );
        let om = m.encode_openmetrics();
        assert!(om.contains("# TYPE shoal_test_things counter"), "{om}");
    }

    #[derive(Debug)]
    struct Rows;
    impl Collector for Rows {
        fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
            encode_gauges(
                &mut e,
                "shoal_test_lag",
                "Lag.",
                [([("group", "g"), ("queue", "1")], 7)],
            )?;
            encode_counters(
                &mut e,
                "shoal_test_empty",
                "Nothing.",
                Vec::<([(&str, &str); 0], u64)>::new(),
            )
        }
    }

    #[test]
    fn collectors_encode_rows() {
        let m = Metrics::new();
        m.collector(Rows);
        let text = m.encode_text();
        assert!(
            text.contains("shoal_test_lag{group=\"g\",queue=\"1\"} 7\n"),
            "{text}"
        );
        assert!(!text.contains("shoal_test_empty"), "{text}");
    }
}
