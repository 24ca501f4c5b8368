//! [`ClientInstance`]: what RocketMQ calls `MQClientInstance` — one identity (client id), one
//! connection pool, the route and broker address tables, the heartbeat and route-refresh timers,
//! the handler of requests brokers send to the client, and typed calls for every request the
//! producer, consumers and admin client make.
//!
//! Every [`Producer`](crate::Producer) and [`PushConsumer`](crate::PushConsumer) owns one
//! instance; the client id is `ip@instanceName` (spec 7.1), the instance name RocketMQ's
//! `<pid>#<nanos>` unless configured.

use crate::config::{default_instance_name, local_ip_towards, ClientConfig};
use crate::error::{ClientError, Result};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use shoal_net::{request_code_not_supported, NetConfig, Processor, RemotingClient, RequestContext};
use shoal_proto::body::{
    ConsumeMessageDirectlyResult, ConsumerData, ConsumerRunningInfo,
    GetConsumerListByGroupResponseBody, HeartbeatData, LockBatchRequestBody, LockBatchResponseBody,
    ProducerData, ResetOffsetBody, TopicRouteData, UnlockBatchRequestBody,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::ext::ConsumerIdsNotice;
use shoal_proto::header::*;
use shoal_proto::message::{decode_records, DecodeOptions, MessageExt};
use shoal_proto::{MessageQueue, RemotingCommand, SerializeType};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Client-side timeout of a long-polling pull (spec 5.1: 30 s against a 15 s hold).
pub const PULL_RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// What a consumer registered in an instance answers to the broker's requests.
pub(crate) trait ConsumerHandle: Send + Sync + 'static {
    /// The consumer's data for heartbeats.
    fn consumer_data(&self) -> ConsumerData;
    /// Topics the consumer subscribes (including its retry topic).
    fn subscribed_topics(&self) -> Vec<String>;
    /// A route change (or anything else that calls for it): rebalance now.
    fn rebalance_now(&self);
    /// NOTIFY_CONSUMER_IDS_CHANGED: the group's members or the topic's queues changed.
    /// Rebalances now; consumers that cache routes also refresh them (a Shoal broker notifies
    /// when a subscribed topic's queue count changes).
    fn group_changed(&self) {
        self.rebalance_now();
    }
    /// NOTIFY_CONSUMER_IDS_CHANGED that carried the group's member list (a Shoal broker, a
    /// membership change without a subscription change), from the broker at `broker_addr`:
    /// rebalance on that list without asking for it.
    fn members_changed(&self, broker_addr: &str, notice: ConsumerIdsNotice) {
        let _ = (broker_addr, notice);
        self.group_changed();
    }
    /// NOTIFY_LOCK_FREED (Shoal brokers): locks this consumer asked for are free.
    fn lock_freed(&self, queues: Vec<MessageQueue>) {
        let _ = queues;
    }
    /// GET_CONSUMER_RUNNING_INFO.
    fn running_info(&self) -> ConsumerRunningInfo;
    /// True when the consumer speaks coordinated mode (its classic heartbeat says so, so the
    /// broker does not count it as a classic-only member).
    fn speaks_coordinated(&self) -> bool {
        false
    }
    /// GROUP_ASSIGNMENT_CHANGED: the coordinator has news for this member.
    fn assignment_changed(&self) {
        self.rebalance_now();
    }
    /// RESET_CONSUMER_CLIENT_OFFSET.
    fn reset_offset(&self, topic: &str, offsets: BTreeMap<MessageQueue, i64>);
    /// CONSUME_MESSAGE_DIRECTLY.
    fn consume_directly(&self, msg: MessageExt)
        -> BoxFuture<'static, ConsumeMessageDirectlyResult>;
}

/// extField of HEART_BEAT naming the groups whose consumers on this client speak coordinated
/// mode (comma-separated).
pub const COORDINATED_GROUPS_EXT: &str = "shoalCoordinatedGroups";

/// Consumers by group; weak so that a consumer dropped without shutdown does not live on.
#[derive(Default)]
struct Registry {
    consumers: Mutex<HashMap<String, Weak<dyn ConsumerHandle>>>,
    /// Transaction check listeners by producer group.
    checkers: Mutex<HashMap<String, crate::transaction_check::CheckListener>>,
}

