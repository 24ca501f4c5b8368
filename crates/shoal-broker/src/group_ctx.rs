//! What the consumer-group handlers get instead of the whole broker: a [`GroupCtx`] of borrowed
//! parts (the group-state handle, the config, the store for offsets and lag, the counters, the
//! topic routes, the subscription-group table, and the broker's reaction to a classic
//! membership change). The handlers in [`crate::coordinated`], [`crate::lease`] and
//! [`crate::client`] take it, so what they may touch is written in their signature.
//!
//! [`GroupHandle`] is the one way into the group state: it takes the one lock, runs the
//! operation with the coordinator's clock, and executes the [`GroupEffect`]s the operation
//! left after the lock is released ([`Notifier`]: notices over the clients' connections, the
//! persistence flag, counters).

use crate::broker::{BrokerInner, Counters, ListenerGroups};
use crate::config::BrokerConfig;
use crate::group_config::{GroupTable, SubscriptionGroupConfig};
use crate::group_state::{GroupEffect, GroupState};
use crate::topic::TopicTable;
use parking_lot::{Mutex, MutexGuard};
use shoal_group::membership::GroupChange;
use shoal_net::{Connection, RemotingClient};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::ext::{self, LockFreedBody};
use shoal_proto::{MessageQueue, RemotingCommand};
use shoal_store::MessageStore;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

/// The broker's clocks: monotonic time since start (expiry, lock TTLs) and the coordinator's
/// clock (wall-clock ms at start plus monotonic time since).
#[derive(Debug, Clone, Copy)]
pub struct BrokerClock {
    started: Instant,
    started_wall_ms: i64,
}

impl BrokerClock {
    /// A clock starting now, when the wall clock says `started_wall_ms`.
    pub fn starting_at(started_wall_ms: i64) -> Self {
        Self {
            started: Instant::now(),
            started_wall_ms,
        }
    }

    /// Monotonic milliseconds since the broker started.
    pub fn mono_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// When the broker started (wall clock, ms).
    pub fn started_wall_ms(&self) -> i64 {
        self.started_wall_ms
    }

    /// The coordinator's clock: never goes backwards while the broker runs and stays
    /// comparable across restarts.
    pub fn coord_ms(&self) -> u64 {
        (self.started_wall_ms.max(0) as u64).saturating_add(self.mono_ms())
    }
}

/// Executes group effects: notices to clients over their connections, the coordinator's
/// persistence flag, counters.
#[derive(Debug, Clone, Copy)]
pub struct Notifier<'a> {
    /// Connections of clients that heartbeated, by connection id.
    pub connections: &'a Mutex<HashMap<u64, Connection>>,
    /// Counters (notices sent, members removed).
    pub counters: &'a Counters,
    /// Set when the coordinator's state must be persisted.
    pub coordinator_dirty: &'a AtomicBool,
}

