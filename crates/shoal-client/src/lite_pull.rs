//! [`LitePullConsumer`]: RocketMQ's `DefaultLitePullConsumer` — `subscribe` (queues assigned by
//! the classic rebalance, as the push consumer) or `assign` (queues chosen by the
//! application), then [`LitePullConsumer::poll`] for batches; auto commit (every
//! `auto_commit_interval`) or manual [`LitePullConsumer::commit_sync`]; seeks by offset, to the
//! beginning, the end or a time; pause/resume per queue.
//!
//! One pull task per assigned queue fetches ahead (LITE_PULL_MESSAGE, sysFlag
//! SUSPEND|SUBSCRIPTION|LITE_PULL) into a bounded buffer; `poll` takes from it. A seek or a
//! pause bumps the queue's epoch so that batches fetched before it are discarded.
//!
//! With `subscribe`, queues come from the same rebalance driver as the push consumer's
//! ([`crate::rebalance`]): locked before they start, handed over after their final commit,
//! and `poll` returns a queue's messages only while its lease is valid.

use crate::config::ClientConfig;
use crate::coordinated::{new_member_id, GroupProtocol, MemberMode, Membership};
use crate::error::{ClientError, Result};
use crate::instance::{ClientInstance, ConsumerHandle, PullArgs, PullStatus, PULL_RPC_TIMEOUT};
use crate::rebalance::{DriverConfig, DriverHandle, QueueRuntime};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use shoal_group::{strategy_by_name, AllocateStrategy};
use shoal_proto::body::{
    ConsumeFromWhere, ConsumeMessageDirectlyResult, ConsumeResult, ConsumeType, ConsumerData,
    ConsumerRunningInfo, MessageModel, ProcessQueueInfo, SubscriptionData,
};
use shoal_proto::code::request_code as rc;
use shoal_proto::constants::pull_sys_flag;
use shoal_proto::message::MessageExt;
use shoal_proto::MessageQueue;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Lite pull consumer settings (RocketMQ defaults).
#[derive(Debug, Clone)]
pub struct LitePullConfig {
    /// Consumer group.
    pub group: String,
    /// Name servers, identity, timers.
    pub client: ClientConfig,
    /// Where a group without a stored offset starts (last offset by default).
    pub consume_from_where: ConsumeFromWhere,
    /// Timestamp for `ConsumeFromTimestamp`, ms (default 30 minutes before start).
    pub consume_timestamp_ms: i64,
    /// Allocation strategy for `subscribe`. `None` (the default): `AVG` in classic mode, the
    /// coordinator's default assignor in coordinated mode (as
    /// [`ConsumerConfig::allocate_strategy`](crate::consumer::ConsumerConfig::allocate_strategy)).
    pub allocate_strategy: Option<String>,
    /// Commit automatically (true).
    pub auto_commit: bool,
    /// Auto commit period (5 s).
    pub auto_commit_interval: Duration,
    /// Messages per pull (`pullBatchSize`, 10).
    pub pull_batch_size: i32,
    /// Batches buffered ahead of `poll` for all queues together (64).
    pub buffered_batches: usize,
    /// Long-polling hold asked of the broker, ms (20000).
    pub pull_suspend_ms: i64,
    /// Wait after a failed pull (1 s).
    pub pull_delay_on_error: Duration,
    /// Safety-net rebalance period (20 s).
    pub rebalance_interval: Duration,
    /// Subscribe mode: session timeout announced to Shoal brokers (10 s; the lease of the
    /// queue locks).
    pub session_timeout: Duration,
    /// Subscribe mode: heartbeats to Shoal brokers renewing the leases (3 s).
    pub session_heartbeat_interval: Duration,
    /// Subscribe mode: lock renewal against Apache RocketMQ brokers (20 s).
    pub lock_interval: Duration,
    /// Subscribe mode: group protocol (`Auto`: coordinated where the broker coordinates the
    /// group, classic otherwise; see [`GroupProtocol`]).
    pub protocol: GroupProtocol,
    /// Subscribe mode, coordinated: a stable instance id (static membership).
    pub instance_id: Option<String>,
}

