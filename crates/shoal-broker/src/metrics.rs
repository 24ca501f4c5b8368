//! The broker's Prometheus metrics (every one is described in `docs/operations.md`).
//!
//! [`BrokerMetrics`] owns the broker's registry ([`BrokerMetrics::registry`], served at
//! `/metrics` by the `shoal` binary) and the metrics updated on the request path. Values that
//! already live elsewhere (offsets, lag, owners, held pulls, the commit log's size, free disk)
//! are read at scrape time by [`BrokerCollector`], so the hot path does not pay for them.
//!
//! Adding a metric from another module is one line, kept as a field or a local handle:
//!
//! ```
//! # let metrics = shoal_broker::metrics::BrokerMetrics::new();
//! let hits = metrics.registry.counter("shoal_broker_my_things", "Things that happened.");
//! hits.inc();
//! let limit = metrics.limit("max_my_things"); // shoal_broker_limit_hits_total{limit="max_my_things"}
//! limit.inc();
//! ```

use crate::broker::BrokerInner;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use shoal_metrics::{encode_counters, encode_gauges, prometheus_client, Keyed, LatencyHistogram};
use shoal_metrics::{Metrics, RequestMetrics};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

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

/// Reads, at scrape time, what lives in the broker's own tables: topic traffic, held pulls,
/// the store's size and free disk, and per group and queue the broker offset, committed
/// offset, lag and owner.
#[derive(Debug)]
pub struct BrokerCollector {
    inner: Weak<BrokerInner>,
}

impl BrokerCollector {
    /// A collector over a broker's state (held weakly: the registry lives in that state).
    pub fn new(inner: &Arc<BrokerInner>) -> Self {
        Self {
            inner: Arc::downgrade(inner),
        }
    }
}

/// One row of the per group and queue metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueProgress {
    /// Consumer group.
    pub group: String,
    /// Topic.
    pub topic: String,
    /// Queue id.
    pub queue_id: i32,
    /// Next offset the broker will write (max offset).
    pub broker_offset: i64,
    /// Offset the group committed (0 when none).
    pub committed_offset: i64,
    /// Client id of the member that pulled this queue last, if it is still in the group.
    pub owner: Option<String>,
}

impl QueueProgress {
    /// Messages not yet committed.
    pub fn lag(&self) -> i64 {
        (self.broker_offset - self.committed_offset).max(0)
    }
}

/// Per group and queue progress on this broker: every group online or with offsets here,
/// every queue of the topics it subscribes to or has offsets for.
pub fn group_progress(b: &BrokerInner) -> Vec<QueueProgress> {
    let mut groups: BTreeSet<String> = b.clients.lock().group_names().into_iter().collect();
    groups.extend(b.groups.lock().all().keys().cloned());
    let marks = b.pull_marks.lock().clone();
    let mut rows = Vec::new();
    for group in groups {
        let (mut topics, members): (BTreeSet<String>, Vec<(u64, String)>) = {
            let clients = b.clients.lock();
            (
                clients
                    .group_subscriptions(&group)
                    .map(|s| s.keys().cloned().collect())
                    .unwrap_or_default(),
                clients
                    .members(&group)
                    .into_iter()
                    .map(|(c, _)| (c.conn_id, c.client_id.clone()))
                    .collect(),
            )
        };
        for (t, _, _) in b.store.offsets_of_group(&group) {
            topics.insert(t);
        }
        for topic in topics {
            let Some(queues) = b.topics.lock().get(&topic).map(|c| c.read_queue_nums) else {
                continue;
            };
            for q in 0..queues {
                let owner = marks
                    .get(&(group.clone(), topic.clone(), q))
                    .and_then(|m| members.iter().find(|(c, _)| *c == m.conn_id))
                    .map(|(_, id)| id.clone());
                rows.push(QueueProgress {
                    broker_offset: b.store.max_offset(&topic, q) as i64,
                    committed_offset: b.store.query_offset(&group, &topic, q).unwrap_or(0).max(0),
                    owner,
                    group: group.clone(),
                    topic: topic.clone(),
                    queue_id: q,
                });
            }
        }
    }
    rows
}

/// Free and total bytes of the file system holding `path`.
fn disk_space(path: &std::path::Path) -> Option<(u64, u64)> {
    Some((
        fs4::available_space(path).ok()?,
        fs4::total_space(path).ok()?,
    ))
}

