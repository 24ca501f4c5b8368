//! The name server process: a [`RouteTable`] behind the remoting protocol.

use crate::metrics::{NamesrvMetrics, RouteStats, RouteStatsSource};
use crate::route::{BrokerRegistration, ChangedTopics, QueueInfo, RouteTable, TopicRegistration};
use crate::watch::{RouteWatches, Watch, WatchLimit};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use shoal_net::{
    request_code_not_supported, Connection, NetConfig, ProcessResult, Processor, RequestContext,
    Server,
};
use shoal_proto::body::{
    BrokerData, ClusterInfo, KVTable, QueueData, RegisterBrokerBody, TopicList, TopicRouteData,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::{
    AddWritePermOfBrokerRequestHeader, AddWritePermOfBrokerResponseHeader,
    WipeWritePermOfBrokerRequestHeader, WipeWritePermOfBrokerResponseHeader,
};
use shoal_proto::header::{
    BrokerHeartbeatRequestHeader, DeleteKvConfigRequestHeader, DeleteTopicFromNamesrvRequestHeader,
    GetKvConfigRequestHeader, GetKvConfigResponseHeader, GetKvListByNamespaceRequestHeader,
    GetRouteInfoRequestHeader, GetTopicsByClusterRequestHeader, PutKvConfigRequestHeader,
    RegisterBrokerRequestHeader, RegisterBrokerResponseHeader, UnregisterBrokerRequestHeader,
};
use shoal_proto::message::body_crc;
use shoal_proto::RemotingCommand;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

/// The client version (`MQVersion` ordinal of V4_9_4) from which routes are sent as standard
/// JSON; older clients get fastjson's bare numeric map keys (spec 1.6, 3.1).
const STANDARD_JSON_ROUTE_VERSION: i32 = 401;

/// Name server settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamesrvConfig {
    /// Address to listen on (port 0 picks a free port).
    pub listen_addr: String,
    /// How often expired brokers are looked for (RocketMQ: 5 s).
    pub scan_interval: Duration,
    /// Broker expiry when a broker does not say (RocketMQ: 120 s).
    pub default_broker_timeout: Duration,
    /// ACL: when set, requests that change routes or settings (REGISTER_BROKER,
    /// UNREGISTER_BROKER, topic deletion, KV config, broker write permission) must be signed by
    /// an admin account (or come from a globally allowed address), so a fake broker cannot
    /// register routes. Route queries stay open.
    pub acl: Option<shoal_proto::acl::PlainAclConfig>,
    /// TLS of the listener (RocketMQ `tls.server.mode`: disabled, permissive, enforcing).
    pub tls: shoal_net::ServerTls,
    /// Transport limits of the listener (frame size, requests in flight, answers waiting,
    /// idle timeout, partial frames, connections per IP).
    pub net: NetConfig,
    /// Pushed routes: (connection, topic) watches held at most, over every connection
    /// (`max_route_watches`); a watch over the limit is refused and the client keeps polling.
    pub max_route_watches: usize,
    /// Pushed routes: topics one connection may watch (`max_route_watches_per_connection`).
    pub max_route_watches_per_connection: usize,
}

/// Default of [`NamesrvConfig::max_route_watches`].
pub const DEFAULT_MAX_ROUTE_WATCHES: usize = 100_000;
/// Default of [`NamesrvConfig::max_route_watches_per_connection`].
pub const DEFAULT_MAX_ROUTE_WATCHES_PER_CONNECTION: usize = 1_000;

/// Name server requests that need an admin account when ACL is on.
pub const NAMESRV_WRITE_CODES: &[i32] = &[
    rc::REGISTER_BROKER,
    rc::UNREGISTER_BROKER,
    rc::BROKER_HEARTBEAT,
    rc::DELETE_TOPIC_IN_NAMESRV,
    rc::REGISTER_TOPIC_IN_NAMESRV,
    rc::PUT_KV_CONFIG,
    rc::DELETE_KV_CONFIG,
    rc::UPDATE_NAMESRV_CONFIG,
    rc::WIPE_WRITE_PERM_OF_BROKER,
    rc::ADD_WRITE_PERM_OF_BROKER,
];