impl LitePullConfig {
    /// Defaults for a group.
    pub fn new(group: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            client: ClientConfig::default(),
            consume_from_where: ConsumeFromWhere::ConsumeFromLastOffset,
            consume_timestamp_ms: crate::now_ms_u64() as i64 - 30 * 60 * 1000,
            allocate_strategy: None,
            auto_commit: true,
            auto_commit_interval: Duration::from_secs(5),
            pull_batch_size: 10,
            buffered_batches: 64,
            pull_suspend_ms: 20_000,
            pull_delay_on_error: Duration::from_secs(1),
            rebalance_interval: Duration::from_secs(20),
            session_timeout: Duration::from_secs(10),
            session_heartbeat_interval: Duration::from_secs(3),
            lock_interval: Duration::from_secs(20),
            protocol: GroupProtocol::Auto,
            instance_id: None,
        }
    }
}

/// Per-queue state.
struct QueueSlot {
    /// Bumped by seeks and pauses: batches of older epochs are dropped.
    epoch: u64,
    /// Next offset the pull task asks for.
    pull_offset: i64,
    /// Next offset to consume (one past the last message `poll` returned).
    consumed: i64,
    /// Last committed offset.
    committed: Option<i64>,
    paused: bool,
    cancel: CancellationToken,
    last_pull_ms: u64,
    /// Subscribe mode: `poll` returns messages only before this time.
    lease_until: Option<Instant>,
}

impl QueueSlot {
    fn lease_valid(&self) -> bool {
        self.lease_until.is_none_or(|u| Instant::now() < u)
    }
}

struct Batch {
    mq: MessageQueue,
    epoch: u64,
    messages: Vec<MessageExt>,
}

struct Inner {
    config: LitePullConfig,
    instance: ClientInstance,
    strategy: Arc<dyn AllocateStrategy>,
    driver_cfg: DriverConfig,
    /// Subscribe mode: the rebalance driver (started by the first `subscribe`).
    driver: OnceLock<DriverHandle>,
    me: Weak<Inner>,
    /// Subscriptions (subscribe mode); empty in assign mode.
    subs: Mutex<BTreeMap<String, SubscriptionData>>,
    assigned_mode: Mutex<bool>,
    slots: Mutex<HashMap<MessageQueue, QueueSlot>>,
    tx: mpsc::Sender<Batch>,
    rx: tokio::sync::Mutex<mpsc::Receiver<Batch>>,
    wake_pullers: Notify,
    token: CancellationToken,
    last_auto_commit: Mutex<Instant>,
}

/// A started lite pull consumer. Cheap to clone.
#[derive(Clone)]
pub struct LitePullConsumer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LitePullConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LitePullConsumer")
            .field("group", &self.inner.config.group)
            .field("client_id", &self.inner.instance.client_id())
            .finish()
    }
}