impl Collector for BrokerCollector {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(b) = self.inner.upgrade() else {
            return Ok(());
        };
        let topics = b.metrics.topics.snapshot();
        let by_topic = |f: fn(&TopicTraffic) -> u64| {
            topics
                .iter()
                .map(move |(t, c)| ([("topic", t.clone())], f(c)))
                .collect::<Vec<_>>()
        };
        encode_counters(
            &mut e,
            "shoal_broker_topic_messages_in",
            "Messages stored by sends, by topic.",
            by_topic(|c| c.messages_in.load(Ordering::Relaxed)),
        )?;
        encode_counters(
            &mut e,
            "shoal_broker_topic_bytes_in",
            "Message body bytes stored by sends, by topic.",
            by_topic(|c| c.bytes_in.load(Ordering::Relaxed)),
        )?;
        encode_counters(
            &mut e,
            "shoal_broker_topic_messages_out",
            "Messages returned by pulls, by topic.",
            by_topic(|c| c.messages_out.load(Ordering::Relaxed)),
        )?;
        encode_counters(
            &mut e,
            "shoal_broker_topic_bytes_out",
            "Stored-record bytes returned by pulls, by topic.",
            by_topic(|c| c.bytes_out.load(Ordering::Relaxed)),
        )?;
        let one = |v: i64| [([("broker", b.config.broker_name.clone())], v)];
        let c = &b.counters;
        let refusals = [
            (
                "shoal_broker_pulls_capped",
                "Pull answers cut by max_pull_batch_bytes / max_pull_batch_messages.",
                &c.pulls_capped,
            ),
            (
                "shoal_broker_heartbeats_refused",
                "Heartbeats refused (too large, too many groups or subscriptions).",
                &c.heartbeats_refused,
            ),
            (
                "shoal_broker_groups_refused",
                "Groups not auto-created because max_subscription_groups was reached.",
                &c.groups_refused,
            ),
            (
                "shoal_broker_system_topic_sends_refused",
                "Client sends to system topics refused.",
                &c.system_topic_sends_refused,
            ),
            (
                "shoal_broker_invalid_queue_requests",
                "Requests refused for bad queue ids or offsets.",
                &c.invalid_queue_requests,
            ),
            (
                "shoal_broker_acl_refused",
                "Requests refused by the ACL (authentication or permission).",
                &c.acl_refused,
            ),
        ];
        for (name, help, v) in refusals {
            encode_counters(
                &mut e,
                name,
                help,
                [(
                    [("broker", b.config.broker_name.clone())],
                    v.load(Ordering::Relaxed),
                )],
            )?;
        }
        encode_net(&mut e, &b.net_stats.snapshot())?;
        encode_gauges(
            &mut e,
            "shoal_broker_pull_holds",
            "Pulls held by long polling now, waiting for a message.",
            one(b.holds.len() as i64),
        )?;
        encode_gauges(
            &mut e,
            "shoal_broker_sends_waiting_for_store",
            "Sends waiting for the store now (limited by max_inflight_sends).",
            one(b.counters.inflight_puts.load(Ordering::Relaxed) as i64),
        )?;
        let (min, max, flushed) = (
            b.store.commit_log_min_offset(),
            b.store.commit_log_max_offset(),
            b.store.commit_log_flushed_offset(),
        );
        encode_gauges(
            &mut e,
            "shoal_broker_commit_log_bytes",
            "Bytes held in the commit log (max offset minus min offset).",
            one(max.saturating_sub(min) as i64),
        )?;
        encode_gauges(
            &mut e,
            "shoal_broker_commit_log_max_offset",
            "Commit log write position (bytes ever written).",
            one(max as i64),
        )?;
        encode_gauges(
            &mut e,
            "shoal_broker_commit_log_unflushed_bytes",
            "Bytes written to the commit log but not yet fsynced.",
            one(max.saturating_sub(flushed) as i64),
        )?;
        if let Some((free, total)) = disk_space(&b.config.data_dir) {
            encode_gauges(
                &mut e,
                "shoal_broker_disk_free_bytes",
                "Free bytes on the file system of the data directory.",
                one(free as i64),
            )?;
            encode_gauges(
                &mut e,
                "shoal_broker_disk_total_bytes",
                "Size of the file system of the data directory.",
                one(total as i64),
            )?;
        }
        encode_gauges(
            &mut e,
            "shoal_broker_topics",
            "Topics in the broker's topic table.",
            one(b.topics.lock().all().len() as i64),
        )?;
        let members: Vec<([(&str, String); 1], i64)> = {
            let clients = b.clients.lock();
            clients
                .group_names()
                .into_iter()
                .map(|g| {
                    let n = clients.members(&g).len() as i64;
                    ([("group", g)], n)
                })
                .collect()
        };
        encode_gauges(
            &mut e,
            "shoal_broker_group_members",
            "Members (client connections) of each online consumer group.",
            members,
        )?;
        let rows = group_progress(&b);
        let labels = |r: &QueueProgress| {
            [
                ("group", r.group.clone()),
                ("topic", r.topic.clone()),
                ("queue", r.queue_id.to_string()),
            ]
        };
        encode_gauges(
            &mut e,
            "shoal_broker_queue_offset",
            "Next offset the broker writes in the queue (its max offset), per group consuming it.",
            rows.iter().map(|r| (labels(r), r.broker_offset)),
        )?;
        encode_gauges(
            &mut e,
            "shoal_broker_group_committed_offset",
            "Offset the group committed for the queue.",
            rows.iter().map(|r| (labels(r), r.committed_offset)),
        )?;
        encode_gauges(
            &mut e,
            "shoal_broker_group_lag",
            "Messages of the queue the group has not committed (broker offset minus committed offset).",
            rows.iter().map(|r| (labels(r), r.lag())),
        )?;
        encode_gauges(
            &mut e,
            "shoal_broker_group_queue_owner",
            "1 for the member that pulls the queue now (the last one to pull it that is still in the group).",
            rows.iter().filter_map(|r| {
                let owner = r.owner.clone()?;
                let [g, t, q] = labels(r);
                Some(([g, t, q, ("client", owner)], 1))
            }),
        )?;
        Ok(())
    }
}

