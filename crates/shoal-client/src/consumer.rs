//! [`PushConsumer`]: RocketMQ's `DefaultMQPushConsumer` with classic (client-side) rebalance
//! and the fixes of `DESIGN.md` section 3.
//!
//! Tasks of one consumer (all stop at [`PushConsumer::shutdown`]):
//! - the **rebalance service**: runs at start, at once on NOTIFY_CONSUMER_IDS_CHANGED and on
//!   route changes, and every `rebalance_interval` (20 s) as a safety net. Per subscribed
//!   topic (with `%RETRY%<group>` in clustering mode) it sorts queues and client ids and runs
//!   the configured strategy; lost queues are released gracefully (dropped, in-flight consumes
//!   finished within `drop_wait`, offset committed synchronously, orderly lock released at
//!   once) before the rebalance goes on, gained queues get their broker lock first (orderly)
//!   and a start offset (broker offset, else consume-from-where);
//! - one **pull loop** per owned queue (RocketMQ's `PullRequest`), with flow control on the
//!   cached count, size and (concurrent) offset span;
//! - **consume tasks**: concurrent batches bounded by `consume_thread_max`, or one orderly
//!   loop per queue that only consumes while the broker lock is held;
//! - the **offset persister** (every 5 s; broker or local file) and, for orderly consumers,
//!   the **lock renewer** (every 20 s; a failed renewal stops the queue's consumption).
//!
//! Listeners are plain closures run on tokio's blocking pool, as Java runs them on a thread
//! pool.

use crate::config::ClientConfig;
use crate::coordinated::{new_member_id, GroupProtocol, MemberMode, Membership};
use crate::error::{ClientError, Result};
use crate::instance::{ClientInstance, ConsumerHandle, PullArgs, PullStatus, PULL_RPC_TIMEOUT};
use crate::offset_store::{LocalOffsetFile, OffsetTable};
use crate::process_queue::{Cached, ProcessQueue};
use crate::producer::Producer;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use shoal_group::{strategy_by_name, AllocateStrategy, AllocationInput};
use shoal_proto::body::{
    ConsumeFromWhere, ConsumeMessageDirectlyResult, ConsumeResult, ConsumeStatus, ConsumeType,
    ConsumerData, ConsumerRunningInfo, MessageModel, ProcessQueueInfo, SubscriptionData,
};
use shoal_proto::code::request_code as rc;
use shoal_proto::constants::{is_retry_topic, pull_sys_flag, retry_topic};
use shoal_proto::message::{property, Message, MessageExt};
use shoal_proto::MessageQueue;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify, OnceCell, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Client-side expiry of an orderly lock without renewal (RocketMQ: 30 s).
pub const LOCK_EXPIRE_MS: u64 = 30_000;

/// When a released queue's final commit is repeated (see `release_queue`).
const FINAL_COMMIT_REPEAT_AFTER: Duration = Duration::from_millis(30);

/// What a concurrent listener returns (`ConsumeConcurrentlyStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumeConcurrentlyStatus {
    /// Consumed.
    ConsumeSuccess,
    /// Consume again later (clustering: sent back to the broker for retry).
    ReconsumeLater,
}

/// What an orderly listener returns (`ConsumeOrderlyStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumeOrderlyStatus {
    /// Consumed; the queue moves on.
    Success,
    /// Suspend the queue for `suspend_current_queue_time`, then consume the same messages.
    SuspendCurrentQueueAMoment,
}

/// Passed to the listener with each batch.
#[derive(Debug, Clone)]
pub struct ConsumeContext {
    /// The queue the messages come from (for retry messages: `%RETRY%<group>`'s queue).
    pub message_queue: MessageQueue,
}

type ConcurrentlyFn =
    dyn Fn(&[MessageExt], &ConsumeContext) -> ConsumeConcurrentlyStatus + Send + Sync;
type OrderlyFn = dyn Fn(&[MessageExt], &ConsumeContext) -> ConsumeOrderlyStatus + Send + Sync;

/// The application's message listener.
#[derive(Clone)]
pub enum MessageListener {
    /// Batches consumed in parallel (`MessageListenerConcurrently`).
    Concurrently(Arc<ConcurrentlyFn>),
    /// One batch at a time per queue, in offset order, under the broker lock
    /// (`MessageListenerOrderly`).
    Orderly(Arc<OrderlyFn>),
}

impl std::fmt::Debug for MessageListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MessageListener::Concurrently(_) => "MessageListener::Concurrently",
            MessageListener::Orderly(_) => "MessageListener::Orderly",
        })
    }
}

impl MessageListener {
    /// A concurrent listener from a closure.
    pub fn concurrently<F>(f: F) -> Self
    where
        F: Fn(&[MessageExt], &ConsumeContext) -> ConsumeConcurrentlyStatus + Send + Sync + 'static,
    {
        MessageListener::Concurrently(Arc::new(f))
    }

    /// An orderly listener from a closure.
    pub fn orderly<F>(f: F) -> Self
    where
        F: Fn(&[MessageExt], &ConsumeContext) -> ConsumeOrderlyStatus + Send + Sync + 'static,
    {
        MessageListener::Orderly(Arc::new(f))
    }

    fn is_orderly(&self) -> bool {
        matches!(self, MessageListener::Orderly(_))
    }
}

/// Push consumer settings (RocketMQ defaults). Build with [`PushConsumer::builder`].
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// Consumer group.
    pub group: String,
    /// Name servers, identity, heartbeat/route/offset timers.
    pub client: ClientConfig,
    /// Clustering (default) or broadcasting.
    pub message_model: MessageModel,
    /// Where a group without a stored offset starts (last offset by default).
    pub consume_from_where: ConsumeFromWhere,
    /// Timestamp (ms) for `ConsumeFromTimestamp` (default: 30 minutes before start).
    pub consume_timestamp_ms: i64,
    /// Subscriptions: topic → tag expression (`*`, `a || b`).
    pub subscriptions: BTreeMap<String, String>,
    /// Allocation strategy name ([`shoal_group::strategy_by_name`], default `AVG`).
    pub allocate_strategy: String,
    /// Concurrent consume batches running at once (`consumeThreadMax`, 20).
    pub consume_thread_max: usize,
    /// Messages per listener call (`consumeMessageBatchMaxSize`, 1).
    pub consume_batch_size: usize,
    /// Messages per pull (`pullBatchSize`, 32).
    pub pull_batch_size: i32,
    /// Flow control: cached messages per queue (`pullThresholdForQueue`, 1000).
    pub pull_threshold_for_queue: usize,
    /// Flow control: cached body bytes per queue (`pullThresholdSizeForQueue`, 100 MiB).
    pub pull_threshold_size_for_queue: usize,
    /// Flow control (concurrent): largest offset span cached per queue
    /// (`consumeConcurrentlyMaxSpan`, 2000).
    pub consume_concurrently_max_span: i64,
    /// Safety-net rebalance period (20 s).
    pub rebalance_interval: Duration,
    /// Orderly lock renewal period (20 s).
    pub lock_interval: Duration,
    /// Long-polling hold asked of the broker, ms (15000).
    pub pull_suspend_ms: i64,
    /// Wait after a failed pull (RocketMQ: 3 s).
    pub pull_delay_on_error: Duration,
    /// Retries before the DLQ (concurrent: 16; orderly: `None` = retry locally forever).
    pub max_reconsume_times: Option<i32>,
    /// Orderly: pause after `SuspendCurrentQueueAMoment` (1 s).
    pub suspend_current_queue_time: Duration,
    /// Bound on the wait for in-flight consumes of a lost queue (hand-over) and at shutdown.
    pub drop_wait: Duration,
    /// Broadcasting: directory of the local offset files.
    pub offset_store_dir: PathBuf,
    /// Clustering, concurrent: how long a consumer waits before reading the start offset of
    /// queues it gained, so that the former owner (which got the
    /// same notification) has committed its final offset (Shoal; 200 ms). Orderly consumers
    /// need no delay: the broker lock orders the hand-over.
    pub handover_delay: Duration,
    /// Group protocol: `Auto` (coordinated where the broker coordinates groups, classic
    /// otherwise), `Coordinated` or `Classic` (clustering only; broadcasting is always
    /// classic).
    pub protocol: GroupProtocol,
    /// Coordinated mode: a stable instance id (static membership): a restart within the
    /// session timeout gets the same queues back and moves nothing.
    pub instance_id: Option<String>,
}

