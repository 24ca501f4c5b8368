//! `shoal bench produce|consume|e2e|rebalance`: throughput, latency and rebalance benchmarks
//! against any name server (Shoal's or an Apache RocketMQ cluster's).
//!
//! Every message the tool sends carries a 24-byte header at the start of its body (when the body
//! is at least that long): a magic number, a run id, a key unique in the run (producer number and
//! sequence) and the wall-clock send time in microseconds. Consumers use it for end-to-end
//! latency, duplicates and losses; bodies without it are counted as foreign.
//!
//! Latencies go into HdrHistograms in microseconds (3 significant digits). In open-loop mode
//! (`--rate`) sends follow a fixed timetable and a send's latency counts from the moment its
//! timer fired, including any wait for a free in-flight slot: a stalled broker shows up in the
//! tail instead of slowing the load down (no coordinated omission, up to `--inflight`
//! outstanding sends per producer).

use crate::admin_cmd::Common;
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parking_lot::Mutex;
use serde::Serialize;
use shoal_client::admin::{AdminClient, TopicSpec};
use shoal_client::consumer::{ConsumeConcurrentlyStatus, MessageListener};
use shoal_client::{
    ClientConfig, ClientError, ConsumeFromWhere, Message, MessageQueue, Producer, PushConsumer,
};
use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Magic number at the start of a benchmark body ("SHOL").
const MAGIC: u32 = 0x5348_4F4C;
/// Length of the benchmark header in a body.
pub const HEADER_LEN: usize = 24;
/// Largest body the tool sends (RocketMQ's default message size limit).
const MAX_BODY: usize = 4 * 1024 * 1024;

/// `shoal bench ...`
#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// Produce at a target rate or as fast as possible; report send throughput and
    /// acknowledgement latency.
    Produce(ProduceArgs),
    /// Consume a topic with a group of consumers; report throughput (and end-to-end latency
    /// for messages sent by `shoal bench`).
    Consume(ConsumeArgs),
    /// Produce and consume at once: send acknowledgement and end-to-end latency, duplicates
    /// and losses.
    E2e(E2eArgs),
    /// A consumer group under steady load while members join, leave and crash on a schedule:
    /// convergence time, consumption pause, duplicates and losses per event.
    Rebalance(RebalanceArgs),
}

/// Topic options.
#[derive(Debug, Args, Clone)]
pub struct TopicArgs {
    /// Topic to use.
    #[arg(long, default_value = "ShoalBench")]
    pub topic: String,
    /// Queues per broker: the topic is created (or updated) with this many read and write
    /// queues on every master before the run.
    #[arg(long, default_value_t = 8)]
    pub queues: i32,
    /// Use the topic as it is (do not create or update it).
    #[arg(long)]
    pub no_create: bool,
}

/// Load (producer) options.
#[derive(Debug, Args, Clone)]
pub struct LoadArgs {
    /// Number of producers (each its own client instance and connections).
    #[arg(long, default_value_t = 1)]
    pub producers: usize,
    /// Body size in bytes.
    #[arg(long, default_value_t = 128)]
    pub size: usize,
    /// Messages per send (1: SEND_MESSAGE; more: SEND_BATCH_MESSAGE).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Target rate in messages per second over all producers (open loop). `max` (or 0): as
    /// fast as possible (closed loop, `--inflight` sends outstanding per producer).
    #[arg(long, default_value = "max", value_parser = parse_rate)]
    pub rate: f64,
    /// Sends outstanding per producer (default: 1 at max rate, i.e. synchronous sends; 256
    /// with --rate).
    #[arg(long)]
    pub inflight: Option<usize>,
    /// How long to send (`10s`, `1m`).
    #[arg(long, value_parser = parse_duration, default_value = "10s", conflicts_with = "count")]
    pub duration: Duration,
    /// Send this many messages in total instead of for a duration.
    #[arg(long)]
    pub count: Option<u64>,
    /// Timeout of one send, retries included.
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    pub send_timeout: Duration,
}

/// Consumer group options.
#[derive(Debug, Args, Clone)]
pub struct GroupArgs {
    /// Number of consumers in the group (each its own client instance).
    #[arg(long, default_value_t = 1)]
    pub consumers: usize,
    /// Consumer group (default: a fresh `shoal-bench-<pid>-<time>` group).
    #[arg(long)]
    pub group: Option<String>,
    /// Allocation strategy (AVG, BALANCED_STICKY, ...).
    #[arg(long, default_value = "AVG")]
    pub strategy: String,
}

/// Options of `shoal bench produce`.
#[derive(Debug, Args)]
pub struct ProduceArgs {
    #[command(flatten)]
    topic: TopicArgs,
    #[command(flatten)]
    load: LoadArgs,
}

/// Options of `shoal bench consume`.
#[derive(Debug, Args)]
pub struct ConsumeArgs {
    #[command(flatten)]
    topic: TopicArgs,
    #[command(flatten)]
    group: GroupArgs,
    /// Where a new group starts: `first` (drain what is stored) or `last` (only new messages).
    #[arg(long, default_value = "first", value_parser = ["first", "last"])]
    from: String,
    /// Stop after this long at the latest.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    duration: Duration,
    /// Stop after this many messages.
    #[arg(long)]
    count: Option<u64>,
    /// Stop when nothing arrived for this long (after the first message).
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    idle: Duration,
}

/// Options of `shoal bench e2e`.
#[derive(Debug, Args)]
pub struct E2eArgs {
    #[command(flatten)]
    topic: TopicArgs,
    #[command(flatten)]
    load: LoadArgs,
    #[command(flatten)]
    group: GroupArgs,
    /// After sending, wait at most this long for every acknowledged message to be consumed.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    drain: Duration,
}

/// Options of `shoal bench rebalance`.
#[derive(Debug, Args)]
pub struct RebalanceArgs {
    /// Topic to use.
    #[arg(long, default_value = "ShoalBenchRebalance")]
    topic: String,
    /// Queues per broker.
    #[arg(long, default_value_t = 16)]
    queues: i32,
    /// Use the topic as it is (do not create or update it).
    #[arg(long)]
    no_create: bool,
    /// Consumers at the start.
    #[arg(long, default_value_t = 4)]
    consumers: usize,
    /// Membership changes, one per interval: `join:N`, `leave:N` (graceful shutdown),
    /// `kill:N` (hard stop: connections dropped, no unregister, no final commit), separated
    /// by commas. Leaves and kills take the most recently joined members.
    #[arg(long, default_value = "join:4,leave:4,kill:1")]
    schedule: String,
    /// Time between events (the first event comes one interval after the start).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    interval: Duration,
    /// Steady produce rate, messages per second.
    #[arg(long, default_value_t = 2000.0)]
    rate: f64,
    /// Number of producers.
    #[arg(long, default_value_t = 1)]
    producers: usize,
    /// Body size in bytes (at least 24).
    #[arg(long, default_value_t = 128)]
    size: usize,
    /// Consumer group (default: a fresh one).
    #[arg(long)]
    group: Option<String>,
    /// Allocation strategy.
    #[arg(long, default_value = "AVG")]
    strategy: String,
    /// Group protocol of the consumers: `classic` (client-side allocation, hand-over by
    /// locks and notices), `coordinated` (the broker coordinates: epochs, revoke then
    /// assign), `auto` (the consumers' default: coordinated against a Shoal broker).
    #[arg(long, default_value = "auto")]
    mode: shoal_client::GroupProtocol,
    /// Consumers' safety-net rebalance period (notifications trigger rebalances at once).
    #[arg(long, value_parser = parse_duration, default_value = "20s")]
    rebalance_interval: Duration,
    /// Consumers' offset commit period (RocketMQ's default 5 s); a killed member's queues are
    /// re-consumed from the last commit.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    persist_offset_interval: Duration,
    /// After the last interval, wait at most this long for every acknowledged message.
    #[arg(long, value_parser = parse_duration, default_value = "15s")]
    drain: Duration,
}

