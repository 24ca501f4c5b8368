//! [`Producer`]: RocketMQ's `DefaultMQProducer` — route lookup (with the `TBW102` auto-create
//! fallback), queue choice with latency fault tolerance ([`crate::fault`]), retries on another
//! broker, sync / async / oneway sends, batches, chosen queues and selectors (ordered messages).

use crate::config::ClientConfig;
use crate::error::{ClientError, Result};
use crate::fault::{FaultTable, LatencyFaultTolerance};
use crate::instance::ClientInstance;
use crate::send_header::{send_command, SendV2};
use bytes::Bytes;
use futures::future::Either;
use parking_lot::Mutex;
use shoal_proto::body::TopicRouteData;
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::constants::{is_retry_topic, AUTO_CREATE_TOPIC_KEY_TOPIC};
use shoal_proto::hash::java_string_hash;
use shoal_proto::header::SendResponseRef;
use shoal_proto::message::{
    compress_for_send, encode_batch, property, CompressionType, Message, Properties,
    UniqKeyGenerator, DEFAULT_COMPRESS_BODY_OVER, DEFAULT_COMPRESS_LEVEL, DEFAULT_MAX_MESSAGE_SIZE,
};
use shoal_proto::{MessageQueue, RemotingCommand, SerializeType};
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// How a send ended when the broker accepted the message (`SendStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendStatus {
    /// Stored.
    SendOk,
    /// Stored, but the flush to disk timed out (sync flush).
    FlushDiskTimeout,
    /// Stored, but replication to the slave timed out.
    FlushSlaveTimeout,
    /// Stored, but no slave is available.
    SlaveNotAvailable,
}

/// A successful send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendResult {
    /// How the broker answered.
    pub status: SendStatus,
    /// The message id applications see (UNIQ_KEY; comma-joined for a batch).
    pub msg_id: String,
    /// The offset message id (store host + commit-log offset; comma-joined for a batch).
    pub offset_msg_id: String,
    /// The queue the message went to.
    pub message_queue: MessageQueue,
    /// Consume-queue offset of the (first) message.
    pub queue_offset: i64,
}

/// Producer settings. Build with [`Producer::builder`].
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// Producer group.
    pub group: String,
    /// Name servers, identity, timers.
    pub client: ClientConfig,
    /// Timeout of one send, retries included (3 s).
    pub send_timeout: Duration,
    /// Extra attempts after a failed synchronous send, each on another broker when possible
    /// (`retryTimesWhenSendFailed`, 2).
    pub retries: usize,
    /// Bodies of at least this many bytes are compressed (zlib, 4096).
    pub compress_over: usize,
    /// Zlib level (5).
    pub compress_level: i32,
    /// Largest body accepted (4 MiB).
    pub max_message_size: usize,
    /// Queue count asked for when a topic is auto-created through `TBW102` (4).
    pub default_topic_queue_nums: i32,
    /// Latency fault tolerance on/off (`sendLatencyFaultEnable`).
    pub latency_fault_enabled: bool,
    /// Latency table of the fault tolerance.
    pub fault_table: FaultTable,
}

impl ProducerConfig {
    /// Defaults for a group (RocketMQ's, with latency fault tolerance on).
    pub fn new(group: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            client: ClientConfig::default(),
            send_timeout: Duration::from_secs(3),
            retries: 2,
            compress_over: DEFAULT_COMPRESS_BODY_OVER,
            compress_level: DEFAULT_COMPRESS_LEVEL,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            default_topic_queue_nums: shoal_proto::constants::DEFAULT_TOPIC_QUEUE_NUMS,
            latency_fault_enabled: true,
            fault_table: FaultTable::default(),
        }
    }
}

/// Builder of a [`Producer`].
#[derive(Debug, Clone)]
pub struct ProducerBuilder {
    config: ProducerConfig,
}