impl ConsumerConfig {
    /// Defaults for a group.
    pub fn new(group: impl Into<String>) -> Self {
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
        Self {
            group: group.into(),
            client: ClientConfig::default(),
            message_model: MessageModel::Clustering,
            consume_from_where: ConsumeFromWhere::ConsumeFromLastOffset,
            consume_timestamp_ms: crate::now_ms_u64() as i64 - 30 * 60 * 1000,
            subscriptions: BTreeMap::new(),
            allocate_strategy: "AVG".into(),
            consume_thread_max: 20,
            consume_batch_size: 1,
            pull_batch_size: 32,
            pull_threshold_for_queue: 1000,
            pull_threshold_size_for_queue: 100 * 1024 * 1024,
            consume_concurrently_max_span: 2000,
            rebalance_interval: Duration::from_secs(20),
            lock_interval: Duration::from_secs(20),
            pull_suspend_ms: 15_000,
            pull_delay_on_error: Duration::from_secs(3),
            max_reconsume_times: None,
            suspend_current_queue_time: Duration::from_secs(1),
            drop_wait: Duration::from_secs(5),
            offset_store_dir: home.join(".shoal_offsets"),
            handover_delay: Duration::from_millis(200),
            protocol: GroupProtocol::Auto,
            instance_id: None,
        }
    }
}

/// Builder of a [`PushConsumer`].
#[derive(Debug, Clone)]
pub struct PushConsumerBuilder {
    config: ConsumerConfig,
}

impl PushConsumerBuilder {
    /// Name server list (`"host:port;host:port"`).
    pub fn namesrv(mut self, addrs: &str) -> Self {
        self.config.client.namesrv_addrs = crate::config::parse_namesrv_addrs(addrs);
        self
    }
    /// The whole client configuration (timers included).
    pub fn client_config(mut self, client: ClientConfig) -> Self {
        self.config.client = client;
        self
    }
    /// Instance name (part of the client id).
    pub fn instance_name(mut self, name: impl Into<String>) -> Self {
        self.config.client.instance_name = Some(name.into());
        self
    }
    /// Subscribes `topic` with a tag expression (`*`, `a || b`).
    pub fn subscribe(mut self, topic: impl Into<String>, expression: impl Into<String>) -> Self {
        self.config
            .subscriptions
            .insert(topic.into(), expression.into());
        self
    }
    /// Clustering or broadcasting.
    pub fn message_model(mut self, model: MessageModel) -> Self {
        self.config.message_model = model;
        self
    }
    /// Where a new group starts.
    pub fn consume_from_where(mut self, w: ConsumeFromWhere) -> Self {
        self.config.consume_from_where = w;
        self
    }
    /// Timestamp for `ConsumeFromTimestamp`, ms.
    pub fn consume_timestamp_ms(mut self, t: i64) -> Self {
        self.config.consume_timestamp_ms = t;
        self
    }
    /// Allocation strategy name.
    pub fn allocate_strategy(mut self, name: impl Into<String>) -> Self {
        self.config.allocate_strategy = name.into();
        self
    }
    /// Group protocol (`Auto` by default).
    pub fn protocol(mut self, p: GroupProtocol) -> Self {
        self.config.protocol = p;
        self
    }
    /// Static membership instance id (coordinated mode).
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.config.instance_id = Some(id.into());
        self
    }
    /// Concurrent batches at once.
    pub fn consume_thread_max(mut self, n: usize) -> Self {
        self.config.consume_thread_max = n;
        self
    }
    /// Messages per listener call.
    pub fn consume_batch_size(mut self, n: usize) -> Self {
        self.config.consume_batch_size = n;
        self
    }
    /// Messages per pull.
    pub fn pull_batch_size(mut self, n: i32) -> Self {
        self.config.pull_batch_size = n;
        self
    }
    /// Retries before the DLQ.
    pub fn max_reconsume_times(mut self, n: i32) -> Self {
        self.config.max_reconsume_times = Some(n);
        self
    }
    /// Safety-net rebalance period.
    pub fn rebalance_interval(mut self, d: Duration) -> Self {
        self.config.rebalance_interval = d;
        self
    }
    /// Orderly lock renewal period.
    pub fn lock_interval(mut self, d: Duration) -> Self {
        self.config.lock_interval = d;
        self
    }
    /// Orderly suspend time.
    pub fn suspend_current_queue_time(mut self, d: Duration) -> Self {
        self.config.suspend_current_queue_time = d;
        self
    }
    /// Broadcasting offset directory.
    pub fn offset_store_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.offset_store_dir = dir.into();
        self
    }
    /// Changes any other setting.
    pub fn configure(mut self, f: impl FnOnce(&mut ConsumerConfig)) -> Self {
        f(&mut self.config);
        self
    }
    /// The configuration built so far.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }
    /// Starts the consumer with `listener`.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] for a bad configuration or unknown strategy.
    pub async fn start(self, listener: MessageListener) -> Result<PushConsumer> {
        PushConsumer::start(self.config, listener).await
    }
}

/// Local state of one owned queue.
struct QueueState {
    mq: MessageQueue,
    pq: Mutex<ProcessQueue<MessageExt>>,
    /// Stops the pull loop and the orderly consume loop.
    cancel: CancellationToken,
    /// Consumes running for this queue (graceful hand-over waits for 0).
    in_flight: watch::Sender<usize>,
    /// Orderly: new messages or a renewed lock.
    wake: Notify,
    /// Orderly: local retry count per offset.
    suspends: Mutex<HashMap<i64, i32>>,
}

