//! [`PushConsumer`]: RocketMQ's `DefaultMQPushConsumer` with classic (client-side) rebalance
//! done by Shoal's rebalance engine (`docs/rebalance.md`).
//!
//! Tasks of one consumer (all stop at [`PushConsumer::shutdown`]):
//! - the **rebalance driver** ([`crate::rebalance`]): one task owning the sans-IO
//!   [`shoal_group::rebalance::Rebalancer`]; it runs at start, at once on
//!   NOTIFY_CONSUMER_IDS_CHANGED, lock-freed notices and route changes, and every
//!   `rebalance_interval` (20 s) as a safety net. In clustering mode a queue is taken only
//!   once its broker lock is held and started from the committed offset read after that; a
//!   lost queue is stopped, its in-flight consumes finish (within `drop_wait`), its offset is
//!   committed and acknowledged, and only then is the lock released;
//! - one **pull loop** per owned queue ([`pull`]), with flow control on the cached count, size
//!   and (concurrent) offset span;
//! - **consume tasks** ([`concurrent`], [`orderly`]): a listener gets messages of a queue only
//!   while the queue's lease is valid by this process's clock (fencing: a member back from a
//!   pause past its lease delivers nothing until it holds the lock again);
//! - the **offset persister** (every 5 s; broker or local file).
//!
//! Listeners are plain closures run on tokio's blocking pool, as Java runs them on a thread
//! pool.

mod concurrent;
mod config;
mod orderly;
mod pull;
mod send_back;

pub(crate) use config::{ConcurrentlyFn, OrderlyFn};
pub use config::{
    ConsumeConcurrentlyStatus, ConsumeContext, ConsumeOrderlyStatus, ConsumerConfig,
    MessageListener, PushConsumerBuilder, CLASSIC_DEFAULT_STRATEGY,
};

