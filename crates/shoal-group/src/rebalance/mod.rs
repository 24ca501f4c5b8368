//! The client-side rebalancer: one sans-IO state machine that decides which message queues a
//! consumer takes, hands over and fences, in the style of quinn-proto's `Connection`.
//!
//! The driver (one task per consumer in `shoal-client`, or the simulator in [`crate::sim`])
//! feeds it events with the time they happened (`handle_*(now, ..)`), executes the actions it
//! polls ([`Rebalancer::poll_action`]) and calls [`Rebalancer::handle_timeout`] at the deadline
//! [`Rebalancer::poll_timeout`] gives. Nothing here sleeps, reads a clock or does I/O, so every
//! race can be replayed on virtual time.
//!
//! **Target.** What the consumer should own is an input the rebalancer reconciles towards:
//! - *classic mode* (RocketMQ's model): per topic the driver fetches the route's queues and the
//!   group's member ids ([`Action::FetchView`] → [`Rebalancer::handle_view`]) and the
//!   rebalancer runs the allocation strategy for itself;
//! - *coordinated mode*: a group coordinator computes the assignment and the driver passes it
//!   on with [`Rebalancer::handle_target`] (with the coordinator's member epoch). The first
//!   such call switches the rebalancer to coordinated mode; views are no longer fetched.
//!
//! **Per-queue states.** Gaining: `Pending → Acquiring → Starting → Owned`. Losing:
//! `Owned → Draining → Committing → Unlocking → (released)`. A queue in the target is locked on
//! the broker first (LOCK_BATCH_MQ), its start offset is read only once the lock is held, and
//! it is started with the lease the lock gave. A queue that leaves the target is stopped
//! ([`Action::Stop`]: no new deliveries, in-flight ones finish), its offset is committed and
//! acknowledged, and only then is its lock released, which is the evidence the next owner waits
//! for ([`Handover::Locks`]).
//!
//! **Leases and fencing.** Every held lock has a [`Lease`]: the time until which the member may
//! hand messages of the queue to its listener, by its own clock, computed by the driver from
//! when the evidence was *sent* (a lock request, or a heartbeat on a Shoal broker whose locks
//! last the member's session). A queue whose lease runs out is fenced ([`Action::Fence`]:
//! deliveries stop at once, cached messages are dropped, nothing is committed) and acquired
//! again from the committed offset. A lease is extended only by evidence of the same broker
//! session ([`Lease::session`]); a heartbeat answer naming another session means the broker
//! dropped our locks.
//!
//! **Fewer round trips against a Shoal broker** (each only where the broker lists the feature
//! in GET_BROKER_FEATURES; against Apache RocketMQ every step is the plain protocol):
//! - the lock grant carries the group's committed offsets ([`LockAnswer::committed`]): a
//!   granted queue starts without [`Action::QueryStartOffset`];
//! - the final commit rides on the unlock ([`Action::CommitAndUnlock`], when the grant said
//!   [`LockAnswer::commit_on_unlock`]): the broker stores the offset, then frees the lock;
//! - membership notices carry the member list ([`Rebalancer::handle_members`]): no view fetch;
//! - a queue whose lock came after a newer membership notice is held (locked, not started)
//!   until a fresh view still gives it to this member, so a burst of joins does not make it
//!   change hands twice.

mod queue;
#[cfg(test)]
mod tests;
mod types;

use crate::allocate::{AllocateStrategy, AllocationInput};
use queue::{After, QState, Queue};
use shoal_proto::MessageQueue;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

pub use queue::QueuePhase;
pub use types::{
    Action, Handover, Lease, LockAnswer, RebalanceStats, RebalancerConfig, StartOffset,
    MAX_UNLOCK_ATTEMPTS,
};

/// Milliseconds of a duration (the rebalancer's clock counts milliseconds).
pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[derive(Debug, Default)]
struct TopicView {
    queues: Option<Vec<MessageQueue>>,
    members: Option<Vec<String>>,
    in_flight: bool,
    again: bool,
    stale_in_a_row: u32,
    next_at: Option<u64>,
    /// A membership notice came after the view the share rests on (cleared when a view or
    /// member list is applied, or a fetch fails).
    stale: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Classic,
    /// `epoch`: of the last applied assignment; `None` after a fence or a rejoin (the next
    /// assignment is accepted whatever its epoch: a new epoch lineage).
    Coordinated {
        epoch: Option<i64>,
    },
}

