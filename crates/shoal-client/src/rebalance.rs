//! The rebalance driver: one tokio task per consumer that owns a
//! [`shoal_group::rebalance::Rebalancer`] and does its I/O. The push consumer and the lite
//! pull consumer both use it (through [`QueueRuntime`], which starts, stops and commits their
//! queues), so they hand over, fence and start queues the same way.
//!
//! The task is the rebalancer's only owner: it feeds it events (results of the actions it
//! spawned, broker notices, lease evidence from heartbeats) with the monotonic time in ms, executes
//! the actions it polls, and sleeps until [`Rebalancer::poll_timeout`]. Nothing is locked
//! across an await; the rest of the consumer reads a snapshot ([`DriverHandle::owned`]).
//!
//! Leases: against a Shoal broker (GET_BROKER_FEATURES lists session locks) the consumer's
//! locks last its session: they are granted with the session id, and every heartbeat (sent
//! every `session_heartbeat`, 3 s) extends them until `sent + session_timeout`. Against an
//! Apache RocketMQ broker a lock lasts `rocketmq_lock_lease` (30 s, the client-side expiry
//! RocketMQ's orderly consumer uses against the broker's 60 s) from when it was asked for and
//! is renewed after `rocketmq_lock_renew` (20 s); refused locks are asked for again with a
//! short back-off, as no notice comes.
//!
//! Round trips a Shoal broker saves (each used only where GET_BROKER_FEATURES lists it):
//! `offsetOnGrant` (the lock answer carries the committed offsets: no start-offset query),
//! `commitOnUnlock` (the final commit rides on the unlock), `memberListNotice` (membership
//! notices carry the member list: no GET_CONSUMER_LIST_BY_GROUP).

use crate::coordinated::{Directive, Membership};
use crate::error::Result;
use crate::instance::ClientInstance;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use shoal_group::member::Applied;
use shoal_group::rebalance::{
    Action, Handover, Lease, LockAnswer, QueuePhase, RebalanceStats, Rebalancer, RebalancerConfig,
    StartOffset,
};
use shoal_group::AllocateStrategy;
use shoal_proto::body::ConsumeFromWhere;
use shoal_proto::constants::is_retry_topic;
use shoal_proto::MessageQueue;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// What a consumer does with its queues when the rebalancer says so.
pub(crate) trait QueueRuntime: Send + Sync + 'static {
    /// Start pulling and delivering `mq` from `offset`; deliveries only before `lease_until`.
    fn start(&self, mq: MessageQueue, offset: i64, lease_until: Option<Instant>);
    /// The lease of a started queue moved.
    fn set_lease(&self, mq: &MessageQueue, until: Instant);
    /// Stop the queue (`fence`: at once, dropping what is cached); resolves once in-flight
    /// deliveries ended, to the offset to commit (`None` when fenced or nothing to commit).
    fn stop(&self, mq: MessageQueue, fence: bool) -> BoxFuture<'static, Option<i64>>;
    /// Commit synchronously (broker, or the local file when broadcasting); true when stored.
    fn commit(&self, mq: MessageQueue, offset: i64, rewind: bool) -> BoxFuture<'static, bool>;
    /// Broadcasting: the offset stored locally for a queue.
    fn local_offset(&self, mq: &MessageQueue) -> Option<i64>;
}

/// Settings of a driver.
#[derive(Debug, Clone)]
pub(crate) struct DriverConfig {
    pub group: String,
    /// Clustering (locks, broker offsets) or broadcasting (every queue, local offsets).
    pub clustering: bool,
    pub orderly: bool,
    pub from_where: ConsumeFromWhere,
    pub from_timestamp_ms: i64,
    /// Safety-net rebalance period.
    pub refresh_interval: Duration,
    /// Shoal session timeout (lease of session locks).
    pub session_timeout: Duration,
    /// Heartbeats to Shoal brokers (lease renewal).
    pub session_heartbeat: Duration,
    /// Lease of a lock on an Apache RocketMQ broker, from its request.
    pub rocketmq_lock_lease: Duration,
    /// When a lock on an Apache RocketMQ broker is renewed, after its request.
    pub rocketmq_lock_renew: Duration,
    /// Coordinated mode (clustering consumers whose protocol is not classic): the group
    /// membership whose assignment is the rebalancer's target.
    pub membership: Option<Arc<Membership>>,
}