use crate::coordinated::{new_member_id, GroupProtocol, MemberMode, Membership};
use crate::error::{ClientError, Result};
use crate::instance::{ClientInstance, ConsumerHandle};
use crate::offset_store::{LocalOffsetFile, OffsetTable};
use crate::process_queue::ProcessQueue;
use crate::producer::Producer;
use crate::rebalance::{DriverConfig, DriverHandle, QueueRuntime};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use shoal_group::{strategy_by_name, AllocateStrategy};
use shoal_proto::body::{
    ConsumeMessageDirectlyResult, ConsumeResult, ConsumeStatus, ConsumeType, ConsumerData,
    ConsumerRunningInfo, MessageModel, ProcessQueueInfo, SubscriptionData,
};
use shoal_proto::constants::retry_topic;
use shoal_proto::message::MessageExt;
use shoal_proto::MessageQueue;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify, OnceCell, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Client-side expiry of a lock on an Apache RocketMQ broker without renewal (RocketMQ's
/// orderly consumer uses 30 s against the broker's 60 s).
pub const LOCK_EXPIRE_MS: u64 = 30_000;

/// What a queue's process queue keeps of a pulled message: orderly consumption takes its
/// messages from there (`Some`); concurrent consumption hands each batch to the listener when
/// it is pulled and keeps only offset and size (`None`), so no message is copied.
/// What a process queue holds per message: the message itself in orderly mode (boxed, so the
/// queue's tree moves small entries), nothing in concurrent mode.
type Held = Option<Box<MessageExt>>;

/// Local state of one owned queue.
struct QueueState {
    mq: MessageQueue,
    pq: Mutex<ProcessQueue<Held>>,
    /// Deliveries allowed strictly before this time (`None`: no limit, broadcasting).
    lease_until: Mutex<Option<Instant>>,
    /// Stops the pull loop and the orderly consume loop.
    cancel: CancellationToken,
    /// Consumes running for this queue (graceful hand-over waits for 0).
    in_flight: watch::Sender<usize>,
    /// Orderly: new messages or a renewed lock.
    wake: Notify,
    /// Orderly: local retry count per offset.
    suspends: Mutex<HashMap<i64, i32>>,
    /// Concurrent: the highest offset handed to the listener (changed under `pq`'s lock).
    max_delivered: AtomicI64,
    /// Stopped by a fence (set under `pq`'s lock with `dropped`): nothing more is delivered.
    fenced: AtomicBool,
}

impl QueueState {
    fn new(mq: MessageQueue, parent: &CancellationToken, lease: Option<Instant>) -> Self {
        Self {
            mq,
            pq: Mutex::new(ProcessQueue::new()),
            lease_until: Mutex::new(lease),
            cancel: parent.child_token(),
            in_flight: watch::channel(0).0,
            wake: Notify::new(),
            suspends: Mutex::new(HashMap::new()),
            max_delivered: AtomicI64::new(-1),
            fenced: AtomicBool::new(false),
        }
    }
    /// Concurrent: may a batch of offsets `first..=last` be handed to the listener now? While
    /// the queue is owned, yes (with a valid lease). Once it is stopped gracefully, only a
    /// batch below an offset already delivered (a gap left by batches consumed out of
    /// order): the committed offset (the smallest offset not consumed) then passes every
    /// delivered message, so the next owner delivers none of them again. The lock is still
    /// held meanwhile: the stop waits for these calls.
    fn admit_concurrent(&self, first: i64, last: i64) -> bool {
        if !self.lease_valid() {
            return false;
        }
        let pq = self.pq.lock();
        if !pq.dropped {
            self.max_delivered.fetch_max(last, Ordering::Relaxed);
            return true;
        }
        !self.fenced.load(Ordering::Relaxed) && first < self.max_delivered.load(Ordering::Relaxed)
    }
    fn is_dropped(&self) -> bool {
        self.pq.lock().dropped
    }
    fn lease_valid(&self) -> bool {
        self.lease_until.lock().is_none_or(|u| Instant::now() < u)
    }
    /// Time left on the lease (`None`: no limit).
    fn lease_left(&self) -> Option<Duration> {
        self.lease_until
            .lock()
            .map(|u| u.saturating_duration_since(Instant::now()))
    }
    /// May a message of this queue be handed to the listener now?
    fn may_deliver(&self) -> bool {
        !self.is_dropped() && self.lease_valid()
    }
    fn begin(&self) {
        self.in_flight.send_modify(|n| *n += 1);
    }
    fn end(&self) {
        self.in_flight.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Counters of one consumer (for tests, the CLI and running info).
#[derive(Debug, Default)]
pub struct ConsumerStats {
    /// Messages handed to the listener that it consumed.
    pub consumed_ok: AtomicU64,
    /// Messages the listener asked to reconsume.
    pub consumed_failed: AtomicU64,
    /// Messages sent back for retry (CONSUMER_SEND_MSG_BACK or the retry topic).
    pub sent_back: AtomicU64,
    /// Rebalance rounds (times the consumer's target changed).
    pub rebalances: AtomicU64,
    /// Queue hand-overs (queues released).
    pub queues_released: AtomicU64,
    /// Queues fenced (lease ran out or lock lost).
    pub queues_fenced: AtomicU64,
    /// Pulls made.
    pub pulls: AtomicU64,
    /// Queue stops that waited past `drop_wait` for an in-flight listener call (the queue's
    /// lock was kept meanwhile).
    pub slow_drains: AtomicU64,
}

struct Inner {
    config: ConsumerConfig,
    instance: ClientInstance,
    listener: MessageListener,
    strategy_name: String,
    subs: BTreeMap<String, SubscriptionData>,
    table: Mutex<HashMap<MessageQueue, Arc<QueueState>>>,
    offsets: Mutex<OffsetTable>,
    local_file: Option<LocalOffsetFile>,
    permits: Arc<Semaphore>,
    stats: ConsumerStats,
    token: CancellationToken,
    retry_producer: OnceCell<Producer>,
    start_ms: u64,
    driver: OnceLock<DriverHandle>,
    /// Coordinated mode membership (clustering consumers whose protocol is not classic).
    membership: Option<Arc<Membership>>,
    /// Wakes pull loops backing off after an error when a route of the consumer changes (a
    /// new master registered): they pull again at once instead of after
    /// `pull_delay_on_error`.
    routes_changed: tokio::sync::Notify,
}

/// A started push consumer. Cheap to clone.
#[derive(Clone)]
pub struct PushConsumer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PushConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushConsumer")
            .field("group", &self.inner.config.group)
            .field("client_id", &self.inner.instance.client_id())
            .finish()
    }
}

fn is_clustering(c: &ConsumerConfig) -> bool {
    c.message_model == MessageModel::Clustering
}

/// The driver's view of the push consumer (weak: the consumer owns the driver).
struct Runtime(Weak<Inner>);

impl PushConsumer {
    /// A builder for `group` with RocketMQ's defaults.
    pub fn builder(group: impl Into<String>) -> PushConsumerBuilder {
        PushConsumerBuilder::new(group)
    }

    /// Starts a consumer: routes, heartbeat, then the rebalance driver and timers.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] for a bad configuration; [`ClientError::Allocate`] for
    /// an unknown strategy; [`ClientError::OffsetFile`] for an unreadable broadcasting file.
    pub async fn start(config: ConsumerConfig, listener: MessageListener) -> Result<PushConsumer> {
        if config.group.is_empty() {
            return Err(ClientError::InvalidArgument(
                "consumer group is empty".into(),
            ));
        }
        if config.subscriptions.is_empty() {
            return Err(ClientError::InvalidArgument("no subscription".into()));
        }
        if config.consume_thread_max == 0 || config.consume_batch_size == 0 {
            return Err(ClientError::InvalidArgument(
                "consume_thread_max and consume_batch_size must be at least 1".into(),
            ));
        }
        if config.session_timeout < Duration::from_secs(1)
            || config.session_heartbeat_interval.is_zero()
            || config.session_heartbeat_interval >= config.session_timeout
        {
            return Err(ClientError::InvalidArgument(
                "session_timeout must be at least 1 s and above session_heartbeat_interval".into(),
            ));
        }
        for t in config.subscriptions.keys() {
            crate::producer::validate_topic(t)?;
        }
        let strategy: Arc<dyn AllocateStrategy> =
            Arc::from(strategy_by_name(config.classic_strategy())?);
        let instance = ClientInstance::start(config.client.clone())?;
        let sub_version = crate::now_ms_u64() as i64;
        let mut subs = BTreeMap::new();
        for (t, e) in &config.subscriptions {
            let sub = if config.sql92_topics.contains(t) {
                SubscriptionData::sql92(t.clone(), e, sub_version)
            } else {
                SubscriptionData::from_tag_expression(t.clone(), e, sub_version)
            };
            subs.insert(t.clone(), sub);
        }
        if is_clustering(&config) {
            let rt = retry_topic(&config.group);
            subs.insert(
                rt.clone(),
                SubscriptionData::from_tag_expression(rt, "*", sub_version),
            );
        }
        let (local_file, offsets) = if is_clustering(&config) {
            (None, OffsetTable::new())
        } else {
            let f = LocalOffsetFile::new(
                &config.offset_store_dir,
                instance.client_id(),
                &config.group,
            );
            let t = f.load()?;
            (Some(f), t)
        };
        let permits = Arc::new(Semaphore::new(config.consume_thread_max));
        let membership = (is_clustering(&config) && config.protocol != GroupProtocol::Classic)
            .then(|| {
                Arc::new(
                    Membership::new(
                        &config.group,
                        new_member_id(instance.client_id()),
                        config.instance_id.clone(),
                        config.protocol,
                        config.allocate_strategy.as_deref(),
                    )
                    .with_session_timeout(config.session_timeout),
                )
            });
        let inner = Arc::new(Inner {
            membership,
            routes_changed: tokio::sync::Notify::new(),
            token: instance.shutdown_token().child_token(),
            instance,
            listener,
            strategy_name: strategy.name(),
            subs,
            table: Mutex::new(HashMap::new()),
            offsets: Mutex::new(offsets),
            local_file,
            permits,
            stats: ConsumerStats::default(),
            retry_producer: OnceCell::new(),
            start_ms: crate::now_ms_u64(),
            driver: OnceLock::new(),
            config,
        });
        for t in inner.subs.keys() {
            if let Err(e) = inner.instance.update_route(t).await {
                debug!(topic = %t, error = %e, "no route yet");
            }
        }
        // As Java's checkClientInBroker: SQL92 subscriptions are checked with every broker of
        // their topic before anything starts.
        for sub in inner.subs.values() {
            if sub.expression_type == shoal_proto::body::ExpressionType::Sql92 {
                if let Err(e) = inner
                    .instance
                    .check_client_config(&inner.config.group, sub)
                    .await
                {
                    inner.token.cancel();
                    inner.instance.shutdown();
                    return Err(e);
                }
            }
        }
        let c = &inner.config;
        let driver = crate::rebalance::spawn(
            DriverConfig {
                group: c.group.clone(),
                clustering: is_clustering(c),
                orderly: inner.listener.is_orderly(),
                from_where: c.consume_from_where,
                from_timestamp_ms: c.consume_timestamp_ms,
                refresh_interval: c.rebalance_interval,
                session_timeout: c.session_timeout,
                session_heartbeat: c.session_heartbeat_interval,
                rocketmq_lock_lease: Duration::from_millis(LOCK_EXPIRE_MS),
                rocketmq_lock_renew: c.lock_interval,
                membership: inner.membership.clone(),
            },
            strategy,
            inner.instance.clone(),
            Arc::new(Runtime(Arc::downgrade(&inner))),
            inner.token.clone(),
        );
        let _ = inner.driver.set(driver.clone());
        let handle: Arc<dyn ConsumerHandle> = inner.clone();
        inner
            .instance
            .register_consumer(&inner.config.group, Arc::downgrade(&handle));
        // Coordinated first, so the classic heartbeat below finds the member known.
        if let Some(m) = inner.membership.clone() {
            let topics: Vec<String> = inner.subs.keys().cloned().collect();
            driver.member_heartbeat(&topics).await;
            if m.protocol() == GroupProtocol::Coordinated && m.mode() == MemberMode::Unsupported {
                inner.token.cancel();
                inner
                    .instance
                    .unregister_consumer_local(&inner.config.group);
                inner.instance.shutdown();
                return Err(ClientError::InvalidArgument(
                    "protocol = coordinated, but the broker does not coordinate groups (an Apache RocketMQ broker?)".into(),
                ));
            }
        }
        // The broker must know us before our first view (so we are in the member list).
        inner.instance.heartbeat_all().await;
        for t in inner.subs.keys() {
            driver.subscribe(t);
        }
        let this = PushConsumer { inner };
        this.spawn_persister();
        driver.spawn_membership(this.inner.token.clone());
        info!(group = %this.inner.config.group, client_id = %this.inner.instance.client_id(), "push consumer started");
        Ok(this)
    }

    fn spawn_persister(&self) {
        let weak = Arc::downgrade(&self.inner);
        let token = self.inner.token.clone();
        let period = self.inner.config.client.persist_offset_interval;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(period) => {}
                }
                let Some(inner) = weak.upgrade() else { return };
                inner.persist_all().await;
            }
        });
    }

    /// The client id, `ip@instanceName`.
    pub fn client_id(&self) -> &str {
        self.inner.instance.client_id()
    }

    /// The configuration.
    pub fn config(&self) -> &ConsumerConfig {
        &self.inner.config
    }

    /// The client instance.
    pub fn instance(&self) -> &ClientInstance {
        &self.inner.instance
    }

    /// Counters.
    pub fn stats(&self) -> &ConsumerStats {
        if let Some(d) = self.inner.driver.get() {
            let s = d.stats();
            self.inner
                .stats
                .rebalances
                .store(s.rounds, Ordering::Relaxed);
            self.inner
                .stats
                .queues_fenced
                .store(s.fenced, Ordering::Relaxed);
        }
        &self.inner.stats
    }

    /// Prometheus metrics of this consumer, to register in an application's registry.
    pub fn metrics(&self) -> crate::metrics::ConsumerMetrics {
        let weak = Arc::downgrade(&self.inner);
        crate::metrics::ConsumerMetrics::new(&self.inner.config.group, move || {
            let inner = weak.upgrade()?;
            let s = &inner.stats;
            let owned = inner
                .table
                .lock()
                .values()
                .filter(|q| !q.is_dropped())
                .count();
            let rb = inner
                .driver
                .get()
                .map(DriverHandle::stats)
                .unwrap_or_default();
            Some(crate::metrics::ConsumerSnapshot {
                consumed_ok: s.consumed_ok.load(Ordering::Relaxed),
                consumed_failed: s.consumed_failed.load(Ordering::Relaxed),
                sent_back: s.sent_back.load(Ordering::Relaxed),
                rebalances: rb.rounds,
                queues_released: s.queues_released.load(Ordering::Relaxed),
                pulls: s.pulls.load(Ordering::Relaxed),
                queues_owned: owned as u64,
            })
        })
    }

    /// The queues owned now (started and not being released), sorted.
    pub fn owned_queues(&self) -> Vec<MessageQueue> {
        self.inner
            .driver
            .get()
            .map(DriverHandle::owned)
            .unwrap_or_default()
    }

    /// The in-memory offset (next to consume) of a queue, if owned or known.
    pub fn committed_offset(&self, mq: &MessageQueue) -> Option<i64> {
        self.inner.offsets.lock().get(mq)
    }

    /// What GET_CONSUMER_RUNNING_INFO answers: owned queues with their cached counts,
    /// offsets and lock state, properties, subscriptions.
    pub fn running_info(&self) -> ConsumerRunningInfo {
        ConsumerHandle::running_info(&*self.inner)
    }

    /// Asks for a rebalance now (normally notices and the safety net do this).
    pub async fn rebalance_now(&self) {
        self.inner.rebalance_now();
    }

    /// Persists every owned queue's offset now (broker or local file).
    pub async fn persist_offsets(&self) {
        self.inner.persist_all().await;
    }

    /// Graceful shutdown: every queue is released (pulls stopped, in-flight consumes finished
    /// within `drop_wait`, offset committed and acknowledged, lock released), then the client
    /// unregisters from the brokers (which tells the rest of the group at once) and stops.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        if let Some(d) = inner.driver.get() {
            d.shutdown(inner.config.drop_wait + Duration::from_secs(5))
                .await;
        }
        inner.token.cancel();
        if let Some(f) = &inner.local_file {
            let table = inner.offsets.lock().clone();
            if let Err(e) = f.store(&table) {
                warn!(error = %e, "storing local offsets failed");
            }
        }
        inner
            .instance
            .unregister_client(None, Some(&inner.config.group))
            .await;
        inner
            .instance
            .unregister_consumer_local(&inner.config.group);
        if let Some(p) = inner.retry_producer.get() {
            p.shutdown().await;
        }
        inner.instance.shutdown();
        info!(group = %inner.config.group, client_id = %inner.instance.client_id(), "push consumer shut down");
    }
}

