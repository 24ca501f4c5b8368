//! State shared by the connections of one listener.

use crate::classic_groups::GroupCoordinator;
use crate::config::KafkaConfig;
use crate::fetch_hold::{FetchHolds, MemberKey};
use crate::host::{BrokerHandle, TopicInfo};
use crate::member_cache::ConsumerGroups;
use crate::producer::ProducerTable;
use md5::{Digest, Md5};
use shoal_store::MessageStore;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;
use uuid::Uuid;

/// Counters of the Kafka listener: plain atomics, updated on the request path without a
/// registry. The metrics module's `KafkaCollector` reads them at scrape time and exports each
/// field at `/metrics` as `shoal_kafka_<field>` (`connections_open` a gauge, every other
/// field a counter, `_total` appended), except the `limit_*` fields: each is one row of
/// `shoal_kafka_limit_hits_total{limit="kafka.KEY",action}`, the `*_limit_hits_total` family of
/// the other listeners; docs/operations.md lists them.
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections open now.
    pub connections_open: AtomicUsize,
    /// Connections accepted since start.
    pub connections_accepted: AtomicU64,
    /// Connections closed at accept because `max_connections` was reached.
    pub limit_max_connections: AtomicU64,
    /// Connections closed because a request frame was over `max_request_bytes`.
    pub limit_max_request_bytes: AtomicU64,
    /// Produce batches refused (RECORD_LIST_TOO_LARGE) because they inflate past
    /// `max_batch_decompressed_bytes`.
    pub limit_max_batch_decompressed_bytes: AtomicU64,
    /// Idempotent producer states forgotten because `max_producer_states` was reached.
    pub limit_max_producer_states: AtomicU64,
    /// JoinGroup requests refused (GROUP_MAX_SIZE_REACHED) because the classic group had
    /// `group_max_size` members.
    pub limit_group_max_size: AtomicU64,
    /// JoinGroup requests refused because `max_groups` classic groups were held and none was
    /// empty.
    pub limit_max_groups: AtomicU64,
    /// Requests read.
    pub requests: AtomicU64,
    /// Requests that closed their connection (too large, malformed, unsupported API).
    pub requests_refused: AtomicU64,
    /// Requests for an API or version outside what ApiVersions lists: answered with
    /// UNSUPPORTED_VERSION where the response has a top-level error code, else closed (and
    /// then also counted in `requests_refused`).
    pub requests_unsupported: AtomicU64,
    /// Requests whose body was malformed (a declared length past the end of the frame, or
    /// refused by the decoder); each closed its connection.
    pub requests_malformed: AtomicU64,
    /// Record batches refused before decoding as malformed (a declared record or header
    /// count past the end, a bad compression stream).
    pub batches_malformed: AtomicU64,
    /// Records stored by Produce.
    pub records_produced: AtomicU64,
    /// Records returned by Fetch.
    pub records_fetched: AtomicU64,
    /// Fetches that waited for data (long polling).
    pub fetches_held: AtomicU64,
    /// Batches answered as duplicates of an earlier idempotent batch (not stored again).
    pub duplicate_batches: AtomicU64,
    /// Batches refused for a sequence gap or a stale producer epoch.
    pub sequence_errors: AtomicU64,
    /// Idempotent batches answered REQUEST_TIMED_OUT (retriable) because another request of
    /// the same producer was still writing the same partition (a retry on a new connection).
    pub concurrent_writes_refused: AtomicU64,
    /// Classic group rebalances completed (generations started).
    pub rebalances: AtomicU64,
}

/// Everything the request handlers share.
#[derive(Debug)]
pub(crate) struct State {
    pub config: KafkaConfig,
    pub host: Arc<dyn BrokerHandle>,
    pub store: Arc<MessageStore>,
    pub advertised_host: String,
    pub advertised_port: i32,
    /// This listener's node id (configured, or derived from the advertised address).
    pub node_id: i32,
    pub counters: Counters,
    pub producers: ProducerTable,
    pub groups: GroupCoordinator,
    pub consumer_groups: ConsumerGroups,
    /// Fetches held across a member's rebalance callback ([`crate::fetch_hold`]).
    fetch_holds: parking_lot::Mutex<FetchHolds>,
    /// Set while `fetch_holds` may hold something: fetches skip the lock otherwise.
    fetch_holds_any: std::sync::atomic::AtomicBool,
    fetch_released: tokio::sync::Notify,
    started: std::time::Instant,
}

impl std::fmt::Debug for dyn BrokerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BrokerHandle")
    }
}

impl State {
    pub(crate) fn new(
        config: KafkaConfig,
        host: Arc<dyn BrokerHandle>,
        bound: SocketAddr,
    ) -> State {
        let advertised_host = config.advertised_host.clone().unwrap_or_else(|| {
            if bound.ip().is_unspecified() {
                "127.0.0.1".to_string()
            } else {
                bound.ip().to_string()
            }
        });
        let advertised_port = i32::from(config.advertised_port.unwrap_or(bound.port()));
        let node_id = config.node_id.unwrap_or_else(|| {
            crate::cluster::derived_node_id(&format!("{advertised_host}:{advertised_port}"))
        });
        let producers = ProducerTable::new(config.max_producer_states);
        let groups = GroupCoordinator::new(&config);
        let consumer_groups = ConsumerGroups::new(&config, host.broker_name());
        State {
            store: host.store(),
            host,
            advertised_host,
            advertised_port,
            node_id,
            counters: Counters::default(),
            producers,
            groups,
            consumer_groups,
            config,
            fetch_holds: parking_lot::Mutex::new(FetchHolds::default()),
            fetch_holds_any: std::sync::atomic::AtomicBool::new(false),
            fetch_released: tokio::sync::Notify::new(),
            started: std::time::Instant::now(),
        }
    }

