//! Broker configuration: a TOML file, overridden by command-line flags.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// When a send is acknowledged relative to the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FlushMode {
    /// Acknowledge after the write; a flusher thread fsyncs every `flush_interval_ms`.
    #[default]
    Async,
    /// Acknowledge after fsync (group commit).
    Sync,
}

/// Everything a broker needs to start. Defaults are RocketMQ's unless noted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// Broker name (`brokerName`).
    pub broker_name: String,
    /// Cluster name (`brokerClusterName`).
    pub cluster_name: String,
    /// Broker id registered with the name servers: 0 = master. A replicated broker
    /// (`[replication]`) ignores it: it registers as 0 while master, and as the id its
    /// controller gave it while a replica.
    pub broker_id: i64,
    /// Address to listen on.
    pub listen_addr: String,
    /// Address to announce to name servers and clients (defaults to the listen address).
    pub announce_addr: Option<String>,
    /// HTTP address for `/metrics` and the dashboard (served by the `shoal` binary); none by
    /// default (`shoal dev` turns it on).
    pub http_listen_addr: Option<String>,
    /// gRPC address for RocketMQ 5 clients (`apache.rocketmq.v2.MessagingService`, served by
    /// the `shoal` binary with the listener's TLS); none by default (`shoal dev` serves
    /// 127.0.0.1:8081, RocketMQ proxy's port).
    pub grpc_listen_addr: Option<String>,
    /// gRPC: the long polling a consumer is told to use for its receives, ms (30 s; 1 s to
    /// 60 s). A PushConsumer's close waits for its receives in flight, up to this plus its
    /// request timeout.
    pub grpc_long_polling_ms: u64,
    /// Name server addresses (`host:port`), registered with in parallel.
    pub namesrv_addrs: Vec<String>,
    /// Data directory (commit log, consume queues, index, configs, offsets).
    pub data_dir: PathBuf,
    /// Flush mode.
    pub flush_mode: FlushMode,
    /// Async flush interval.
    pub flush_interval_ms: u64,
    /// How long a sync-flush append may wait for fsync before answering FLUSH_DISK_TIMEOUT.
    pub sync_flush_timeout_ms: u64,
    /// Commit log segment size in bytes (1 GiB).
    pub commit_log_segment_bytes: u64,
    /// Append to the commit log through a memory map of space reserved ahead of the writes, instead
    /// of one `pwrite` per append, as RocketMQ's `MappedFile` (off by default: the pipelined sends'
    /// p99 rises with it, see docs/benchmarks.md; Linux only, ignored elsewhere; appends of a page
    /// or more and copy-on-write file systems use `pwrite`). See docs/storage.md.
    pub mmap_commit_log: bool,
    /// Bytes reserved and mapped at a time with `mmap_commit_log` (4 MiB).
    pub mmap_chunk_bytes: u64,
    /// Retention of commit log segments, hours (72).
    pub retention_hours: u64,
    /// Largest message body accepted, bytes (4 MiB).
    pub max_message_bytes: usize,
    /// Create unknown topics on first send (`autoCreateTopicEnable`; on in `shoal dev`).
    pub auto_create_topic: bool,
    /// Create subscription groups on first heartbeat (`autoCreateSubscriptionGroup`).
    pub auto_create_subscription_group: bool,
    /// Queue count of auto-created topics.
    pub default_topic_queue_nums: i32,
    /// Interval between registrations with the name servers (30 s).
    pub register_interval_ms: u64,
    /// Expiry of a client without heartbeat (120 s).
    pub client_expiry_ms: u64,
    /// Queue lock lifetime after last renewal (60 s), for clients without a session.
    pub lock_ttl_ms: u64,
    /// Shortest session timeout a Shoal client may ask for (1 s).
    pub min_session_timeout_ms: u64,
    /// Longest session timeout a Shoal client may ask for (120 s, the channel expiry).
    pub max_session_timeout_ms: u64,
    /// Long polling on (held pulls answered on arrival).
    pub long_polling: bool,
    /// Hold time of a pull when long polling is off (1 s).
    pub short_polling_ms: u64,
    /// Delay levels (`messageDelayLevel`).
    pub delay_levels: String,
    /// Reconsume attempts before the DLQ, when the client does not say (16).
    pub max_reconsume_times: i32,
    /// Queues of `%RETRY%<group>` topics (1).
    pub retry_queue_nums: i32,
    /// Consumer offsets flushed to disk every this many ms (5 s).
    pub offset_flush_interval_ms: u64,
    /// Sends waiting for the store at once before new ones are refused with SYSTEM_BUSY
    /// (RocketMQ's send thread pool queue, 10000).
    pub max_inflight_sends: usize,
    /// Largest pull answer in bytes of message data (RocketMQ's
    /// `maxTransferBytesOnMessageInMemory`, 256 KiB); a single larger message is still served
    /// alone. The client's `maxMsgBytes` can only lower it.
    pub max_pull_batch_bytes: usize,
    /// Most messages in one pull answer (RocketMQ's `maxTransferCountOnMessageInMemory`, 32).
    pub max_pull_batch_messages: usize,
    /// Largest HEART_BEAT body accepted, bytes (1 MiB).
    pub max_heartbeat_bytes: usize,
    /// Most producer plus consumer groups one client connection may join (256).
    pub max_groups_per_client: usize,
    /// Most subscriptions (topics) of one consumer group in a heartbeat (1024).
    pub max_subscriptions_per_group: usize,
    /// Most subscription groups on the broker before auto-create (heartbeat, pull) refuses new
    /// ones (10000); groups created by an administrator are not counted against it.
    pub max_subscription_groups: usize,
    /// Check the CRC of every record a pull reads (RocketMQ's `checkCRCOnRecover`, applied to
    /// reads as well).
    pub check_crc_on_read: bool,
    /// A record whose CRC fails: `skip` (left out of pull answers, logged and counted) or
    /// `error` (the pull that reaches it is answered SYSTEM_ERROR).
    pub corrupt_record_policy: CorruptRecordPolicy,
    /// Refuse transactional (half) messages with NO_PERMISSION (`rejectTransactionMessage`).
    pub reject_transaction_message: bool,
    /// Serve SQL92 subscriptions (`enablePropertyFilter`; off by default as in RocketMQ, on in
    /// `shoal dev`): off, an SQL92 pull or CHECK_CLIENT_CONFIG is answered SYSTEM_ERROR.
    pub enable_property_filter: bool,
    /// POP: messages of one queue under invisibility lease at once per group (2000); a queue at
    /// the limit hands out nothing more until acks or lapses free room.
    pub pop_max_inflight_per_queue: usize,
    /// POP: pops and notifications held by long polling at once (10000); more are answered
    /// POLLING_FULL (209).
    pub pop_max_polling: usize,
    /// A half message without a decision is checked once it is this old, ms
    /// (`transactionTimeOut`, 6 s).
    pub transaction_timeout_ms: u64,
    /// Checks of a half message before it is discarded (`transactionCheckMax`, 15).
    pub transaction_check_max: i32,
    /// Time between two check rounds, ms (`transactionCheckInterval`, 30 s).
    pub transaction_check_interval_ms: u64,
    /// Where half messages checked `transaction_check_max` times go
    /// (`TRANS_CHECK_MAX_TIME_TOPIC`, as RocketMQ); empty: dropped (logged and counted).
    pub transaction_discard_topic: String,
    /// Transaction decisions remembered to make commits idempotent (100000); the oldest are
    /// forgotten first.
    pub transaction_max_remembered_decisions: usize,
    /// ACL on (RocketMQ `aclEnable`): every request must be signed by an account of `acl_file`
    /// (or come from a globally allowed address); refusals are NO_PERMISSION (16).
    pub acl_enabled: bool,
    /// The ACL file: TOML with the keys of RocketMQ's `plain_acl.yml`
    /// (`globalWhiteRemoteAddresses`, `[[accounts]]` with `accessKey`, `secretKey`,
    /// `whiteRemoteAddress`, `admin`, `defaultTopicPerm`, `defaultGroupPerm`, `topicPerms`,
    /// `groupPerms`). See docs/security.md.
    pub acl_file: Option<PathBuf>,
    /// Access key the broker signs its name server requests with (registration), when the name
    /// servers run with ACL.
    pub namesrv_access_key: Option<String>,
    /// Secret key for `namesrv_access_key`.
    pub namesrv_secret_key: Option<String>,
    /// The group coordinator of coordinated mode (`[coordinator]` table: session, heartbeat
    /// and rebalance timeouts, limits, default assignor).
    pub coordinator: shoal_group::coordinator::CoordinatorConfig,
    /// Transport limits of the broker's listener (`[net]` table).
    pub net: NetLimits,
    /// TLS of the broker's listener and of its connections to the name servers (`[tls]`
    /// table).
    pub tls: TlsSettings,
    /// Who may use the HTTP port (dashboard, its API, `/metrics`) and how it is served
    /// (`[http]` table; see docs/security.md).
    pub http: HttpSettings,
    /// The Kafka listener's `[kafka]` table: read and checked by the `shoal` binary, which
    /// runs the listener (the keys of `shoal_kafka::KafkaFile`; docs/configuration.md). The
    /// broker itself does not use it.
    #[serde(skip_serializing_if = "toml::Table::is_empty")]
    pub kafka: toml::Table,
    /// Replication of the broker's group (`[replication]` table; docs/ha.md): off unless
    /// `controller_addrs` names the controller.
    pub replication: crate::replication::ReplicationSettings,
}

