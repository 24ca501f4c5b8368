//! Latency fault tolerance for producers (RocketMQ's `MQFaultStrategy`).
//!
//! After every send the producer records how long the broker took. A slow broker is made
//! unavailable for a while, by the table below; a broker that failed a send is isolated for a
//! fixed time. Queue selection then prefers available brokers other than the one that just
//! failed, then reachable ones, then any queue (round-robin). Sans-IO: callers pass the time.

use shoal_proto::MessageQueue;

/// Latency thresholds (ms) and, index for index, how long a broker that reached them is not
/// available (ms). RocketMQ 5's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultTable {
    /// Latency thresholds, ascending.
    pub latency_max_ms: Vec<u64>,
    /// Unavailability for each threshold.
    pub not_available_ms: Vec<u64>,
    /// Isolation after a failed send.
    pub isolation_ms: u64,
}

impl Default for FaultTable {
    fn default() -> Self {
        Self {
            latency_max_ms: vec![50, 100, 550, 1800, 3000, 5000, 15000],
            not_available_ms: vec![0, 0, 2000, 5000, 6000, 10000, 30000],
            isolation_ms: 10_000,
        }
    }
}

impl FaultTable {
    /// How long a broker is unavailable after a send that took `latency_ms`.
    pub fn not_available_for(&self, latency_ms: u64) -> u64 {
        self.latency_max_ms
            .iter()
            .zip(&self.not_available_ms)
            .rev()
            .find(|(max, _)| latency_ms >= **max)
            .map(|(_, d)| *d)
            .unwrap_or(0)
    }
}

#[derive(Debug, Clone, Copy)]
struct FaultItem {
    latency_ms: u64,
    available_from_ms: u64,
    reachable: bool,
}

/// Per-broker latency and availability, plus the round-robin queue selector.
#[derive(Debug)]
pub struct LatencyFaultTolerance {
    enabled: bool,
    table: FaultTable,
    items: foldhash::HashMap<String, FaultItem>,
    next_index: usize,
}

impl LatencyFaultTolerance {
    /// A new selector; `enabled = false` gives plain round-robin that only avoids the broker
    /// that just failed (RocketMQ's `sendLatencyFaultEnable = false`).
    pub fn new(enabled: bool, table: FaultTable) -> Self {
        Self {
            enabled,
            table,
            items: foldhash::HashMap::default(),
            next_index: 0,
        }
    }

    /// Records a send outcome: its latency, and whether it failed (isolation).
    pub fn record(&mut self, broker: &str, latency_ms: u64, failed: bool, now_ms: u64) {
        if !self.enabled {
            return;
        }
        let duration = if failed {
            self.table.isolation_ms
        } else {
            self.table.not_available_for(latency_ms)
        };
        let item = FaultItem {
            latency_ms: if failed {
                self.table.isolation_ms
            } else {
                latency_ms
            },
            available_from_ms: now_ms + duration,
            reachable: !failed,
        };
        // Updated in place: a send records every outcome, and a key copy per send is waste.
        match self.items.get_mut(broker) {
            Some(existing) => *existing = item,
            None => {
                self.items.insert(broker.to_string(), item);
            }
        }
    }

    /// Forgets what was recorded of a broker: it registered with the name server again (a
    /// restart, or back after it left the route), which is evidence it is up.
    pub fn forget(&mut self, broker: &str) {
        self.items.remove(broker);
    }

    /// True when the broker may be used now.
    pub fn is_available(&self, broker: &str, now_ms: u64) -> bool {
        self.items
            .get(broker)
            .is_none_or(|i| now_ms >= i.available_from_ms)
    }

    /// True unless the last send to the broker failed.
    pub fn is_reachable(&self, broker: &str) -> bool {
        self.items.get(broker).is_none_or(|i| i.reachable)
    }

    /// The last recorded latency of a broker.
    pub fn latency_of(&self, broker: &str) -> Option<u64> {
        self.items.get(broker).map(|i| i.latency_ms)
    }

    /// Chooses a queue from `queues` (the topic's write queues), avoiding `last_failed_broker`.
    pub fn select(
        &mut self,
        queues: &[MessageQueue],
        last_failed_broker: Option<&str>,
        now_ms: u64,
    ) -> Option<MessageQueue> {
        self.select_index(queues, last_failed_broker, now_ms)
            .map(|i| queues[i].clone())
    }

