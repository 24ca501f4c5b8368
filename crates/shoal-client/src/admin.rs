//! The admin client: topics, clusters, consumer progress and connections, offset resets,
//! message lookup and DLQ resend — what `mqadmin` does, as async Rust.
//!
//! Every call goes to the name servers for routes and then to the brokers that serve the topic
//! or group.

use shoal_net::{NetConfig, NotSupportedProcessor, RemotingClient};
use shoal_proto::body::{
    ClusterInfo, ConsumeStats, ConsumerConnection, ConsumerRunningInfo, ResetOffsetBody, TopicList,
    TopicRouteData, TopicStatsTable,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::constants::retry_topic;
use shoal_proto::header::*;
use shoal_proto::{MessageQueue, RemotingCommand};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

mod cluster;
mod messages;
pub use cluster::{DrainStatus, GroupDrain, PermChange};

/// Errors of admin calls; each names what failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No name server answered.
    #[error("no name server reachable ({addrs}): {last}")]
    NamesrvUnreachable {
        /// The addresses tried.
        addrs: String,
        /// The last error.
        last: String,
    },
    /// A server could not be reached.
    #[error("{addr}: {source}")]
    Net {
        /// The server.
        addr: String,
        /// Cause.
        source: shoal_net::NetError,
    },
    /// A server refused the request.
    #[error("{what} refused by {addr}: code {code}: {remark}")]
    Refused {
        /// What was asked.
        what: &'static str,
        /// The server.
        addr: String,
        /// Response code.
        code: i32,
        /// Remark.
        remark: String,
    },
    /// The topic has no route (it does not exist).
    #[error("topic {0} does not exist (no route on the name server)")]
    TopicNotFound(String),
    /// The consumer group is unknown everywhere.
    #[error("consumer group {0} is not known to any broker")]
    GroupNotFound(String),
    /// A message was not found.
    #[error("message {0} not found")]
    MessageNotFound(String),
    /// Bad data in an answer.
    #[error("bad answer from {addr}: {source}")]
    Proto {
        /// The server.
        addr: String,
        /// Cause.
        source: shoal_proto::ProtoError,
    },
    /// Bad input from the caller.
    #[error("{0}")]
    Invalid(String),
}

/// Result of admin calls.
pub type AdminResult<T> = Result<T, AdminError>;

/// A topic to create or update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    /// Topic name.
    pub name: String,
    /// Read queues per broker.
    pub read_queues: i32,
    /// Write queues per broker.
    pub write_queues: i32,
    /// Permission bits (6 = read + write).
    pub perm: i32,
    /// Ordered topic.
    pub order: bool,
    /// RocketMQ 5's message type (`message.type` attribute): NORMAL, FIFO, DELAY,
    /// TRANSACTION or MIXED; `None` takes every type.
    pub message_type: Option<shoal_proto::body::TopicMessageType>,
}

impl TopicSpec {
    /// A read-write topic with `queues` queues per broker.
    pub fn new(name: impl Into<String>, queues: i32) -> Self {
        Self {
            name: name.into(),
            read_queues: queues,
            write_queues: queues,
            perm: 6,
            order: false,
            message_type: None,
        }
    }
}

/// One queue's consumption progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueProgress {
    /// The queue.
    pub mq: MessageQueue,
    /// Next offset to be written (max offset).
    pub broker_offset: i64,
    /// The group's committed offset (members commit every 5 s and when they leave).
    pub consumer_offset: i64,
    /// The owner's consumed position (its in-memory offset, ahead of the committed one until
    /// the next commit), when the owner reported its running info.
    pub consumed_offset: Option<i64>,
    /// Messages not yet consumed: broker offset minus the consumed position where the owner
    /// reported it, else minus the committed offset.
    pub lag: i64,
    /// Client id of the member that holds the queue now, if one says so (several ids joined
    /// by `,` when more than one member claims it).
    pub owner: Option<String>,
    /// Store time of the last consumed message (ms, 0 if none).
    pub last_consume_timestamp: i64,
}

