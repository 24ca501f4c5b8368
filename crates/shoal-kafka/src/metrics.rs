//! The Kafka listener's Prometheus metrics (every one is described in `docs/operations.md`).
//!
//! The listener counts in plain atomics ([`Counters`]), updated on the request path without
//! a registry; [`KafkaCollector`] reads them at scrape time. Each field is exported as
//! `shoal_kafka_<field>`: `connections_open` as a gauge, every other field as a counter
//! (`_total` added by the encoder). The `shoal` binary registers the collector in the
//! broker's registry when it starts the listener, so the metrics are served at `/metrics`
//! only where a Kafka listener runs.

use crate::state::{Counters, State};
use shoal_metrics::prometheus_client::collector::Collector;
use shoal_metrics::prometheus_client::encoding::DescriptorEncoder;
use shoal_metrics::{encode_counters, encode_gauges};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Weak;

/// Reads a listener's [`Counters`] at every scrape. It holds the listener weakly: once the
/// listener is shut down and dropped it reports nothing.
#[derive(Debug)]
pub struct KafkaCollector {
    state: Weak<State>,
}

impl KafkaCollector {
    pub(crate) fn new(state: Weak<State>) -> Self {
        Self { state }
    }
}

impl Collector for KafkaCollector {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        match self.state.upgrade() {
            Some(s) => encode(&mut e, &s.counters),
            None => Ok(()),
        }
    }
}

/// The counters, by metric name (without `_total`) and help text.
fn counters(c: &Counters) -> [(&'static str, &'static str, &AtomicU64); 13] {
    [
        (
            "shoal_kafka_connections_accepted",
            "Kafka connections accepted since the listener started.",
            &c.connections_accepted,
        ),
        (
            "shoal_kafka_requests",
            "Kafka requests read.",
            &c.requests,
        ),
        (
            "shoal_kafka_requests_refused",
            "Kafka requests that closed their connection (too large, malformed, unsupported without a top-level error code).",
            &c.requests_refused,
        ),
        (
            "shoal_kafka_requests_unsupported",
            "Kafka requests for an API or version ApiVersions does not list (answered UNSUPPORTED_VERSION, or closed).",
            &c.requests_unsupported,
        ),
        (
            "shoal_kafka_requests_malformed",
            "Kafka requests whose body was malformed (a declared length past the frame, or refused by the decoder); each closed its connection.",
            &c.requests_malformed,
        ),
        (
            "shoal_kafka_batches_malformed",
            "Produce record batches refused before decoding (counts past the end, or more than max_batch_decompressed_bytes inflated).",
            &c.batches_malformed,
        ),
        (
            "shoal_kafka_records_produced",
            "Records stored by Produce.",
            &c.records_produced,
        ),
        (
            "shoal_kafka_records_fetched",
            "Records returned by Fetch.",
            &c.records_fetched,
        ),
        (
            "shoal_kafka_fetches_held",
            "Fetches that waited for data (long polling).",
            &c.fetches_held,
        ),
        (
            "shoal_kafka_duplicate_batches",
            "Idempotent batches answered as duplicates of an earlier batch (not stored again).",
            &c.duplicate_batches,
        ),
        (
            "shoal_kafka_sequence_errors",
            "Idempotent batches refused for a sequence gap or a stale producer epoch.",
            &c.sequence_errors,
        ),
        (
            "shoal_kafka_concurrent_writes_refused",
            "Idempotent batches answered REQUEST_TIMED_OUT because another request of the same producer was still writing the partition.",
            &c.concurrent_writes_refused,
        ),
        (
            "shoal_kafka_rebalances",
            "Classic Kafka group rebalances completed (generations started).",
            &c.rebalances,
        ),
    ]
}

/// The limit counters, as (config key in the broker file's `[kafka]` table, what the listener
/// did, counter): the rows of `shoal_kafka_limit_hits_total`.
fn limit_hits(c: &Counters) -> [(&'static str, &'static str, &AtomicU64); 6] {
    [
        ("kafka.max_connections", "refused", &c.limit_max_connections),
        (
            "kafka.max_request_bytes",
            "closed",
            &c.limit_max_request_bytes,
        ),
        (
            "kafka.max_batch_decompressed_bytes",
            "refused",
            &c.limit_max_batch_decompressed_bytes,
        ),
        (
            "kafka.max_producer_states",
            "evicted",
            &c.limit_max_producer_states,
        ),
        ("kafka.group_max_size", "refused", &c.limit_group_max_size),
        ("kafka.max_groups", "refused", &c.limit_max_groups),
    ]
}

