//! The broker process: state shared by the request processors, background services, start and
//! shutdown.

use crate::config::{BrokerConfig, FlushMode};
use crate::group_config::{GroupTable, SubscriptionGroupConfig};
use crate::group_state::{GroupEffect, GroupState, StatePart};
use crate::hold::PullHoldTable;
use crate::metrics::BrokerMetrics;
use crate::persist::PersistError;
use crate::processor::BrokerProcessor;
use crate::topic::TopicTable;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use shoal_group::coordinator::{Coordinator, CoordinatorSnapshot};
use shoal_group::lock::QueueLockTable;
use shoal_group::membership::{ClientRegistry, GroupChange};
use shoal_net::{Connection, NetConfig, NotSupportedProcessor, RemotingClient, Server};
use shoal_proto::body::{
    ConsumeFromWhere, ConsumeType, MessageModel, RegisterBrokerBody, SubscriptionData,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::{
    NotifyConsumerIdsChangedRequestHeader, RegisterBrokerRequestHeader,
    UnregisterBrokerRequestHeader,
};
use shoal_proto::RemotingCommand;
use shoal_store::{MessageStore, RecoveryReport, StoreConfig};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// What a consumer group's heartbeat says about the group as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerMeta {
    /// Push (passive) or pull (active).
    pub consume_type: ConsumeType,
    /// Clustering or broadcasting.
    pub message_model: MessageModel,
    /// Where a new group starts.
    pub consume_from_where: ConsumeFromWhere,
}

/// The client registry type of the broker.
pub type Clients = ClientRegistry<ConsumerMeta, SubscriptionData>;

/// Errors starting a broker.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The store could not be opened.
    #[error("message store: {0}")]
    Store(#[from] shoal_store::StoreError),
    /// A config file could not be read.
    #[error(transparent)]
    Persist(#[from] PersistError),
    /// The listen address could not be bound.
    #[error("broker cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: String,
        /// Cause.
        source: shoal_net::NetError,
    },
    /// The announce address is not `ip:port`.
    #[error("announce address {0:?} is not ip:port")]
    BadAnnounceAddr(String),
    /// The TLS settings (`[tls]`) cannot be used: a certificate, key or CA file that cannot
    /// be read, a key that does not fit.
    #[error("broker {0}")]
    Tls(shoal_net::NetError),
}

/// Per (group, topic, queue): the last pull (offset and time) for consume stats.
#[derive(Debug, Clone, Copy, Default)]
pub struct PullMark {
    /// Offset the last pull asked for.
    pub offset: i64,
    /// Wall-clock time of the last pull, ms.
    pub at_ms: i64,
    /// Connection the last pull came on (its member owns the queue now).
    pub conn_id: u64,
}

/// Counters exported by GET_BROKER_RUNTIME_INFO and the metrics endpoint (registered in
/// [`BrokerMetrics::registry`]; `inc()` / `inc_by(n)` / `get()`).
#[derive(Debug)]
pub struct Counters {
    /// Messages stored by sends.
    pub msgs_put: Counter,
    /// Messages returned by pulls.
    pub msgs_got: Counter,
    /// Pulls held by long polling.
    pub pulls_held: Counter,
    /// NOTIFY_CONSUMER_IDS_CHANGED sent.
    pub notifications_sent: Counter,
    /// Sends refused with SYSTEM_BUSY (`max_inflight_sends`).
    pub sends_rejected_busy: Counter,
    /// Coordinated members removed (left, expired, fenced, replaced).
    pub coordinator_members_removed: Counter,
    /// GROUP_ASSIGNMENT_CHANGED notices sent.
    pub coordinator_notices_sent: Counter,
    /// Pulls, commits and lock requests refused for a stale member epoch.
    pub coordinator_fenced: Counter,
    /// Puts waiting for the store now (exported as `shoal_broker_sends_waiting_for_store`).
    pub inflight_puts: std::sync::atomic::AtomicUsize,
    /// Pull answers cut by `max_pull_batch_bytes` / `max_pull_batch_messages`.
    pub pulls_capped: AtomicU64,
    /// Heartbeats refused (too large, too many groups or subscriptions).
    pub heartbeats_refused: AtomicU64,
    /// Groups not auto-created because `max_subscription_groups` was reached.
    pub groups_refused: AtomicU64,
    /// Client sends to system topics refused.
    pub system_topic_sends_refused: AtomicU64,
    /// Requests refused for bad queue ids or offsets.
    pub invalid_queue_requests: AtomicU64,
    /// Requests refused by the ACL (authentication or permission).
    pub acl_refused: AtomicU64,
    /// NOTIFY_LOCK_FREED sent (rebalance engine).
    pub lock_freed_sent: Counter,
    /// Offset commits refused by the commit fence (rebalance engine).
    pub commits_fenced: Counter,
}

/// Whether a counter just reached a value worth a log line (1, 2, 4, 8, ...), so a flood of
/// refusals logs a few lines, not one per request.
pub fn worth_logging(count: u64) -> bool {
    count.is_power_of_two()
}