/// `max` (as fast as possible, 0) or messages per second.
fn parse_rate(s: &str) -> Result<f64, String> {
    match s.trim() {
        "max" => Ok(0.0),
        t => t
            .parse::<f64>()
            .map_err(|_| format!("{s:?}: give messages per second or `max`")),
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?}: {e} (examples: 500ms, 10s, 2m)"))
}

// ---- schedule -------------------------------------------------------------------------

/// A membership change of `bench rebalance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "n", rename_all = "lowercase")]
pub enum MemberEvent {
    /// N new members start.
    Join(usize),
    /// The N most recent members shut down gracefully.
    Leave(usize),
    /// The N most recent members stop hard (crash).
    Kill(usize),
}

impl std::fmt::Display for MemberEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemberEvent::Join(n) => write!(f, "join {n}"),
            MemberEvent::Leave(n) => write!(f, "leave {n}"),
            MemberEvent::Kill(n) => write!(f, "kill {n}"),
        }
    }
}

/// Parses a schedule (`join:4,leave:4,kill:1`) and checks that it never takes the group below
/// one member, starting from `initial` members.
pub fn parse_schedule(s: &str, initial: usize) -> anyhow::Result<Vec<MemberEvent>> {
    let mut out = Vec::new();
    let mut members = initial;
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((kind, n)) = part.split_once(':') else {
            bail!("schedule entry {part:?} is not KIND:N (join:4, leave:2, kill:1)");
        };
        let n: usize = n
            .trim()
            .parse()
            .with_context(|| format!("schedule entry {part:?}: {n:?} is not a count"))?;
        if n == 0 {
            bail!("schedule entry {part:?}: the count must be at least 1");
        }
        let ev = match kind.trim() {
            "join" => MemberEvent::Join(n),
            "leave" => MemberEvent::Leave(n),
            "kill" => MemberEvent::Kill(n),
            other => bail!("schedule entry {part:?}: unknown kind {other:?} (join, leave, kill)"),
        };
        members = match ev {
            MemberEvent::Join(n) => members + n,
            MemberEvent::Leave(n) | MemberEvent::Kill(n) => {
                if n >= members {
                    bail!("schedule entry {part:?} would leave no consumer (there are {members})");
                }
                members - n
            }
        };
        out.push(ev);
    }
    if out.is_empty() {
        bail!("the schedule is empty");
    }
    Ok(out)
}

// ---- message header -------------------------------------------------------------------

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or_default()
}

/// The header `shoal bench` puts at the start of a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyHeader {
    /// Run id (random per run).
    pub run: u32,
    /// Key unique in the run: producer number << 40 | sequence.
    pub key: u64,
    /// Wall-clock send time, microseconds since the epoch.
    pub sent_us: u64,
}

/// Builds a body of `size` bytes; the header is written when `size >= HEADER_LEN`.
pub fn make_body(size: usize, h: &BodyHeader) -> Vec<u8> {
    let mut body: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
    if size >= HEADER_LEN {
        body[0..4].copy_from_slice(&MAGIC.to_be_bytes());
        body[4..8].copy_from_slice(&h.run.to_be_bytes());
        body[8..16].copy_from_slice(&h.key.to_be_bytes());
        body[16..24].copy_from_slice(&h.sent_us.to_be_bytes());
    }
    body
}

/// Reads the header of a body, if it has one.
pub fn parse_body(body: &[u8]) -> Option<BodyHeader> {
    let magic = u32::from_be_bytes(body.get(0..4)?.try_into().ok()?);
    if magic != MAGIC {
        return None;
    }
    Some(BodyHeader {
        run: u32::from_be_bytes(body.get(4..8)?.try_into().ok()?),
        key: u64::from_be_bytes(body.get(8..16)?.try_into().ok()?),
        sent_us: u64::from_be_bytes(body.get(16..24)?.try_into().ok()?),
    })
}

// ---- latency --------------------------------------------------------------------------

fn histogram() -> Histogram<u64> {
    // 1 µs .. 1 h, 3 significant digits: constant bounds that HdrHistogram accepts.
    #[allow(clippy::expect_used)]
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant histogram bounds are valid")
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Latency {
    /// Samples.
    pub count: u64,
    /// Mean, ms.
    pub mean_ms: f64,
    /// Median, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// 99.9th percentile, ms.
    pub p999_ms: f64,
    /// Maximum, ms.
    pub max_ms: f64,
}

fn ms(us: u64) -> f64 {
    (us as f64 / 1000.0 * 1000.0).round() / 1000.0
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            count: h.len(),
            mean_ms: (h.mean() / 1000.0 * 1000.0).round() / 1000.0,
            p50_ms: ms(h.value_at_quantile(0.5)),
            p90_ms: ms(h.value_at_quantile(0.9)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        }
    }
}

// ---- reports --------------------------------------------------------------------------

/// What was sent.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ProduceReport {
    /// Messages handed to the client.
    pub sent: u64,
    /// Messages the broker acknowledged.
    pub acknowledged: u64,
    /// Messages whose send failed.
    pub errors: u64,
    /// Failed messages by kind of error.
    pub errors_by_kind: BTreeMap<String, u64>,
    /// Acknowledged messages per second over the send period.
    pub msgs_per_s: f64,
    /// Acknowledged body megabytes (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// Send acknowledgement latency (one sample per send call; a batch is one call).
    pub ack_latency: Latency,
}

/// What was consumed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ConsumeReport {
    /// Deliveries of this run's messages to the listeners, duplicates included (`bench
    /// consume`: of every message).
    pub consumed: u64,
    /// Distinct messages of this run consumed.
    pub unique: u64,
    /// Deliveries beyond the first of a message.
    pub duplicates: u64,
    /// Messages without this run's header (other runs, other producers).
    pub foreign: u64,
    /// Acknowledged messages never consumed (after the drain), when the run produced.
    pub lost: Option<u64>,
    /// Deliveries per second, first to last delivery.
    pub msgs_per_s: f64,
    /// Body megabytes (10^6 bytes) per second, first to last delivery.
    pub mb_per_s: f64,
    /// Send -> consume latency, from the send time in the body (wall clock).
    pub e2e_latency: Latency,
}

/// One membership change of `bench rebalance`.
#[derive(Debug, Clone, Serialize)]
pub struct EventReport {
    /// The change (`start 4` for the initial group, then the schedule).
    pub event: String,
    /// Members before.
    pub from: usize,
    /// Members after.
    pub to: usize,
    /// Seconds since the run started.
    pub at_s: f64,
    /// How long the change itself took (starting or shutting down the members), ms.
    pub change_ms: f64,
    /// From the change until every queue had exactly one live owner and every queue had
    /// been consumed by its owner again, ms (`None`: not within the interval).
    pub convergence_ms: Option<f64>,
    /// Longest gap between two consumptions of any queue in the interval, ms.
    pub pause_ms: f64,
    /// Queues whose owner changed.
    pub moved_queues: usize,
    /// Duplicate deliveries during the interval.
    pub duplicates: u64,
    /// Messages sent (and acknowledged) during the interval and never consumed.
    pub lost: u64,
}

/// Results of `bench rebalance`.
#[derive(Debug, Clone, Serialize)]
pub struct RebalanceReport {
    /// Queues in the topic.
    pub queues: usize,
    /// Allocation strategy.
    pub strategy: String,
    /// Group protocol asked for (`auto`, `classic`, `coordinated`).
    pub mode: String,
    /// Longest per-queue gap before the first event (steady state), ms.
    pub baseline_pause_ms: f64,
    /// One entry per membership change.
    pub events: Vec<EventReport>,
}

/// The whole report (`--json` prints it).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// produce, consume, e2e or rebalance.
    pub mode: String,
    /// Topic.
    pub topic: String,
    /// Body size, bytes.
    pub size: usize,
    /// Messages per send.
    pub batch: usize,
    /// Producers.
    pub producers: usize,
    /// Consumers (at the start).
    pub consumers: usize,
    /// Target rate (msgs/s), `None` for as fast as possible.
    pub target_rate: Option<f64>,
    /// Wall time of the run, seconds.
    pub elapsed_s: f64,
    /// Send side.
    pub produce: Option<ProduceReport>,
    /// Consume side.
    pub consume: Option<ConsumeReport>,
    /// Rebalance events.
    pub rebalance: Option<RebalanceReport>,
}