impl QueueState {
    fn new(mq: MessageQueue, parent: &CancellationToken) -> Self {
        Self {
            mq,
            pq: Mutex::new(ProcessQueue::new()),
            cancel: parent.child_token(),
            in_flight: watch::channel(0).0,
            wake: Notify::new(),
            suspends: Mutex::new(HashMap::new()),
        }
    }
    fn is_dropped(&self) -> bool {
        self.pq.lock().dropped
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
    /// Rebalance runs.
    pub rebalances: AtomicU64,
    /// Queue hand-overs (queues released).
    pub queues_released: AtomicU64,
    /// Pulls made.
    pub pulls: AtomicU64,
}

struct Inner {
    config: ConsumerConfig,
    instance: ClientInstance,
    listener: MessageListener,
    strategy: Box<dyn AllocateStrategy>,
    subs: BTreeMap<String, SubscriptionData>,
    table: Mutex<HashMap<MessageQueue, Arc<QueueState>>>,
    offsets: Mutex<OffsetTable>,
    local_file: Option<LocalOffsetFile>,
    rebalance_wake: Notify,
    permits: Arc<Semaphore>,
    stats: ConsumerStats,
    token: CancellationToken,
    retry_producer: OnceCell<Producer>,
    start_ms: u64,
    /// Serialises rebalances with resets and shutdown.
    rebalance_lock: tokio::sync::Mutex<()>,
    /// Ourselves, for work the broker's requests start.
    me: std::sync::Weak<Inner>,
    /// Bumped by every rebalance request: a rebalance that sees it move knows its view of the
    /// group is stale and gives up its gains (the next run is already due).
    generation: AtomicU64,
    /// Coordinated mode membership (clustering consumers whose protocol is not classic).
    membership: Option<Arc<Membership>>,
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

impl PushConsumer {
    /// A builder for `group` with RocketMQ's defaults.
    pub fn builder(group: impl Into<String>) -> PushConsumerBuilder {
        PushConsumerBuilder {
            config: ConsumerConfig::new(group),
        }
    }

    /// Starts a consumer: routes, heartbeat, then the rebalance service and timers.
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
        for t in config.subscriptions.keys() {
            crate::producer::validate_topic(t)?;
        }
        let strategy = strategy_by_name(&config.allocate_strategy)?;
        let instance = ClientInstance::start(config.client.clone())?;
        let sub_version = crate::now_ms_u64() as i64;
        let mut subs = BTreeMap::new();
        for (t, e) in &config.subscriptions {
            subs.insert(
                t.clone(),
                SubscriptionData::from_tag_expression(t.clone(), e, sub_version),
            );
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
                Arc::new(Membership::new(
                    &config.group,
                    new_member_id(instance.client_id()),
                    config.instance_id.clone(),
                    config.protocol,
                    &config.allocate_strategy,
                ))
            });
        let inner = Arc::new_cyclic(|me| Inner {
            membership,
            me: me.clone(),
            generation: AtomicU64::new(0),
            token: instance.shutdown_token().child_token(),
            instance,
            listener,
            strategy,
            subs,
            table: Mutex::new(HashMap::new()),
            offsets: Mutex::new(offsets),
            local_file,
            rebalance_wake: Notify::new(),
            permits,
            stats: ConsumerStats::default(),
            retry_producer: OnceCell::new(),
            start_ms: crate::now_ms_u64(),
            rebalance_lock: tokio::sync::Mutex::new(()),
            config,
        });
        for t in inner.subs.keys() {
            if let Err(e) = inner.instance.update_route(t).await {
                debug!(topic = %t, error = %e, "no route yet");
            }
        }
        let handle: Arc<dyn ConsumerHandle> = inner.clone();
        inner
            .instance
            .register_consumer(&inner.config.group, Arc::downgrade(&handle));
        // Coordinated first, so the classic heartbeat below finds the member known.
        if let Some(m) = inner.membership.clone() {
            inner.member_heartbeat().await;
            if m.protocol() == GroupProtocol::Coordinated && m.mode() == MemberMode::Unsupported {
                inner
                    .instance
                    .unregister_consumer_local(&inner.config.group);
                inner.instance.shutdown();
                return Err(ClientError::InvalidArgument(
                    "protocol = coordinated, but the broker does not coordinate groups (an Apache RocketMQ broker?)".into(),
                ));
            }
        }
        inner.instance.heartbeat_all().await;
        let this = PushConsumer { inner };
        this.spawn_services();
        info!(group = %this.inner.config.group, client_id = %this.inner.instance.client_id(), "push consumer started");
        Ok(this)
    }

