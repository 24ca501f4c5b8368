//! The owner of the broker's consumer-group state ([`GroupState`]: membership registry, queue
//! locks, coordinator) behind its one short lock, and the executor of the effects it leaves:
//! notices over the clients' connections, observations for the rebalance timeline, logs,
//! counters and the coordinator's persistence.
//!
//! Every operation runs through [`Groups::with`] (the lock, the group state's clock) and
//! ends with its effects executed after the lock is released, so a membership change is one
//! critical section however many reactions it has.

use crate::clock::{wall_ms, BrokerClock};
use crate::connections::NoticeSink;
use crate::metrics::Counters;
use crate::observe::Observer;
use crate::persist::write_json_atomic;
use crate::sub_groups::SubscriptionGroups;
use parking_lot::Mutex;
use shoal_group::coordinator::CoordinatorSnapshot;
use shoal_group::state::{GroupEffect, GroupState, MemberList};
use shoal_proto::code::request_code as rc;
use shoal_proto::ext::{self, LockFreedBody};
use shoal_proto::header::NotifyConsumerIdsChangedRequestHeader;
use shoal_proto::{MessageQueue, RemotingCommand};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;
use tracing::{info, warn};

/// The group state and where its effects go. See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct Groups {
    state: Mutex<GroupState>,
    clock: BrokerClock,
    sink: Arc<dyn NoticeSink>,
    counters: Arc<Counters>,
    observer: Arc<Observer>,
    sub_groups: Arc<SubscriptionGroups>,
    /// Where the coordinator's state is kept (none: not persisted).
    path: Option<PathBuf>,
    /// The coordinator's state changed since it was last persisted.
    dirty: AtomicBool,
    /// Shutting down: the state was written before connections closed, and the closes of
    /// shutdown are not members leaving.
    frozen: AtomicBool,
    /// The state's next deadline may have moved earlier.
    deadline_moved: Notify,
    /// Where notices to members without a remoting connection go (a protocol listener's).
    listener: std::sync::OnceLock<crate::listener::ListenerGroups>,
    /// In a replicated broker group: the coordinated groups whose state changed since the
    /// metadata task last took them (`None`: not replicated).
    changed: Option<Mutex<ChangedGroups>>,
}

/// Coordinated groups whose state changed, at most [`ChangedGroups::MAX`]; beyond that only
/// the fact that more changed (the master then writes every group).
#[derive(Debug, Default)]
pub(crate) struct ChangedGroups {
    pub(crate) names: BTreeSet<String>,
    pub(crate) overflowed: bool,
}

impl ChangedGroups {
    /// Names kept at most.
    const MAX: usize = 4096;

    fn add(&mut self, group: String) {
        if self.names.len() < Self::MAX || self.names.contains(&group) {
            self.names.insert(group);
        } else {
            self.overflowed = true;
        }
    }
}

/// What [`Groups`] needs besides its state.
#[derive(Debug)]
pub(crate) struct GroupsParts {
    pub(crate) clock: BrokerClock,
    pub(crate) sink: Arc<dyn NoticeSink>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) observer: Arc<Observer>,
    pub(crate) sub_groups: Arc<SubscriptionGroups>,
    pub(crate) path: Option<PathBuf>,
    /// The broker replicates (a member of a replicated broker group): changed groups are
    /// kept for the metadata task.
    pub(crate) replicated: bool,
}

impl Groups {
    /// The owner of `state`; `restored` when the coordinator came from its file (it is
    /// written again at the next persistence).
    pub(crate) fn new(state: GroupState, parts: GroupsParts, restored: bool) -> Self {
        Self {
            state: Mutex::new(state),
            clock: parts.clock,
            sink: parts.sink,
            counters: parts.counters,
            observer: parts.observer,
            sub_groups: parts.sub_groups,
            path: parts.path,
            dirty: AtomicBool::new(restored),
            frozen: AtomicBool::new(false),
            deadline_moved: Notify::new(),
            listener: std::sync::OnceLock::new(),
            changed: parts
                .replicated
                .then(|| Mutex::new(ChangedGroups::default())),
        }
    }

    /// The coordinated groups whose state changed since the last call (replicated brokers).
    pub(crate) fn take_changed(&self) -> ChangedGroups {
        self.changed
            .as_ref()
            .map(|c| std::mem::take(&mut *c.lock()))
            .unwrap_or_default()
    }

    /// This broker became its group's master: its coordinator continues from `snapshot`,
    /// the state its log replicated ([`GroupState::take_over_coordinator`]).
    pub(crate) fn take_over(&self, snapshot: CoordinatorSnapshot) {
        self.with(|g, now| g.take_over_coordinator(now, snapshot));
    }

    /// Notices to members that have no remoting connection go to the protocol listener
    /// (its members learn of changes by heartbeating); once.
    pub(crate) fn set_listener(&self, listener: crate::listener::ListenerGroups) {
        let _ = self.listener.set(listener);
    }

