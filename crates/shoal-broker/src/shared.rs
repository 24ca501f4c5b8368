//! What the request handlers and background services of one broker share: the owners of its
//! state (each with private fields behind one short lock, or lock-free), its configuration and
//! its store. `docs/architecture.md` lists which owner holds which state.
//!
//! | owner | state |
//! |---|---|
//! | [`Topics`] | the topic table (auto-creation; every change wakes the registration) |
//! | [`SubscriptionGroups`] | the subscription-group table |
//! | [`Groups`] | registry, queue locks, coordinator ([`shoal_group::state::GroupState`]) and their effects |
//! | [`Connections`] | client connections to call back on |
//! | [`PullHoldTable`] | long-polling pulls |
//! | `SelectorCache` | compiled SQL92 selectors |
//! | `PopService` | POP leases, their journal, request modes |
//! | [`Observer`] | pull marks and the rebalance timeline |
//! | [`NameServers`] | registration, other brokers' routes |
//! | [`TransactionState`] | transaction decisions and counters |
//! | [`Stats`] | runtime-info windows |
//! | `MessageStore` | messages, consume queues, offsets, delay progress (shoal-store) |

use crate::clock::{wall_ms, BrokerClock};
use crate::config::BrokerConfig;
use crate::connections::Connections;
use crate::group_ctx::{GroupCtx, Routes};
use crate::groups::Groups;
use crate::hold::PullHoldTable;
use crate::listener::ListenerGroups;
use crate::metrics::{BrokerMetrics, Counters};
use crate::namesrv::NameServers;
use crate::observe::Observer;
use crate::persist::PersistError;
use crate::reply::Reject;
use crate::stats::Stats;
use crate::sub_groups::SubscriptionGroups;
use crate::topics::Topics;
use crate::transaction::TransactionState;
use parking_lot::Mutex;
use shoal_proto::body::RegisterBrokerBody;
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::{RegisterBrokerRequestHeader, UnregisterBrokerRequestHeader};
use shoal_proto::RemotingCommand;
use shoal_store::MessageStore;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::Notify;
use tracing::{info, warn};

/// The state owners, configuration and store of one broker. See the
/// [module documentation](self).
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: BrokerConfig,
    pub(crate) store: Arc<MessageStore>,
    /// Address written into stored messages and offset message ids.
    pub(crate) store_host: SocketAddr,
    pub(crate) topics: Topics,
    pub(crate) sub_groups: Arc<SubscriptionGroups>,
    pub(crate) groups: Groups,
    pub(crate) connections: Arc<Connections>,
    pub(crate) holds: PullHoldTable,
    /// Compiled SQL92 selectors of subscriptions (bounded).
    pub(crate) selectors: crate::selectors::SelectorCache,
    /// POP consumption: the lease engine, its journal, request modes.
    pub(crate) pop: crate::pop::PopService,
    pub(crate) observer: Arc<Observer>,
    pub(crate) namesrv: NameServers,
    pub(crate) transactions: TransactionState,
    pub(crate) stats: Stats,
    pub(crate) counters: Arc<Counters>,
    pub(crate) metrics: BrokerMetrics,
    /// Counters of the listener's connections (transport limits hit, reads, writes).
    pub(crate) net_stats: Arc<shoal_net::NetStats>,
    /// The ACL, when `acl_enabled`.
    pub(crate) acl: Option<shoal_proto::acl::AccessControl>,
    pub(crate) clock: BrokerClock,
    /// The CLUSTER property a plain send's stored properties end with, written once; `None`
    /// when the cluster name holds a separator and cannot be stored verbatim.
    pub(crate) cluster_property: Option<String>,
    /// Delay level durations, ms (level n = index n - 1).
    pub(crate) delay_levels_ms: Vec<u64>,
    /// Wakes the delay-level services (a message was stored in the schedule topic).
    pub(crate) schedule_wakeup: Notify,
    /// Classic groups of a protocol listener on this broker (Kafka's JoinGroup/SyncGroup
    /// groups), so GROUP_DESCRIBE shows them; set once by whoever starts the listener.
    pub(crate) listener_groups: OnceLock<ListenerGroups>,
    /// Where transaction checks go when no remoting producer of the group is connected (a
    /// protocol front end's producers); set once by whoever starts the front end.
    pub(crate) transaction_checker: OnceLock<crate::transaction::front::TransactionChecker>,
    /// Replication of the broker's group, when `[replication]` names a controller; set once
    /// at start, before requests are served.
    pub(crate) replication: OnceLock<Arc<crate::replication::Replication>>,
    /// The Kafka listener this broker runs, named in its registrations so that every
    /// broker's listener can serve the whole cluster; set once by whoever starts it.
    pub(crate) kafka_listener: OnceLock<shoal_proto::body::KafkaListener>,
    /// Serializes writes of the config tables.
    persist_lock: Mutex<()>,
}

