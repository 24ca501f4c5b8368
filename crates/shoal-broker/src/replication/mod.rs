//! Replication of the broker's group: the broker as one member of a replicated group
//! (`[replication]` with the controller's addresses), DESIGN.md section 7 and docs/ha.md.
//!
//! The decisions are `shoal_ha::replication::Member`'s (controller session, master or
//! replica, what to ship, what to truncate, which sends are acknowledged); one task, the
//! driver (`driver.rs`), owns it and only moves bytes and messages: the store's commit log to
//! and from the other brokers of the group, requests to the controller, time. Everything
//! else talks to the task through [`Replication`]:
//! - the send path asks [`Replication::check_writable`] before a put (only a master holding
//!   its lease appends), then waits in [`Replication::acknowledged`] until the in-sync set has
//!   the put (or the master, under `ack = "master"`);
//! - the processor hands the group's replication messages (codes 9082, 9083) to
//!   [`Replication::deliver`];
//! - the registration with the name servers asks [`Replication::route_broker_id`] (0 for the
//!   master, the controller's id for a replica) and wakes on [`Replication::role_changed`].
//!
//! The store is the other half of the rules: a replicated store shows consumers nothing above
//! the confirmed offset and refuses puts unless the driver allows them (only while master).

mod commits;
mod config;
mod disk;
mod driver;
mod link;
mod metadata;
mod metrics;
mod pop;
mod wire;

pub use config::{AckSetting, ReplicationSettings};

use crate::reply::Reject;
use parking_lot::Mutex;
use serde::Serialize;
use shoal_ha::replication::WriteRefusal;
use shoal_ha::{BrokerId, Epoch};
use shoal_proto::code::response_code as resp;
use shoal_proto::RemotingCommand;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{mpsc, oneshot, Notify};

pub(crate) use commits::{start as start_forwarding_commits, store_commit};
pub(crate) use driver::start;
pub(crate) use metadata::{start as start_metadata, METADATA_TOPIC};
pub(crate) use wire::is_peer_code;

/// The member's role as the rest of the broker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "camelCase", tag = "role")]
pub(crate) enum RoleView {
    /// No id, or no word from the controller yet.
    #[default]
    Joining,
    /// Master of `epoch`.
    Master {
        /// The master epoch.
        epoch: Epoch,
    },
    /// Replica following `master` (when known) in `epoch`.
    Replica {
        /// The master it follows.
        master: Option<BrokerId>,
        /// The newest master epoch it knows.
        epoch: Epoch,
    },
}

/// What the driver last published about the member (status pages, metrics, the send path's
/// first check).
#[derive(Debug, Clone, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReplicationView {
    pub(crate) group: String,
    pub(crate) broker_id: Option<BrokerId>,
    #[serde(flatten)]
    pub(crate) role: RoleView,
    /// Whether a put would be accepted now, or why not.
    pub(crate) writable: Option<String>,
    /// On a master: whether it holds its write lease.
    pub(crate) lease_held: bool,
    pub(crate) log_end: u64,
    pub(crate) confirmed: u64,
    /// The in-sync set (on a master).
    pub(crate) in_sync: Vec<BrokerId>,
    pub(crate) in_sync_epoch: Epoch,
    /// On a replica: the address of the master it follows, when known.
    pub(crate) master_addr: Option<String>,
    /// Each replica's acknowledged log end (on a master; `None`: not following this epoch).
    pub(crate) replicas: Vec<(BrokerId, Option<u64>)>,
    /// Sends waiting for their acknowledgement.
    pub(crate) pending_acks: usize,
    /// The log's epoch entries: `(master epoch, first commit-log offset)`, oldest first.
    #[serde(skip)]
    pub(crate) epochs: Vec<(Epoch, u64)>,
}

pub(crate) enum Input {
    /// A put of the send path ended at `end`; answer when it is acknowledged.
    Appended {
        end: u64,
        reply: oneshot::Sender<Result<(), WriteRefusal>>,
    },
    /// A message from another broker of the group.
    Peer(wire::PeerFrame),
    /// The controller's answer to `call` (`None`: none came).
    Answer {
        call: u64,
        response: Option<shoal_ha::controller::Response>,
    },
    /// The controller says the group changed (a hint: ask it now).
    Notice,
    /// A message to this broker of the group could not be sent, or the connection to it
    /// closed (a hint that it is down).
    Unreachable(shoal_ha::BrokerId),
}