enum Cmd {
    Subscribe(String),
    LockFreed(Vec<MessageQueue>),
    Reset(Vec<(MessageQueue, i64)>),
    Shutdown,
    View(String, Result<(Vec<MessageQueue>, Vec<String>)>),
    /// Coordinated mode: the membership's directive after a heartbeat.
    Member(Directive),
    /// A membership notice with the member list: broker address, version, members.
    Members(String, u64, Vec<String>),
    Locked {
        queues: Vec<MessageQueue>,
        answer: LockAnswer,
    },
    Lease(String, Lease),
    StartOffset(MessageQueue, Option<StartOffset>),
    Drained(MessageQueue, Option<i64>),
    Committed(MessageQueue, bool),
    Unlocked(Vec<MessageQueue>, bool),
}

/// What the rest of the consumer sees of the rebalancer.
#[derive(Debug, Default, Clone)]
pub(crate) struct Snapshot {
    pub owned: Vec<MessageQueue>,
    /// Queues whose lock is held: starting, started, draining or committing (what a
    /// coordinated heartbeat reports as owned).
    pub held: Vec<MessageQueue>,
    /// The member epoch of the coordinator's target the rebalancer had applied with `held`.
    pub held_epoch: Option<i64>,
    /// Queues stopped and waiting for in-flight listener calls.
    pub draining: usize,
    /// Subscribed topics.
    pub topics: Vec<String>,
    pub stats: RebalanceStats,
}

/// The consumer's side of its driver. Cheap to clone.
#[derive(Clone)]
pub(crate) struct DriverHandle {
    tx: mpsc::UnboundedSender<Cmd>,
    notice: Arc<Notify>,
    snapshot: Arc<Mutex<Snapshot>>,
    done: watch::Receiver<bool>,
    instance: ClientInstance,
    membership: Option<Arc<Membership>>,
}