impl LitePullConsumer {
    /// Starts a consumer with no queues; then [`subscribe`](Self::subscribe) or
    /// [`assign`](Self::assign).
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] for a bad configuration or unknown strategy.
    pub async fn start(config: LitePullConfig) -> Result<LitePullConsumer> {
        if config.group.is_empty() {
            return Err(ClientError::InvalidArgument(
                "consumer group is empty".into(),
            ));
        }
        if config.pull_batch_size <= 0 || config.buffered_batches == 0 {
            return Err(ClientError::InvalidArgument(
                "pull_batch_size and buffered_batches must be positive".into(),
            ));
        }
        let strategy: Arc<dyn AllocateStrategy> = Arc::from(strategy_by_name(
            config
                .allocate_strategy
                .as_deref()
                .unwrap_or(crate::consumer::CLASSIC_DEFAULT_STRATEGY),
        )?);
        let instance = ClientInstance::start(config.client.clone())?;
        let (tx, rx) = mpsc::channel(config.buffered_batches);
        let driver_cfg = DriverConfig {
            group: config.group.clone(),
            clustering: true,
            orderly: false,
            from_where: config.consume_from_where,
            from_timestamp_ms: config.consume_timestamp_ms,
            refresh_interval: config.rebalance_interval,
            session_timeout: config.session_timeout,
            session_heartbeat: config.session_heartbeat_interval,
            rocketmq_lock_lease: Duration::from_millis(crate::consumer::LOCK_EXPIRE_MS),
            rocketmq_lock_renew: config.lock_interval,
            membership: (config.protocol != GroupProtocol::Classic).then(|| {
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
            }),
        };
        let inner = Arc::new_cyclic(|me| Inner {
            token: instance.shutdown_token().child_token(),
            instance,
            strategy,
            driver_cfg,
            driver: OnceLock::new(),
            me: me.clone(),
            subs: Mutex::new(BTreeMap::new()),
            assigned_mode: Mutex::new(false),
            slots: Mutex::new(HashMap::new()),
            tx,
            rx: tokio::sync::Mutex::new(rx),
            wake_pullers: Notify::new(),
            last_auto_commit: Mutex::new(Instant::now()),
            config,
        });
        let handle: Arc<dyn ConsumerHandle> = inner.clone();
        inner
            .instance
            .register_consumer(&inner.config.group, Arc::downgrade(&handle));
        // The offset persister.
        let weak = Arc::downgrade(&inner);
        let token = inner.token.clone();
        let period = inner.config.client.persist_offset_interval;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(period) => {}
                }
                let Some(inner) = weak.upgrade() else { return };
                if inner.config.auto_commit {
                    inner.commit_all(false).await;
                }
            }
        });
        Ok(LitePullConsumer { inner })
    }

    /// The client id.
    pub fn client_id(&self) -> &str {
        self.inner.instance.client_id()
    }

    /// Subscribes a topic with a tag expression; queues come from the rebalance.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] after [`assign`](Self::assign) or for a bad topic.
    pub async fn subscribe(&self, topic: &str, expression: &str) -> Result<()> {
        crate::producer::validate_topic(topic)?;
        if *self.inner.assigned_mode.lock() {
            return Err(ClientError::InvalidArgument(
                "subscribe and assign cannot be mixed".into(),
            ));
        }
        self.inner.subs.lock().insert(
            topic.to_owned(),
            SubscriptionData::from_tag_expression(topic, expression, crate::now_ms_u64() as i64),
        );
        self.inner.instance.update_route(topic).await?;
        let inner = &self.inner;
        let mut first = false;
        let driver = inner.driver.get_or_init(|| {
            first = true;
            crate::rebalance::spawn(
                inner.driver_cfg.clone(),
                inner.strategy.clone(),
                inner.instance.clone(),
                Arc::new(Runtime(inner.me.clone())),
                inner.token.clone(),
            )
        });
        if let Some(m) = driver.membership() {
            // Coordinated first (with the new subscription), so the classic heartbeat below
            // finds the member known.
            let topics: Vec<String> = inner.subs.lock().keys().cloned().collect();
            driver.member_heartbeat(&topics).await;
            if m.protocol() == GroupProtocol::Coordinated && m.mode() == MemberMode::Unsupported {
                inner.subs.lock().remove(topic);
                return Err(ClientError::InvalidArgument(
                    "protocol = coordinated, but the broker does not coordinate groups (an Apache RocketMQ broker?)".into(),
                ));
            }
            if first {
                driver.spawn_membership(inner.token.clone());
            }
        }
        // The broker must know us (with our session) before our first view.
        inner.instance.heartbeat_all().await;
        driver.subscribe(topic);
        Ok(())
    }

    /// Assigns queues directly (no rebalance, no group membership effects).
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] after [`subscribe`](Self::subscribe).
    pub async fn assign(&self, queues: Vec<MessageQueue>) -> Result<()> {
        if !self.inner.subs.lock().is_empty() {
            return Err(ClientError::InvalidArgument(
                "subscribe and assign cannot be mixed".into(),
            ));
        }
        *self.inner.assigned_mode.lock() = true;
        let want: BTreeSet<MessageQueue> = queues.into_iter().collect();
        for t in want
            .iter()
            .map(|q| q.topic.clone())
            .collect::<BTreeSet<_>>()
        {
            self.inner.instance.update_route(&t).await?;
        }
        self.inner.apply(want).await;
        Ok(())
    }

    /// The queues assigned now, sorted.
    pub fn assignment(&self) -> Vec<MessageQueue> {
        let mut v: Vec<MessageQueue> = self.inner.slots.lock().keys().cloned().collect();
        v.sort();
        v
    }

    /// Waits up to `timeout` for messages and returns one batch (possibly empty). With auto
    /// commit, offsets of earlier polls are committed every `auto_commit_interval`.
    pub async fn poll(&self, timeout: Duration) -> Vec<MessageExt> {
        let deadline = tokio::time::Instant::now() + timeout;
        if self.inner.config.auto_commit {
            let due = self.inner.last_auto_commit.lock().elapsed()
                >= self.inner.config.auto_commit_interval;
            if due {
                *self.inner.last_auto_commit.lock() = Instant::now();
                self.inner.commit_all(false).await;
            }
        }
        let mut rx = self.inner.rx.lock().await;
        loop {
            let batch = match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(b)) => b,
                Ok(None) | Err(_) => return Vec::new(),
            };
            let mut slots = self.inner.slots.lock();
            let Some(slot) = slots.get_mut(&batch.mq) else {
                continue;
            };
            if slot.epoch != batch.epoch || slot.paused || !slot.lease_valid() {
                // Fenced: a queue past its lease hands nothing to the application.
                continue;
            }
            let msgs: Vec<MessageExt> = batch
                .messages
                .into_iter()
                .filter(|m| m.queue_offset >= slot.consumed)
                .collect();
            if let Some(last) = msgs.last() {
                slot.consumed = last.queue_offset + 1;
                return msgs;
            }
        }
    }

    /// Commits the consumed offsets of every assigned queue now and waits for the brokers.
    pub async fn commit_sync(&self) {
        self.inner.commit_all(true).await;
    }

    /// Commits given offsets (next offset to consume per queue) and waits for the brokers.
    ///
    /// # Errors
    /// The first failed commit.
    pub async fn commit(&self, offsets: &BTreeMap<MessageQueue, i64>) -> Result<()> {
        for (mq, off) in offsets {
            // An explicit commit may move an offset back on purpose.
            self.inner
                .instance
                .rewind_consumer_offset(&self.inner.config.group, mq, *off)
                .await?;
            if let Some(s) = self.inner.slots.lock().get_mut(mq) {
                s.committed = Some(*off);
            }
        }
        Ok(())
    }

    /// The committed offset of a queue as the broker has it (`None` if none).
    ///
    /// # Errors
    /// Transport errors.
    pub async fn committed(&self, mq: &MessageQueue) -> Result<Option<i64>> {
        self.inner
            .instance
            .query_consumer_offset(&self.inner.config.group, mq)
            .await
    }

    /// Moves an assigned queue to `offset`: the next poll returns messages from there.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] if the queue is not assigned or the offset is outside
    /// `[min, max]`.
    pub async fn seek(&self, mq: &MessageQueue, offset: i64) -> Result<()> {
        let (min, max) = (
            self.inner.instance.min_offset(mq).await?,
            self.inner.instance.max_offset(mq).await?,
        );
        if offset < min || offset > max {
            return Err(ClientError::InvalidArgument(format!(
                "offset {offset} of {mq} is outside [{min}, {max}]"
            )));
        }
        let mut slots = self.inner.slots.lock();
        let slot = slots
            .get_mut(mq)
            .ok_or_else(|| ClientError::InvalidArgument(format!("{mq} is not assigned")))?;
        slot.epoch += 1;
        slot.pull_offset = offset;
        slot.consumed = offset;
        drop(slots);
        self.inner.wake_pullers.notify_waiters();
        Ok(())
    }

    /// Seeks to the queue's first offset.
    ///
    /// # Errors
    /// As [`seek`](Self::seek).
    pub async fn seek_to_begin(&self, mq: &MessageQueue) -> Result<()> {
        let min = self.inner.instance.min_offset(mq).await?;
        self.seek(mq, min).await
    }

    /// Seeks past the queue's last message.
    ///
    /// # Errors
    /// As [`seek`](Self::seek).
    pub async fn seek_to_end(&self, mq: &MessageQueue) -> Result<()> {
        let max = self.inner.instance.max_offset(mq).await?;
        self.seek(mq, max).await
    }

    /// The first offset stored at or after `timestamp_ms`.
    ///
    /// # Errors
    /// Transport errors.
    pub async fn offset_for_timestamp(&self, mq: &MessageQueue, timestamp_ms: i64) -> Result<i64> {
        self.inner.instance.search_offset(mq, timestamp_ms).await
    }

    /// Seeks to the first message stored at or after `timestamp_ms`.
    ///
    /// # Errors
    /// As [`seek`](Self::seek).
    pub async fn seek_to_time(&self, mq: &MessageQueue, timestamp_ms: i64) -> Result<()> {
        let off = self.offset_for_timestamp(mq, timestamp_ms).await?;
        self.seek(mq, off).await
    }

    /// Stops returning (and fetching) messages of these queues until [`resume`](Self::resume).
    pub fn pause(&self, queues: &[MessageQueue]) {
        let mut slots = self.inner.slots.lock();
        for mq in queues {
            if let Some(s) = slots.get_mut(mq) {
                s.paused = true;
                s.epoch += 1;
                s.pull_offset = s.consumed;
            }
        }
    }

    /// Resumes paused queues from where `poll` left them.
    pub fn resume(&self, queues: &[MessageQueue]) {
        {
            let mut slots = self.inner.slots.lock();
            for mq in queues {
                if let Some(s) = slots.get_mut(mq) {
                    s.paused = false;
                }
            }
        }
        self.inner.wake_pullers.notify_waiters();
    }

    /// Commits (with auto commit), releases the queues (and their locks, in subscribe mode),
    /// unregisters, stops the instance.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        match inner.driver.get() {
            Some(d) => d.shutdown(Duration::from_secs(10)).await,
            None => inner.apply(BTreeSet::new()).await,
        }
        inner.token.cancel();
        inner
            .instance
            .unregister_client(None, Some(&inner.config.group))
            .await;
        inner
            .instance
            .unregister_consumer_local(&inner.config.group);
        inner.instance.shutdown();
    }
}