impl Inner {
    fn clustering(&self) -> bool {
        is_clustering(&self.config)
    }

    fn start_queue(self: &Arc<Self>, mq: MessageQueue, offset: i64, lease: Option<Instant>) {
        let state = Arc::new(QueueState::new(mq.clone(), &self.token, lease));
        {
            let mut pq = state.pq.lock();
            pq.locked = self.clustering();
            pq.last_lock_ms = crate::now_ms_u64();
        }
        self.offsets.lock().update(&mq, offset, false);
        self.table.lock().insert(mq, state.clone());
        self.spawn_pull_loop(state.clone(), offset);
        if self.listener.is_orderly() {
            self.spawn_orderly_loop(state);
        }
    }

    /// Stops a queue: dropped, pulls stopped, then waits until no listener call on it runs
    /// any more; returns the offset to commit (the smallest still in flight) unless fenced.
    ///
    /// The wait is what keeps the hand-over exclusive: the rebalancer commits and unlocks
    /// only after this returns, and the lock (renewed by the session meanwhile) is what the
    /// next owner waits for. `drop_wait` is only when a slow listener is reported. A graceful
    /// stop ends early when the queue's lease runs out (the lock is no longer ours, nothing
    /// is committed); a fence (lease already lost, or an offset reset) waits for the call
    /// regardless, so this member never runs two listener calls of one queue at once.
    async fn stop_queue(&self, mq: MessageQueue, fence: bool) -> Option<i64> {
        let state = self.table.lock().get(&mq).cloned()?;
        {
            let mut pq = state.pq.lock();
            if fence {
                // Nothing cached is delivered any more.
                state.fenced.store(true, Ordering::Relaxed);
                pq.clear();
            }
            pq.dropped = true;
        }
        state.cancel.cancel();
        state.wake.notify_one();
        self.wait_in_flight(&state, fence).await;
        // Lock order is table -> offsets -> process queue: take the queue's answer first.
        let floor = state.pq.lock().commit_offset();
        let offset = floor.or_else(|| self.offsets.lock().get(&mq));
        if self.clustering() {
            self.offsets.lock().remove(&mq);
        } else if let Some(o) = offset.filter(|_| !fence) {
            self.offsets.lock().update(&mq, o, true);
        }
        {
            let mut table = self.table.lock();
            if table.get(&mq).is_some_and(|s| Arc::ptr_eq(s, &state)) {
                table.remove(&mq);
            }
        }
        state.pq.lock().clear();
        self.stats.queues_released.fetch_add(1, Ordering::Relaxed);
        debug!(queue = %mq, offset = ?offset, fence, "queue stopped");
        (!fence).then_some(offset).flatten()
    }