impl Notifier<'_> {
    /// Remembers a client's connection (so notices can reach it).
    pub fn remember(&self, conn: &Connection) {
        self.connections.lock().insert(conn.id(), conn.clone());
    }

    /// Executes what a group-state operation asked for.
    pub fn execute(&self, effects: Vec<GroupEffect>) {
        for e in effects {
            match e {
                GroupEffect::NotifyMember {
                    group,
                    member_id,
                    conn_id,
                } => self.send_assignment_notice(&group, &member_id, conn_id),
                GroupEffect::MemberRemoved {
                    group,
                    member_id,
                    reason,
                } => {
                    info!(group = %group, member = %member_id, reason = ?reason, "coordinated member removed");
                    self.counters.coordinator_members_removed.inc();
                }
                GroupEffect::Persist => {
                    self.coordinator_dirty.store(true, Ordering::Relaxed);
                }
                GroupEffect::LockFreed {
                    group,
                    conn_id,
                    queues,
                } => self.send_lock_freed(group, conn_id, queues),
                GroupEffect::ModeChanged {
                    group,
                    mode,
                    notify_conn_ids,
                } => {
                    info!(group = %group, mode = %mode, "consumer group changed mode");
                    for conn in notify_conn_ids {
                        self.send_assignment_notice(&group, "", conn);
                    }
                }
            }
        }
    }

    /// GROUP_ASSIGNMENT_CHANGED to a coordinated member (oneway).
    fn send_assignment_notice(&self, group: &str, member_id: &str, conn_id: u64) {
        let Some(conn) = self.connections.lock().get(&conn_id).cloned() else {
            return;
        };
        let body = shoal_proto::coordinated::AssignmentChangedNotice {
            group: group.to_string(),
            member_id: member_id.to_string(),
        };
        let Ok(bytes) = shoal_proto::body::to_json_bytes(&body) else {
            return;
        };
        let mut req = RemotingCommand::request(
            shoal_proto::coordinated::request_code::GROUP_ASSIGNMENT_CHANGED,
        )
        .with_body(bytes);
        req.set_oneway();
        self.counters.coordinator_notices_sent.inc();
        tokio::spawn(async move {
            if let Err(e) = conn.oneway(req).await {
                warn!(peer = %conn.peer_addr(), error = %e, "could not tell a coordinated member its assignment changed");
            }
        });
    }

    /// NOTIFY_LOCK_FREED (oneway) to a member that was refused one of `queues`
    /// ([`GroupEffect::LockFreed`]).
    fn send_lock_freed(&self, group: String, conn_id: u64, queues: Vec<MessageQueue>) {
        let Some(conn) = self.connections.lock().get(&conn_id).cloned() else {
            return;
        };
        let body = LockFreedBody {
            consumer_group: group,
            mq_set: queues,
        };
        let Ok(mut req) = RemotingCommand::request(ext::request_code::NOTIFY_LOCK_FREED)
            .with_ext_fields(Default::default())
            .with_json_body(&body)
        else {
            return;
        };
        req.set_oneway();
        self.counters.lock_freed_sent.inc();
        tokio::spawn(async move {
            if let Err(e) = conn.oneway(req).await {
                debug!(peer = %conn.peer_addr(), error = %e, "could not send a lock-freed notice");
            }
        });
    }
}

/// The handle on the broker's [`GroupState`]: its one lock, the clock, and where its effects
/// go.
#[derive(Debug, Clone, Copy)]
pub struct GroupHandle<'a> {
    state: &'a Mutex<GroupState>,
    clock: BrokerClock,
    notifier: Notifier<'a>,
}

impl<'a> GroupHandle<'a> {
    /// A handle on `state`.
    pub fn new(state: &'a Mutex<GroupState>, clock: BrokerClock, notifier: Notifier<'a>) -> Self {
        Self {
            state,
            clock,
            notifier,
        }
    }

    /// Runs `f` on the group state under its one lock (with the coordinator's clock), then
    /// executes the effects it left, outside the lock.
    pub fn with<R>(&self, f: impl FnOnce(&mut GroupState, u64) -> R) -> R {
        let now = self.clock.coord_ms();
        let (r, effects) = {
            let mut g = self.state.lock();
            let r = f(&mut g, now);
            (r, g.take_effects())
        };
        self.notifier.execute(effects);
        r
    }

    /// The group state under its lock, for reads and for operations that leave no effects
    /// (anything that may leave one goes through [`Self::with`]).
    pub fn lock(&self) -> MutexGuard<'a, GroupState> {
        self.state.lock()
    }

    /// The broker's clocks.
    pub fn clock(&self) -> BrokerClock {
        self.clock
    }

    /// Where effects go (also: remember a client's connection).
    pub fn notifier(&self) -> Notifier<'a> {
        self.notifier
    }
}

/// Topic queues as the coordinator allocates them: this broker's topic table plus the other
/// brokers' queues from the name servers (cached).
#[derive(Debug, Clone, Copy)]
pub struct Routes<'a> {
    /// This broker's topic table.
    pub topics: &'a Mutex<TopicTable>,
    /// Wakes the registration task (the topic table changed).
    pub register_now: &'a Notify,
    /// Other brokers' queues of a topic and when they were fetched.
    pub route_cache: &'a Mutex<HashMap<String, (Vec<MessageQueue>, Instant)>>,
    /// Client for the name servers.
    pub namesrv_client: &'a RemotingClient,
    /// This broker's name and name server addresses.
    pub config: &'a BrokerConfig,
}