impl ProducerBuilder {
    /// Name server list (`"host:port;host:port"`).
    pub fn namesrv(mut self, addrs: &str) -> Self {
        self.config.client.namesrv_addrs = crate::config::parse_namesrv_addrs(addrs);
        self
    }
    /// Instance name (part of the client id).
    pub fn instance_name(mut self, name: impl Into<String>) -> Self {
        self.config.client.instance_name = Some(name.into());
        self
    }
    /// The whole client configuration.
    pub fn client_config(mut self, client: ClientConfig) -> Self {
        self.config.client = client;
        self
    }
    /// Send timeout.
    pub fn send_timeout(mut self, t: Duration) -> Self {
        self.config.send_timeout = t;
        self
    }
    /// Retries after a failed send.
    pub fn retries(mut self, n: usize) -> Self {
        self.config.retries = n;
        self
    }
    /// Compression threshold in bytes.
    pub fn compress_over(mut self, bytes: usize) -> Self {
        self.config.compress_over = bytes;
        self
    }
    /// Largest body accepted.
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.config.max_message_size = bytes;
        self
    }
    /// Latency fault tolerance on/off.
    pub fn latency_fault(mut self, enabled: bool) -> Self {
        self.config.latency_fault_enabled = enabled;
        self
    }
    /// Latency fault table.
    pub fn fault_table(mut self, table: FaultTable) -> Self {
        self.config.fault_table = table;
        self
    }
    /// The configuration built so far.
    pub fn config(&self) -> &ProducerConfig {
        &self.config
    }
    /// Starts the producer (client instance, timers). Needs a tokio runtime.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] for a bad configuration.
    pub async fn start(self) -> Result<Producer> {
        Producer::start(self.config).await
    }
}

struct Inner {
    config: ProducerConfig,
    instance: ClientInstance,
    fault: Mutex<LatencyFaultTolerance>,
    uniq: UniqKeyGenerator,
    metrics: crate::metrics::ProducerMetrics,
}

impl crate::instance::ProducerHandle for Inner {
    fn broker_appeared(&self, broker: &str) {
        self.fault.lock().forget(broker);
    }
}

/// A started producer. Cheap to clone; clones share the instance.
#[derive(Clone)]
pub struct Producer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("group", &self.inner.config.group)
            .field("client_id", &self.inner.instance.client_id())
            .finish()
    }
}

/// Longest topic name a client accepts (RocketMQ's `Validators.TOPIC_MAX_LENGTH`).
pub const TOPIC_MAX_LENGTH: usize = 127;

/// Checks a topic name as RocketMQ does: 1..=127 chars of `[%|a-zA-Z0-9_-]`.
///
/// # Errors
/// [`ClientError::InvalidArgument`] naming the problem.
pub fn validate_topic(topic: &str) -> Result<()> {
    if topic.is_empty() {
        return Err(ClientError::InvalidArgument("topic is empty".into()));
    }
    if topic.len() > TOPIC_MAX_LENGTH {
        return Err(ClientError::InvalidArgument(format!(
            "topic {topic:?} is longer than {TOPIC_MAX_LENGTH} characters"
        )));
    }
    if let Some(c) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '%' | '|' | '_' | '-')))
    {
        return Err(ClientError::InvalidArgument(format!(
            "topic {topic:?} contains the illegal character {c:?}"
        )));
    }
    Ok(())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// Whether a failed attempt may be retried on another broker.
fn retryable(e: &ClientError) -> bool {
    match e {
        ClientError::Net(_) | ClientError::NoBrokerAddr(_) => true,
        ClientError::Server { code, .. } => matches!(
            *code,
            resp::SYSTEM_ERROR
                | resp::SYSTEM_BUSY
                | resp::TOPIC_NOT_EXIST
                | resp::NO_PERMISSION
                | resp::NOT_IN_CURRENT_UNIT
                | resp::SERVICE_NOT_AVAILABLE
                | resp::FLOW_CONTROL
        ),
        _ => false,
    }
}

/// The queue a sharding key maps to among `n` queues: Java's `abs(key.hashCode()) % n`
/// (as `SelectMessageQueueByHash`).
pub fn queue_index_for_key(key: &str, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    (java_string_hash(key).unsigned_abs() as usize) % n
}

impl Producer {
    /// A builder for `group` with RocketMQ's defaults.
    pub fn builder(group: impl Into<String>) -> ProducerBuilder {
        ProducerBuilder {
            config: ProducerConfig::new(group),
        }
    }