/// The HTTP port (`[http]` in the broker's TOML file). Sign-in is required when ACL is on or a
/// `token` is set; see docs/security.md for what the port exposes in each mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// A token an operator may sign in with instead of an ACL account (at least 16
    /// characters). With ACL on, the dashboard's requests of a token session are signed as
    /// `token_account`.
    pub token: Option<String>,
    /// The ACL account (an `accessKey` of `acl_file`) a token session acts as; needed with ACL
    /// on and a `token`.
    pub token_account: Option<String>,
    /// `/metrics` takes `Authorization: Bearer <metrics_token>` when set (at least 16
    /// characters); without it `/metrics` is open (Prometheus scrapers), in every mode.
    pub metrics_token: Option<String>,
    /// TLS of the HTTP port: `disabled`, `permissive` (HTTPS and HTTP, chosen by each
    /// connection's first byte) or `enforcing` (HTTPS only), with `[tls]`'s certificate and
    /// key. Default: the mode of `[tls]`.
    pub tls_mode: Option<shoal_net::TlsMode>,
    /// A signed-in session ends after this long, seconds (28800: 8 h).
    pub session_timeout_secs: u64,
    /// Sessions held at once (256); a sign-in beyond it ends the oldest session.
    pub max_sessions: usize,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            token: None,
            token_account: None,
            metrics_token: None,
            tls_mode: None,
            session_timeout_secs: 8 * 3600,
            max_sessions: 256,
        }
    }
}