/// Writes every counter of `c` (the listener has no labels: one listener per process).
fn encode(e: &mut DescriptorEncoder<'_>, c: &Counters) -> Result<(), std::fmt::Error> {
    let none: [(&str, &str); 0] = [];
    encode_gauges(
        e,
        "shoal_kafka_connections_open",
        "Kafka connections open now (bounded by max_connections).",
        [(none, c.connections_open.load(Ordering::Relaxed) as i64)],
    )?;
    for (name, help, v) in counters(c) {
        encode_counters(e, name, help, [(none, v.load(Ordering::Relaxed))])?;
    }
    encode_counters(
        e,
        "shoal_kafka_limit_hits",
        "Limits of the Kafka listener hit, by limit (the [kafka] config key) and action: refused (a connection closed at accept, a batch or a join refused), closed (the connection closed), evicted (the least recently used producer state forgotten).",
        limit_hits(c).map(|(limit, action, v)| {
            (
                [("limit", limit), ("action", action)],
                v.load(Ordering::Relaxed),
            )
        }),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_metrics::Metrics;

    /// A collector over counters the test owns (the real one needs a running listener).
    #[derive(Debug)]
    struct Fixed(Counters);

    impl Collector for Fixed {
        fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
            encode(&mut e, &self.0)
        }
    }

    #[test]
    fn every_counter_is_exported_with_its_value() {
        let c = Counters::default();
        c.connections_open.store(3, Ordering::Relaxed);
        // Each counter gets a distinct value, so a field exported under another's name shows.
        for (i, (_, _, v)) in counters(&c).into_iter().enumerate() {
            v.store(100 + i as u64, Ordering::Relaxed);
        }
        for (i, (_, _, v)) in limit_hits(&c).into_iter().enumerate() {
            v.store(200 + i as u64, Ordering::Relaxed);
        }
        let limits: Vec<String> = limit_hits(&c)
            .into_iter()
            .map(|(limit, action, v)| {
                format!(
                    "\nshoal_kafka_limit_hits_total{{limit=\"{limit}\",action=\"{action}\"}} {}\n",
                    v.load(Ordering::Relaxed)
                )
            })
            .collect();
        let expected: Vec<(&str, u64)> = counters(&c)
            .into_iter()
            .map(|(name, _, v)| (name, v.load(Ordering::Relaxed)))
            .collect();
        let m = Metrics::new();
        m.collector(Fixed(c));
        let text = m.encode_text();
        assert!(
            text.contains("# TYPE shoal_kafka_connections_open gauge\n"),
            "{text}"
        );
        assert!(
            text.contains("\nshoal_kafka_connections_open 3\n"),
            "{text}"
        );
        for (name, v) in &expected {
            assert!(
                text.contains(&format!("# TYPE {name}_total counter\n")),
                "{name}: {text}"
            );
            assert!(
                text.contains(&format!("\n{name}_total {v}\n")),
                "{name}_total {v} not in {text}"
            );
        }
        for row in &limits {
            assert!(text.contains(row.as_str()), "{row} not in {text}");
        }
        // 13 counters, the limit family and the gauge; and the names are distinct.
        assert_eq!(text.matches("# TYPE shoal_kafka_").count(), 15, "{text}");
        let mut names: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 13);
    }

    #[test]
    fn every_field_of_the_counters_has_a_metric() {
        // The struct's fields, from its Debug output, against the exported names: a counter
        // added to `Counters` without a metric fails here.
        let fields: Vec<String> = format!("{:?}", Counters::default())
            .trim_start_matches("Counters {")
            .trim_end_matches('}')
            .split(',')
            .filter_map(|f| f.split(':').next())
            .map(|f| f.trim().to_string())
            .filter(|f| !f.is_empty())
            .collect();
        let c = Counters::default();
        let mut exported: Vec<String> = counters(&c)
            .iter()
            .map(|(n, _, _)| n.trim_start_matches("shoal_kafka_").to_string())
            .collect();
        // The `limit_*` fields are the rows of the limit family, named by their config key.
        exported.extend(
            limit_hits(&c)
                .iter()
                .map(|(k, _, _)| format!("limit_{}", k.trim_start_matches("kafka."))),
        );
        exported.push("connections_open".into());
        let mut f = fields.clone();
        f.sort();
        exported.sort();
        assert_eq!(f, exported);
    }

    #[test]
    fn a_dropped_listener_reports_nothing() {
        let m = Metrics::new();
        m.collector(KafkaCollector::new(Weak::new()));
        assert_eq!(m.encode_text().matches("shoal_kafka_").count(), 0);
    }
}