/// The rebalancer of one consumer. See the [module documentation](self).
#[derive(Debug)]
pub struct Rebalancer {
    config: RebalancerConfig,
    strategy: Arc<dyn AllocateStrategy>,
    source: Source,
    topics: BTreeMap<String, TopicView>,
    /// Classic mode: each topic's share; coordinated mode: one entry under "".
    shares: BTreeMap<String, BTreeSet<MessageQueue>>,
    target: BTreeSet<MessageQueue>,
    target_changed_at: Option<u64>,
    queues: BTreeMap<MessageQueue, Queue>,
    actions: VecDeque<Action>,
    next_refresh: Option<u64>,
    shutting_down: bool,
    stats: RebalanceStats,
    /// Per broker, the version of the last member list applied from its notices.
    member_versions: BTreeMap<String, u64>,
}

impl Rebalancer {
    /// A rebalancer with no topics yet.
    pub fn new(config: RebalancerConfig, strategy: Arc<dyn AllocateStrategy>) -> Self {
        Self {
            config,
            strategy,
            source: Source::Classic,
            topics: BTreeMap::new(),
            shares: BTreeMap::new(),
            target: BTreeSet::new(),
            target_changed_at: None,
            queues: BTreeMap::new(),
            actions: VecDeque::new(),
            next_refresh: None,
            shutting_down: false,
            stats: RebalanceStats::default(),
            member_versions: BTreeMap::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RebalancerConfig {
        &self.config
    }

    // ---- inputs --------------------------------------------------------------------------

    /// Adds a topic to the subscription (classic mode fetches its view at once).
    pub fn handle_subscribe(&mut self, now: u64, topic: &str) {
        if !self.topics.contains_key(topic) {
            self.topics.insert(
                topic.to_owned(),
                TopicView {
                    next_at: Some(now),
                    ..TopicView::default()
                },
            );
        }
        self.step(now);
    }

    /// Removes a topic: its queues are released.
    pub fn handle_unsubscribe(&mut self, now: u64, topic: &str) {
        self.topics.remove(topic);
        self.shares.remove(topic);
        self.recompute_target(now);
        self.step(now);
    }

    /// Something may have changed (a membership notice, a route change, the safety-net
    /// timer): fetch every topic's view again.
    pub fn handle_notice(&mut self, now: u64) {
        if self.source == Source::Classic {
            for v in self.topics.values_mut() {
                v.stale = true;
                if v.in_flight {
                    v.again = true;
                } else {
                    v.next_at = Some(now);
                }
            }
        }
        self.step(now);
    }

    /// A topic's view as fetched: its queues (the route's readable queues) and the group's
    /// member ids.
    pub fn handle_view(
        &mut self,
        now: u64,
        topic: &str,
        queues: Vec<MessageQueue>,
        members: Vec<String>,
    ) {
        let max_stale = self.config.max_stale_views;
        let Some(v) = self.topics.get_mut(topic) else {
            return;
        };
        v.in_flight = false;
        if self.shutting_down || self.source != Source::Classic {
            return;
        }
        if v.again && v.stale_in_a_row < max_stale {
            // A notice arrived while this was being fetched: it may predate the change.
            v.again = false;
            v.stale_in_a_row += 1;
            v.next_at = Some(now);
            self.stats.stale_views += 1;
            self.step(now);
            return;
        }
        if v.again {
            v.again = false;
            v.next_at = Some(now);
        }
        v.stale_in_a_row = 0;
        v.stale = false;
        // A member list without this member predates the broker's processing of its first
        // heartbeat (or follows an expiry): fetch again soon rather than at the next refresh
        // interval, or a new member would idle for 20 s. Liveness only: nothing is taken on it.
        if !queues.is_empty() && !members.contains(&self.config.client_id) {
            v.next_at = Some(now + ms(self.config.refresh_retry));
            self.stats.views_without_self += 1;
        }
        v.queues = Some(queues);
        v.members = Some(members);
        self.next_refresh = Some(now + ms(self.config.refresh_interval));
        self.allocate_topic(topic);
        self.recompute_target(now);
        self.step(now);
    }

    /// Fetching a topic's view failed: keep the current share and try again soon.
    pub fn handle_view_failed(&mut self, now: u64, topic: &str) {
        let retry = self.config.refresh_retry;
        if let Some(v) = self.topics.get_mut(topic) {
            v.in_flight = false;
            v.again = false;
            // Go on with what is known (a held queue must not wait for a view that does not
            // come).
            v.stale = false;
            v.next_at = Some(now + ms(retry));
        }
        self.step(now);
    }

    /// A membership notice that carried the group's member list (a Shoal broker with the
    /// feature `memberListNotice`), version `version` of broker `broker`'s registry: it is
    /// applied as the member half of the view of every topic with queues on that broker,
    /// without a fetch. A list not newer than the last one applied from that broker (notices
    /// may overtake each other) is ignored. A fetch in flight is made again after it answers
    /// (it may predate the change), as for a plain notice.
    pub fn handle_members(&mut self, now: u64, broker: &str, version: u64, members: Vec<String>) {
        if self.shutting_down || self.source != Source::Classic {
            return;
        }
        if self
            .member_versions
            .get(broker)
            .is_some_and(|v| *v >= version)
        {
            return;
        }
        self.member_versions.insert(broker.to_owned(), version);
        self.stats.member_lists += 1;
        let retry = self.config.refresh_retry;
        let me = self.config.client_id.clone();
        let mut applied = Vec::new();
        for (topic, v) in self.topics.iter_mut() {
            if v.in_flight {
                // The fetch in flight may predate this change (even a first fetch, whose
                // queues are not known yet: the last joiner's list would be lost otherwise):
                // fetch again after it, as for a plain notice.
                v.again = true;
            }
            let on_broker = v
                .queues
                .as_ref()
                .is_some_and(|qs| qs.iter().any(|q| q.broker_name == broker));
            if !on_broker {
                continue;
            }
            v.members = Some(members.clone());
            if !v.in_flight {
                v.stale = false;
            }
            if !members.contains(&me) && v.next_at.is_none() && !v.in_flight {
                v.next_at = Some(now + ms(retry));
                self.stats.views_without_self += 1;
            }
            applied.push(topic.clone());
        }
        for topic in &applied {
            self.allocate_topic(topic);
        }
        if !applied.is_empty() {
            self.next_refresh = Some(now + ms(self.config.refresh_interval));
        }
        self.recompute_target(now);
        self.step(now);
    }

    /// Coordinated mode: the queues this member should own, as the group coordinator
    /// assigned them at member epoch `epoch`. Views are no longer fetched after the first call;
    /// an assignment older than the last one applied is ignored (until
    /// [`Rebalancer::handle_fenced`] or [`Rebalancer::handle_rejoin`] start a new lineage).
    pub fn handle_target(&mut self, now: u64, epoch: i64, queues: BTreeSet<MessageQueue>) {
        if let Source::Coordinated { epoch: Some(e) } = self.source {
            if epoch < e {
                return;
            }
        }
        self.enter_coordinated(Some(epoch));
        self.shares.insert(String::new(), queues);
        self.recompute_target(now);
        self.step(now);
    }

    /// Coordinated mode: the coordinator fenced this member (stale or unknown member epoch),
    /// or no heartbeat was answered for a session timeout. The coordinator may have given the
    /// queues away already, so every queue is dropped at once: deliveries stop, cached
    /// messages are dropped, nothing is committed ([`Action::Fence`]); the locks are released.
    /// The next [`Rebalancer::handle_target`] is accepted whatever its epoch (the member
    /// rejoins).
    pub fn handle_fenced(&mut self, now: u64) {
        self.enter_coordinated(None);
        self.recompute_target(now);
        for (mq, q) in self.queues.iter_mut() {
            match q.state {
                QState::Owned => {
                    q.state = QState::Draining {
                        after: After::Fenced,
                    };
                    self.stats.fenced += 1;
                    self.actions.push_back(Action::Fence { mq: mq.clone() });
                }
                // Already stopping: commit nothing when the drain ends.
                QState::Draining { .. } => {
                    q.state = QState::Draining {
                        after: After::Fenced,
                    };
                }
                _ => {}
            }
            q.fence_now = false;
        }
        self.step(now);
    }

    /// Coordinated mode: the member leaves its coordinator and joins another (the group's
    /// coordinator moved with the routes) or has not heard from one yet. Every queue is
    /// released gracefully (stop, commit, unlock) and the next [`Rebalancer::handle_target`]
    /// is accepted whatever its epoch.
    pub fn handle_rejoin(&mut self, now: u64) {
        self.enter_coordinated(None);
        self.recompute_target(now);
        self.step(now);
    }

    /// Coordinated mode: the group's coordinator moved and the member joined the new one,
    /// keeping its queues (their broker locks' leases decide how long they may be consumed).
    /// The target stays as it is; the next [`Rebalancer::handle_target`] is accepted whatever
    /// its epoch (the new coordinator's member epochs are a new lineage: a joining member is
    /// at epoch 0 until it has released what it must).
    pub fn handle_coordinator_moved(&mut self, now: u64) {
        if let Source::Coordinated { epoch } = &mut self.source {
            *epoch = None;
        }
        self.step(now);
    }

    /// Back to classic allocation (the group got a classic-only member, or the broker does
    /// not coordinate it): every topic's view is fetched at once and the strategy decides
    /// again. Queues held meanwhile stay held until the new share says otherwise; hand-over
    /// stays by locks, so the change is exclusive throughout.
    pub fn handle_classic(&mut self, now: u64) {
        if self.source != Source::Classic {
            self.source = Source::Classic;
            // Keep the coordinator's queues as each topic's share until its view arrives.
            let held = self.shares.remove("").unwrap_or_default();
            self.shares.clear();
            for (topic, v) in self.topics.iter_mut() {
                let share: BTreeSet<MessageQueue> =
                    held.iter().filter(|q| &q.topic == topic).cloned().collect();
                self.shares.insert(topic.clone(), share);
                // A view fetched before coordinated mode is stale: fetch again.
                v.again = v.in_flight;
                v.stale_in_a_row = 0;
                v.next_at = Some(now);
            }
            self.recompute_target(now);
        }
        self.step(now);
    }

    fn enter_coordinated(&mut self, epoch: Option<i64>) {
        self.source = Source::Coordinated { epoch };
        self.shares.clear();
        self.next_refresh = None;
        for v in self.topics.values_mut() {
            v.next_at = None;
            v.again = false;
        }
    }

    /// True while a group coordinator decides the target (coordinated mode).
    pub fn is_coordinated(&self) -> bool {
        matches!(self.source, Source::Coordinated { .. })
    }

    /// The answer to an [`Action::Lock`]: `granted` are the queues the broker says we hold
    /// now, under `lease`. `lease` is `None` when the request failed (nothing is known: held
    /// queues keep their lease, queues being acquired are tried again later).
    /// `notice_expected` says the broker will tell us when a refused lock frees.
    pub fn handle_lock_result(
        &mut self,
        now: u64,
        requested: &[MessageQueue],
        granted: &BTreeSet<MessageQueue>,
        lease: Option<Lease>,
        notice_expected: bool,
    ) {
        self.handle_lock_answer(
            now,
            requested,
            LockAnswer {
                granted: granted.clone(),
                lease,
                notice_expected,
                ..LockAnswer::default()
            },
        );
    }

    /// The answer to an [`Action::Lock`] with what a Shoal broker may add to it (committed
    /// offsets, commit on unlock); see [`LockAnswer`] and [`Rebalancer::handle_lock_result`].
    pub fn handle_lock_answer(&mut self, now: u64, requested: &[MessageQueue], answer: LockAnswer) {
        let LockAnswer {
            granted,
            lease,
            notice_expected,
            committed,
            commit_on_unlock,
        } = answer;
        let granted = &granted;
        let mut begin = Vec::new();
        for mq in requested {
            let in_target = self.target.contains(mq);
            let Some(q) = self.queues.get_mut(mq) else {
                if lease.is_some() && granted.contains(mq) {
                    // Granted after we forgot it (e.g. the target changed twice): give it back.
                    self.actions.push_back(unlock(mq));
                }
                continue;
            };
            let renewal = q.renewing;
            q.renewing = false;
            match (&q.state, lease) {
                (QState::Acquiring, None) => {
                    q.maybe_locked = true;
                    q.retry_later(now, &self.config, false);
                }
                (QState::Acquiring, Some(lease)) => {
                    q.maybe_locked = false;
                    if granted.contains(mq) {
                        q.freed_while_acquiring = false;
                    }
                    if granted.contains(mq) {
                        q.lease = Some(lease);
                        q.backoff = Duration::ZERO;
                        q.commit_on_unlock = commit_on_unlock;
                        if in_target && !self.shutting_down {
                            q.state = QState::Starting { retry_at: None };
                            match committed.get(mq) {
                                Some(&offset) => begin.push((mq.clone(), offset)),
                                None => self
                                    .actions
                                    .push_back(Action::QueryStartOffset { mq: mq.clone() }),
                            }
                        } else {
                            q.state = QState::Unlocking { retry_at: None };
                            self.actions.push_back(unlock(mq));
                        }
                    } else {
                        self.stats.lock_refused += 1;
                        q.retry_later(now, &self.config, notice_expected);
                    }
                }
                (_, None) if renewal => {
                    // No answer is no evidence: keep the lease, ask again a little later.
                    if let Some(l) = &mut q.lease {
                        l.renew_at = (now + ms(self.config.refresh_retry)).min(l.until);
                    }
                }
                (_, None) => {}
                (QState::Unlocking { .. }, Some(_)) if renewal && granted.contains(mq) => {
                    // The renewal was sent before the unlock and may have been processed after
                    // it (requests can overtake each other), taking the lock again: unlock once
                    // more when this unlock is answered.
                    q.unlock_again = true;
                }
                (_, Some(lease)) if renewal => {
                    if granted.contains(mq) {
                        q.extend(lease, mq, &mut self.actions);
                    } else {
                        // Someone else holds it: our lease is gone.
                        self.stats.lock_refused += 1;
                        q.lose_lease(now);
                    }
                }
                _ => {}
            }
        }
        for (mq, offset) in begin {
            self.stats.offsets_on_grant += 1;
            self.begin(now, &mq, offset);
        }
        self.step(now);
    }

    /// A Shoal broker acknowledged a heartbeat sent at the time the lease was computed from:
    /// every lock held on `broker` under the same session lasts at least until `lease.until`.
    /// A different session means the broker ended ours and dropped our locks there.
    pub fn handle_lease(&mut self, now: u64, broker: &str, lease: Lease) {
        for (mq, q) in self.queues.iter_mut() {
            if mq.broker_name != broker {
                continue;
            }
            let Some(cur) = q.lease else { continue };
            match (cur.session, lease.session) {
                (Some(a), Some(b)) if a == b => q.extend(lease, mq, &mut self.actions),
                (Some(_), _) => q.lose_lease(now),
                (None, _) => {}
            }
        }
        self.step(now);
    }

    /// A Shoal broker told us these locks are free (lock-freed notice): ask for them now.
    pub fn handle_lock_freed(&mut self, now: u64, queues: &[MessageQueue]) {
        for mq in queues {
            if let Some(q) = self.queues.get_mut(mq) {
                match &mut q.state {
                    QState::Pending { retry_at } => *retry_at = Some(now),
                    // The notice overtook the refusal of the request in flight.
                    QState::Acquiring => q.freed_while_acquiring = true,
                    _ => {}
                }
            }
        }
        self.step(now);
    }

    /// The answer to an [`Action::QueryStartOffset`] (`None`: the query failed).
    pub fn handle_start_offset(&mut self, now: u64, mq: &MessageQueue, start: Option<StartOffset>) {
        let in_target = self.target.contains(mq) && !self.shutting_down;
        let retry = self.config.start_retry;
        let Some(q) = self.queues.get_mut(mq) else {
            return;
        };
        if !matches!(q.state, QState::Starting { retry_at: None }) {
            return;
        }
        q.unsaved_start = match start {
            Some(StartOffset::Resolved(o)) => Some(o),
            _ => None,
        };
        if !in_target {
            // Released before it started: a position this member chose is kept for the group.
            let keep = q.unsaved_start;
            self.release(now, mq, keep);
        } else if let Some(start) = start {
            self.begin(now, mq, start.offset());
        } else {
            q.state = QState::Starting {
                retry_at: Some(now + ms(retry)),
            };
        }
        self.step(now);
    }

    /// The driver stopped a queue after [`Action::Stop`] or [`Action::Fence`]; `offset` is
    /// the offset to commit (the smallest still in flight, or one past the last delivered),
    /// `None` when nothing is known.
    pub fn handle_drained(&mut self, now: u64, mq: &MessageQueue, offset: Option<i64>) {
        let locks = self.config.handover == Handover::Locks;
        let in_target = self.target.contains(mq) && !self.shutting_down;
        let Some(q) = self.queues.get_mut(mq) else {
            return;
        };
        let QState::Draining { after } = q.state else {
            return;
        };
        match after {
            After::Release => self.release(now, mq, offset),
            After::Restart(reset) => {
                if q.lease_valid(now) || !locks {
                    q.state = QState::Committing { after };
                    self.actions.push_back(Action::Commit {
                        mq: mq.clone(),
                        offset: reset,
                        rewind: true,
                    });
                } else {
                    self.finish_fence(now, mq, in_target);
                }
            }
            After::Fenced => self.finish_fence(now, mq, in_target),
        }
        self.step(now);
    }

    /// The answer to an [`Action::Commit`].
    pub fn handle_committed(&mut self, now: u64, mq: &MessageQueue, ok: bool) {
        let _ = ok; // A failed final commit costs duplicates, not safety: hand over anyway.
        let Some(q) = self.queues.get_mut(mq) else {
            return;
        };
        let QState::Committing { after } = q.state else {
            return;
        };
        match after {
            After::Restart(_) => {
                q.state = QState::Starting { retry_at: None };
                self.actions
                    .push_back(Action::QueryStartOffset { mq: mq.clone() });
            }
            _ => self.finish_release(now, mq),
        }
        self.step(now);
    }

    /// The answer to an [`Action::Unlock`] for one queue: `ok` when the broker answered
    /// (whatever it said: a lock we do not hold is not ours to worry about); a failed unlock
    /// is sent again (up to [`MAX_UNLOCK_ATTEMPTS`] times; the broker frees the lock when the
    /// session ends anyway).
    pub fn handle_unlocked(&mut self, now: u64, mq: &MessageQueue, ok: bool) {
        let retry = self.config.refresh_retry;
        if let Some(q) = self.queues.get_mut(mq) {
            if q.state == (QState::Unlocking { retry_at: None }) {
                q.unlock_failures += u32::from(!ok);
                if ok && std::mem::take(&mut q.unlock_again) {
                    q.final_offset = None;
                    self.actions.push_back(unlock(mq));
                } else if ok || q.unlock_failures >= MAX_UNLOCK_ATTEMPTS {
                    self.queues.remove(mq);
                    self.stats.released += 1;
                } else {
                    q.state = QState::Unlocking {
                        retry_at: Some(now + ms(retry)),
                    };
                }
            }
        }
        self.step(now);
    }

    /// An administrator reset the offset of an owned queue: it is stopped without committing
    /// its position, `offset` is committed, and it starts again from there.
    pub fn handle_reset(&mut self, now: u64, mq: &MessageQueue, offset: i64) {
        if let Some(q) = self.queues.get_mut(mq) {
            if q.state == QState::Owned {
                q.state = QState::Draining {
                    after: After::Restart(offset),
                };
                self.actions.push_back(Action::Fence { mq: mq.clone() });
            }
        }
        self.step(now);
    }

    /// Graceful shutdown: every queue is released; [`Rebalancer::is_idle`] says when done.
    pub fn handle_shutdown(&mut self, now: u64) {
        self.shutting_down = true;
        self.next_refresh = None;
        for v in self.topics.values_mut() {
            v.next_at = None;
            v.again = false;
        }
        self.target.clear();
        self.step(now);
    }

    /// Timers: safety-net refresh, lock retries, lease renewals and expiries.
    pub fn handle_timeout(&mut self, now: u64) {
        if self.next_refresh.is_some_and(|t| t <= now) {
            self.next_refresh = None;
            self.handle_notice(now);
            return;
        }
        self.step(now);
    }

    // ---- outputs -------------------------------------------------------------------------

    /// The next action for the driver.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Rebalancer::handle_timeout`] should be called next.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut t = self.next_refresh;
        let mut take = |x: Option<u64>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        };
        if self.source == Source::Classic && !self.shutting_down {
            for v in self.topics.values() {
                if !v.in_flight {
                    take(v.next_at);
                }
            }
        }
        for q in self.queues.values() {
            take(q.deadline());
        }
        t
    }

