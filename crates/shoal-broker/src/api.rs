//! The broker's API for what runs around it in one process: the `shoal` binary's HTTP port
//! and dashboard, and protocol listeners (the Kafka listener). Operations go through the
//! broker's state owners, as requests do; nothing outside the crate holds a lock of the
//! broker's.

use crate::clock::wall_ms;
use crate::config::BrokerConfig;
use crate::listener::ListenerGroups;
use crate::metrics::TopicTraffic;
use crate::shared::Shared;
use crate::timeline::{ObservedRebalance, Outcome};
use shoal_group::coordinator::{Coordinator, RebalanceRecord};
use shoal_group::state::GroupMode;
use shoal_proto::body::TopicConfig;
use shoal_store::MessageStore;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Why an operation of [`BrokerApi`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The topic exists already.
    #[error("topic {0} exists")]
    TopicExists(String),
    /// The topic does not exist.
    #[error("topic {0} does not exist")]
    UnknownTopic(String),
    /// A name or value the broker does not accept.
    #[error("{0}")]
    Invalid(String),
    /// The group runs in classic mode (a classic-only RocketMQ member is in it).
    #[error("group {0} runs in classic mode")]
    ClassicGroup(String),
    /// The broker could not do it (a table not persisted, the store).
    #[error("{0}")]
    Broker(String),
    /// A replica: its coordinator answers no member (the client asks which broker
    /// coordinates the group again).
    #[error("{0}")]
    NotCoordinator(String),
    /// The group's master, still taking over its group's state (applying its log's
    /// metadata): it coordinates the group, and answers its members once it has done so.
    #[error("{0}")]
    CoordinatorLoading(String),
    /// A replica: topics and subscription groups change on the master, whose tables the
    /// replicas follow.
    #[error("{0}")]
    NotMaster(String),
}

/// What the dashboard shows of the broker.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BrokerSummary {
    /// Broker name.
    pub name: String,
    /// Announced address.
    pub addr: String,
    /// Start time (wall clock, ms).
    pub started_at_ms: i64,
    /// Time since start, ms.
    pub uptime_ms: u64,
    /// Messages stored by sends.
    pub messages_put: u64,
    /// Messages returned by pulls.
    pub messages_pulled: u64,
    /// Pulls held now.
    pub pulls_held_now: usize,
    /// Client connections open now.
    pub connections: i64,
    /// Bytes of the commit log.
    pub commit_log_bytes: u64,
    /// Bytes written but not yet flushed.
    pub unflushed_bytes: u64,
    /// Topics.
    pub topics: usize,
    /// Consumer groups with members.
    pub groups_online: usize,
}

/// A cheap handle on a running broker's API. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct BrokerApi {
    pub(crate) b: Arc<Shared>,
}

impl BrokerApi {
    pub(crate) fn new(b: Arc<Shared>) -> Self {
        Self { b }
    }

    /// The broker's configuration (as it runs: the announced address filled in).
    pub fn config(&self) -> &BrokerConfig {
        &self.b.config
    }

    /// The store.
    pub fn store(&self) -> Arc<MessageStore> {
        self.b.store.clone()
    }

    /// In a replicated group: whether a write may be appended now (only on the master).
    /// Unreplicated brokers always may.
    pub fn check_replicated_write(&self) -> Result<(), shoal_ha::replication::WriteRefusal> {
        match self.b.replication.get() {
            Some(r) => r.check_writable(),
            None => Ok(()),
        }
    }