impl DriverHandle {
    /// Something changed (membership notice, route change): rebalance now.
    pub(crate) fn notice(&self) {
        self.notice.notify_one();
    }
    /// NOTIFY_CONSUMER_IDS_CHANGED without a member list: the group's subscriptions or a
    /// subscribed topic's queues changed (or the broker sends no lists). The subscribed topics'
    /// routes are fetched again first and the rebalance runs after, so that it allocates over
    /// the queue list the broker's notice is about: members allocating AVG over different
    /// lists could leave a queue without an owner until the next route poll.
    pub(crate) fn refresh_routes_then_notice(&self) {
        let this = self.clone();
        tokio::spawn(async move {
            let topics: Vec<String> = this
                .snapshot
                .lock()
                .topics
                .iter()
                .filter(|t| !is_retry_topic(t))
                .cloned()
                .collect();
            let refreshes = topics.iter().map(|t| this.instance.update_route(t));
            for (t, r) in topics
                .iter()
                .zip(futures::future::join_all(refreshes).await)
            {
                if let Err(e) = r {
                    debug!(topic = %t, error = %e, "route refresh after a notice failed");
                }
            }
            this.notice();
        });
    }
    pub(crate) fn lock_freed(&self, queues: Vec<MessageQueue>) {
        let _ = self.tx.send(Cmd::LockFreed(queues));
    }
    /// A membership notice that carried the member list (see
    /// [`crate::instance::ConsumerHandle::members_changed`]).
    pub(crate) fn members(&self, broker_addr: &str, notice: shoal_proto::ext::ConsumerIdsNotice) {
        let _ = self.tx.send(Cmd::Members(
            broker_addr.to_owned(),
            notice.version,
            notice.consumer_id_list,
        ));
    }
    pub(crate) fn subscribe(&self, topic: &str) {
        {
            let mut s = self.snapshot.lock();
            if !s.topics.iter().any(|t| t == topic) {
                s.topics.push(topic.to_owned());
            }
        }
        let _ = self.tx.send(Cmd::Subscribe(topic.to_owned()));
    }
    /// The coordinated membership, if any.
    pub(crate) fn membership(&self) -> Option<&Arc<Membership>> {
        self.membership.as_ref()
    }
    /// Coordinated mode: heartbeat the coordinator now (a notice came).
    pub(crate) fn member_wake(&self) {
        if let Some(m) = &self.membership {
            m.wake();
        }
    }
    /// Coordinated mode: one heartbeat to the group's coordinator (reporting the held
    /// queues); its outcome goes to the rebalancer. Returns false without a membership.
    pub(crate) async fn member_heartbeat(&self, topics: &[String]) -> bool {
        let Some(m) = &self.membership else {
            return false;
        };
        let topics: Vec<String> = if topics.is_empty() {
            self.snapshot.lock().topics.clone()
        } else {
            topics.to_vec()
        };
        let Some(addr) = coordinator_addr(&self.instance, m, &topics).await else {
            let _ = self.tx.send(Cmd::Member(m.directive()));
            return true;
        };
        let (held, held_epoch) = {
            let s = self.snapshot.lock();
            (s.held.clone(), s.held_epoch)
        };
        let out = m
            .heartbeat(&self.instance, &addr, topics, held, held_epoch)
            .await;
        let _ = self.tx.send(Cmd::Member(m.directive()));
        if out.again {
            m.wake();
        }
        true
    }
    /// Coordinated mode: heartbeats on notices, releases and every interval, until `token`.
    pub(crate) fn spawn_membership(&self, token: CancellationToken) {
        let Some(m) = self.membership.clone() else {
            return;
        };
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = m.wait() => {}
                }
                if *this.done.borrow() {
                    // Shut down: the consumer leaves the group now.
                    return;
                }
                this.member_heartbeat(&[]).await;
            }
        });
    }
    pub(crate) fn reset(&self, offsets: Vec<(MessageQueue, i64)>) {
        let _ = self.tx.send(Cmd::Reset(offsets));
    }
    /// The queues owned now, sorted.
    pub(crate) fn owned(&self) -> Vec<MessageQueue> {
        self.snapshot.lock().owned.clone()
    }
    pub(crate) fn stats(&self) -> RebalanceStats {
        self.snapshot.lock().stats
    }
    /// Releases every queue gracefully and waits until done. A queue still draining (a
    /// listener call on it runs) is always waited for, as its lock must not be released under
    /// it; the rest of the release (commits, unlocks) gets `limit` after the last drain.
    pub(crate) async fn shutdown(&self, limit: Duration) {
        let _ = self.tx.send(Cmd::Shutdown);
        let mut done = self.done.clone();
        loop {
            if tokio::time::timeout(limit, done.wait_for(|d| *d))
                .await
                .is_ok()
            {
                break;
            }
            let draining = self.snapshot.lock().draining;
            if draining == 0 {
                warn!("rebalance shutdown did not finish in time; the broker frees the rest when the session ends");
                break;
            }
            warn!(
                draining,
                "shutdown waits for listener calls still running on stopped queues"
            );
        }
        if let Some(m) = &self.membership {
            let topics = self.snapshot.lock().topics.clone();
            if let Some(addr) = coordinator_addr(&self.instance, m, &topics).await {
                m.leave(&self.instance, &addr).await;
            }
        }
    }
}

impl std::fmt::Debug for DriverHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverHandle").finish_non_exhaustive()
    }
}

struct Driver {
    cfg: DriverConfig,
    rb: Rebalancer,
    instance: ClientInstance,
    runtime: Arc<dyn QueueRuntime>,
    tx: mpsc::UnboundedSender<Cmd>,
    snapshot: Arc<Mutex<Snapshot>>,
    /// Fences and rejoins of the membership already applied.
    member_applied: Applied,
}