/// Counters of the replication task (`shoal_replication_*` metrics).
#[derive(Debug, Default)]
pub(crate) struct ReplicationCounters {
    /// Bytes shipped to replicas.
    pub(crate) bytes_shipped: AtomicU64,
    /// Bytes received from a master and appended.
    pub(crate) bytes_received: AtomicU64,
    /// Non-empty batches shipped to replicas.
    pub(crate) batches_shipped: AtomicU64,
    /// Non-empty batches received from a master and appended.
    pub(crate) batches_received: AtomicU64,
    /// Batches received from a master that could not be appended (a full disk, I/O errors).
    pub(crate) append_failures: AtomicU64,
    /// Truncations of this broker's log at a divergence point.
    pub(crate) truncations: AtomicU64,
    /// Restarts of this broker's log at its master's first offset.
    pub(crate) log_restarts: AtomicU64,
    /// Times this broker became master.
    pub(crate) became_master: AtomicU64,
    /// Sends refused or failed by replication (not master, lease expired, in-sync set too
    /// small, not acknowledged in time).
    pub(crate) writes_refused: AtomicU64,
    /// Peer messages and controller answers dropped because the task's inbox was full.
    pub(crate) inbox_dropped: AtomicU64,
    /// Coordinated groups of the master's replicated coordinator state the metadata task
    /// holds (a gauge; at most `[coordinator] max_groups`).
    pub(crate) coordinator_groups: AtomicU64,
    /// Coordinated groups of the master's state left out: the task held `max_groups` already.
    pub(crate) coordinator_groups_left_out: AtomicU64,
}

/// The broker's handle on its replication task. See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct Replication {
    group: String,
    inbox: mpsc::Sender<Input>,
    view: Mutex<ReplicationView>,
    role_changed: Notify,
    /// The master epoch (+ 1; 0: none) in which this broker took over its group's state: it
    /// applied every metadata record of its log, restored the coordinator and rebuilt the
    /// transaction decisions from it (`metadata.rs`).
    taken_over: AtomicU64,
    /// Wakes those waiting for the take-over ([`Self::serving_or_not_master`]).
    taken_over_now: Notify,
    /// Metadata rounds the master started (`metadata.rs`; each reads the offsets then).
    rounds_started: AtomicU64,
    /// Metadata rounds the in-sync set acknowledged, by the number they started as.
    rounds_done: tokio::sync::watch::Sender<u64>,
    /// Asks the metadata task for a round now.
    round_wanted: Notify,
    pub(crate) counters: ReplicationCounters,
    /// Commits made to this broker while a replica, for its master (`commits.rs`).
    pub(crate) commits: commits::ForwardedCommits,
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Input::Appended { end, .. } => write!(f, "Appended({end})"),
            Input::Peer(p) => write!(f, "Peer({p:?})"),
            Input::Answer { call, .. } => write!(f, "Answer({call})"),
            Input::Notice => write!(f, "Notice"),
            Input::Unreachable(b) => write!(f, "Unreachable({b})"),
        }
    }
}

/// The answer a send gets for a refusal.
pub(crate) fn refusal_reject(r: WriteRefusal) -> Reject {
    let code = match r {
        WriteRefusal::InSyncReplicasNotEnough { .. } => resp::SYSTEM_ERROR,
        WriteRefusal::LeaseExpired | WriteRefusal::NotMaster => resp::SERVICE_NOT_AVAILABLE,
        WriteRefusal::Busy => resp::SYSTEM_BUSY,
        WriteRefusal::Timeout => resp::FLUSH_SLAVE_TIMEOUT,
    };
    let remark = match r {
        // RocketMQ's remark for PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH.
        WriteRefusal::InSyncReplicasNotEnough { have, need } => {
            format!("in-sync replicas not enough ({have} in sync, min_insync_replicas = {need})")
        }
        WriteRefusal::NotMaster => "this broker is not the master of its group".into(),
        other => other.to_string(),
    };
    Reject::new(code, remark)
}

impl Replication {
    fn new(group: String, inbox: mpsc::Sender<Input>, max_pending_commits: usize) -> Self {
        Self {
            view: Mutex::new(ReplicationView {
                group: group.clone(),
                ..Default::default()
            }),
            group,
            inbox,
            role_changed: Notify::new(),
            taken_over: AtomicU64::new(0),
            taken_over_now: Notify::new(),
            rounds_started: AtomicU64::new(0),
            rounds_done: tokio::sync::watch::channel(0).0,
            round_wanted: Notify::new(),
            counters: ReplicationCounters::default(),
            commits: commits::ForwardedCommits::new(max_pending_commits),
        }
    }