    // ---- introspection -------------------------------------------------------------------

    /// True when the member may hand messages of `mq` to its listener at `now`: it owns the
    /// queue and its lease is valid.
    pub fn may_dispatch(&self, mq: &MessageQueue, now: u64) -> bool {
        self.queues
            .get(mq)
            .is_some_and(|q| q.state == QState::Owned && q.lease_valid(now))
    }

    /// The queues owned now (started, not being released), sorted.
    pub fn owned(&self) -> Vec<MessageQueue> {
        self.queues
            .iter()
            .filter(|(_, q)| q.state == QState::Owned)
            .map(|(mq, _)| mq.clone())
            .collect()
    }

    /// The phase of a queue this rebalancer knows about.
    pub fn phase(&self, mq: &MessageQueue) -> Option<QueuePhase> {
        self.queues.get(mq).map(|q| q.phase())
    }

    /// Every queue known with its phase, sorted.
    pub fn phases(&self) -> Vec<(MessageQueue, QueuePhase)> {
        self.queues
            .iter()
            .map(|(mq, q)| (mq.clone(), q.phase()))
            .collect()
    }

    /// The queues this member should own (the strategy's share, or the coordinator's
    /// assignment), sorted.
    pub fn target(&self) -> &BTreeSet<MessageQueue> {
        &self.target
    }