impl HttpSettings {
    fn validate(&self, b: &BrokerConfig) -> Result<(), ConfigError> {
        for (key, v) in [
            ("token", &self.token),
            ("metrics_token", &self.metrics_token),
        ] {
            if v.as_ref().is_some_and(|t| t.chars().count() < 16) {
                return Err(ConfigError(format!(
                    "http.{key} must be at least 16 characters (a guessable token is no protection)"
                )));
            }
        }
        if b.acl_enabled && self.token.is_some() && self.token_account.is_none() {
            return Err(ConfigError(
                "http.token with ACL on needs http.token_account: the ACL account whose \
                 permissions a token session has (the dashboard signs its requests as it)"
                    .into(),
            ));
        }
        if self.token_account.is_some() && self.token.is_none() {
            return Err(ConfigError(
                "http.token_account is the account of a token session: set http.token".into(),
            ));
        }
        if self.effective_tls_mode(b) != shoal_net::TlsMode::Disabled
            && (b.tls.cert_path.is_none() || b.tls.key_path.is_none())
        {
            return Err(ConfigError(
                "http.tls_mode needs tls.cert_path and tls.key_path (the HTTP port serves the \
                 listener's certificate)"
                    .into(),
            ));
        }
        if self.session_timeout_secs == 0 || self.max_sessions == 0 {
            return Err(ConfigError(
                "http.session_timeout_secs and http.max_sessions must be positive".into(),
            ));
        }
        Ok(())
    }

    /// Whether the dashboard and its API need a sign-in: ACL on, or a token set.
    pub fn sign_in_required(&self, b: &BrokerConfig) -> bool {
        b.acl_enabled || self.token.is_some()
    }

    /// The HTTP port's TLS mode: `tls_mode`, else the listener's.
    pub fn effective_tls_mode(&self, b: &BrokerConfig) -> shoal_net::TlsMode {
        self.tls_mode.unwrap_or(b.tls.mode)
    }
}

/// TLS of the broker (`[tls]` in the broker's TOML file; RocketMQ's `tls.*` settings in
/// brackets). See docs/security.md.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// The listener's mode (`tls.server.mode`): `disabled` (default), `permissive` (TLS and
    /// plaintext clients) or `enforcing` (TLS only).
    pub mode: shoal_net::TlsMode,
    /// PEM certificate chain of the listener, leaf first (`tls.server.certPath`); needed
    /// unless `mode` is `disabled`.
    pub cert_path: Option<PathBuf>,
    /// PEM private key of the listener: PKCS#8, PKCS#1 or SEC1 (`tls.server.keyPath`).
    pub key_path: Option<PathBuf>,
    /// Longest time a client may take for its handshake (and its first byte), ms (10000).
    pub handshake_timeout_ms: u64,
    /// Speak TLS to the name servers (their listeners run in permissive or enforcing mode).
    pub namesrv_tls: bool,
    /// PEM CA certificates the name servers' certificates must chain to
    /// (`tls.client.trustCertPath`); with `namesrv_tls`, this or `insecure` is needed.
    pub trust_cert_path: Option<PathBuf>,
    /// Do not verify the name servers' certificates (`tls.test.mode.enable`): encrypted but
    /// not authenticated; for tests and trusted networks.
    pub insecure: bool,
    /// Name the name servers' certificates must carry (default: the host of each address).
    pub server_name: Option<String>,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            mode: shoal_net::TlsMode::Disabled,
            cert_path: None,
            key_path: None,
            handshake_timeout_ms: shoal_net::tls::DEFAULT_HANDSHAKE_TIMEOUT.as_millis() as u64,
            namesrv_tls: false,
            trust_cert_path: None,
            insecure: false,
            server_name: None,
        }
    }
}