/// The group's coordinator (a deterministic choice among the brokers of the topics); the
/// routes are fetched when none is known yet.
async fn coordinator_addr(
    instance: &ClientInstance,
    m: &Membership,
    topics: &[String],
) -> Option<String> {
    if let Some(a) = m.coordinator_addr(instance, topics) {
        return Some(a);
    }
    for t in topics.iter().filter(|t| !is_retry_topic(t)) {
        if let Err(e) = instance.update_route(t).await {
            debug!(topic = %t, error = %e, "no route for the coordinator choice");
        }
    }
    m.coordinator_addr(instance, topics)
}

/// Starts the driver task of a consumer; it ends after a shutdown, or when `token` is cancelled
/// (without releasing anything: the instance is going away).
pub(crate) fn spawn(
    cfg: DriverConfig,
    strategy: Arc<dyn AllocateStrategy>,
    instance: ClientInstance,
    runtime: Arc<dyn QueueRuntime>,
    token: CancellationToken,
) -> DriverHandle {
    let (tx, rx) = mpsc::unbounded_channel();
    let notice = Arc::new(Notify::new());
    let snapshot = Arc::new(Mutex::new(Snapshot::default()));
    let (done_tx, done) = watch::channel(false);
    let mut rc = RebalancerConfig::new(cfg.group.clone(), instance.client_id());
    rc.refresh_interval = cfg.refresh_interval;
    rc.handover = if cfg.clustering {
        Handover::Locks
    } else {
        Handover::Unguarded
    };
    if cfg.clustering {
        instance.set_session_timeout(Some(cfg.session_timeout));
    }
    let membership = cfg.membership.clone();
    let driver = Driver {
        rb: Rebalancer::new(rc, strategy),
        cfg,
        instance: instance.clone(),
        runtime,
        tx: tx.clone(),
        snapshot: snapshot.clone(),
        member_applied: Applied::default(),
    };
    tokio::spawn(driver.run(rx, notice.clone(), token, done_tx));
    DriverHandle {
        tx,
        notice,
        snapshot,
        done,
        instance,
        membership,
    }
}