// ---- send side ------------------------------------------------------------------------

/// Kind of a send error, for the report.
pub fn error_kind(e: &ClientError) -> String {
    match e {
        ClientError::SendFailed { last, .. } => error_kind(last),
        ClientError::Net(n) => {
            let s = n.to_string();
            if s.contains("timed out") || s.contains("timeout") {
                "timeout".into()
            } else {
                "network".into()
            }
        }
        ClientError::Server { code, .. } => format!("broker code {code}"),
        ClientError::NoRoute(_) => "no route".into(),
        ClientError::NoBrokerAddr(_) => "no broker address".into(),
        ClientError::InvalidArgument(_) => "invalid message".into(),
        ClientError::NotRunning(_) => "timeout or not running".into(),
        ClientError::Proto(_) => "protocol".into(),
        other => other.to_string(),
    }
}

struct SendStats {
    sent: AtomicU64,
    acked: AtomicU64,
    errors: AtomicU64,
    ack_latency: Mutex<Histogram<u64>>,
    errors_by_kind: Mutex<BTreeMap<String, u64>>,
    /// Keys acknowledged with their send times (only kept when a consumer checks losses).
    acked_keys: Option<Mutex<Vec<(u64, u64)>>>,
    first_send: Mutex<Option<Instant>>,
    last_ack: Mutex<Option<Instant>>,
}

impl SendStats {
    fn new(keep_keys: bool) -> Self {
        SendStats {
            sent: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            ack_latency: Mutex::new(histogram()),
            errors_by_kind: Mutex::new(BTreeMap::new()),
            acked_keys: keep_keys.then(|| Mutex::new(Vec::new())),
            first_send: Mutex::new(None),
            last_ack: Mutex::new(None),
        }
    }