    /// The coordinator's member epoch of the applied assignment (coordinated mode).
    pub fn target_epoch(&self) -> Option<i64> {
        match self.source {
            Source::Coordinated { epoch } => epoch,
            Source::Classic => None,
        }
    }

    /// How many times the target changed (the round number).
    pub fn round(&self) -> u64 {
        self.stats.rounds
    }

    /// Counters.
    pub fn stats(&self) -> RebalanceStats {
        self.stats
    }

    /// True when every target queue is owned and nothing else is held.
    pub fn is_settled(&self) -> bool {
        self.queues.len() == self.target.len()
            && self.target.iter().all(|mq| {
                self.queues
                    .get(mq)
                    .is_some_and(|q| q.state == QState::Owned)
            })
    }

    /// True when nothing is held or in progress (after [`Rebalancer::handle_shutdown`]: done).
    pub fn is_idle(&self) -> bool {
        self.queues.is_empty()
    }

    /// True once [`Rebalancer::handle_shutdown`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    // ---- internals -----------------------------------------------------------------------

    fn allocate_topic(&mut self, topic: &str) {
        let Some(v) = self.topics.get(topic) else {
            return;
        };
        let (Some(queues), Some(members)) = (&v.queues, &v.members) else {
            return;
        };
        let share: BTreeSet<MessageQueue> = if self.config.handover == Handover::Unguarded {
            queues.iter().cloned().collect()
        } else if queues.is_empty() || members.is_empty() {
            BTreeSet::new()
        } else {
            let input =
                AllocationInput::new(&self.config.group, queues.iter().cloned(), members.clone());
            match self.strategy.allocate(&input, &self.config.client_id) {
                Ok(mine) => mine.into_iter().collect(),
                // Keep the previous share: a strategy that cannot decide must not drop queues.
                Err(_) => return,
            }
        };
        self.shares.insert(topic.to_owned(), share);
    }