impl Counters {
    /// The counters, registered in `m`.
    pub fn new(m: &BrokerMetrics) -> Self {
        let r = &m.registry;
        Self {
            msgs_put: r.counter("shoal_broker_messages_put", "Messages stored by sends (all topics)."),
            msgs_got: r.counter("shoal_broker_messages_pulled", "Messages returned by pulls (all topics)."),
            pulls_held: r.counter("shoal_broker_pulls_held", "Pulls that found nothing and were held by long polling."),
            notifications_sent: r.counter(
                "shoal_broker_notifications_sent",
                "NOTIFY_CONSUMER_IDS_CHANGED requests sent to consumers (membership or subscription changes).",
            ),
            sends_rejected_busy: m.limit("max_inflight_sends"),
            coordinator_members_removed: r.counter(
                "shoal_broker_coordinator_members_removed",
                "Coordinated members removed (left, session expired, rebalance timeout, connection closed, replaced).",
            ),
            coordinator_notices_sent: r.counter(
                "shoal_broker_coordinator_notices_sent",
                "GROUP_ASSIGNMENT_CHANGED notices sent to coordinated members.",
            ),
            coordinator_fenced: r.counter(
                "shoal_broker_coordinator_fenced",
                "Pulls, offset commits and lock requests refused for a stale member epoch or a queue not assigned.",
            ),
            inflight_puts: std::sync::atomic::AtomicUsize::new(0),
            pulls_capped: AtomicU64::new(0),
            heartbeats_refused: AtomicU64::new(0),
            groups_refused: AtomicU64::new(0),
            system_topic_sends_refused: AtomicU64::new(0),
            invalid_queue_requests: AtomicU64::new(0),
            acl_refused: AtomicU64::new(0),
            lock_freed_sent: r.counter(
                "shoal_broker_lock_freed_notices_sent",
                "NOTIFY_LOCK_FREED sent to members waiting for a queue lock.",
            ),
            commits_fenced: r.counter(
                "shoal_broker_offset_commits_fenced",
                "Offset commits refused (or pull-carried offsets ignored) because the member does not hold the queue's lock.",
            ),
        }
    }
}

/// What a protocol listener of this broker (the Kafka listener) knows of its groups beyond
/// the broker's group state. Both are called without any broker lock held; they must not
/// block.
#[derive(Clone)]
pub struct ListenerGroups {
    /// Describes a classic group the listener serves (None when it does not hold it, or is
    /// gone).
    pub describe: Arc<DescribeListenerGroup>,
    /// The hosts of the listener's members of a coordinated group (member id, host as the
    /// listener saw it): the coordinator knows their client ids only.
    pub member_hosts: Arc<ListenerMemberHosts>,
}

/// The function behind [`ListenerGroups::describe`].
pub type DescribeListenerGroup =
    dyn Fn(&str) -> Option<shoal_group::classic_group::ClassicGroupDescription> + Send + Sync;

/// The function behind [`ListenerGroups::member_hosts`].
pub type ListenerMemberHosts = dyn Fn(&str) -> Vec<(String, String)> + Send + Sync;

impl std::fmt::Debug for ListenerGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ListenerGroups")
    }
}