impl Default for NamesrvConfig {
    fn default() -> Self {
        Self {
            listen_addr: "127.0.0.1:9876".into(),
            scan_interval: Duration::from_secs(5),
            default_broker_timeout: Duration::from_secs(120),
            acl: None,
            tls: shoal_net::ServerTls::disabled(),
            net: NetConfig::default(),
            max_route_watches: DEFAULT_MAX_ROUTE_WATCHES,
            max_route_watches_per_connection: DEFAULT_MAX_ROUTE_WATCHES_PER_CONNECTION,
        }
    }
}

/// Errors starting the name server.
#[derive(Debug, thiserror::Error)]
pub enum NamesrvError {
    /// The listen address could not be bound.
    #[error("name server cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: String,
        /// Cause.
        source: shoal_net::NetError,
    },
    /// The ACL configuration is invalid.
    #[error("name server ACL: {0}")]
    Acl(String),
}

struct State {
    routes: RouteTable,
    kv: BTreeMap<String, BTreeMap<String, String>>,
}

/// The request processor of the name server.
pub struct NamesrvProcessor {
    state: Mutex<State>,
    /// Route watches of Shoal clients (its own lock, never taken with `state`'s: a watch is
    /// taken before the route is read, and notices are computed after a change is applied, so
    /// no change falls between the two).
    watches: Mutex<RouteWatches<Connection>>,
    metrics: Arc<NamesrvMetrics>,
    started: Instant,
    default_timeout_ms: u64,
    acl: Option<shoal_proto::acl::AccessControl>,
    acl_refused: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for NamesrvProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamesrvProcessor").finish_non_exhaustive()
    }
}

impl RouteStatsSource for NamesrvProcessor {
    fn route_stats(&self) -> RouteStats {
        let (brokers, topics) = self.sizes();
        let departed_slots = self.departed_slots();
        let w = self.watches.lock();
        RouteStats {
            brokers,
            topics,
            watches: w.len(),
            watching_connections: w.connections(),
            watch_refused_total: w.refused(WatchLimit::Total),
            watch_refused_per_connection: w.refused(WatchLimit::PerConnection),
            departed_slots,
        }
    }
}

type Handled = Result<RemotingCommand, (i32, String)>;

fn bad_request(e: impl std::fmt::Display) -> (i32, String) {
    (resp::SYSTEM_ERROR, e.to_string())
}

impl NamesrvProcessor {
    /// A processor with an empty route table.
    pub fn new(config: &NamesrvConfig) -> Result<Self, NamesrvError> {
        let acl = match &config.acl {
            Some(c) => Some(shoal_proto::acl::AccessControl::new(c).map_err(NamesrvError::Acl)?),
            None => None,
        };
        Ok(Self {
            acl,
            acl_refused: std::sync::atomic::AtomicU64::new(0),
            state: Mutex::new(State {
                routes: RouteTable::new(),
                kv: BTreeMap::new(),
            }),
            watches: Mutex::new(RouteWatches::new(
                config.max_route_watches,
                config.max_route_watches_per_connection,
            )),
            metrics: Arc::new(NamesrvMetrics::new()),
            started: Instant::now(),
            default_timeout_ms: config.default_broker_timeout.as_millis() as u64,
        })
    }