/// This broker's queues of a topic together with other brokers' (none when neither has any).
fn merge_queues(
    own: Option<Vec<MessageQueue>>,
    others: Vec<MessageQueue>,
) -> Option<Vec<MessageQueue>> {
    if own.is_none() && others.is_empty() {
        return None;
    }
    let mut all = own.unwrap_or_default();
    all.extend(others);
    Some(all)
}

impl Routes<'_> {
    /// The queues of `topic` this broker serves.
    pub fn topic_queues(&self, topic: &str) -> Option<Vec<MessageQueue>> {
        let n = self.topics.lock().get(topic).map(|c| c.read_queue_nums)?;
        Some(
            (0..n)
                .map(|i| MessageQueue::new(topic, &self.config.broker_name, i))
                .collect(),
        )
    }

    /// Every queue of `topic` in the cluster: this broker's own, plus the other brokers' from
    /// the name servers' route (cached for 2 s; the last known when the name servers do not
    /// answer).
    pub async fn cluster_topic_queues(&self, topic: &str) -> Option<Vec<MessageQueue>> {
        let own = self.topic_queues(topic);
        let fresh = self
            .route_cache
            .lock()
            .get(topic)
            .filter(|(_, at)| at.elapsed() < Duration::from_secs(2))
            .map(|(q, _)| q.clone());
        let others = match fresh {
            Some(o) => o,
            None => match self.fetch_other_queues(topic).await {
                Some(o) => {
                    self.route_cache
                        .lock()
                        .insert(topic.to_string(), (o.clone(), Instant::now()));
                    o
                }
                None => self
                    .route_cache
                    .lock()
                    .get(topic)
                    .map(|(q, _)| q.clone())
                    .unwrap_or_default(),
            },
        };
        merge_queues(own, others)
    }

    /// Other brokers' readable queues of `topic` from the first name server that answers.
    async fn fetch_other_queues(&self, topic: &str) -> Option<Vec<MessageQueue>> {
        let req = RemotingCommand::request_with_header(
            rc::GET_ROUTEINFO_BY_TOPIC,
            &shoal_proto::header::GetRouteInfoRequestHeader {
                topic: topic.to_string(),
                ..Default::default()
            },
        );
        for addr in &self.config.namesrv_addrs {
            match self
                .namesrv_client
                .invoke(addr, req.clone(), Duration::from_secs(3))
                .await
            {
                Ok(r) if r.code == resp::SUCCESS => {
                    let route: shoal_proto::body::TopicRouteData = r.decode_json_body().ok()?;
                    return Some(
                        route
                            .subscribe_queues(topic)
                            .into_iter()
                            .filter(|q| q.broker_name != self.config.broker_name)
                            .collect(),
                    );
                }
                Ok(_) => return Some(Vec::new()),
                Err(_) => continue,
            }
        }
        None
    }

    /// A topic's queues without asking the name servers: this broker's own plus the other
    /// brokers' last known route.
    pub fn known_topic_queues(&self, topic: &str) -> Option<Vec<MessageQueue>> {
        let others = self
            .route_cache
            .lock()
            .get(topic)
            .map(|(q, _)| q.clone())
            .unwrap_or_default();
        merge_queues(self.topic_queues(topic), others)
    }
}

/// The subscription-group table, with auto-creation as the config allows.
#[derive(Debug, Clone, Copy)]
pub struct SubscriptionGroups<'a> {
    /// The table.
    pub table: &'a Mutex<GroupTable>,
    /// Auto-creation and its limit.
    pub config: &'a BrokerConfig,
    /// Counts refused auto-creations.
    pub counters: &'a Counters,
}