impl TlsSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.mode != shoal_net::TlsMode::Disabled
            && (self.cert_path.is_none() || self.key_path.is_none())
        {
            return Err(ConfigError(format!(
                "tls.mode = \"{}\" needs tls.cert_path and tls.key_path (PEM files)",
                self.mode
            )));
        }
        if self.handshake_timeout_ms == 0 {
            return Err(ConfigError(
                "tls.handshake_timeout_ms must be positive".into(),
            ));
        }
        if self.namesrv_tls && self.trust_cert_path.is_none() && !self.insecure {
            return Err(ConfigError(
                "tls.namesrv_tls needs tls.trust_cert_path (the CA of the name servers' \
                 certificates) or tls.insecure = true"
                    .into(),
            ));
        }
        if !self.namesrv_tls
            && (self.trust_cert_path.is_some() || self.insecure || self.server_name.is_some())
        {
            return Err(ConfigError(
                "tls.trust_cert_path, tls.insecure and tls.server_name are for the connections \
                 to the name servers: set tls.namesrv_tls = true"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The listener's TLS settings, certificate and key read from their files.
    ///
    /// # Errors
    /// [`shoal_net::NetError::Tls`] when a file cannot be read or the key does not fit.
    pub fn server_tls(&self) -> Result<shoal_net::ServerTls, shoal_net::NetError> {
        let tls = match (&self.cert_path, &self.key_path) {
            (Some(cert), Some(key)) => shoal_net::ServerTls::from_pem_files(self.mode, cert, key)?,
            _ => shoal_net::ServerTls::disabled(),
        };
        Ok(tls.with_handshake_timeout(std::time::Duration::from_millis(self.handshake_timeout_ms)))
    }

    /// The TLS settings of the connections to the name servers (`None`: plaintext).
    ///
    /// # Errors
    /// [`shoal_net::NetError::Tls`] when the CA file cannot be read or the name is bad.
    pub fn namesrv_client_tls(&self) -> Result<Option<shoal_net::ClientTls>, shoal_net::NetError> {
        if !self.namesrv_tls {
            return Ok(None);
        }
        let roots = match (&self.trust_cert_path, self.insecure) {
            (_, true) => shoal_net::TrustRoots::Insecure,
            (Some(p), false) => shoal_net::TrustRoots::PemFile(p.clone()),
            (None, false) => {
                return Err(shoal_net::NetError::Tls(
                    "tls.namesrv_tls needs tls.trust_cert_path or tls.insecure".into(),
                ))
            }
        };
        shoal_net::ClientTls::new(roots, self.server_name.as_deref()).map(Some)
    }
}

/// What pulls do with a record whose body CRC fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CorruptRecordPolicy {
    /// Left out of the answer (the consumer moves past it); logged and counted.
    #[default]
    Skip,
    /// The pull that reaches it is refused; the consumer stays there.
    Error,
}

/// Limits of the remoting listener, per connection unless said otherwise (`[net]` in the
/// broker's TOML file). Each bounds what a client can make the broker hold; when one is hit
/// the broker logs it and counts it (see `docs/configuration.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetLimits {
    /// Largest frame read or written, bytes including the length field (16 MiB, as Java's
    /// `frameMaxLength`).
    pub max_frame_bytes: usize,
    /// Requests of one connection being processed or held (long polling) at once; at the
    /// limit the broker stops reading that socket until one completes (4096).
    pub max_inflight_requests: usize,
    /// Answers of one connection waiting to be written; over it the broker stops reading that
    /// socket (a client that does not read its answers is slowed down, not buffered) (4 MiB).
    pub max_pending_write_bytes: usize,
    /// Connections idle this long (nothing read or written, nothing in flight) are closed;
    /// 0 = never (120, RocketMQ's `serverChannelMaxIdleTimeSeconds`).
    pub idle_timeout_secs: u64,
    /// Bytes of incomplete frames held by all connections together; a connection that would
    /// take the total over it is closed (256 MiB).
    pub max_partial_frame_bytes: usize,
    /// Connections accepted at once from one IP address (1024).
    pub max_connections_per_ip: usize,
}

