//! The broker process: start (the store, the config tables, the state owners of
//! [`crate::shared`]), the background loops (registration, group timers, housekeeping, the
//! rebalance timeline, delay levels, transaction checks) and shutdown.

use crate::clock::{wall_ms, BrokerClock};
use crate::config::{BrokerConfig, FlushMode};
use crate::connections::Connections;
use crate::group_config::{GroupTable, SubscriptionGroupConfig};
use crate::groups::{Groups, GroupsParts};
use crate::metrics::{BrokerMetrics, Counters};
use crate::namesrv::NameServers;
use crate::observe::Observer;
use crate::persist::PersistError;
use crate::processor::BrokerProcessor;
use crate::shared::{Shared, SharedParts};
use crate::sub_groups::SubscriptionGroups;
use crate::topic::TopicTable;
use crate::topics::Topics;
use shoal_group::coordinator::CoordinatorSnapshot;
use shoal_group::state::{GroupState, GroupStateConfig};
use shoal_net::Server;
use shoal_store::{MessageStore, RecoveryReport, StoreConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::task::JoinHandle;
use tracing::{info, warn};

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
    /// Replication (`[replication]`) could not start: its member file or the store refused.
    #[error("replication: {0}")]
    Replication(String),
}

/// A running broker.
#[derive(Debug)]
pub struct Broker {
    shared: Arc<Shared>,
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
        let mut config = config;
        if config.announce_addr.is_none() {
            config.announce_addr = Some(bound.to_string());
        }
        let assembled = match open_store(&config).await {
            Ok((store, recovery)) => {
                let parts = Assembly {
                    config,
                    store,
                    delay_levels_ms,
                    net_stats: server.stats(),
                    namesrv_tls,
                    clock: BrokerClock::starting_at(wall_ms()),
                    sink: None,
                };
                assemble(parts).map(|shared| (shared, recovery))
            }
            Err(e) => Err(e),
        };
        let (shared, recovery) = match assembled {
            Ok(parts) => parts,
            Err(e) => {
                server.shutdown().await;
                return Err(e);
            }
        };
        let mut tasks = Vec::new();
        if shared.config.replication.enabled() {
            let started = crate::replication::start(
                &shared.config.replication,
                &shared.config.broker_name,
                shared
                    .config
                    .replication
                    .advertised_addr
                    .as_deref()
                    .unwrap_or(shared.config.announce_addr()),
                &shared.config.data_dir,
                shared.store.clone(),
                shared
                    .config
                    .tls
                    .namesrv_client_tls()
                    .map_err(BrokerError::Tls)?,
                shared.config.flush_mode == FlushMode::Sync,
            );
            match started {
                Ok((replication, task)) => {
                    let _ = shared.replication.set(replication);
                    tasks.push(task);
                }
                Err(e) => {
                    server.shutdown().await;
                    return Err(BrokerError::Replication(e.to_string()));
                }
            }
        }
        late.set(Arc::new(BrokerProcessor::new(shared.clone())));
        info!(addr = %server.local_addr(), broker = %shared.config.broker_name, "broker listening");

        tasks.extend([
            tokio::spawn(housekeeping_loop(shared.clone())),
            tokio::spawn(group_timer_loop(shared.clone())),
            tokio::spawn(timeline_loop(shared.clone())),
            tokio::spawn(crate::route_notices::route_notice_loop(shared.clone())),
        ]);
        tasks.extend(crate::schedule::start(shared.clone()));
        tasks.push(crate::transaction::service::start(shared.clone()));
        tasks.push(crate::pop::revive::start(shared.clone()));
        if let Some(r) = shared.replication.get() {
            tasks.push(crate::replication::start_metadata(
                shared.clone(),
                r.clone(),
            ));
            tasks.push(crate::replication::start_forwarding_commits(
                shared.clone(),
                r.clone(),
            ));
        }
        let registered = shared.register_all().await;
        // A replica without a broker id yet registers once the controller gives it one (its
        // role change wakes the registration).
        let everywhere = registered == shared.namesrv.count() || shared.route_broker_id().is_none();
        if !everywhere {
            warn!(
                accepted = registered,
                namesrvs = shared.namesrv.count(),
                "not every name server accepted the first registration; retrying from {} ms, doubling up to every {} ms",
                REGISTER_RETRY_MIN.as_millis(),
                shared.config.register_interval_ms
            );
        }
        tasks.push(tokio::spawn(register_loop(shared.clone(), everywhere)));
        Ok(Broker {
            shared,
            server,
            tasks,
            recovery,
        })
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

    /// The broker's API for the processes and listeners built around it (the `shoal`
    /// binary's HTTP port and dashboard, the Kafka listener).
    pub fn api(&self) -> crate::api::BrokerApi {
        crate::api::BrokerApi::new(self.shared.clone())
    }