impl Registry {
    fn checker(&self, group: &str) -> Option<crate::transaction_check::CheckListener> {
        self.checkers.lock().get(group).cloned()
    }
    fn get(&self, group: &str) -> Option<Arc<dyn ConsumerHandle>> {
        self.consumers.lock().get(group).and_then(Weak::upgrade)
    }
    fn all(&self) -> Vec<Arc<dyn ConsumerHandle>> {
        self.consumers
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

/// Handles NOTIFY_CONSUMER_IDS_CHANGED (40), RESET_CONSUMER_CLIENT_OFFSET (220),
/// GET_CONSUMER_RUNNING_INFO (307) and CONSUME_MESSAGE_DIRECTLY (309); anything else is
/// answered REQUEST_CODE_NOT_SUPPORTED.
struct ClientProcessor {
    registry: Arc<Registry>,
}

impl Processor for ClientProcessor {
    fn process(
        &self,
        _ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'static, shoal_net::ProcessResult> {
        let registry = Arc::clone(&self.registry);
        Box::pin(async move {
            match request.code {
                shoal_proto::coordinated::request_code::GROUP_ASSIGNMENT_CHANGED => {
                    let n: shoal_proto::coordinated::AssignmentChangedNotice =
                        request.decode_json_body()?;
                    if let Some(c) = registry.get(&n.group) {
                        c.assignment_changed();
                    }
                    Ok(None)
                }
                rc::NOTIFY_CONSUMER_IDS_CHANGED => {
                    let h: NotifyConsumerIdsChangedRequestHeader =
                        request.decode_command_header()?;
                    // A Shoal broker's notice to a Shoal member carries the member list; anything
                    // else (no body, or one we do not understand) means "ask".
                    let list = request
                        .body
                        .as_ref()
                        .and_then(|_| request.decode_json_body::<ConsumerIdsNotice>().ok());
                    debug!(group = %h.consumer_group, members = ?list.as_ref().map(|n| n.consumer_id_list.len()), "consumer ids changed");
                    if let Some(c) = registry.get(&h.consumer_group) {
                        match list {
                            Some(n) => {
                                c.members_changed(&_ctx.connection().peer_addr().to_string(), n)
                            }
                            None => c.group_changed(),
                        }
                    }
                    Ok(None)
                }
                shoal_proto::ext::request_code::NOTIFY_LOCK_FREED => {
                    let body: shoal_proto::ext::LockFreedBody = request.decode_json_body()?;
                    if let Some(c) = registry.get(&body.consumer_group) {
                        c.lock_freed(body.mq_set);
                    }
                    Ok(None)
                }
                rc::RESET_CONSUMER_CLIENT_OFFSET => {
                    let h: ResetOffsetRequestHeader = request.decode_command_header()?;
                    let body: ResetOffsetBody = match request.body {
                        Some(_) => request.decode_json_body()?,
                        None => ResetOffsetBody::default(),
                    };
                    if let Some(c) = registry.get(&h.group) {
                        c.reset_offset(&h.topic, body.offset_table);
                    }
                    Ok(None)
                }
                rc::GET_CONSUMER_RUNNING_INFO => {
                    let h: GetConsumerRunningInfoRequestHeader = request.decode_command_header()?;
                    Ok(Some(match registry.get(&h.consumer_group) {
                        Some(c) => RemotingCommand::response(resp::SUCCESS, None)
                            .with_json_body(&c.running_info())?,
                        None => RemotingCommand::response(
                            resp::SYSTEM_ERROR,
                            Some(format!(
                                "The Consumer Group <{}> not exist in this consumer",
                                h.consumer_group
                            )),
                        ),
                    }))
                }
                rc::CONSUME_MESSAGE_DIRECTLY => {
                    let h: ConsumeMessageDirectlyRequestHeader = request.decode_command_header()?;
                    let Some(c) = registry.get(&h.consumer_group) else {
                        return Ok(Some(RemotingCommand::response(
                            resp::SYSTEM_ERROR,
                            Some(format!(
                                "The Consumer Group <{}> not exist in this consumer",
                                h.consumer_group
                            )),
                        )));
                    };
                    let body = request.body.clone().unwrap_or_default();
                    let run = decode_records(&body, &DecodeOptions::client());
                    let Some(msg) = run.messages.into_iter().next() else {
                        return Ok(Some(RemotingCommand::response(
                            resp::SYSTEM_ERROR,
                            Some(format!(
                                "no message in the request body: {}",
                                run.error.map(|e| e.to_string()).unwrap_or_default()
                            )),
                        )));
                    };
                    let result = c.consume_directly(msg).await;
                    Ok(Some(
                        RemotingCommand::response(resp::SUCCESS, None).with_json_body(&result)?,
                    ))
                }
                rc::CHECK_TRANSACTION_STATE => {
                    // Answered with END_TRANSACTION on the same connection, off this task (the
                    // listener may take its time).
                    let conn = _ctx.connection().clone();
                    tokio::spawn(async move {
                        match crate::transaction_check::answer_check(&request, |g| {
                            registry.checker(g)
                        })
                        .await
                        {
                            Ok(Some(end)) => {
                                if let Err(e) = conn.oneway(end).await {
                                    warn!(error = %e, "could not answer a transaction check");
                                }
                            }
                            Ok(None) => {}
                            Err(e) => warn!(error = %e, "bad CHECK_TRANSACTION_STATE"),
                        }
                    });
                    Ok(None)
                }
                _ => Ok(Some(request_code_not_supported(&request))),
            }
        })
    }
}

/// The outcome of a pull, as RocketMQ's `PullStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullStatus {
    /// Messages were found.
    Found,
    /// Nothing new at this offset.
    NoNewMsg,
    /// Entries were scanned but none matched the subscription.
    NoMatchedMsg,
    /// The offset is outside the queue; use `next_begin_offset`.
    OffsetIllegal,
}

/// A pull answer.
#[derive(Debug, Clone)]
pub struct PullResult {
    /// What happened.
    pub status: PullStatus,
    /// Where to pull next.
    pub next_begin_offset: i64,
    /// The queue's minimum offset.
    pub min_offset: i64,
    /// The queue's maximum offset (next to be written).
    pub max_offset: i64,
    /// The messages (with `Found`), bodies decompressed.
    pub messages: Vec<MessageExt>,
}

/// The arguments of a pull.
#[derive(Debug, Clone)]
pub struct PullArgs<'a> {
    /// Request code: PULL_MESSAGE (push consumer) or LITE_PULL_MESSAGE.
    pub code: i32,
    /// Consumer group.
    pub group: &'a str,
    /// Queue.
    pub mq: &'a MessageQueue,
    /// Offset to read from.
    pub offset: i64,
    /// Maximum number of messages.
    pub max_msgs: i32,
    /// PullSysFlag bits.
    pub sys_flag: i32,
    /// Offset to commit (with COMMIT_OFFSET).
    pub commit_offset: i64,
    /// Long-polling hold, ms.
    pub suspend_ms: i64,
    /// Subscription expression (sent with SUBSCRIPTION).
    pub subscription: Option<&'a str>,
    /// Subscription version.
    pub sub_version: i64,
    /// Expression type of `subscription`: `TAG` or `SQL92`.
    pub expression_type: &'a str,
    /// RPC timeout.
    pub timeout: Duration,
}

/// What kind of broker an address is (GET_BROKER_FEATURES).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerKind {
    /// A Shoal broker and the features it lists.
    Shoal(shoal_proto::ext::BrokerFeatures),
    /// A broker that does not know Shoal's extensions (Apache RocketMQ).
    RocketMq,
}

impl BrokerKind {
    /// True for a Shoal broker with session locks.
    pub fn has_session_locks(&self) -> bool {
        matches!(self, BrokerKind::Shoal(f) if f.has(shoal_proto::ext::feature::SESSION_LOCKS))
    }

    /// True for a Shoal broker that lists the feature `name` (`shoal_proto::ext::feature`).
    pub fn has(&self, name: &str) -> bool {
        matches!(self, BrokerKind::Shoal(f) if f.has(name))
    }

    /// True for a Shoal broker that coordinates groups (coordinated mode); Apache RocketMQ
    /// brokers and Shoal brokers with `[coordinator] enabled = false` do not.
    pub fn has_coordinator(&self) -> bool {
        matches!(self, BrokerKind::Shoal(f) if f.has(shoal_proto::ext::feature::COORDINATOR))
    }
}