    /// Starts a producer.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] for a bad configuration.
    pub async fn start(config: ProducerConfig) -> Result<Producer> {
        if config.group.is_empty() {
            return Err(ClientError::InvalidArgument(
                "producer group is empty".into(),
            ));
        }
        let instance = ClientInstance::start(config.client.clone())?;
        instance.register_producer(&config.group);
        let ip: IpAddr = instance
            .client_id()
            .split('@')
            .next()
            .and_then(|ip| ip.parse().ok())
            .unwrap_or(IpAddr::from([127, 0, 0, 1]));
        let fault =
            LatencyFaultTolerance::new(config.latency_fault_enabled, config.fault_table.clone());
        let inner = Arc::new(Inner {
            instance,
            fault: Mutex::new(fault),
            uniq: UniqKeyGenerator::new(ip),
            metrics: crate::metrics::ProducerMetrics::new(&config.group),
            config,
        });
        let weak = Arc::downgrade(&inner);
        inner.instance.watch_brokers(weak);
        Ok(Producer { inner })
    }

    /// The client instance (client id, routes).
    pub fn instance(&self) -> &ClientInstance {
        &self.inner.instance
    }

    /// Prometheus metrics of this producer's sends, to register in an application's
    /// registry.
    pub fn metrics(&self) -> &crate::metrics::ProducerMetrics {
        &self.inner.metrics
    }

    /// The configuration.
    pub fn config(&self) -> &ProducerConfig {
        &self.inner.config
    }

    /// Unregisters the producer from the brokers and stops the instance.
    pub async fn shutdown(&self) {
        self.inner
            .instance
            .unregister_client(Some(&self.inner.config.group), None)
            .await;
        self.inner.instance.shutdown();
    }

    /// The write queues of a topic (spec 3.2); for an unknown topic, `TBW102`'s brokers with
    /// `min(default_topic_queue_nums, readQueueNums)` queues each (auto-create, spec 7.6).
    ///
    /// # Errors
    /// [`ClientError::NoRoute`] if neither the topic nor `TBW102` has a route.
    pub async fn publish_queues(&self, topic: &str) -> Result<Vec<MessageQueue>> {
        let inst = &self.inner.instance;
        if let Some(route) = inst.cached_route(topic) {
            let queues = route.publish_queues(topic);
            if !queues.is_empty() {
                return Ok(queues);
            }
            // A cached route without a writable master (a failover under way, a master
            // between two registrations): ask the name servers again, as RocketMQ's producer
            // does when its publish info has no queue, rather than fail on the cached one.
        }
        // Concurrent sends share one lookup.
        let route = match inst.update_route_shared(topic).await {
            Ok(r) => r,
            Err(ClientError::NoRoute(_)) => {
                return self.auto_create_queues(topic).await;
            }
            Err(e) => return Err(e),
        };
        let queues = route.publish_queues(topic);
        if queues.is_empty() {
            return Err(ClientError::NoRoute(topic.to_owned()));
        }
        Ok(queues)
    }

    /// Learns `topic`'s route and what kind of broker each of its masters is, so that the
    /// first send already goes the way later ones do: with binary headers to a Shoal broker
    /// ([`ClientConfig::binary_sends_to_shoal`](crate::ClientConfig::binary_sends_to_shoal)).
    /// A long-running producer learns a broker's kind in the background after its first send
    /// there; a short-lived one (`shoal send`) calls this first. A broker that does not answer
    /// stays unknown, and sends to it use the configured encoding.
    ///
    /// # Errors
    /// As [`Producer::publish_queues`].
    pub async fn prepare_topic(&self, topic: &str) -> Result<()> {
        let queues = self.publish_queues(topic).await?;
        let inst = &self.inner.instance;
        if !inst.config().binary_sends_to_shoal {
            return Ok(());
        }
        let mut brokers: Vec<&str> = queues.iter().map(|q| &*q.broker_name).collect();
        brokers.sort_unstable();
        brokers.dedup();
        for name in brokers {
            if let Some(addr) = inst.master_addr_shared(name) {
                if let Err(e) = inst.broker_kind(&addr).await {
                    debug!(broker = %addr, error = %e, "broker kind not known");
                }
            }
        }
        Ok(())
    }