impl Default for NetLimits {
    fn default() -> Self {
        let d = shoal_net::NetConfig::default();
        Self {
            max_frame_bytes: d.max_frame_len,
            max_inflight_requests: d.max_inflight_requests,
            max_pending_write_bytes: d.max_pending_write_bytes,
            idle_timeout_secs: d.idle_timeout.map_or(0, |t| t.as_secs()),
            max_partial_frame_bytes: d.max_partial_frame_bytes,
            max_connections_per_ip: d.max_connections_per_ip,
        }
    }
}

impl NetLimits {
    /// The transport settings these limits give.
    pub fn net_config(&self) -> shoal_net::NetConfig {
        shoal_net::NetConfig {
            max_frame_len: self.max_frame_bytes,
            max_inflight_requests: self.max_inflight_requests,
            max_pending_write_bytes: self.max_pending_write_bytes,
            idle_timeout: (self.idle_timeout_secs > 0)
                .then(|| std::time::Duration::from_secs(self.idle_timeout_secs)),
            max_partial_frame_bytes: self.max_partial_frame_bytes,
            max_connections_per_ip: self.max_connections_per_ip,
            ..shoal_net::NetConfig::default()
        }
    }

    /// Checks values that would make the listener misbehave (a frame limit below 64 KiB, a
    /// zero limit).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_frame_bytes < 64 * 1024 {
            return Err(ConfigError(format!(
                "net.max_frame_bytes {} is below 64 KiB",
                self.max_frame_bytes
            )));
        }
        for (key, v) in [
            ("net.max_inflight_requests", self.max_inflight_requests),
            ("net.max_pending_write_bytes", self.max_pending_write_bytes),
            ("net.max_partial_frame_bytes", self.max_partial_frame_bytes),
            ("net.max_connections_per_ip", self.max_connections_per_ip),
        ] {
            if v == 0 {
                return Err(ConfigError(format!("{key} must be positive")));
            }
        }
        Ok(())
    }
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            broker_name: "broker-a".into(),
            cluster_name: "DefaultCluster".into(),
            broker_id: 0,
            listen_addr: "127.0.0.1:10911".into(),
            announce_addr: None,
            http_listen_addr: None,
            grpc_listen_addr: None,
            grpc_long_polling_ms: 30_000,
            namesrv_addrs: vec!["127.0.0.1:9876".into()],
            data_dir: PathBuf::from("shoal-data/broker"),
            flush_mode: FlushMode::Async,
            flush_interval_ms: 500,
            sync_flush_timeout_ms: 5_000,
            commit_log_segment_bytes: 1 << 30,
            mmap_commit_log: false,
            mmap_chunk_bytes: 4 << 20,
            retention_hours: 72,
            max_message_bytes: 4 * 1024 * 1024,
            auto_create_topic: false,
            auto_create_subscription_group: true,
            default_topic_queue_nums: 4,
            register_interval_ms: 30_000,
            client_expiry_ms: 120_000,
            lock_ttl_ms: 60_000,
            min_session_timeout_ms: 1_000,
            max_session_timeout_ms: 120_000,
            long_polling: true,
            short_polling_ms: 1_000,
            delay_levels: "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h".into(),
            max_reconsume_times: 16,
            retry_queue_nums: 1,
            offset_flush_interval_ms: 5_000,
            max_inflight_sends: 10_000,
            max_pull_batch_bytes: 256 * 1024,
            max_pull_batch_messages: 32,
            max_heartbeat_bytes: 1024 * 1024,
            max_groups_per_client: 256,
            max_subscriptions_per_group: 1024,
            max_subscription_groups: 10_000,
            check_crc_on_read: true,
            corrupt_record_policy: CorruptRecordPolicy::Skip,
            reject_transaction_message: false,
            enable_property_filter: false,
            pop_max_inflight_per_queue: 2_000,
            pop_max_polling: 10_000,
            transaction_timeout_ms: 6_000,
            transaction_check_max: 15,
            transaction_check_interval_ms: 30_000,
            transaction_discard_topic: crate::transaction::CHECK_MAX_TIME_TOPIC.into(),
            transaction_max_remembered_decisions: 100_000,
            acl_enabled: false,
            acl_file: None,
            namesrv_access_key: None,
            namesrv_secret_key: None,
            coordinator: shoal_group::coordinator::CoordinatorConfig::default(),
            net: NetLimits::default(),
            tls: TlsSettings::default(),
            http: HttpSettings::default(),
            kafka: toml::Table::new(),
            replication: Default::default(),
        }
    }
}

/// A configuration that cannot be used, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid broker configuration: {0}")]
pub struct ConfigError(pub String);

impl BrokerConfig {
    /// A session timeout a client asks for, bounded by `[min_session_timeout_ms,
    /// max_session_timeout_ms]`.
    pub fn clamp_session_timeout(&self, ms: u64) -> u64 {
        ms.clamp(
            self.min_session_timeout_ms,
            self.max_session_timeout_ms.max(self.min_session_timeout_ms),
        )
    }