/// State shared by every processor and service of one broker.
#[derive(Debug)]
pub struct BrokerInner {
    /// Configuration.
    pub config: BrokerConfig,
    /// The store.
    pub store: Arc<MessageStore>,
    /// Address written into stored messages and offset message ids.
    pub store_host: SocketAddr,
    /// Topic table.
    pub topics: Mutex<TopicTable>,
    /// Subscription groups.
    pub groups: Mutex<GroupTable>,
    /// The one owner of group state: membership registry, queue locks, coordinator.
    pub group_state: Arc<Mutex<GroupState>>,
    /// Consumers and producers (a view of `group_state`: the same lock).
    pub clients: StatePart<Clients>,
    /// Queue locks (a view of `group_state`: the same lock).
    pub locks: StatePart<QueueLockTable>,
    /// The coordinator state changed since it was last persisted.
    pub coordinator_dirty: std::sync::atomic::AtomicBool,
    /// Shutting down: the coordinator state was written before connections closed, and the
    /// closes of shutdown are not members leaving.
    pub coordinator_frozen: std::sync::atomic::AtomicBool,
    /// Version of the member lists sent in NOTIFY_CONSUMER_IDS_CHANGED to Shoal members
    /// ([`shoal_proto::ext::ConsumerIdsNotice`]): starts at the start time in microseconds,
    /// grows by one per list.
    pub member_list_version: AtomicU64,
    /// Coordinated mode: other brokers' queues of a topic (from the name servers) and when
    /// they were fetched.
    pub route_cache: Mutex<HashMap<String, (Vec<shoal_proto::MessageQueue>, Instant)>>,
    /// Connections of clients that heartbeated, by connection id.
    pub connections: Mutex<HashMap<u64, Connection>>,
    /// Long-polling pulls.
    pub holds: PullHoldTable,
    /// Compiled SQL92 selectors of subscriptions (bounded).
    pub selectors: crate::filter::SelectorCache,
    /// POP consumption: the lease engine, its journal, request modes.
    pub pop: crate::pop::PopService,
    /// Last pull per (group, topic, queue).
    pub pull_marks: Mutex<foldhash::HashMap<(String, String, i32), PullMark>>,
    /// Delay level durations, ms (level n = index n - 1).
    pub delay_levels_ms: Vec<u64>,
    /// Wakes the registration task (topic table changed).
    pub register_now: Notify,
    /// Wakes the delay-level services (a message was stored in the schedule topic).
    pub schedule_wakeup: Notify,
    /// Counters.
    pub counters: Counters,
    /// Metrics (the registry served at `/metrics`).
    pub metrics: BrokerMetrics,
    /// Transactional messages: remembered decisions and counters.
    pub transactions: crate::transaction::TransactionState,
    /// Daily totals and throughput windows (sampled every second), for runtime info.
    pub stats: Mutex<crate::stats::BrokerStats>,
    /// Observed rebalances of classic groups (membership changes, queue hand-overs).
    pub timeline: Mutex<crate::timeline::Timeline>,
    /// Queues whose puller changed, not yet given to the timeline (bounded).
    pub owner_changes: Mutex<std::collections::VecDeque<(String, String, i32, PullMark)>>,
    /// Counters of the listener's connections (transport limits hit, reads, writes).
    pub net_stats: Arc<shoal_net::NetStats>,
    /// Client used for name servers.
    pub namesrv_client: RemotingClient,
    /// Serializes writes of the config tables.
    pub persist_lock: Mutex<()>,
    /// The ACL, when `acl_enabled`.
    pub acl: Option<shoal_proto::acl::AccessControl>,
    /// Credentials for name server requests.
    pub namesrv_credentials: Option<shoal_proto::acl::SessionCredentials>,
    /// Classic groups of a protocol listener on this broker (Kafka's JoinGroup/SyncGroup
    /// groups), so GROUP_DESCRIBE shows them; set once by whoever starts the listener.
    pub listener_groups: std::sync::OnceLock<ListenerGroups>,
    /// Monotonic and coordinator clocks.
    pub clock: crate::group_ctx::BrokerClock,
    /// The CLUSTER property a plain send's stored properties end with (`CLUSTER`, the
    /// cluster name and the separators), written once; `None` when the name holds a
    /// separator and cannot be stored verbatim.
    pub cluster_property: Option<String>,
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl BrokerInner {
    /// Monotonic milliseconds since the broker started (for expiry and lock TTLs).
    pub fn mono_ms(&self) -> u64 {
        self.clock.mono_ms()
    }

    /// When the broker started (wall clock, ms).
    pub fn started_wall_ms(&self) -> i64 {
        self.clock.started_wall_ms()
    }

    /// The coordinator's clock: wall-clock ms at start plus monotonic time since, so it never
    /// goes backwards while the broker runs and stays comparable across restarts.
    pub fn coord_ms(&self) -> u64 {
        self.clock.coord_ms()
    }

    /// Runs `f` on the group state under its one lock, then executes the effects it left
    /// ([`crate::group_ctx::GroupHandle::with`]).
    pub fn with_group_state<R>(&self, f: impl FnOnce(&mut GroupState, u64) -> R) -> R {
        self.group_handle().with(f)
    }

    /// Executes what a group-state operation asked for (notices, logs, persistence).
    pub fn execute_group_effects(&self, effects: Vec<GroupEffect>) {
        self.group_handle().notifier().execute(effects);
    }

    /// The queues of `topic` this broker serves, as the coordinator sees them.
    pub fn topic_queues(&self, topic: &str) -> Option<Vec<shoal_proto::MessageQueue>> {
        self.routes().topic_queues(topic)
    }

    /// Every queue of `topic` in the cluster ([`crate::group_ctx::Routes::cluster_topic_queues`]).
    pub async fn cluster_topic_queues(
        &self,
        topic: &str,
    ) -> Option<Vec<shoal_proto::MessageQueue>> {
        self.routes().cluster_topic_queues(topic).await
    }

    /// A topic's queues as the coordinator allocates them without asking the name servers:
    /// this broker's own plus the other brokers' last known route.
    pub fn known_topic_queues(&self, topic: &str) -> Option<Vec<shoal_proto::MessageQueue>> {
        self.routes().known_topic_queues(topic)
    }

    /// Tells the coordinator a topic's queues (after a change of this broker's topic table).
    pub fn refresh_coordinator_topic(&self, topic: &str) {
        let queues = self.known_topic_queues(topic);
        self.with_group_state(|g, now| match queues {
            Some(q) => g.coordinator.set_topic_queues(topic, q, now),
            None => g.coordinator.remove_topic(topic, now),
        });
    }

    /// Sends NOTIFY_CONSUMER_IDS_CHANGED to every remaining member of a changed group, unless
    /// the group is broadcasting or has notifications switched off; releases the queue locks
    /// of members that left.
    pub fn apply_group_change(&self, change: &GroupChange) {
        self.with_group_state(|g, now| g.after_registry_change(change, now));
        if change.needs_notify() {
            // Pulls seen before the change belong to the previous rebalance.
            self.feed_timeline();
            let members: Vec<(u64, String)> = self
                .clients
                .lock()
                .members(&change.group)
                .into_iter()
                .map(|(c, _)| (c.conn_id, c.client_id.clone()))
                .collect();
            self.timeline.lock().membership(
                &change.group,
                members,
                change.subscription_changed,
                wall_ms(),
            );
        }
        if !change.left_client_ids.is_empty() {
            self.with_group_state(|g, _| {
                for id in &change.left_client_ids {
                    let n = g.release_client_locks(&change.group, id);
                    if n > 0 {
                        info!(group = %change.group, client = %id, locks = n, "released the queue locks of a client that left");
                    }
                }
            });
        }
        if let Some(h) = self.clients.lock().health_if_changed(&change.group) {
            if h.is_healthy() {
                info!(group = %change.group, "consumer group is consistent again");
            } else {
                warn!(group = %change.group, duplicate_client_ids = ?h.duplicate_client_ids, inconsistent_topics = ?h.inconsistent_topics,
                    "consumer group misconfigured: duplicate client ids or members subscribing differently break queue allocation");
            }
        }
        if !change.needs_notify() {
            return;
        }
        let enabled = self
            .groups
            .lock()
            .get(&change.group)
            .is_none_or(|g| g.notify_consumer_ids_changed_enable);
        let broadcasting = self
            .clients
            .lock()
            .group(&change.group)
            .is_some_and(|g| g.meta.message_model == MessageModel::Broadcasting);
        if !enabled || broadcasting {
            return;
        }
        // Shoal members (a session) get the member list with the notice when only members
        // changed (feature `memberListNotice`): they need not ask for it. The list and its
        // version are read in one critical section, so a higher version is a newer list.
        let list = (!change.subscription_changed).then(|| {
            let c = self.clients.lock();
            let shoal: std::collections::HashSet<u64> = change
                .notify_conn_ids
                .iter()
                .copied()
                .filter(|id| {
                    c.session(&change.group, *id)
                        .is_some_and(|s| s.timeout_ms.is_some())
                })
                .collect();
            let notice = shoal_proto::ext::ConsumerIdsNotice {
                consumer_id_list: c.client_ids(&change.group),
                version: self.member_list_version.fetch_add(1, Ordering::Relaxed) + 1,
            };
            (shoal, notice)
        });
        let conns: Vec<Connection> = {
            let map = self.connections.lock();
            change
                .notify_conn_ids
                .iter()
                .filter_map(|id| map.get(id).cloned())
                .collect()
        };
        let header = NotifyConsumerIdsChangedRequestHeader {
            consumer_group: change.group.clone(),
            ..Default::default()
        };
        for conn in conns {
            let mut req =
                RemotingCommand::request_with_header(rc::NOTIFY_CONSUMER_IDS_CHANGED, &header);
            if let Some((shoal, notice)) = &list {
                if shoal.contains(&conn.id()) {
                    match req.with_json_body(notice) {
                        Ok(r) => req = r,
                        Err(e) => {
                            warn!(error = %e, "member list not encoded; plain notice");
                            req = RemotingCommand::request_with_header(
                                rc::NOTIFY_CONSUMER_IDS_CHANGED,
                                &header,
                            );
                        }
                    }
                }
            }
            req.set_oneway();
            self.counters.notifications_sent.inc();
            tokio::spawn(async move {
                if let Err(e) = conn.oneway(req).await {
                    warn!(peer = %conn.peer_addr(), error = %e, "could not notify a consumer of a membership change");
                }
            });
        }
    }

    /// Tells every member of the groups that consume `topic` to rebalance now (the topic's
    /// queues changed).
    pub fn notify_consumers_of_topic(&self, topic: &str) {
        self.refresh_coordinator_topic(topic);
        let groups = self.clients.lock().groups_of_topic(topic);
        for group in groups {
            let conns: Vec<u64> = self
                .clients
                .lock()
                .members(&group)
                .into_iter()
                .map(|(c, _)| c.conn_id)
                .collect();
            self.apply_group_change(&GroupChange {
                group,
                subscription_changed: true,
                notify_conn_ids: conns,
                ..GroupChange::default()
            });
        }
    }

    /// A client connection closed: its consumers leave their groups at once.
    pub fn connection_closed(&self, conn_id: u64) {
        self.connections.lock().remove(&conn_id);
        let now = self.mono_ms();
        let changes = self.clients.lock().connection_closed(conn_id, now);
        self.with_group_state(|g, t| g.coordinator.connection_closed(conn_id, t));
        for c in &changes {
            info!(group = %c.group, clients = ?c.left_client_ids, "consumer connection closed: left the group");
            self.apply_group_change(c);
        }
    }

    /// Drops clients whose heartbeats stopped.
    pub fn expire_clients(&self) {
        let now = self.mono_ms();
        let changes = self
            .clients
            .lock()
            .expire(now, self.config.client_expiry_ms);
        for c in &changes {
            warn!(group = %c.group, clients = ?c.left_client_ids, "consumer expired: no heartbeat within the expiry time");
            self.apply_group_change(c);
        }
        self.with_group_state(|g, now| g.tick(now));
    }

    /// Persists topic and group tables; logs failures (the caller is a timer or shutdown).
    pub fn persist_configs(&self) {
        if let Err(e) = self.persist_tables_now() {
            warn!(error = %e, "could not persist the config tables");
        }
        self.persist_coordinator();
    }

    /// A subscription group, created with the defaults when auto-create is on (heartbeat,
    /// pull); see [`crate::group_ctx::SubscriptionGroups::get_or_auto_create`].
    pub fn group_or_auto_create(&self, group: &str) -> Result<SubscriptionGroupConfig, String> {
        self.subscription_groups().get_or_auto_create(group)
    }

    /// Whether the topic or group table has changes not on disk yet.
    pub fn tables_dirty(&self) -> bool {
        self.topics.lock().is_dirty() || self.groups.lock().is_dirty()
    }

    /// Makes auto-created topics and groups durable before the request that created them is
    /// acknowledged (a crash right after must not lose them: their acknowledged messages would
    /// become unreachable). Cheap when nothing changed.
    pub async fn persist_tables(self: &Arc<Self>) -> Result<(), crate::reply::Reject> {
        if !self.tables_dirty() {
            return Ok(());
        }
        let b = self.clone();
        crate::reply::blocking(move || {
            b.persist_tables_now().map_err(|e| {
                tracing::error!(error = %e, "could not persist an auto-created topic or group");
                crate::reply::Reject::new(
                    resp::SYSTEM_ERROR,
                    format!("could not persist the topic or subscription group table: {e}"),
                )
            })
        })
        .await
    }

    /// Writes the topic and group tables if they changed (blocking: temp file, fsync,
    /// rename). Writers are serialized and each writes a copy taken after the previous write
    /// finished, so a newer table is never overwritten by an older one.
    pub fn persist_tables_now(&self) -> Result<(), PersistError> {
        let _one_writer = self.persist_lock.lock();
        let topics = {
            let t = self.topics.lock();
            t.is_dirty().then(|| t.snapshot())
        };
        if let Some(snap) = topics {
            snap.write()?;
            self.topics.lock().mark_persisted(snap.changes);
        }
        let groups = {
            let g = self.groups.lock();
            g.is_dirty().then(|| g.snapshot())
        };
        if let Some(snap) = groups {
            snap.write()?;
            self.groups.lock().mark_persisted(snap.changes);
        }
        Ok(())
    }

    /// Where the coordinator's state is kept.
    pub fn coordinator_path(&self) -> std::path::PathBuf {
        self.config.data_dir.join("config").join("coordinator.json")
    }

    /// Writes the coordinator's state if it changed.
    pub fn persist_coordinator(&self) {
        if self.coordinator_frozen.load(Ordering::Relaxed)
            || !self.coordinator_dirty.swap(false, Ordering::Relaxed)
        {
            return;
        }
        let snapshot = self.group_state.lock().snapshot();
        if let Err(e) = crate::persist::write_json_atomic(&self.coordinator_path(), &snapshot) {
            self.coordinator_dirty.store(true, Ordering::Relaxed);
            warn!(error = %e, "could not persist the group coordinator state");
        }
    }

    /// Builds a REGISTER_BROKER request carrying the whole topic table.
    pub fn register_request(&self) -> RemotingCommand {
        let body = RegisterBrokerBody {
            filter_server_list: Vec::new(),
            topic_config_serialize_wrapper: self.topics.lock().wrapper(),
        };
        let bytes = shoal_proto::body::to_json_bytes(&body).unwrap_or_default();
        let header = RegisterBrokerRequestHeader {
            broker_name: self.config.broker_name.clone(),
            broker_addr: self.config.announce_addr().to_string(),
            cluster_name: self.config.cluster_name.clone(),
            ha_server_addr: self.config.announce_addr().to_string(),
            broker_id: self.config.broker_id,
            heartbeat_timeout_millis: Some(120_000),
            enable_acting_master: Some(false),
            compressed: false,
            body_crc32: shoal_proto::message::body_crc(&bytes) as i32,
            ..Default::default()
        };
        RemotingCommand::request_with_header(rc::REGISTER_BROKER, &header).with_body(bytes)
    }

    /// Registers with every name server in parallel; returns how many accepted.
    pub async fn register_all(&self) -> usize {
        let req = self.register_request();
        let mut req = req;
        if let Some(c) = &self.namesrv_credentials {
            shoal_proto::acl::sign_request(&mut req, c);
        }
        let futs = self.config.namesrv_addrs.iter().map(|addr| {
            let req = req.clone();
            async move {
                match self
                    .namesrv_client
                    .invoke(addr, req, Duration::from_secs(3))
                    .await
                {
                    Ok(r) if r.code == resp::SUCCESS => true,
                    Ok(r) => {
                        warn!(namesrv = %addr, code = r.code, remark = ?r.remark, "name server refused the registration");
                        false
                    }
                    Err(e) => {
                        warn!(namesrv = %addr, error = %e, "could not register with a name server");
                        false
                    }
                }
            }
        });
        futures::future::join_all(futs)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count()
    }

    async fn unregister_all(&self) {
        let header = UnregisterBrokerRequestHeader {
            broker_name: self.config.broker_name.clone(),
            broker_addr: self.config.announce_addr().to_string(),
            cluster_name: self.config.cluster_name.clone(),
            broker_id: self.config.broker_id,
            ..Default::default()
        };
        let mut req = RemotingCommand::request_with_header(rc::UNREGISTER_BROKER, &header);
        if let Some(c) = &self.namesrv_credentials {
            shoal_proto::acl::sign_request(&mut req, c);
        }
        let futs = self.config.namesrv_addrs.iter().map(|addr| {
            let req = req.clone();
            async move {
                if let Err(e) = self
                    .namesrv_client
                    .invoke(addr, req, Duration::from_secs(3))
                    .await
                {
                    warn!(namesrv = %addr, error = %e, "could not unregister from a name server");
                }
            }
        });
        futures::future::join_all(futs).await;
    }
}

/// A running broker.
#[derive(Debug)]
pub struct Broker {
    inner: Arc<BrokerInner>,
    server: Server,
    tasks: Vec<JoinHandle<()>>,
    recovery: RecoveryReport,
}

impl Broker {
    /// Opens the store (recovering it), loads the config tables, binds the port, registers
    /// with the name servers and starts the background services.
    pub async fn start(config: BrokerConfig) -> Result<Broker, BrokerError> {
        config.validate()?;
        let delay_levels_ms = crate::config::parse_delay_levels(&config.delay_levels)?;
        // Bind first (the announced address may depend on the port), then attach the processor
        // once the state it needs exists; requests before that are answered SYSTEM_BUSY.
        let server_tls = config.tls.server_tls().map_err(BrokerError::Tls)?;
        let namesrv_tls = config.tls.namesrv_client_tls().map_err(BrokerError::Tls)?;
        let late = Arc::new(crate::processor::LateProcessor::default());
        let server = Server::bind_with_tls(
            config.listen_addr.as_str(),
            late.clone(),
            config.net.net_config(),
            server_tls,
        )
        .await
        .map_err(|source| BrokerError::Bind {
            addr: config.listen_addr.clone(),
            source,
        })?;
        let bound = server.local_addr();
        let (inner, recovery) =
            match Self::assemble(config, bound, delay_levels_ms, server.stats(), namesrv_tls).await
            {
                Ok(parts) => parts,
                Err(e) => {
                    server.shutdown().await;
                    return Err(e);
                }
            };
        late.set(Arc::new(BrokerProcessor::new(inner.clone())));
        info!(addr = %server.local_addr(), broker = %inner.config.broker_name, "broker listening");

        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(housekeeping_loop(inner.clone())));
        tasks.push(tokio::spawn(timeline_loop(inner.clone())));
        tasks.extend(crate::schedule::start(inner.clone()));
        tasks.push(crate::transaction::service::start(inner.clone()));
        tasks.push(crate::pop::start(inner.clone()));
        let registered = inner.register_all().await;
        let everywhere = registered == inner.config.namesrv_addrs.len();
        if !everywhere {
            warn!(
                accepted = registered,
                namesrvs = inner.config.namesrv_addrs.len(),
                "not every name server accepted the first registration; retrying from {} ms, doubling up to every {} ms",
                REGISTER_RETRY_MIN.as_millis(),
                inner.config.register_interval_ms
            );
        }
        tasks.push(tokio::spawn(register_loop(inner.clone(), everywhere)));
        Ok(Broker {
            inner,
            server,
            tasks,
            recovery,
        })
    }