    fn report(&self, size: usize) -> ProduceReport {
        let acked = self.acked.load(Ordering::Acquire);
        let secs = match (*self.first_send.lock(), *self.last_ack.lock()) {
            (Some(a), Some(b)) if b > a => b.duration_since(a).as_secs_f64(),
            _ => 0.0,
        };
        let rate = if secs > 0.0 { acked as f64 / secs } else { 0.0 };
        ProduceReport {
            sent: self.sent.load(Ordering::Acquire),
            acknowledged: acked,
            errors: self.errors.load(Ordering::Acquire),
            errors_by_kind: self.errors_by_kind.lock().clone(),
            msgs_per_s: round1(rate),
            mb_per_s: round3(rate * size as f64 / 1e6),
            ack_latency: Latency::of(&self.ack_latency.lock()),
        }
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// What the producers do.
#[derive(Debug, Clone)]
struct LoadPlan {
    topic: String,
    producers: usize,
    size: usize,
    batch: usize,
    rate: Option<f64>,
    inflight: usize,
    duration: Duration,
    count: Option<u64>,
    run: u32,
    send_timeout: Duration,
}

impl LoadPlan {
    fn new(topic: &str, l: &LoadArgs, run: u32) -> anyhow::Result<Self> {
        if l.producers == 0 {
            bail!("--producers must be at least 1");
        }
        if l.size == 0 || l.size > MAX_BODY {
            bail!("--size must be between 1 and {MAX_BODY} bytes");
        }
        if l.batch == 0 {
            bail!("--batch must be at least 1");
        }
        if l.batch.saturating_mul(l.size + 64) > MAX_BODY {
            bail!(
                "a batch of {} x {} bytes exceeds the {MAX_BODY}-byte message limit",
                l.batch,
                l.size
            );
        }
        if !l.rate.is_finite() || l.rate < 0.0 {
            bail!("--rate must be a number of messages per second, 0 for as fast as possible");
        }
        if l.duration.is_zero() && l.count.is_none() {
            bail!("--duration must be positive");
        }
        if l.count == Some(0) {
            bail!("--count must be at least 1");
        }
        if l.inflight == Some(0) {
            bail!("--inflight must be at least 1");
        }
        let rate = (l.rate > 0.0).then_some(l.rate);
        Ok(LoadPlan {
            topic: topic.to_owned(),
            producers: l.producers,
            size: l.size,
            batch: l.batch,
            rate,
            inflight: l.inflight.unwrap_or(if rate.is_some() { 256 } else { 1 }),
            duration: l.duration,
            count: l.count,
            run,
            send_timeout: l.send_timeout,
        })
    }
}

fn client_config(common: &Common, instance: String) -> ClientConfig {
    ClientConfig {
        instance_name: Some(instance),
        // Checked when the command starts (`run`).
        credentials: common.credentials().ok().flatten(),
        tls: common.client_tls().ok().flatten(),
        ..ClientConfig::new(&common.namesrv)
    }
}

async fn start_producers(common: &Common, plan: &LoadPlan) -> anyhow::Result<Vec<Producer>> {
    let mut out = Vec::with_capacity(plan.producers);
    for i in 0..plan.producers {
        let p = Producer::builder(format!("shoal-bench-pg-{}", plan.run))
            .client_config(client_config(
                common,
                format!("bench{}-{}-p{i}", std::process::id(), plan.run),
            ))
            .send_timeout(plan.send_timeout)
            .start()
            .await
            .with_context(|| format!("starting producer {i}"))?;
        // Routes now, so that the first send's latency is not a route lookup.
        p.publish_queues(&plan.topic)
            .await
            .with_context(|| format!("no route for topic {}", plan.topic))?;
        out.push(p);
    }
    Ok(out)
}

/// Runs the producers to the end of the plan (or until `stop`); returns when every send has
/// completed.
async fn run_producers(
    producers: Vec<Producer>,
    plan: Arc<LoadPlan>,
    stats: Arc<SendStats>,
    stop: Arc<AtomicBool>,
) {
    let tickets = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    *stats.first_send.lock() = Some(started);
    let mut tasks = JoinSet::new();
    for (idx, p) in producers.into_iter().enumerate() {
        let (plan, stats, stop, tickets) =
            (plan.clone(), stats.clone(), stop.clone(), tickets.clone());
        tasks.spawn(async move {
            producer_loop(idx as u64, p.clone(), plan, stats, stop, tickets, started).await;
            p.shutdown().await;
        });
    }
    let deadline_stop = stop.clone();
    let timer = (plan.count.is_none()).then(|| {
        let d = plan.duration;
        tokio::spawn(async move {
            tokio::time::sleep(d).await;
            deadline_stop.store(true, Ordering::Release);
        })
    });
    while tasks.join_next().await.is_some() {}
    if let Some(t) = timer {
        t.abort();
    }
}

async fn producer_loop(
    idx: u64,
    producer: Producer,
    plan: Arc<LoadPlan>,
    stats: Arc<SendStats>,
    stop: Arc<AtomicBool>,
    tickets: Arc<AtomicU64>,
    started: Instant,
) {
    let sem = Arc::new(Semaphore::new(plan.inflight));
    let mut sends = JoinSet::new();
    let period = plan
        .rate
        .map(|r| Duration::from_secs_f64(plan.batch as f64 * plan.producers as f64 / r));
    // Producers start staggered across one period, so their sends interleave.
    let offset = period.map_or(Duration::ZERO, |p| {
        p.mul_f64(idx as f64 / plan.producers as f64)
    });
    let mut seq = 0u64;
    let mut tick = 0u32;
    loop {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let n = match plan.count {
            Some(total) => {
                let t = tickets.fetch_add(plan.batch as u64, Ordering::AcqRel);
                if t >= total {
                    break;
                }
                (total - t).min(plan.batch as u64) as usize
            }
            None => plan.batch,
        };
        if let Some(p) = period {
            let at = started + offset + p.mul_f64(f64::from(tick));
            if plan.count.is_none() && at >= started + plan.duration {
                break;
            }
            tokio::time::sleep_until(at.into()).await;
            if stop.load(Ordering::Acquire) {
                break;
            }
        }
        tick = tick.saturating_add(1);
        // Latency counts from here. Open loop: the timer's own lateness (tokio's timer has
        // 1 ms resolution) is not the broker's, but a wait for an in-flight slot is. Closed
        // loop: a slot frees when the previous send completes, so the wait is not counted.
        let mut due = Instant::now();
        let Ok(permit) = sem.clone().acquire_owned().await else {
            break;
        };
        if period.is_none() {
            due = Instant::now();
        }
        let sent_us = now_us();
        let msgs: Vec<Message> = (0..n)
            .map(|_| {
                let key = (idx << 40) | seq;
                seq += 1;
                let h = BodyHeader {
                    run: plan.run,
                    key,
                    sent_us,
                };
                Message::new(plan.topic.clone(), make_body(plan.size, &h))
            })
            .collect();
        let keys: Vec<u64> = (seq - n as u64..seq).map(|s| (idx << 40) | s).collect();
        stats.sent.fetch_add(n as u64, Ordering::AcqRel);
        let (p, stats) = (producer.clone(), stats.clone());
        sends.spawn(async move {
            let r = if msgs.len() == 1 {
                match msgs.into_iter().next() {
                    Some(m) => p.send(m).await,
                    None => Err(ClientError::InvalidArgument("empty send".into())),
                }
            } else {
                p.send_batch(msgs).await
            };
            let took = due.elapsed();
            match r {
                Ok(_) => {
                    stats.acked.fetch_add(n as u64, Ordering::AcqRel);
                    stats
                        .ack_latency
                        .lock()
                        .saturating_record(took.as_micros().max(1) as u64);
                    if let Some(k) = &stats.acked_keys {
                        k.lock().extend(keys.iter().map(|&key| (key, sent_us)));
                    }
                    let now = Instant::now();
                    let mut last = stats.last_ack.lock();
                    if last.is_none_or(|l| l < now) {
                        *last = Some(now);
                    }
                }
                Err(e) => {
                    stats.errors.fetch_add(n as u64, Ordering::AcqRel);
                    *stats
                        .errors_by_kind
                        .lock()
                        .entry(error_kind(&e))
                        .or_insert(0) += n as u64;
                }
            }
            drop(permit);
        });
        while sends.try_join_next().is_some() {}
    }
    while sends.join_next().await.is_some() {}
}

// ---- consume side ---------------------------------------------------------------------

#[derive(Debug, Clone, Copy, Default)]
struct QueueTrack {
    last: Option<Instant>,
    last_member: usize,
    max_gap: Duration,
}

struct TrackState {
    consumed: u64,
    bytes: u64,
    foreign: u64,
    duplicates: u64,
    /// Deliveries per (run, key).
    seen: HashMap<(u32, u64), u32>,
    e2e: Histogram<u64>,
    first: Option<Instant>,
    last: Option<Instant>,
    queues: Vec<QueueTrack>,
}

/// Shared by every consumer's listener.
struct Tracker {
    topic: String,
    run: Option<u32>,
    queue_index: HashMap<(String, i32), usize>,
    state: Mutex<TrackState>,
}

impl Tracker {
    fn new(run: Option<u32>, queues: &[MessageQueue]) -> Self {
        Tracker {
            topic: queues.first().map(|q| q.topic.clone()).unwrap_or_default(),
            run,
            queue_index: queues
                .iter()
                .enumerate()
                .map(|(i, q)| ((q.broker_name.clone(), q.queue_id), i))
                .collect(),
            state: Mutex::new(TrackState {
                consumed: 0,
                bytes: 0,
                foreign: 0,
                duplicates: 0,
                seen: HashMap::new(),
                e2e: histogram(),
                first: None,
                last: None,
                queues: vec![QueueTrack::default(); queues.len()],
            }),
        }
    }

    fn record<'a>(&self, member: usize, bodies: impl Iterator<Item = &'a [u8]>, mq: &MessageQueue) {
        let now = Instant::now();
        let now_wall = now_us();
        let q = if mq.topic == self.topic {
            self.queue_index
                .get(&(mq.broker_name.clone(), mq.queue_id))
                .copied()
        } else {
            None
        };
        let mut s = self.state.lock();
        if let Some(t) = q.and_then(|q| s.queues.get_mut(q)) {
            if let Some(last) = t.last {
                let gap = now.saturating_duration_since(last);
                if gap > t.max_gap {
                    t.max_gap = gap;
                }
            }
            if t.last.is_none_or(|l| l <= now) {
                t.last = Some(now);
                t.last_member = member;
            }
        }
        let mut counted = false;
        for body in bodies {
            match parse_body(body) {
                Some(h) if self.run.is_none_or(|r| r == h.run) => {
                    s.e2e
                        .saturating_record(now_wall.saturating_sub(h.sent_us).max(1));
                    let c = s.seen.entry((h.run, h.key)).or_insert(0);
                    *c += 1;
                    if *c > 1 {
                        s.duplicates += 1;
                    }
                }
                _ => {
                    s.foreign += 1;
                    // Another run's messages are not this run's consumption (`bench consume`,
                    // which has no run, counts everything).
                    if self.run.is_some() {
                        continue;
                    }
                }
            }
            counted = true;
            s.consumed += 1;
            s.bytes += body.len() as u64;
        }
        if counted {
            s.first.get_or_insert(now);
            s.last = Some(now);
        }
    }

    fn consumed(&self) -> u64 {
        self.state.lock().consumed
    }

    fn report(&self, lost: Option<u64>) -> ConsumeReport {
        let s = self.state.lock();
        let secs = match (s.first, s.last) {
            (Some(a), Some(b)) if b > a => b.duration_since(a).as_secs_f64(),
            _ => 0.0,
        };
        let rate = |x: u64| if secs > 0.0 { x as f64 / secs } else { 0.0 };
        ConsumeReport {
            consumed: s.consumed,
            unique: s.seen.len() as u64,
            duplicates: s.duplicates,
            foreign: s.foreign,
            lost,
            msgs_per_s: round1(rate(s.consumed)),
            mb_per_s: round3(rate(s.bytes) / 1e6),
            e2e_latency: Latency::of(&s.e2e),
        }
    }

    /// Send times of the acknowledged messages not consumed.
    fn missing(&self, acked: &[(u64, u64)]) -> Vec<u64> {
        let run = self.run.unwrap_or_default();
        let s = self.state.lock();
        acked
            .iter()
            .filter(|(k, _)| !s.seen.contains_key(&(run, *k)))
            .map(|&(_, sent)| sent)
            .collect()
    }
}

/// One consumer of the benchmark group.
struct Member {
    id: usize,
    consumer: PushConsumer,
    alive: Arc<AtomicBool>,
}

#[derive(Debug, Clone)]
struct GroupSpec {
    group: String,
    topic: String,
    strategy: String,
    protocol: shoal_client::GroupProtocol,
    from: ConsumeFromWhere,
    from_ts_ms: i64,
    rebalance_interval: Duration,
    persist_offset_interval: Duration,
    run: u32,
}

async fn start_member(
    common: &Common,
    spec: &GroupSpec,
    id: usize,
    tracker: &Arc<Tracker>,
) -> anyhow::Result<Member> {
    let alive = Arc::new(AtomicBool::new(true));
    let (t, a) = (tracker.clone(), alive.clone());
    let listener = MessageListener::concurrently(move |msgs, ctx| {
        // A killed member's late deliveries do not count: a crashed process would not have
        // processed them.
        if a.load(Ordering::Acquire) {
            t.record(id, msgs.iter().map(|m| &m.body[..]), &ctx.message_queue);
        }
        ConsumeConcurrentlyStatus::ConsumeSuccess
    });
    let mut cfg = client_config(
        common,
        format!("bench{}-{}-c{id}", std::process::id(), spec.run),
    );
    cfg.persist_offset_interval = spec.persist_offset_interval;
    let consumer = PushConsumer::builder(spec.group.clone())
        .client_config(cfg)
        .subscribe(spec.topic.clone(), "*")
        .allocate_strategy(spec.strategy.clone())
        .protocol(spec.protocol)
        .rebalance_interval(spec.rebalance_interval)
        .consume_from_where(spec.from)
        .consume_timestamp_ms(spec.from_ts_ms)
        .consume_batch_size(32)
        .start(listener)
        .await
        .with_context(|| format!("starting consumer {id}"))?;
    Ok(Member {
        id,
        consumer,
        alive,
    })
}

/// Every queue owned by exactly one member: the owner per queue index.
fn ownership(members: &[Member], tracker: &Tracker, nq: usize) -> Option<Vec<usize>> {
    let mut owner: Vec<Option<usize>> = vec![None; nq];
    for m in members {
        for q in m.consumer.owned_queues() {
            if q.topic != tracker.topic {
                continue;
            }
            if let Some(&i) = tracker
                .queue_index
                .get(&(q.broker_name.clone(), q.queue_id))
            {
                let slot = owner.get_mut(i)?;
                if slot.is_some() {
                    return None;
                }
                *slot = Some(m.id);
            }
        }
    }
    owner.into_iter().collect()
}

/// Ownership is single and every queue was consumed by its owner since `since`.
fn converged(
    members: &[Member],
    tracker: &Tracker,
    nq: usize,
    since: Instant,
) -> Option<Vec<usize>> {
    let owners = ownership(members, tracker, nq)?;
    let s = tracker.state.lock();
    let ok = owners
        .iter()
        .zip(&s.queues)
        .all(|(o, t)| t.last_member == *o && t.last.is_some_and(|l| l >= since));
    ok.then_some(owners)
}

// ---- helpers --------------------------------------------------------------------------

fn random_run() -> u32 {
    let n = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(16))
        .unwrap_or_default();
    n ^ std::process::id().rotate_left(8)
}