/// The parts [`Shared::new`] puts together.
#[derive(Debug)]
pub(crate) struct SharedParts {
    pub(crate) pop: crate::pop::PopService,
    pub(crate) config: BrokerConfig,
    pub(crate) store: Arc<MessageStore>,
    pub(crate) store_host: SocketAddr,
    pub(crate) topics: Topics,
    pub(crate) sub_groups: Arc<SubscriptionGroups>,
    pub(crate) groups: Groups,
    pub(crate) connections: Arc<Connections>,
    pub(crate) observer: Arc<Observer>,
    pub(crate) namesrv: NameServers,
    pub(crate) counters: Arc<Counters>,
    pub(crate) metrics: BrokerMetrics,
    pub(crate) net_stats: Arc<shoal_net::NetStats>,
    pub(crate) acl: Option<shoal_proto::acl::AccessControl>,
    pub(crate) clock: BrokerClock,
    pub(crate) delay_levels_ms: Vec<u64>,
    pub(crate) cluster_property: Option<String>,
}

impl Shared {
    pub(crate) fn new(p: SharedParts) -> Self {
        Self {
            cluster_property: p.cluster_property,
            transactions: TransactionState::new(p.config.transaction_max_remembered_decisions),
            config: p.config,
            store: p.store,
            store_host: p.store_host,
            topics: p.topics,
            sub_groups: p.sub_groups,
            groups: p.groups,
            connections: p.connections,
            holds: PullHoldTable::default(),
            selectors: Default::default(),
            pop: p.pop,
            observer: p.observer,
            namesrv: p.namesrv,
            stats: Stats::default(),
            counters: p.counters,
            metrics: p.metrics,
            net_stats: p.net_stats,
            acl: p.acl,
            clock: p.clock,
            delay_levels_ms: p.delay_levels_ms,
            schedule_wakeup: Notify::new(),
            listener_groups: OnceLock::new(),
            transaction_checker: OnceLock::new(),
            replication: OnceLock::new(),
            kafka_listener: OnceLock::new(),
            persist_lock: Mutex::new(()),
        }
    }

    /// Monotonic milliseconds since the broker started.
    pub(crate) fn mono_ms(&self) -> u64 {
        self.clock.mono_ms()
    }

    /// When the broker started (wall clock, ms).
    pub(crate) fn started_wall_ms(&self) -> i64 {
        self.clock.started_wall_ms()
    }

