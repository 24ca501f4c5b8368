//! POP consumption (RocketMQ 5's remoting POP codes): the broker, not the client, picks the
//! queues, and hands out every message under an invisibility lease with a receipt. There is no
//! rebalance: any number of consumers share a topic's queues.
//!
//! [`PopConsumer`] offers the two ways RocketMQ 5 clients consume:
//! - **Simple**: [`PopConsumer::receive`] (POP_MESSAGE with long polling),
//!   [`PopConsumer::ack`] (ACK_MESSAGE), [`PopConsumer::change_invisible`]
//!   (CHANGE_MESSAGE_INVISIBLETIME: the receipt changes).
//! - **Push**: [`PopConsumer::start`] with a listener: one task per broker group of the
//!   topic pops, hands each message to the listener on a blocking thread, acks it when the
//!   listener succeeds, makes it invisible for [`PopConsumerConfig::retry_delay`] when the
//!   listener asks for a retry, and renews the lease while a slow listener still runs (at half
//!   the invisibility), so a slow message is not handed to another consumer meanwhile.
//!
//! Pops, acks and renewals go to the group's master as the route names it now: after a
//! failover they reach the new master (which has the old one's leases in a replicated group)
//! as soon as the name servers push the new route; a broker group that joins the topic's
//! route gets its task within a second.
//!
//! A lease that lapses (the consumer died, or could not renew) makes the broker redeliver the
//! message: through the group's POP retry topic with its reconsume count raised, or in place
//! for FIFO pops ([`PopConsumerConfig::fifo`]), where a queue hands out nothing more until its
//! message is acknowledged.

use crate::config::ClientConfig;
use crate::error::{ClientError, Result};
use crate::instance::ClientInstance;
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::{
    parse_order_count_info, parse_start_offset_info, AckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader, ChangeInvisibleTimeResponseHeader, PopExtraInfo,
    PopMessageRequestHeader, PopMessageResponseHeader, PopRetryFlag,
};
use shoal_proto::message::{decode_records, DecodeOptions, MessageExt};
use shoal_proto::RemotingCommand;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::{JoinHandle, JoinSet};

/// How often the push consumer looks for broker groups that joined the topic's route.
const NEW_BROKERS_EVERY: Duration = Duration::from_secs(1);

/// What a POP consumer reads and how.
#[derive(Debug, Clone)]
pub struct PopConsumerConfig {
    /// Consumer group.
    pub group: String,
    /// Topic.
    pub topic: String,
    /// Tag expression (`*`, `a || b`), unless [`PopConsumerConfig::sql`] is set.
    pub expression: String,
    /// SQL92 selector over message properties (the broker evaluates it).
    pub sql: Option<String>,
    /// Invisibility of a received message, as asked of the broker (RocketMQ's default 60 s).
    pub invisible: Duration,
    /// Messages per pop, 1..=32.
    pub batch: i32,
    /// Long-polling time of a pop that finds nothing.
    pub poll: Duration,
    /// In order: a queue hands out its next message only after the previous one is acked;
    /// a lapsed message comes back first, in place.
    pub fifo: bool,
    /// A queue the group never read starts at its first message (else at its last).
    pub from_first: bool,
    /// Invisibility after the listener asked for a retry (the message comes back then).
    pub retry_delay: Duration,
    /// Messages of a pop handed to the listener at once (FIFO pops: one at a time).
    pub concurrency: usize,
    /// Client settings (name servers, credentials, TLS).
    pub client: ClientConfig,
}

impl PopConsumerConfig {
    /// A configuration with RocketMQ's defaults for `group` reading `topic`.
    pub fn new(group: impl Into<String>, topic: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            topic: topic.into(),
            expression: "*".into(),
            sql: None,
            invisible: Duration::from_secs(60),
            batch: 16,
            poll: Duration::from_secs(15),
            fifo: false,
            from_first: false,
            retry_delay: Duration::from_secs(10),
            concurrency: 8,
            client: ClientConfig::default(),
        }
    }
}

/// A message received under lease.
#[derive(Debug, Clone)]
pub struct PoppedMessage {
    /// The message (its topic is the subscribed one, also for redeliveries through the POP
    /// retry topic; its queue and offset are the stored copy's).
    pub message: MessageExt,
    /// The address of the broker that leased it (acks and renewals go to its group's master
    /// as the route names it then, this address when the route names none).
    pub broker_addr: String,
    /// The receipt (RocketMQ's `POP_CK` extra info); changed by
    /// [`PopConsumer::change_invisible`].
    pub receipt: PopExtraInfo,
    /// Which delivery this is: 1 the first time.
    pub attempt: u32,
    /// When the lease ends (by this client's clock).
    pub invisible_until: Instant,
}