    /// What store recovery found at start.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Unregisters from the name servers, stops serving, and closes the store cleanly
    /// (offsets and config tables flushed).
    pub async fn shutdown(self) {
        self.shared.unregister_all().await;
        for t in &self.tasks {
            t.abort();
        }
        // Members stay members across a restart: write the coordinator's state before the
        // server closes their connections.
        self.shared.groups.freeze();
        self.server.shutdown().await;
        self.shared.persist_configs();
        self.shared.namesrv.shutdown();
        let store = self.shared.store.clone();
        match tokio::task::spawn_blocking(move || store.shutdown()).await {
            Ok(Ok(())) => info!("broker stopped cleanly"),
            Ok(Err(e)) => warn!(error = %e, "store shutdown failed"),
            Err(e) => warn!(error = %e, "store shutdown task failed"),
        }
    }
}

/// Opens the store under the broker's data directory, recovering it.
pub(crate) async fn open_store(
    config: &BrokerConfig,
) -> Result<(Arc<MessageStore>, RecoveryReport), BrokerError> {
    let store_host = store_host(config)?;
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
    // A replica of a group: consumers see nothing above the confirmed offset.
    store_cfg.replicated = config.replication.enabled();
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
    Ok((Arc::new(store), recovery))
}

/// The address written into stored messages (the announced one).
fn store_host(config: &BrokerConfig) -> Result<SocketAddr, BrokerError> {
    config
        .announce_addr()
        .parse()
        .map_err(|_| BrokerError::BadAnnounceAddr(config.announce_addr().to_string()))
}

/// What [`assemble`] builds a broker's shared state from.
pub(crate) struct Assembly {
    pub(crate) config: BrokerConfig,
    pub(crate) store: Arc<MessageStore>,
    pub(crate) delay_levels_ms: Vec<u64>,
    pub(crate) net_stats: Arc<shoal_net::NetStats>,
    pub(crate) namesrv_tls: Option<shoal_net::ClientTls>,
    pub(crate) clock: BrokerClock,
    /// Where notices to clients go; `None`: over the clients' connections.
    pub(crate) sink: Option<Arc<dyn crate::connections::NoticeSink>>,
}

/// Loads the config tables and the coordinator's state and builds the state owners around
/// an open store.
pub(crate) fn assemble(a: Assembly) -> Result<Arc<Shared>, BrokerError> {
    let config = a.config;
    let store_host = store_host(&config)?;
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
    let now = a.clock.started_wall_ms();
    let config_dir = config.data_dir.join("config");
    let topics = TopicTable::open(
        Some(config_dir.join("topics.json")),
        a.delay_levels_ms.len(),
        config.auto_create_topic,
        config.default_topic_queue_nums,
        now,
    )?;
    let group_defaults = SubscriptionGroupConfig {
        retry_queue_nums: config.retry_queue_nums,
        retry_max_times: config.max_reconsume_times,
        ..SubscriptionGroupConfig::default()
    };
    let sub_groups = Arc::new(SubscriptionGroups::new(
        GroupTable::open(
            Some(config_dir.join("subscriptionGroup.json")),
            group_defaults,
        )?,
        config.auto_create_subscription_group,
        config.max_subscription_groups,
    ));

    let metrics = BrokerMetrics::new();
    let counters = Arc::new(Counters::new(&metrics));
    let coordinator_path = config_dir.join("coordinator.json");
    let state_config = GroupStateConfig {
        client_expiry_ms: config.client_expiry_ms,
        lock_ttl_ms: config.lock_ttl_ms,
        coordinator: config.coordinator.clone(),
        // Session ids never repeat across restarts: a client must not take a new session for
        // the one its locks belonged to.
        session_base: (now.max(0) as u64).saturating_mul(1000),
        // A restarted broker's member lists are newer than the ones it sent before.
        member_list_version_base: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64),
        broker_name: Some(config.broker_name.clone()),
    };
    let restored = crate::persist::read_json::<CoordinatorSnapshot>(&coordinator_path)?;
    let state = match restored.clone() {
        Some(snap) => {
            info!("group coordinator state restored; epochs move forward");
            GroupState::restore(state_config, snap, a.clock.now_ms())
        }
        None => GroupState::new(state_config),
    };
    let connections = Arc::new(Connections::default());
    let observer = Arc::new(Observer::default());
    let groups = Groups::new(
        state,
        GroupsParts {
            clock: a.clock.clone(),
            sink: a.sink.unwrap_or_else(|| connections.clone()),
            counters: counters.clone(),
            observer: observer.clone(),
            sub_groups: sub_groups.clone(),
            path: Some(coordinator_path),
            replicated: config.replication.enabled(),
        },
        restored.is_some(),
    );
    let namesrv = NameServers::new(
        config.namesrv_addrs.clone(),
        namesrv_credentials,
        config.broker_name.clone(),
        a.namesrv_tls,
    );
    let pop = crate::pop::PopService::open(&config).map_err(|source| {
        BrokerError::Store(shoal_store::StoreError::Io {
            op: "open the POP journal",
            path: config.data_dir.join("pop"),
            source,
        })
    })?;
    let shared = Arc::new(Shared::new(SharedParts {
        pop,
        cluster_property: crate::send::cluster_property(&config.cluster_name),
        store: a.store.clone(),
        store_host,
        topics: Topics::new(topics),
        sub_groups,
        groups,
        connections,
        observer,
        namesrv,
        counters,
        metrics,
        net_stats: a.net_stats,
        acl,
        clock: a.clock,
        delay_levels_ms: a.delay_levels_ms,
        config,
    }));
    shared.persist_configs();
    shared
        .metrics
        .registry
        .collector(crate::collector::BrokerCollector::new(&shared));
    shared.metrics.registry.register(
        "shoal_broker_store_flush_seconds",
        "Time of one commit log fsync (the flusher thread, sync-flush group commits, shutdown).",
        shared.store.flush_latency(),
    );

    // Long polling and the delay services hear about every stored message.
    let weak = Arc::downgrade(&shared);
    a.store.add_arrival_listener(Arc::new(move |arrival| {
        if let Some(b) = weak.upgrade() {
            b.holds.notify(arrival);
            b.pop.on_arrival();
            if arrival.topic == shoal_proto::constants::SCHEDULE_TOPIC {
                b.schedule_wakeup.notify_waiters();
            }
        }
    }));
    Ok(shared)
}

