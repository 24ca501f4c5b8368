//! [`ClientInstance`]: what RocketMQ calls `MQClientInstance` — one identity (client id), one
//! connection pool, the route and broker address tables, the heartbeat and route-refresh timers,
//! the handler of requests brokers send to the client, and typed calls for every request the
//! producer, consumers and admin client make.
//!
//! Every [`Producer`](crate::Producer) and [`PushConsumer`](crate::PushConsumer) owns one
//! instance; the client id is `ip@instanceName` (spec 7.1), the instance name RocketMQ's
//! `<pid>#<nanos>` unless configured.
//!
//! The instance's calls are grouped by whom they go to: the name servers (`routes.rs`), every
//! broker's heartbeat and what kind of broker it is (`heartbeat.rs`), and one broker's
//! requests (`broker.rs`); requests brokers send to the client are answered in `incoming.rs`.

mod broker;
mod heartbeat;
mod incoming;
mod routes;
#[cfg(test)]
mod tests;
mod types;

pub(crate) use incoming::{ConsumerHandle, ProducerHandle};
pub use types::{BrokerKind, LockGrant, PullArgs, PullResult, PullStatus};

use crate::config::{default_instance_name, local_ip_towards, ClientConfig};
use crate::error::{ClientError, Result};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use shoal_net::{NetConfig, RemotingClient};
use shoal_proto::body::TopicRouteData;
use shoal_proto::code::response_code as resp;
use shoal_proto::{MessageQueue, RemotingCommand};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use incoming::{ClientProcessor, Registry};

/// Client-side timeout of a long-polling pull (spec 5.1: 30 s against a 15 s hold).
pub const PULL_RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// extField of HEART_BEAT naming the groups whose consumers on this client speak coordinated
/// mode (comma-separated).
pub const COORDINATED_GROUPS_EXT: &str = "shoalCoordinatedGroups";

struct Inner {
    config: ClientConfig,
    /// Broker address -> kind, once known.
    kinds: Mutex<foldhash::HashMap<String, BrokerKind>>,
    /// Broker addresses whose kind a send asked for in the background (not asked again
    /// while the question is open; a failed one is forgotten, so a later send asks again).
    kinds_asked: Mutex<foldhash::HashSet<Arc<str>>>,
    /// Session timeout announced in heartbeats (Shoal members), ms.
    session_timeout_ms: Mutex<Option<u64>>,
    client_id: String,
    net: RemotingClient,
    registry: Arc<Registry>,
    routes: Mutex<HashMap<String, TopicRouteData>>,
    /// Topic -> its write queues, computed when its route is stored and shared by every send
    /// (no route copy and no queue list built per send).
    publish_queues: Mutex<foldhash::HashMap<String, Arc<[MessageQueue]>>>,
    /// Broker name -> broker id -> address.
    brokers: Mutex<foldhash::HashMap<String, BTreeMap<i64, Arc<str>>>>,
    producer_groups: Mutex<BTreeSet<String>>,
    namesrv_index: AtomicUsize,
    shutdown: CancellationToken,
    /// Coordinated mode: group -> (member id, member epoch) stamped on pulls, commits, locks.
    stamps: Mutex<HashMap<String, shoal_group::member::MemberStamp>>,
    /// Topics name servers said changed, for the refresh task.
    pending_routes: Arc<routes::PendingRoutes>,
    /// Route lookups under way that sends share ([`ClientInstance::update_route_shared`]).
    route_lookups: routes::RouteLookups,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.net.shutdown();
    }
}

/// One client identity with its connections, tables and timers. Cheap to clone.
#[derive(Clone)]
pub struct ClientInstance {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ClientInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientInstance")
            .field("client_id", &self.inner.client_id)
            .field("namesrv_addrs", &self.inner.config.namesrv_addrs)
            .finish()
    }
}

fn ok_or(what: &'static str, r: RemotingCommand) -> Result<RemotingCommand> {
    if r.code == resp::SUCCESS {
        Ok(r)
    } else {
        Err(ClientError::server(what, &r))
    }
}

