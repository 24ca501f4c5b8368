//! Client metrics for applications to export with the `prometheus-client` crate (re-exported
//! as [`shoal_metrics::prometheus_client`]).
//!
//! ```
//! # async fn f(producer: shoal_client::Producer, consumer: shoal_client::PushConsumer) {
//! use shoal_metrics::prometheus_client::registry::Registry;
//! let mut registry = Registry::default();
//! producer.metrics().register(&mut registry);
//! consumer.metrics().register(&mut registry);
//! let mut text = String::new();
//! shoal_metrics::prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
//! # }
//! ```
//!
//! Series carry the producer or consumer group as the `group` label, so several clients of a
//! process can share one registry.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use shoal_metrics::{encode_counters, encode_family, encode_gauges, prometheus_client};
use shoal_metrics::{LatencyHistogram, Metrics};
use std::sync::Arc;
use std::time::Duration;

/// A producer's metrics: sends by outcome and their latency (all attempts included).
#[derive(Debug, Clone)]
pub struct ProducerMetrics {
    inner: Arc<ProducerInner>,
}

#[derive(Debug)]
struct ProducerInner {
    group: String,
    sent: Counter,
    failed: Counter,
    failed_attempts: Counter,
    latency: LatencyHistogram,
}

impl ProducerMetrics {
    /// Metrics of a producer of `group`.
    pub fn new(group: &str) -> Self {
        Self {
            inner: Arc::new(ProducerInner {
                group: group.to_string(),
                sent: Counter::default(),
                failed: Counter::default(),
                failed_attempts: Counter::default(),
                latency: LatencyHistogram::default(),
            }),
        }
    }

    /// Counts a send that succeeded after `latency`.
    pub fn sent(&self, latency: Duration) {
        self.inner.sent.inc();
        self.inner.latency.observe(latency);
    }

    /// Counts a send that failed (after its retries).
    pub fn failed(&self, latency: Duration) {
        self.inner.failed.inc();
        self.inner.latency.observe(latency);
    }

    /// Counts one failed attempt (retried or not).
    pub fn attempt_failed(&self) {
        self.inner.failed_attempts.inc();
    }

    /// Sends that succeeded so far.
    pub fn sent_count(&self) -> u64 {
        self.inner.sent.get()
    }

    /// Sends that failed so far.
    pub fn failed_count(&self) -> u64 {
        self.inner.failed.get()
    }

    /// Registers in an application's `prometheus-client` registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(self.clone()));
    }

    /// Registers in a Shoal [`Metrics`] registry.
    pub fn register_in(&self, metrics: &Metrics) {
        metrics.collector(self.clone());
    }
}

impl Collector for ProducerMetrics {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let i = &self.inner;
        let g = || i.group.clone();
        encode_counters(
            &mut e,
            "shoal_client_sends",
            "Sends by outcome (after retries).",
            [
                ([("group", g()), ("result", "ok".to_string())], i.sent.get()),
                (
                    [("group", g()), ("result", "failed".to_string())],
                    i.failed.get(),
                ),
            ],
        )?;
        encode_counters(
            &mut e,
            "shoal_client_send_attempts_failed",
            "Send attempts that failed (each retry counts).",
            [([("group", g())], i.failed_attempts.get())],
        )?;
        let labels = [("group", g())];
        encode_family(
            &mut e,
            "shoal_client_send_seconds",
            "Time of a send, from the call to the answer (retries included).",
            [(&labels, &i.latency)],
        )
    }
}

/// A consumer's counters as read at scrape time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumerSnapshot {
    /// Messages the listener consumed.
    pub consumed_ok: u64,
    /// Messages the listener asked to reconsume.
    pub consumed_failed: u64,
    /// Messages sent back for retry.
    pub sent_back: u64,
    /// Rebalance runs.
    pub rebalances: u64,
    /// Queues released to other members.
    pub queues_released: u64,
    /// Pulls made.
    pub pulls: u64,
    /// Queues owned now.
    pub queues_owned: u64,
}

type Reader = dyn Fn() -> Option<ConsumerSnapshot> + Send + Sync;

/// A consumer's metrics (consumption, rebalances, queues owned), read from the consumer at
/// every scrape; nothing is added to the consume path.
#[derive(Clone)]
pub struct ConsumerMetrics {
    group: String,
    read: Arc<Reader>,
}

impl std::fmt::Debug for ConsumerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerMetrics")
            .field("group", &self.group)
            .finish()
    }
}

impl ConsumerMetrics {
    /// Metrics of a consumer of `group` read by `read` (`None` once the consumer is gone).
    pub fn new(
        group: &str,
        read: impl Fn() -> Option<ConsumerSnapshot> + Send + Sync + 'static,
    ) -> Self {
        Self {
            group: group.to_string(),
            read: Arc::new(read),
        }
    }

    /// The counters now (`None` once the consumer was dropped).
    pub fn snapshot(&self) -> Option<ConsumerSnapshot> {
        (self.read)()
    }

    /// Registers in an application's `prometheus-client` registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(self.clone()));
    }

    /// Registers in a Shoal [`Metrics`] registry.
    pub fn register_in(&self, metrics: &Metrics) {
        metrics.collector(self.clone());
    }
}

impl Collector for ConsumerMetrics {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(s) = self.snapshot() else {
            return Ok(());
        };
        let g = || self.group.clone();
        encode_counters(
            &mut e,
            "shoal_client_messages_consumed",
            "Messages handed to the listener, by its answer (ok, or failed = reconsume later).",
            [
                (
                    [("group", g()), ("result", "ok".to_string())],
                    s.consumed_ok,
                ),
                (
                    [("group", g()), ("result", "failed".to_string())],
                    s.consumed_failed,
                ),
            ],
        )?;
        let one = |name: &str, help: &str, v: u64, e: &mut DescriptorEncoder<'_>| {
            encode_counters(e, name, help, [([("group", g())], v)])
        };
        one(
            "shoal_client_messages_sent_back",
            "Messages sent back to the broker for a later retry.",
            s.sent_back,
            &mut e,
        )?;
        one(
            "shoal_client_rebalances",
            "Rebalance runs (on notification, at start, or by the safety-net timer).",
            s.rebalances,
            &mut e,
        )?;
        one(
            "shoal_client_queues_released",
            "Queues handed over to other members.",
            s.queues_released,
            &mut e,
        )?;
        one("shoal_client_pulls", "Pull requests made.", s.pulls, &mut e)?;
        encode_gauges(
            &mut e,
            "shoal_client_queues_owned",
            "Queues this consumer owns now.",
            [([("group", g())], s.queues_owned as i64)],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn producer_and_consumer_metrics_encode() {
        let p = ProducerMetrics::new("pg");
        p.sent(Duration::from_millis(2));
        p.failed(Duration::from_millis(20));
        p.attempt_failed();
        let c = ConsumerMetrics::new("cg", || {
            Some(ConsumerSnapshot {
                consumed_ok: 5,
                queues_owned: 2,
                ..Default::default()
            })
        });
        let mut r = Registry::default();
        p.register(&mut r);
        c.register(&mut r);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &r).unwrap();
        assert!(
            text.contains("shoal_client_sends_total{group=\"pg\",result=\"ok\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("shoal_client_send_seconds_count{group=\"pg\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("shoal_client_messages_consumed_total{group=\"cg\",result=\"ok\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("shoal_client_queues_owned{group=\"cg\"} 2\n"),
            "{text}"
        );
    }
}
