//! Push consumer settings, listeners and the builder.

use super::PushConsumer;
use crate::config::ClientConfig;
use crate::coordinated::GroupProtocol;
use crate::error::Result;
use shoal_proto::body::{ConsumeFromWhere, MessageModel};
use shoal_proto::message::MessageExt;
use shoal_proto::MessageQueue;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

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
    /// Cancelled once the consumer stops the queue (hand-over, fence, shutdown).
    pub(crate) stopped: CancellationToken,
}

impl ConsumeContext {
    /// True once the consumer stopped this batch's queue (it was handed over, fenced, or the
    /// consumer is shutting down). The queue's lock is kept until the listener call returns;
    /// a listener holding a batch back may return then, and what it answers is not committed.
    pub fn is_queue_stopped(&self) -> bool {
        self.stopped.is_cancelled()
    }

    /// Resolves once [`ConsumeContext::is_queue_stopped`] is true.
    pub async fn queue_stopped(&self) {
        self.stopped.cancelled().await
    }
}

pub(crate) type ConcurrentlyFn =
    dyn Fn(&[MessageExt], &ConsumeContext) -> ConsumeConcurrentlyStatus + Send + Sync;
pub(crate) type OrderlyFn =
    dyn Fn(&[MessageExt], &ConsumeContext) -> ConsumeOrderlyStatus + Send + Sync;

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

    pub(crate) fn is_orderly(&self) -> bool {
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
    /// Subscriptions: topic → tag expression (`*`, `a || b`), or an SQL92 selector for the
    /// topics in `sql92_topics`.
    pub subscriptions: BTreeMap<String, String>,
    /// Topics whose expression in `subscriptions` is an SQL92 selector (RocketMQ's
    /// `MessageSelector.bySql`), evaluated by the broker.
    pub sql92_topics: BTreeSet<String>,
    /// Allocation strategy name ([`shoal_group::strategy_by_name`]). `None` (the default):
    /// RocketMQ's `AVG` in classic mode; in coordinated mode the coordinator's default
    /// assignor (`STICKY`: balanced, moving the fewest queues when members come and go). A
    /// strategy set here is used in both modes.
    pub allocate_strategy: Option<String>,
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
    /// Lock renewal period against an Apache RocketMQ broker (20 s; its locks live 60 s there,
    /// 30 s by the client's clock). Shoal brokers renew locks with the session heartbeats.
    pub lock_interval: Duration,
    /// Long-polling hold asked of the broker, ms (15000).
    pub pull_suspend_ms: i64,
    /// Wait after a failed pull (RocketMQ: 3 s).
    pub pull_delay_on_error: Duration,
    /// Retries before the DLQ (concurrent: 16; orderly: `None` = retry locally forever).
    pub max_reconsume_times: Option<i32>,
    /// Orderly: pause after `SuspendCurrentQueueAMoment` (1 s).
    pub suspend_current_queue_time: Duration,
    /// How long in-flight consumes of a lost queue (hand-over, shutdown) may run before a
    /// warning is logged (and `ConsumerStats::slow_drains` counted). It bounds nothing: the
    /// queue's lock (renewed by the session) is kept until the last listener call on the queue
    /// returned, so the next owner never starts while one runs; only a lost lease (session
    /// ended, lock taken) ends the wait early.
    pub drop_wait: Duration,
    /// Broadcasting: directory of the local offset files.
    pub offset_store_dir: PathBuf,
    /// Clustering: the session timeout announced to Shoal brokers (default 10 s): a member
    /// that sends no heartbeat for this long leaves the group, and its queue locks (its
    /// leases) last as long after its last heartbeat. Official clients keep RocketMQ's 120 s.
    pub session_timeout: Duration,
    /// Clustering: heartbeats to Shoal brokers, which renew the leases (3 s).
    pub session_heartbeat_interval: Duration,
    /// Group protocol: `Auto` (coordinated where the broker coordinates groups, classic
    /// otherwise), `Coordinated` or `Classic` (clustering only; broadcasting is always
    /// classic).
    pub protocol: GroupProtocol,
    /// Coordinated mode: a stable instance id (static membership): a restart within the
    /// session timeout gets the same queues back and moves nothing.
    pub instance_id: Option<String>,
}

/// The strategy of a classic-mode consumer that names none (RocketMQ's default).
pub const CLASSIC_DEFAULT_STRATEGY: &str = "AVG";

impl ConsumerConfig {
    /// The strategy this consumer allocates with in classic mode: the one chosen, else
    /// [`CLASSIC_DEFAULT_STRATEGY`].
    pub fn classic_strategy(&self) -> &str {
        self.allocate_strategy
            .as_deref()
            .unwrap_or(CLASSIC_DEFAULT_STRATEGY)
    }

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
            sql92_topics: BTreeSet::new(),
            allocate_strategy: None,
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
            session_timeout: Duration::from_secs(10),
            session_heartbeat_interval: Duration::from_secs(3),
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
    pub(super) fn new(group: impl Into<String>) -> Self {
        Self {
            config: ConsumerConfig::new(group),
        }
    }
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
        let topic = topic.into();
        self.config.sql92_topics.remove(&topic);
        self.config.subscriptions.insert(topic, expression.into());
        self
    }
    /// Subscribes `topic` with an SQL92 selector over message properties (RocketMQ's
    /// `MessageSelector.bySql`, e.g. `region = 'eu' AND amount > 100`). The broker evaluates it
    /// (it needs `enable_property_filter`); [`PushConsumer::start`](crate::PushConsumer::start)
    /// fails when a broker of the topic cannot serve it or the selector does not compile.
    pub fn subscribe_sql(mut self, topic: impl Into<String>, selector: impl Into<String>) -> Self {
        let topic = topic.into();
        self.config.sql92_topics.insert(topic.clone());
        self.config.subscriptions.insert(topic, selector.into());
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
    /// Allocation strategy name (see [`ConsumerConfig::allocate_strategy`]).
    pub fn allocate_strategy(mut self, name: impl Into<String>) -> Self {
        self.config.allocate_strategy = Some(name.into());
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
    /// Lock renewal period against Apache RocketMQ brokers.
    pub fn lock_interval(mut self, d: Duration) -> Self {
        self.config.lock_interval = d;
        self
    }
    /// Orderly suspend time.
    pub fn suspend_current_queue_time(mut self, d: Duration) -> Self {
        self.config.suspend_current_queue_time = d;
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
    /// Session timeout announced to Shoal brokers (lease of the queue locks).
    pub fn session_timeout(mut self, d: Duration) -> Self {
        self.config.session_timeout = d;
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
        assert_eq!(c.allocate_strategy.as_deref(), Some("BALANCED_STICKY"));
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
        assert_eq!(c.allocate_strategy, None);
        assert_eq!(c.classic_strategy(), "AVG");
        assert_eq!(c.session_timeout, Duration::from_secs(10));
        assert_eq!(c.session_heartbeat_interval, Duration::from_secs(3));
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