    /// Waits until no listener call on the stopped queue runs (see [`Inner::stop_queue`]).
    async fn wait_in_flight(&self, state: &QueueState, fence: bool) {
        let mut rx = state.in_flight.subscribe();
        let started = Instant::now();
        let mut warned = false;
        loop {
            if *rx.borrow_and_update() == 0 {
                break;
            }
            let lease_left = if fence { None } else { state.lease_left() };
            if lease_left == Some(Duration::ZERO) {
                warn!(queue = %state.mq, waited = ?started.elapsed(), "lease ran out while a listener call on the stopped queue still runs; released without a commit");
                break;
            }
            let warn_in =
                (!warned).then(|| self.config.drop_wait.saturating_sub(started.elapsed()));
            // Wake for the warning and at the lease's end (it may have been renewed by then).
            let step = [warn_in, lease_left].into_iter().flatten().min();
            let ended = rx.wait_for(|n| *n == 0);
            let done = match step {
                Some(d) => tokio::time::timeout(d, ended).await.is_ok(),
                None => ended.await.is_ok(),
            };
            if done {
                break;
            }
            if !warned && started.elapsed() >= self.config.drop_wait {
                warned = true;
                self.stats.slow_drains.fetch_add(1, Ordering::Relaxed);
                warn!(queue = %state.mq, drop_wait = ?self.config.drop_wait, "a listener call on a stopped queue still runs after drop_wait; its lock is kept until it returns");
            }
        }
        if warned {
            info!(queue = %state.mq, waited = ?started.elapsed(), "slow listener call on the stopped queue ended");
        }
    }

