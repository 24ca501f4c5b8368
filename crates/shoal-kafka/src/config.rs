//! Configuration of the Kafka listener (`[kafka]` keys, see `docs/kafka.md`).

use crate::KafkaError;
use serde::{Deserialize, Serialize};

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
    /// This broker's Kafka node id; `None` derives one from the advertised address (stable
    /// across restarts, different for each listener of a cluster).
    pub node_id: Option<i32>,
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
    /// After a classic member is told of a new assignment, fetches of the partitions it held
    /// wait until its next group request (a JoinGroup, SyncGroup or LeaveGroup, or its
    /// OffsetFetch of a partition it was just given) shows it is past its rebalance callbacks,
    /// at most this long (0: never). librdkafka's fetcher stops for up to a second when a
    /// fetch answer arrives while the callback runs (see docs/kafka.md, "Partitions that keep
    /// their owner"). A member given nothing new sends no such request: its kept partitions
    /// wait this long.
    pub rebalance_fetch_hold_ms: u64,
    /// The same for a `group.protocol=consumer` member, whose acknowledging heartbeat always
    /// follows its callbacks and ends the hold: this is only the longest wait, when that
    /// heartbeat is late or lost (0: never).
    pub consumer_fetch_hold_ms: u64,
    /// How long an answer that tells a member of a new assignment waits after its fetches
    /// are held (0: not at all). A fetch answered just before the hold may still be on its
    /// way; arriving after the new assignment, it would find the fetcher paused by the
    /// rebalance callback. Below `rebalance_fetch_hold_ms` and `consumer_fetch_hold_ms`
    /// (those above 0).
    pub rebalance_answer_delay_ms: u64,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            listen_addr: "127.0.0.1:9092".into(),
            advertised_host: None,
            advertised_port: None,
            node_id: None,
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
            consumer_fetch_hold_ms: 500,
            rebalance_answer_delay_ms: 10,
        }
    }
}

impl KafkaConfig {
    /// Sets what clients are told to connect to from `host:port`.
    ///
    /// # Errors
    /// [`KafkaError::Config`] when it is not `host:port`.
    pub fn set_advertised(&mut self, addr: &str) -> Result<(), KafkaError> {
        let bad = || KafkaError::Config(format!("advertised address {addr:?} is not host:port"));
        let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        if host.is_empty() || port == 0 {
            return Err(bad());
        }
        self.advertised_host = Some(host.trim_matches(['[', ']']).to_string());
        self.advertised_port = Some(port);
        Ok(())
    }

    /// Checks the values.
    pub fn validate(&self) -> Result<(), KafkaError> {
        let bad = |m: &str| Err(KafkaError::Config(m.to_string()));
        if self.listen_addr.trim().is_empty() {
            return bad("listen_addr is empty");
        }
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
        for (hold, name) in [
            (self.rebalance_fetch_hold_ms, "rebalance_fetch_hold_ms"),
            (self.consumer_fetch_hold_ms, "consumer_fetch_hold_ms"),
        ] {
            if hold > 0 && self.rebalance_answer_delay_ms >= hold {
                return bad(&format!("rebalance_answer_delay_ms must be below {name}"));
            }
        }
        if self.group_max_size == 0 || self.max_groups == 0 {
            return bad("group_max_size and max_groups must be at least 1");
        }
        Ok(())
    }
}