    /// The topic routes as the coordinator sees them.
    pub(crate) fn routes(&self) -> Routes<'_> {
        Routes {
            topics: &self.topics,
            namesrv: &self.namesrv,
            broker_name: &self.config.broker_name,
        }
    }

    /// What the group handlers get.
    pub(crate) fn group_ctx(&self) -> GroupCtx<'_> {
        GroupCtx {
            groups: &self.groups,
            config: &self.config,
            store: &self.store,
            counters: &self.counters,
            routes: self.routes(),
            sub_groups: &self.sub_groups,
            connections: &self.connections,
            listener_groups: &self.listener_groups,
        }
    }

    /// A topic's queues changed (created, resized, deleted): the coordinator allocates the
    /// new set and every member of the groups that consume it rebalances now.
    pub(crate) fn topic_changed(&self, topic: &str) {
        let queues = self.routes().known_topic_queues(topic);
        self.groups
            .with(|g, now| g.handle_topic_changed(now, topic, queues));
    }

    /// A client connection closed: its consumers leave their groups at once.
    pub(crate) fn connection_closed(&self, conn_id: u64) {
        self.connections.forget(conn_id);
        let changes = self
            .groups
            .with(|g, now| g.handle_connection_closed(now, conn_id));
        for c in &changes {
            info!(group = %c.group, clients = ?c.left_client_ids, "consumer connection closed: left the group");
        }
    }

    /// The group state's timers: expired clients leave, the coordinator's timeouts run.
    pub(crate) fn group_timers(&self) {
        let changes = self.groups.with(|g, now| g.handle_timeout(now));
        for c in &changes {
            warn!(group = %c.group, clients = ?c.left_client_ids, "consumer expired: no heartbeat within the expiry time");
        }
    }

    /// Persists topic and group tables and the coordinator; logs failures (the caller is a
    /// timer or shutdown).
    pub(crate) fn persist_configs(&self) {
        if let Err(e) = self.persist_tables_now() {
            warn!(error = %e, "could not persist the config tables");
        }
        self.groups.persist_if_dirty();
    }

    /// Whether the topic or group table has changes not on disk yet.
    pub(crate) fn tables_dirty(&self) -> bool {
        self.topics.is_dirty() || self.sub_groups.is_dirty()
    }

    /// Makes auto-created topics and groups durable before the request that created them is
    /// acknowledged (a crash right after must not lose them: their acknowledged messages would
    /// become unreachable). Cheap when nothing changed.
    pub(crate) async fn persist_tables(self: &Arc<Self>) -> Result<(), Reject> {
        if !self.tables_dirty() {
            return Ok(());
        }
        let b = self.clone();
        crate::reply::blocking(move || {
            b.persist_tables_now().map_err(|e| {
                tracing::error!(error = %e, "could not persist an auto-created topic or group");
                Reject::new(
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
    pub(crate) fn persist_tables_now(&self) -> Result<(), PersistError> {
        let _one_writer = self.persist_lock.lock();
        if let Some(snap) = self.topics.snapshot_if_dirty() {
            snap.write()?;
            self.topics.mark_persisted(snap.changes);
        }
        if let Some(snap) = self.sub_groups.snapshot_if_dirty() {
            snap.write()?;
            self.sub_groups.mark_persisted(snap.changes);
        }
        Ok(())
    }

    /// Whether this broker writes its own log: always, unless it is a replica of a group
    /// (then only while master, once it took over its log's metadata: delay-level progress,
    /// the transaction checker's offsets and decisions). The services that write (delay
    /// levels, transaction checks) wait while it does not.
    pub(crate) fn writes_log(&self) -> bool {
        self.replication.get().is_none_or(|r| r.serves_as_master())
    }

    /// The `brokerId` this broker registers as: the configured one, or, in a replicated
    /// group, 0 while master and the controller's id while a replica (none before it has one).
    pub(crate) fn route_broker_id(&self) -> Option<i64> {
        match self.replication.get() {
            Some(r) => r.route_broker_id(),
            None => Some(self.config.broker_id),
        }
    }

    /// Builds a REGISTER_BROKER request carrying the whole topic table, as `broker_id`.
    pub(crate) fn register_request(&self, broker_id: i64) -> RemotingCommand {
        let body = RegisterBrokerBody {
            filter_server_list: Vec::new(),
            topic_config_serialize_wrapper: self.topics.wrapper(),
        };
        let bytes = shoal_proto::body::to_json_bytes(&body).unwrap_or_default();
        let header = RegisterBrokerRequestHeader {
            broker_name: self.config.broker_name.clone(),
            broker_addr: self.config.announce_addr().to_string(),
            cluster_name: self.config.cluster_name.clone(),
            ha_server_addr: self.config.announce_addr().to_string(),
            broker_id,
            heartbeat_timeout_millis: Some(120_000),
            enable_acting_master: Some(false),
            compressed: false,
            body_crc32: shoal_proto::message::body_crc(&bytes) as i32,
            ..Default::default()
        };
        let mut req =
            RemotingCommand::request_with_header(rc::REGISTER_BROKER, &header).with_body(bytes);
        if let Some(k) = self.kafka_listener.get() {
            shoal_proto::kafka_cluster::announce(&mut req, k.node_id, &k.addr);
            if let Some((epoch, in_sync)) = self.replication.get().and_then(|r| r.leadership()) {
                let epoch = i32::try_from(epoch).unwrap_or(i32::MAX);
                shoal_proto::kafka_cluster::announce_leadership(&mut req, epoch, &in_sync);
            }
        }
        req
    }

    /// Registers with every name server in parallel; returns how many accepted.
    pub(crate) async fn register_all(&self) -> usize {
        let Some(id) = self.route_broker_id() else {
            // A replica without an id yet is in no route.
            return 0;
        };
        self.namesrv
            .to_all(self.register_request(id), "registration")
            .await
    }

    /// Unregisters from every name server.
    pub(crate) async fn unregister_all(&self) {
        let header = UnregisterBrokerRequestHeader {
            broker_name: self.config.broker_name.clone(),
            broker_addr: self.config.announce_addr().to_string(),
            cluster_name: self.config.cluster_name.clone(),
            broker_id: self.route_broker_id().unwrap_or(self.config.broker_id),
            ..Default::default()
        };
        let req = RemotingCommand::request_with_header(rc::UNREGISTER_BROKER, &header);
        self.namesrv.to_all(req, "unregistration").await;
    }

    /// Closes rebalances of the timeline that converged or gave up, and counts them.
    pub(crate) fn observe_rebalances(&self) {
        for (group, r) in self.observer.tick(wall_ms()) {
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