    async fn commit_queue(&self, mq: MessageQueue, offset: i64, rewind: bool) -> bool {
        if !self.clustering() {
            self.offsets.lock().update(&mq, offset, true);
            return true;
        }
        let r = if rewind {
            self.instance
                .rewind_consumer_offset(&self.config.group, &mq, offset)
                .await
        } else {
            self.instance
                .update_consumer_offset(&self.config.group, &mq, offset)
                .await
        };
        match r {
            Ok(()) => true,
            Err(e) => {
                warn!(queue = %mq, offset, error = %e, "offset commit failed");
                false
            }
        }
    }

    async fn persist_all(&self) {
        let owned: Vec<(MessageQueue, i64)> = {
            let table = self.table.lock();
            let offsets = self.offsets.lock();
            // Only queues still ours by their lease: a zombie commits nothing.
            offsets
                .to_commit(|mq| table.get(mq).is_some_and(|s| s.may_deliver()))
                .map(|(mq, o)| (mq.clone(), o))
                .collect()
        };
        if let Some(f) = &self.local_file {
            let table = self.offsets.lock().clone();
            if let Err(e) = f.store(&table) {
                warn!(error = %e, "storing local offsets failed");
            }
            return;
        }
        for (mq, off) in owned {
            if let Err(e) = self
                .instance
                .update_consumer_offset_oneway(&self.config.group, &mq, off)
                .await
            {
                debug!(queue = %mq, error = %e, "offset persist failed");
            }
        }
    }
}