impl Driver {
    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Cmd>,
        notice: Arc<Notify>,
        token: CancellationToken,
        done: watch::Sender<bool>,
    ) {
        let mut heartbeat = tokio::time::interval(self.cfg.session_heartbeat);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let phases = self.rb.phases();
            let draining = phases
                .iter()
                .filter(|(_, p)| *p == QueuePhase::Draining)
                .count();
            let held: Vec<MessageQueue> = phases
                .into_iter()
                // Every queue the rebalancer may still start or is still releasing: a queue
                // left out counts as released for the coordinator, which may then give it
                // away while it is being acquired here (the seeded simulator found the fence
                // that follows). Not `Unlocking`: the final commit is acknowledged and the
                // unlock (the coordinator's release evidence) is on its way.
                .filter(|(_, p)| !matches!(p, QueuePhase::Unlocking))
                .map(|(mq, _)| mq)
                .collect();
            {
                let mut s = self.snapshot.lock();
                s.draining = draining;
                s.owned = self.rb.owned();
                s.stats = self.rb.stats();
                s.held.clone_from(&held);
                s.held_epoch = self.rb.target_epoch();
            }
            if let Some(m) = &self.cfg.membership {
                // A release is reported at once: the coordinator gives the queue to its next
                // owner only then.
                m.report_held(held, self.rb.target_epoch());
            }
            // The snapshot first: a coordinated heartbeat must never name a queue whose
            // unlock (release evidence) is already on its way.
            while let Some(a) = self.rb.poll_action() {
                self.execute(a);
            }
            if self.rb.is_shutting_down() && self.rb.is_idle() {
                break;
            }
            let deadline = self
                .rb
                .poll_timeout()
                .map(|ms| tokio::time::Instant::from_std(crate::instant_of(ms)));
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = token.cancelled() => break,
                cmd = rx.recv() => match cmd {
                    Some(cmd) => self.apply(cmd),
                    None => break,
                },
                _ = notice.notified() => self.rb.handle_notice(now_ms()),
                _ = sleep => self.rb.handle_timeout(now_ms()),
                _ = heartbeat.tick(), if self.cfg.clustering => self.heartbeat(),
            }
        }
        let _ = done.send(true);
        debug!(group = %self.cfg.group, "rebalance driver stopped");
    }

    fn apply(&mut self, cmd: Cmd) {
        let now = now_ms();
        let rb = &mut self.rb;
        match cmd {
            Cmd::Subscribe(t) => rb.handle_subscribe(now, &t),
            Cmd::LockFreed(q) => {
                debug!(queues = q.len(), "lock-freed notice");
                rb.handle_lock_freed(now, &q)
            }
            Cmd::Reset(list) => {
                for (mq, o) in list {
                    rb.handle_reset(now, &mq, o);
                }
            }
            Cmd::Shutdown => rb.handle_shutdown(now),
            Cmd::View(topic, Ok((queues, members))) => {
                debug!(
                    topic,
                    queues = queues.len(),
                    members = members.len(),
                    "view fetched"
                );
                rb.handle_view(now, &topic, queues, members)
            }
            Cmd::Member(d) => d.apply(rb, now, &mut self.member_applied),
            Cmd::View(topic, Err(e)) => {
                // A retry topic appears once the broker created it: keep trying quietly.
                if !is_retry_topic(&topic) {
                    debug!(topic, error = %e, "rebalance view not fetched");
                }
                rb.handle_view_failed(now, &topic)
            }
            Cmd::Members(addr, version, members) => {
                // The notice's broker by address; unknown (a name we cannot map): ask instead.
                match self
                    .instance
                    .masters()
                    .into_iter()
                    .find(|(_, a)| *a == addr)
                {
                    Some((broker, _)) => {
                        debug!(
                            broker,
                            version,
                            members = members.len(),
                            "member list from a notice"
                        );
                        rb.handle_members(now, &broker, version, members)
                    }
                    None => rb.handle_notice(now),
                }
            }
            Cmd::Locked { queues, answer } => {
                debug!(
                    asked = queues.len(),
                    granted = answer.granted.len(),
                    answered = answer.lease.is_some(),
                    notice = answer.notice_expected,
                    offsets = answer.committed.len(),
                    "lock result"
                );
                rb.handle_lock_answer(now, &queues, answer)
            }
            Cmd::Lease(broker, lease) => rb.handle_lease(now, &broker, lease),
            Cmd::StartOffset(mq, o) => rb.handle_start_offset(now, &mq, o),
            Cmd::Drained(mq, o) => rb.handle_drained(now, &mq, o),
            Cmd::Committed(mq, ok) => rb.handle_committed(now, &mq, ok),
            Cmd::Unlocked(queues, ok) => {
                for q in &queues {
                    rb.handle_unlocked(now, q, ok);
                }
            }
        }
    }

    /// Spawns the I/O of one action; its result comes back as a [`Cmd`].
    fn execute(&mut self, action: Action) {
        let tx = self.tx.clone();
        let instance = self.instance.clone();
        let cfg = self.cfg.clone();
        match action {
            Action::FetchView { topic } => {
                tokio::spawn(async move {
                    let r = fetch_view(&instance, &cfg, &topic).await;
                    let _ = tx.send(Cmd::View(topic, r));
                });
            }
            Action::Lock { broker, queues } => {
                tokio::spawn(async move {
                    let cmd = lock(&instance, &cfg, &broker, queues).await;
                    let _ = tx.send(cmd);
                });
            }
            Action::QueryStartOffset { mq } => {
                let local = self.runtime.local_offset(&mq);
                tokio::spawn(async move {
                    let r = start_offset(&instance, &cfg, &mq, local).await;
                    let o = match r {
                        Ok(o) => Some(o),
                        Err(e) => {
                            warn!(queue = %mq, error = %e, "no start offset; retrying");
                            None
                        }
                    };
                    let _ = tx.send(Cmd::StartOffset(mq, o));
                });
            }
            Action::Start {
                mq,
                offset,
                lease_until,
            } => {
                debug!(queue = %mq, offset, "queue started");
                self.runtime
                    .start(mq, offset, lease_until.map(crate::instant_of));
            }
            Action::Lease { mq, until } => self.runtime.set_lease(&mq, crate::instant_of(until)),
            Action::Stop { mq } => {
                let stop = self.runtime.stop(mq.clone(), false);
                tokio::spawn(async move {
                    let o = stop.await;
                    let _ = tx.send(Cmd::Drained(mq, o));
                });
            }
            Action::Fence { mq } => {
                info!(queue = %mq, "lease ran out or lock lost: queue fenced (no delivery until it is locked again)");
                let stop = self.runtime.stop(mq.clone(), true);
                tokio::spawn(async move {
                    stop.await;
                    let _ = tx.send(Cmd::Drained(mq, None));
                });
            }
            Action::Commit { mq, offset, rewind } => {
                let commit = self.runtime.commit(mq.clone(), offset, rewind);
                tokio::spawn(async move {
                    let ok = commit.await;
                    debug!(queue = %mq, offset, ok, "final offset committed");
                    let _ = tx.send(Cmd::Committed(mq, ok));
                });
            }
            Action::CommitAndUnlock { broker, mq, offset } => {
                tokio::spawn(async move {
                    let r = instance.unlock_with_commit(&cfg.group, &mq, offset).await;
                    match &r {
                        Ok(()) => {
                            debug!(queue = %mq, offset, "final offset committed with the unlock")
                        }
                        Err(e) => {
                            debug!(broker, error = %e, "unlock with commit failed; asking again")
                        }
                    }
                    let _ = tx.send(Cmd::Unlocked(vec![mq], r.is_ok()));
                });
            }
            Action::Unlock { broker, queues } => {
                tokio::spawn(async move {
                    let topic = queues.first().map(|q| q.topic.clone()).unwrap_or_default();
                    let r = instance
                        .unlock_batch(&cfg.group, &broker, &topic, queues.clone())
                        .await;
                    if let Err(e) = &r {
                        debug!(broker, error = %e, "unlock failed; asking again");
                    }
                    let _ = tx.send(Cmd::Unlocked(queues, r.is_ok()));
                });
            }
        }
    }

    /// Lease evidence: a heartbeat to every Shoal broker.
    fn heartbeat(&self) {
        for (name, addr) in self.instance.masters() {
            let (tx, instance, cfg) = (self.tx.clone(), self.instance.clone(), self.cfg.clone());
            tokio::spawn(async move {
                if !matches!(instance.broker_kind(&addr).await, Ok(k) if k.has_session_locks()) {
                    return;
                }
                let sent = now_ms();
                match instance.heartbeat_to(&addr).await {
                    Ok(sessions) => {
                        let session = sessions.get(&cfg.group).copied();
                        let lease = session_lease(&cfg, sent, session);
                        let _ = tx.send(Cmd::Lease(name, lease));
                    }
                    Err(e) => debug!(broker = %addr, error = %e, "heartbeat failed"),
                }
            });
        }
    }
}