    fn recompute_target(&mut self, now: u64) {
        if self.shutting_down {
            return;
        }
        let target: BTreeSet<MessageQueue> = self.shares.values().flatten().cloned().collect();
        if target != self.target {
            self.target = target;
            self.target_changed_at = Some(now);
            self.stats.rounds += 1;
        }
    }

    /// Releases a queue whose lock is held and that delivers nothing (drained, or never
    /// started): `offset`, when known, is committed first (on the unlock when the broker
    /// takes it there), unless the lease ran out, in which case the lock may already be
    /// someone else's and nothing is committed.
    fn release(&mut self, now: u64, mq: &MessageQueue, offset: Option<i64>) {
        let locks = self.config.handover == Handover::Locks;
        let classic = self.source == Source::Classic;
        let Some(q) = self.queues.get_mut(mq) else {
            return;
        };
        q.unsaved_start = None;
        match offset {
            // Not in coordinated mode: there the final commit must be acknowledged while
            // the heartbeat still reports the queue (see the driver's `held`).
            Some(offset) if locks && q.commit_on_unlock && classic && q.lease_valid(now) => {
                q.state = QState::Unlocking { retry_at: None };
                q.final_offset = Some(offset);
                self.actions.push_back(Action::CommitAndUnlock {
                    broker: mq.broker_name.clone(),
                    mq: mq.clone(),
                    offset,
                });
            }
            Some(offset) if !locks || q.lease_valid(now) => {
                q.state = QState::Committing {
                    after: After::Release,
                };
                self.actions.push_back(Action::Commit {
                    mq: mq.clone(),
                    offset,
                    rewind: false,
                });
            }
            _ => self.finish_release(now, mq),
        }
    }