/// What a LOCK_BATCH_MQ answered.
#[derive(Debug, Clone, Default)]
pub struct LockGrant {
    /// The queues held now.
    pub locked: Vec<MessageQueue>,
    /// The session they last for (session locks on a Shoal broker).
    pub session: Option<u64>,
    /// The group's committed offsets of granted queues (topic, queue id, offset), when asked
    /// for and the broker has `offsetOnGrant`.
    pub committed: Vec<(String, i32, i64)>,
}

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
    stamps: Mutex<HashMap<String, (String, i32)>>,
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
        let net = RemotingClient::with_tls(
            NetConfig::default(),
            Arc::new(ClientProcessor {
                registry: Arc::clone(&registry),
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
        });
        let this = ClientInstance { inner };
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
        self.inner
            .registry
            .consumers
            .lock()
            .insert(group.to_owned(), handle);
    }

    pub(crate) fn unregister_consumer_local(&self, group: &str) {
        self.inner.registry.consumers.lock().remove(group);
    }

    /// Makes this instance answer the broker's transaction checks for `group`.
    pub fn register_transaction_checker(
        &self,
        group: &str,
        listener: crate::transaction_check::CheckListener,
    ) {
        self.inner
            .registry
            .checkers
            .lock()
            .insert(group.to_string(), listener);
    }

    /// Stops answering transaction checks for `group`.
    pub fn unregister_transaction_checker(&self, group: &str) {
        self.inner.registry.checkers.lock().remove(group);
    }

    pub(crate) fn register_producer(&self, group: &str) {
        self.inner.producer_groups.lock().insert(group.to_owned());
    }

    // ---- name server -------------------------------------------------------------------

    /// Sends a request to a name server: the current one first, then the others round-robin.
    ///
    /// # Errors
    /// The last transport error when no name server answered.
    pub async fn invoke_namesrv(&self, request: RemotingCommand) -> Result<RemotingCommand> {
        let addrs = &self.inner.config.namesrv_addrs;
        let n = addrs.len();
        let start = self.inner.namesrv_index.load(Ordering::Relaxed);
        let mut last = None;
        for i in 0..n {
            let idx = (start + i) % n;
            let Some(addr) = addrs.get(idx) else { continue };
            match self
                .inner
                .net
                .invoke(
                    addr,
                    self.signed(request.clone()),
                    self.inner.config.rpc_timeout,
                )
                .await
            {
                Ok(r) => {
                    self.inner.namesrv_index.store(idx, Ordering::Relaxed);
                    return Ok(r);
                }
                Err(e) => {
                    if self.inner.shutdown.is_cancelled() {
                        debug!(namesrv = %addr, error = %e, "name server request failed during shutdown");
                    } else {
                        warn!(namesrv = %addr, error = %e, "name server request failed");
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.map_or(
            ClientError::InvalidArgument("no name server".into()),
            Into::into,
        ))
    }

    /// Asks the name servers for a topic's route (no caching).
    ///
    /// # Errors
    /// [`ClientError::NoRoute`] if the topic does not exist, transport errors otherwise.
    pub async fn fetch_route(&self, topic: &str) -> Result<TopicRouteData> {
        let req = RemotingCommand::request_with_header(
            rc::GET_ROUTEINFO_BY_TOPIC,
            &GetRouteInfoRequestHeader {
                topic: topic.to_owned(),
                ..Default::default()
            },
        );
        let r = self.invoke_namesrv(req).await?;
        match r.code {
            resp::SUCCESS => Ok(r.decode_json_body()?),
            resp::TOPIC_NOT_EXIST => Err(ClientError::NoRoute(topic.to_owned())),
            _ => Err(ClientError::server("GET_ROUTEINFO_BY_TOPIC", &r)),
        }
    }

    /// Fetches a topic's route and stores it (and its broker addresses); consumers of the topic
    /// rebalance when it changed. Returns the route.
    ///
    /// # Errors
    /// Those of [`ClientInstance::fetch_route`].
    pub async fn update_route(&self, topic: &str) -> Result<TopicRouteData> {
        let route = self.fetch_route(topic).await?;
        self.store_route(topic, &route);
        Ok(route)
    }

    fn store_route(&self, topic: &str, route: &TopicRouteData) {
        {
            let mut brokers = self.inner.brokers.lock();
            for b in &route.broker_datas {
                let addrs = b
                    .broker_addrs
                    .iter()
                    .map(|(&id, addr)| (id, Arc::from(addr.as_str())))
                    .collect();
                brokers.insert(b.broker_name.clone(), addrs);
            }
        }
        let queues: Arc<[MessageQueue]> = route.publish_queues(topic).into();
        self.inner
            .publish_queues
            .lock()
            .insert(topic.to_owned(), queues);
        let changed = {
            let mut routes = self.inner.routes.lock();
            let old = routes.insert(topic.to_owned(), route.clone());
            old.as_ref().is_none_or(|o| {
                o.queue_datas != route.queue_datas || o.broker_datas != route.broker_datas
            })
        };
        if changed {
            debug!(topic, "route changed");
            for c in self.inner.registry.all() {
                if c.subscribed_topics().iter().any(|t| t == topic) {
                    c.rebalance_now();
                }
            }
        }
    }

    /// The cached route of a topic, fetching it on first use.
    ///
    /// # Errors
    /// Those of [`ClientInstance::fetch_route`].
    pub async fn route(&self, topic: &str) -> Result<TopicRouteData> {
        if let Some(r) = self.inner.routes.lock().get(topic) {
            return Ok(r.clone());
        }
        self.update_route(topic).await
    }

    /// The cached route of a topic, if any.
    pub fn cached_route(&self, topic: &str) -> Option<TopicRouteData> {
        self.inner.routes.lock().get(topic).cloned()
    }

    /// The write queues of a topic's cached route (as [`TopicRouteData::publish_queues`]), if
    /// its route is cached; shared, so a send costs no copy.
    pub fn cached_publish_queues(&self, topic: &str) -> Option<Arc<[MessageQueue]>> {
        self.inner.publish_queues.lock().get(topic).cloned()
    }

    /// Refreshes the routes of every topic in use (the 30 s timer).
    pub async fn refresh_routes(&self) {
        let mut topics: BTreeSet<String> = self.inner.routes.lock().keys().cloned().collect();
        for c in self.inner.registry.all() {
            topics.extend(c.subscribed_topics());
        }
        for t in topics {
            if let Err(e) = self.update_route(&t).await {
                debug!(topic = %t, error = %e, "route refresh failed");
            }
        }
    }

    /// The master address of a broker, if known.
    pub fn master_addr(&self, broker_name: &str) -> Option<String> {
        self.master_addr_shared(broker_name).map(|a| a.to_string())
    }

    /// [`ClientInstance::master_addr`] without a copy of the text (a send looks it up each
    /// time).
    pub(crate) fn master_addr_shared(&self, broker_name: &str) -> Option<Arc<str>> {
        self.inner
            .brokers
            .lock()
            .get(broker_name)
            .and_then(|ids| ids.get(&shoal_proto::constants::MASTER_ID).cloned())
    }

    /// The master address of a broker, refreshing `topic`'s route if it is unknown.
    ///
    /// # Errors
    /// [`ClientError::NoBrokerAddr`] when no route names it.
    pub async fn find_master_addr(&self, broker_name: &str, topic: &str) -> Result<String> {
        if let Some(a) = self.master_addr(broker_name) {
            return Ok(a);
        }
        // Boxed: a route update is rare, and its future would otherwise grow every request's.
        let _ = Box::pin(self.update_route(topic)).await;
        self.master_addr(broker_name)
            .ok_or_else(|| ClientError::NoBrokerAddr(broker_name.to_owned()))
    }

    /// Every known master address.
    pub fn master_addrs(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .inner
            .brokers
            .lock()
            .values()
            .filter_map(|ids| {
                ids.get(&shoal_proto::constants::MASTER_ID)
                    .map(|a| a.to_string())
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }

    // ---- heartbeats --------------------------------------------------------------------

    fn heartbeat_data(&self) -> HeartbeatData {
        HeartbeatData {
            client_id: self.inner.client_id.clone(),
            consumer_data_set: self
                .inner
                .registry
                .all()
                .iter()
                .map(|c| c.consumer_data())
                .collect(),
            producer_data_set: self
                .inner
                .producer_groups
                .lock()
                .iter()
                .map(|g| ProducerData {
                    group_name: g.clone(),
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Makes the instance's heartbeats announce a Shoal session of this timeout (a Shoal
    /// broker then expires the client after that long without heartbeat, and its session
    /// locks last as long).
    pub fn set_session_timeout(&self, timeout: Option<Duration>) {
        *self.inner.session_timeout_ms.lock() = timeout.map(|d| d.as_millis() as u64);
    }

    fn heartbeat_request(&self) -> Option<RemotingCommand> {
        let data = self.heartbeat_data();
        if data.consumer_data_set.is_empty() && data.producer_data_set.is_empty() {
            return None;
        }
        let coordinated: Vec<String> = self
            .inner
            .registry
            .all()
            .iter()
            .filter(|c| c.speaks_coordinated())
            .map(|c| c.consumer_data().group_name)
            .collect();
        let mut ext = shoal_proto::command::ExtFields::new();
        if !coordinated.is_empty() {
            // Shoal brokers: these groups' members speak coordinated mode (Apache RocketMQ
            // ignores extFields it does not know).
            ext.insert(COORDINATED_GROUPS_EXT, coordinated.join(","));
        }
        if let Some(ms) = *self.inner.session_timeout_ms.lock() {
            ext.insert(shoal_proto::ext::field::SESSION_TIMEOUT_MS, ms.to_string());
        }
        RemotingCommand::request(rc::HEART_BEAT)
            .with_ext_fields(ext)
            .with_json_body(&data)
            .ok()
    }

    /// One HEART_BEAT to one broker; returns the Shoal sessions its answer names (group →
    /// session id; empty from an Apache RocketMQ broker).
    ///
    /// # Errors
    /// Transport errors and a refused heartbeat.
    pub async fn heartbeat_to(&self, addr: &str) -> Result<HashMap<String, u64>> {
        let Some(req) = self.heartbeat_request() else {
            return Ok(HashMap::new());
        };
        let r = ok_or(
            "HEART_BEAT",
            self.inner
                .net
                .invoke(addr, req, self.inner.config.rpc_timeout)
                .await?,
        )?;
        Ok(r.ext(shoal_proto::ext::field::SESSIONS)
            .map(shoal_proto::ext::decode_sessions)
            .unwrap_or_default()
            .into_iter()
            .collect())
    }

    /// What kind of broker `addr` is (asked once with GET_BROKER_FEATURES, then cached).
    ///
    /// # Errors
    /// Transport errors (nothing is cached then).
    pub async fn broker_kind(&self, addr: &str) -> Result<BrokerKind> {
        if let Some(k) = self.inner.kinds.lock().get(addr) {
            return Ok(k.clone());
        }
        let req = RemotingCommand::request(shoal_proto::ext::request_code::GET_BROKER_FEATURES)
            .with_ext_fields(Default::default());
        let r = self
            .inner
            .net
            .invoke(addr, req, self.inner.config.rpc_timeout)
            .await?;
        let kind = match r.code {
            resp::SUCCESS => BrokerKind::Shoal(r.decode_json_body()?),
            _ => BrokerKind::RocketMq,
        };
        self.inner
            .kinds
            .lock()
            .insert(addr.to_owned(), kind.clone());
        Ok(kind)
    }

    /// True when sends to `broker_name`'s master go with binary headers
    /// ([`ClientConfig::binary_sends_to_shoal`]): the master is known to be a Shoal broker. A
    /// master whose kind is not known yet is asked about in the background (once), and sends
    /// use the configured encoding meanwhile.
    pub(crate) fn binary_sends_to(&self, broker_name: &str) -> bool {
        self.send_target(broker_name).1
    }

    /// A send's target: `broker_name`'s master address, if known, and whether sends to it
    /// go with binary headers (as [`ClientInstance::binary_sends_to`]), found with one
    /// lookup of each table.
    pub(crate) fn send_target(&self, broker_name: &str) -> (Option<Arc<str>>, bool) {
        let Some(addr) = self.master_addr_shared(broker_name) else {
            return (None, false);
        };
        let binary = self.inner.config.binary_sends_to_shoal && self.is_shoal_broker(&addr);
        (Some(addr), binary)
    }

    /// Whether `addr` is known to be a Shoal broker; when its kind is not known, it is asked
    /// about in the background (once at a time) and this says no meanwhile.
    fn is_shoal_broker(&self, addr: &Arc<str>) -> bool {
        if let Some(k) = self.inner.kinds.lock().get(&**addr) {
            return matches!(k, BrokerKind::Shoal(_));
        }
        if self.inner.kinds_asked.lock().insert(Arc::clone(addr)) {
            let (this, addr) = (self.clone(), Arc::clone(addr));
            tokio::spawn(async move {
                if let Err(e) = this.broker_kind(&addr).await {
                    debug!(addr = %addr, error = %e, "broker kind not known; asked again later");
                }
                this.inner.kinds_asked.lock().remove(&addr);
            });
        }
        false
    }

    /// Every known broker master as (broker name, address), sorted.
    pub fn masters(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .inner
            .brokers
            .lock()
            .iter()
            .filter_map(|(name, ids)| {
                ids.get(&shoal_proto::constants::MASTER_ID)
                    .map(|a| (name.clone(), a.to_string()))
            })
            .collect();
        v.sort();
        v
    }

    /// Sends HEART_BEAT to every known master; returns how many answered SUCCESS.
    pub async fn heartbeat_all(&self) -> usize {
        let Some(req) = self.heartbeat_request() else {
            return 0;
        };
        let calls = self.master_addrs().into_iter().map(|addr| {
            let req = req.clone();
            async move {
                match self
                    .inner
                    .net
                    .invoke(&addr, self.signed(req), self.inner.config.rpc_timeout)
                    .await
                {
                    Ok(r) if r.code == resp::SUCCESS => true,
                    Ok(r) => {
                        warn!(broker = %addr, code = r.code, remark = ?r.remark, "heartbeat refused");
                        false
                    }
                    Err(e) => {
                        debug!(broker = %addr, error = %e, "heartbeat failed");
                        false
                    }
                }
            }
        });
        futures::future::join_all(calls)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count()
    }

    /// Sends UNREGISTER_CLIENT for a producer or consumer group to every known master.
    pub async fn unregister_client(
        &self,
        producer_group: Option<&str>,
        consumer_group: Option<&str>,
    ) {
        let req = RemotingCommand::request_with_header(
            rc::UNREGISTER_CLIENT,
            &UnregisterClientRequestHeader {
                client_id: self.inner.client_id.clone(),
                producer_group: producer_group.map(str::to_owned),
                consumer_group: consumer_group.map(str::to_owned),
                ..Default::default()
            },
        );
        let calls = self.master_addrs().into_iter().map(|addr| {
            let req = req.clone();
            async move {
                if let Err(e) = self
                    .inner
                    .net
                    .invoke(&addr, self.signed(req), self.inner.config.rpc_timeout)
                    .await
                {
                    debug!(broker = %addr, error = %e, "unregister failed");
                }
            }
        });
        futures::future::join_all(calls).await;
    }

    // ---- broker requests ----------------------------------------------------------------

    /// Sends a request to a broker address and waits for the answer.
    ///
    /// # Errors
    /// Transport errors.
    /// On an established connection the request is sent at once and the future only waits
    /// for the answer (see [`RemotingClient::invoke`](shoal_net::RemotingClient::invoke)).
    pub fn invoke(
        &self,
        addr: &str,
        request: RemotingCommand,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<RemotingCommand>> + Send + 'static {
        use futures::FutureExt;
        self.inner
            .net
            .invoke(addr, self.signed(request), timeout)
            .map(|r| Ok(r?))
    }

    /// [`ClientInstance::invoke`] for a caller that reads the answer's header with a reader
    /// that takes a kept binary area too
    /// ([`RemotingClient::invoke_keeping_answer_area`](shoal_net::RemotingClient::invoke_keeping_answer_area)).
    pub fn invoke_keeping_answer_area(
        &self,
        addr: &str,
        request: RemotingCommand,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<RemotingCommand>> + Send + 'static {
        use futures::FutureExt;
        self.inner
            .net
            .invoke_keeping_answer_area(addr, self.signed(request), timeout)
            .map(|r| Ok(r?))
    }

    /// Sends a oneway request to a broker address.
    ///
    /// # Errors
    /// Transport errors.
    pub async fn invoke_oneway(&self, addr: &str, request: RemotingCommand) -> Result<()> {
        Ok(self
            .inner
            .net
            .invoke_oneway(addr, self.signed(request))
            .await?)
    }

    /// Readies a request for the wire: its header encoding is the configured one
    /// ([`ClientConfig::serialize_type`]), and it is signed with the configured ACL
    /// credentials (unsigned without them).
    pub fn signed(&self, mut request: RemotingCommand) -> RemotingCommand {
        // A request its maker marked binary stays binary (sends to a Shoal broker).
        let chosen = match request.serialize_type {
            SerializeType::RocketMq => SerializeType::RocketMq,
            SerializeType::Json => self.inner.config.serialize_type,
        };
        request.serialize_type = chosen.for_request_code(request.code);
        if let Some(c) = &self.inner.config.credentials {
            shoal_proto::acl::sign_request(&mut request, c);
        }
        request
    }

    async fn call_broker(
        &self,
        what: &'static str,
        mq: &MessageQueue,
        request: RemotingCommand,
    ) -> Result<RemotingCommand> {
        let addr = self.find_master_addr(&mq.broker_name, &mq.topic).await?;
        let r = self
            .invoke(&addr, request, self.inner.config.rpc_timeout)
            .await?;
        ok_or(what, r)
    }

    /// CHECK_CLIENT_CONFIG (46) with every master of `sub`'s topic: the broker says whether it
    /// can serve the subscription (SQL92 needs its property filter and a selector that
    /// compiles).
    ///
    /// # Errors
    /// [`ClientError::Server`] with the broker's answer when one refuses; route errors.
    pub async fn check_client_config(
        &self,
        group: &str,
        sub: &shoal_proto::body::SubscriptionData,
    ) -> Result<()> {
        let route = self.route(&sub.topic).await?;
        let body = shoal_proto::body::CheckClientRequestBody {
            client_id: self.client_id().to_owned(),
            group: group.to_owned(),
            subscription_data: Some(sub.clone()),
        };
        for bd in &route.broker_datas {
            let Some(addr) = bd.broker_addrs.get(&shoal_proto::constants::MASTER_ID) else {
                continue;
            };
            let req = RemotingCommand::request(rc::CHECK_CLIENT_CONFIG).with_json_body(&body)?;
            let r = self
                .invoke(addr, req, self.inner.config.rpc_timeout)
                .await?;
            ok_or("CHECK_CLIENT_CONFIG", r)?;
        }
        Ok(())
    }

    /// Pulls messages from a queue's master.
    ///
    /// # Errors
    /// Transport errors, and [`ClientError::Server`] for codes other than SUCCESS,
    /// PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY and PULL_OFFSET_MOVED.
    pub async fn pull(&self, args: PullArgs<'_>) -> Result<PullResult> {
        let mq = args.mq;
        let addr = self.find_master_addr(&mq.broker_name, &mq.topic).await?;
        let header = PullMessageRequestHeader {
            consumer_group: args.group.to_owned(),
            topic: mq.topic.clone(),
            queue_id: mq.queue_id,
            queue_offset: args.offset,
            max_msg_nums: args.max_msgs,
            sys_flag: args.sys_flag,
            commit_offset: args.commit_offset,
            suspend_timeout_millis: args.suspend_ms,
            subscription: args.subscription.map(str::to_owned),
            sub_version: args.sub_version,
            expression_type: Some(args.expression_type.to_owned()),
            max_msg_bytes: Some(262_144),
            rpc: RpcFields::with_broker_name(&mq.broker_name),
            ..Default::default()
        };
        let mut req = RemotingCommand::request_with_header(args.code, &header);
        self.stamp(args.group, &mut req);
        let r = self.invoke(&addr, req, args.timeout).await?;
        let status = match r.code {
            resp::SUCCESS => PullStatus::Found,
            resp::PULL_NOT_FOUND => PullStatus::NoNewMsg,
            resp::PULL_RETRY_IMMEDIATELY => PullStatus::NoMatchedMsg,
            resp::PULL_OFFSET_MOVED => PullStatus::OffsetIllegal,
            _ => return Err(ClientError::server("PULL_MESSAGE", &r)),
        };
        let h: PullMessageResponseHeader = r.decode_command_header()?;
        let mut messages = Vec::new();
        if status == PullStatus::Found {
            let body = r.body.clone().unwrap_or_default();
            let run = decode_records(&body, &DecodeOptions::client());
            if let Some(e) = &run.error {
                warn!(%mq, error = %e, decoded = run.messages.len(), "pull body decoded partially");
            }
            messages = run.messages;
            if let Some(delta) = h.offset_delta {
                for m in &mut messages {
                    m.queue_offset += delta;
                }
            }
        }
        Ok(PullResult {
            status,
            next_begin_offset: h.next_begin_offset,
            min_offset: h.min_offset,
            max_offset: h.max_offset,
            messages,
        })
    }

    /// QUERY_CONSUMER_OFFSET with `setZeroIfNotFound=false`: `None` when the group has no
    /// offset for the queue.
    ///
    /// # Errors
    /// Transport errors and unexpected codes.
    pub async fn query_consumer_offset(
        &self,
        group: &str,
        mq: &MessageQueue,
    ) -> Result<Option<i64>> {
        let req = RemotingCommand::request_with_header(
            rc::QUERY_CONSUMER_OFFSET,
            &QueryConsumerOffsetRequestHeader {
                consumer_group: group.to_owned(),
                topic: mq.topic.clone(),
                queue_id: mq.queue_id,
                set_zero_if_not_found: Some(false),
                rpc: RpcFields::with_broker_name(&mq.broker_name),
            },
        );
        let addr = self.find_master_addr(&mq.broker_name, &mq.topic).await?;
        let r = self
            .invoke(&addr, req, self.inner.config.rpc_timeout)
            .await?;
        match r.code {
            resp::SUCCESS => {
                let h: QueryConsumerOffsetResponseHeader = r.decode_command_header()?;
                Ok(Some(h.offset))
            }
            resp::QUERY_NOT_FOUND => Ok(None),
            _ => Err(ClientError::server("QUERY_CONSUMER_OFFSET", &r)),
        }
    }

    fn update_offset_req(&self, group: &str, mq: &MessageQueue, offset: i64) -> RemotingCommand {
        let mut req = RemotingCommand::request_with_header(
            rc::UPDATE_CONSUMER_OFFSET,
            &UpdateConsumerOffsetRequestHeader {
                consumer_group: group.to_owned(),
                topic: mq.topic.clone(),
                queue_id: mq.queue_id,
                commit_offset: offset,
                rpc: RpcFields::with_broker_name(&mq.broker_name),
            },
        );
        self.stamp(group, &mut req);
        req
    }

    /// Coordinated mode: the member id and epoch to stamp on this group's pulls, commits and
    /// lock requests (`None`: classic, unstamped).
    pub fn set_member_stamp(&self, group: &str, stamp: Option<(String, i32)>) {
        let mut m = self.inner.stamps.lock();
        match stamp {
            Some(s) => {
                m.insert(group.to_string(), s);
            }
            None => {
                m.remove(group);
            }
        }
    }

    fn stamp(&self, group: &str, req: &mut RemotingCommand) {
        if let Some((id, epoch)) = self.inner.stamps.lock().get(group) {
            shoal_proto::coordinated::stamp(req, id, *epoch);
        }
    }

    /// UPDATE_CONSUMER_OFFSET, waiting for the answer.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn update_consumer_offset(
        &self,
        group: &str,
        mq: &MessageQueue,
        offset: i64,
    ) -> Result<()> {
        self.call_broker(
            "UPDATE_CONSUMER_OFFSET",
            mq,
            self.update_offset_req(group, mq, offset),
        )
        .await
        .map(|_| ())
    }

    /// UPDATE_CONSUMER_OFFSET, oneway (the 5 s persistence).
    ///
    /// # Errors
    /// Transport errors.
    pub async fn update_consumer_offset_oneway(
        &self,
        group: &str,
        mq: &MessageQueue,
        offset: i64,
    ) -> Result<()> {
        let addr = self.find_master_addr(&mq.broker_name, &mq.topic).await?;
        self.invoke_oneway(&addr, self.update_offset_req(group, mq, offset))
            .await
    }

    /// GET_MAX_OFFSET: the next offset to be written in a queue.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn max_offset(&self, mq: &MessageQueue) -> Result<i64> {
        let req = RemotingCommand::request_with_header(
            rc::GET_MAX_OFFSET,
            &GetMaxOffsetRequestHeader {
                topic: mq.topic.clone(),
                queue_id: mq.queue_id,
                committed: true,
                rpc: RpcFields::with_broker_name(&mq.broker_name),
            },
        );
        let r = self.call_broker("GET_MAX_OFFSET", mq, req).await?;
        Ok(r.decode_command_header::<GetMaxOffsetResponseHeader>()?
            .offset)
    }

    /// GET_MIN_OFFSET: the smallest offset still in a queue.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn min_offset(&self, mq: &MessageQueue) -> Result<i64> {
        let req = RemotingCommand::request_with_header(
            rc::GET_MIN_OFFSET,
            &GetMinOffsetRequestHeader {
                topic: mq.topic.clone(),
                queue_id: mq.queue_id,
                rpc: RpcFields::with_broker_name(&mq.broker_name),
            },
        );
        let r = self.call_broker("GET_MIN_OFFSET", mq, req).await?;
        Ok(r.decode_command_header::<GetMinOffsetResponseHeader>()?
            .offset)
    }

    /// SEARCH_OFFSET_BY_TIMESTAMP: the first offset stored at or after `timestamp_ms`.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn search_offset(&self, mq: &MessageQueue, timestamp_ms: i64) -> Result<i64> {
        let req = RemotingCommand::request_with_header(
            rc::SEARCH_OFFSET_BY_TIMESTAMP,
            &SearchOffsetRequestHeader {
                topic: mq.topic.clone(),
                queue_id: mq.queue_id,
                timestamp: timestamp_ms,
                boundary_type: None,
                rpc: RpcFields::with_broker_name(&mq.broker_name),
            },
        );
        let r = self
            .call_broker("SEARCH_OFFSET_BY_TIMESTAMP", mq, req)
            .await?;
        Ok(r.decode_command_header::<SearchOffsetResponseHeader>()?
            .offset)
    }

    /// GET_CONSUMER_LIST_BY_GROUP sent to one broker of `topic` (a random one, spec 7.3).
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn consumer_ids(&self, group: &str, topic: &str) -> Result<Vec<String>> {
        let route = self.route(topic).await?;
        let addrs: Vec<String> = route
            .broker_datas
            .iter()
            .filter_map(|b| b.master_addr().map(str::to_owned))
            .collect();
        if addrs.is_empty() {
            return Err(ClientError::NoRoute(topic.to_owned()));
        }
        let addr = addrs
            .get(rand::random::<usize>() % addrs.len())
            .cloned()
            .unwrap_or_default();
        let req = RemotingCommand::request_with_header(
            rc::GET_CONSUMER_LIST_BY_GROUP,
            &GetConsumerListByGroupRequestHeader {
                consumer_group: group.to_owned(),
                ..Default::default()
            },
        );
        let r = ok_or(
            "GET_CONSUMER_LIST_BY_GROUP",
            self.invoke(&addr, req, self.inner.config.rpc_timeout)
                .await?,
        )?;
        let body: GetConsumerListByGroupResponseBody = r.decode_json_body()?;
        Ok(body.consumer_id_list)
    }

    /// LOCK_BATCH_MQ on one broker: returns the queues locked for this client.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn lock_batch(
        &self,
        group: &str,
        broker_name: &str,
        topic: &str,
        mqs: Vec<MessageQueue>,
    ) -> Result<Vec<MessageQueue>> {
        let addr = self.find_master_addr(broker_name, topic).await?;
        let body = LockBatchRequestBody {
            client_id: self.inner.client_id.clone(),
            consumer_group: group.to_owned(),
            mq_set: mqs,
            only_this_broker: false,
        };
        let mut req = RemotingCommand::request(rc::LOCK_BATCH_MQ)
            .with_ext_fields(Default::default())
            .with_json_body(&body)?;
        self.stamp(group, &mut req);
        let r = ok_or(
            "LOCK_BATCH_MQ",
            self.invoke(&addr, req, self.inner.config.rpc_timeout)
                .await?,
        )?;
        let body: LockBatchResponseBody = r.decode_json_body()?;
        Ok(body.lock_ok_mq_set)
    }

    /// LOCK_BATCH_MQ asking for Shoal session locks (the broker must be a Shoal broker with
    /// session locks; an Apache RocketMQ broker ignores the extra fields and answers as
    /// [`ClientInstance::lock_batch`]).
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn lock_batch_session(
        &self,
        group: &str,
        broker_name: &str,
        topic: &str,
        mqs: Vec<MessageQueue>,
        orderly: bool,
        want_offsets: bool,
    ) -> Result<LockGrant> {
        let addr = self.find_master_addr(broker_name, topic).await?;
        let body = LockBatchRequestBody {
            client_id: self.inner.client_id.clone(),
            consumer_group: group.to_owned(),
            mq_set: mqs,
            only_this_broker: false,
        };
        let mut ext = shoal_proto::command::ExtFields::new();
        ext.insert(shoal_proto::ext::field::LEASE, "true");
        ext.insert(shoal_proto::ext::field::ORDERLY, orderly.to_string());
        if want_offsets {
            ext.insert(shoal_proto::ext::field::WANT_OFFSETS, "true");
        }
        let mut req = RemotingCommand::request(rc::LOCK_BATCH_MQ)
            .with_ext_fields(ext)
            .with_json_body(&body)?;
        self.stamp(group, &mut req);
        let r = ok_or(
            "LOCK_BATCH_MQ",
            self.invoke(&addr, req, self.inner.config.rpc_timeout)
                .await?,
        )?;
        let session = r
            .ext(shoal_proto::ext::field::SESSION)
            .and_then(|s| s.parse().ok());
        let committed = r
            .ext(shoal_proto::ext::field::COMMITTED_OFFSETS)
            .map(shoal_proto::ext::decode_queue_offsets)
            .unwrap_or_default();
        let body: LockBatchResponseBody = r.decode_json_body()?;
        Ok(LockGrant {
            locked: body.lock_ok_mq_set,
            session,
            committed,
        })
    }

    /// UNLOCK_BATCH_MQ of one queue carrying its final commit (a Shoal broker with
    /// `commitOnUnlock`: it stores the offset, fenced as any commit, then frees the lock),
    /// waiting for the answer.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn unlock_with_commit(
        &self,
        group: &str,
        mq: &MessageQueue,
        offset: i64,
    ) -> Result<()> {
        let addr = self.find_master_addr(&mq.broker_name, &mq.topic).await?;
        let body = UnlockBatchRequestBody {
            client_id: self.inner.client_id.clone(),
            consumer_group: group.to_owned(),
            mq_set: vec![mq.clone()],
            only_this_broker: false,
        };
        let mut ext = shoal_proto::command::ExtFields::new();
        ext.insert(
            shoal_proto::ext::field::COMMIT,
            shoal_proto::ext::encode_queue_offsets([(mq.topic.as_str(), mq.queue_id, offset)]),
        );
        let mut req = RemotingCommand::request(rc::UNLOCK_BATCH_MQ)
            .with_ext_fields(ext)
            .with_json_body(&body)?;
        self.stamp(group, &mut req);
        ok_or(
            "UNLOCK_BATCH_MQ",
            self.invoke(&addr, req, self.inner.config.rpc_timeout)
                .await?,
        )
        .map(|_| ())
    }

    /// UPDATE_CONSUMER_OFFSET of an offset that may be below the stored one on purpose (a seek
    /// back or an offset reset by a Shoal member), waiting for the answer.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn rewind_consumer_offset(
        &self,
        group: &str,
        mq: &MessageQueue,
        offset: i64,
    ) -> Result<()> {
        let mut req = self.update_offset_req(group, mq, offset);
        req.ext_fields
            .get_or_insert_with(Default::default)
            .insert(shoal_proto::ext::field::REWIND, "true");
        self.call_broker("UPDATE_CONSUMER_OFFSET", mq, req)
            .await
            .map(|_| ())
    }

    /// UNLOCK_BATCH_MQ on one broker, waiting for the answer.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn unlock_batch(
        &self,
        group: &str,
        broker_name: &str,
        topic: &str,
        mqs: Vec<MessageQueue>,
    ) -> Result<()> {
        let addr = self.find_master_addr(broker_name, topic).await?;
        let body = UnlockBatchRequestBody {
            client_id: self.inner.client_id.clone(),
            consumer_group: group.to_owned(),
            mq_set: mqs,
            only_this_broker: false,
        };
        let req = RemotingCommand::request(rc::UNLOCK_BATCH_MQ)
            .with_ext_fields(Default::default())
            .with_json_body(&body)?;
        ok_or(
            "UNLOCK_BATCH_MQ",
            self.invoke(&addr, req, self.inner.config.rpc_timeout)
                .await?,
        )
        .map(|_| ())
    }

    /// CONSUMER_SEND_MSG_BACK for a message that came from `broker_name`.
    ///
    /// # Errors
    /// Transport errors and a non-SUCCESS answer.
    pub async fn send_back(
        &self,
        broker_name: &str,
        group: &str,
        msg: &MessageExt,
        delay_level: i32,
        max_reconsume_times: i32,
    ) -> Result<()> {
        let addr = self.find_master_addr(broker_name, &msg.topic).await?;
        let req = RemotingCommand::request_with_header(
            rc::CONSUMER_SEND_MSG_BACK,
            &ConsumerSendMsgBackRequestHeader {
                offset: msg.commit_log_offset,
                group: group.to_owned(),
                delay_level,
                origin_msg_id: Some(msg.msg_id().into_owned()),
                origin_topic: Some(msg.topic.clone()),
                unit_mode: false,
                max_reconsume_times: Some(max_reconsume_times),
                rpc: RpcFields::with_broker_name(broker_name),
            },
        );
        ok_or(
            "CONSUMER_SEND_MSG_BACK",
            self.invoke(&addr, req, self.inner.config.rpc_timeout)
                .await?,
        )
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_net::Server;

    /// A consumer handle that records what the processor asked of it.
    #[derive(Default)]
    struct Recorder {
        rebalances: Mutex<usize>,
        resets: Mutex<Vec<(String, BTreeMap<MessageQueue, i64>)>>,
    }

    impl ConsumerHandle for Recorder {
        fn consumer_data(&self) -> ConsumerData {
            ConsumerData {
                group_name: "G".into(),
                ..Default::default()
            }
        }
        fn subscribed_topics(&self) -> Vec<String> {
            vec!["T".into()]
        }
        fn rebalance_now(&self) {
            *self.rebalances.lock() += 1;
        }
        fn running_info(&self) -> ConsumerRunningInfo {
            let mut info = ConsumerRunningInfo::default();
            info.properties.insert("k".into(), "v".into());
            info
        }
        fn reset_offset(&self, topic: &str, offsets: BTreeMap<MessageQueue, i64>) {
            self.resets.lock().push((topic.to_owned(), offsets));
        }
        fn consume_directly(
            &self,
            _msg: MessageExt,
        ) -> BoxFuture<'static, ConsumeMessageDirectlyResult> {
            Box::pin(async { ConsumeMessageDirectlyResult::default() })
        }
    }

    /// A broker stand-in that, once the client connected, sends it server-initiated requests.
    #[tokio::test]
    async fn processor_answers_broker_requests() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let server = Server::bind(
            "127.0.0.1:0",
            Arc::new(shoal_net::processor_fn(move |ctx, _req| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(ctx.connection().clone());
                    Ok(Some(RemotingCommand::response(resp::SUCCESS, None)))
                }
            })),
        )
        .await
        .unwrap();
        let addr = server.local_addr().to_string();
        let instance = ClientInstance::start(ClientConfig::new(&addr)).unwrap();
        let rec = Arc::new(Recorder::default());
        let weak: Weak<dyn ConsumerHandle> =
            Arc::downgrade(&(rec.clone() as Arc<dyn ConsumerHandle>));
        instance.register_consumer("G", weak);
        let r = instance
            .invoke(
                &addr,
                RemotingCommand::request(rc::HEART_BEAT),
                Duration::from_secs(3),
            )
            .await
            .unwrap();
        assert_eq!(r.code, resp::SUCCESS);
        let conn = rx.recv().await.unwrap();
        let t = Duration::from_secs(3);

        // GET_CONSUMER_RUNNING_INFO for a known and an unknown group.
        let req = RemotingCommand::request_with_header(
            rc::GET_CONSUMER_RUNNING_INFO,
            &GetConsumerRunningInfoRequestHeader {
                consumer_group: "G".into(),
                client_id: instance.client_id().into(),
                ..Default::default()
            },
        );
        let r = conn.request(req, t).await.unwrap();
        assert_eq!(r.code, resp::SUCCESS);
        let info: ConsumerRunningInfo = r.decode_json_body().unwrap();
        assert_eq!(info.properties.get("k").map(String::as_str), Some("v"));
        let req = RemotingCommand::request_with_header(
            rc::GET_CONSUMER_RUNNING_INFO,
            &GetConsumerRunningInfoRequestHeader {
                consumer_group: "nope".into(),
                client_id: "x".into(),
                ..Default::default()
            },
        );
        let r = conn.request(req, t).await.unwrap();
        assert_eq!(r.code, resp::SYSTEM_ERROR);
        assert!(r.remark.unwrap().contains("nope"));

        // NOTIFY (oneway) triggers a rebalance; RESET passes the table on.
        let mut notify = RemotingCommand::request_with_header(
            rc::NOTIFY_CONSUMER_IDS_CHANGED,
            &NotifyConsumerIdsChangedRequestHeader {
                consumer_group: "G".into(),
                ..Default::default()
            },
        );
        notify.set_oneway();
        conn.oneway(notify).await.unwrap();
        let mut table = BTreeMap::new();
        table.insert(MessageQueue::new("T", "b", 1), 42);
        let reset = RemotingCommand::request_with_header(
            rc::RESET_CONSUMER_CLIENT_OFFSET,
            &ResetOffsetRequestHeader {
                topic: "T".into(),
                group: "G".into(),
                timestamp: 0,
                ..Default::default()
            },
        )
        .with_json_body(&ResetOffsetBody {
            offset_table: table.clone(),
        })
        .unwrap();
        conn.oneway(reset).await.unwrap();
        for _ in 0..200 {
            if *rec.rebalances.lock() == 1 && rec.resets.lock().len() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(*rec.rebalances.lock(), 1);
        assert_eq!(rec.resets.lock()[0], ("T".to_owned(), table));

        // Unknown codes.
        let r = conn
            .request(RemotingCommand::request(999_999), t)
            .await
            .unwrap();
        assert_eq!(r.code, resp::REQUEST_CODE_NOT_SUPPORTED);
        instance.shutdown();
        server.shutdown().await;
    }
}