    /// Opens the store and config tables and builds the shared state.
    async fn assemble(
        config: BrokerConfig,
        bound: SocketAddr,
        delay_levels_ms: Vec<u64>,
        net_stats: Arc<shoal_net::NetStats>,
        namesrv_tls: Option<shoal_net::ClientTls>,
    ) -> Result<(Arc<BrokerInner>, RecoveryReport), BrokerError> {
        let mut config = config;
        if config.announce_addr.is_none() {
            config.announce_addr = Some(bound.to_string());
        }
        let acl = match (&config.acl_enabled, &config.acl_file) {
            (true, Some(path)) => {
                let acl = crate::config::load_acl(path)?;
                info!(accounts = acl.account_count(), file = %path.display(), "ACL enabled");
                Some(acl)
            }
            _ => None,
        };
        let namesrv_credentials = match (&config.namesrv_access_key, &config.namesrv_secret_key) {
            (Some(ak), Some(sk)) => Some(shoal_proto::acl::SessionCredentials::new(
                ak.clone(),
                sk.clone(),
            )),
            _ => None,
        };
        let store_host: SocketAddr = config
            .announce_addr()
            .parse()
            .map_err(|_| BrokerError::BadAnnounceAddr(config.announce_addr().to_string()))?;

        let mut store_cfg = StoreConfig::new(config.data_dir.join("store"));
        store_cfg.commit_log_segment_size = config.commit_log_segment_bytes;
        // On Linux only (the store's default elsewhere is off, and stays off).
        store_cfg.mmap_commit_log = config.mmap_commit_log && cfg!(target_os = "linux");
        store_cfg.mmap_chunk_size = config.mmap_chunk_bytes;
        store_cfg.flush_mode = match config.flush_mode {
            FlushMode::Async => shoal_store::FlushMode::Async,
            FlushMode::Sync => shoal_store::FlushMode::Sync,
        };
        store_cfg.flush_interval = Duration::from_millis(config.flush_interval_ms);
        store_cfg.sync_flush_timeout = Duration::from_millis(config.sync_flush_timeout_ms);
        store_cfg.retention = Duration::from_secs(config.retention_hours * 3600);
        store_cfg.max_message_size = config.max_message_bytes + 64 * 1024;
        store_cfg.offsets_persist_interval = Duration::from_millis(config.offset_flush_interval_ms);
        store_cfg.store_host = store_host;
        store_cfg.check_crc_on_read = config.check_crc_on_read;
        store_cfg.corrupt_record_policy = match config.corrupt_record_policy {
            crate::config::CorruptRecordPolicy::Skip => shoal_store::CorruptRecordPolicy::Skip,
            crate::config::CorruptRecordPolicy::Error => shoal_store::CorruptRecordPolicy::Error,
        };
        let (store, recovery) = tokio::task::spawn_blocking(move || MessageStore::open(store_cfg))
            .await
            .map_err(|e| {
                shoal_store::StoreError::InvalidArgument(format!("store open task failed: {e}"))
            })??;
        if recovery.truncated_bytes > 0 || recovery.abnormal_shutdown {
            warn!(report = ?recovery, "store recovered after an abnormal shutdown");
        } else {
            info!(end = recovery.commit_log_end, "store opened");
        }
        let store = Arc::new(store);

        let now = wall_ms();
        let config_dir = config.data_dir.join("config");
        let topics = TopicTable::open(
            Some(config_dir.join("topics.json")),
            delay_levels_ms.len(),
            config.auto_create_topic,
            config.default_topic_queue_nums,
            now,
        )?;
        let group_defaults = SubscriptionGroupConfig {
            retry_queue_nums: config.retry_queue_nums,
            retry_max_times: config.max_reconsume_times,
            ..SubscriptionGroupConfig::default()
        };
        let groups = GroupTable::open(
            Some(config_dir.join("subscriptionGroup.json")),
            group_defaults,
        )?;

        let metrics = BrokerMetrics::new();
        let coordinator_path = config_dir.join("coordinator.json");
        let coord_now = now.max(0) as u64;
        let mut restored = false;
        let coordinator = match crate::persist::read_json::<CoordinatorSnapshot>(&coordinator_path)?
        {
            Some(snap) => {
                info!("group coordinator state restored; epochs move forward");
                restored = true;
                Coordinator::restore(config.coordinator.clone(), snap, coord_now)
            }
            None => Coordinator::new(config.coordinator.clone()),
        };
        let group_state = Arc::new(Mutex::new(GroupState::with_coordinator(
            // Session ids never repeat across restarts: a client must not take a new session
            // for the one its locks belonged to.
            ClientRegistry::with_session_base((now.max(0) as u64).saturating_mul(1000)),
            QueueLockTable::new(config.lock_ttl_ms),
            coordinator,
        )));
        let inner = Arc::new(BrokerInner {
            store_host,
            store: store.clone(),
            topics: Mutex::new(topics),
            groups: Mutex::new(groups),
            clients: StatePart::new(group_state.clone(), |g| &mut g.clients),
            locks: StatePart::new(group_state.clone(), |g| &mut g.locks),
            group_state,
            coordinator_dirty: std::sync::atomic::AtomicBool::new(restored),
            coordinator_frozen: std::sync::atomic::AtomicBool::new(false),
            member_list_version: AtomicU64::new(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros() as u64),
            ),
            route_cache: Mutex::new(HashMap::new()),
            connections: Mutex::new(HashMap::new()),
            holds: PullHoldTable::default(),
            selectors: Default::default(),
            pop: crate::pop::PopService::open(&config).map_err(|source| {
                BrokerError::Store(shoal_store::StoreError::Io {
                    op: "open the POP journal",
                    path: config.data_dir.join("pop"),
                    source,
                })
            })?,
            pull_marks: Mutex::new(foldhash::HashMap::default()),
            delay_levels_ms,
            register_now: Notify::new(),
            schedule_wakeup: Notify::new(),
            counters: Counters::new(&metrics),
            metrics,
            stats: Mutex::new(crate::stats::BrokerStats::default()),
            transactions: crate::transaction::TransactionState::new(
                config.transaction_max_remembered_decisions,
            ),
            timeline: Mutex::new(crate::timeline::Timeline::new()),
            owner_changes: Mutex::new(std::collections::VecDeque::new()),
            net_stats,
            namesrv_client: RemotingClient::with_tls(
                NetConfig::default(),
                Arc::new(NotSupportedProcessor),
                namesrv_tls,
            ),
            persist_lock: Mutex::new(()),
            acl,
            namesrv_credentials,
            listener_groups: std::sync::OnceLock::new(),
            clock: crate::group_ctx::BrokerClock::starting_at(now),
            cluster_property: crate::send::cluster_property(&config.cluster_name),
            config,
        });
        inner.persist_configs();
        inner
            .metrics
            .registry
            .collector(crate::metrics::BrokerCollector::new(&inner));
        inner.metrics.registry.register(
            "shoal_broker_store_flush_seconds",
            "Time of one commit log fsync (the flusher thread, sync-flush group commits, shutdown).",
            inner.store.flush_latency(),
        );