    /// As [`LatencyFaultTolerance::select`], giving the chosen queue's index in `queues`
    /// (no copy of the queue).
    ///
    /// The queues are tried in tiers: available brokers other than the last failed one, then
    /// reachable ones, then any. Within the first tier that has any, the choice is
    /// round-robin over **that tier's queues**, so that sends spread evenly over the queues
    /// still trusted: a rotation over every queue that skipped to the next trusted one would
    /// give the first trusted queue after a run of untrusted ones the share of the whole run
    /// (with one of two brokers unavailable, 5 of 8 sends to one queue).
    pub fn select_index(
        &mut self,
        queues: &[MessageQueue],
        last_failed_broker: Option<&str>,
        now_ms: u64,
    ) -> Option<usize> {
        if queues.is_empty() {
            return None;
        }
        let turn = self.next_index;
        self.next_index = self.next_index.wrapping_add(1);
        let not_last = |q: &MessageQueue| Some(q.broker_name.as_str()) != last_failed_broker;
        if self.enabled {
            if let Some(i) = nth_matching(queues, turn, |q| {
                not_last(q) && self.is_available(&q.broker_name, now_ms)
            }) {
                return Some(i);
            }
            if let Some(i) = nth_matching(queues, turn, |q| {
                not_last(q) && self.is_reachable(&q.broker_name)
            }) {
                return Some(i);
            }
        } else if let Some(i) = nth_matching(queues, turn, not_last) {
            return Some(i);
        }
        Some(turn % queues.len())
    }
}