/// What the listener did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PopConsumeResult {
    /// Consumed: acknowledge it.
    Success,
    /// Not consumed: deliver it again after the retry delay.
    Later,
}

/// Counters of a POP consumer.
#[derive(Debug, Default)]
pub struct PopConsumerStats {
    /// Messages received.
    pub received: AtomicU64,
    /// Acks accepted by the broker.
    pub acked: AtomicU64,
    /// Acks refused (the lease had lapsed: the message will come again).
    pub ack_refused: AtomicU64,
    /// Leases renewed for slow listeners.
    pub renewed: AtomicU64,
    /// Messages the listener asked to get again.
    pub retried: AtomicU64,
}

type Listener = Arc<dyn Fn(&PoppedMessage) -> PopConsumeResult + Send + Sync>;

/// A POP consumer. See the [module documentation](self).
#[derive(Debug)]
pub struct PopConsumer {
    instance: ClientInstance,
    config: PopConsumerConfig,
    running: Arc<AtomicBool>,
    tasks: parking_lot::Mutex<Vec<JoinHandle<()>>>,
    stats: Arc<PopConsumerStats>,
}

impl PopConsumer {
    /// A consumer for the simple API (no listener, no tasks).
    ///
    /// # Errors
    /// An unusable configuration.
    pub fn new(config: PopConsumerConfig) -> Result<Self> {
        if !(1..=32).contains(&config.batch) {
            return Err(ClientError::InvalidArgument(format!(
                "a pop asks 1..=32 messages, not {}",
                config.batch
            )));
        }
        if config.invisible < Duration::from_secs(1) {
            return Err(ClientError::InvalidArgument(
                "the invisible time must be at least 1 s".into(),
            ));
        }
        Ok(Self {
            instance: ClientInstance::start(config.client.clone())?,
            config,
            running: Arc::new(AtomicBool::new(true)),
            tasks: parking_lot::Mutex::new(Vec::new()),
            stats: Arc::new(PopConsumerStats::default()),
        })
    }

    /// Starts a push-style consumer: one task per broker group of the topic pops and hands
    /// the messages to `listener` (on blocking threads).
    ///
    /// # Errors
    /// An unusable configuration; the topic has no route.
    pub async fn start(
        config: PopConsumerConfig,
        listener: impl Fn(&PoppedMessage) -> PopConsumeResult + Send + Sync + 'static,
    ) -> Result<Arc<Self>> {
        let me = Arc::new(Self::new(config)?);
        me.brokers().await?;
        let listener: Listener = Arc::new(listener);
        let c = me.clone();
        *me.tasks.lock() = vec![tokio::spawn(async move { c.supervise(listener).await })];
        Ok(me)
    }

    /// Runs a task per broker group of the topic's route, adding one for each group that
    /// joins it (the tasks end with this one).
    async fn supervise(self: Arc<Self>, listener: Listener) {
        let mut tasks = JoinSet::new();
        let mut started: BTreeSet<String> = BTreeSet::new();
        while self.running.load(Ordering::Acquire) {
            let names: Vec<String> = match self.instance.cached_route(&self.config.topic) {
                Some(route) => route
                    .queue_datas
                    .iter()
                    .filter(|q| q.read_queue_nums > 0)
                    .map(|q| q.broker_name.clone())
                    .collect(),
                None => Vec::new(),
            };
            for name in names {
                if started.insert(name.clone()) {
                    let c = self.clone();
                    let l = listener.clone();
                    tasks.spawn(async move { c.run(name, l).await });
                }
            }
            tokio::time::sleep(NEW_BROKERS_EVERY).await;
        }
    }

    /// Where requests for `m` go: its broker group's master now, else where it came from.
    fn addr_of(&self, m: &PoppedMessage) -> String {
        self.instance
            .master_addr(&m.receipt.broker_name)
            .unwrap_or_else(|| m.broker_addr.clone())
    }

    /// The client id.
    pub fn client_id(&self) -> &str {
        self.instance.client_id()
    }

    /// Counters.
    pub fn stats(&self) -> &PopConsumerStats {
        &self.stats
    }

    /// The masters serving the topic: (broker name, address).
    ///
    /// # Errors
    /// The topic has no route.
    pub async fn brokers(&self) -> Result<Vec<(String, String)>> {
        let route = self.instance.update_route(&self.config.topic).await?;
        Ok(route
            .broker_datas
            .iter()
            .filter(|b| {
                route
                    .queue_datas
                    .iter()
                    .any(|q| q.broker_name == b.broker_name && q.read_queue_nums > 0)
            })
            .filter_map(|b| {
                b.broker_addrs
                    .get(&shoal_proto::constants::MASTER_ID)
                    .map(|a| (b.broker_name.clone(), a.clone()))
            })
            .collect())
    }