    /// Parses a TOML document; unknown keys are errors (a typo must not be ignored).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let cfg: BrokerConfig = toml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks values that would make the broker misbehave.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.broker_name.is_empty() {
            return Err(ConfigError("broker_name is empty".into()));
        }
        if self.cluster_name.is_empty() {
            return Err(ConfigError("cluster_name is empty".into()));
        }
        if !(1_000..=60_000).contains(&self.grpc_long_polling_ms) {
            return Err(ConfigError(format!(
                "grpc_long_polling_ms {} must be within 1000..=60000",
                self.grpc_long_polling_ms
            )));
        }
        if self.commit_log_segment_bytes < 64 * 1024 {
            return Err(ConfigError(format!(
                "commit_log_segment_bytes {} is below 64 KiB",
                self.commit_log_segment_bytes
            )));
        }
        if !(64 * 1024..=1 << 30).contains(&self.mmap_chunk_bytes) {
            return Err(ConfigError(format!(
                "mmap_chunk_bytes {} is outside 64 KiB..=1 GiB",
                self.mmap_chunk_bytes
            )));
        }
        if self.max_message_bytes == 0
            || self.max_message_bytes as u64 + 64 * 1024 > self.commit_log_segment_bytes
        {
            return Err(ConfigError(format!(
                "max_message_bytes {} must be positive and fit in a commit log segment ({} bytes)",
                self.max_message_bytes, self.commit_log_segment_bytes
            )));
        }
        if !(1..=1024).contains(&self.default_topic_queue_nums) {
            return Err(ConfigError(format!(
                "default_topic_queue_nums {} is outside 1..=1024",
                self.default_topic_queue_nums
            )));
        }
        if self.transaction_check_max < 1 {
            return Err(ConfigError(
                "transaction_check_max must be at least 1".into(),
            ));
        }
        if !self.transaction_discard_topic.is_empty() {
            crate::topic::validate_topic_name(&self.transaction_discard_topic)
                .map_err(|e| ConfigError(format!("transaction_discard_topic: {e}")))?;
        }
        // A pull answer (data + headers) must fit in a 16 MiB frame.
        const FRAME_ROOM: usize = 15 * 1024 * 1024;
        if self.max_pull_batch_bytes == 0 || self.max_pull_batch_bytes > FRAME_ROOM {
            return Err(ConfigError(format!(
                "max_pull_batch_bytes {} must be within 1..={FRAME_ROOM} (an answer must fit in a 16 MiB frame)",
                self.max_pull_batch_bytes
            )));
        }
        if self.max_message_bytes + 64 * 1024 > FRAME_ROOM {
            return Err(ConfigError(format!(
                "max_message_bytes {} is too large: a message must fit in a 16 MiB frame",
                self.max_message_bytes
            )));
        }
        if !(1..=1024).contains(&self.max_pull_batch_messages) {
            return Err(ConfigError(format!(
                "max_pull_batch_messages {} is outside 1..=1024",
                self.max_pull_batch_messages
            )));
        }
        for (name, v) in [
            ("max_heartbeat_bytes", self.max_heartbeat_bytes),
            ("max_groups_per_client", self.max_groups_per_client),
            (
                "max_subscriptions_per_group",
                self.max_subscriptions_per_group,
            ),
        ] {
            if v == 0 {
                return Err(ConfigError(format!("{name} must be positive")));
            }
        }
        if self.acl_enabled && self.acl_file.is_none() {
            return Err(ConfigError(
                "acl_enabled needs acl_file (the accounts and their permissions)".into(),
            ));
        }
        if self.acl_enabled && self.replication.enabled() && self.replication.access_key.is_none() {
            return Err(ConfigError(
                "acl_enabled with replication needs replication.access_key and \
                 replication.secret_key: an admin account of the ACL file, which the group's \
                 brokers sign their replication messages with (the ACL refuses unsigned ones)"
                    .into(),
            ));
        }
        if self.namesrv_access_key.is_some() != self.namesrv_secret_key.is_some() {
            return Err(ConfigError(
                "namesrv_access_key and namesrv_secret_key go together".into(),
            ));
        }
        parse_delay_levels(&self.delay_levels)?;
        self.net.validate()?;
        self.tls.validate()?;
        self.http.validate(self)?;
        self.replication.validate()?;
        Ok(())
    }

    /// The address announced to name servers and clients.
    pub fn announce_addr(&self) -> &str {
        self.announce_addr.as_deref().unwrap_or(&self.listen_addr)
    }
}

