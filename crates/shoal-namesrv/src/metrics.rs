//! The name server's Prometheus metrics (described in `docs/operations.md`).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use shoal_metrics::{encode_counters, encode_gauges, prometheus_client, Metrics, RequestMetrics};
use std::sync::{Arc, Weak};

/// The name server's registry and the metrics updated per request.
#[derive(Debug)]
pub struct NamesrvMetrics {
    /// The registry (served at `/metrics`); register new metrics here.
    pub registry: Arc<Metrics>,
    /// Requests by request and response code, with latency.
    pub requests: RequestMetrics,
    /// Open connections (brokers and clients).
    pub connections: Gauge,
    /// NOTIFY_ROUTE_CHANGED notices sent to route watchers.
    pub route_notices: Counter,
}

impl Default for NamesrvMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl NamesrvMetrics {
    /// A fresh registry with the name server's metrics registered.
    pub fn new() -> Self {
        let registry = Arc::new(Metrics::new());
        let requests = RequestMetrics::new(
            "shoal_namesrv_request_seconds",
            "Requests served by the name server, by request code and response code, and how long they took.",
        );
        registry.collector(requests.clone());
        Self {
            connections: registry.gauge(
                "shoal_namesrv_connections",
                "Connections open now (brokers and clients).",
            ),
            route_notices: registry.counter(
                "shoal_namesrv_route_notices",
                "Route change notices (NOTIFY_ROUTE_CHANGED) sent to Shoal clients watching the changed topics.",
            ),
            requests,
            registry,
        }
    }
}

/// The route table's size at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteStats {
    /// Broker names registered.
    pub brokers: usize,
    /// Topics in the route table.
    pub topics: usize,
    /// Route watches held (connection, topic pairs).
    pub watches: usize,
    /// Connections watching at least one topic.
    pub watching_connections: usize,
    /// Watches refused by `max_route_watches` so far.
    pub watch_refused_total: u64,
    /// Watches refused by `max_route_watches_per_connection` so far.
    pub watch_refused_per_connection: u64,
    /// Places of departed broker groups kept for Kafka's numbering (at most
    /// [`crate::route::MAX_DEPARTED_SLOTS`]).
    pub departed_slots: usize,
}

/// Where [`NamesrvCollector`] reads the route table's size at scrape time (the name server's
/// processor, [`NamesrvProcessor`](crate::NamesrvProcessor)).
pub trait RouteStatsSource: Send + Sync + std::fmt::Debug {
    /// The route table's size now.
    fn route_stats(&self) -> RouteStats;
}

/// Reads the route table's size at scrape time.
#[derive(Debug)]
pub struct NamesrvCollector {
    source: Weak<dyn RouteStatsSource>,
    net: Option<Arc<shoal_net::NetStats>>,
}

impl NamesrvCollector {
    /// A collector over a name server's processor (held weakly).
    pub fn new<S: RouteStatsSource + 'static>(p: &Arc<S>) -> Self {
        let source: Weak<S> = Arc::downgrade(p);
        Self { source, net: None }
    }

    /// Also exports the listener's TLS counters.
    #[must_use]
    pub fn with_net(mut self, stats: Arc<shoal_net::NetStats>) -> Self {
        self.net = Some(stats);
        self
    }
}

impl Collector for NamesrvCollector {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(source) = self.source.upgrade() else {
            return Ok(());
        };
        let RouteStats {
            brokers,
            topics,
            watches,
            watching_connections,
            watch_refused_total,
            watch_refused_per_connection,
            departed_slots,
        } = source.route_stats();
        let none: [(&str, &str); 0] = [];
        encode_gauges(
            &mut e,
            "shoal_namesrv_brokers",
            "Broker names registered now.",
            [(none, brokers as i64)],
        )?;
        encode_gauges(
            &mut e,
            "shoal_namesrv_topics",
            "Topics in the route table now.",
            [(none, topics as i64)],
        )?;
        encode_gauges(
            &mut e,
            "shoal_namesrv_route_watches",
            "Route watches held now: (connection, topic) pairs a Shoal client asked to be told about (bounded by max_route_watches).",
            [(none, watches as i64)],
        )?;
        encode_gauges(
            &mut e,
            "shoal_namesrv_route_watching_connections",
            "Connections watching at least one topic's route now.",
            [(none, watching_connections as i64)],
        )?;
        encode_gauges(
            &mut e,
            "shoal_namesrv_kafka_departed_slots",
            "(topic, broker group) places kept for broker groups that left while serving the topic, so Kafka's partition numbering keeps them (at most 100000).",
            [(none, departed_slots as i64)],
        )?;
        encode_counters(
            &mut e,
            "shoal_namesrv_route_watch_refused",
            "Route watches refused by a limit (the config key: max_route_watches or max_route_watches_per_connection); the route is answered and the client keeps its periodic poll.",
            [
                ([("limit", "max_route_watches")], watch_refused_total),
                (
                    [("limit", "max_route_watches_per_connection")],
                    watch_refused_per_connection,
                ),
            ],
        )?;
        if let Some(n) = self.net.as_ref().map(|n| n.snapshot()) {
            let by_result = |rows: &[(&'static str, u64)]| {
                rows.iter()
                    .map(|&(result, v)| ([("result", result)], v))
                    .collect::<Vec<_>>()
            };
            encode_counters(
                &mut e,
                "shoal_namesrv_net_limit_hits",
                "Transport limits of the listener hit, by limit (the [net] config key of `shoal namesrv --config`) and action: refused (connection closed at accept), closed (connection closed), paused (the name server stopped reading that socket for a while), answer_replaced (an answer over the frame limit sent as SYSTEM_ERROR).",
                n.limit_hits()
                    .map(|(limit, action, v)| ([("limit", limit), ("action", action)], v)),
            )?;
            encode_counters(
                &mut e,
                "shoal_namesrv_tls_handshakes",
                "TLS handshakes on the listener, by result: ok, failed (closed), timeout (closed).",
                by_result(&[
                    ("ok", n.tls_handshakes),
                    ("failed", n.tls_handshake_failures),
                    ("timeout", n.tls_handshake_timeouts),
                ]),
            )?;
            encode_counters(
                &mut e,
                "shoal_namesrv_plaintext_connections",
                "Plaintext connections to a TLS listener: accepted (permissive mode) or refused (enforcing mode, closed).",
                by_result(&[
                    ("accepted", n.plaintext_accepted),
                    ("refused", n.plaintext_refused),
                ]),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NamesrvConfig, NamesrvProcessor};

    #[test]
    fn route_table_sizes_are_exported() {
        let p = Arc::new(NamesrvProcessor::new(&NamesrvConfig::default()).unwrap());
        p.metrics().registry.collector(NamesrvCollector::new(&p));
        let text = p.metrics().registry.encode_text();
        assert!(text.contains("shoal_namesrv_brokers 0\n"), "{text}");
        assert!(text.contains("shoal_namesrv_topics 0\n"), "{text}");
        assert!(text.contains("shoal_namesrv_connections 0\n"), "{text}");
        assert!(text.contains("shoal_namesrv_route_watches 0\n"), "{text}");
        assert!(
            text.contains("shoal_namesrv_kafka_departed_slots 0\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "shoal_namesrv_route_watch_refused_total{limit=\"max_route_watches\"} 0\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("shoal_namesrv_route_notices_total 0\n"),
            "{text}"
        );
    }
}