impl Inner {
    /// Assign mode: makes the assigned set `want`: releases the others (committing), starts the
    /// new ones (no locks: the application chose the queues).
    async fn apply(self: &Arc<Self>, want: BTreeSet<MessageQueue>) {
        let lost: Vec<(MessageQueue, QueueSlot)> = {
            let mut slots = self.slots.lock();
            let gone: Vec<MessageQueue> = slots
                .keys()
                .filter(|q| !want.contains(q))
                .cloned()
                .collect();
            gone.into_iter()
                .filter_map(|q| slots.remove(&q).map(|s| (q, s)))
                .collect()
        };
        for (mq, slot) in lost {
            slot.cancel.cancel();
            if self.config.auto_commit && slot.committed != Some(slot.consumed) {
                if let Err(e) = self
                    .instance
                    .update_consumer_offset(&self.config.group, &mq, slot.consumed)
                    .await
                {
                    warn!(queue = %mq, error = %e, "final commit failed");
                }
            }
        }
        let have: BTreeSet<MessageQueue> = self.slots.lock().keys().cloned().collect();
        for mq in want.difference(&have) {
            let start =
                match crate::rebalance::start_offset(&self.instance, &self.driver_cfg, mq, None)
                    .await
                {
                    Ok(o) => o.offset(),
                    Err(e) => {
                        warn!(queue = %mq, error = %e, "no start offset; retry at next rebalance");
                        continue;
                    }
                };
            self.start_slot(mq.clone(), start, None);
        }
    }