impl ClientInstance {
    /// Creates an instance and starts its route-refresh and heartbeat timers (they stop at
    /// [`ClientInstance::shutdown`] or when the last clone is dropped). Must be called inside a
    /// tokio runtime.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] for an unusable configuration.
    pub fn start(config: ClientConfig) -> Result<Self> {
        config.validate()?;
        let instance_name = config
            .instance_name
            .clone()
            .unwrap_or_else(default_instance_name);
        let ip = match &config.client_ip {
            Some(ip) => ip.clone(),
            None => local_ip_towards(config.namesrv_addrs.first().map_or("", String::as_str)),
        };
        let registry = Arc::new(Registry::default());
        let pending_routes = Arc::new(routes::PendingRoutes::default());
        // One processor for requests from brokers and from name servers (route notices): the
        // name server connections are this client's connections too.
        let net = RemotingClient::with_tls(
            NetConfig::default(),
            Arc::new(ClientProcessor {
                registry: Arc::clone(&registry),
                pending_routes: Arc::clone(&pending_routes),
            }),
            config.tls.clone(),
        );
        let start_index = rand::random::<usize>() % config.namesrv_addrs.len().max(1);
        let inner = Arc::new(Inner {
            client_id: format!("{ip}@{instance_name}"),
            config,
            kinds: Mutex::new(foldhash::HashMap::default()),
            kinds_asked: Mutex::new(foldhash::HashSet::default()),
            session_timeout_ms: Mutex::new(None),
            net,
            registry,
            routes: Mutex::new(HashMap::new()),
            publish_queues: Mutex::new(foldhash::HashMap::default()),
            brokers: Mutex::new(foldhash::HashMap::default()),
            producer_groups: Mutex::new(BTreeSet::new()),
            namesrv_index: AtomicUsize::new(start_index),
            stamps: Mutex::new(HashMap::new()),
            shutdown: CancellationToken::new(),
            pending_routes,
            route_lookups: routes::RouteLookups::default(),
        });
        let this = ClientInstance { inner };
        routes::spawn_route_notice_task(
            Arc::clone(&this.inner.pending_routes),
            Arc::downgrade(&this.inner),
            this.inner.shutdown.clone(),
        );
        this.spawn_timer(this.inner.config.poll_namesrv_interval, |c| {
            Box::pin(async move { c.refresh_routes().await })
        });
        this.spawn_timer(this.inner.config.heartbeat_interval, |c| {
            Box::pin(async move {
                c.heartbeat_all().await;
            })
        });
        Ok(this)
    }

    /// Runs `tick` every `period` while the instance lives and is not shut down.
    fn spawn_timer(
        &self,
        period: Duration,
        tick: impl Fn(ClientInstance) -> BoxFuture<'static, ()> + Send + 'static,
    ) {
        let weak = Arc::downgrade(&self.inner);
        let token = self.inner.shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(period) => {}
                }
                let Some(inner) = weak.upgrade() else { return };
                tick(ClientInstance { inner }).await;
            }
        });
    }

    /// The client id, `ip@instanceName`.
    pub fn client_id(&self) -> &str {
        &self.inner.client_id
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// A token cancelled at shutdown (for tasks of the producer/consumers).
    pub(crate) fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    /// True once [`ClientInstance::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.inner.shutdown.is_cancelled()
    }

    /// Stops the timers and closes every connection.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.net.shutdown();
    }

    pub(crate) fn register_consumer(&self, group: &str, handle: Weak<dyn ConsumerHandle>) {
        self.inner.registry.add_consumer(group, handle);
    }

    pub(crate) fn unregister_consumer_local(&self, group: &str) {
        self.inner.registry.remove_consumer(group);
    }

    /// Makes this instance answer the broker's transaction checks for `group`.
    pub fn register_transaction_checker(
        &self,
        group: &str,
        listener: crate::transaction_check::CheckListener,
    ) {
        self.inner.registry.add_checker(group, listener);
    }

    /// Stops answering transaction checks for `group`.
    pub fn unregister_transaction_checker(&self, group: &str) {
        self.inner.registry.remove_checker(group);
    }

    pub(crate) fn register_producer(&self, group: &str) {
        self.inner.producer_groups.lock().insert(group.to_owned());
    }

    /// Makes a producer hear of brokers appearing in its routes.
    pub(crate) fn watch_brokers(&self, producer: Weak<dyn ProducerHandle>) {
        self.inner.registry.add_producer(producer);
    }
}