        // Long polling and the delay services hear about every stored message.
        let weak = Arc::downgrade(&inner);
        store.add_arrival_listener(Arc::new(move |arrival| {
            if let Some(b) = weak.upgrade() {
                b.holds.notify(arrival);
                b.pop.on_arrival();
                if arrival.topic == shoal_proto::constants::SCHEDULE_TOPIC {
                    b.schedule_wakeup.notify_waiters();
                }
            }
        }));

        Ok((inner, recovery))
    }

    /// The address the broker listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Counters of the listener's connections: transport limits hit (backpressure pauses,
    /// idle and partial-frame closes, refused connections), reads and writes.
    pub fn net_stats(&self) -> Arc<shoal_net::NetStats> {
        self.server.stats()
    }

    /// Shared state (for tests and `shoal dev`).
    pub fn inner(&self) -> &Arc<BrokerInner> {
        &self.inner
    }

    /// What store recovery found at start.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Unregisters from the name servers, stops serving, and closes the store cleanly
    /// (offsets and config tables flushed).
    pub async fn shutdown(self) {
        self.inner.unregister_all().await;
        for t in &self.tasks {
            t.abort();
        }
        // Members stay members across a restart: write the coordinator's state before the
        // server closes their connections.
        self.inner.coordinator_dirty.store(true, Ordering::Relaxed);
        self.inner.persist_coordinator();
        self.inner.coordinator_frozen.store(true, Ordering::Relaxed);
        self.server.shutdown().await;
        self.inner.persist_configs();
        self.inner.namesrv_client.shutdown();
        let store = self.inner.store.clone();
        match tokio::task::spawn_blocking(move || store.shutdown()).await {
            Ok(Ok(())) => info!("broker stopped cleanly"),
            Ok(Err(e)) => warn!(error = %e, "store shutdown failed"),
            Err(e) => warn!(error = %e, "store shutdown task failed"),
        }
    }
}