/// The `[kafka]` table of the broker's TOML file (`shoal broker -c`, `shoal dev -c`): every
/// setting of [`KafkaConfig`], each optional; a key the file leaves out keeps its default (or,
/// under `shoal dev`, dev's). Unknown keys are errors (a typo must not be ignored).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaFile {
    /// Address to listen on, `host:port`; under `shoal broker` this turns the listener on.
    pub listen_addr: Option<String>,
    /// `host:port` clients are told to connect to (Metadata, FindCoordinator).
    pub advertised_addr: Option<String>,
    /// This broker's Kafka node id.
    pub node_id: Option<i32>,
    /// Cluster id reported in Metadata.
    pub cluster_id: Option<String>,
    /// See [`KafkaConfig::max_request_bytes`].
    pub max_request_bytes: Option<usize>,
    /// See [`KafkaConfig::max_batch_decompressed_bytes`].
    pub max_batch_decompressed_bytes: Option<usize>,
    /// See [`KafkaConfig::max_connections`].
    pub max_connections: Option<usize>,
    /// See [`KafkaConfig::max_fetch_wait_ms`].
    pub max_fetch_wait_ms: Option<u64>,
    /// See [`KafkaConfig::max_fetch_response_bytes`].
    pub max_fetch_response_bytes: Option<usize>,
    /// See [`KafkaConfig::max_producer_states`].
    pub max_producer_states: Option<usize>,
    /// See [`KafkaConfig::default_partitions`].
    pub default_partitions: Option<i32>,
    /// See [`KafkaConfig::group_initial_rebalance_delay_ms`].
    pub group_initial_rebalance_delay_ms: Option<u64>,
    /// See [`KafkaConfig::group_min_session_timeout_ms`].
    pub group_min_session_timeout_ms: Option<u64>,
    /// See [`KafkaConfig::group_max_session_timeout_ms`].
    pub group_max_session_timeout_ms: Option<u64>,
    /// See [`KafkaConfig::group_max_size`].
    pub group_max_size: Option<usize>,
    /// See [`KafkaConfig::max_groups`].
    pub max_groups: Option<usize>,
    /// See [`KafkaConfig::consumer_heartbeat_interval_ms`].
    pub consumer_heartbeat_interval_ms: Option<u64>,
    /// See [`KafkaConfig::group_heartbeat_hold_ms`].
    pub group_heartbeat_hold_ms: Option<u64>,
    /// See [`KafkaConfig::group_new_member_window_ms`].
    pub group_new_member_window_ms: Option<u64>,
    /// See [`KafkaConfig::consumer_reconcile_heartbeat_interval_ms`].
    pub consumer_reconcile_heartbeat_interval_ms: Option<u64>,
    /// See [`KafkaConfig::consumer_heartbeat_hold_ms`].
    pub consumer_heartbeat_hold_ms: Option<u64>,
    /// See [`KafkaConfig::rebalance_fetch_hold_ms`].
    pub rebalance_fetch_hold_ms: Option<u64>,
    /// See [`KafkaConfig::consumer_fetch_hold_ms`].
    pub consumer_fetch_hold_ms: Option<u64>,
    /// See [`KafkaConfig::rebalance_answer_delay_ms`].
    pub rebalance_answer_delay_ms: Option<u64>,
}