    fn finish_release(&mut self, _now: u64, mq: &MessageQueue) {
        if self.config.handover == Handover::Locks {
            if let Some(q) = self.queues.get_mut(mq) {
                q.state = QState::Unlocking { retry_at: None };
                q.final_offset = None;
                self.actions.push_back(unlock(mq));
            }
        } else {
            self.queues.remove(mq);
            self.stats.released += 1;
        }
    }

    /// A locked queue's start offset is known: start it, or hold it for a fresh view (the
    /// topic's view went stale while the lock was being taken), or ask for the lock again
    /// (the lease ran out meanwhile).
    fn begin(&mut self, now: u64, mq: &MessageQueue, offset: i64) {
        let stale = self.view_stale(&mq.topic);
        let Some(q) = self.queues.get_mut(mq) else {
            return;
        };
        if !q.lease_valid(now) {
            q.state = QState::Pending {
                retry_at: Some(now),
            };
            q.lease = None;
            q.unsaved_start = None;
        } else if stale {
            q.state = QState::Ready { offset };
            self.stats.held_for_view += 1;
        } else {
            q.state = QState::Owned;
            q.unsaved_start = None;
            self.stats.started += 1;
            self.actions.push_back(Action::Start {
                mq: mq.clone(),
                offset,
                lease_until: q.lease.map(|l| l.until),
            });
        }
    }