    /// Pops up to `max` messages from a broker (`broker_name` at `addr`), waiting up to the
    /// configured poll time for one to arrive. Empty when none came.
    ///
    /// # Errors
    /// Transport errors; the broker refused the pop.
    pub async fn receive(
        &self,
        broker_name: &str,
        addr: &str,
        max: i32,
    ) -> Result<Vec<PoppedMessage>> {
        let c = &self.config;
        let (exp_type, exp) = match &c.sql {
            Some(sql) => ("SQL92", sql.clone()),
            None => ("TAG", c.expression.clone()),
        };
        let header = PopMessageRequestHeader {
            consumer_group: c.group.clone(),
            topic: c.topic.clone(),
            queue_id: -1,
            max_msg_nums: max.clamp(1, 32),
            invisible_time: c.invisible.as_millis() as i64,
            poll_time: c.poll.as_millis() as i64,
            born_time: crate::now_ms_u64() as i64,
            init_mode: if c.from_first { 0 } else { 1 },
            exp_type: Some(exp_type.into()),
            exp: Some(exp),
            order: c.fifo,
            ..Default::default()
        };
        let asked = Instant::now();
        let req = RemotingCommand::request_with_header(rc::POP_MESSAGE, &header);
        let timeout = c.poll + self.instance.config().rpc_timeout;
        let r = self.instance.invoke(addr, req, timeout).await?;
        match r.code {
            resp::SUCCESS => {}
            resp::PULL_NOT_FOUND | resp::POLLING_TIMEOUT => return Ok(Vec::new()),
            resp::POLLING_FULL => {
                // The broker holds as many pops as it allows: back off a little.
                tokio::time::sleep(Duration::from_millis(200)).await;
                return Ok(Vec::new());
            }
            _ => return Err(ClientError::server("POP_MESSAGE", &r)),
        }
        let h: PopMessageResponseHeader = r.decode_command_header()?;
        let starts = parse_start_offset_info(h.start_offset_info.as_deref().unwrap_or(""))?;
        let counts = parse_order_count_info(h.order_count_info.as_deref().unwrap_or(""))?;
        let body = r.body.clone().unwrap_or_default();
        let run = decode_records(&body, &DecodeOptions::default());
        if let Some(e) = run.error {
            return Err(e.into());
        }
        let until = asked + Duration::from_millis(h.invisible_time.max(0) as u64);
        let mut out = Vec::with_capacity(run.messages.len());
        for mut m in run.messages {
            let retry = PopRetryFlag::of_topic(&m.topic);
            let ck = starts
                .iter()
                .find(|s| s.retry == retry && s.queue_id == m.queue_id)
                .map_or(m.queue_offset, |s| s.start_offset);
            let earlier = counts
                .iter()
                .find(|o| {
                    o.retry == retry
                        && o.queue_id == m.queue_id
                        && (o.queue_offset == m.queue_offset || o.queue_offset < 0)
                })
                .map_or(0, |o| o.count.max(0) as u32);
            if earlier > 0 {
                m.reconsume_times = earlier as i32;
            }
            let receipt = PopExtraInfo {
                ck_queue_offset: ck,
                pop_time: h.pop_time,
                invisible_time: h.invisible_time,
                revive_qid: h.revive_qid,
                retry,
                broker_name: broker_name.to_owned(),
                queue_id: m.queue_id,
                msg_queue_offset: Some(m.queue_offset),
            };
            let attempt = m.reconsume_times.max(0) as u32 + 1;
            if retry != PopRetryFlag::Normal {
                // A redelivery through the retry topic: the application sees its own topic.
                m.topic = c.topic.clone();
            }
            out.push(PoppedMessage {
                message: m,
                broker_addr: addr.to_owned(),
                receipt,
                attempt,
                invisible_until: until,
            });
        }
        self.stats
            .received
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        Ok(out)
    }

    /// Acknowledges a received message.
    ///
    /// # Errors
    /// [`ClientError::Server`] with NO_MESSAGE when the receipt is no longer valid (its lease
    /// lapsed or changed: the message will be delivered again); transport errors.
    pub async fn ack(&self, m: &PoppedMessage) -> Result<()> {
        let header = AckMessageRequestHeader {
            consumer_group: self.config.group.clone(),
            topic: self.config.topic.clone(),
            queue_id: m.message.queue_id,
            extra_info: m.receipt.to_extra_info(),
            offset: m.message.queue_offset,
            ..Default::default()
        };
        let req = RemotingCommand::request_with_header(rc::ACK_MESSAGE, &header);
        let r = self
            .instance
            .invoke(&self.addr_of(m), req, self.instance.config().rpc_timeout)
            .await?;
        if r.code == resp::SUCCESS {
            self.stats.acked.fetch_add(1, Ordering::Relaxed);
            Ok(())
        } else {
            self.stats.ack_refused.fetch_add(1, Ordering::Relaxed);
            Err(ClientError::server("ACK_MESSAGE", &r))
        }
    }