    /// Whether a put may be appended now: only on a master that holds its lease and has
    /// enough in-sync replicas (the answer is final only once acknowledged).
    pub(crate) fn check_writable(&self) -> Result<(), WriteRefusal> {
        let view = self.view.lock();
        if !matches!(view.role, RoleView::Master { .. }) {
            drop(view);
            self.counters.writes_refused.fetch_add(1, Ordering::Relaxed);
            return Err(WriteRefusal::NotMaster);
        }
        Ok(())
    }

    /// Waits until the put that ended the log at `end` is acknowledged (or refused).
    pub(crate) async fn acknowledged(&self, end: u64) -> Result<(), WriteRefusal> {
        let (reply, rx) = oneshot::channel();
        // Waits for room: the task answers quickly, and its queue is bounded.
        if self
            .inbox
            .send(Input::Appended { end, reply })
            .await
            .is_err()
        {
            return Err(WriteRefusal::NotMaster);
        }
        let r = rx.await.unwrap_or(Err(WriteRefusal::NotMaster));
        if r.is_err() {
            self.counters.writes_refused.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// A replication message from another broker (codes 9082, 9083); dropped when malformed,
    /// of another group, or when the task is too busy (the protocol sends again).
    pub(crate) fn deliver(&self, cmd: &RemotingCommand) {
        match wire::decode_peer(cmd) {
            Ok(frame) if frame.group == self.group => {
                if self.inbox.try_send(Input::Peer(frame)).is_err() {
                    self.counters.inbox_dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(frame) => {
                tracing::debug!(group = %frame.group, "replication message for another group dropped");
            }
            Err(e) => tracing::debug!(error = %e, "malformed replication message dropped"),
        }
    }

    /// The `brokerId` to register with the name servers: 0 while master holding its lease
    /// (routes name the master as RocketMQ's do; a master cut off from the controller must not
    /// take id 0 back from the one elected in its place), the controller's id otherwise, none
    /// before an id.
    pub(crate) fn route_broker_id(&self) -> Option<i64> {
        let view = self.view.lock();
        match view.role {
            RoleView::Master { .. } if view.lease_held => Some(0),
            _ => view.broker_id.map(|id| id as i64),
        }
    }

    /// While master: how many brokers keep a copy of the group's log (itself and the
    /// replicas it ships to, in sync or not).
    pub(crate) fn group_size(&self) -> Option<usize> {
        let view = self.view.lock();
        match view.role {
            RoleView::Master { .. } => Some(1 + view.replicas.len()),
            _ => None,
        }
    }

    /// While master holding its lease: its master epoch and its in-sync set as registered
    /// broker ids (itself as 0, the replicas by their controller ids), which its
    /// registration names for the Kafka listeners (leader epoch and ISR).
    pub(crate) fn leadership(&self) -> Option<(Epoch, Vec<i64>)> {
        let view = self.view.lock();
        match view.role {
            RoleView::Master { epoch } if view.lease_held => {
                let own = view.broker_id;
                let ids = view
                    .in_sync
                    .iter()
                    .map(|id| {
                        if Some(*id) == own {
                            0
                        } else {
                            i64::try_from(*id).unwrap_or(i64::MAX)
                        }
                    })
                    .collect();
                Some((epoch, ids))
            }
            _ => None,
        }
    }

    /// The master epochs this broker's log holds data of (`(epoch, first commit-log offset)`,
    /// oldest first) and the newest master epoch it knows.
    pub(crate) fn epochs(&self) -> (Vec<(Epoch, u64)>, Epoch) {
        let view = self.view.lock();
        let current = match view.role {
            RoleView::Master { epoch } | RoleView::Replica { epoch, .. } => epoch,
            RoleView::Joining => 0,
        };
        (view.epochs.clone(), current)
    }

    /// Resolves once a metadata round that started after the call is acknowledged by the
    /// in-sync set, so every consumer offset committed and every topic or subscription-group
    /// change made before the call is on every member of the set (a new master has it); `false` when none was within `timeout` (not master,
    /// or the set did not acknowledge).
    pub(crate) async fn metadata_replicated(&self, timeout: std::time::Duration) -> bool {
        let want = self.rounds_started.load(Ordering::Acquire) + 1;
        let mut done = self.rounds_done.subscribe();
        self.round_wanted.notify_one();
        tokio::time::timeout(timeout, done.wait_for(|n| *n >= want))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The metadata task starts a round (before it reads the offsets); its number.
    pub(crate) fn round_started(&self) -> u64 {
        self.rounds_started.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The metadata task's round `n` was acknowledged.
    pub(crate) fn round_done(&self, n: u64) {
        self.rounds_done.send_if_modified(|d| {
            let newer = n > *d;
            if newer {
                *d = n;
            }
            newer
        });
    }

    /// Resolves when a round is asked for ([`Self::metadata_replicated`]).
    pub(crate) async fn round_wanted(&self) {
        self.round_wanted.notified().await;
    }

    /// Whether this broker is its group's master now.
    pub(crate) fn is_master(&self) -> bool {
        matches!(self.view.lock().role, RoleView::Master { .. })
    }

    /// The refusal of a change to the topic or subscription-group table on a replica: the
    /// master's tables are replicated to it and would take the change back.
    pub(crate) fn refuse_table_change(&self) -> Result<(), Reject> {
        if self.is_master() {
            return Ok(());
        }
        Err(Reject::new(
            resp::SERVICE_NOT_AVAILABLE,
            format!(
                "this broker is a replica of {}: change topics and subscription groups on its \
                 master (brokerId 0), whose tables the replicas follow",
                self.group
            ),
        ))
    }

    /// The metadata task took over the group's state as master of `epoch`.
    pub(crate) fn set_taken_over(&self, epoch: Epoch) {
        self.taken_over
            .store(u64::from(epoch) + 1, Ordering::Release);
        self.taken_over_now.notify_waiters();
    }

    /// Resolves once this broker serves as master, at once when it is not master (a replica
    /// answers at once that it is not the coordinator), or after `limit`: a master still
    /// taking over its group's state answers its members after it, not in between.
    pub(crate) async fn serving_or_not_master(&self, limit: std::time::Duration) {
        let taken_over = self.taken_over_now.notified();
        tokio::pin!(taken_over);
        taken_over.as_mut().enable();
        if !self.is_master() || self.serves_as_master() {
            return;
        }
        let _ = tokio::time::timeout(limit, taken_over).await;
    }

    /// Whether this broker is master and has taken over the group's state in its epoch
    /// (the metadata, the coordinator, the transaction decisions of its log): only then do
    /// its coordinator answer members, its transaction decisions and checks run, and its
    /// delay levels deliver.
    pub(crate) fn serves_as_master(&self) -> bool {
        match self.view.lock().role {
            RoleView::Master { epoch } => {
                self.taken_over.load(Ordering::Acquire) == u64::from(epoch) + 1
            }
            _ => false,
        }
    }

    /// The refusal of a request that only a master that took over its group's state answers
    /// (GROUP_HEARTBEAT, GROUP_LEAVE, END_TRANSACTION, LOCK_BATCH_MQ, UNLOCK_BATCH_MQ, and
    /// the POP codes that lease, acknowledge or renew): a
    /// replica, or a master still applying its log, would answer from stale state. The client
    /// asks again (members heartbeat and lock again; a producer's transaction is checked
    /// back).
    pub(crate) fn refuse_unless_serving(&self) -> Result<(), Reject> {
        if self.serves_as_master() {
            return Ok(());
        }
        let remark = if self.is_master() {
            format!(
                "this broker became the master of {} and is still applying its log's metadata; \
                 ask again shortly",
                self.group
            )
        } else {
            format!(
                "this broker is a replica of {}: coordinated groups, queue locks, POP leases \
                 and transactions are served by its master (brokerId 0)",
                self.group
            )
        };
        Err(Reject::new(resp::SERVICE_NOT_AVAILABLE, remark))
    }

    /// What the driver last published.
    pub(crate) fn view(&self) -> ReplicationView {
        self.view.lock().clone()
    }

    /// Resolves when the role changes next.
    pub(crate) async fn role_changed(&self) {
        self.role_changed.notified().await;
    }

    /// The driver publishes a new view; wakes registration when the role or the in-sync set
    /// changed (routes name the master; Kafka metadata names the in-sync set).
    fn publish(&self, view: ReplicationView) {
        let changed = {
            let mut v = self.view.lock();
            let changed = v.role != view.role
                || v.broker_id != view.broker_id
                || v.lease_held != view.lease_held
                || v.in_sync != view.in_sync;
            *v = view;
            changed
        };
        if changed {
            self.role_changed.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;

    fn as_role(r: &Replication, role: RoleView) {
        r.publish(ReplicationView {
            group: "broker-a".into(),
            broker_id: Some(2),
            role,
            ..Default::default()
        });
    }

    #[tokio::test]
    async fn a_wait_for_the_take_over_ends_with_it_at_once_off_master_or_at_its_limit() {
        use std::sync::Arc;
        use std::time::Duration;
        let (tx, _rx) = mpsc::channel(1);
        let r = Arc::new(Replication::new("broker-a".into(), tx, 16));
        // A limit no run reaches: the guard only turns a wait that does not end into a failure.
        let hour = Duration::from_secs(3600);
        let guard = Duration::from_secs(30);
        // Not master: at once.
        let ended = tokio::time::timeout(guard, r.serving_or_not_master(hour)).await;
        assert!(ended.is_ok(), "a replica does not wait");
        // Elected, still taking over: until the take-over.
        as_role(&r, RoleView::Master { epoch: 4 });
        let waiting = tokio::spawn({
            let r = r.clone();
            async move { r.serving_or_not_master(hour).await }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(
            !waiting.is_finished(),
            "it waits while the master takes over"
        );
        r.set_taken_over(4);
        let ended = tokio::time::timeout(guard, waiting).await;
        assert!(ended.is_ok(), "the take-over ends the wait");
        // Serving: at once.
        let ended = tokio::time::timeout(guard, r.serving_or_not_master(hour)).await;
        assert!(ended.is_ok(), "a serving master does not wait");
        // Elected again and never taking over: the limit ends it.
        as_role(&r, RoleView::Master { epoch: 6 });
        let ended =
            tokio::time::timeout(guard, r.serving_or_not_master(Duration::from_millis(1))).await;
        assert!(ended.is_ok(), "the limit ends the wait");
    }

    #[test]
    fn only_a_master_that_took_over_serves_members_and_transactions() {
        let (tx, _rx) = mpsc::channel(1);
        let r = Replication::new("broker-a".into(), tx, 16);
        let refused = |r: &Replication| r.refuse_unless_serving().err().map(|e| e.code);
        assert_eq!(refused(&r), Some(resp::SERVICE_NOT_AVAILABLE), "joining");
        as_role(
            &r,
            RoleView::Replica {
                master: Some(1),
                epoch: 3,
            },
        );
        let e = r.refuse_unless_serving().unwrap_err();
        assert_eq!(e.code, resp::SERVICE_NOT_AVAILABLE);
        assert!(e.remark.contains("replica of broker-a"), "{}", e.remark);
        // Elected: still applying its log.
        as_role(&r, RoleView::Master { epoch: 4 });
        let e = r.refuse_unless_serving().unwrap_err();
        assert!(e.remark.contains("still applying"), "{}", e.remark);
        assert!(!r.serves_as_master());
        // A take-over of an older epoch does not count.
        r.set_taken_over(3);
        assert!(!r.serves_as_master());
        r.set_taken_over(4);
        assert!(r.serves_as_master());
        assert!(r.refuse_unless_serving().is_ok());
        // Stepped down, then elected again: it takes over again first.
        as_role(
            &r,
            RoleView::Replica {
                master: Some(1),
                epoch: 5,
            },
        );
        assert!(!r.serves_as_master());
        as_role(&r, RoleView::Master { epoch: 6 });
        assert!(!r.serves_as_master());
    }
}

#[cfg(test)]
mod round_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    /// A commit waits for a metadata round that started after it: not for one in progress
    /// when it came (that round read the offsets before it), and not at all once its round is
    /// acknowledged; without rounds (not master) it gives up after its timeout.
    #[tokio::test]
    async fn a_commit_waits_for_a_round_that_started_after_it() {
        let (tx, _rx) = mpsc::channel(1);
        let r = Arc::new(Replication::new("broker-a".into(), tx, 16));
        let in_progress = r.round_started();
        let waiter = {
            let r = r.clone();
            tokio::spawn(async move { r.metadata_replicated(Duration::from_secs(30)).await })
        };
        // The task is asked for a round.
        tokio::time::timeout(Duration::from_secs(5), r.round_wanted())
            .await
            .unwrap();
        r.round_done(in_progress);
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "the round in progress read the offsets before"
        );
        let next = r.round_started();
        r.round_done(next);
        assert!(waiter.await.unwrap());
        assert!(!r.metadata_replicated(Duration::from_millis(20)).await);
    }
}