impl QueueRuntime for Runtime {
    fn start(&self, mq: MessageQueue, offset: i64, lease_until: Option<Instant>) {
        if let Some(inner) = self.0.upgrade() {
            inner.start_queue(mq, offset, lease_until);
        }
    }

    fn set_lease(&self, mq: &MessageQueue, until: Instant) {
        if let Some(inner) = self.0.upgrade() {
            if let Some(s) = inner.table.lock().get(mq) {
                *s.lease_until.lock() = Some(until);
                s.wake.notify_one();
            }
        }
    }

    fn stop(&self, mq: MessageQueue, fence: bool) -> BoxFuture<'static, Option<i64>> {
        let weak = self.0.clone();
        Box::pin(async move {
            let inner = weak.upgrade()?;
            inner.stop_queue(mq, fence).await
        })
    }

    fn commit(&self, mq: MessageQueue, offset: i64, rewind: bool) -> BoxFuture<'static, bool> {
        let weak = self.0.clone();
        Box::pin(async move {
            match weak.upgrade() {
                Some(inner) => inner.commit_queue(mq, offset, rewind).await,
                None => false,
            }
        })
    }

    fn local_offset(&self, mq: &MessageQueue) -> Option<i64> {
        self.0.upgrade()?.offsets.lock().get(mq)
    }
}