/// Parses RocketMQ's `messageDelayLevel` string ("1s 5s 10s 30s 1m ... 2h") into milliseconds
/// (see [`shoal_proto::constants::parse_delay_levels`]; `ms` is accepted too). Empty is an error.
pub(crate) fn parse_delay_levels(text: &str) -> Result<Vec<u64>, ConfigError> {
    let levels = shoal_proto::constants::parse_delay_levels(text)
        .map_err(|e| ConfigError(format!("delay_levels: {e}")))?;
    if levels.is_empty() {
        return Err(ConfigError("delay_levels is empty".into()));
    }
    Ok(levels)
}

/// Reads an ACL file (TOML with the keys of RocketMQ's `plain_acl.yml`) and compiles it.
pub fn load_acl(path: &std::path::Path) -> Result<shoal_proto::acl::AccessControl, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("cannot read ACL file {}: {e}", path.display())))?;
    parse_acl(&text).map_err(|e| ConfigError(format!("ACL file {}: {e}", path.display())))
}

/// Reads an ACL file without compiling it (the name server takes the parsed form); checks it
/// compiles.
pub fn read_acl_config(
    path: &std::path::Path,
) -> Result<shoal_proto::acl::PlainAclConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("cannot read ACL file {}: {e}", path.display())))?;
    let cfg: shoal_proto::acl::PlainAclConfig = toml::from_str(&text)
        .map_err(|e| ConfigError(format!("ACL file {}: {e}", path.display())))?;
    shoal_proto::acl::AccessControl::new(&cfg)
        .map_err(|e| ConfigError(format!("ACL file {}: {e}", path.display())))?;
    Ok(cfg)
}

/// The name server's configuration file (`shoal namesrv --config FILE`, TOML): the limits of
/// pushed routes, and the `[net]` table, with the broker's keys, defaults and checks. Unknown
/// keys are errors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NamesrvFile {
    /// Route watches (connection, topic) of Shoal clients held at most; over it a watch is
    /// refused (the client keeps its periodic route poll) and counted in
    /// `shoal_namesrv_route_watch_refused_total`. 0 turns pushed routes off.
    pub max_route_watches: usize,
    /// Topics one client connection may watch.
    pub max_route_watches_per_connection: usize,
    /// Transport limits of the name server's listener.
    pub net: NetLimits,
}

impl Default for NamesrvFile {
    /// `shoal_namesrv::server::DEFAULT_MAX_ROUTE_WATCHES` and
    /// `DEFAULT_MAX_ROUTE_WATCHES_PER_CONNECTION` (a test checks they agree).
    fn default() -> Self {
        Self {
            max_route_watches: 100_000,
            max_route_watches_per_connection: 1_000,
            net: NetLimits::default(),
        }
    }
}

impl NamesrvFile {
    /// Parses and checks a name server configuration document.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let cfg: NamesrvFile = toml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        cfg.net.validate()?;
        Ok(cfg)
    }

    /// Reads and checks a name server configuration file; the error names the file.
    pub fn read(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
        Self::from_toml(&text).map_err(|e| ConfigError(format!("{}: {}", path.display(), e.0)))
    }
}