    fn start_slot(self: &Arc<Self>, mq: MessageQueue, start: i64, lease_until: Option<Instant>) {
        let cancel = self.token.child_token();
        self.slots.lock().insert(
            mq.clone(),
            QueueSlot {
                epoch: 0,
                pull_offset: start,
                consumed: start,
                committed: None,
                paused: false,
                cancel: cancel.clone(),
                last_pull_ms: 0,
                lease_until,
            },
        );
        self.spawn_puller(mq, cancel);
    }

    fn spawn_puller(self: &Arc<Self>, mq: MessageQueue, cancel: CancellationToken) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                if cancel.is_cancelled() {
                    return;
                }
                let Some(inner) = weak.upgrade() else { return };
                let snapshot = inner
                    .slots
                    .lock()
                    .get(&mq)
                    .map(|s| (s.paused, s.epoch, s.pull_offset));
                let Some((paused, epoch, offset)) = snapshot else {
                    return;
                };
                if paused {
                    let wake = inner.wake_pullers.notified();
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = wake => {}
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                    continue;
                }
                let expr = inner
                    .subs
                    .lock()
                    .get(&mq.topic)
                    .map_or_else(|| "*".to_owned(), |s| s.sub_string.clone());
                let args = PullArgs {
                    code: rc::LITE_PULL_MESSAGE,
                    group: &inner.config.group,
                    mq: &mq,
                    offset,
                    max_msgs: inner.config.pull_batch_size,
                    sys_flag: pull_sys_flag::SUSPEND
                        | pull_sys_flag::SUBSCRIPTION
                        | pull_sys_flag::LITE_PULL,
                    commit_offset: 0,
                    suspend_ms: inner.config.pull_suspend_ms,
                    subscription: Some(&expr),
                    sub_version: 0,
                    expression_type: "TAG",
                    timeout: PULL_RPC_TIMEOUT,
                };
                let wake = inner.wake_pullers.notified();
                let result = tokio::select! {
                    _ = cancel.cancelled() => return,
                    // A seek or resume restarts the pull at the new position.
                    _ = wake => continue,
                    r = inner.instance.pull(args) => r,
                };
                if let Some(s) = inner.slots.lock().get_mut(&mq) {
                    s.last_pull_ms = crate::now_ms_u64();
                }
                let r = match result {
                    Ok(r) => r,
                    Err(e) => {
                        debug!(queue = %mq, error = %e, "lite pull failed");
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            _ = tokio::time::sleep(inner.config.pull_delay_on_error) => {}
                        }
                        continue;
                    }
                };
                let sub = inner.subs.lock().get(&mq.topic).cloned();
                let messages: Vec<MessageExt> = if r.status == PullStatus::Found {
                    r.messages
                        .into_iter()
                        .filter(|m| sub.as_ref().is_none_or(|s| s.matches_tags(m.tags())))
                        .collect()
                } else {
                    Vec::new()
                };
                {
                    let mut slots = inner.slots.lock();
                    let Some(s) = slots.get_mut(&mq) else { return };
                    if s.epoch != epoch {
                        continue;
                    }
                    s.pull_offset = r.next_begin_offset;
                    if messages.is_empty() && s.consumed == offset {
                        // Filtered or moved: nothing to hand out, the consumed offset follows.
                        s.consumed = r.next_begin_offset;
                    }
                }
                if !messages.is_empty() {
                    let batch = Batch {
                        mq: mq.clone(),
                        epoch,
                        messages,
                    };
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        sent = inner.tx.send(batch) => if sent.is_err() { return },
                    }
                }
            }
        });
    }

    async fn commit_all(&self, wait: bool) {
        let todo: Vec<(MessageQueue, i64)> = self
            .slots
            .lock()
            .iter()
            .filter(|(_, s)| s.committed != Some(s.consumed) && s.lease_valid())
            .map(|(q, s)| (q.clone(), s.consumed))
            .collect();
        for (mq, off) in todo {
            let r = if wait {
                self.instance
                    .update_consumer_offset(&self.config.group, &mq, off)
                    .await
            } else {
                self.instance
                    .update_consumer_offset_oneway(&self.config.group, &mq, off)
                    .await
            };
            match r {
                Ok(()) => {
                    if let Some(s) = self.slots.lock().get_mut(&mq) {
                        s.committed = Some(off);
                    }
                }
                Err(e) => debug!(queue = %mq, error = %e, "commit failed"),
            }
        }
    }
}