/// The index in `queues` of the `turn % k`-th of the `k` queues that match, if any match
/// (two passes, no allocation: a send calls this).
fn nth_matching(
    queues: &[MessageQueue],
    turn: usize,
    matches: impl Fn(&MessageQueue) -> bool,
) -> Option<usize> {
    let k = queues.iter().filter(|q| matches(q)).count();
    if k == 0 {
        return None;
    }
    if k == queues.len() {
        return Some(turn % k);
    }
    let n = turn % k;
    queues
        .iter()
        .enumerate()
        .filter(|(_, q)| matches(q))
        .nth(n)
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues() -> Vec<MessageQueue> {
        let mut v = Vec::new();
        for b in ["broker-a", "broker-b"] {
            for q in 0..2 {
                v.push(MessageQueue::new("T", b, q));
            }
        }
        v
    }

    #[test]
    fn table_matches_rocketmq() {
        let t = FaultTable::default();
        assert_eq!(t.not_available_for(10), 0);
        assert_eq!(t.not_available_for(99), 0);
        assert_eq!(t.not_available_for(550), 2000);
        assert_eq!(t.not_available_for(1799), 2000);
        assert_eq!(t.not_available_for(1800), 5000);
        assert_eq!(t.not_available_for(3000), 6000);
        assert_eq!(t.not_available_for(5000), 10000);
        assert_eq!(t.not_available_for(20000), 30000);
    }

    #[test]
    fn round_robin_without_faults() {
        let mut f = LatencyFaultTolerance::new(true, FaultTable::default());
        let qs = queues();
        let picked: Vec<_> = (0..4).map(|_| f.select(&qs, None, 0).unwrap()).collect();
        assert_eq!(picked, qs);
    }

    #[test]
    fn slow_broker_is_avoided_until_it_recovers() {
        let mut f = LatencyFaultTolerance::new(true, FaultTable::default());
        let qs = queues();
        f.record("broker-a", 600, false, 1_000);
        for _ in 0..8 {
            assert_eq!(f.select(&qs, None, 1_500).unwrap().broker_name, "broker-b");
        }
        assert!(f.is_available("broker-a", 3_000));
        let picked: Vec<_> = (0..4)
            .map(|_| f.select(&qs, None, 3_000).unwrap().broker_name)
            .collect();
        assert!(picked.iter().any(|b| b == "broker-a"));
    }

    #[test]
    fn failed_broker_is_isolated_and_last_failed_is_avoided() {
        let mut f = LatencyFaultTolerance::new(true, FaultTable::default());
        let qs = queues();
        f.record("broker-b", 5, true, 0);
        assert!(!f.is_reachable("broker-b"));
        assert_eq!(f.select(&qs, None, 9_999).unwrap().broker_name, "broker-a");
        // Both unavailable: a reachable broker other than the last failed one still wins.
        f.record("broker-a", 2_000, false, 0);
        assert_eq!(
            f.select(&qs, Some("broker-b"), 100).unwrap().broker_name,
            "broker-a"
        );
        // Everything failed: still returns a queue rather than nothing.
        f.record("broker-a", 5, true, 0);
        assert!(f.select(&qs, Some("broker-a"), 100).is_some());
        // broker-b registered again: usable at once.
        f.forget("broker-b");
        assert!(f.is_available("broker-b", 100) && f.is_reachable("broker-b"));
        assert_eq!(f.select(&qs, None, 100).unwrap().broker_name, "broker-b");
    }

    #[test]
    fn disabled_only_avoids_last_failed() {
        let mut f = LatencyFaultTolerance::new(false, FaultTable::default());
        let qs = queues();
        f.record("broker-a", 20_000, false, 0);
        assert!(f.is_available("broker-a", 0));
        for _ in 0..4 {
            assert_eq!(
                f.select(&qs, Some("broker-a"), 0).unwrap().broker_name,
                "broker-b"
            );
        }
    }

    /// With one broker unavailable, sends spread evenly over the other broker's queues (the
    /// rotation over every queue gave the first trusted queue 5 of 8 sends).
    #[test]
    fn sends_spread_evenly_over_the_queues_still_trusted() {
        let qs: Vec<MessageQueue> = ["broker-a", "broker-b"]
            .iter()
            .flat_map(|b| (0..4).map(move |q| MessageQueue::new("T", *b, q)))
            .collect();
        let count = |f: &mut LatencyFaultTolerance, last: Option<&str>, sends: usize| {
            let mut per_queue = std::collections::BTreeMap::<(String, i32), usize>::new();
            for _ in 0..sends {
                let q = f.select(&qs, last, 1_000).unwrap();
                *per_queue.entry((q.broker_name, q.queue_id)).or_default() += 1;
            }
            per_queue
        };
        // broker-b failed a send: isolated.
        let mut f = LatencyFaultTolerance::new(true, FaultTable::default());
        f.record("broker-b", 5, true, 0);
        let spread = count(&mut f, None, 800);
        assert_eq!(spread.len(), 4, "{spread:?}");
        assert!(spread.keys().all(|(b, _)| b == "broker-a"), "{spread:?}");
        assert!(spread.values().all(|n| *n == 200), "{spread:?}");
        // Slow rather than failed (latency tier), and the plain round-robin avoiding the last
        // failed broker: the same.
        let mut f = LatencyFaultTolerance::new(true, FaultTable::default());
        f.record("broker-a", 600, false, 500);
        let spread = count(&mut f, None, 800);
        assert!(spread.keys().all(|(b, _)| b == "broker-b"), "{spread:?}");
        assert!(spread.values().all(|n| *n == 200), "{spread:?}");
        let mut f = LatencyFaultTolerance::new(false, FaultTable::default());
        let spread = count(&mut f, Some("broker-a"), 800);
        assert!(spread.values().all(|n| *n == 200), "{spread:?}");
        // Every broker available: every queue in turn.
        let mut f = LatencyFaultTolerance::new(true, FaultTable::default());
        let spread = count(&mut f, None, 800);
        assert_eq!(spread.len(), 8);
        assert!(spread.values().all(|n| *n == 100), "{spread:?}");
        // Uneven brokers (3 queues on one, 5 on the other), one unavailable: even over the 5.
        let uneven: Vec<MessageQueue> = (0..3)
            .map(|q| MessageQueue::new("T", "broker-a", q))
            .chain((0..5).map(|q| MessageQueue::new("T", "broker-b", q)))
            .collect();
        let mut f = LatencyFaultTolerance::new(true, FaultTable::default());
        f.record("broker-a", 5, true, 0);
        let mut per = std::collections::BTreeMap::<i32, usize>::new();
        for _ in 0..500 {
            let q = f.select(&uneven, None, 1_000).unwrap();
            assert_eq!(q.broker_name, "broker-b");
            *per.entry(q.queue_id).or_default() += 1;
        }
        assert!(per.values().all(|n| *n == 100), "{per:?}");
    }
}