impl SubscriptionGroups<'_> {
    /// A subscription group, created with the defaults when auto-create is on. `Err` with the
    /// reason when it does not exist and may not be created: auto-create is off, the name is
    /// invalid, or `max_subscription_groups` is reached.
    pub fn get_or_auto_create(&self, group: &str) -> Result<SubscriptionGroupConfig, String> {
        let mut groups = self.table.lock();
        if let Some(c) = groups.get(group) {
            return Ok(c.clone());
        }
        if !self.config.auto_create_subscription_group {
            return Err(format!("subscription group [{group}] does not exist"));
        }
        crate::group_config::validate_group_name(group)?;
        if groups.len() >= self.config.max_subscription_groups {
            drop(groups);
            let n = self.counters.groups_refused.fetch_add(1, Ordering::Relaxed) + 1;
            if crate::broker::worth_logging(n) {
                warn!(%group, limit = self.config.max_subscription_groups, refused = n,
                    "subscription group not auto-created: max_subscription_groups reached");
            }
            return Err(format!(
                "subscription group [{group}] does not exist and cannot be auto-created: the broker holds max_subscription_groups = {} groups",
                self.config.max_subscription_groups
            ));
        }
        let (c, created) = groups.ensure(group, crate::broker::wall_ms());
        if created {
            info!(%group, "subscription group auto-created");
        }
        Ok(c)
    }
}

/// What the broker does after a classic membership change (the registry is in the group
/// state; the reaction also feeds the rebalance timeline and sends
/// NOTIFY_CONSUMER_IDS_CHANGED).
pub trait MembershipChanges: Send + Sync {
    /// Reacts to `change`: mode re-evaluation, notices, lock release of members that left.
    fn group_changed(&self, change: &GroupChange);
}

/// What the consumer-group handlers may touch. See the [module documentation](self).
#[derive(Clone, Copy)]
pub struct GroupCtx<'a> {
    /// The group state (registry, locks, coordinator).
    pub state: GroupHandle<'a>,
    /// The broker's config (coordinator section, session bounds, limits, broker name).
    pub config: &'a BrokerConfig,
    /// The store (consumer offsets, max offsets for lag).
    pub store: &'a MessageStore,
    /// Counters.
    pub counters: &'a Counters,
    /// Topic queues (own and other brokers').
    pub routes: Routes<'a>,
    /// The subscription-group table.
    pub groups: SubscriptionGroups<'a>,
    /// Classic groups of a protocol listener (GROUP_DESCRIBE shows them).
    pub listener_groups: &'a OnceLock<ListenerGroups>,
    /// The broker's reaction to a classic membership change.
    pub membership: &'a dyn MembershipChanges,
}

impl std::fmt::Debug for GroupCtx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCtx")
            .field("broker", &self.config.broker_name)
            .finish_non_exhaustive()
    }
}

impl BrokerInner {
    /// The handle on the group state.
    pub fn group_handle(&self) -> GroupHandle<'_> {
        GroupHandle::new(
            &self.group_state,
            self.clock,
            Notifier {
                connections: &self.connections,
                counters: &self.counters,
                coordinator_dirty: &self.coordinator_dirty,
            },
        )
    }

    /// The topic routes as the coordinator sees them.
    pub fn routes(&self) -> Routes<'_> {
        Routes {
            topics: &self.topics,
            register_now: &self.register_now,
            route_cache: &self.route_cache,
            namesrv_client: &self.namesrv_client,
            config: &self.config,
        }
    }

    /// The subscription-group table with auto-creation.
    pub fn subscription_groups(&self) -> SubscriptionGroups<'_> {
        SubscriptionGroups {
            table: &self.groups,
            config: &self.config,
            counters: &self.counters,
        }
    }

    /// What the group handlers get.
    pub fn group_ctx(&self) -> GroupCtx<'_> {
        GroupCtx {
            state: self.group_handle(),
            config: &self.config,
            store: &self.store,
            counters: &self.counters,
            routes: self.routes(),
            groups: self.subscription_groups(),
            listener_groups: &self.listener_groups,
            membership: self,
        }
    }
}

impl MembershipChanges for BrokerInner {
    fn group_changed(&self, change: &GroupChange) {
        self.apply_group_change(change);
    }
}