    /// Classic mode with locks: a membership notice came after the topic's applied view.
    fn view_stale(&self, topic: &str) -> bool {
        self.source == Source::Classic
            && self.config.handover == Handover::Locks
            && !self.shutting_down
            && self.topics.get(topic).is_some_and(|v| v.stale)
    }

    fn finish_fence(&mut self, now: u64, mq: &MessageQueue, in_target: bool) {
        if in_target {
            if let Some(q) = self.queues.get_mut(mq) {
                q.state = QState::Pending {
                    retry_at: Some(now),
                };
                q.lease = None;
            }
        } else {
            self.finish_release(now, mq);
        }
    }

    /// Moves every queue as far as it can go now and batches the lock requests.
    fn step(&mut self, now: u64) {
        // View fetches.
        if self.source == Source::Classic && !self.shutting_down {
            for (topic, v) in self.topics.iter_mut() {
                if !v.in_flight && v.next_at.is_some_and(|t| t <= now) {
                    v.in_flight = true;
                    v.next_at = None;
                    self.actions.push_back(Action::FetchView {
                        topic: topic.clone(),
                    });
                }
            }
        }
        // New queues of the target.
        let gain_at = match self.config.handover {
            Handover::Delay(d) => self.target_changed_at.map(|t| t + ms(d)),
            _ => None,
        };
        let locks = self.config.handover == Handover::Locks;
        let stale_topics: BTreeSet<String> = self
            .topics
            .keys()
            .filter(|t| self.view_stale(t))
            .cloned()
            .collect();
        for mq in &self.target {
            if !self.queues.contains_key(mq) {
                self.queues.insert(
                    mq.clone(),
                    Queue::new(
                        QState::Pending {
                            retry_at: Some(gain_at.unwrap_or(now)),
                        },
                        locks,
                    ),
                );
            }
        }
        let mut lock_requests: BTreeMap<String, Vec<MessageQueue>> = BTreeMap::new();
        let mut remove = Vec::new();
        let mut release = Vec::new();
        for (mq, q) in self.queues.iter_mut() {
            let in_target = self.target.contains(mq);
            // Leases.
            if locks && q.lease.is_some() && !q.lease_valid(now) {
                q.lose_lease(now);
            }
            match q.state {
                QState::Pending { retry_at } => {
                    if !in_target && q.maybe_locked && locks {
                        q.maybe_locked = false;
                        q.state = QState::Unlocking { retry_at: None };
                        self.actions.push_back(unlock(mq));
                    } else if !in_target {
                        remove.push(mq.clone());
                    } else if retry_at.is_some_and(|t| t <= now) {
                        if locks {
                            q.state = QState::Acquiring;
                            lock_requests
                                .entry(mq.broker_name.clone())
                                .or_default()
                                .push(mq.clone());
                        } else {
                            q.state = QState::Starting { retry_at: None };
                            self.actions
                                .push_back(Action::QueryStartOffset { mq: mq.clone() });
                        }
                    }
                }
                QState::Starting {
                    retry_at: Some(t), ..
                } if t <= now => {
                    if in_target {
                        q.state = QState::Starting { retry_at: None };
                        self.actions
                            .push_back(Action::QueryStartOffset { mq: mq.clone() });
                    } else if locks {
                        q.state = QState::Unlocking { retry_at: None };
                        self.actions.push_back(unlock(mq));
                    } else {
                        remove.push(mq.clone());
                    }
                }
                QState::Unlocking {
                    retry_at: Some(t), ..
                } if t <= now => {
                    q.state = QState::Unlocking { retry_at: None };
                    self.actions.push_back(match q.final_offset {
                        Some(offset) => Action::CommitAndUnlock {
                            broker: mq.broker_name.clone(),
                            mq: mq.clone(),
                            offset,
                        },
                        None => unlock(mq),
                    });
                }
                QState::Ready { offset } => {
                    if !in_target {
                        release.push((mq.clone(), q.unsaved_start));
                    } else if !stale_topics.contains(&mq.topic) {
                        if q.lease_valid(now) {
                            q.state = QState::Owned;
                            q.unsaved_start = None;
                            self.stats.started += 1;
                            self.actions.push_back(Action::Start {
                                mq: mq.clone(),
                                offset,
                                lease_until: q.lease.map(|l| l.until),
                            });
                        } else {
                            q.state = QState::Pending {
                                retry_at: Some(now),
                            };
                            q.lease = None;
                            q.unsaved_start = None;
                        }
                    }
                }
                QState::Owned if q.fence_now => {
                    q.fence_now = false;
                    q.state = QState::Draining {
                        after: After::Fenced,
                    };
                    self.stats.fenced += 1;
                    self.actions.push_back(Action::Fence { mq: mq.clone() });
                }
                QState::Owned if !in_target => {
                    q.state = QState::Draining {
                        after: After::Release,
                    };
                    self.actions.push_back(Action::Stop { mq: mq.clone() });
                }
                _ => {}
            }
            q.fence_now = false;
            // Renewals of held locks.
            if locks && !q.renewing && q.state.holds_lock() {
                if let Some(l) = q.lease {
                    if l.renew_at <= now && l.until > now {
                        q.renewing = true;
                        lock_requests
                            .entry(mq.broker_name.clone())
                            .or_default()
                            .push(mq.clone());
                    }
                }
            }
        }
        for mq in remove {
            self.queues.remove(&mq);
        }
        for (mq, offset) in release {
            self.release(now, &mq, offset);
        }
        for (broker, mut queues) in lock_requests {
            queues.sort();
            queues.dedup();
            self.actions.push_back(Action::Lock { broker, queues });
        }
    }
}

fn unlock(mq: &MessageQueue) -> Action {
    Action::Unlock {
        broker: mq.broker_name.clone(),
        queues: vec![mq.clone()],
    }
}