fn admin(common: &Common) -> AdminClient {
    let admin = AdminClient::new(
        common
            .namesrv
            .split([';', ','])
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
    )
    .with_timeout(Duration::from_secs(5));
    let admin = match common.client_tls() {
        Ok(Some(tls)) => admin.with_tls(tls),
        _ => admin,
    };
    match common.credentials() {
        Ok(Some(c)) => admin.with_credentials(c),
        _ => admin,
    }
}

/// Creates the topic (unless told not to) and returns its subscribe queues once routed.
async fn prepare_topic(
    common: &Common,
    topic: &str,
    queues: i32,
    create: bool,
) -> anyhow::Result<Vec<MessageQueue>> {
    shoal_client::producer::validate_topic(topic).context("bad --topic")?;
    if !(1..=1024).contains(&queues) {
        bail!("--queues must be between 1 and 1024");
    }
    let admin = admin(common);
    let result = async {
        if create {
            admin
                .create_topic(&TopicSpec::new(topic, queues), None)
                .await
                .with_context(|| format!("creating topic {topic}"))?;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match admin.topic_route(topic).await {
                Ok(r) => {
                    let qs = r.subscribe_queues(topic);
                    let per_broker_ok = !create
                        || r.queue_datas
                            .iter()
                            .all(|d| d.read_queue_nums == queues && d.write_queue_nums == queues);
                    if !qs.is_empty() && per_broker_ok {
                        return Ok(qs);
                    }
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(anyhow::Error::from(e).context(format!("no route for {topic}")))
                }
                Err(_) => {}
            }
            if Instant::now() >= deadline {
                bail!("topic {topic} is not routed with {queues} queues after 10 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    .await;
    admin.shutdown();
    result
}

fn progress_bar() -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    if std::io::stderr().is_terminal() {
        pb.set_draw_target(ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}") {
            pb.set_style(style);
        }
    } else {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    pb
}

/// A live progress line (on a terminal): counts and rates of the last second.
fn spawn_progress(
    pb: ProgressBar,
    send: Option<Arc<SendStats>>,
    recv: Option<Arc<Tracker>>,
    extra: Arc<Mutex<String>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = (0u64, 0u64, Instant::now());
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let acked = send.as_ref().map_or(0, |s| s.acked.load(Ordering::Acquire));
            let consumed = recv.as_ref().map_or(0, |r| r.consumed());
            let dt = last.2.elapsed().as_secs_f64().max(1e-3);
            let mut msg = String::new();
            if let Some(s) = &send {
                msg.push_str(&format!(
                    "acked {acked} ({:.0}/s) errors {} ",
                    (acked - last.0) as f64 / dt,
                    s.errors.load(Ordering::Acquire)
                ));
            }
            if recv.is_some() {
                msg.push_str(&format!(
                    "consumed {consumed} ({:.0}/s) ",
                    (consumed - last.1) as f64 / dt
                ));
            }
            msg.push_str(&extra.lock());
            pb.set_message(msg);
            pb.tick();
            last = (acked, consumed, Instant::now());
        }
    })
}

fn fresh_group(run: u32) -> String {
    format!("shoal-bench-{}-{run}", std::process::id())
}

// ---- commands -------------------------------------------------------------------------