/// Parses and compiles ACL TOML text.
pub(crate) fn parse_acl(text: &str) -> Result<shoal_proto::acl::AccessControl, String> {
    let cfg: shoal_proto::acl::PlainAclConfig = toml::from_str(text).map_err(|e| e.to_string())?;
    shoal_proto::acl::AccessControl::new(&cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namesrv_file_takes_net_limits_and_refuses_unknown_keys() {
        let f = NamesrvFile::from_toml("[net]\nmax_connections_per_ip = 2\n").unwrap();
        assert_eq!(f.net.max_connections_per_ip, 2);
        assert_eq!(f.net.net_config().max_connections_per_ip, 2);
        assert_eq!(
            f.net.idle_timeout_secs,
            NetLimits::default().idle_timeout_secs
        );
        assert_eq!(NamesrvFile::from_toml("").unwrap(), NamesrvFile::default());
        let d = NamesrvFile::default();
        assert_eq!(
            d.max_route_watches,
            shoal_namesrv::server::DEFAULT_MAX_ROUTE_WATCHES
        );
        assert_eq!(
            d.max_route_watches_per_connection,
            shoal_namesrv::server::DEFAULT_MAX_ROUTE_WATCHES_PER_CONNECTION
        );
        let f =
            NamesrvFile::from_toml("max_route_watches = 5\nmax_route_watches_per_connection = 2\n")
                .unwrap();
        assert_eq!(
            (f.max_route_watches, f.max_route_watches_per_connection),
            (5, 2)
        );
        let e = NamesrvFile::from_toml("[net]\nmax_conections_per_ip = 2\n").unwrap_err();
        assert!(e.0.contains("max_conections_per_ip"), "{e}");
        let e = NamesrvFile::from_toml("[net]\nmax_inflight_requests = 0\n").unwrap_err();
        assert!(e.0.contains("net.max_inflight_requests"), "{e}");
        assert!(NamesrvFile::from_toml("listen = \"x\"\n").is_err());
    }

    #[test]
    fn default_delay_levels() {
        let l = parse_delay_levels(&BrokerConfig::default().delay_levels).unwrap();
        assert_eq!(l.len(), 18);
        assert_eq!(l[0], 1_000);
        assert_eq!(l[4], 60_000);
        assert_eq!(l[17], 7_200_000);
        assert!(parse_delay_levels("1x").is_err());
        assert!(parse_delay_levels("1\u{e9}").is_err());
        assert!(parse_delay_levels("s").is_err());
        assert_eq!(parse_delay_levels("20ms 1s").unwrap(), vec![20, 1_000]);
        assert!(parse_delay_levels("").is_err());
    }

    #[test]
    fn toml_overrides_and_rejects_typos() {
        let c = BrokerConfig::from_toml("broker_name = \"b1\"\nflush_mode = \"sync\"\n").unwrap();
        assert_eq!(c.broker_name, "b1");
        assert_eq!(c.flush_mode, FlushMode::Sync);
        assert_eq!(c.cluster_name, "DefaultCluster");
        let e = BrokerConfig::from_toml("brokr_name = \"b1\"").unwrap_err();
        assert!(e.0.contains("brokr_name"), "{e}");
        assert!(BrokerConfig::from_toml("max_message_bytes = 0").is_err());
        assert!(BrokerConfig::from_toml("grpc_long_polling_ms = 500").is_err());
        assert_eq!(
            BrokerConfig::from_toml("grpc_long_polling_ms = 5000")
                .unwrap()
                .grpc_long_polling_ms,
            5_000
        );
    }

    #[test]
    fn mmap_commit_log_keys() {
        let d = BrokerConfig::default();
        assert!(!d.mmap_commit_log);
        assert_eq!(d.mmap_chunk_bytes, 4 << 20);
        let c = BrokerConfig::from_toml(
            "mmap_commit_log = true
mmap_chunk_bytes = 1048576
",
        )
        .unwrap();
        assert!(c.mmap_commit_log);
        assert_eq!(c.mmap_chunk_bytes, 1 << 20);
        assert!(BrokerConfig::from_toml("mmap_chunk_bytes = 4096").is_err());
    }

    #[test]
    fn net_limits_from_toml() {
        let c =
            BrokerConfig::from_toml("[net]\nidle_timeout_secs = 0\nmax_inflight_requests = 8\n")
                .unwrap();
        let n = c.net.net_config();
        assert_eq!(n.idle_timeout, None);
        assert_eq!(n.max_inflight_requests, 8);
        assert_eq!(
            BrokerConfig::default().net.net_config(),
            shoal_net::NetConfig::default()
        );
        assert!(BrokerConfig::from_toml("[net]\nmax_inflight_requests = 0\n").is_err());
        assert!(BrokerConfig::from_toml("[net]\nidle_timeout = 3\n").is_err());
    }

    #[test]
    fn tls_table_from_toml() {
        let c = BrokerConfig::from_toml(
            "[tls]\nmode = \"enforcing\"\ncert_path = \"/etc/shoal/broker.pem\"\n\
             key_path = \"/etc/shoal/broker.key\"\nnamesrv_tls = true\n\
             trust_cert_path = \"/etc/shoal/ca.pem\"\n",
        )
        .unwrap();
        assert_eq!(c.tls.mode, shoal_net::TlsMode::Enforcing);
        assert_eq!(c.tls.handshake_timeout_ms, 10_000);
        assert!(c.tls.namesrv_tls);
        // Missing files are reported when the settings are loaded, naming the file.
        let e = c.tls.server_tls().unwrap_err().to_string();
        assert!(e.contains("/etc/shoal/broker.pem"), "{e}");
        let e = c.tls.namesrv_client_tls().unwrap_err().to_string();
        assert!(e.contains("/etc/shoal/ca.pem"), "{e}");
        // Default: plaintext both ways.
        let d = TlsSettings::default();
        assert_eq!(d.server_tls().unwrap().mode(), shoal_net::TlsMode::Disabled);
        assert_eq!(d.namesrv_client_tls().unwrap(), None);

        for (bad, says) in [
            ("[tls]\nmode = \"permissive\"\n", "needs tls.cert_path"),
            ("[tls]\nmode = \"strict\"\n", "strict"),
            ("[tls]\nnamesrv_tls = true\n", "tls.trust_cert_path"),
            ("[tls]\ninsecure = true\n", "set tls.namesrv_tls = true"),
            ("[tls]\nhandshake_timeout_ms = 0\n", "positive"),
            ("[tls]\ncert = \"x\"\n", "cert"),
        ] {
            let e = BrokerConfig::from_toml(bad).unwrap_err();
            assert!(e.0.contains(says), "{bad}: {e}");
        }
    }
}