/// The listener's transport counters (`shoal_net::NetStats`): each transport limit hit, by its
/// config key and what the broker did, and the connection's reads, writes and requests.
fn encode_net(
    e: &mut DescriptorEncoder<'_>,
    n: &shoal_net::NetStatsSnapshot,
) -> Result<(), std::fmt::Error> {
    encode_counters(
        e,
        "shoal_broker_net_limit_hits",
        "Transport limits of the listener hit, by limit (the [net] config key) and action: refused (connection closed at accept), closed (connection closed), paused (the broker stopped reading that socket for a while), answer_replaced (an answer over the frame limit sent as SYSTEM_ERROR).",
        n.limit_hits()
            .map(|(limit, action, v)| ([("limit", limit), ("action", action)], v)),
    )?;
    encode_gauges(
        e,
        "shoal_broker_net_partial_frame_bytes",
        "Bytes held now by incomplete incoming frames over all connections (bounded by net.max_partial_frame_bytes).",
        [([("listener", "remoting")], n.partial_frame_bytes as i64)],
    )?;
    for (name, help, v) in [
        (
            "shoal_broker_net_requests",
            "Requests received by the listener (oneway included).",
            n.requests_received,
        ),
        (
            "shoal_broker_net_socket_reads",
            "Read calls on client sockets (one read takes every frame available).",
            n.read_calls,
        ),
        (
            "shoal_broker_net_socket_writes",
            "Write calls on client sockets (one write carries every answer ready).",
            n.write_calls,
        ),
    ] {
        encode_counters(e, name, help, [([("listener", "remoting")], v)])?;
    }
    let by_result = |rows: [(&'static str, u64); 3]| {
        rows.map(|(result, v)| ([("listener", "remoting"), ("result", result)], v))
    };
    encode_counters(
        e,
        "shoal_broker_tls_handshakes",
        "TLS handshakes on the listener, by result: ok, failed (connection closed), timeout (closed after tls.handshake_timeout_ms).",
        by_result([
            ("ok", n.tls_handshakes),
            ("failed", n.tls_handshake_failures),
            ("timeout", n.tls_handshake_timeouts),
        ]),
    )?;
    encode_counters(
        e,
        "shoal_broker_plaintext_connections",
        "Plaintext connections to a TLS listener: accepted (permissive mode) or refused (enforcing mode, connection closed).",
        [
            ([("listener", "remoting"), ("result", "accepted")], n.plaintext_accepted),
            ([("listener", "remoting"), ("result", "refused")], n.plaintext_refused),
        ],
    )?;
    Ok(())
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

    #[test]
    fn net_limit_hits_are_exported_by_config_key() {
        struct Net(shoal_net::NetStatsSnapshot);
        impl std::fmt::Debug for Net {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("Net")
            }
        }
        impl Collector for Net {
            fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
                encode_net(&mut e, &self.0)
            }
        }
        let m = Metrics::new();
        m.collector(Net(shoal_net::NetStatsSnapshot {
            refused_per_ip: 3,
            paused_write_queue: 2,
            partial_frame_bytes: 7,
            ..Default::default()
        }));
        let text = m.encode_text();
        for line in [
            "shoal_broker_net_limit_hits_total{limit=\"net.max_connections_per_ip\",action=\"refused\"} 3\n",
            "shoal_broker_net_limit_hits_total{limit=\"net.max_pending_write_bytes\",action=\"paused\"} 2\n",
            "shoal_broker_net_limit_hits_total{limit=\"net.idle_timeout_secs\",action=\"closed\"} 0\n",
            "shoal_broker_net_partial_frame_bytes{listener=\"remoting\"} 7\n",
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
    }
}