    /// The write queues a send picks from: the instance's shared list for a cached route,
    /// otherwise as [`Producer::publish_queues`].
    async fn send_queues(&self, topic: &str) -> Result<Arc<[MessageQueue]>> {
        match self.inner.instance.cached_publish_queues(topic) {
            Some(queues) if !queues.is_empty() => Ok(queues),
            // Boxed: the route lookup's future is large and rarely needed, so it does not
            // grow every send's future (which is moved when a send is spawned).
            _ => Ok(Box::pin(self.publish_queues(topic)).await?.into()),
        }
    }

    async fn auto_create_queues(&self, topic: &str) -> Result<Vec<MessageQueue>> {
        let tbw: TopicRouteData = self
            .inner
            .instance
            .update_route(AUTO_CREATE_TOPIC_KEY_TOPIC)
            .await
            .map_err(|_| ClientError::NoRoute(topic.to_owned()))?;
        let mut tbw = tbw;
        for q in &mut tbw.queue_datas {
            let n = self
                .inner
                .config
                .default_topic_queue_nums
                .min(q.read_queue_nums);
            q.read_queue_nums = n;
            q.write_queue_nums = n;
        }
        let queues = tbw.publish_queues(topic);
        if queues.is_empty() {
            return Err(ClientError::NoRoute(topic.to_owned()));
        }
        Ok(queues)
    }

    /// Checks and completes a message of a batch before sending: as [`Producer::check`],
    /// and a UNIQ_KEY added to it when it has none.
    fn prepare(&self, msg: &mut Message) -> Result<()> {
        self.check(msg)?;
        if msg.uniq_key().is_none() {
            msg.set_uniq_key(self.inner.uniq.next_key())?;
        }
        Ok(())
    }

    /// The UNIQ_KEY a single send carries, and whether it must be added to what is sent:
    /// the message's own, or a new one written after its properties without being put into
    /// them (no map entry per send).
    fn uniq_for(&self, msg: &Message) -> (String, bool) {
        match msg.uniq_key() {
            Some(k) => (k.to_owned(), false),
            None => (self.inner.uniq.next_key(), true),
        }
    }

    /// Checks a message before sending: topic and body size.
    fn check(&self, msg: &Message) -> Result<()> {
        validate_topic(&msg.topic)?;
        if msg.body.is_empty() {
            return Err(ClientError::InvalidArgument("message body is empty".into()));
        }
        if msg.body.len() > self.inner.config.max_message_size {
            return Err(ClientError::InvalidArgument(format!(
                "message body is {} bytes, the limit is {}",
                msg.body.len(),
                self.inner.config.max_message_size
            )));
        }
        Ok(())
    }

    /// Encodes the SEND_MESSAGE_V2 request for one message to `mq`, with `uniq_key` added
    /// after its properties when given, and a binary header when `binary`.
    fn single_request(
        &self,
        msg: &Message,
        uniq_key: Option<&str>,
        mq: &MessageQueue,
        binary: bool,
    ) -> Result<RemotingCommand> {
        let mut sys_flag = 0;
        let mut body: Bytes = msg.body.clone();
        if let Some((compressed, bits)) = compress_for_send(
            &msg.body,
            self.inner.config.compress_over,
            CompressionType::Zlib,
            self.inner.config.compress_level,
        )? {
            body = Bytes::from(compressed);
            sys_flag |= bits;
        }
        let (mut reconsume, mut max_reconsume) = (None, None);
        // Copied only when something is taken out of them (retry topics).
        let mut retry_props;
        let mut props = &msg.properties;
        if is_retry_topic(&msg.topic) {
            retry_props = msg.properties.clone();
            reconsume = retry_props
                .shift_remove(property::RECONSUME_TIME)
                .and_then(|v| v.parse().ok());
            max_reconsume = retry_props
                .shift_remove(property::MAX_RECONSUME_TIMES)
                .and_then(|v| v.parse().ok());
            props = &retry_props;
        }
        if props.get(property::TRAN_MSG).is_some_and(|v| v == "true") {
            sys_flag |= shoal_proto::message::sys_flag::TRANSACTION_PREPARED_TYPE;
        }
        let h = SendV2 {
            group: &self.inner.config.group,
            topic: &msg.topic,
            default_topic_queue_nums: self.inner.config.default_topic_queue_nums,
            queue_id: mq.queue_id,
            sys_flag,
            born_timestamp: now_ms(),
            flag: msg.flag,
            properties: props,
            uniq_key,
            reconsume_times: reconsume,
            max_reconsume_times: max_reconsume,
            broker_name: &mq.broker_name,
            batch: false,
        };
        self.send_command(rc::SEND_MESSAGE_V2, &h, body, binary)
    }