/// Runs a `shoal bench` command and prints its report (a table, or JSON with `--json`).
pub async fn run(common: &Common, cmd: BenchCmd) -> anyhow::Result<()> {
    // A bad credentials file or bad TLS options are reported here, once.
    common.credentials()?;
    common.client_tls()?;
    let report = match cmd {
        BenchCmd::Produce(a) => produce(common, a).await?,
        BenchCmd::Consume(a) => consume(common, a).await?,
        BenchCmd::E2e(a) => e2e(common, a).await?,
        BenchCmd::Rebalance(a) => rebalance(common, a).await?,
    };
    if common.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

async fn produce(common: &Common, a: ProduceArgs) -> anyhow::Result<Report> {
    let run = random_run();
    let plan = Arc::new(LoadPlan::new(&a.topic.topic, &a.load, run)?);
    prepare_topic(common, &plan.topic, a.topic.queues, !a.topic.no_create).await?;
    let producers = start_producers(common, &plan).await?;
    let stats = Arc::new(SendStats::new(false));
    let pb = progress_bar();
    let prog = spawn_progress(pb.clone(), Some(stats.clone()), None, Arc::default());
    let t0 = Instant::now();
    run_producers(producers, plan.clone(), stats.clone(), Arc::default()).await;
    prog.abort();
    pb.finish_and_clear();
    Ok(Report {
        mode: "produce".into(),
        topic: plan.topic.clone(),
        size: plan.size,
        batch: plan.batch,
        producers: plan.producers,
        consumers: 0,
        target_rate: plan.rate,
        elapsed_s: round3(t0.elapsed().as_secs_f64()),
        produce: Some(stats.report(plan.size)),
        consume: None,
        rebalance: None,
    })
}

fn check_group(g: &GroupArgs) -> anyhow::Result<()> {
    if g.consumers == 0 {
        bail!("--consumers must be at least 1");
    }
    check_strategy(&g.strategy)
}

fn check_strategy(s: &str) -> anyhow::Result<()> {
    if shoal_group::strategy_by_name(s).is_err() {
        bail!(
            "unknown allocation strategy {s:?}; known: {}",
            shoal_group::STRATEGY_NAMES.join(", ")
        );
    }
    Ok(())
}

/// Starts `n` members and waits (up to 15 s) until every queue has one owner and the
/// assignment stayed the same for `settle` (members joining one after the other can pass
/// through states that look complete).
async fn start_group(
    common: &Common,
    spec: &GroupSpec,
    n: usize,
    tracker: &Arc<Tracker>,
    settle: Duration,
) -> anyhow::Result<Vec<Member>> {
    let mut members = Vec::with_capacity(n);
    for id in 0..n {
        members.push(start_member(common, spec, id, tracker).await?);
    }
    let nq = tracker.queue_index.len();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut last: Option<Vec<usize>> = None;
    let mut same_since = Instant::now();
    loop {
        let owners = ownership(&members, tracker, nq);
        if owners.is_none() || owners != last {
            same_since = Instant::now();
        } else if same_since.elapsed() >= settle {
            break;
        }
        last = owners;
        if Instant::now() >= deadline {
            for m in &members {
                m.consumer.shutdown().await;
            }
            bail!("the consumer group did not settle on an assignment of every queue within 15 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(members)
}

async fn consume(common: &Common, a: ConsumeArgs) -> anyhow::Result<Report> {
    check_group(&a.group)?;
    if a.count == Some(0) {
        bail!("--count must be at least 1");
    }
    let run = random_run();
    let queues = prepare_topic(common, &a.topic.topic, a.topic.queues, !a.topic.no_create).await?;
    let tracker = Arc::new(Tracker::new(None, &queues));
    let spec = GroupSpec {
        group: a.group.group.clone().unwrap_or_else(|| fresh_group(run)),
        topic: a.topic.topic.clone(),
        strategy: a.group.strategy.clone(),
        protocol: shoal_client::GroupProtocol::Auto,
        from: if a.from == "first" {
            ConsumeFromWhere::ConsumeFromFirstOffset
        } else {
            ConsumeFromWhere::ConsumeFromLastOffset
        },
        from_ts_ms: 0,
        rebalance_interval: Duration::from_secs(20),
        persist_offset_interval: Duration::from_secs(5),
        run,
    };
    let pb = progress_bar();
    let prog = spawn_progress(pb.clone(), None, Some(tracker.clone()), Arc::default());
    let t0 = Instant::now();
    let members = start_group(
        common,
        &spec,
        a.group.consumers,
        &tracker,
        Duration::from_secs(1),
    )
    .await?;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (n, last) = {
            let s = tracker.state.lock();
            (s.consumed, s.last)
        };
        if a.count.is_some_and(|c| n >= c)
            || t0.elapsed() >= a.duration
            || last.is_some_and(|l| l.elapsed() >= a.idle)
        {
            break;
        }
    }
    for m in &members {
        m.consumer.shutdown().await;
    }
    prog.abort();
    pb.finish_and_clear();
    Ok(Report {
        mode: "consume".into(),
        topic: spec.topic.clone(),
        size: 0,
        batch: 0,
        producers: 0,
        consumers: a.group.consumers,
        target_rate: None,
        elapsed_s: round3(t0.elapsed().as_secs_f64()),
        produce: None,
        consume: Some(tracker.report(None)),
        rebalance: None,
    })
}

/// Waits until every acknowledged key was consumed or `drain` passed; returns the send times
/// of the messages lost.
async fn drain(stats: &SendStats, tracker: &Tracker, drain: Duration) -> Vec<u64> {
    let deadline = Instant::now() + drain;
    loop {
        let acked = stats
            .acked_keys
            .as_ref()
            .map(|k| k.lock().clone())
            .unwrap_or_default();
        let unique = tracker.state.lock().seen.len();
        if unique >= acked.len() || Instant::now() >= deadline {
            let missing = tracker.missing(&acked);
            if missing.is_empty() || Instant::now() >= deadline {
                return missing;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn e2e(common: &Common, a: E2eArgs) -> anyhow::Result<Report> {
    check_group(&a.group)?;
    let run = random_run();
    let plan = Arc::new(LoadPlan::new(&a.topic.topic, &a.load, run)?);
    if plan.size < HEADER_LEN {
        bail!("e2e needs --size of at least {HEADER_LEN} bytes (the benchmark header)");
    }
    let queues = prepare_topic(common, &plan.topic, a.topic.queues, !a.topic.no_create).await?;
    let tracker = Arc::new(Tracker::new(Some(run), &queues));
    let spec = GroupSpec {
        group: a.group.group.clone().unwrap_or_else(|| fresh_group(run)),
        topic: plan.topic.clone(),
        strategy: a.group.strategy.clone(),
        protocol: shoal_client::GroupProtocol::Auto,
        from: ConsumeFromWhere::ConsumeFromTimestamp,
        from_ts_ms: (now_us() / 1000) as i64 - 1000,
        rebalance_interval: Duration::from_secs(20),
        persist_offset_interval: Duration::from_secs(5),
        run,
    };
    let members = start_group(
        common,
        &spec,
        a.group.consumers,
        &tracker,
        Duration::from_secs(1),
    )
    .await?;
    let producers = start_producers(common, &plan).await?;
    let stats = Arc::new(SendStats::new(true));
    let pb = progress_bar();
    let prog = spawn_progress(
        pb.clone(),
        Some(stats.clone()),
        Some(tracker.clone()),
        Arc::default(),
    );
    let t0 = Instant::now();
    run_producers(producers, plan.clone(), stats.clone(), Arc::default()).await;
    let lost = drain(&stats, &tracker, a.drain).await;
    for m in &members {
        m.consumer.shutdown().await;
    }
    prog.abort();
    pb.finish_and_clear();
    Ok(Report {
        mode: "e2e".into(),
        topic: plan.topic.clone(),
        size: plan.size,
        batch: plan.batch,
        producers: plan.producers,
        consumers: a.group.consumers,
        target_rate: plan.rate,
        elapsed_s: round3(t0.elapsed().as_secs_f64()),
        produce: Some(stats.report(plan.size)),
        consume: Some(tracker.report(Some(lost.len() as u64))),
        rebalance: None,
    })
}

fn reset_gaps(tracker: &Tracker) {
    for q in tracker.state.lock().queues.iter_mut() {
        q.max_gap = Duration::ZERO;
    }
}

/// Longest gap of any queue in the current window, the gap still open included.
fn window_pause(tracker: &Tracker, now: Instant) -> Duration {
    tracker
        .state
        .lock()
        .queues
        .iter()
        .map(|q| {
            let open = q
                .last
                .map_or(Duration::ZERO, |l| now.saturating_duration_since(l));
            q.max_gap.max(open)
        })
        .max()
        .unwrap_or_default()
}

async fn rebalance(common: &Common, a: RebalanceArgs) -> anyhow::Result<Report> {
    if a.consumers == 0 {
        bail!("--consumers must be at least 1");
    }
    check_strategy(&a.strategy)?;
    let schedule = parse_schedule(&a.schedule, a.consumers)?;
    if a.size < HEADER_LEN {
        bail!("rebalance needs --size of at least {HEADER_LEN} bytes (the benchmark header)");
    }
    if !(a.rate.is_finite() && a.rate > 0.0) {
        bail!("rebalance needs a positive --rate (steady load)");
    }
    if a.interval < Duration::from_millis(500) {
        bail!("--interval must be at least 500ms");
    }
    let run = random_run();
    let load = LoadArgs {
        producers: a.producers,
        size: a.size,
        batch: 1,
        rate: a.rate,
        inflight: None,
        // An upper bound: the load is stopped after the last event's interval.
        duration: a.interval * (schedule.len() as u32 + 4),
        count: None,
        send_timeout: Duration::from_secs(3),
    };
    let plan = Arc::new(LoadPlan::new(&a.topic, &load, run)?);
    let queues = prepare_topic(common, &a.topic, a.queues, !a.no_create).await?;
    let nq = queues.len();
    let tracker = Arc::new(Tracker::new(Some(run), &queues));
    let spec = GroupSpec {
        group: a.group.clone().unwrap_or_else(|| fresh_group(run)),
        topic: a.topic.clone(),
        strategy: a.strategy.clone(),
        protocol: a.mode,
        from: ConsumeFromWhere::ConsumeFromTimestamp,
        from_ts_ms: (now_us() / 1000) as i64 - 1000,
        rebalance_interval: a.rebalance_interval,
        persist_offset_interval: a.persist_offset_interval,
        run,
    };
    let t_start = Instant::now();
    let extra = Arc::new(Mutex::new(String::new()));
    let stats = Arc::new(SendStats::new(true));
    let pb = progress_bar();
    let prog = spawn_progress(
        pb.clone(),
        Some(stats.clone()),
        Some(tracker.clone()),
        extra.clone(),
    );
    let change0 = Instant::now();
    let mut wall_starts = vec![now_us()];
    let mut members = start_group(common, &spec, a.consumers, &tracker, Duration::ZERO).await?;
    let mut next_id = members.len();
    let start_change = change0.elapsed();
    let producers = start_producers(common, &plan).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let load_task = tokio::spawn(run_producers(
        producers,
        plan.clone(),
        stats.clone(),
        stop.clone(),
    ));
    let mut events = Vec::new();
    // Initial group: converged once every queue is consumed by its owner.
    let start_end = change0 + a.interval;
    let start = wait_converged(&members, &tracker, nq, change0, start_end).await;
    let start_conv = start.as_ref().map(|(at, _)| at.duration_since(change0));
    let mut owners = start.map(|(_, o)| o);
    // One more interval of steady state: the baseline pause.
    reset_gaps(&tracker);
    let base_end = start_end + a.interval;
    tokio::time::sleep_until(base_end.into()).await;
    let baseline = window_pause(&tracker, Instant::now());
    events.push(EventReport {
        event: format!("start {}", a.consumers),
        from: 0,
        to: a.consumers,
        at_s: 0.0,
        change_ms: ms(start_change.as_micros() as u64),
        convergence_ms: start_conv.map(|d| ms(d.as_micros() as u64)),
        pause_ms: ms(baseline.as_micros() as u64),
        moved_queues: nq,
        duplicates: 0,
        lost: 0,
    });
    let mut graveyard: Vec<Member> = Vec::new();
    for ev in &schedule {
        let from = members.len();
        *extra.lock() = format!("| {ev} ({from} members)");
        reset_gaps(&tracker);
        let dups_before = tracker.state.lock().duplicates;
        let t0 = Instant::now();
        wall_starts.push(now_us());
        match *ev {
            MemberEvent::Join(n) => {
                // The new members start at once, as a scale-out would.
                let mut starting = JoinSet::new();
                for id in next_id..next_id + n {
                    let (c, sp, t) = (common.clone(), spec.clone(), tracker.clone());
                    starting.spawn(async move { start_member(&c, &sp, id, &t).await });
                }
                next_id += n;
                let mut joined = Vec::with_capacity(n);
                while let Some(r) = starting.join_next().await {
                    joined.push(r.context("a consumer start task failed")??);
                }
                joined.sort_by_key(|m| m.id);
                members.extend(joined);
            }
            MemberEvent::Leave(n) => {
                // The leaving members shut down at once, as a scale-in would. A graceful leave
                // finishes its in-flight messages and commits their offsets: they count as
                // consumed.
                let leaving: Vec<Member> = (0..n).filter_map(|_| members.pop()).collect();
                let mut stopping = JoinSet::new();
                for m in &leaving {
                    let c = m.consumer.clone();
                    stopping.spawn(async move { c.shutdown().await });
                }
                while stopping.join_next().await.is_some() {}
                for m in leaving {
                    m.alive.store(false, Ordering::Release);
                }
            }
            MemberEvent::Kill(n) => {
                for _ in 0..n {
                    if let Some(m) = members.pop() {
                        m.alive.store(false, Ordering::Release);
                        m.consumer.instance().shutdown();
                        graveyard.push(m);
                    }
                }
            }
        }
        let change = t0.elapsed();
        let end = t0 + a.interval;
        let result = wait_converged(&members, &tracker, nq, t0, end).await;
        let convergence = result.as_ref().map(|(at, _)| at.duration_since(t0));
        let new_owners = result.map(|(_, o)| o);
        let moved = match (&owners, &new_owners) {
            (Some(o), Some(n)) => o.iter().zip(n).filter(|(x, y)| x != y).count(),
            _ => nq,
        };
        if new_owners.is_some() {
            owners = new_owners;
        }
        let pause = window_pause(&tracker, Instant::now());
        events.push(EventReport {
            event: ev.to_string(),
            from,
            to: members.len(),
            at_s: round3(t0.duration_since(t_start).as_secs_f64()),
            change_ms: ms(change.as_micros() as u64),
            convergence_ms: convergence.map(|d| ms(d.as_micros() as u64)),
            pause_ms: ms(pause.as_micros() as u64),
            moved_queues: moved,
            duplicates: tracker.state.lock().duplicates - dups_before,
            lost: 0,
        });
    }
    stop.store(true, Ordering::Release);
    load_task.await.context("the load task failed")?;
    *extra.lock() = "| draining".into();
    let lost = drain(&stats, &tracker, a.drain).await;
    for (e, n) in events
        .iter_mut()
        .zip(losses_per_interval(&wall_starts, &lost))
    {
        e.lost = n;
    }
    for m in &members {
        m.consumer.shutdown().await;
    }
    drop(graveyard);
    prog.abort();
    pb.finish_and_clear();
    Ok(Report {
        mode: "rebalance".into(),
        topic: a.topic.clone(),
        size: a.size,
        batch: 1,
        producers: a.producers,
        consumers: a.consumers,
        target_rate: Some(a.rate),
        elapsed_s: round3(t_start.elapsed().as_secs_f64()),
        produce: Some(stats.report(a.size)),
        consume: Some(tracker.report(Some(lost.len() as u64))),
        rebalance: Some(RebalanceReport {
            queues: nq,
            strategy: a.strategy.clone(),
            mode: format!("{:?}", a.mode).to_ascii_lowercase(),
            baseline_pause_ms: ms(baseline.as_micros() as u64),
            events,
        }),
    })
}

/// Watches the group (every 5 ms) from a change at `since` to `until`; returns when it
/// converged: the first moment from which every queue kept the same single live owner until
/// `until`, every queue having been consumed by that owner since the change; and the final
/// owners. `None` when the assignment was still incomplete or changing at `until`.
async fn wait_converged(
    members: &[Member],
    tracker: &Tracker,
    nq: usize,
    since: Instant,
    until: Instant,
) -> Option<(Instant, Vec<usize>)> {
    let mut last: Option<Vec<usize>> = None;
    let mut at: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let owners = ownership(members, tracker, nq);
        if owners.is_none() || owners != last {
            at = None;
        }
        if at.is_none()
            && converged(members, tracker, nq, since).is_some_and(|o| Some(&o) == owners.as_ref())
        {
            at = Some(now);
        }
        last = owners;
        if now >= until {
            return at.zip(last);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Counts lost messages per interval: interval `i` starts at `starts[i]` (wall-clock µs,
/// ascending) and ends where the next begins; a message sent before the first start counts in
/// the first interval.
fn losses_per_interval(starts: &[u64], lost_sent_us: &[u64]) -> Vec<u64> {
    let mut out = vec![0u64; starts.len()];
    for sent in lost_sent_us {
        let i = starts.partition_point(|&w| w <= *sent).saturating_sub(1);
        if let Some(n) = out.get_mut(i) {
            *n += 1;
        }
    }
    out
}

// ---- rendering ------------------------------------------------------------------------

fn latency_row(name: &str, l: &Latency) -> String {
    format!(
        "{name:<14} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>10}\n",
        l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms, l.mean_ms, l.count
    )
}

/// The human-readable table of a report.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let rate = r
        .target_rate
        .map_or_else(|| "max".to_string(), |x| format!("{x} msgs/s"));
    s.push_str(&format!(
        "bench {} on {}: {} B x batch {}, {} producer(s), {} consumer(s), rate {rate}, {:.1} s\n",
        r.mode, r.topic, r.size, r.batch, r.producers, r.consumers, r.elapsed_s
    ));
    if let Some(p) = &r.produce {
        s.push_str(&format!(
            "sent {}  acknowledged {}  errors {}  |  {:.1} msgs/s  {:.3} MB/s\n",
            p.sent, p.acknowledged, p.errors, p.msgs_per_s, p.mb_per_s
        ));
        for (k, n) in &p.errors_by_kind {
            s.push_str(&format!("  error {k}: {n}\n"));
        }
    }
    if let Some(c) = &r.consume {
        let lost = c.lost.map_or_else(|| "-".to_string(), |l| l.to_string());
        s.push_str(&format!(
            "consumed {}  unique {}  duplicates {}  lost {lost}  foreign {}  |  {:.1} msgs/s  {:.3} MB/s\n",
            c.consumed, c.unique, c.duplicates, c.foreign, c.msgs_per_s, c.mb_per_s
        ));
    }
    s.push_str(&format!(
        "{:<14} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}\n",
        "latency (ms)", "p50", "p90", "p99", "p99.9", "max", "mean", "samples"
    ));
    if let Some(p) = &r.produce {
        s.push_str(&latency_row("send ack", &p.ack_latency));
    }
    if let Some(c) = &r.consume {
        s.push_str(&latency_row("end to end", &c.e2e_latency));
    }
    if let Some(rb) = &r.rebalance {
        s.push_str(&format!(
            "rebalance over {} queues ({}, {} mode), steady-state pause {:.1} ms\n",
            rb.queues, rb.strategy, rb.mode, rb.baseline_pause_ms
        ));
        s.push_str(&format!(
            "{:<10} {:>7} {:>8} {:>10} {:>13} {:>10} {:>6} {:>10} {:>6}\n",
            "event",
            "members",
            "at (s)",
            "change ms",
            "converged ms",
            "pause ms",
            "moved",
            "duplicates",
            "lost"
        ));
        for e in &rb.events {
            let conv = e
                .convergence_ms
                .map_or_else(|| "no".to_string(), |c| format!("{c:.1}"));
            s.push_str(&format!(
                "{:<10} {:>7} {:>8.1} {:>10.1} {:>13} {:>10.1} {:>6} {:>10} {:>6}\n",
                e.event,
                format!("{}->{}", e.from, e.to),
                e.at_s,
                e.change_ms,
                conv,
                e.pause_ms,
                e.moved_queues,
                e.duplicates,
                e.lost
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: BenchCmd,
    }

    fn parse(args: &[&str]) -> Result<BenchCmd, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.cmd)
    }

    #[test]
    fn body_header_round_trip() {
        let h = BodyHeader {
            run: 7,
            key: (3 << 40) | 99,
            sent_us: 1_700_000_000_000_000,
        };
        let b = make_body(128, &h);
        assert_eq!(b.len(), 128);
        assert_eq!(parse_body(&b), Some(h));
        // Too short for a header: plain filler, not recognised.
        let short = make_body(10, &h);
        assert_eq!(short.len(), 10);
        assert_eq!(parse_body(&short), None);
        assert_eq!(parse_body(b"hello world, this is not a bench body"), None);
        assert_eq!(parse_body(&[]), None);
    }

    #[test]
    fn schedule_parsing() {
        assert_eq!(
            parse_schedule("join:4, leave:4,kill:1", 4).unwrap(),
            vec![
                MemberEvent::Join(4),
                MemberEvent::Leave(4),
                MemberEvent::Kill(1)
            ]
        );
        for (bad, why) in [
            ("", "empty"),
            ("join", "KIND:N"),
            ("join:x", "not a count"),
            ("join:0", "at least 1"),
            ("grow:2", "unknown kind"),
            ("leave:4", "no consumer"),
            ("join:1,kill:5", "no consumer"),
        ] {
            let e = parse_schedule(bad, 4).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn argument_errors() {
        // Unknown mode, bad duration, count with duration.
        assert!(parse(&["fly"]).is_err());
        assert!(parse(&["produce", "--duration", "soon"]).is_err());
        assert!(parse(&["produce", "--duration", "1s", "--count", "5"]).is_err());
        assert!(parse(&["consume", "--from", "middle"]).is_err());
        // Values clap accepts but the plan rejects.
        let load = |args: &[&str]| match parse(args) {
            Ok(BenchCmd::Produce(p)) => LoadPlan::new("T", &p.load, 1),
            other => panic!("{other:?}"),
        };
        for (args, why) in [
            (&["produce", "--producers", "0"][..], "--producers"),
            (&["produce", "--size", "0"][..], "--size"),
            (&["produce", "--batch", "0"][..], "--batch"),
            (&["produce", "--rate=-5"][..], "--rate"),
            (&["produce", "--count", "0"][..], "--count"),
            (&["produce", "--inflight", "0"][..], "--inflight"),
            (
                &["produce", "--size", "1048576", "--batch", "8"][..],
                "exceeds",
            ),
        ] {
            let e = load(args).unwrap_err().to_string();
            assert!(e.contains(why), "{args:?}: {e}");
        }
        let ok = load(&["produce", "--rate", "1000", "--producers", "2"]).unwrap();
        assert_eq!(ok.rate, Some(1000.0));
        assert_eq!(ok.inflight, 256);
        let max = load(&["produce"]).unwrap();
        assert_eq!((max.rate, max.inflight), (None, 1));
        assert!(check_strategy("NOPE").is_err());
        assert!(check_strategy("AVG").is_ok());
    }

    #[test]
    fn latency_percentiles() {
        let mut h = histogram();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap();
        }
        let l = Latency::of(&h);
        assert_eq!(l.count, 1000);
        assert!((l.p50_ms - 500.0).abs() < 1.0, "{l:?}");
        assert!((l.p99_ms - 990.0).abs() < 1.5, "{l:?}");
        assert!((l.max_ms - 1000.0).abs() < 1.5, "{l:?}");
        assert_eq!(Latency::of(&histogram()), Latency::default());
    }

    #[test]
    fn tracker_counts_duplicates_gaps_and_foreign() {
        let qs: Vec<MessageQueue> = (0..2).map(|i| MessageQueue::new("T", "b", i)).collect();
        let t = Tracker::new(Some(5), &qs);
        let mk = |run: u32, key: u64| {
            make_body(
                32,
                &BodyHeader {
                    run,
                    key,
                    sent_us: now_us(),
                },
            )
        };
        t.record(0, [mk(5, 1), mk(5, 2)].iter().map(|b| &b[..]), &qs[0]);
        t.record(1, [mk(5, 1), mk(6, 1)].iter().map(|b| &b[..]), &qs[1]);
        let r = t.report(None);
        assert_eq!(
            (r.consumed, r.unique, r.duplicates, r.foreign),
            (3, 2, 1, 1)
        );
        assert_eq!(t.missing(&[(1, 10), (2, 20), (3, 30)]), vec![30]);
        let s = t.state.lock();
        assert_eq!(s.queues[0].last_member, 0);
        assert_eq!(s.queues[1].last_member, 1);
    }

    #[test]
    fn losses_go_to_the_interval_they_were_sent_in() {
        let starts = [100, 200, 300];
        assert_eq!(
            losses_per_interval(&starts, &[50, 100, 150, 299, 300, 1000]),
            vec![3, 1, 2]
        );
        assert_eq!(losses_per_interval(&starts, &[]), vec![0, 0, 0]);
        assert!(losses_per_interval(&[], &[5]).is_empty());
    }

    #[test]
    fn error_kinds() {
        let e = ClientError::SendFailed {
            attempts: 3,
            last: Box::new(ClientError::Server {
                what: "send",
                code: 14,
                remark: "busy".into(),
            }),
        };
        assert_eq!(error_kind(&e), "broker code 14");
        assert_eq!(error_kind(&ClientError::NoRoute("T".into())), "no route");
    }

    #[test]
    fn render_has_every_section() {
        let r = Report {
            mode: "rebalance".into(),
            topic: "T".into(),
            size: 128,
            batch: 1,
            producers: 1,
            consumers: 4,
            target_rate: Some(1000.0),
            elapsed_s: 1.0,
            produce: Some(ProduceReport::default()),
            consume: Some(ConsumeReport::default()),
            rebalance: Some(RebalanceReport {
                queues: 16,
                strategy: "AVG".into(),
                mode: "auto".into(),
                baseline_pause_ms: 3.0,
                events: vec![EventReport {
                    event: "join 4".into(),
                    from: 4,
                    to: 8,
                    at_s: 10.0,
                    change_ms: 5.0,
                    convergence_ms: None,
                    pause_ms: 100.0,
                    moved_queues: 8,
                    duplicates: 0,
                    lost: 0,
                }],
            }),
        };
        let text = render(&r);
        for needle in ["send ack", "end to end", "join 4", "4->8", "p99.9", "no "] {
            assert!(text.contains(needle), "{needle} missing in\n{text}");
        }
    }
}
