//! [`RequestMetrics`]: served requests by request code and response code, with latency.

use crate::{encode_family, LatencyHistogram};
use foldhash::{HashMap, HashMapExt};
use parking_lot::RwLock;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use shoal_proto::code::{request_code, response_code};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The response label of a request answered later (a held pull) or not at all (oneway).
pub const DEFERRED: i32 = i32::MIN;

/// Request latency histograms per (request code, response code), exported as one histogram
/// family `<name>` with labels `request` (RocketMQ name), `code` and `response` (RocketMQ
/// name). Codes a peer can choose freely are bounded: an unknown request code is counted as
/// `request="UNKNOWN"`, `code="-1"`, so a client cannot grow the label set.
#[derive(Debug, Clone)]
pub struct RequestMetrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: &'static str,
    help: &'static str,
    series: RwLock<HashMap<(i32, i32), LatencyHistogram>>,
    /// A lock-free cache in front of `series`: each slot is claimed by the first pair that
    /// hashes to it, so the pairs a broker serves most are found without the lock (whose
    /// shared counter the workers would otherwise bounce between cores on every request).
    hot: [OnceLock<((i32, i32), LatencyHistogram)>; HOT_SLOTS],
}

const HOT_SLOTS: usize = 64;

fn hot_slot((request, response): (i32, i32)) -> usize {
    let h =
        (request as u32).wrapping_mul(0x9E37_79B9) ^ (response as u32).wrapping_mul(0x85EB_CA6B);
    (h >> 26) as usize % HOT_SLOTS
}

impl RequestMetrics {
    /// Request metrics exported as `name` (e.g. `shoal_broker_request_seconds`).
    pub fn new(name: &'static str, help: &'static str) -> Self {
        Self {
            inner: Arc::new(Inner {
                name,
                help,
                series: RwLock::new(HashMap::new()),
                hot: std::array::from_fn(|_| OnceLock::new()),
            }),
        }
    }

    /// The histogram of (request, response); keep it to skip the lookup on a hot path.
    pub fn handle(&self, request: i32, response: i32) -> LatencyHistogram {
        self.series(key(request, response))
    }

    fn series(&self, key: (i32, i32)) -> LatencyHistogram {
        if let Some(h) = self.inner.series.read().get(&key) {
            return h.clone();
        }
        self.inner.series.write().entry(key).or_default().clone()
    }

    /// Records one served request.
    pub fn observe(&self, request: i32, response: i32, latency: Duration) {
        let key = key(request, response);
        let slot = &self.inner.hot[hot_slot(key)];
        match slot.get() {
            Some((k, h)) if *k == key => h.observe(latency),
            Some(_) => self.series(key).observe(latency),
            None => {
                let h = self.series(key);
                h.observe(latency);
                // Another pair may have claimed the slot meanwhile; it keeps it.
                let _ = slot.set((key, h));
            }
        }
    }

    /// Requests served with this (request, response) pair so far.
    pub fn count(&self, request: i32, response: i32) -> u64 {
        self.inner
            .series
            .read()
            .get(&(request, response))
            .map_or(0, LatencyHistogram::count)
    }
}

/// The series key of a (request, response) pair: unknown codes become -1 (bounded labels).
fn key(request: i32, response: i32) -> (i32, i32) {
    let request = if request_code::name(request).is_some() {
        request
    } else {
        -1
    };
    let response = if response == DEFERRED || response_code::name(response).is_some() {
        response
    } else {
        -1
    };
    (request, response)
}

fn response_name(code: i32) -> &'static str {
    if code == DEFERRED {
        return "DEFERRED";
    }
    response_code::name(code).unwrap_or("UNKNOWN")
}

impl Collector for RequestMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut rows: Vec<((i32, i32), LatencyHistogram)> = self
            .inner
            .series
            .read()
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        rows.sort_by_key(|(k, _)| *k);
        let labelled: Vec<([(&str, String); 3], &LatencyHistogram)> = rows
            .iter()
            .map(|((req, resp), h)| {
                (
                    [
                        (
                            "request",
                            request_code::name(*req).unwrap_or("UNKNOWN").to_string(),
                        ),
                        ("code", req.to_string()),
                        ("response", response_name(*resp).to_string()),
                    ],
                    h,
                )
            })
            .collect();
        encode_family(
            &mut encoder,
            self.inner.name,
            self.inner.help,
            labelled.iter().map(|(l, h)| (l, *h)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Metrics;

    #[test]
    fn requests_are_labelled_by_name_and_unknown_codes_share_a_series() {
        let r = RequestMetrics::new("shoal_test_request_seconds", "Requests.");
        let m = Metrics::new();
        m.collector(r.clone());
        r.observe(
            request_code::SEND_MESSAGE_V2,
            response_code::SUCCESS,
            Duration::from_micros(300),
        );
        r.observe(
            request_code::PULL_MESSAGE,
            DEFERRED,
            Duration::from_millis(1),
        );
        r.observe(77_777, response_code::SUCCESS, Duration::from_millis(1));
        r.observe(88_888, response_code::SUCCESS, Duration::from_millis(1));
        assert_eq!(r.count(-1, response_code::SUCCESS), 2);
        let text = m.encode_text();
        assert!(
            text.contains("shoal_test_request_seconds_count{request=\"SEND_MESSAGE_V2\",code=\"310\",response=\"SUCCESS\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("response=\"DEFERRED\""), "{text}");
        assert!(
            text.contains("shoal_test_request_seconds_count{request=\"UNKNOWN\",code=\"-1\",response=\"SUCCESS\"} 2\n"),
            "{text}"
        );
    }

    #[test]
    fn every_pair_counts_whether_or_not_it_holds_a_cache_slot() {
        let r = RequestMetrics::new("shoal_test_request_seconds", "Requests.");
        // More pairs than cache slots, so some collide and take the locked path.
        let pairs: Vec<(i32, i32)> = request_code::ALL
            .iter()
            .take(40)
            .flat_map(|(q, _)| {
                [
                    (*q, response_code::SUCCESS),
                    (*q, response_code::SYSTEM_ERROR),
                ]
            })
            .collect();
        assert!(pairs.len() > HOT_SLOTS);
        for round in 1..=3u64 {
            for &(q, a) in &pairs {
                r.observe(q, a, Duration::from_micros(10));
            }
            for &(q, a) in &pairs {
                assert_eq!(r.count(q, a), round, "({q}, {a})");
                assert_eq!(r.handle(q, a).count(), round, "({q}, {a})");
            }
        }
    }
}