/// The driver's view of the lite pull consumer (weak: the consumer owns the driver).
struct Runtime(Weak<Inner>);

impl QueueRuntime for Runtime {
    fn start(&self, mq: MessageQueue, offset: i64, lease_until: Option<Instant>) {
        if let Some(inner) = self.0.upgrade() {
            inner.start_slot(mq, offset, lease_until);
        }
    }

    fn set_lease(&self, mq: &MessageQueue, until: Instant) {
        if let Some(inner) = self.0.upgrade() {
            if let Some(s) = inner.slots.lock().get_mut(mq) {
                s.lease_until = Some(until);
            }
        }
    }

    fn stop(&self, mq: MessageQueue, fence: bool) -> BoxFuture<'static, Option<i64>> {
        let weak = self.0.clone();
        Box::pin(async move {
            let inner = weak.upgrade()?;
            let slot = inner.slots.lock().remove(&mq)?;
            slot.cancel.cancel();
            // What `poll` handed out is consumed: with auto commit it is committed at the
            // hand-over; with manual commits only what the application committed stands.
            (!fence && inner.config.auto_commit).then_some(slot.consumed)
        })
    }

    fn commit(&self, mq: MessageQueue, offset: i64, rewind: bool) -> BoxFuture<'static, bool> {
        let weak = self.0.clone();
        Box::pin(async move {
            let Some(inner) = weak.upgrade() else {
                return false;
            };
            let g = &inner.config.group;
            let r = if rewind {
                inner.instance.rewind_consumer_offset(g, &mq, offset).await
            } else {
                inner.instance.update_consumer_offset(g, &mq, offset).await
            };
            if let Err(e) = &r {
                warn!(queue = %mq, error = %e, "final commit failed");
            }
            r.is_ok()
        })
    }

    fn local_offset(&self, _mq: &MessageQueue) -> Option<i64> {
        None
    }
}

