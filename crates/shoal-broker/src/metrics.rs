//! The broker's Prometheus metrics (every one is described in `docs/operations.md`).
//!
//! [`BrokerMetrics`] owns the broker's registry ([`BrokerMetrics::registry`], served at
//! `/metrics` by the `shoal` binary) and the metrics updated on the request path. Values that
//! already live elsewhere (offsets, lag, owners, held pulls, the commit log's size, free disk)
//! are read at scrape time by the broker's collector (`collector.rs`), so the hot path does
//! not pay for them.
//!
//! Adding a metric from another module is one line, kept as a field or a local handle:
//!
//! ```
//! # let metrics = shoal_broker::BrokerMetrics::new();
//! let hits = metrics.registry.counter("shoal_broker_my_things", "Things that happened.");
//! hits.inc();
//! let limit = metrics.limit("max_my_things"); // shoal_broker_limit_hits_total{limit="max_my_things"}
//! limit.inc();
//! ```

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use shoal_metrics::{prometheus_client, Keyed, LatencyHistogram};
use shoal_metrics::{Metrics, RequestMetrics};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Messages and bytes in and out of one topic.
#[derive(Debug, Default)]
pub struct TopicTraffic {
    /// Messages stored by sends.
    pub messages_in: AtomicU64,
    /// Body bytes stored by sends.
    pub bytes_in: AtomicU64,
    /// Messages returned by pulls.
    pub messages_out: AtomicU64,
    /// Stored-record bytes returned by pulls.
    pub bytes_out: AtomicU64,
}