    /// Makes a received message invisible for `invisible` from now; its receipt changes (the
    /// old one is void).
    ///
    /// # Errors
    /// As [`PopConsumer::ack`].
    pub async fn change_invisible(&self, m: &mut PoppedMessage, invisible: Duration) -> Result<()> {
        let header = ChangeInvisibleTimeRequestHeader {
            consumer_group: self.config.group.clone(),
            topic: self.config.topic.clone(),
            queue_id: m.message.queue_id,
            extra_info: m.receipt.to_extra_info(),
            offset: m.message.queue_offset,
            invisible_time: invisible.as_millis() as i64,
            ..Default::default()
        };
        let asked = Instant::now();
        let req = RemotingCommand::request_with_header(rc::CHANGE_MESSAGE_INVISIBLETIME, &header);
        let r = self
            .instance
            .invoke(&self.addr_of(m), req, self.instance.config().rpc_timeout)
            .await?;
        if r.code != resp::SUCCESS {
            return Err(ClientError::server("CHANGE_MESSAGE_INVISIBLETIME", &r));
        }
        let h: ChangeInvisibleTimeResponseHeader = r.decode_command_header()?;
        m.receipt.pop_time = h.pop_time;
        m.receipt.invisible_time = h.invisible_time;
        m.invisible_until = asked + Duration::from_millis(h.invisible_time.max(0) as u64);
        Ok(())
    }

    /// Stops the tasks (messages in the listener's hands are not acked: their leases lapse
    /// and they come again).
    pub async fn shutdown(&self) {
        self.running.store(false, Ordering::Release);
        let tasks: Vec<JoinHandle<()>> = std::mem::take(&mut *self.tasks.lock());
        for t in tasks {
            t.abort();
            let _ = t.await;
        }
        self.instance.shutdown();
    }

    /// One broker group's loop: pop from its master, deliver, ack.
    async fn run(self: Arc<Self>, broker_name: String, listener: Listener) {
        use futures::StreamExt;
        let mut backoff = Duration::from_millis(100);
        while self.running.load(Ordering::Acquire) {
            let Some(addr) = self.instance.master_addr(&broker_name) else {
                // No master in the route (a failover under way): the next route names one.
                self.wait_for_master(&broker_name, None, backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            };
            let batch = match self.receive(&broker_name, &addr, self.config.batch).await {
                Ok(b) => {
                    backoff = Duration::from_millis(100);
                    b
                }
                Err(e) => {
                    tracing::warn!(broker = %addr, error = %e, "pop failed; retrying");
                    self.wait_for_master(&broker_name, Some(&addr), backoff)
                        .await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            let width = if self.config.fifo {
                1
            } else {
                self.config.concurrency.max(1)
            };
            futures::stream::iter(batch)
                .for_each_concurrent(width, |m| {
                    let me = self.clone();
                    let l = listener.clone();
                    async move { me.deliver(m, l).await }
                })
                .await;
        }
    }

    /// Waits `backoff`, or less when the route names another master of `broker_name` than
    /// `failed` meanwhile.
    async fn wait_for_master(&self, broker_name: &str, failed: Option<&str>, backoff: Duration) {
        let until = Instant::now() + backoff;
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50).min(backoff)).await;
            let now = self.instance.master_addr(broker_name);
            if now.is_some() && now.as_deref() != failed {
                return;
            }
        }
    }

    /// Hands one message to the listener, renewing its lease while the listener runs, then
    /// acks it or makes it invisible for the retry delay.
    async fn deliver(&self, mut m: PoppedMessage, listener: Listener) {
        let shown = m.clone();
        let mut work = tokio::task::spawn_blocking(move || listener(&shown));
        let result = loop {
            let half = m.invisible_until.saturating_duration_since(Instant::now()) / 2;
            tokio::select! {
                r = &mut work => break r.unwrap_or(PopConsumeResult::Later),
                _ = tokio::time::sleep(half.max(Duration::from_millis(200))) => {
                    match self.change_invisible(&mut m, self.config.invisible).await {
                        Ok(()) => {
                            self.stats.renewed.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "could not renew the lease of a slow message; it may be delivered again");
                        }
                    }
                }
            }
        };
        match result {
            PopConsumeResult::Success => {
                if let Err(e) = self.ack(&m).await {
                    tracing::warn!(error = %e, "ack refused; the message will be delivered again");
                }
            }
            PopConsumeResult::Later => {
                self.stats.retried.fetch_add(1, Ordering::Relaxed);
                let delay = self.config.retry_delay.max(Duration::from_secs(1));
                if let Err(e) = self.change_invisible(&mut m, delay).await {
                    tracing::debug!(error = %e, "retry: lease not changed; it lapses by itself");
                }
            }
        }
    }
}