    fn spawn_services(&self) {
        // Coordinated membership: heartbeats on notices, releases and every interval.
        if let Some(m) = self.inner.membership.clone() {
            let weak = Arc::downgrade(&self.inner);
            let token = self.inner.token.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = token.cancelled() => return,
                        _ = m.wait() => {}
                    }
                    let Some(inner) = weak.upgrade() else { return };
                    inner.member_heartbeat().await;
                }
            });
        }
        // Rebalance service.
        let weak = Arc::downgrade(&self.inner);
        let token = self.inner.token.clone();
        let interval = self.inner.config.rebalance_interval;
        tokio::spawn(async move {
            let mut wait = Duration::ZERO;
            loop {
                {
                    let Some(inner) = weak.upgrade() else { return };
                    tokio::select! {
                        _ = token.cancelled() => return,
                        _ = inner.rebalance_wake.notified() => {}
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                let Some(inner) = weak.upgrade() else { return };
                let retry_soon = inner.rebalance().await;
                wait = if retry_soon {
                    interval.min(Duration::from_millis(500))
                } else {
                    interval
                };
            }
        });
        // Offset persister.
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
        // Lock renewer.
        if self.inner.listener.is_orderly() && is_clustering(&self.inner.config) {
            let weak = Arc::downgrade(&self.inner);
            let token = self.inner.token.clone();
            let period = self.inner.config.lock_interval;
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = token.cancelled() => return,
                        _ = tokio::time::sleep(period) => {}
                    }
                    let Some(inner) = weak.upgrade() else { return };
                    inner.renew_locks().await;
                }
            });
        }
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
            Some(crate::metrics::ConsumerSnapshot {
                consumed_ok: s.consumed_ok.load(Ordering::Relaxed),
                consumed_failed: s.consumed_failed.load(Ordering::Relaxed),
                sent_back: s.sent_back.load(Ordering::Relaxed),
                rebalances: s.rebalances.load(Ordering::Relaxed),
                queues_released: s.queues_released.load(Ordering::Relaxed),
                pulls: s.pulls.load(Ordering::Relaxed),
                queues_owned: owned as u64,
            })
        })
    }

    /// The queues owned now (not dropped), sorted.
    pub fn owned_queues(&self) -> Vec<MessageQueue> {
        let mut v: Vec<MessageQueue> = self
            .inner
            .table
            .lock()
            .values()
            .filter(|s| !s.is_dropped())
            .map(|s| s.mq.clone())
            .collect();
        v.sort();
        v
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

    /// Runs a rebalance now and waits for it (normally the service does this by itself).
    pub async fn rebalance_now(&self) {
        self.inner.rebalance().await;
    }

    /// Persists every owned queue's offset now (broker or local file).
    pub async fn persist_offsets(&self) {
        self.inner.persist_all().await;
    }

    /// Graceful shutdown: stop rebalancing and pulling, let in-flight consumes finish (within
    /// `drop_wait`), commit offsets synchronously, release orderly locks, unregister from the
    /// brokers (which tells the rest of the group at once), stop the instance.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.token.cancel();
        let _guard = inner.rebalance_lock.lock().await;
        let all: Vec<Arc<QueueState>> = inner.table.lock().values().cloned().collect();
        futures::future::join_all(all.into_iter().map(|s| inner.release_queue(s, true))).await;
        if let Some(m) = &inner.membership {
            let topics: Vec<String> = inner.subs.keys().cloned().collect();
            if let Some(addr) =
                Membership::coordinator_addr(&inner.instance, &inner.config.group, &topics)
            {
                m.leave(&inner.instance, &addr).await;
            }
        }
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

    /// True when the coordinator decides this consumer's queues.
    fn coordinated(&self) -> bool {
        self.membership.as_ref().is_some_and(|m| m.decides())
    }

    /// One coordinated heartbeat; rebalances when the assignment or mode changed.
    async fn member_heartbeat(&self) {
        let Some(m) = &self.membership else { return };
        let topics: Vec<String> = self.subs.keys().cloned().collect();
        let addr = match Membership::coordinator_addr(&self.instance, &self.config.group, &topics) {
            Some(a) => a,
            None => {
                for t in topics.iter().filter(|t| !is_retry_topic(t)) {
                    if let Err(e) = self.instance.update_route(t).await {
                        debug!(topic = %t, error = %e, "no route for the coordinator choice");
                    }
                }
                match Membership::coordinator_addr(&self.instance, &self.config.group, &topics) {
                    Some(a) => a,
                    None => return,
                }
            }
        };
        let owned: Vec<MessageQueue> = self.table.lock().keys().cloned().collect();
        let out = m.heartbeat(&self.instance, &addr, topics, owned).await;
        if out.changed {
            self.rebalance_now();
        }
        if out.again {
            m.wake();
        }
    }

    /// One rebalance over every subscribed topic. Returns true when it should be retried soon
    /// (a lock could not be taken, a start offset could not be found, a lookup failed).
    async fn rebalance(self: &Arc<Self>) -> bool {
        let _guard = self.rebalance_lock.lock().await;
        if self.token.is_cancelled() {
            return false;
        }
        self.stats.rebalances.fetch_add(1, Ordering::Relaxed);
        let generation = self.generation.load(Ordering::SeqCst);
        let mut retry = false;
        let held_before = self.table.lock().len();
        // Phase 1, every topic: allocate and release what is lost (the next owners wait on
        // our commits and unlocks).
        let mut plans = Vec::new();
        for topic in self.subs.keys() {
            match self.allocate(topic).await {
                Ok(mine) => {
                    let gained = self.release_lost(topic, &mine).await;
                    plans.push((topic, mine, gained));
                }
                Err(e) => {
                    debug!(topic = %topic, error = %e, "rebalance of topic skipped");
                    // A retry topic appears once the broker created it; keep trying softly.
                    if !is_retry_topic(topic) {
                        retry = true;
                    }
                }
            }
        }
        // Coordinated: report the releases at once (the next owners wait for them).
        if self.coordinated() && self.table.lock().len() < held_before {
            if let Some(m) = &self.membership {
                m.wake();
            }
        }
        // One hand-over pause for all gains (concurrent clustering; orderly has the locks;
        // coordinated mode has the coordinator's evidence).
        let orderly = self.listener.is_orderly() && self.clustering();
        if !orderly
            && self.clustering()
            && !self.coordinated()
            && plans.iter().any(|(_, _, g)| !g.is_empty())
        {
            tokio::time::sleep(self.config.handover_delay).await;
        }
        // Phase 2: take the gains.
        for (topic, mine, gained) in plans {
            if !gained.is_empty() && self.add_gained(topic, &mine, gained, generation).await {
                retry = true;
            }
        }
        retry
    }

    async fn allocate(&self, topic: &str) -> Result<BTreeSet<MessageQueue>> {
        let route = match self.instance.cached_route(topic) {
            Some(r) => r,
            None => self.instance.update_route(topic).await?,
        };
        let all = route.subscribe_queues(topic);
        if !self.clustering() {
            return Ok(all.into_iter().collect());
        }
        if let Some(m) = self.membership.as_ref().filter(|m| m.decides()) {
            return Ok(m.assignment_of(topic));
        }
        let cids = self
            .instance
            .consumer_ids(&self.config.group, topic)
            .await?;
        if all.is_empty() || cids.is_empty() {
            return Ok(BTreeSet::new());
        }
        let input = AllocationInput::new(&self.config.group, all, cids);
        let mine = self.strategy.allocate(&input, self.instance.client_id())?;
        Ok(mine.into_iter().collect())
    }

    /// Applies an allocation for one topic; returns true if something must be retried.
    /// Releases the queues of `topic` not in `mine`; returns the queues to gain.
    async fn release_lost(&self, topic: &str, mine: &BTreeSet<MessageQueue>) -> Vec<MessageQueue> {
        let current: Vec<Arc<QueueState>> = self
            .table
            .lock()
            .values()
            .filter(|s| s.mq.topic == topic)
            .cloned()
            .collect();
        let lost: Vec<Arc<QueueState>> = current
            .iter()
            .filter(|s| !mine.contains(&s.mq))
            .cloned()
            .collect();
        let have: BTreeSet<MessageQueue> = current.iter().map(|s| s.mq.clone()).collect();
        let gained: Vec<MessageQueue> = mine.difference(&have).cloned().collect();
        if !lost.is_empty() || !gained.is_empty() {
            info!(group = %self.config.group, client_id = %self.instance.client_id(), topic,
                lost = lost.len(), gained = gained.len(), "rebalance changes assignment");
        }
        futures::future::join_all(lost.into_iter().map(|s| self.release_queue(s, true))).await;
        gained
    }

    /// Takes gained queues of `topic` (locking them first when orderly); returns true if
    /// something must be retried soon.
    async fn add_gained(
        self: &Arc<Self>,
        topic: &str,
        mine: &BTreeSet<MessageQueue>,
        gained: Vec<MessageQueue>,
        generation: u64,
    ) -> bool {
        let mut retry = false;
        let mut to_add = gained;
        let orderly = self.listener.is_orderly() && self.clustering();
        if orderly && !to_add.is_empty() {
            let mut by_broker: BTreeMap<String, Vec<MessageQueue>> = BTreeMap::new();
            for mq in to_add.drain(..) {
                by_broker
                    .entry(mq.broker_name.clone())
                    .or_default()
                    .push(mq);
            }
            for (broker, mqs) in by_broker {
                let want = mqs.len();
                match self
                    .instance
                    .lock_batch(&self.config.group, &broker, topic, mqs)
                    .await
                {
                    Ok(locked) => {
                        if locked.len() < want {
                            retry = true;
                        }
                        to_add.extend(locked.into_iter().filter(|m| mine.contains(m)));
                    }
                    Err(e) => {
                        debug!(broker = %broker, error = %e, "lock failed");
                        retry = true;
                    }
                }
            }
        }
        if !to_add.is_empty() && self.generation.load(Ordering::SeqCst) != generation {
            // Something was notified while we were releasing or waiting. If the group and the
            // queues are still what we allocated from (e.g. the notice of our own join), the
            // gains stand; otherwise they may already belong to someone else and the pending
            // run recomputes them.
            let still = matches!(self.allocate(topic).await, Ok(fresh) if &fresh == mine);
            if !still {
                debug!(topic, "membership changed during rebalance; gains deferred");
                if orderly {
                    self.unlock_quietly(topic, &to_add).await;
                }
                return true;
            }
        }
        for mq in to_add {
            let start = match self.start_offset(&mq).await {
                Ok(o) => o,
                Err(e) => {
                    warn!(queue = %mq, error = %e, "no start offset; retrying later");
                    if orderly {
                        self.unlock_quietly(topic, std::slice::from_ref(&mq)).await;
                    }
                    retry = true;
                    continue;
                }
            };
            let state = Arc::new(QueueState::new(mq.clone(), &self.token));
            {
                let mut pq = state.pq.lock();
                pq.locked = orderly;
                pq.last_lock_ms = crate::now_ms_u64();
            }
            self.offsets.lock().update(&mq, start, false);
            self.table.lock().insert(mq.clone(), state.clone());
            debug!(queue = %mq, start, "queue gained");
            self.spawn_pull_loop(state.clone(), start);
            if self.listener.is_orderly() {
                self.spawn_orderly_loop(state);
            }
        }
        retry
    }

    async fn unlock_quietly(&self, topic: &str, mqs: &[MessageQueue]) {
        for mq in mqs {
            if let Err(e) = self
                .instance
                .unlock_batch(&self.config.group, &mq.broker_name, topic, vec![mq.clone()])
                .await
            {
                debug!(queue = %mq, error = %e, "unlock failed");
            }
        }
    }

    /// The offset a newly owned queue starts at (spec 7.4).
    async fn start_offset(&self, mq: &MessageQueue) -> Result<i64> {
        if self.clustering() {
            if let Some(o) = self
                .instance
                .query_consumer_offset(&self.config.group, mq)
                .await?
            {
                return Ok(o);
            }
        } else if let Some(o) = self.offsets.lock().get(mq) {
            return Ok(o);
        }
        let retry = is_retry_topic(&mq.topic);
        match self.config.consume_from_where {
            ConsumeFromWhere::ConsumeFromFirstOffset => Ok(0),
            ConsumeFromWhere::ConsumeFromTimestamp => {
                if retry {
                    self.instance.max_offset(mq).await
                } else {
                    self.instance
                        .search_offset(mq, self.config.consume_timestamp_ms)
                        .await
                }
            }
            _ => {
                if retry {
                    Ok(0)
                } else {
                    self.instance.max_offset(mq).await
                }
            }
        }
    }

    /// Hand-over of a lost queue (also shutdown): dropped, pulls stopped, in-flight consumes
    /// given `drop_wait`, offset committed synchronously, orderly lock released, entry removed.
    async fn release_queue(&self, state: Arc<QueueState>, commit: bool) {
        state.pq.lock().dropped = true;
        state.cancel.cancel();
        state.wake.notify_one();
        let mut rx = state.in_flight.subscribe();
        if tokio::time::timeout(self.config.drop_wait, rx.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            warn!(queue = %state.mq, "in-flight consume still running after drop_wait; releasing anyway");
        }
        let mq = &state.mq;
        // Lock order is table -> offsets -> process queue: take the queue's answer first and
        // let its guard go before looking at the offset table.
        let in_flight_floor = state.pq.lock().commit_offset();
        let final_offset = in_flight_floor.or_else(|| self.offsets.lock().get(mq));
        if commit {
            if let Some(off) = final_offset {
                self.offsets.lock().update(mq, off, true);
                if self.clustering() {
                    if let Err(e) = self
                        .instance
                        .update_consumer_offset(&self.config.group, mq, off)
                        .await
                    {
                        warn!(queue = %mq, error = %e, "final offset commit failed");
                    }
                    // A pull sent just before the release carries an older commitOffset that
                    // the broker, processing requests concurrently, may apply after the commit
                    // above: commit once more after it (still before the unlock and well
                    // within the next owner's `handover_delay`).
                    tokio::time::sleep(FINAL_COMMIT_REPEAT_AFTER).await;
                    if let Err(e) = self
                        .instance
                        .update_consumer_offset(&self.config.group, mq, off)
                        .await
                    {
                        warn!(queue = %mq, error = %e, "final offset commit failed");
                    }
                }
            }
        }
        if self.listener.is_orderly() && self.clustering() {
            if let Err(e) = self
                .instance
                .unlock_batch(
                    &self.config.group,
                    &mq.broker_name,
                    &mq.topic,
                    vec![mq.clone()],
                )
                .await
            {
                debug!(queue = %mq, error = %e, "unlock failed (the broker lock will expire)");
            }
        }
        if self.clustering() {
            self.offsets.lock().remove(mq);
        }
        {
            let mut table = self.table.lock();
            if table.get(mq).is_some_and(|s| Arc::ptr_eq(s, &state)) {
                table.remove(mq);
            }
        }
        state.pq.lock().clear();
        self.stats.queues_released.fetch_add(1, Ordering::Relaxed);
        debug!(queue = %mq, offset = ?final_offset, "queue released");
    }

    async fn persist_all(&self) {
        let owned: Vec<(MessageQueue, i64)> = {
            let table = self.table.lock();
            let offsets = self.offsets.lock();
            offsets
                .to_commit(|mq| table.get(mq).is_some_and(|s| !s.is_dropped()))
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

    async fn renew_locks(&self) {
        let mut by_broker: BTreeMap<(String, String), Vec<Arc<QueueState>>> = BTreeMap::new();
        for s in self.table.lock().values() {
            if !s.is_dropped() {
                by_broker
                    .entry((s.mq.broker_name.clone(), s.mq.topic.clone()))
                    .or_default()
                    .push(s.clone());
            }
        }
        for ((broker, topic), states) in by_broker {
            let mqs: Vec<MessageQueue> = states.iter().map(|s| s.mq.clone()).collect();
            let locked: BTreeSet<MessageQueue> = match self
                .instance
                .lock_batch(&self.config.group, &broker, &topic, mqs)
                .await
            {
                Ok(l) => l.into_iter().collect(),
                Err(e) => {
                    warn!(broker = %broker, error = %e, "lock renewal failed; pausing its queues");
                    BTreeSet::new()
                }
            };
            let now = crate::now_ms_u64();
            for s in states {
                let mut pq = s.pq.lock();
                if locked.contains(&s.mq) {
                    pq.locked = true;
                    pq.last_lock_ms = now;
                    drop(pq);
                    s.wake.notify_one();
                } else {
                    if pq.locked {
                        warn!(queue = %s.mq, "lock lost; consumption stops");
                    }
                    pq.locked = false;
                }
            }
        }
    }

    fn spawn_pull_loop(self: &Arc<Self>, state: Arc<QueueState>, start: i64) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut next = start;
            loop {
                if state.cancel.is_cancelled() {
                    return;
                }
                let Some(inner) = weak.upgrade() else { return };
                match inner.pull_once(&state, next).await {
                    Some(n) => next = n,
                    None => {
                        tokio::select! {
                            _ = state.cancel.cancelled() => return,
                            _ = tokio::time::sleep(inner.config.pull_delay_on_error) => {}
                        }
                    }
                }
            }
        });
    }

    /// One pull step; returns the next offset, or `None` to back off.
    async fn pull_once(self: &Arc<Self>, state: &Arc<QueueState>, offset: i64) -> Option<i64> {
        // Flow control.
        loop {
            let (count, bytes, span, dropped, locked_ok) = {
                let pq = state.pq.lock();
                let lock_ok = !self.listener.is_orderly()
                    || !self.clustering()
                    || (pq.locked
                        && crate::now_ms_u64().saturating_sub(pq.last_lock_ms) < LOCK_EXPIRE_MS);
                (
                    pq.cached_count(),
                    pq.cached_bytes(),
                    pq.max_span(),
                    pq.dropped,
                    lock_ok,
                )
            };
            if dropped {
                return Some(offset);
            }
            let over = count >= self.config.pull_threshold_for_queue
                || bytes >= self.config.pull_threshold_size_for_queue
                || (!self.listener.is_orderly()
                    && span > self.config.consume_concurrently_max_span)
                || !locked_ok;
            if !over {
                break;
            }
            tokio::select! {
                _ = state.cancel.cancelled() => return Some(offset),
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
        let sub = self.subs.get(&state.mq.topic)?;
        let commit = if self.clustering() {
            self.offsets.lock().get(&state.mq).unwrap_or(0)
        } else {
            0
        };
        let sys_flag = pull_sys_flag::build(commit > 0, true, true, false);
        state.pq.lock().last_pull_ms = crate::now_ms_u64();
        self.stats.pulls.fetch_add(1, Ordering::Relaxed);
        let args = PullArgs {
            code: rc::PULL_MESSAGE,
            group: &self.config.group,
            mq: &state.mq,
            offset,
            max_msgs: self.config.pull_batch_size,
            sys_flag,
            commit_offset: commit,
            suspend_ms: self.config.pull_suspend_ms,
            subscription: Some(&sub.sub_string),
            sub_version: sub.sub_version,
            timeout: PULL_RPC_TIMEOUT,
        };
        // Biased: a queue released in the meantime must not send one more pull (its
        // commitOffset could land after the final commit).
        let result = tokio::select! {
            biased;
            _ = state.cancel.cancelled() => return Some(offset),
            r = self.instance.pull(args) => r,
        };
        let result = match result {
            Ok(r) => r,
            Err(e) => {
                debug!(queue = %state.mq, error = %e, "pull failed");
                if e.server_code() == Some(shoal_proto::code::response_code::FLOW_CONTROL) {
                    // The broker is busy: RocketMQ re-pulls after 20 ms, not the error delay.
                    tokio::select! {
                        _ = state.cancel.cancelled() => {}
                        _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                    }
                    return Some(offset);
                }
                return None;
            }
        };
        if state.is_dropped() {
            return Some(offset);
        }
        match result.status {
            PullStatus::Found => {
                let matched: Vec<MessageExt> = result
                    .messages
                    .into_iter()
                    .filter(|m| sub.matches_tags(m.tags()))
                    .collect();
                if matched.is_empty() {
                    self.advance_if_idle(state, result.next_begin_offset);
                } else {
                    self.dispatch(state, matched);
                }
            }
            PullStatus::NoNewMsg | PullStatus::NoMatchedMsg => {
                self.advance_if_idle(state, result.next_begin_offset);
            }
            PullStatus::OffsetIllegal => {
                warn!(queue = %state.mq, offset, next = result.next_begin_offset, "offset illegal; moving");
                self.offsets
                    .lock()
                    .update(&state.mq, result.next_begin_offset, false);
                if self.clustering() {
                    let _ = self
                        .instance
                        .update_consumer_offset(
                            &self.config.group,
                            &state.mq,
                            result.next_begin_offset,
                        )
                        .await;
                }
            }
        }
        Some(result.next_begin_offset)
    }

    /// Nothing cached: the committed offset may follow the pull offset (filtered messages).
    fn advance_if_idle(&self, state: &QueueState, next: i64) {
        let idle = state.pq.lock().is_idle();
        if idle && !state.is_dropped() {
            self.offsets.lock().update(&state.mq, next, true);
        }
    }

    /// Restores the real topic of a retry message for the listener.
    fn for_listener(&self, mut m: MessageExt) -> MessageExt {
        if is_retry_topic(&m.topic) {
            if let Some(t) = m.property(property::RETRY_TOPIC) {
                m.topic = t.to_owned();
            }
        }
        m
    }

    fn dispatch(self: &Arc<Self>, state: &Arc<QueueState>, msgs: Vec<MessageExt>) {
        let cached: Vec<Cached<MessageExt>> = msgs
            .iter()
            .map(|m| Cached {
                offset: m.queue_offset,
                size: m.body.len(),
                message: m.clone(),
            })
            .collect();
        let added = state.pq.lock().put(cached);
        if added == 0 {
            return;
        }
        match &self.listener {
            MessageListener::Orderly(_) => state.wake.notify_one(),
            MessageListener::Concurrently(f) => {
                for chunk in msgs.chunks(self.config.consume_batch_size) {
                    self.spawn_concurrent(state.clone(), f.clone(), chunk.to_vec());
                }
            }
        }
    }

    fn spawn_concurrent(
        self: &Arc<Self>,
        state: Arc<QueueState>,
        f: Arc<ConcurrentlyFn>,
        msgs: Vec<MessageExt>,
    ) {
        let inner = self.clone();
        state.begin();
        tokio::spawn(async move {
            inner.consume_concurrently(&state, f, msgs).await;
            state.end();
        });
    }

    async fn consume_concurrently(
        self: &Arc<Self>,
        state: &Arc<QueueState>,
        f: Arc<ConcurrentlyFn>,
        msgs: Vec<MessageExt>,
    ) {
        let Ok(_permit) = self.permits.clone().acquire_owned().await else {
            return;
        };
        if state.is_dropped() {
            // Not consumed: stays below the committed offset for the next owner.
            return;
        }
        let offsets: Vec<i64> = msgs.iter().map(|m| m.queue_offset).collect();
        let for_listener: Vec<MessageExt> =
            msgs.iter().cloned().map(|m| self.for_listener(m)).collect();
        let ctx = ConsumeContext {
            message_queue: state.mq.clone(),
        };
        let started = Instant::now();
        let status = tokio::task::spawn_blocking(move || f(&for_listener, &ctx))
            .await
            .unwrap_or(ConsumeConcurrentlyStatus::ReconsumeLater);
        state.pq.lock().last_consume_ms = crate::now_ms_u64();
        debug!(queue = %state.mq, n = msgs.len(), ?status, elapsed = ?started.elapsed(), "consumed");
        let mut keep: Vec<MessageExt> = Vec::new();
        match status {
            ConsumeConcurrentlyStatus::ConsumeSuccess => {
                self.stats
                    .consumed_ok
                    .fetch_add(msgs.len() as u64, Ordering::Relaxed);
            }
            ConsumeConcurrentlyStatus::ReconsumeLater => {
                self.stats
                    .consumed_failed
                    .fetch_add(msgs.len() as u64, Ordering::Relaxed);
                if self.clustering() {
                    for m in &msgs {
                        if !self.send_back(&state.mq, m).await {
                            keep.push(m.clone());
                        }
                    }
                } else {
                    warn!(queue = %state.mq, n = msgs.len(), "broadcasting: failed messages are dropped");
                }
            }
        }
        let done: Vec<i64> = offsets
            .into_iter()
            .filter(|o| !keep.iter().any(|k| k.queue_offset == *o))
            .collect();
        let commit = state.pq.lock().remove(&done);
        if let Some(c) = commit {
            if !state.is_dropped() {
                self.offsets.lock().update(&state.mq, c, true);
            }
        }
        if !keep.is_empty() {
            // Neither send-back nor the retry topic worked: consume again here in 5 s.
            let inner = self.clone();
            let state = state.clone();
            let f = match &self.listener {
                MessageListener::Concurrently(f) => f.clone(),
                MessageListener::Orderly(_) => return,
            };
            state.begin();
            tokio::spawn(async move {
                tokio::select! {
                    _ = state.cancel.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {
                        inner.spawn_concurrent(state.clone(), f, keep);
                    }
                }
                state.end();
            });
        }
    }

    fn max_reconsume(&self) -> i32 {
        self.config.max_reconsume_times.unwrap_or(16)
    }

    /// Sends a failed message back for retry: CONSUMER_SEND_MSG_BACK, else a normal send to
    /// `%RETRY%<group>`. Returns false if both failed.
    async fn send_back(&self, mq: &MessageQueue, m: &MessageExt) -> bool {
        let max = self.max_reconsume();
        match self
            .instance
            .send_back(&mq.broker_name, &self.config.group, m, 0, max)
            .await
        {
            Ok(()) => {
                self.stats.sent_back.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                warn!(queue = %mq, error = %e, "send back failed; sending to the retry topic");
                self.send_to_retry_topic(m, max, 3 + m.reconsume_times)
                    .await
            }
        }
    }

    /// A normal send to `%RETRY%<group>` (spec 6) with the retry properties.
    async fn send_to_retry_topic(&self, m: &MessageExt, max: i32, delay: i32) -> bool {
        let producer = match self
            .retry_producer
            .get_or_try_init(|| async {
                let mut cfg = crate::producer::ProducerConfig::new(
                    shoal_proto::constants::CLIENT_INNER_PRODUCER_GROUP,
                );
                cfg.client = self.config.client.clone();
                cfg.client.instance_name = None;
                Producer::start(cfg).await
            })
            .await
        {
            Ok(p) => p,
            Err(e) => {
                warn!(error = %e, "retry producer failed to start");
                return false;
            }
        };
        let mut msg = Message::new(retry_topic(&self.config.group), m.body.clone());
        msg.flag = m.flag;
        msg.properties = m.properties.clone();
        let origin_topic = m
            .property(property::RETRY_TOPIC)
            .map(str::to_owned)
            .unwrap_or_else(|| m.topic.clone());
        let origin_id = m
            .property(property::ORIGIN_MESSAGE_ID)
            .map(str::to_owned)
            .unwrap_or_else(|| m.msg_id().into_owned());
        msg.remove_property(property::TRAN_MSG);
        let ok = msg
            .put_property(property::RETRY_TOPIC, origin_topic)
            .is_ok()
            && msg
                .put_property(property::ORIGIN_MESSAGE_ID, origin_id)
                .is_ok()
            && msg
                .put_property(
                    property::RECONSUME_TIME,
                    (m.reconsume_times + 1).to_string(),
                )
                .is_ok()
            && msg
                .put_property(property::MAX_RECONSUME_TIMES, max.to_string())
                .is_ok()
            && (delay <= 0 || msg.set_delay_level(delay).is_ok());
        if !ok {
            return false;
        }
        match producer.send(msg).await {
            Ok(_) => {
                self.stats.sent_back.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                warn!(error = %e, "sending to the retry topic failed");
                false
            }
        }
    }

    fn spawn_orderly_loop(self: &Arc<Self>, state: Arc<QueueState>) {
        let MessageListener::Orderly(f) = &self.listener else {
            return;
        };
        let f = f.clone();
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = state.cancel.cancelled() => return,
                    _ = state.wake.notified() => {}
                }
                let Some(inner) = weak.upgrade() else { return };
                inner.consume_orderly(&state, &f).await;
            }
        });
    }

    fn may_consume_orderly(&self, pq: &ProcessQueue<MessageExt>) -> bool {
        if pq.dropped {
            return false;
        }
        if !self.clustering() {
            return true;
        }
        pq.locked && crate::now_ms_u64().saturating_sub(pq.last_lock_ms) < LOCK_EXPIRE_MS
    }

    async fn consume_orderly(self: &Arc<Self>, state: &Arc<QueueState>, f: &Arc<OrderlyFn>) {
        loop {
            let batch: Vec<MessageExt> = {
                let mut pq = state.pq.lock();
                if !self.may_consume_orderly(&pq) {
                    return;
                }
                let taken: Vec<MessageExt> = pq
                    .take(self.config.consume_batch_size)
                    .into_iter()
                    .map(|c| c.message.clone())
                    .collect();
                if taken.is_empty() {
                    return;
                }
                pq.consuming_now = true;
                taken
            };
            state.begin();
            let suspends: Vec<i32> = {
                let s = state.suspends.lock();
                batch
                    .iter()
                    .map(|m| s.get(&m.queue_offset).copied().unwrap_or(0))
                    .collect()
            };
            let for_listener: Vec<MessageExt> = batch
                .iter()
                .cloned()
                .zip(&suspends)
                .map(|(mut m, n)| {
                    m.reconsume_times += n;
                    self.for_listener(m)
                })
                .collect();
            let ctx = ConsumeContext {
                message_queue: state.mq.clone(),
            };
            let f2 = f.clone();
            let status = tokio::task::spawn_blocking(move || f2(&for_listener, &ctx))
                .await
                .unwrap_or(ConsumeOrderlyStatus::SuspendCurrentQueueAMoment);
            let mut suspend = false;
            match status {
                ConsumeOrderlyStatus::Success => {
                    self.stats
                        .consumed_ok
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    self.commit_orderly(state, &batch);
                }
                ConsumeOrderlyStatus::SuspendCurrentQueueAMoment => {
                    self.stats
                        .consumed_failed
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    let exceeded = self.config.max_reconsume_times.is_some_and(|max| {
                        batch
                            .iter()
                            .zip(&suspends)
                            .all(|(m, n)| m.reconsume_times + n + 1 > max)
                    });
                    if exceeded && self.clustering() {
                        // Past max reconsume times: to the retry topic (the broker diverts to
                        // the DLQ), then move on.
                        let max = self.max_reconsume();
                        let mut all_sent = true;
                        for (m, n) in batch.iter().zip(&suspends) {
                            let mut m = m.clone();
                            m.reconsume_times += n;
                            all_sent &= self.send_to_retry_topic(&m, max, 0).await;
                        }
                        if all_sent {
                            self.commit_orderly(state, &batch);
                        } else {
                            state.pq.lock().return_taken();
                            suspend = true;
                        }
                    } else {
                        {
                            let mut s = state.suspends.lock();
                            for m in &batch {
                                *s.entry(m.queue_offset).or_insert(0) += 1;
                            }
                        }
                        state.pq.lock().return_taken();
                        suspend = true;
                    }
                }
            }
            state.pq.lock().consuming_now = false;
            state.end();
            if suspend {
                tokio::select! {
                    _ = state.cancel.cancelled() => return,
                    _ = tokio::time::sleep(self.config.suspend_current_queue_time) => {}
                }
            }
        }
    }

    fn commit_orderly(&self, state: &QueueState, batch: &[MessageExt]) {
        let commit = state.pq.lock().commit_taken();
        {
            let mut s = state.suspends.lock();
            for m in batch {
                s.remove(&m.queue_offset);
            }
        }
        if let Some(c) = commit {
            if !state.is_dropped() {
                self.offsets.lock().update(&state.mq, c, true);
            }
        }
    }

    async fn reset_offsets(self: Arc<Self>, topic: String, offsets: BTreeMap<MessageQueue, i64>) {
        let _guard = self.rebalance_lock.lock().await;
        let owned: Vec<Arc<QueueState>> = self
            .table
            .lock()
            .values()
            .filter(|s| s.mq.topic == topic)
            .cloned()
            .collect();
        for s in owned {
            let Some(off) = offsets.get(&s.mq).copied() else {
                continue;
            };
            // Drop without committing the old position, then store the new one.
            self.release_queue(s.clone(), false).await;
            self.offsets.lock().update(&s.mq, off, false);
            if self.clustering() {
                if let Err(e) = self
                    .instance
                    .update_consumer_offset(&self.config.group, &s.mq, off)
                    .await
                {
                    warn!(queue = %s.mq, error = %e, "reset offset commit failed");
                }
                self.offsets.lock().remove(&s.mq);
            }
        }
        drop(_guard);
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.rebalance_wake.notify_one();
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
        self.membership.is_some()
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
        self.rebalance_now();
        // The notice may be about the topic's queues: refresh the routes too; a changed route
        // triggers one more rebalance (`store_route`).
        let instance = self.instance.clone();
        let topics: Vec<String> = self
            .subs
            .keys()
            .filter(|t| !is_retry_topic(t))
            .cloned()
            .collect();
        tokio::spawn(async move {
            for t in topics {
                if let Err(e) = instance.update_route(&t).await {
                    debug!(topic = %t, error = %e, "route refresh after a notification failed");
                }
            }
        });
    }

    fn rebalance_now(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.rebalance_wake.notify_one();
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
        p.insert("allocateMessageQueueStrategy".into(), self.strategy.name());
        info.subscription_set = self.subs.values().cloned().collect();
        for t in self.subs.keys() {
            info.status_table
                .insert(t.clone(), ConsumeStatus::default());
        }
        info
    }

    fn reset_offset(&self, topic: &str, offsets: BTreeMap<MessageQueue, i64>) {
        if let Some(me) = self.me.upgrade() {
            tokio::spawn(me.reset_offsets(topic.to_owned(), offsets));
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

    #[test]
    fn builder_sets_what_it_says() {
        let b = PushConsumer::builder("G")
            .namesrv("10.0.0.1:9876;10.0.0.2:9876")
            .subscribe("T", "a || b")
            .subscribe("U", "*")
            .message_model(MessageModel::Broadcasting)
            .consume_from_where(ConsumeFromWhere::ConsumeFromTimestamp)
            .consume_timestamp_ms(42)
            .allocate_strategy("BALANCED_STICKY")
            .consume_thread_max(3)
            .consume_batch_size(4)
            .pull_batch_size(5)
            .max_reconsume_times(6)
            .rebalance_interval(Duration::from_secs(7))
            .lock_interval(Duration::from_secs(8))
            .suspend_current_queue_time(Duration::from_millis(9))
            .configure(|c| c.drop_wait = Duration::from_millis(10));
        let c = b.config();
        assert_eq!(
            c.client.namesrv_addrs,
            vec!["10.0.0.1:9876", "10.0.0.2:9876"]
        );
        assert_eq!(c.subscriptions.get("T").map(String::as_str), Some("a || b"));
        assert_eq!(c.subscriptions.len(), 2);
        assert_eq!(c.message_model, MessageModel::Broadcasting);
        assert_eq!(c.consume_from_where, ConsumeFromWhere::ConsumeFromTimestamp);
        assert_eq!(c.consume_timestamp_ms, 42);
        assert_eq!(c.allocate_strategy, "BALANCED_STICKY");
        assert_eq!(
            (
                c.consume_thread_max,
                c.consume_batch_size,
                c.pull_batch_size
            ),
            (3, 4, 5)
        );
        assert_eq!(c.max_reconsume_times, Some(6));
        assert_eq!(c.rebalance_interval, Duration::from_secs(7));
        assert_eq!(c.lock_interval, Duration::from_secs(8));
        assert_eq!(c.suspend_current_queue_time, Duration::from_millis(9));
        assert_eq!(c.drop_wait, Duration::from_millis(10));
    }

    #[test]
    fn defaults_are_rocketmqs() {
        let c = ConsumerConfig::new("G");
        assert_eq!(c.rebalance_interval, Duration::from_secs(20));
        assert_eq!(c.lock_interval, Duration::from_secs(20));
        assert_eq!(c.client.heartbeat_interval, Duration::from_secs(30));
        assert_eq!(c.client.poll_namesrv_interval, Duration::from_secs(30));
        assert_eq!(c.client.persist_offset_interval, Duration::from_secs(5));
        assert_eq!(c.pull_batch_size, 32);
        assert_eq!(c.consume_thread_max, 20);
        assert_eq!(c.consume_concurrently_max_span, 2000);
        assert_eq!(c.pull_suspend_ms, 15_000);
        assert_eq!(c.message_model, MessageModel::Clustering);
        assert_eq!(c.allocate_strategy, "AVG");
    }

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

    #[test]
    fn listener_kinds() {
        let c = MessageListener::concurrently(|_, _| ConsumeConcurrentlyStatus::ConsumeSuccess);
        let o = MessageListener::orderly(|_, _| ConsumeOrderlyStatus::Success);
        assert!(!c.is_orderly());
        assert!(o.is_orderly());
        assert_eq!(format!("{o:?}"), "MessageListener::Orderly");
    }
}