/// First wait before registering again when a name server did not accept a registration.
const REGISTER_RETRY_MIN: Duration = Duration::from_millis(500);

/// Registers with every name server each `register_interval_ms` (and when asked to). After a
/// registration that a name server did not accept (not started yet, unreachable, refusing),
/// the next one comes sooner: 0.5 s, doubling up to the interval, so that a name server started
/// just after the broker knows it within a second instead of a whole interval later.
async fn register_loop(inner: Arc<BrokerInner>, mut everywhere: bool) {
    let interval = Duration::from_millis(inner.config.register_interval_ms.max(100));
    let mut retry = REGISTER_RETRY_MIN.min(interval);
    loop {
        let wait = if everywhere { interval } else { retry };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = inner.register_now.notified() => {}
        }
        everywhere = inner.register_all().await == inner.config.namesrv_addrs.len();
        retry = if everywhere {
            REGISTER_RETRY_MIN.min(interval)
        } else {
            (retry * 2).min(interval)
        };
    }
}

/// Feeds the rebalance timeline with who pulled each queue, and counts finished rebalances.
async fn timeline_loop(inner: Arc<BrokerInner>) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        inner.observe_pullers();
    }
}

impl BrokerInner {
    /// Records that (group, topic, queue) was pulled on a new connection (from the pull path).
    pub fn note_owner_change(&self, group: &str, topic: &str, queue_id: i32, mark: PullMark) {
        let mut q = self.owner_changes.lock();
        if q.len() >= 10_000 {
            q.pop_front();
        }
        q.push_back((group.to_string(), topic.to_string(), queue_id, mark));
    }