fn session_lease(cfg: &DriverConfig, sent: u64, session: Option<u64>) -> Lease {
    let session_ms = cfg.session_timeout.as_millis() as u64;
    Lease {
        until: sent + session_ms,
        renew_at: sent + session_ms * 2 / 3,
        session,
    }
}

/// The rebalancer's clock: milliseconds on the process's monotonic clock.
fn now_ms() -> u64 {
    crate::mono_ms(Instant::now())
}

async fn fetch_view(
    instance: &ClientInstance,
    cfg: &DriverConfig,
    topic: &str,
) -> Result<(Vec<MessageQueue>, Vec<String>)> {
    let route = match instance.cached_route(topic) {
        Some(r) => r,
        None => instance.update_route(topic).await?,
    };
    let queues = route.subscribe_queues(topic);
    let members = if cfg.clustering {
        instance.consumer_ids(&cfg.group, topic).await?
    } else {
        Vec::new()
    };
    Ok((queues, members))
}

async fn lock(
    instance: &ClientInstance,
    cfg: &DriverConfig,
    broker: &str,
    queues: Vec<MessageQueue>,
) -> Cmd {
    let topic = queues.first().map(|q| q.topic.clone()).unwrap_or_default();
    let failed = |queues| Cmd::Locked {
        queues,
        answer: LockAnswer::default(),
    };
    let Ok(addr) = instance.find_master_addr(broker, &topic).await else {
        return failed(queues);
    };
    let kind = match instance.broker_kind(&addr).await {
        Ok(k) => k,
        Err(e) => {
            debug!(broker, error = %e, "broker features unknown; lock not asked");
            return failed(queues);
        }
    };
    let sent = now_ms();
    if kind.has_session_locks() {
        let want_offsets = kind.has(shoal_proto::ext::feature::OFFSET_ON_GRANT);
        match instance
            .lock_batch_session(
                &cfg.group,
                broker,
                &topic,
                queues.clone(),
                cfg.orderly,
                want_offsets,
            )
            .await
        {
            Ok(g) => {
                let committed = g
                    .committed
                    .iter()
                    .filter_map(|(t, id, o)| {
                        queues
                            .iter()
                            .find(|q| q.topic == *t && q.queue_id == *id)
                            .map(|q| (q.clone(), *o))
                    })
                    .collect();
                let answer = LockAnswer {
                    granted: g.locked.into_iter().collect(),
                    lease: Some(session_lease(cfg, sent, g.session)),
                    // Without a session (our heartbeat was not seen yet) no notice will come.
                    notice_expected: g.session.is_some(),
                    committed,
                    commit_on_unlock: g.session.is_some()
                        && kind.has(shoal_proto::ext::feature::COMMIT_ON_UNLOCK),
                };
                Cmd::Locked { queues, answer }
            }
            Err(e) => {
                debug!(broker, error = %e, "lock failed");
                failed(queues)
            }
        }
    } else {
        match instance
            .lock_batch(&cfg.group, broker, &topic, queues.clone())
            .await
        {
            Ok(locked) => Cmd::Locked {
                queues,
                answer: LockAnswer {
                    granted: locked.into_iter().collect(),
                    lease: Some(Lease {
                        until: sent + cfg.rocketmq_lock_lease.as_millis() as u64,
                        renew_at: sent + cfg.rocketmq_lock_renew.as_millis() as u64,
                        session: None,
                    }),
                    ..LockAnswer::default()
                },
            },
            Err(e) => {
                debug!(broker, error = %e, "lock failed");
                failed(queues)
            }
        }
    }
}

