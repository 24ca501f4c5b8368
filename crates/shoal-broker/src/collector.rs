//! The broker's metrics read at scrape time ([`BrokerCollector`]): what lives in the broker's
//! own tables (topic traffic, held pulls, the store's size and free disk, per group and queue
//! the broker offset, committed offset, lag and owner) and the listener's transport counters.

use crate::metrics::TopicTraffic;
use crate::shared::Shared;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use shoal_metrics::{encode_counters, encode_gauges, prometheus_client};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// Reads, at scrape time, what lives in the broker's own tables: topic traffic, held pulls,
/// the store's size and free disk, and per group and queue the broker offset, committed
/// offset, lag and owner.
#[derive(Debug)]
pub(crate) struct BrokerCollector {
    inner: Weak<Shared>,
}

impl BrokerCollector {
    /// A collector over a broker's state (held weakly: the registry lives in that state).
    pub(crate) fn new(inner: &Arc<Shared>) -> Self {
        Self {
            inner: Arc::downgrade(inner),
        }
    }
}

/// One row of the per group and queue metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueProgress {
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
    pub(crate) fn lag(&self) -> i64 {
        (self.broker_offset - self.committed_offset).max(0)
    }
}

/// Per group and queue progress on this broker: every group online or with offsets here,
/// every queue of the topics it subscribes to or has offsets for.
pub(crate) fn group_progress(b: &Shared) -> Vec<QueueProgress> {
    let mut groups: BTreeSet<String> = b
        .groups
        .read(|g, _| g.clients().group_names())
        .into_iter()
        .collect();
    groups.extend(b.sub_groups.names());
    let marks = b.observer.marks();
    let mut rows = Vec::new();
    for group in groups {
        let (mut topics, members): (BTreeSet<String>, Vec<(u64, String)>) = {
            b.groups.read(|g, _| {
                let clients = g.clients();
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
            })
        };
        for (t, _, _) in b.store.offsets_of_group(&group) {
            topics.insert(t);
        }
        for topic in topics {
            let Some(queues) = b.topics.read(&topic, |c| c.map(|c| c.read_queue_nums)) else {
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
        let groups_refused = std::sync::atomic::AtomicU64::new(b.sub_groups.refused());
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
                &groups_refused,
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
        if let Some(r) = b.replication.get() {
            r.encode_metrics(&mut e, &b.config.broker_name)?;
        }
        let t = &b.transactions.counters;
        let broker = b.config.broker_name.clone();
        encode_counters(
            &mut e,
            "shoal_broker_transaction_events",
            "Transactional message events: half messages stored, commits, rollbacks, duplicate decisions (ignored), checks sent, checks due with no producer connected, half messages discarded after too many checks.",
            [
                ("half_stored", &t.half_stored),
                ("committed", &t.committed),
                ("rolled_back", &t.rolled_back),
                ("duplicate_decision", &t.duplicate_decisions),
                ("check_sent", &t.checks_sent),
                ("check_without_producer", &t.checks_without_producer),
                ("discarded", &t.discarded),
            ]
            .map(|(event, v)| {
                (
                    [("broker", broker.clone()), ("event", event.to_string())],
                    v.load(Ordering::Relaxed),
                )
            }),
        )?;
        let pop = b.pop.engine_counters();
        encode_counters(
            &mut e,
            "shoal_broker_pop_events",
            "POP consumption: leases granted, acks accepted, receipts refused (stale, foreign, lapsed), leases lapsed, copies revived to a retry or dead-letter topic, FIFO messages dead-lettered, invisibility changes.",
            [
                ("leased", pop.leased),
                ("acked", pop.acked),
                ("refused", pop.refused),
                ("lapsed", pop.lapsed),
                ("revived", pop.revived),
                ("dead_lettered", pop.dead_lettered),
                ("changed", pop.changed),
            ]
            .map(|(event, v)| ([("broker", broker.clone()), ("event", event.to_string())], v)),
        )?;
        let p = &b.pop.counters;
        encode_counters(
            &mut e,
            "shoal_broker_pop_requests",
            "POP_MESSAGE requests by result: found messages, or none (after long polling).",
            [
                ("found", p.pops_found.load(Ordering::Relaxed)),
                ("empty", p.pops_empty.load(Ordering::Relaxed)),
            ]
            .map(|(result, v)| {
                (
                    [("broker", broker.clone()), ("result", result.to_string())],
                    v,
                )
            }),
        )?;
        encode_counters(
            &mut e,
            "shoal_broker_pop_journal_errors",
            "Writes of the POP journal that failed (the request was refused).",
            [(
                [("broker", broker.clone())],
                p.journal_errors.load(Ordering::Relaxed),
            )],
        )?;
        encode_gauges(
            &mut e,
            "shoal_broker_pop_polling",
            "POP requests held by long polling now (bounded by pop_max_polling).",
            one(b.pop.polling.load(Ordering::Relaxed) as i64),
        )?;
        encode_gauges(
            &mut e,
            "shoal_broker_pop_groups",
            "Consumer groups in POP mode (by request mode, or with POP state).",
            one(b.pop.pop_groups().len() as i64),
        )?;
        encode_gauges(
            &mut e,
            "shoal_broker_sql_selectors_cached",
            "Compiled SQL92 selectors in the broker's cache (at most 1024).",
            one(b.selectors.len() as i64),
        )?;
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
            one(b.topics.len() as i64),
        )?;
        let members: Vec<([(&str, String); 1], i64)> = b.groups.read(|g, _| {
            let clients = g.clients();
            clients
                .group_names()
                .into_iter()
                .map(|g| {
                    let n = clients.members(&g).len() as i64;
                    ([("group", g)], n)
                })
                .collect()
        });
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
            "shoal_broker_net_requests_binary_header",
            "Requests received whose header came in RocketMQ's binary encoding (the others came as JSON).",
            n.requests_binary_header,
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
    use shoal_metrics::Metrics;

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