impl ConsumerHandle for Inner {
    fn consumer_data(&self) -> ConsumerData {
        ConsumerData {
            consume_from_where: self.config.consume_from_where,
            consume_type: ConsumeType::ConsumePassively,
            group_name: self.config.group.clone(),
            message_model: self.config.message_model,
            subscription_data_set: self.subs.values().cloned().collect(),
            unit_mode: false,
        }
    }

    fn subscribed_topics(&self) -> Vec<String> {
        self.subs.keys().cloned().collect()
    }

    fn speaks_coordinated(&self) -> bool {
        // Not once the broker turned out not to coordinate (it allocates classic then).
        self.membership
            .as_ref()
            .is_some_and(|m| m.mode() != MemberMode::Unsupported)
    }

    fn assignment_changed(&self) {
        match &self.membership {
            Some(m) => m.wake(),
            None => self.rebalance_now(),
        }
    }

    fn group_changed(&self) {
        if let Some(m) = &self.membership {
            // A member may have left or joined a group that runs classic: ask again.
            m.wake();
        }
        // The notice may be about the topic's queues: the routes are refreshed before the
        // rebalance runs (a changed route also triggers one, `store_route`).
        if let Some(d) = self.driver.get() {
            d.refresh_routes_then_notice();
        }
    }

    fn members_changed(&self, broker_addr: &str, notice: shoal_proto::ext::ConsumerIdsNotice) {
        if let Some(m) = &self.membership {
            // A member may have left or joined a group that runs classic: ask again.
            m.wake();
        }
        // Members only (a subscription or queue change comes without the list): no route
        // refresh.
        if let Some(d) = self.driver.get() {
            d.members(broker_addr, notice);
        }
    }

    fn rebalance_now(&self) {
        if let Some(d) = self.driver.get() {
            d.notice();
        }
    }

    fn route_changed(&self) {
        if let Some(m) = &self.membership {
            m.wake();
        }
        self.routes_changed.notify_waiters();
        self.rebalance_now();
    }

    fn lock_freed(&self, queues: Vec<MessageQueue>) {
        if let Some(d) = self.driver.get() {
            d.lock_freed(queues);
        }
    }