/// A group's progress over all its topics and brokers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupProgress {
    /// Per queue, sorted.
    pub queues: Vec<QueueProgress>,
    /// Client ids heartbeated by more than one connection (reported by brokers).
    pub duplicate_client_ids: BTreeSet<String>,
    /// Topics the members subscribe to differently (reported by brokers).
    pub inconsistent_topics: BTreeSet<String>,
    /// Members that did not answer GET_CONSUMER_RUNNING_INFO (their queues show no owner).
    pub unreachable_members: BTreeSet<String>,
}

impl GroupProgress {
    /// Sum of lags.
    pub fn total_lag(&self) -> i64 {
        self.queues.iter().map(|q| q.lag).sum()
    }

    /// Queues with more than one owner, and queues with none: after convergence both are empty.
    pub fn ownership_problems(&self) -> (Vec<MessageQueue>, Vec<MessageQueue>) {
        let shared = self
            .queues
            .iter()
            .filter(|q| q.owner.as_deref().is_some_and(|o| o.contains(',')))
            .map(|q| q.mq.clone())
            .collect();
        let unowned = self
            .queues
            .iter()
            .filter(|q| q.owner.is_none())
            .map(|q| q.mq.clone())
            .collect();
        (shared, unowned)
    }
}

/// One offset reset, planned or applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetReset {
    /// The queue.
    pub mq: MessageQueue,
    /// Committed offset before.
    pub from: i64,
    /// New offset.
    pub to: i64,
}

/// The admin client.
#[derive(Debug, Clone)]
pub struct AdminClient {
    namesrv: Vec<String>,
    net: RemotingClient,
    timeout: Duration,
    credentials: Option<shoal_proto::acl::SessionCredentials>,
    serialize_type: shoal_proto::SerializeType,
}

fn refused(what: &'static str, addr: &str, r: &RemotingCommand) -> AdminError {
    AdminError::Refused {
        what,
        addr: addr.to_string(),
        code: r.code,
        remark: r.remark.clone().unwrap_or_default(),
    }
}

