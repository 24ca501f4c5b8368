//! Configuration of the Kafka listener (`[kafka]` keys, see `docs/kafka.md`).

use crate::KafkaError;

/// Kafka listener settings. Every limit here bounds something a client can make the server
/// hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    /// Address to listen on, `host:port`.
    pub listen_addr: String,
    /// Host name clients are told to connect to (Metadata, FindCoordinator). Default: the
    /// listen host, or 127.0.0.1 when listening on a wildcard address.
    pub advertised_host: Option<String>,
    /// Port clients are told to connect to. Default: the bound port.
    pub advertised_port: Option<u16>,
    /// This broker's Kafka node id.
    pub node_id: i32,
    /// Cluster id reported in Metadata.
    pub cluster_id: String,
    /// Largest request frame accepted, bytes (Kafka's `socket.request.max.bytes`); a larger
    /// one closes the connection with a logged reason.
    pub max_request_bytes: usize,
    /// Largest size a compressed record batch of a Produce request may inflate to, bytes;
    /// a larger one is refused (RECORD_LIST_TOO_LARGE) and inflating stops there.
    pub max_batch_decompressed_bytes: usize,
    /// Most open Kafka connections; more are closed at accept with a logged reason.
    pub max_connections: usize,
    /// Longest a fetch may wait for data, whatever the client asks (ms).
    pub max_fetch_wait_ms: u64,
    /// Largest fetch response, bytes, whatever the client asks (`fetch.max.bytes`).
    pub max_fetch_response_bytes: usize,
    /// Most idempotent producers whose sequence state is kept; the least recently used are
    /// forgotten beyond it (they get UNKNOWN_PRODUCER_ID and re-initialise).
    pub max_producer_states: usize,
    /// Partitions of a topic created by Metadata auto-creation or CreateTopics with -1
    /// (`num.partitions`); `None` takes the broker's default queue count.
    pub default_partitions: Option<i32>,
    /// Delay before the first rebalance of an empty classic group completes
    /// (`group.initial.rebalance.delay.ms`).
    pub group_initial_rebalance_delay_ms: u64,
    /// Smallest session timeout a member may ask for (`group.min.session.timeout.ms`).
    pub group_min_session_timeout_ms: u64,
    /// Largest session timeout a member may ask for (`group.max.session.timeout.ms`).
    pub group_max_session_timeout_ms: u64,
    /// How long a classic group's heartbeat answer may be held while the group is Stable
    /// (at most a third of the member's session timeout; 0: answered at once, as Kafka
    /// does). A rebalance answers held heartbeats at once, so members learn of it without
    /// waiting for their next heartbeat. Best a little below the clients'
    /// `heartbeat.interval.ms` (3 s for librdkafka and the Java client), which librdkafka
    /// counts from the heartbeat it sent: the next one follows right after the answer.
    pub group_heartbeat_hold_ms: u64,
    /// When new members join a classic group that has members, the others are told of the
    /// rebalance once no new member joined for this long (at most ten times this), so that
    /// members started together join one generation (0: told at once).
    pub group_new_member_window_ms: u64,
    /// Most members of one classic group (`group.max.size`).
    pub group_max_size: usize,
    /// Most classic groups held in memory. (`group.protocol=consumer` groups live in the
    /// broker's coordinator, bounded by its `[coordinator]` limits.)
    pub max_groups: usize,
    /// Longest heartbeat interval given to `group.protocol=consumer` members
    /// (`group.consumer.heartbeat.interval.ms`): the coordinator's interval when shorter.
    /// Kafka members learn assignment changes by heartbeating (Shoal members are also told
    /// at once), so a shorter interval here speeds up their rebalances. The session timeout
    /// is the coordinator's.
    pub consumer_heartbeat_interval_ms: u64,
    /// The heartbeat interval given to a `group.protocol=consumer` member while it has
    /// partitions to revoke or waits for partitions (it is given the steady interval again
    /// once it is reconciled).
    pub consumer_reconcile_heartbeat_interval_ms: u64,
    /// How long the answer to a heartbeat of a reconciled `group.protocol=consumer` member
    /// may be held, waiting for a change of its assignment (answered at once when one
    /// comes); 0 answers at once, as Kafka does. Below `consumer_heartbeat_interval_ms`
    /// (librdkafka times a heartbeat out after the interval); scaled down with the interval
    /// when the coordinator's is shorter.
    pub consumer_heartbeat_hold_ms: u64,
    /// After a member is told of a new assignment, fetches of the partitions it held wait
    /// until its next group request (a heartbeat of the consumer protocol; a JoinGroup,
    /// SyncGroup or LeaveGroup of the classic one) shows it is past its rebalance callbacks,
    /// at most this long (0: never). librdkafka's fetcher stops for up to a second when a fetch answer
    /// arrives while the callback runs (see docs/kafka.md, "Partitions that keep their
    /// owner").
    pub rebalance_fetch_hold_ms: u64,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            listen_addr: "127.0.0.1:9092".into(),
            advertised_host: None,
            advertised_port: None,
            node_id: 0,
            cluster_id: "shoal".into(),
            max_request_bytes: 100 * 1024 * 1024,
            max_batch_decompressed_bytes: 100 * 1024 * 1024,
            max_connections: 10_000,
            max_fetch_wait_ms: 30_000,
            max_fetch_response_bytes: 55 * 1024 * 1024,
            max_producer_states: 100_000,
            default_partitions: None,
            group_initial_rebalance_delay_ms: 3_000,
            group_min_session_timeout_ms: 6_000,
            group_max_session_timeout_ms: 1_800_000,
            group_heartbeat_hold_ms: 2_750,
            group_new_member_window_ms: 200,
            group_max_size: 1_000,
            max_groups: 10_000,
            consumer_heartbeat_interval_ms: 5_000,
            consumer_reconcile_heartbeat_interval_ms: 50,
            consumer_heartbeat_hold_ms: 4_750,
            rebalance_fetch_hold_ms: 100,
        }
    }
}

impl KafkaConfig {
    /// Checks the values.
    pub fn validate(&self) -> Result<(), KafkaError> {
        let bad = |m: &str| Err(KafkaError::Config(m.to_string()));
        if self.max_request_bytes < 1024 {
            return bad("max_request_bytes must be at least 1024");
        }
        if self.max_batch_decompressed_bytes < 1024 {
            return bad("max_batch_decompressed_bytes must be at least 1024");
        }
        if self.max_connections == 0 {
            return bad("max_connections must be at least 1");
        }
        if self.max_fetch_response_bytes == 0 {
            return bad("max_fetch_response_bytes must be at least 1");
        }
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms {
            return bad("group_min_session_timeout_ms exceeds group_max_session_timeout_ms");
        }
        if self.default_partitions.is_some_and(|p| p < 1) {
            return bad("default_partitions must be at least 1");
        }
        if self.consumer_heartbeat_interval_ms == 0
            || self.consumer_reconcile_heartbeat_interval_ms == 0
        {
            return bad(
                "consumer_heartbeat_interval_ms and consumer_reconcile_heartbeat_interval_ms must be above 0",
            );
        }
        if self.consumer_heartbeat_hold_ms >= self.consumer_heartbeat_interval_ms {
            return bad("consumer_heartbeat_hold_ms must be below consumer_heartbeat_interval_ms");
        }
        if self.group_max_size == 0 || self.max_groups == 0 {
            return bad("group_max_size and max_groups must be at least 1");
        }
        Ok(())
    }
}