    fn running_info(&self) -> ConsumerRunningInfo {
        let mut info = ConsumerRunningInfo::default();
        let offsets = self.offsets.lock().clone();
        for s in self.table.lock().values() {
            let pq = s.pq.lock();
            if pq.dropped {
                continue;
            }
            info.mq_table.insert(
                s.mq.clone(),
                ProcessQueueInfo {
                    cached_msg_count: pq.cached_count() as i32,
                    cached_msg_max_offset: pq.max_offset_put(),
                    cached_msg_min_offset: pq.commit_offset().unwrap_or(-1),
                    cached_msg_size_in_mib: (pq.cached_bytes() / (1024 * 1024)) as i32,
                    commit_offset: offsets.get(&s.mq).unwrap_or(-1),
                    droped: pq.dropped,
                    last_consume_timestamp: pq.last_consume_ms as i64,
                    last_lock_timestamp: pq.last_lock_ms as i64,
                    last_pull_timestamp: pq.last_pull_ms as i64,
                    locked: pq.locked,
                    ..Default::default()
                },
            );
        }
        let p = &mut info.properties;
        p.insert(
            "PROP_CONSUMEORDERLY".into(),
            self.listener.is_orderly().to_string(),
        );
        p.insert("PROP_CONSUME_TYPE".into(), "CONSUME_PASSIVELY".into());
        p.insert(
            "PROP_CLIENT_VERSION".into(),
            format!("shoal-{}", env!("CARGO_PKG_VERSION")),
        );
        p.insert(
            "PROP_CONSUMER_START_TIMESTAMP".into(),
            self.start_ms.to_string(),
        );
        p.insert(
            "PROP_THREADPOOL_CORE_SIZE".into(),
            self.config.consume_thread_max.to_string(),
        );
        p.insert(
            "PROP_NAMESERVER_ADDR".into(),
            self.config.client.namesrv_addrs.join(";"),
        );
        p.insert(
            "messageModel".into(),
            format!("{:?}", self.config.message_model).to_uppercase(),
        );
        p.insert(
            "allocateMessageQueueStrategy".into(),
            self.strategy_name.clone(),
        );
        info.subscription_set = self.subs.values().cloned().collect();
        for t in self.subs.keys() {
            info.status_table
                .insert(t.clone(), ConsumeStatus::default());
        }
        info
    }

    fn reset_offset(&self, topic: &str, offsets: BTreeMap<MessageQueue, i64>) {
        let list: Vec<(MessageQueue, i64)> = offsets
            .into_iter()
            .filter(|(mq, _)| mq.topic == topic)
            .collect();
        if self.clustering() {
            if let Some(d) = self.driver.get() {
                d.reset(list);
            }
        } else {
            // Broadcasting: local offsets; owned queues restart from them.
            for (mq, o) in &list {
                self.offsets.lock().update(mq, *o, false);
            }
            if let Some(d) = self.driver.get() {
                d.reset(list);
            }
        }
    }

    fn consume_directly(
        &self,
        msg: MessageExt,
    ) -> BoxFuture<'static, ConsumeMessageDirectlyResult> {
        let msg = self.for_listener(msg);
        let listener = self.listener.clone();
        Box::pin(async move {
            let started = Instant::now();
            let ctx = ConsumeContext {
                message_queue: MessageQueue::new(msg.topic.clone(), "", msg.queue_id),
                // Not a queue the consumer owns: never stopped.
                stopped: CancellationToken::new(),
            };
            let orderly = listener.is_orderly();
            let result = tokio::task::spawn_blocking(move || match listener {
                MessageListener::Concurrently(f) => match f(std::slice::from_ref(&msg), &ctx) {
                    ConsumeConcurrentlyStatus::ConsumeSuccess => ConsumeResult::Success,
                    ConsumeConcurrentlyStatus::ReconsumeLater => ConsumeResult::Later,
                },
                MessageListener::Orderly(f) => match f(std::slice::from_ref(&msg), &ctx) {
                    ConsumeOrderlyStatus::Success => ConsumeResult::Success,
                    ConsumeOrderlyStatus::SuspendCurrentQueueAMoment => ConsumeResult::Later,
                },
            })
            .await
            .unwrap_or(ConsumeResult::ThrowException);
            ConsumeMessageDirectlyResult {
                auto_commit: true,
                consume_result: result,
                order: orderly,
                remark: None,
                spent_time_mills: started.elapsed().as_millis() as i64,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bad_configurations_are_refused_before_any_io() {
        let listener =
            || MessageListener::concurrently(|_, _| ConsumeConcurrentlyStatus::ConsumeSuccess);
        let e = PushConsumer::builder("G")
            .start(listener())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no subscription"), "{e}");
        let e = PushConsumer::builder("")
            .subscribe("T", "*")
            .start(listener())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("group"), "{e}");
        let e = PushConsumer::builder("G")
            .subscribe("bad topic", "*")
            .start(listener())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("illegal character"), "{e}");
        let e = PushConsumer::builder("G")
            .subscribe("T", "*")
            .allocate_strategy("NOPE")
            .start(listener())
            .await
            .unwrap_err();
        assert!(matches!(e, ClientError::Allocate(_)), "{e}");
        let e = PushConsumer::builder("G")
            .subscribe("T", "*")
            .consume_thread_max(0)
            .start(listener())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("at least 1"), "{e}");
    }
}