/// First wait before registering again when a name server did not accept a registration.
const REGISTER_RETRY_MIN: Duration = Duration::from_millis(500);

/// Registers with every name server each `register_interval_ms` and whenever the topic table
/// changes. After a registration that a name server did not accept (not started yet,
/// unreachable, refusing), the next one comes sooner: 0.5 s, doubling up to the interval, so
/// that a name server started just after the broker knows it within a second instead of a
/// whole interval later.
async fn register_loop(b: Arc<Shared>, mut everywhere: bool) {
    let interval = Duration::from_millis(b.config.register_interval_ms.max(100));
    let mut retry = REGISTER_RETRY_MIN.min(interval);
    loop {
        let wait = if everywhere { interval } else { retry };
        let role_changed = async {
            match b.replication.get() {
                Some(r) => r.role_changed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = b.topics.changed() => {}
            _ = role_changed => {}
        }
        everywhere = b.register_all().await == b.namesrv.count();
        retry = if everywhere {
            REGISTER_RETRY_MIN.min(interval)
        } else {
            (retry * 2).min(interval)
        };
    }
}

/// Closes the rebalances of the timeline that converged, and counts them.
async fn timeline_loop(b: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        b.observe_rebalances();
    }
}

/// Classic clients are expired at least this often (RocketMQ's channel expiry is coarse).
const CLIENT_EXPIRY_CHECK: Duration = Duration::from_secs(1);

/// Runs the group state's timers when they are due: at the coordinator's next deadline (a
/// session or rebalance timeout), woken early when an operation moved it earlier, and at
/// least every [`CLIENT_EXPIRY_CHECK`] for classic clients' expiry.
async fn group_timer_loop(b: Arc<Shared>) {
    loop {
        let now = b.groups.now_ms();
        let wait = b
            .groups
            .next_deadline()
            .map_or(CLIENT_EXPIRY_CHECK, |d| {
                Duration::from_millis(d.saturating_sub(now))
            })
            .min(CLIENT_EXPIRY_CHECK);
        tokio::select! {
            _ = tokio::time::sleep(wait) => b.group_timers(),
            _ = b.groups.deadline_moved() => {}
        }
    }
}

/// Once a second: the coordinator's state persisted if it changed, the runtime-info
/// windows sampled; every 10 s the config tables persisted.
async fn housekeeping_loop(b: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n: u64 = 0;
    loop {
        tick.tick().await;
        n += 1;
        if b.groups.is_dirty() {
            let s = b.clone();
            let _ = tokio::task::spawn_blocking(move || s.groups.persist_if_dirty()).await;
        }
        b.stats.sample(
            wall_ms(),
            b.mono_ms(),
            b.counters.msgs_put.get(),
            b.counters.msgs_got.get(),
        );
        if n % 10 == 0 {
            let s = b.clone();
            let _ = tokio::task::spawn_blocking(move || s.persist_configs()).await;
        }
    }
}