/// Where a newly owned queue starts (spec 7.4): the group's committed offset (broker, or the
/// local file when broadcasting), else consume-from-where — the first stored message, the last,
/// or the first at the configured time (`%RETRY%` topics: from the start, or the end for
/// a timestamp).
pub(crate) async fn start_offset(
    instance: &ClientInstance,
    cfg: &DriverConfig,
    mq: &MessageQueue,
    local: Option<i64>,
) -> Result<StartOffset> {
    if cfg.clustering {
        if let Some(o) = instance.query_consumer_offset(&cfg.group, mq).await? {
            return Ok(StartOffset::Committed(o));
        }
    } else if let Some(o) = local {
        return Ok(StartOffset::Committed(o));
    }
    resolve_from_where(instance, cfg, mq)
        .await
        .map(StartOffset::Resolved)
}

/// Where consume-from-where puts a queue the group has no offset for.
async fn resolve_from_where(
    instance: &ClientInstance,
    cfg: &DriverConfig,
    mq: &MessageQueue,
) -> Result<i64> {
    let retry = is_retry_topic(&mq.topic);
    match cfg.from_where {
        ConsumeFromWhere::ConsumeFromFirstOffset => instance.min_offset(mq).await,
        ConsumeFromWhere::ConsumeFromTimestamp => {
            if retry {
                instance.max_offset(mq).await
            } else {
                instance.search_offset(mq, cfg.from_timestamp_ms).await
            }
        }
        _ => {
            if retry {
                instance.min_offset(mq).await
            } else {
                instance.max_offset(mq).await
            }
        }
    }
}