impl TopicTraffic {
    /// Counts a send of `messages` messages with `bytes` body bytes.
    #[inline]
    pub fn sent(&self, messages: u64, bytes: u64) {
        self.messages_in.fetch_add(messages, Ordering::Relaxed);
        self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts a pull answer of `messages` messages and `bytes` bytes.
    #[inline]
    pub fn pulled(&self, messages: u64, bytes: u64) {
        self.messages_out.fetch_add(messages, Ordering::Relaxed);
        self.bytes_out.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Label set with one fixed label name.
type OneLabel = [(&'static str, String); 1];

/// The broker's metrics. See the module documentation.
#[derive(Debug)]
pub struct BrokerMetrics {
    /// The registry every broker metric is in; register new ones here.
    pub registry: Arc<Metrics>,
    /// Requests by request and response code, with latency.
    pub requests: RequestMetrics,
    /// Per topic traffic (keep the handle where the topic is resolved).
    pub topics: Keyed<TopicTraffic>,
    /// Open client connections.
    pub connections: Gauge,
    /// Client connections accepted since start.
    pub connections_opened: Counter,
    /// Time to store a send (write, and fsync under sync flush), measured in the store call.
    pub store_append: LatencyHistogram,
    /// Rebalances the broker observed, by group and cause.
    pub rebalances: Family<[(&'static str, String); 2], Counter>,
    /// Time from a membership change to a settled assignment, by group.
    pub rebalance_convergence: Family<OneLabel, LatencyHistogram>,
    limits: Family<[(&'static str, &'static str); 1], Counter>,
}

impl Default for BrokerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl BrokerMetrics {
    /// A fresh registry with the broker's metrics registered.
    pub fn new() -> Self {
        let registry = Arc::new(Metrics::new());
        let requests = RequestMetrics::new(
            "shoal_broker_request_seconds",
            "Requests served by the broker, by request code and response code (DEFERRED: answered later, e.g. a held pull), and how long the handler took.",
        );
        registry.collector(requests.clone());
        Self {
            requests,
            topics: Keyed::default(),
            connections: registry.gauge(
                "shoal_broker_connections",
                "Client connections open now.",
            ),
            connections_opened: registry.counter(
                "shoal_broker_connections_opened",
                "Client connections accepted since the broker started.",
            ),
            store_append: registry.histogram(
                "shoal_broker_store_append_seconds",
                "Time to append a send to the store (the write, and the fsync under sync flush).",
            ),
            rebalances: registry.counter_family(
                "shoal_broker_rebalances",
                "Rebalances observed by the broker, by group and cause (member_joined, member_left, member_expired, subscription_changed, queues_changed, owner_changed).",
            ),
            rebalance_convergence: registry.histogram_family_slow(
                "shoal_broker_rebalance_convergence_seconds",
                "Time from a rebalance's cause to the last queue hand-over it needed, by group.",
            ),
            limits: registry.counter_family(
                "shoal_broker_limit_hits",
                "Requests refused or cut because a configured limit was reached, by limit (the config key).",
            ),
            registry,
        }
    }

    /// The counter of refusals by the limit named `config_key` (one series per limit).
    pub fn limit(&self, config_key: &'static str) -> Counter {
        self.limits.get_or_create(&[("limit", config_key)]).clone()
    }

    /// The traffic counters of `topic` (created on first use).
    pub fn topic(&self, topic: &str) -> Arc<TopicTraffic> {
        self.topics.get(topic)
    }
}

/// Histogram families with slow buckets.
trait SlowFamily {
    fn histogram_family_slow(&self, name: &str, help: &str) -> Family<OneLabel, LatencyHistogram>;
}

impl SlowFamily for Metrics {
    fn histogram_family_slow(&self, name: &str, help: &str) -> Family<OneLabel, LatencyHistogram> {
        let f: Family<OneLabel, LatencyHistogram> = Family::new_with_constructor(|| {
            LatencyHistogram::with_buckets(shoal_metrics::SLOW_BUCKETS)
        });
        self.register(name, help, f.clone());
        f
    }
}

/// Counters exported by GET_BROKER_RUNTIME_INFO and the metrics endpoint (registered in
/// [`BrokerMetrics::registry`]; `inc()` / `inc_by(n)` / `get()`).
#[derive(Debug)]
pub(crate) struct Counters {
    /// Messages stored by sends.
    pub(crate) msgs_put: Counter,
    /// Messages returned by pulls.
    pub(crate) msgs_got: Counter,
    /// Pulls held by long polling.
    pub(crate) pulls_held: Counter,
    /// NOTIFY_CONSUMER_IDS_CHANGED sent.
    pub(crate) notifications_sent: Counter,
    /// Sends refused with SYSTEM_BUSY (`max_inflight_sends`).
    pub(crate) sends_rejected_busy: Counter,
    /// Coordinated members removed (left, expired, fenced, replaced).
    pub(crate) coordinator_members_removed: Counter,
    /// GROUP_ASSIGNMENT_CHANGED notices sent.
    pub(crate) coordinator_notices_sent: Counter,
    /// Pulls, commits and lock requests refused for a stale member epoch.
    pub(crate) coordinator_fenced: Counter,
    /// Puts waiting for the store now (exported as `shoal_broker_sends_waiting_for_store`).
    pub(crate) inflight_puts: std::sync::atomic::AtomicUsize,
    /// Pull answers cut by `max_pull_batch_bytes` / `max_pull_batch_messages`.
    pub(crate) pulls_capped: AtomicU64,
    /// Heartbeats refused (too large, too many groups or subscriptions).
    pub(crate) heartbeats_refused: AtomicU64,
    /// Client sends to system topics refused.
    pub(crate) system_topic_sends_refused: AtomicU64,
    /// Requests refused for bad queue ids or offsets.
    pub(crate) invalid_queue_requests: AtomicU64,
    /// Requests refused by the ACL (authentication or permission).
    pub(crate) acl_refused: AtomicU64,
    /// NOTIFY_LOCK_FREED sent (rebalance engine).
    pub(crate) lock_freed_sent: Counter,
    /// Offset commits refused by the commit fence (rebalance engine).
    pub(crate) commits_fenced: Counter,
}

impl Counters {
    /// The counters, registered in `m`.
    pub(crate) fn new(m: &BrokerMetrics) -> Self {
        let r = &m.registry;
        Self {
            msgs_put: r.counter("shoal_broker_messages_put", "Messages stored by sends (all topics)."),
            msgs_got: r.counter("shoal_broker_messages_pulled", "Messages returned by pulls (all topics)."),
            pulls_held: r.counter("shoal_broker_pulls_held", "Pulls that found nothing and were held by long polling."),
            notifications_sent: r.counter(
                "shoal_broker_notifications_sent",
                "NOTIFY_CONSUMER_IDS_CHANGED requests sent to consumers (membership or subscription changes).",
            ),
            sends_rejected_busy: m.limit("max_inflight_sends"),
            coordinator_members_removed: r.counter(
                "shoal_broker_coordinator_members_removed",
                "Coordinated members removed (left, session expired, rebalance timeout, connection closed, replaced).",
            ),
            coordinator_notices_sent: r.counter(
                "shoal_broker_coordinator_notices_sent",
                "GROUP_ASSIGNMENT_CHANGED notices sent to coordinated members.",
            ),
            coordinator_fenced: r.counter(
                "shoal_broker_coordinator_fenced",
                "Pulls, offset commits and lock requests refused for a stale member epoch or a queue not assigned.",
            ),
            inflight_puts: std::sync::atomic::AtomicUsize::new(0),
            pulls_capped: AtomicU64::new(0),
            heartbeats_refused: AtomicU64::new(0),
            system_topic_sends_refused: AtomicU64::new(0),
            invalid_queue_requests: AtomicU64::new(0),
            acl_refused: AtomicU64::new(0),
            lock_freed_sent: r.counter(
                "shoal_broker_lock_freed_notices_sent",
                "NOTIFY_LOCK_FREED sent to members waiting for a queue lock.",
            ),
            commits_fenced: r.counter(
                "shoal_broker_offset_commits_fenced",
                "Offset commits refused (or pull-carried offsets ignored) because the member does not hold the queue's lock.",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_topics_are_one_liners() {
        let m = BrokerMetrics::new();
        m.limit("max_inflight_sends").inc();
        m.limit("max_inflight_sends").inc();
        m.topic("T").sent(2, 10);
        m.topic("T").pulled(1, 150);
        let text = m.registry.encode_text();
        assert!(
            text.contains("shoal_broker_limit_hits_total{limit=\"max_inflight_sends\"} 2\n"),
            "{text}"
        );
        assert_eq!(m.topic("T").bytes_in.load(Ordering::Relaxed), 10);
        assert_eq!(m.topics.len(), 1);
    }
}