    /// Gives the recorded puller changes to the timeline.
    fn feed_timeline(&self) {
        let changes: Vec<_> = self.owner_changes.lock().drain(..).collect();
        if changes.is_empty() {
            return;
        }
        let mut t = self.timeline.lock();
        for (group, topic, q, mark) in changes {
            t.puller_conn(&group, &topic, q, mark.conn_id, mark.at_ms);
        }
    }

    /// One timeline step: new pullers, then convergence checks.
    pub fn observe_pullers(&self) {
        self.feed_timeline();
        let done = self.timeline.lock().tick(wall_ms());
        for (group, r) in done {
            self.metrics
                .rebalances
                .get_or_create(&[("group", group.clone()), ("cause", r.cause.clone())])
                .inc();
            if let Some(ms) = r.convergence_ms() {
                self.metrics
                    .rebalance_convergence
                    .get_or_create(&[("group", group.clone())])
                    .observe(Duration::from_millis(ms as u64));
            }
            info!(group = %group, cause = %r.cause, moves = r.moves.len(), outcome = ?r.outcome,
                convergence_ms = ?r.convergence_ms(), "rebalance observed");
        }
    }
}

async fn housekeeping_loop(inner: Arc<BrokerInner>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n: u64 = 0;
    loop {
        tick.tick().await;
        n += 1;
        inner.expire_clients();
        if inner.coordinator_dirty.load(Ordering::Relaxed) {
            let i = inner.clone();
            let _ = tokio::task::spawn_blocking(move || i.persist_coordinator()).await;
        }
        inner.stats.lock().sample(
            wall_ms(),
            inner.mono_ms(),
            inner.counters.msgs_put.get(),
            inner.counters.msgs_got.get(),
        );
        if n % 10 == 0 {
            let i = inner.clone();
            let _ = tokio::task::spawn_blocking(move || i.persist_configs()).await;
        }
    }
}