    /// Requests refused by the ACL so far.
    pub fn acl_refused(&self) -> u64 {
        self.acl_refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The ACL's answer for a request, when it is refused.
    fn refused(&self, ctx: &RequestContext, req: &RemotingCommand) -> Option<RemotingCommand> {
        let acl = self.acl.as_ref()?;
        if !NAMESRV_WRITE_CODES.contains(&req.code) {
            return None;
        }
        let access = shoal_proto::acl::AccessRequest::parse(req, ctx.peer_addr().ip());
        let denied = acl.check(&access, NAMESRV_WRITE_CODES).err()?;
        let n = self
            .acl_refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        if n.is_power_of_two() {
            warn!(peer = %ctx.peer_addr(), code = req.code, reason = %denied, refused = n, "name server request refused by the ACL");
        }
        Some(RemotingCommand::response(
            shoal_proto::code::response_code::NO_PERMISSION,
            Some(denied.0),
        ))
    }

    /// The name server's metrics (registry served at `/metrics` by the `shoal` binary).
    pub fn metrics(&self) -> &Arc<NamesrvMetrics> {
        &self.metrics
    }

    /// Brokers registered and topics known now.
    pub fn sizes(&self) -> (usize, usize) {
        let st = self.state.lock();
        let (_, brokers) = st.routes.cluster_info();
        (brokers.len(), st.routes.topics().len())
    }

    /// Places of departed broker groups kept for Kafka's numbering.
    fn departed_slots(&self) -> usize {
        self.state.lock().routes.departed_slots()
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Removes expired brokers; returns how many left.
    pub fn scan_expired(&self) -> usize {
        let now = self.now_ms();
        let removed = self.state.lock().routes.expire(now);
        let mut changed = ChangedTopics::new();
        for b in &removed {
            warn!(broker = %b.broker_name, addr = %b.broker_addr, "broker expired: no registration within its timeout");
            changed.extend(b.changed_topics.iter().cloned());
        }
        self.notify_watchers(&changed);
        removed.len()
    }

    /// Route watches held now (connection, topic pairs).
    pub fn route_watches(&self) -> usize {
        self.watches.lock().len()
    }

    /// Tells the connections watching `changed` topics (NOTIFY_ROUTE_CHANGED, oneway, sent
    /// in the background; a closed connection just misses it and its watches end with it).
    fn notify_watchers(&self, changed: &ChangedTopics) {
        if changed.is_empty() {
            return;
        }
        let notices = self.watches.lock().notices(changed);
        if notices.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        debug!(
            topics = changed.len(),
            connections = notices.len(),
            "routes changed: telling the watchers"
        );
        for (conn, topics) in notices {
            let Ok(req) = shoal_proto::route_watch::notice(topics) else {
                continue;
            };
            self.metrics.route_notices.inc();
            rt.spawn(async move {
                if let Err(e) = conn.oneway(req).await {
                    debug!(peer = %conn.peer_addr(), error = %e, "a route notice was not sent");
                }
            });
        }
    }

    fn handle(&self, conn: &Connection, req: &RemotingCommand) -> Option<Handled> {
        Some(match req.code {
            rc::REGISTER_BROKER => self.register_broker(conn, req),
            rc::UNREGISTER_BROKER => self.unregister_broker(req),
            rc::BROKER_HEARTBEAT => self.broker_heartbeat(conn, req),
            rc::GET_ROUTEINFO_BY_TOPIC => self.route(conn, req),
            rc::WIPE_WRITE_PERM_OF_BROKER => self.wipe_write_perm(req),
            rc::ADD_WRITE_PERM_OF_BROKER => self.add_write_perm(req),
            rc::GET_BROKER_CLUSTER_INFO => self.cluster_info(req),
            rc::GET_ALL_TOPIC_LIST_FROM_NAMESERVER => {
                let topics = self.state.lock().routes.topics();
                json_ok(&TopicList {
                    broker_addr: None,
                    topic_list: topics.into_iter().collect(),
                })
            }
            rc::GET_TOPICS_BY_CLUSTER => self.topics_by_cluster(req),
            rc::DELETE_TOPIC_IN_NAMESRV => self.delete_topic(req),
            rc::PUT_KV_CONFIG => self.put_kv(req),
            rc::GET_KV_CONFIG => self.get_kv(req),
            rc::DELETE_KV_CONFIG => self.delete_kv(req),
            rc::GET_KVLIST_BY_NAMESPACE => self.kv_list(req),
            _ => return None,
        })
    }

    fn register_broker(&self, conn: &Connection, req: &RemotingCommand) -> Handled {
        let h: RegisterBrokerRequestHeader = req.decode_command_header().map_err(bad_request)?;
        let body = req.body.as_deref().unwrap_or_default();
        if h.body_crc32 != 0 && body_crc(body) as i32 != h.body_crc32 {
            return Err((resp::SYSTEM_ERROR, "crc32 not match".into()));
        }
        let reg_body: RegisterBrokerBody = if body.is_empty() {
            RegisterBrokerBody::default()
        } else if h.compressed {
            RegisterBrokerBody::decode_compressed(body, req.version).map_err(bad_request)?
        } else {
            shoal_proto::body::from_json_slice(body).map_err(bad_request)?
        };
        let wrapper = reg_body.topic_config_serialize_wrapper;
        let dv = &wrapper.data_version;
        let reg = BrokerRegistration {
            cluster: h.cluster_name.clone(),
            broker_addr: h.broker_addr.clone(),
            broker_name: h.broker_name.clone(),
            broker_id: h.broker_id,
            ha_server_addr: h.ha_server_addr.clone(),
            zone_name: h.zone_name.clone(),
            heartbeat_timeout_ms: h
                .heartbeat_timeout_millis
                .filter(|t| *t > 0)
                .map(|t| t as u64)
                .unwrap_or(self.default_timeout_ms),
            enable_acting_master: h.enable_acting_master.unwrap_or(false),
            topics: wrapper
                .topic_config_table
                .values()
                .map(|t| TopicRegistration {
                    topic: t.topic_name.clone(),
                    queues: QueueInfo {
                        read_queue_nums: t.read_queue_nums,
                        write_queue_nums: t.write_queue_nums,
                        perm: t.perm,
                        topic_sys_flag: t.topic_sys_flag,
                    },
                })
                .collect(),
            kafka: shoal_proto::kafka_cluster::announced(req),
            data_version: (dv.timestamp != 0 || dv.counter != 0)
                .then_some((dv.timestamp, dv.counter)),
            connection_id: Some(conn.id()),
        };
        let now = self.now_ms();
        let mut result = {
            let mut st = self.state.lock();
            let first = !st.routes.has_broker(&h.broker_name);
            let r = st.routes.register(reg, now);
            if first {
                info!(broker = %h.broker_name, addr = %h.broker_addr, cluster = %h.cluster_name, "broker registered");
            }
            r
        };
        self.notify_watchers(&std::mem::take(&mut result.changed_topics));
        let header = RegisterBrokerResponseHeader {
            ha_server_addr: result.ha_server_addr,
            master_addr: result.master_addr,
        };
        Ok(RemotingCommand::response(resp::SUCCESS, None).with_header(&header))
    }

    fn unregister_broker(&self, req: &RemotingCommand) -> Handled {
        let h: UnregisterBrokerRequestHeader = req.decode_command_header().map_err(bad_request)?;
        let removed = self.state.lock().routes.unregister(
            &h.cluster_name,
            &h.broker_addr,
            &h.broker_name,
            h.broker_id,
        );
        if let Some(r) = removed {
            info!(broker = %h.broker_name, addr = %h.broker_addr, "broker unregistered");
            self.notify_watchers(&r.changed_topics);
        }
        Ok(RemotingCommand::response(resp::SUCCESS, None))
    }

    fn wipe_write_perm(&self, req: &RemotingCommand) -> Handled {
        let h: WipeWritePermOfBrokerRequestHeader =
            req.decode_command_header().map_err(bad_request)?;
        let changed = self.state.lock().routes.wipe_write_perm(&h.broker_name);
        info!(broker = %h.broker_name, topics = changed.len(), "write permission of a broker wiped");
        self.notify_watchers(&changed);
        Ok(RemotingCommand::response(resp::SUCCESS, None).with_header(
            &WipeWritePermOfBrokerResponseHeader {
                wipe_topic_count: changed.len() as i32,
            },
        ))
    }

    fn add_write_perm(&self, req: &RemotingCommand) -> Handled {
        let h: AddWritePermOfBrokerRequestHeader =
            req.decode_command_header().map_err(bad_request)?;
        let changed = self.state.lock().routes.add_write_perm(&h.broker_name);
        info!(broker = %h.broker_name, topics = changed.len(), "write permission of a broker restored");
        self.notify_watchers(&changed);
        Ok(RemotingCommand::response(resp::SUCCESS, None).with_header(
            &AddWritePermOfBrokerResponseHeader {
                add_topic_count: changed.len() as i32,
            },
        ))
    }

    fn broker_heartbeat(&self, _conn: &Connection, req: &RemotingCommand) -> Handled {
        let h: BrokerHeartbeatRequestHeader = req.decode_command_header().map_err(bad_request)?;
        let now = self.now_ms();
        self.state
            .lock()
            .routes
            .touch(&h.cluster_name, &h.broker_addr, now);
        Ok(RemotingCommand::response(resp::SUCCESS, None))
    }

    fn route(&self, conn: &Connection, req: &RemotingCommand) -> Handled {
        let h: GetRouteInfoRequestHeader = req.decode_command_header().map_err(bad_request)?;
        // The watch first, then the route: a change either shows in this answer or is
        // pushed after it.
        let watched = shoal_proto::route_watch::wants_watch(req).then(|| {
            let w = self.watches.lock().watch(conn.id(), conn, &h.topic);
            if let Watch::Refused(limit) = w {
                let n = self.watches.lock().refused(limit);
                if n.is_power_of_two() {
                    warn!(peer = %conn.peer_addr(), topic = %h.topic, limit = limit.key(), refused = n, "route watch refused: limit reached (the client keeps polling)");
                }
            }
            w == Watch::Watching
        });
        let route = self.state.lock().routes.route(&h.topic);
        let Some(route) = route else {
            return Err((
                resp::TOPIC_NOT_EXIST,
                format!(
                    "No topic route info in name server for the topic: {}",
                    h.topic
                ),
            ));
        };
        let with_kafka = shoal_proto::kafka_cluster::wants_listeners(req);
        let mut answer = RemotingCommand::response(resp::SUCCESS, None);
        if let Some(watched) = watched {
            answer
                .ext_fields
                .get_or_insert_with(Default::default)
                .insert(
                    shoal_proto::route_watch::field::WATCHED,
                    if watched { "true" } else { "false" },
                );
        }
        let data = TopicRouteData {
            broker_datas: route
                .brokers
                .iter()
                .map(|b| broker_data(b, with_kafka))
                .collect(),
            filter_server_table: BTreeMap::new(),
            order_topic_conf: self
                .state
                .lock()
                .kv
                .get(ORDER_TOPIC_CONFIG_NAMESPACE)
                .and_then(|ns| ns.get(&h.topic))
                .cloned(),
            queue_datas: route
                .queues
                .iter()
                .map(|(name, q)| QueueData {
                    broker_name: name.clone(),
                    perm: q.perm,
                    read_queue_nums: q.read_queue_nums,
                    topic_sys_flag: q.topic_sys_flag,
                    write_queue_nums: q.write_queue_nums,
                })
                .collect(),
            topic_queue_mapping_by_broker: None,
            kafka_departed: (with_kafka && !route.departed.is_empty())
                .then(|| route.departed.clone()),
        };
        let standard = req.version >= STANDARD_JSON_ROUTE_VERSION
            || h.accept_standard_json_only.unwrap_or(false);
        let body = if standard {
            shoal_proto::body::to_json_bytes(&data).map_err(bad_request)?
        } else {
            fastjson_route_bytes(&data).map_err(bad_request)?
        };
        Ok(answer.with_body(body))
    }

    fn cluster_info(&self, req: &RemotingCommand) -> Handled {
        let with_kafka = shoal_proto::kafka_cluster::wants_listeners(req);
        let (brokers, clusters) = self.state.lock().routes.cluster_info();
        json_ok(&ClusterInfo {
            broker_addr_table: brokers
                .iter()
                .map(|(n, b)| (n.clone(), broker_data(b, with_kafka)))
                .collect(),
            cluster_addr_table: clusters,
        })
    }

    fn topics_by_cluster(&self, req: &RemotingCommand) -> Handled {
        let h: GetTopicsByClusterRequestHeader =
            req.decode_command_header().map_err(bad_request)?;
        let topics = self.state.lock().routes.topics_of_cluster(&h.cluster);
        json_ok(&TopicList {
            broker_addr: None,
            topic_list: topics.into_iter().collect::<BTreeSet<_>>(),
        })
    }

    fn delete_topic(&self, req: &RemotingCommand) -> Handled {
        let h: DeleteTopicFromNamesrvRequestHeader =
            req.decode_command_header().map_err(bad_request)?;
        let deleted = self
            .state
            .lock()
            .routes
            .delete_topic(&h.topic, h.cluster_name.as_deref());
        if deleted {
            self.notify_watchers(&[h.topic.clone()].into());
        }
        Ok(RemotingCommand::response(resp::SUCCESS, None))
    }

    fn put_kv(&self, req: &RemotingCommand) -> Handled {
        let h: PutKvConfigRequestHeader = req.decode_command_header().map_err(bad_request)?;
        self.state
            .lock()
            .kv
            .entry(h.namespace)
            .or_default()
            .insert(h.key, h.value);
        Ok(RemotingCommand::response(resp::SUCCESS, None))
    }

    fn get_kv(&self, req: &RemotingCommand) -> Handled {
        let h: GetKvConfigRequestHeader = req.decode_command_header().map_err(bad_request)?;
        let value = self
            .state
            .lock()
            .kv
            .get(&h.namespace)
            .and_then(|ns| ns.get(&h.key))
            .cloned();
        match value {
            Some(v) => Ok(RemotingCommand::response(resp::SUCCESS, None)
                .with_header(&GetKvConfigResponseHeader { value: Some(v) })),
            None => Err((
                resp::QUERY_NOT_FOUND,
                format!("No config item, Namespace: {} Key: {}", h.namespace, h.key),
            )),
        }
    }

    fn delete_kv(&self, req: &RemotingCommand) -> Handled {
        let h: DeleteKvConfigRequestHeader = req.decode_command_header().map_err(bad_request)?;
        let mut st = self.state.lock();
        if let Some(ns) = st.kv.get_mut(&h.namespace) {
            ns.remove(&h.key);
            if ns.is_empty() {
                st.kv.remove(&h.namespace);
            }
        }
        Ok(RemotingCommand::response(resp::SUCCESS, None))
    }

    fn kv_list(&self, req: &RemotingCommand) -> Handled {
        let h: GetKvListByNamespaceRequestHeader =
            req.decode_command_header().map_err(bad_request)?;
        let table = self.state.lock().kv.get(&h.namespace).cloned();
        match table {
            Some(table) => json_ok(&KVTable { table }),
            None => Err((
                resp::QUERY_NOT_FOUND,
                format!("No config item, Namespace: {}", h.namespace),
            )),
        }
    }
}

/// KV namespace whose entries become a route's `orderTopicConf` (RocketMQ's
/// `NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG`).
pub const ORDER_TOPIC_CONFIG_NAMESPACE: &str = "ORDER_TOPIC_CONFIG";

fn json_ok<T: serde::Serialize>(value: &T) -> Handled {
    let body = shoal_proto::body::to_json_bytes(value).map_err(bad_request)?;
    Ok(RemotingCommand::response(resp::SUCCESS, None).with_body(body))
}

/// A broker group as answers show it; its Kafka listeners only when the request asked.
fn broker_data(b: &crate::route::BrokerInfo, with_kafka: bool) -> BrokerData {
    BrokerData {
        kafka_listeners: with_kafka.then(|| b.kafka_by_id()),
        broker_addrs: b.broker_addrs.clone(),
        broker_name: b.broker_name.clone(),
        cluster: b.cluster.clone(),
        enable_acting_master: b.enable_acting_master,
        zone_name: b.zone_name.clone(),
    }
}

/// The route as fastjson writes it for old clients: `brokerAddrs` with bare numeric keys.
fn fastjson_route_bytes(data: &TopicRouteData) -> shoal_proto::Result<Vec<u8>> {
    let value = serde_json::to_value(data).map_err(|e| shoal_proto::ProtoError::Json {
        what: "TopicRouteData",
        reason: e.to_string(),
    })?;
    let mut out = Vec::with_capacity(256);
    write_fastjson(&value, false, &mut out);
    Ok(out)
}

fn write_fastjson(v: &serde_json::Value, bare_keys: bool, out: &mut Vec<u8>) {
    match v {
        serde_json::Value::Object(map) => {
            out.push(b'{');
            for (i, (k, val)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                if bare_keys && k.parse::<i64>().is_ok() {
                    out.extend_from_slice(k.as_bytes());
                } else {
                    out.extend_from_slice(
                        serde_json::Value::String(k.clone()).to_string().as_bytes(),
                    );
                }
                out.push(b':');
                write_fastjson(val, k == "brokerAddrs", out);
            }
            out.push(b'}');
        }
        serde_json::Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_fastjson(item, false, out);
            }
            out.push(b']');
        }
        other => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

impl Processor for NamesrvProcessor {
    /// Every name server request is answered from its tables at once: handled here, before
    /// the (ready) future is returned.
    fn process(
        &self,
        ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'static, ProcessResult> {
        if let Some(refusal) = self.refused(&ctx, &request) {
            return Box::pin(std::future::ready(Ok(Some(refusal))));
        }
        let start = Instant::now();
        let response = match self.handle(ctx.connection(), &request) {
            None => request_code_not_supported(&request),
            Some(Ok(r)) => r,
            Some(Err((code, remark))) => RemotingCommand::response(code, Some(remark)),
        };
        self.metrics
            .requests
            .observe(request.code, response.code, start.elapsed());
        Box::pin(std::future::ready(Ok(Some(response))))
    }

    fn on_connection_open(&self, _conn: &Connection) {
        self.metrics.connections.inc();
    }

    fn on_connection_close(&self, conn: &Connection) {
        self.metrics.connections.dec();
        self.watches.lock().forget(conn.id());
        let removed = self.state.lock().routes.connection_closed(conn.id());
        let mut changed = ChangedTopics::new();
        for b in removed {
            info!(broker = %b.broker_name, addr = %b.broker_addr, "broker connection closed: removed from routes");
            changed.extend(b.changed_topics);
        }
        self.notify_watchers(&changed);
    }
}

/// A running name server.
#[derive(Debug)]
pub struct NameServer {
    server: Server,
    processor: Arc<NamesrvProcessor>,
    scanner: JoinHandle<()>,
}

impl NameServer {
    /// Binds and starts serving.
    pub async fn start(config: NamesrvConfig) -> Result<NameServer, NamesrvError> {
        let processor = Arc::new(NamesrvProcessor::new(&config)?);
        let server = Server::bind_with_tls(
            config.listen_addr.as_str(),
            processor.clone(),
            config.net.clone(),
            config.tls.clone(),
        )
        .await
        .map_err(|source| NamesrvError::Bind {
            addr: config.listen_addr.clone(),
            source,
        })?;
        processor
            .metrics
            .registry
            .collector(crate::metrics::NamesrvCollector::new(&processor).with_net(server.stats()));
        let p = processor.clone();
        let interval = config.scan_interval;
        let scanner = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                p.scan_expired();
            }
        });
        info!(addr = %server.local_addr(), "name server listening");
        Ok(NameServer {
            server,
            processor,
            scanner,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The processor (route table access for tests and `shoal dev`).
    pub fn processor(&self) -> &Arc<NamesrvProcessor> {
        &self.processor
    }

    /// Stops accepting, closes connections, stops the expiry scanner.
    pub async fn shutdown(self) {
        self.scanner.abort();
        self.server.shutdown().await;
    }
}