    /// The group state's clock now.
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Runs `f` on the group state under its one lock (with the clock's time), then executes
    /// the effects it left, outside the lock.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut GroupState, u64) -> R) -> R {
        let now = self.clock.now_ms();
        let (r, effects, deadline) = {
            let mut g = self.state.lock();
            let before = g.poll_timeout();
            let r = f(&mut g, now);
            let effects: Vec<GroupEffect> = std::iter::from_fn(|| g.poll_effect()).collect();
            let after = g.poll_timeout();
            let moved = match (before, after) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some(b), Some(a)) => a < b,
            };
            (r, effects, moved)
        };
        if deadline {
            self.deadline_moved.notify_one();
        }
        self.execute(effects);
        r
    }

    /// Reads the group state under its lock (with the clock's time).
    pub(crate) fn read<R>(&self, f: impl FnOnce(&GroupState, u64) -> R) -> R {
        let now = self.clock.now_ms();
        f(&self.state.lock(), now)
    }

    /// When the state's timers have work next ([`GroupState::poll_timeout`]).
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.state.lock().poll_timeout()
    }

    /// Waits until an operation moved the next deadline earlier.
    pub(crate) async fn deadline_moved(&self) {
        self.deadline_moved.notified().await;
    }

    /// Writes the coordinator's state if it changed (blocking).
    pub(crate) fn persist_if_dirty(&self) {
        let Some(path) = &self.path else {
            return;
        };
        if self.frozen.load(Ordering::Relaxed) || !self.dirty.swap(false, Ordering::Relaxed) {
            return;
        }
        let snapshot = self.state.lock().snapshot();
        if let Err(e) = write_json_atomic(path, &snapshot) {
            self.dirty.store(true, Ordering::Relaxed);
            warn!(error = %e, "could not persist the group coordinator state");
        }
    }

    /// Whether the coordinator's state has changes not on disk.
    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Relaxed)
    }

    /// Shutting down: writes the state one last time and ignores what follows (the closes
    /// of shutdown are not members leaving), so members stay members across a restart.
    pub(crate) fn freeze(&self) {
        self.dirty.store(true, Ordering::Relaxed);
        self.persist_if_dirty();
        self.frozen.store(true, Ordering::Relaxed);
    }

    /// Executes what a group-state operation asked for.
    fn execute(&self, effects: Vec<GroupEffect>) {
        for e in effects {
            match e {
                GroupEffect::NotifyMember {
                    group,
                    member_id,
                    conn_id,
                } => self.assignment_notice(&group, &member_id, conn_id),
                GroupEffect::MemberRemoved {
                    group,
                    member_id,
                    reason,
                } => {
                    info!(group = %group, member = %member_id, reason = ?reason, "coordinated member removed");
                    self.counters.coordinator_members_removed.inc();
                }
                GroupEffect::Persist { group } => {
                    self.dirty.store(true, Ordering::Relaxed);
                    if let Some(c) = &self.changed {
                        c.lock().add(group);
                    }
                }
                GroupEffect::LockFreed {
                    group,
                    conn_id,
                    queues,
                } => self.lock_freed(group, conn_id, queues),
                GroupEffect::ModeChanged {
                    group,
                    mode,
                    notify_conn_ids,
                } => {
                    info!(group = %group, mode = %mode, "consumer group changed mode");
                    for conn in notify_conn_ids {
                        self.assignment_notice(&group, "", conn);
                    }
                }
                GroupEffect::ConsumerIdsChanged {
                    group,
                    conn_ids,
                    member_list,
                } => self.consumer_ids_changed(&group, conn_ids, member_list),
                GroupEffect::MembershipObserved {
                    group,
                    members,
                    subscription_changed,
                } => self
                    .observer
                    .membership(&group, members, subscription_changed, wall_ms()),
                GroupEffect::ClientLocksReleased {
                    group,
                    client_id,
                    count,
                } => {
                    info!(group = %group, client = %client_id, locks = count, "released the queue locks of a client that left");
                }
                GroupEffect::HealthChanged { group, health } => {
                    if health.is_healthy() {
                        info!(group = %group, "consumer group is consistent again");
                    } else {
                        warn!(group = %group, duplicate_client_ids = ?health.duplicate_client_ids, inconsistent_topics = ?health.inconsistent_topics,
                            "consumer group misconfigured: duplicate client ids or members subscribing differently break queue allocation");
                    }
                }
            }
        }
    }

    /// NOTIFY_CONSUMER_IDS_CHANGED to every remaining member, unless the group's
    /// subscription config switches notices off; Shoal members get the member list.
    fn consumer_ids_changed(&self, group: &str, conn_ids: Vec<u64>, list: Option<MemberList>) {
        if !self.sub_groups.notifies_consumer_ids_changed(group) {
            return;
        }
        let header = NotifyConsumerIdsChangedRequestHeader {
            consumer_group: group.to_string(),
            ..Default::default()
        };
        for conn in conn_ids {
            let plain =
                || RemotingCommand::request_with_header(rc::NOTIFY_CONSUMER_IDS_CHANGED, &header);
            let mut req = match list.as_ref().filter(|l| l.to.contains(&conn)) {
                Some(l) => plain().with_json_body(&l.notice).unwrap_or_else(|e| {
                    warn!(error = %e, "member list not encoded; plain notice");
                    plain()
                }),
                None => plain(),
            };
            req.set_oneway();
            if self.sink.notify(conn, req) {
                self.counters.notifications_sent.inc();
            }
        }
    }

    /// GROUP_ASSIGNMENT_CHANGED to a coordinated member (oneway).
    fn assignment_notice(&self, group: &str, member_id: &str, conn_id: u64) {
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
        if self.sink.notify(conn_id, req) {
            self.counters.coordinator_notices_sent.inc();
        } else if let Some(l) = self.listener.get() {
            // No such connection: a protocol listener's member (its held heartbeat answer
            // goes out now), or a member whose connection is gone (the listener skips it).
            (l.notify_member)(group, member_id);
        }
    }

    /// NOTIFY_LOCK_FREED (oneway) to a member that was refused one of `queues`.
    fn lock_freed(&self, group: String, conn_id: u64, queues: Vec<MessageQueue>) {
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
        if self.sink.notify(conn_id, req) {
            self.counters.lock_freed_sent.inc();
        }
    }
}