impl ConsumerHandle for Inner {
    fn consumer_data(&self) -> ConsumerData {
        ConsumerData {
            consume_from_where: self.config.consume_from_where,
            consume_type: ConsumeType::ConsumeActively,
            group_name: self.config.group.clone(),
            message_model: MessageModel::Clustering,
            subscription_data_set: self.subs.lock().values().cloned().collect(),
            unit_mode: false,
        }
    }

    fn subscribed_topics(&self) -> Vec<String> {
        self.subs.lock().keys().cloned().collect()
    }

    fn rebalance_now(&self) {
        if let Some(d) = self.driver.get() {
            d.notice();
        }
    }

    fn route_changed(&self) {
        if let Some(d) = self.driver.get() {
            d.member_wake();
            d.notice();
        }
    }

    fn lock_freed(&self, queues: Vec<MessageQueue>) {
        if let Some(d) = self.driver.get() {
            d.lock_freed(queues);
        }
    }

    fn speaks_coordinated(&self) -> bool {
        // Not once the broker turned out not to coordinate (it allocates classic then).
        self.driver_cfg
            .membership
            .as_ref()
            .is_some_and(|m| m.mode() != MemberMode::Unsupported)
    }

    fn assignment_changed(&self) {
        match self.driver.get() {
            Some(d) if d.membership().is_some() => d.member_wake(),
            Some(d) => d.notice(),
            None => {}
        }
    }

    fn group_changed(&self) {
        if let Some(d) = self.driver.get() {
            // A member may have left or joined a group that runs classic: ask again.
            d.member_wake();
            // The notice may be about the topic's queues: routes first, then the rebalance.
            d.refresh_routes_then_notice();
        }
    }

    fn members_changed(&self, broker_addr: &str, notice: shoal_proto::ext::ConsumerIdsNotice) {
        if let Some(d) = self.driver.get() {
            d.member_wake();
            d.members(broker_addr, notice);
        }
    }

    fn running_info(&self) -> ConsumerRunningInfo {
        let mut info = ConsumerRunningInfo::default();
        for (mq, s) in self.slots.lock().iter() {
            info.mq_table.insert(
                mq.clone(),
                ProcessQueueInfo {
                    commit_offset: s.committed.unwrap_or(-1),
                    cached_msg_min_offset: s.consumed,
                    cached_msg_max_offset: s.pull_offset,
                    last_pull_timestamp: s.last_pull_ms as i64,
                    ..Default::default()
                },
            );
        }
        info.properties
            .insert("PROP_CONSUME_TYPE".into(), "CONSUME_ACTIVELY".into());
        info.properties
            .insert("PROP_CONSUMEORDERLY".into(), "false".into());
        info.subscription_set = self.subs.lock().values().cloned().collect();
        info
    }

    fn reset_offset(&self, topic: &str, offsets: BTreeMap<MessageQueue, i64>) {
        let mut slots = self.slots.lock();
        for (mq, off) in offsets {
            if mq.topic != topic {
                continue;
            }
            if let Some(s) = slots.get_mut(&mq) {
                s.epoch += 1;
                s.pull_offset = off;
                s.consumed = off;
                s.committed = Some(off);
            }
        }
        drop(slots);
        self.wake_pullers.notify_waiters();
    }

    fn consume_directly(
        &self,
        _msg: MessageExt,
    ) -> BoxFuture<'static, ConsumeMessageDirectlyResult> {
        Box::pin(async {
            ConsumeMessageDirectlyResult {
                auto_commit: true,
                consume_result: ConsumeResult::ReturnNull,
                order: false,
                remark: Some("a lite pull consumer has no listener to consume with".into()),
                spent_time_mills: 0,
            }
        })
    }
}