impl AdminClient {
    /// An admin client for the given name servers (`"host:port"`).
    pub fn new(namesrv: Vec<String>) -> Self {
        Self {
            namesrv,
            net: RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor)),
            timeout: Duration::from_secs(5),
            credentials: None,
            serialize_type: shoal_proto::SerializeType::Json,
        }
    }

    /// Encodes request headers as `serialize_type` (JSON by default; see
    /// [`ClientConfig::serialize_type`](crate::ClientConfig::serialize_type)).
    pub fn with_serialize_type(mut self, serialize_type: shoal_proto::SerializeType) -> Self {
        self.serialize_type = serialize_type;
        self
    }

    /// Signs every request with ACL credentials (an admin account for admin requests).
    pub fn with_credentials(mut self, credentials: shoal_proto::acl::SessionCredentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    fn signed(&self, mut req: RemotingCommand) -> RemotingCommand {
        req.serialize_type = self.serialize_type.for_request_code(req.code);
        if let Some(c) = &self.credentials {
            shoal_proto::acl::sign_request(&mut req, c);
        }
        req
    }

    /// Speaks TLS to the name servers and brokers (replaces the connections made so far).
    pub fn with_tls(mut self, tls: shoal_net::ClientTls) -> Self {
        self.net.shutdown();
        self.net = RemotingClient::with_tls(
            NetConfig::default(),
            Arc::new(NotSupportedProcessor),
            Some(tls),
        );
        self
    }

    /// Sets the per-request timeout (5 s by default).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Closes connections.
    pub fn shutdown(&self) {
        self.net.shutdown();
    }

    async fn call(&self, addr: &str, req: RemotingCommand) -> AdminResult<RemotingCommand> {
        self.net
            .invoke(addr, self.signed(req), self.timeout)
            .await
            .map_err(|source| AdminError::Net {
                addr: addr.to_string(),
                source,
            })
    }

    async fn call_ok(
        &self,
        what: &'static str,
        addr: &str,
        req: RemotingCommand,
    ) -> AdminResult<RemotingCommand> {
        let r = self.call(addr, req).await?;
        if r.code != resp::SUCCESS {
            return Err(refused(what, addr, &r));
        }
        Ok(r)
    }

    /// Sends to the first name server that answers; returns its address and the answer.
    async fn namesrv_call(&self, req: RemotingCommand) -> AdminResult<(String, RemotingCommand)> {
        let mut last = String::from("no name server configured");
        for addr in &self.namesrv {
            match self
                .net
                .invoke(addr, self.signed(req.clone()), self.timeout)
                .await
            {
                Ok(r) => return Ok((addr.clone(), r)),
                Err(e) => last = e.to_string(),
            }
        }
        Err(AdminError::NamesrvUnreachable {
            addrs: self.namesrv.join(";"),
            last,
        })
    }

    fn json<T: serde::de::DeserializeOwned>(addr: &str, r: &RemotingCommand) -> AdminResult<T> {
        r.decode_json_body().map_err(|source| AdminError::Proto {
            addr: addr.to_string(),
            source,
        })
    }

    /// The route of a topic.
    pub async fn topic_route(&self, topic: &str) -> AdminResult<TopicRouteData> {
        let req = RemotingCommand::request_with_header(
            rc::GET_ROUTEINFO_BY_TOPIC,
            &GetRouteInfoRequestHeader {
                topic: topic.into(),
                ..Default::default()
            },
        );
        let (addr, r) = self.namesrv_call(req).await?;
        match r.code {
            resp::SUCCESS => Self::json(&addr, &r),
            resp::TOPIC_NOT_EXIST => Err(AdminError::TopicNotFound(topic.into())),
            _ => Err(refused("route lookup", &addr, &r)),
        }
    }

    /// Brokers (by name) and clusters.
    pub async fn cluster_info(&self) -> AdminResult<ClusterInfo> {
        let (addr, r) = self
            .namesrv_call(RemotingCommand::request(rc::GET_BROKER_CLUSTER_INFO))
            .await?;
        if r.code != resp::SUCCESS {
            return Err(refused("cluster info", &addr, &r));
        }
        Self::json(&addr, &r)
    }

    /// Every topic the name servers know.
    pub async fn topic_list(&self) -> AdminResult<BTreeSet<String>> {
        let (addr, r) = self
            .namesrv_call(RemotingCommand::request(
                rc::GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
            ))
            .await?;
        if r.code != resp::SUCCESS {
            return Err(refused("topic list", &addr, &r));
        }
        Ok(Self::json::<TopicList>(&addr, &r)?.topic_list)
    }

    /// Consumer groups known to the brokers (their subscription group tables).
    pub async fn group_list(&self) -> AdminResult<BTreeSet<String>> {
        let mut groups = BTreeSet::new();
        for addr in self.master_addrs(None).await? {
            let r = self
                .call_ok(
                    "group list",
                    &addr,
                    RemotingCommand::request(rc::GET_ALL_SUBSCRIPTIONGROUP_CONFIG),
                )
                .await?;
            let w: shoal_proto::body::SubscriptionGroupWrapper = Self::json(&addr, &r)?;
            groups.extend(w.subscription_group_table.into_keys());
        }
        groups.remove(shoal_proto::constants::TOOLS_CONSUMER_GROUP);
        Ok(groups)
    }

    /// Deletes a consumer group (its subscription config and, with `clean_offsets`, its
    /// committed offsets) on every master broker; refused while the group has members online.
    /// Returns the brokers that deleted it.
    pub async fn delete_group(&self, group: &str, clean_offsets: bool) -> AdminResult<Vec<String>> {
        if let Ok((conns, _)) = self.consumer_connections(group).await {
            if !conns.connection_set.is_empty() {
                return Err(AdminError::Invalid(format!(
                    "consumer group {group} has {} member(s) online; stop them first",
                    conns.connection_set.len()
                )));
            }
        }
        let known = self.group_list().await?;
        if !known.contains(group) {
            return Err(AdminError::GroupNotFound(group.into()));
        }
        let mut done = Vec::new();
        for addr in self.master_addrs(None).await? {
            let req = RemotingCommand::request_with_header(
                rc::DELETE_SUBSCRIPTIONGROUP,
                &DeleteSubscriptionGroupRequestHeader {
                    group_name: group.into(),
                    clean_offset: clean_offsets,
                    ..Default::default()
                },
            );
            self.call_ok("group delete", &addr, req).await?;
            done.push(addr);
        }
        Ok(done)
    }

    /// A broker's runtime counters (GET_BROKER_RUNTIME_INFO), as `mqadmin brokerStatus` shows.
    pub async fn broker_runtime_info(&self, addr: &str) -> AdminResult<BTreeMap<String, String>> {
        let r = self
            .call_ok(
                "broker status",
                addr,
                RemotingCommand::request(rc::GET_BROKER_RUNTIME_INFO),
            )
            .await?;
        Ok(Self::json::<shoal_proto::body::KVTable>(addr, &r)?.table)
    }

    /// Master addresses of the brokers of a cluster (every cluster when `None`).
    pub async fn master_addrs(&self, cluster: Option<&str>) -> AdminResult<Vec<String>> {
        let info = self.cluster_info().await?;
        let names: BTreeSet<&String> = match cluster {
            Some(c) => info
                .cluster_addr_table
                .get(c)
                .ok_or_else(|| AdminError::Invalid(format!("cluster {c} does not exist")))?
                .iter()
                .collect(),
            None => info.broker_addr_table.keys().collect(),
        };
        Ok(names
            .into_iter()
            .filter_map(|n| info.broker_addr_table.get(n))
            .filter_map(|b| b.master_addr().map(str::to_string))
            .collect())
    }

    /// Creates or updates a topic on every master of the cluster (or of every cluster).
    pub async fn create_topic(
        &self,
        spec: &TopicSpec,
        cluster: Option<&str>,
    ) -> AdminResult<Vec<String>> {
        let brokers = self.master_addrs(cluster).await?;
        if brokers.is_empty() {
            return Err(AdminError::Invalid(
                "no broker is registered with the name server".into(),
            ));
        }
        self.create_topic_at(spec, &brokers).await?;
        Ok(brokers)
    }

    /// Creates or updates a topic on the brokers at `addrs`.
    async fn create_topic_at(&self, spec: &TopicSpec, addrs: &[String]) -> AdminResult<()> {
        for addr in addrs {
            let req = RemotingCommand::request_with_header(
                rc::UPDATE_AND_CREATE_TOPIC,
                &CreateTopicRequestHeader {
                    topic: spec.name.clone(),
                    default_topic: "TBW102".into(),
                    read_queue_nums: spec.read_queues,
                    write_queue_nums: spec.write_queues,
                    perm: spec.perm,
                    topic_filter_type: "SINGLE_TAG".into(),
                    order: spec.order,
                    attributes: spec.message_type.map(|t| {
                        format!("+{}={}", shoal_proto::body::TopicMessageType::ATTRIBUTE, t)
                    }),
                    ..Default::default()
                },
            );
            self.call_ok("create topic", addr, req).await?;
        }
        Ok(())
    }

    /// Deletes a topic from its brokers and the name servers.
    pub async fn delete_topic(&self, topic: &str) -> AdminResult<()> {
        let route = self.topic_route(topic).await?;
        for b in &route.broker_datas {
            if let Some(addr) = b.master_addr() {
                let req = RemotingCommand::request_with_header(
                    rc::DELETE_TOPIC_IN_BROKER,
                    &DeleteTopicRequestHeader {
                        topic: topic.into(),
                        ..Default::default()
                    },
                );
                self.call_ok("delete topic", addr, req).await?;
            }
        }
        for ns in &self.namesrv {
            let req = RemotingCommand::request_with_header(
                rc::DELETE_TOPIC_IN_NAMESRV,
                &DeleteTopicFromNamesrvRequestHeader {
                    topic: topic.into(),
                    ..Default::default()
                },
            );
            self.call_ok("delete topic route", ns, req).await?;
        }
        Ok(())
    }

    /// Per queue min/max offsets and last store time.
    pub async fn topic_status(&self, topic: &str) -> AdminResult<TopicStatsTable> {
        let route = self.topic_route(topic).await?;
        let mut all = TopicStatsTable::default();
        for b in &route.broker_datas {
            if let Some(addr) = b.master_addr() {
                let req = RemotingCommand::request_with_header(
                    rc::GET_TOPIC_STATS_INFO,
                    &GetTopicStatsInfoRequestHeader {
                        topic: topic.into(),
                        ..Default::default()
                    },
                );
                let r = self.call_ok("topic status", addr, req).await?;
                let t: TopicStatsTable = Self::json(addr, &r)?;
                all.offset_table.extend(t.offset_table);
            }
        }
        Ok(all)
    }

    /// Brokers that serve a group: those of its retry topic, else every master.
    async fn group_brokers(&self, group: &str) -> AdminResult<Vec<String>> {
        match self.topic_route(&retry_topic(group)).await {
            Ok(route) => Ok(route
                .broker_datas
                .iter()
                .filter_map(|b| b.master_addr().map(str::to_string))
                .collect()),
            Err(AdminError::TopicNotFound(_)) => self.master_addrs(None).await,
            Err(e) => Err(e),
        }
    }

    /// Coordinated mode: a group as its coordinator describes it (GROUP_DESCRIBE): mode,
    /// epochs, assignor, members with owned and target queues and lag. Asks the group's
    /// brokers in order and returns the first answer that knows the group (mode not `empty`),
    /// with the broker address.
    pub async fn group_describe(&self, group: &str) -> AdminResult<(String, serde_json::Value)> {
        // The coordinator is the broker whose answer has members; a broker that coordinated
        // the group before (routes changed) knows it without members.
        match self
            .coordinator_query(
                group,
                shoal_proto::coordinated::request_code::GROUP_DESCRIBE,
                |v| v["members"].as_array().is_some_and(|m| !m.is_empty()),
            )
            .await
        {
            Ok((addr, mut v)) if v["members"].as_array().is_some_and(|m| !m.is_empty()) => {
                // The coordinator knows its own store; lag over every broker comes from the
                // group's progress (each broker's offsets).
                if let Ok(p) = self.group_progress(group).await {
                    let lag: HashMap<&MessageQueue, i64> =
                        p.queues.iter().map(|q| (&q.mq, q.lag)).collect();
                    if let Some(members) = v["members"].as_array_mut() {
                        for m in members {
                            let total: i64 = ["owned", "revoking"]
                                .iter()
                                .flat_map(|k| m[*k].as_array().cloned().unwrap_or_default())
                                .filter_map(|q| serde_json::from_value::<MessageQueue>(q).ok())
                                .filter_map(|q| lag.get(&q).copied())
                                .sum();
                            m["lag"] = serde_json::json!(total);
                        }
                    }
                }
                Ok((addr, v))
            }
            _ => {
                self.coordinator_query(
                    group,
                    shoal_proto::coordinated::request_code::GROUP_DESCRIBE,
                    |v| v["mode"] != "empty" || v["pop"].is_object(),
                )
                .await
            }
        }
    }

    /// Coordinated mode: the group's last rebalances (GROUP_HISTORY), oldest first, from the
    /// broker that coordinates it.
    pub async fn group_history(&self, group: &str) -> AdminResult<(String, serde_json::Value)> {
        self.coordinator_query(
            group,
            shoal_proto::coordinated::request_code::GROUP_HISTORY,
            |v| v["rebalances"].as_array().is_some_and(|a| !a.is_empty()),
        )
        .await
    }

    async fn coordinator_query(
        &self,
        group: &str,
        code: i32,
        knows: impl Fn(&serde_json::Value) -> bool,
    ) -> AdminResult<(String, serde_json::Value)> {
        let body = shoal_proto::coordinated::GroupRef {
            group: group.to_string(),
        };
        let mut first: Option<(String, serde_json::Value)> = None;
        for addr in self.group_brokers(group).await? {
            let req = RemotingCommand::request(code)
                .with_json_body(&body)
                .map_err(|source| AdminError::Proto {
                    addr: addr.clone(),
                    source,
                })?;
            let r = self.call_ok("group coordinator query", &addr, req).await?;
            let v: serde_json::Value = Self::json(&addr, &r)?;
            if knows(&v) {
                return Ok((addr, v));
            }
            first.get_or_insert((addr, v));
        }
        first.ok_or_else(|| AdminError::GroupNotFound(group.into()))
    }

    /// The group's connections (from the first broker that knows the group).
    pub async fn consumer_connections(
        &self,
        group: &str,
    ) -> AdminResult<(ConsumerConnection, serde_json::Value)> {
        for addr in self.group_brokers(group).await? {
            let req = RemotingCommand::request_with_header(
                rc::GET_CONSUMER_CONNECTION_LIST,
                &GetConsumerConnectionListRequestHeader {
                    consumer_group: group.into(),
                    ..Default::default()
                },
            );
            let r = self.call(&addr, req).await?;
            if r.code == resp::SUCCESS {
                let raw: serde_json::Value = Self::json(&addr, &r)?;
                return Ok((Self::json(&addr, &r)?, raw));
            }
        }
        Err(AdminError::GroupNotFound(group.into()))
    }

    /// A member's running info (its queues), asked through a broker.
    pub async fn consumer_running_info(
        &self,
        broker: &str,
        group: &str,
        client_id: &str,
    ) -> AdminResult<ConsumerRunningInfo> {
        let req = RemotingCommand::request_with_header(
            rc::GET_CONSUMER_RUNNING_INFO,
            &GetConsumerRunningInfoRequestHeader {
                consumer_group: group.into(),
                client_id: client_id.into(),
                ..Default::default()
            },
        );
        let r = self.call_ok("consumer running info", broker, req).await?;
        Self::json(broker, &r)
    }

    /// Per queue broker offset, consumer offset, lag, owner and last consume time, over every
    /// broker of the group, with the brokers' group-health flags.
    pub async fn group_progress(&self, group: &str) -> AdminResult<GroupProgress> {
        let brokers = self.group_brokers(group).await?;
        let mut progress = GroupProgress::default();
        let mut stats: BTreeMap<MessageQueue, shoal_proto::body::OffsetWrapper> = BTreeMap::new();
        let mut known = false;
        for addr in &brokers {
            let req = RemotingCommand::request_with_header(
                rc::GET_CONSUME_STATS,
                &GetConsumeStatsRequestHeader {
                    consumer_group: group.into(),
                    ..Default::default()
                },
            );
            let r = self.call(addr, req).await?;
            if r.code != resp::SUCCESS {
                continue;
            }
            known = true;
            let s: ConsumeStats = Self::json(addr, &r)?;
            let raw: serde_json::Value = Self::json(addr, &r)?;
            for key in ["duplicateClientIds", "inconsistentSubscriptionTopics"] {
                if let Some(list) = raw[key].as_array() {
                    let set = if key == "duplicateClientIds" {
                        &mut progress.duplicate_client_ids
                    } else {
                        &mut progress.inconsistent_topics
                    };
                    set.extend(list.iter().filter_map(|v| v.as_str().map(str::to_string)));
                }
            }
            stats.extend(s.offset_table);
        }
        if !known {
            return Err(AdminError::GroupNotFound(group.into()));
        }
        // Owners: ask each member (through a broker) which queues it holds.
        let mut owners: BTreeMap<MessageQueue, String> = BTreeMap::new();
        let mut consumed: BTreeMap<MessageQueue, i64> = BTreeMap::new();
        if let Ok((conns, _)) = self.consumer_connections(group).await {
            let via = brokers.first().cloned().unwrap_or_default();
            let ids: BTreeSet<String> = conns
                .connection_set
                .iter()
                .map(|c| c.client_id.clone())
                .collect();
            for id in ids {
                match self.consumer_running_info(&via, group, &id).await {
                    Ok(info) => {
                        for (mq, pq) in info.mq_table {
                            if !pq.droped {
                                if pq.commit_offset >= 0 {
                                    consumed
                                        .entry(mq.clone())
                                        .and_modify(|o| *o = (*o).max(pq.commit_offset))
                                        .or_insert(pq.commit_offset);
                                }
                                owners
                                    .entry(mq)
                                    .and_modify(|o| {
                                        o.push(',');
                                        o.push_str(&id);
                                    })
                                    .or_insert_with(|| id.clone());
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!(client = %id, error = %e, "no usable running info from a member");
                        progress.unreachable_members.insert(id);
                    }
                }
            }
        }
        // Members without RocketMQ running info (Kafka members of the Kafka listener, classic
        // or KIP-848): their queues as the group's coordinator describes them. (The plain
        // GROUP_DESCRIBE query: `group_describe` may itself ask for this progress.)
        let described = self
            .coordinator_query(
                group,
                shoal_proto::coordinated::request_code::GROUP_DESCRIBE,
                |v| v["members"].as_array().is_some_and(|m| !m.is_empty()),
            )
            .await;
        if let Ok((_, described)) = described {
            for (mq, owner) in described_owners(&described) {
                owners.entry(mq).or_insert(owner);
            }
        }
        progress.queues = stats
            .into_iter()
            .map(|(mq, w)| {
                // A member's position is never behind what the group committed.
                let consumed_offset = consumed
                    .get(&mq)
                    .map(|&c| c.max(w.consumer_offset).min(w.broker_offset));
                QueueProgress {
                    owner: owners.get(&mq).cloned(),
                    lag: (w.broker_offset - consumed_offset.unwrap_or(w.consumer_offset)).max(0),
                    broker_offset: w.broker_offset,
                    consumer_offset: w.consumer_offset,
                    consumed_offset,
                    last_consume_timestamp: w.last_timestamp,
                    mq,
                }
            })
            .collect();
        Ok(progress)
    }

    /// Moves the group's offsets of `topic` to the first message stored at or after
    /// `timestamp_ms` (`-1` = the latest offset). With `dry_run` nothing changes and the plan is
    /// returned.
    pub async fn reset_offset(
        &self,
        group: &str,
        topic: &str,
        timestamp_ms: i64,
        dry_run: bool,
    ) -> AdminResult<Vec<OffsetReset>> {
        let route = self.topic_route(topic).await?;
        let mut plan = Vec::new();
        for b in &route.broker_datas {
            let Some(addr) = b.master_addr() else {
                continue;
            };
            let req = RemotingCommand::request_with_header(
                rc::GET_CONSUME_STATS,
                &GetConsumeStatsRequestHeader {
                    consumer_group: group.into(),
                    topic: Some(topic.into()),
                    ..Default::default()
                },
            );
            let r = self.call_ok("consume stats", addr, req).await?;
            let stats: ConsumeStats = Self::json(addr, &r)?;
            if dry_run {
                for (mq, w) in stats.offset_table {
                    let to = if timestamp_ms == -1 {
                        w.broker_offset
                    } else {
                        let req = RemotingCommand::request_with_header(
                            rc::SEARCH_OFFSET_BY_TIMESTAMP,
                            &SearchOffsetRequestHeader {
                                topic: topic.into(),
                                queue_id: mq.queue_id,
                                timestamp: timestamp_ms,
                                ..Default::default()
                            },
                        );
                        let r = self.call_ok("search offset", addr, req).await?;
                        r.decode_command_header::<SearchOffsetResponseHeader>()
                            .map_err(|source| AdminError::Proto {
                                addr: addr.to_string(),
                                source,
                            })?
                            .offset
                    };
                    plan.push(OffsetReset {
                        mq,
                        from: w.consumer_offset,
                        to,
                    });
                }
            } else {
                let req = RemotingCommand::request_with_header(
                    rc::INVOKE_BROKER_TO_RESET_OFFSET,
                    &ResetOffsetRequestHeader {
                        topic: topic.into(),
                        group: group.into(),
                        timestamp: timestamp_ms,
                        is_force: true,
                        ..Default::default()
                    },
                );
                let r = self.call_ok("reset offset", addr, req).await?;
                let body: ResetOffsetBody = Self::json(addr, &r)?;
                for (mq, to) in body.offset_table {
                    let from = stats
                        .offset_table
                        .get(&mq)
                        .map(|w| w.consumer_offset)
                        .unwrap_or(0);
                    plan.push(OffsetReset { mq, from, to });
                }
            }
        }
        plan.sort_by(|a, b| a.mq.cmp(&b.mq));
        Ok(plan)
    }
}

/// Owners of queues from a GROUP_DESCRIBE answer (`mode` `kafkaClassic` or `coordinated`):
/// each member's owned queues, named `clientId@host` (host as the listener saw it, without
/// Kafka's leading `/`; just the client id where no host is known, as for Shoal's own
/// coordinated members, whose client ids already name their host). Where that name is shared
/// by members of the group (librdkafka's default client id is `rdkafka` in every process),
/// the member id follows it: `rdkafka@10.0.0.5/rdkafka-5f1c...`.
fn described_owners(v: &serde_json::Value) -> Vec<(MessageQueue, String)> {
    if !matches!(v["mode"].as_str(), Some("kafkaClassic" | "coordinated")) {
        return Vec::new();
    }
    let members: Vec<&serde_json::Value> = v["members"].as_array().into_iter().flatten().collect();
    let name = |m: &serde_json::Value| {
        let client = m["clientId"].as_str().unwrap_or("");
        match m["clientHost"].as_str().map(|h| h.trim_start_matches('/')) {
            Some(host) if !host.is_empty() => format!("{client}@{host}"),
            _ => client.to_string(),
        }
    };
    let mut out = Vec::new();
    for m in &members {
        let mut owner = name(m);
        if members.iter().filter(|o| name(o) == owner).count() > 1 {
            owner = format!("{owner}/{}", m["memberId"].as_str().unwrap_or("?"));
        }
        for q in m["owned"].as_array().into_iter().flatten() {
            if let Ok(mq) = serde_json::from_value::<MessageQueue>(q.clone()) {
                out.push((mq, owner.clone()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn described_owners_name_kafka_members_by_client_and_host() {
        let v = serde_json::json!({
            "mode": "kafkaClassic",
            "members": [
                {"memberId": "rdkafka-1", "clientId": "rdkafka", "clientHost": "/10.0.0.5",
                 "owned": [{"topic": "T", "brokerName": "b", "queueId": 0}]},
                {"memberId": "rdkafka-2", "clientId": "rdkafka", "clientHost": "/10.0.0.5",
                 "owned": [{"topic": "T", "brokerName": "b", "queueId": 1}]},
                {"memberId": "m3", "clientId": "java-1", "clientHost": "/10.0.0.6",
                 "owned": [{"topic": "T", "brokerName": "b", "queueId": 2}]},
            ]
        });
        let owners = described_owners(&v);
        assert_eq!(
            owners,
            vec![
                (
                    MessageQueue::new("T", "b", 0),
                    "rdkafka@10.0.0.5/rdkafka-1".to_string()
                ),
                (
                    MessageQueue::new("T", "b", 1),
                    "rdkafka@10.0.0.5/rdkafka-2".to_string()
                ),
                (
                    MessageQueue::new("T", "b", 2),
                    "java-1@10.0.0.6".to_string()
                ),
            ]
        );
        // A coordinated member without a host: its client id; other modes: nothing.
        let v = serde_json::json!({"mode": "coordinated", "members": [
            {"memberId": "x", "clientId": "10.0.0.7@1", "owned": [{"topic": "T", "brokerName": "b", "queueId": 3}]}]});
        assert_eq!(
            described_owners(&v),
            vec![(MessageQueue::new("T", "b", 3), "10.0.0.7@1".to_string())]
        );
        let v = serde_json::json!({"mode": "classic", "members": []});
        assert!(described_owners(&v).is_empty());
    }

    fn q(i: i32, owner: Option<&str>) -> QueueProgress {
        QueueProgress {
            mq: MessageQueue::new("T", "b", i),
            broker_offset: 10,
            consumer_offset: 4,
            consumed_offset: None,
            lag: 6,
            owner: owner.map(str::to_string),
            last_consume_timestamp: 0,
        }
    }

    #[test]
    fn ownership_problems_and_lag() {
        let p = GroupProgress {
            queues: vec![q(0, Some("a")), q(1, Some("a,b")), q(2, None)],
            ..GroupProgress::default()
        };
        let (shared, unowned) = p.ownership_problems();
        assert_eq!(shared, vec![MessageQueue::new("T", "b", 1)]);
        assert_eq!(unowned, vec![MessageQueue::new("T", "b", 2)]);
        assert_eq!(p.total_lag(), 18);
    }
}