    /// In a replicated group: resolves once the write that ended the commit log at `end` is
    /// acknowledged (by the in-sync set, or the master under `ack = "master"`), or with why
    /// not. Unreplicated brokers resolve at once.
    pub fn replicated_write(
        &self,
        end: u64,
    ) -> impl std::future::Future<Output = Result<(), shoal_ha::replication::WriteRefusal>>
           + Send
           + 'static {
        let r = self.b.replication.get().cloned();
        async move {
            match r {
                Some(r) => r.acknowledged(end).await,
                None => Ok(()),
            }
        }
    }

    /// In a replicated group: resolves with `true` once every consumer offset committed
    /// before the call is acknowledged by the in-sync set (a new master has it), `false` when
    /// it was not within `replication.ack_timeout_ms` (this broker is not master, or the set
    /// did not acknowledge). Unreplicated brokers resolve `true` at once.
    pub fn offsets_replicated(&self) -> impl std::future::Future<Output = bool> + Send + 'static {
        let r = self.b.replication.get().cloned();
        let timeout = Duration::from_millis(self.b.config.replication.ack_timeout_ms);
        async move {
            match r {
                Some(r) => r.metadata_replicated(timeout).await,
                None => true,
            }
        }
    }

    /// Resolves once this broker's coordinator answers its group's members, or when it is
    /// not its group's master (it will not), or after `limit`: a new master answers them
    /// once it has taken over its group's state.
    pub fn coordinator_ready(
        &self,
        limit: Duration,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let r = self.b.replication.get().cloned();
        async move {
            if let Some(r) = r {
                r.serving_or_not_master(limit).await;
            }
        }
    }

    /// The replication view of this broker (role, epochs, in-sync set, offsets), when it
    /// replicates.
    pub fn replication_status(&self) -> Option<serde_json::Value> {
        let view = self.b.replication.get()?.view();
        serde_json::to_value(view).ok()
    }

    /// A replica refuses table changes: its master's tables are replicated to it.
    fn refuse_on_replica(&self) -> Result<(), ApiError> {
        match self.b.replication.get() {
            Some(r) => r
                .refuse_table_change()
                .map_err(|e| ApiError::NotMaster(e.remark)),
            None => Ok(()),
        }
    }

    /// The metrics registry served at `/metrics` (a listener adds its collector to it).
    pub fn metrics(&self) -> Arc<shoal_metrics::Metrics> {
        self.b.metrics.registry.clone()
    }

    /// The traffic counters of a topic, if it had any.
    pub fn topic_traffic(&self, topic: &str) -> Option<Arc<TopicTraffic>> {
        self.b.metrics.topics.find(topic)
    }

    /// What the dashboard shows of the broker now.
    pub fn summary(&self) -> BrokerSummary {
        let b = &self.b;
        let store = &b.store;
        BrokerSummary {
            name: b.config.broker_name.clone(),
            addr: b.config.announce_addr().to_string(),
            started_at_ms: b.started_wall_ms(),
            uptime_ms: b.mono_ms(),
            messages_put: b.counters.msgs_put.get(),
            messages_pulled: b.counters.msgs_got.get(),
            pulls_held_now: b.holds.len(),
            connections: b.metrics.connections.get(),
            commit_log_bytes: store
                .commit_log_max_offset()
                .saturating_sub(store.commit_log_min_offset()),
            unflushed_bytes: store
                .commit_log_max_offset()
                .saturating_sub(store.commit_log_flushed_offset()),
            topics: b.topics.len(),
            groups_online: b.groups.read(|g, _| g.clients().group_names().len()),
        }
    }

    /// The mode a group runs in here.
    pub fn group_mode(&self, group: &str) -> GroupMode {
        self.b.groups.read(|g, _| g.mode(group))
    }

    /// The group's POP consumption on this broker (consumers, leases, redeliveries, dead
    /// letters), `None` when it does not pop here.
    pub fn pop_group(&self, group: &str) -> Option<crate::pop::PopGroupView> {
        crate::pop::describe_group(&self.b, group)
    }

    /// The rebalances the broker observed of a classic group, oldest first.
    pub fn observed_rebalances(&self, group: &str) -> Vec<ObservedRebalance> {
        self.b.observer.history(group)
    }

    /// Whether a classic group's last observed rebalance is still converging.
    pub fn rebalancing(&self, group: &str) -> bool {
        self.b
            .observer
            .history(group)
            .last()
            .is_some_and(|r| r.outcome == Outcome::Converging)
    }

    /// A coordinated group's rebalances, oldest first.
    pub fn coordinator_history(&self, group: &str) -> Vec<RebalanceRecord> {
        self.b.groups.read(|g, _| g.coordinator().history(group))
    }

    /// Tells the broker how a protocol listener describes its own groups (once; `Err` when
    /// one was set already).
    pub fn set_listener_groups(&self, groups: ListenerGroups) -> Result<(), ListenerGroups> {
        self.b.groups.set_listener(groups.clone());
        self.b.listener_groups.set(groups)
    }

    // ---- topics and groups for protocol listeners ----

    /// Every topic's config.
    pub fn topics(&self) -> Vec<TopicConfig> {
        self.b.topics.all()
    }

    /// A topic's config.
    pub fn topic(&self, name: &str) -> Option<TopicConfig> {
        self.b.topics.get(name)
    }

    /// Creates a topic of `queues` read and write queues, durable before it returns.
    pub fn create_topic(&self, name: &str, queues: i32) -> Result<TopicConfig, ApiError> {
        self.create_typed_topic(name, queues, None)
    }

    /// Creates a topic of `queues` read and write queues that takes only messages of
    /// `message_type` (every type when `None`), durable before it returns.
    pub fn create_typed_topic(
        &self,
        name: &str,
        queues: i32,
        message_type: Option<shoal_proto::body::TopicMessageType>,
    ) -> Result<TopicConfig, ApiError> {
        self.refuse_on_replica()?;
        if self.b.topics.get(name).is_some() {
            return Err(ApiError::TopicExists(name.into()));
        }
        let mut config = TopicConfig::new(name, queues);
        if let Some(t) = message_type {
            config.attributes.insert(
                shoal_proto::body::TopicMessageType::ATTRIBUTE.into(),
                t.name().into(),
            );
        }
        crate::topic::validate_topic_name(name).map_err(|e| ApiError::Invalid(e.to_string()))?;
        let created = self
            .b
            .topics
            .upsert(config.clone())
            .map_err(|e| ApiError::Invalid(e.to_string()))?;
        if !created {
            return Err(ApiError::TopicExists(name.into()));
        }
        // (The change wakes the registration: the name servers learn the topic.)
        self.persist_topics()?;
        Ok(config)
    }

    /// Deletes a topic with its consume queues and offsets.
    pub fn delete_topic(&self, name: &str) -> Result<(), ApiError> {
        self.refuse_on_replica()?;
        if self.b.topics.remove(name).is_none() {
            return Err(ApiError::UnknownTopic(name.into()));
        }
        self.b
            .store
            .delete_topic(name)
            .map_err(|e| ApiError::Broker(e.to_string()))?;
        self.persist_topics()
    }

    /// Grows a topic to `count` queues; the name servers learn it first, then the groups that
    /// consume it rebalance.
    pub fn add_queues(&self, name: &str, count: i32) -> Result<(), ApiError> {
        self.refuse_on_replica()?;
        let mut c = self
            .b
            .topics
            .get(name)
            .ok_or_else(|| ApiError::UnknownTopic(name.into()))?;
        let now = c.read_queue_nums.max(c.write_queue_nums);
        if count <= now {
            return Err(ApiError::Invalid(format!(
                "topic {name} already has {now} queues"
            )));
        }
        c.read_queue_nums = count;
        c.write_queue_nums = count;
        self.b
            .topics
            .upsert(c)
            .map_err(|e| ApiError::Invalid(e.to_string()))?;
        self.persist_topics()?;
        let b = self.b.clone();
        let topic = name.to_string();
        tokio::spawn(async move {
            b.register_all().await;
            b.topic_changed(&topic);
        });
        Ok(())
    }

    fn persist_topics(&self) -> Result<(), ApiError> {
        self.b
            .topics
            .persist()
            .map_err(|e| ApiError::Broker(format!("topic table not persisted: {e}")))
    }

    /// The subscription group, created with the defaults if missing (durable before it
    /// returns).
    pub fn ensure_group(&self, group: &str) -> Result<(), ApiError> {
        crate::group_config::validate_group_name(group).map_err(ApiError::Invalid)?;
        if self.b.sub_groups.ensure(group) {
            self.b
                .sub_groups
                .persist()
                .map_err(|e| ApiError::Broker(format!("group table not persisted: {e}")))?;
        }
        Ok(())
    }

    /// Subscription group names.
    pub fn subscription_groups(&self) -> Vec<String> {
        self.b.sub_groups.names()
    }

    /// Deletes a subscription group and its offsets.
    pub fn delete_group(&self, group: &str) -> Result<(), ApiError> {
        self.refuse_on_replica()?;
        self.b.sub_groups.remove(group);
        self.b
            .sub_groups
            .persist()
            .map_err(|e| ApiError::Broker(format!("group table not persisted: {e}")))?;
        self.b.store.remove_group_offsets(group);
        Ok(())
    }

    /// Runs `f` on the group coordinator for a listener's group (the coordinator first
    /// learns the queues of `topics`), with the coordinator's clock; refused when the group
    /// runs classic here, or (with `group`) when this broker is a replica or a master still
    /// taking over its group's state. Effects (notices, persistence) follow as for any group
    /// operation.
    pub fn with_coordinator<R>(
        &self,
        group: Option<&str>,
        topics: &[String],
        f: impl FnOnce(&mut Coordinator, u64) -> R,
    ) -> Result<R, ApiError> {
        // Computed before the group-state lock (they read the topic table and the route
        // cache), so no lock is taken inside another.
        // A group's members are answered only by a master that took over the group's state.
        if let (Some(r), Some(_)) = (self.b.replication.get(), group) {
            r.refuse_unless_serving().map_err(|e| {
                if r.is_master() {
                    ApiError::CoordinatorLoading(e.remark)
                } else {
                    ApiError::NotCoordinator(e.remark)
                }
            })?;
        }
        let routes = self.b.routes();
        let queues: Vec<(String, Vec<shoal_proto::MessageQueue>)> = topics
            .iter()
            .filter_map(|t| routes.known_topic_queues(t).map(|q| (t.clone(), q)))
            .collect();
        self.b
            .groups
            .with(|g, now| g.handle_listener_group(now, group, queues, f))
            .map_err(|_| ApiError::ClassicGroup(group.unwrap_or_default().to_string()))
    }

    /// Resolves when a message is stored at or past one of `positions` (topic, queue, offset),
    /// or after `timeout` (long polling for a listener's fetches).
    pub fn wait_for_messages(
        &self,
        positions: Vec<(String, i32, u64)>,
        timeout: Duration,
    ) -> impl Future<Output = ()> + Send + 'static {
        let b = self.b.clone();
        async move {
            let ticket = b.holds.hold_any(&positions);
            // Close the race between the empty read and the hold.
            for (topic, q, _) in &positions {
                b.holds.recheck(topic, *q, b.store.max_offset(topic, *q));
            }
            b.holds.wait_any(ticket, timeout).await;
        }
    }

    /// Wall-clock milliseconds since the Unix epoch, as the broker stamps them.
    pub fn wall_ms() -> i64 {
        wall_ms()
    }
}