impl KafkaFile {
    /// Sets in `cfg` every key the table gives (the others are left as they are), then checks
    /// the result.
    ///
    /// # Errors
    /// [`KafkaError::Config`] naming the key at fault.
    pub fn apply(&self, cfg: &mut KafkaConfig) -> Result<(), KafkaError> {
        fn set<T: Clone>(to: &mut T, v: &Option<T>) {
            if let Some(v) = v {
                *to = v.clone();
            }
        }
        set(&mut cfg.listen_addr, &self.listen_addr);
        if let Some(a) = &self.advertised_addr {
            cfg.set_advertised(a)
                .map_err(|e| KafkaError::Config(format!("advertised_addr: {e}")))?;
        }
        if let Some(id) = self.node_id {
            if id < 0 {
                return Err(KafkaError::Config(format!(
                    "node_id: {id} is negative (Kafka node ids are 0 or more)"
                )));
            }
            cfg.node_id = Some(id);
        }
        set(&mut cfg.cluster_id, &self.cluster_id);
        set(&mut cfg.max_request_bytes, &self.max_request_bytes);
        set(
            &mut cfg.max_batch_decompressed_bytes,
            &self.max_batch_decompressed_bytes,
        );
        set(&mut cfg.max_connections, &self.max_connections);
        set(&mut cfg.max_fetch_wait_ms, &self.max_fetch_wait_ms);
        set(
            &mut cfg.max_fetch_response_bytes,
            &self.max_fetch_response_bytes,
        );
        set(&mut cfg.max_producer_states, &self.max_producer_states);
        if self.default_partitions.is_some() {
            cfg.default_partitions = self.default_partitions;
        }
        set(
            &mut cfg.group_initial_rebalance_delay_ms,
            &self.group_initial_rebalance_delay_ms,
        );
        set(
            &mut cfg.group_min_session_timeout_ms,
            &self.group_min_session_timeout_ms,
        );
        set(
            &mut cfg.group_max_session_timeout_ms,
            &self.group_max_session_timeout_ms,
        );
        set(&mut cfg.group_max_size, &self.group_max_size);
        set(&mut cfg.max_groups, &self.max_groups);
        set(
            &mut cfg.consumer_heartbeat_interval_ms,
            &self.consumer_heartbeat_interval_ms,
        );
        set(
            &mut cfg.group_heartbeat_hold_ms,
            &self.group_heartbeat_hold_ms,
        );
        set(
            &mut cfg.group_new_member_window_ms,
            &self.group_new_member_window_ms,
        );
        set(
            &mut cfg.consumer_reconcile_heartbeat_interval_ms,
            &self.consumer_reconcile_heartbeat_interval_ms,
        );
        set(
            &mut cfg.consumer_heartbeat_hold_ms,
            &self.consumer_heartbeat_hold_ms,
        );
        set(
            &mut cfg.rebalance_fetch_hold_ms,
            &self.rebalance_fetch_hold_ms,
        );
        set(
            &mut cfg.consumer_fetch_hold_ms,
            &self.consumer_fetch_hold_ms,
        );
        set(
            &mut cfg.rebalance_answer_delay_ms,
            &self.rebalance_answer_delay_ms,
        );
        cfg.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct File {
        #[serde(default)]
        kafka: KafkaFile,
    }

    fn parse(text: &str) -> Result<KafkaFile, String> {
        toml::from_str::<File>(text)
            .map(|f| f.kafka)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn every_key_is_read_and_only_given_keys_change() {
        let f = parse(
            "broker_name = \"b\"\n[kafka]\nlisten_addr = \"0.0.0.0:19092\"\nadvertised_addr = \"kafka.example:9093\"\n\
             node_id = 3\ncluster_id = \"c\"\nmax_request_bytes = 2048\nmax_batch_decompressed_bytes = 4096\n\
             max_connections = 7\nmax_fetch_wait_ms = 100\nmax_fetch_response_bytes = 5000\n\
             max_producer_states = 9\ndefault_partitions = 2\ngroup_initial_rebalance_delay_ms = 11\n\
             group_min_session_timeout_ms = 12\ngroup_max_session_timeout_ms = 13\ngroup_max_size = 14\n\
             max_groups = 15\nconsumer_heartbeat_interval_ms = 160\n\
             group_heartbeat_hold_ms = 17\ngroup_new_member_window_ms = 18\n\
             consumer_reconcile_heartbeat_interval_ms = 19\nconsumer_heartbeat_hold_ms = 20\n\
             rebalance_fetch_hold_ms = 21\nconsumer_fetch_hold_ms = 22\nrebalance_answer_delay_ms = 3\n",
        )
        .unwrap();
        let mut c = KafkaConfig::default();
        f.apply(&mut c).unwrap();
        assert_eq!(
            c,
            KafkaConfig {
                listen_addr: "0.0.0.0:19092".into(),
                advertised_host: Some("kafka.example".into()),
                advertised_port: Some(9093),
                node_id: Some(3),
                cluster_id: "c".into(),
                max_request_bytes: 2048,
                max_batch_decompressed_bytes: 4096,
                max_connections: 7,
                max_fetch_wait_ms: 100,
                max_fetch_response_bytes: 5000,
                max_producer_states: 9,
                default_partitions: Some(2),
                group_initial_rebalance_delay_ms: 11,
                group_min_session_timeout_ms: 12,
                group_max_session_timeout_ms: 13,
                group_max_size: 14,
                max_groups: 15,
                consumer_heartbeat_interval_ms: 160,
                group_heartbeat_hold_ms: 17,
                group_new_member_window_ms: 18,
                consumer_reconcile_heartbeat_interval_ms: 19,
                consumer_heartbeat_hold_ms: 20,
                rebalance_fetch_hold_ms: 21,
                consumer_fetch_hold_ms: 22,
                rebalance_answer_delay_ms: 3,
            }
        );
        // A silent file changes nothing.
        let mut d = KafkaConfig {
            group_initial_rebalance_delay_ms: 0,
            ..KafkaConfig::default()
        };
        let before = d.clone();
        parse("").unwrap().apply(&mut d).unwrap();
        assert_eq!(d, before);
    }

    #[test]
    fn mistakes_are_named() {
        let e = parse("[kafka]\nmax_conections = 1\n").unwrap_err();
        assert!(e.contains("unknown field `max_conections`"), "{e}");
        assert!(e.contains("line 2"), "{e}");
        let e = parse("[kafka]\nmax_connections = \"many\"\n").unwrap_err();
        assert!(e.contains("invalid type"), "{e}");
        let e = parse("[kafka]\nmax_connections = -1\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        for (text, says) in [
            (
                "[kafka]\nmax_connections = 0\n",
                "max_connections must be at least 1",
            ),
            (
                "[kafka]\nmax_request_bytes = 10\n",
                "max_request_bytes must be at least 1024",
            ),
            (
                "[kafka]\ngroup_min_session_timeout_ms = 9\ngroup_max_session_timeout_ms = 8\n",
                "group_min_session_timeout_ms exceeds group_max_session_timeout_ms",
            ),
            (
                "[kafka]\nadvertised_addr = \"nohost\"\n",
                "advertised_addr: ",
            ),
            ("[kafka]\nlisten_addr = \"\"\n", "listen_addr is empty"),
        ] {
            let e = parse(text)
                .unwrap()
                .apply(&mut KafkaConfig::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