    /// A send request (`code` SEND_MESSAGE_V2 or SEND_BATCH_MESSAGE) with header `h`. A request
    /// that goes unsigned carries its header as JSON text or binary entries written straight
    /// from the values (binary when `binary` or the configured encoding says so); signing
    /// (ACL) needs the map.
    fn send_command(
        &self,
        code: i32,
        h: &SendV2<'_>,
        body: Bytes,
        binary: bool,
    ) -> Result<RemotingCommand> {
        let config = self.inner.instance.config();
        let binary =
            binary || config.serialize_type.for_request_code(code) == SerializeType::RocketMq;
        send_command(code, h, body, binary, config.credentials.is_some())
    }

    /// Sends `req` to `mq`'s broker (at `addr` when known) and reads its answer as a send's,
    /// with an empty `msg_id` for the caller to fill. The request is handed over when this is
    /// called when the broker's address is known (the usual case), so the future returned
    /// keeps only the wait for the answer and what the result needs.
    fn send_request(
        &self,
        req: RemotingCommand,
        mq: &MessageQueue,
        addr: Option<Arc<str>>,
        timeout: Duration,
    ) -> impl Future<Output = Result<SendResult>> + Send + 'static {
        let inst = &self.inner.instance;
        let answer = match addr {
            // The answer is read by `SendResponseRef`, which takes its binary area as it came.
            Some(addr) => Either::Left(inst.invoke_keeping_answer_area(&addr, req, timeout)),
            None => {
                // Rare (the route is refreshed first): boxed, with what it needs.
                let (inst, broker, topic) =
                    (inst.clone(), mq.broker_name.clone(), mq.topic.clone());
                Either::Right(Box::pin(async move {
                    let addr = inst.find_master_addr(&broker, &topic).await?;
                    inst.invoke_keeping_answer_area(&addr, req, timeout).await
                }))
            }
        };
        let (topic, broker_name) = (mq.topic.clone(), mq.broker_name.clone());
        async move {
            let r = answer.await?;
            let status = match r.code {
                resp::SUCCESS => SendStatus::SendOk,
                resp::FLUSH_DISK_TIMEOUT => SendStatus::FlushDiskTimeout,
                resp::FLUSH_SLAVE_TIMEOUT => SendStatus::FlushSlaveTimeout,
                resp::SLAVE_NOT_AVAILABLE => SendStatus::SlaveNotAvailable,
                _ => return Err(ClientError::server("SEND_MESSAGE", &r)),
            };
            let h = SendResponseRef::of_response(&r)?;
            Ok(SendResult {
                status,
                msg_id: String::new(),
                offset_msg_id: h.msg_id.to_owned(),
                message_queue: MessageQueue::new(topic, broker_name, h.queue_id),
                queue_offset: h.queue_offset,
            })
        }
    }

    /// Sends one message and waits for the broker: a queue is chosen round-robin with
    /// latency fault tolerance, and a failed attempt is retried (up to `retries` times) on
    /// another broker when possible, within `send_timeout` overall.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] for a bad message, [`ClientError::NoRoute`], or
    /// [`ClientError::SendFailed`] with the last attempt's error.
    pub async fn send(&self, msg: Message) -> Result<SendResult> {
        self.check(&msg)?;
        let queues = self.send_queues(&msg.topic).await?;
        let (msg_id, added) = self.uniq_for(&msg);
        let started = Instant::now();
        let timeout = self.inner.config.send_timeout;
        let attempts = 1 + self.inner.config.retries;
        let mut last_failed: Option<String> = None;
        let mut last_err = None;
        let mut made = 0;
        // Each attempt reads the clock once when it ends; its start is the previous end (or
        // `started`), so a send with one attempt reads it twice in all.
        let mut now = started;
        for _ in 0..attempts {
            let left = timeout.saturating_sub(now.saturating_duration_since(started));
            if left.is_zero() {
                break;
            }
            let Some(mq) = self
                .inner
                .fault
                .lock()
                .select_index(&queues, last_failed.as_deref(), crate::mono_ms(now))
                .map(|i| &queues[i])
            else {
                self.inner
                    .metrics
                    .failed(now.saturating_duration_since(started));
                return Err(ClientError::NoRoute(msg.topic.clone()));
            };
            made += 1;
            let t0 = now;
            let (addr, binary) = self.inner.instance.send_target(&mq.broker_name);
            let req = self.single_request(&msg, added.then_some(&*msg_id), mq, binary)?;
            let outcome = self.send_request(req, mq, addr, left).await;
            now = Instant::now();
            let took = now.saturating_duration_since(t0);
            let latency = took.as_millis() as u64;
            match outcome {
                Ok(mut r) => {
                    r.msg_id = msg_id;
                    self.inner.fault.lock().record(
                        &mq.broker_name,
                        latency,
                        false,
                        crate::mono_ms(now),
                    );
                    // The first attempt started with the send.
                    let total = if t0 == started {
                        took
                    } else {
                        now.saturating_duration_since(started)
                    };
                    self.inner.metrics.sent(total);
                    return Ok(r);
                }
                Err(e) => {
                    self.inner.fault.lock().record(
                        &mq.broker_name,
                        latency,
                        true,
                        crate::mono_ms(now),
                    );
                    self.inner.metrics.attempt_failed();
                    warn!(queue = %mq, error = %e, "send attempt failed");
                    let again = retryable(&e);
                    last_failed = Some(mq.broker_name.clone());
                    last_err = Some(e);
                    if !again {
                        break;
                    }
                }
            }
        }
        self.inner.metrics.failed(started.elapsed());
        Err(ClientError::SendFailed {
            attempts: made,
            last: Box::new(last_err.unwrap_or(ClientError::NotRunning("send timed out"))),
        })
    }

    /// Sends in a spawned task and returns its result as a future that makes progress without
    /// being polled (RocketMQ's asynchronous send).
    pub fn send_async(
        &self,
        msg: Message,
    ) -> impl Future<Output = Result<SendResult>> + Send + 'static {
        let this = self.clone();
        let handle = tokio::spawn(async move { this.send(msg).await });
        async move {
            handle
                .await
                .map_err(|_| ClientError::NotRunning("asynchronous send task ended abnormally"))?
        }
    }

    /// Sends without waiting for any answer (oneway): one attempt, no result.
    ///
    /// # Errors
    /// A bad message, no route, or a transport error while writing.
    pub async fn send_oneway(&self, msg: Message) -> Result<()> {
        self.check(&msg)?;
        let (uniq, added) = self.uniq_for(&msg);
        let queues = self.send_queues(&msg.topic).await?;
        let mq = self
            .inner
            .fault
            .lock()
            .select_index(&queues, None, crate::mono_ms(Instant::now()))
            .map(|i| &queues[i])
            .ok_or_else(|| ClientError::NoRoute(msg.topic.clone()))?;
        let binary = self.inner.instance.binary_sends_to(&mq.broker_name);
        let req = self.single_request(&msg, added.then_some(&*uniq), mq, binary)?;
        let addr = self
            .inner
            .instance
            .find_master_addr(&mq.broker_name, &mq.topic)
            .await?;
        self.inner.instance.invoke_oneway(&addr, req).await
    }

    /// Sends to the given queue (one attempt).
    ///
    /// # Errors
    /// As [`Producer::send`], without retries.
    pub async fn send_to_queue(&self, msg: Message, mq: &MessageQueue) -> Result<SendResult> {
        self.check(&msg)?;
        if mq.topic != msg.topic {
            return Err(ClientError::InvalidArgument(format!(
                "queue {mq} is not of the message's topic {}",
                msg.topic
            )));
        }
        let (msg_id, added) = self.uniq_for(&msg);
        let (addr, binary) = self.inner.instance.send_target(&mq.broker_name);
        let req = self.single_request(&msg, added.then_some(&*msg_id), mq, binary)?;
        let mut r = self
            .send_request(req, mq, addr, self.inner.config.send_timeout)
            .await?;
        r.msg_id = msg_id;
        Ok(r)
    }

    /// Sends to the queue `selector` picks among the topic's write queues (index taken modulo
    /// the queue count): RocketMQ's `MessageQueueSelector`, e.g. for ordered messages.
    ///
    /// # Errors
    /// As [`Producer::send_to_queue`].
    pub async fn send_with_selector<F>(&self, msg: Message, selector: F) -> Result<SendResult>
    where
        F: FnOnce(&[MessageQueue], &Message) -> usize,
    {
        validate_topic(&msg.topic)?;
        let queues = self.publish_queues(&msg.topic).await?;
        let idx = selector(&queues, &msg) % queues.len().max(1);
        let mq = queues
            .get(idx)
            .cloned()
            .ok_or_else(|| ClientError::NoRoute(msg.topic.clone()))?;
        self.send_to_queue(msg, &mq).await
    }

    /// Ordered send: every message with the same `sharding_key` goes to the same queue
    /// (`abs(hashCode) % queue count`, as `SelectMessageQueueByHash`).
    ///
    /// # Errors
    /// As [`Producer::send_to_queue`].
    pub async fn send_ordered(&self, msg: Message, sharding_key: &str) -> Result<SendResult> {
        let key = sharding_key.to_owned();
        self.send_with_selector(msg, move |qs, _| queue_index_for_key(&key, qs.len()))
            .await
    }

    /// Sends a batch (SEND_BATCH_MESSAGE): one topic, no delay, no retry topic; each message
    /// gets its own UNIQ_KEY. The result's ids are comma-joined, one per message.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] for an empty or mixed batch, otherwise as
    /// [`Producer::send`].
    pub async fn send_batch(&self, mut msgs: Vec<Message>) -> Result<SendResult> {
        let Some(topic) = msgs.first().map(|m| m.topic.clone()) else {
            return Err(ClientError::InvalidArgument("empty batch".into()));
        };
        for m in &mut msgs {
            if m.topic != topic {
                return Err(ClientError::InvalidArgument(
                    "all messages of a batch must have the same topic".into(),
                ));
            }
            if m.delay_level() > 0 {
                return Err(ClientError::InvalidArgument(
                    "delay messages cannot be batched".into(),
                ));
            }
            self.prepare(m)?;
        }
        if is_retry_topic(&topic) {
            return Err(ClientError::InvalidArgument(
                "retry-topic messages cannot be batched".into(),
            ));
        }
        let body = encode_batch(msgs.iter())?;
        if body.len() > self.inner.config.max_message_size {
            return Err(ClientError::InvalidArgument(format!(
                "batch is {} bytes, the limit is {}",
                body.len(),
                self.inner.config.max_message_size
            )));
        }
        let ids: Vec<&str> = msgs.iter().filter_map(|m| m.uniq_key()).collect();
        let msg_id = ids.join(",");
        let queues = self.publish_queues(&topic).await?;
        let mut batch_props = Properties::default();
        batch_props.insert(property::WAIT.to_owned(), "true".to_owned());
        batch_props.insert(property::UNIQ_KEY.to_owned(), self.inner.uniq.next_key());
        let body = Bytes::from(body);
        let started = Instant::now();
        let timeout = self.inner.config.send_timeout;
        let mut last_failed: Option<String> = None;
        let mut last_err = None;
        let mut made = 0;
        for _ in 0..=self.inner.config.retries {
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            let Some(mq) = self.inner.fault.lock().select(
                &queues,
                last_failed.as_deref(),
                crate::mono_ms(Instant::now()),
            ) else {
                break;
            };
            made += 1;
            let (addr, binary) = self.inner.instance.send_target(&mq.broker_name);
            let req = self.send_command(
                rc::SEND_BATCH_MESSAGE,
                &SendV2 {
                    group: &self.inner.config.group,
                    topic: &topic,
                    default_topic_queue_nums: self.inner.config.default_topic_queue_nums,
                    queue_id: mq.queue_id,
                    sys_flag: 0,
                    born_timestamp: now_ms(),
                    flag: 0,
                    properties: &batch_props,
                    uniq_key: None,
                    reconsume_times: Some(0),
                    max_reconsume_times: None,
                    broker_name: &mq.broker_name,
                    batch: true,
                },
                body.clone(),
                binary,
            )?;
            let t0 = Instant::now();
            let outcome = self.send_request(req, &mq, addr, left).await;
            let latency = t0.elapsed().as_millis() as u64;
            let failed = outcome.is_err();
            self.inner.fault.lock().record(
                &mq.broker_name,
                latency,
                failed,
                crate::mono_ms(Instant::now()),
            );
            match outcome {
                Ok(mut r) => {
                    r.msg_id = msg_id;
                    return Ok(r);
                }
                Err(e) => {
                    debug!(queue = %mq, error = %e, "batch send attempt failed");
                    let again = retryable(&e);
                    last_failed = Some(mq.broker_name.clone());
                    last_err = Some(e);
                    if !again {
                        break;
                    }
                }
            }
        }
        Err(ClientError::SendFailed {
            attempts: made,
            last: Box::new(last_err.unwrap_or(ClientError::NotRunning("send timed out"))),
        })
    }

    /// The latency last recorded for a broker by the fault tolerance (ms), if any.
    pub fn broker_latency(&self, broker_name: &str) -> Option<u64> {
        self.inner.fault.lock().latency_of(broker_name)
    }

    /// Whether the fault tolerance currently lets `broker_name` be chosen.
    pub fn broker_available(&self, broker_name: &str) -> bool {
        self.inner
            .fault
            .lock()
            .is_available(broker_name, crate::mono_ms(Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future a method taking one argument returns.
    fn future_size<'a, A: 'a, B, F, Fut>(_: F) -> usize
    where
        F: FnOnce(&'a A, B) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    /// A send's future is allocated (or moved) by every caller that keeps sends in flight:
    /// the request is handed to the connection before the first await, so no layer keeps a
    /// copy of it (the future was 2,736 bytes when four layers each held one).
    #[test]
    fn a_send_future_holds_no_request() {
        let send = future_size(Producer::send);
        assert!(send <= 1024, "Producer::send's future grew to {send} bytes");
        let batch = future_size(Producer::send_batch);
        assert!(
            batch <= 1536,
            "Producer::send_batch's future grew to {batch} bytes"
        );
    }

    #[test]
    fn topic_validation() {
        assert!(validate_topic("Topic_a-1%|").is_ok());
        assert!(validate_topic("").is_err());
        assert!(validate_topic("a b")
            .unwrap_err()
            .to_string()
            .contains("' '"));
        assert!(validate_topic(&"x".repeat(128)).is_err());
    }

    #[test]
    fn sharding_key_index_is_java_abs_hash() {
        // "tagA".hashCode() = 3552231
        assert_eq!(queue_index_for_key("tagA", 8), 3552231 % 8);
        // Negative hash codes use the absolute value: "order-created" = -392709271.
        assert_eq!(queue_index_for_key("order-created", 16), 392709271 % 16);
        assert_eq!(queue_index_for_key("x", 0), 0);
    }

    #[test]
    fn retryable_errors() {
        let e = ClientError::Server {
            what: "SEND_MESSAGE",
            code: resp::SYSTEM_BUSY,
            remark: String::new(),
        };
        assert!(retryable(&e));
        let e = ClientError::Server {
            what: "SEND_MESSAGE",
            code: resp::MESSAGE_ILLEGAL,
            remark: String::new(),
        };
        assert!(!retryable(&e));
    }
}