    /// `member` was just told of a new assignment that gives it `given`: fetches of the
    /// partitions it held wait until its next group request or its OffsetFetch of one of
    /// `given`, at most `rebalance_fetch_hold_ms`.
    pub(crate) fn hold_fetches(
        &self,
        member: &MemberKey,
        partitions: Vec<(String, i32)>,
        given: Vec<(String, i32)>,
    ) {
        let Some((now, until)) = self.hold_window(&partitions, self.config.rebalance_fetch_hold_ms)
        else {
            return;
        };
        self.fetch_holds
            .lock()
            .hold(member, partitions, given, now, until);
        self.fetch_holds_any
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// From now to the end of a hold of `partitions` of `hold` ms; `None` when nothing is to be
    /// held (holds are off, or the member held nothing here).
    fn hold_window(
        &self,
        partitions: &[(String, i32)],
        hold: u64,
    ) -> Option<(std::time::Instant, std::time::Instant)> {
        if hold == 0 || partitions.is_empty() {
            return None;
        }
        let now = std::time::Instant::now();
        Some((now, now + std::time::Duration::from_millis(hold)))
    }

    /// `member` answered a heartbeat past its callback and is told of a new assignment in the
    /// answer: its holds are replaced by holds of `partitions` (what it held) in one step
    /// ([`FetchHolds::replace`]); `given` is what the answer newly gives it.
    pub(crate) fn replace_fetch_holds(
        &self,
        member: &MemberKey,
        partitions: Vec<(String, i32)>,
        given: Vec<(String, i32)>,
    ) {
        let Some((now, until)) = self.hold_window(&partitions, self.config.consumer_fetch_hold_ms)
        else {
            self.release_fetches(member);
            return;
        };
        let released = self
            .fetch_holds
            .lock()
            .replace(member, partitions, given, now, until);
        self.fetch_holds_any
            .store(true, std::sync::atomic::Ordering::Release);
        if released {
            self.fetch_released.notify_waiters();
        }
    }

    /// Waits `rebalance_answer_delay_ms` before an answer that told a member of a new
    /// assignment while fetches of partitions it held were just held: a fetch answered before
    /// the hold reaches the member first.
    pub(crate) async fn delay_after_hold(&self) {
        let c = &self.config;
        if (c.rebalance_fetch_hold_ms > 0 || c.consumer_fetch_hold_ms > 0)
            && c.rebalance_answer_delay_ms > 0
        {
            tokio::time::sleep(std::time::Duration::from_millis(
                c.rebalance_answer_delay_ms,
            ))
            .await;
        }
    }

    /// Whether fetches may have to wait ([`State::wait_fetch_holds`]).
    pub(crate) fn fetch_holds_any(&self) -> bool {
        self.fetch_holds_any
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// `member` sent a group request: it is past its rebalance callback.
    pub(crate) fn release_fetches(&self, member: &MemberKey) {
        let released = {
            let mut h = self.fetch_holds.lock();
            !h.is_empty() && h.release(member)
        };
        if released {
            self.fetch_released.notify_waiters();
        }
    }

    /// `group` asked for the committed offsets of `partitions` (OffsetFetch): holds of a
    /// member newly given one of them end ([`FetchHolds::asked`]).
    pub(crate) fn offsets_asked(&self, group: &str, partitions: &[(String, i32)]) {
        if !self.fetch_holds_any() {
            return;
        }
        let released = self
            .fetch_holds
            .lock()
            .asked(group, partitions, std::time::Instant::now());
        if released {
            self.fetch_released.notify_waiters();
        }
    }

    /// Waits while a fetch of `partitions` is held.
    pub(crate) async fn wait_fetch_holds(&self, partitions: &[(String, i32)]) {
        loop {
            let released = self.fetch_released.notified();
            let wait = {
                let h = self.fetch_holds.lock();
                if h.is_empty() {
                    self.fetch_holds_any
                        .store(false, std::sync::atomic::Ordering::Release);
                }
                h.wait_for(partitions, std::time::Instant::now())
            };
            let Some(wait) = wait else {
                return;
            };
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Monotonic milliseconds since the listener started (the group state machines' clock).
    pub(crate) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Looks a topic up by its id (Fetch v13+, Metadata by id).
    /// Whether this listener is `group`'s coordinator ([`crate::cluster::coordinator_of`];
    /// alone, it coordinates every group), with a cluster list at most a second old. Others
    /// answer NOT_COORDINATOR.
    pub(crate) async fn coordinates(&self, group: &str) -> bool {
        self.host.refresh_cluster().await;
        let masters = self.host.kafka_masters();
        matches!(
            crate::cluster::coordinator_of(group, &masters),
            None | Some(crate::cluster::Leader::Here)
        )
    }

    pub(crate) fn topic_by_id(&self, id: Uuid) -> Option<TopicInfo> {
        self.host
            .topics()
            .into_iter()
            .find(|t| topic_id(&t.name) == id)
    }
}

/// The topic id a topic is reported with: derived from its name (an MD5 digest shaped as a
/// version-3 UUID), so it is stable across restarts without being stored.
pub fn topic_id(name: &str) -> Uuid {
    let digest = Md5::digest(name.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest);
    bytes[6] = (bytes[6] & 0x0f) | 0x30;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    Uuid::from_bytes(bytes)
}
