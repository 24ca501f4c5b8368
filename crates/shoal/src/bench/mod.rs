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
//!
//! The pieces: this module holds the command line, the body header, latency histograms, the
//! report and its table; `load` the producers and `bench produce|consume|e2e`; `pop` the POP
//! consumers of `bench consume --pop`; `track` what the consumers deliver (the tracker and its
//! delivery log); `rebalance` `bench rebalance`.

mod load;
mod pop;
mod rebalance;
mod track;

use crate::admin_cmd::Common;
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use load::{ConsumeArgs, E2eArgs, ProduceArgs, SendStats};
use parking_lot::Mutex;
pub(crate) use rebalance::RebalanceArgs;
use rebalance::RebalanceReport;
use serde::Serialize;
use shoal_client::admin::TopicSpec;
use shoal_client::{ClientConfig, MessageQueue};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use track::Tracker;

/// Magic number at the start of a benchmark body ("SHOL").
const MAGIC: u32 = 0x5348_4F4C;
/// Length of the benchmark header in a body.
pub(crate) const HEADER_LEN: usize = 24;
/// Largest body the tool sends (RocketMQ's default message size limit).
const MAX_BODY: usize = 4 * 1024 * 1024;

/// `shoal bench ...`
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCmd {
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
pub(crate) struct TopicArgs {
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
pub(crate) struct LoadArgs {
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
pub(crate) struct GroupArgs {
    /// Number of consumers in the group (each its own client instance).
    #[arg(long, default_value_t = 1)]
    pub consumers: usize,
    /// Consumer group (default: a fresh `shoal-bench-<pid>-<time>` group).
    #[arg(long)]
    pub group: Option<String>,
    /// Allocation strategy (AVG, BALANCED_STICKY, STICKY, ...). Default: AVG in classic mode,
    /// the broker's default assignor (STICKY) in coordinated mode.
    #[arg(long)]
    pub strategy: Option<String>,
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

// ---- message header -------------------------------------------------------------------

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or_default()
}

/// The header `shoal bench` puts at the start of a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BodyHeader {
    /// Run id (random per run).
    pub run: u32,
    /// Key unique in the run: producer number << 40 | sequence.
    pub key: u64,
    /// Wall-clock send time, microseconds since the epoch.
    pub sent_us: u64,
}

/// Builds a body of `size` bytes; the header is written when `size >= HEADER_LEN`.
pub(crate) fn make_body(size: usize, h: &BodyHeader) -> Vec<u8> {
    // The alphabet repeated (`b'a' + i % 26` at offset `i`), a slice at a time: the load
    // generator's own work per message stays small beside the producer's.
    const FILLER: &[u8; 26] = b"abcdefghijklmnopqrstuvwxyz";
    let mut body: Vec<u8> = Vec::with_capacity(size);
    while body.len() < size {
        let n = (size - body.len()).min(FILLER.len());
        body.extend_from_slice(&FILLER[..n]);
    }
    if size >= HEADER_LEN {
        body[0..4].copy_from_slice(&MAGIC.to_be_bytes());
        body[4..8].copy_from_slice(&h.run.to_be_bytes());
        body[8..16].copy_from_slice(&h.key.to_be_bytes());
        body[16..24].copy_from_slice(&h.sent_us.to_be_bytes());
    }
    body
}

/// Reads the header of a body, if it has one.
pub(crate) fn parse_body(body: &[u8]) -> Option<BodyHeader> {
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
pub(crate) struct Latency {
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
pub(crate) struct ProduceReport {
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
pub(crate) struct ConsumeReport {
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
pub(crate) struct Report {
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

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn client_config(common: &Common, instance: String) -> ClientConfig {
    ClientConfig {
        instance_name: Some(instance),
        // Checked when the command starts (`run`).
        credentials: common.credentials().ok().flatten(),
        tls: common.client_tls().ok().flatten(),
        serialize_type: common.serialize_type.serialize_type(),
        binary_sends_to_shoal: common.serialize_type.binary_sends_to_shoal(),
        ..ClientConfig::new(&common.namesrv)
    }
}

// ---- helpers --------------------------------------------------------------------------

fn random_run() -> u32 {
    let n = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(16))
        .unwrap_or_default();
    n ^ std::process::id().rotate_left(8)
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
    let admin = common.admin()?;
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
pub(crate) async fn run(common: &Common, cmd: BenchCmd) -> anyhow::Result<()> {
    // A bad credentials file or bad TLS options are reported here, once.
    common.credentials()?;
    common.client_tls()?;
    let report = match cmd {
        BenchCmd::Produce(a) => load::produce(common, a).await?,
        BenchCmd::Consume(a) => load::consume(common, a).await?,
        BenchCmd::E2e(a) => load::e2e(common, a).await?,
        BenchCmd::Rebalance(a) => rebalance::run(common, a).await?,
    };
    if common.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

fn check_group(g: &GroupArgs) -> anyhow::Result<()> {
    if g.consumers == 0 {
        bail!("--consumers must be at least 1");
    }
    check_strategy(g.strategy.as_deref())
}

fn check_strategy(s: Option<&str>) -> anyhow::Result<()> {
    let Some(s) = s else {
        return Ok(());
    };
    if shoal_group::strategy_by_name(s).is_err() {
        bail!(
            "unknown allocation strategy {s:?}; known: {}",
            shoal_group::STRATEGY_NAMES.join(", ")
        );
    }
    Ok(())
}

// ---- rendering ------------------------------------------------------------------------

fn latency_row(name: &str, l: &Latency) -> String {
    format!(
        "{name:<14} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>10}\n",
        l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms, l.mean_ms, l.count
    )
}

/// The human-readable table of a report.
pub(crate) fn render(r: &Report) -> String {
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
        rebalance::render(&mut s, rb);
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: BenchCmd,
    }

    pub(crate) fn parse(args: &[&str]) -> Result<BenchCmd, clap::Error> {
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
    fn body_filler_is_the_alphabet_repeated() {
        let h = BodyHeader {
            run: 1,
            key: 2,
            sent_us: 3,
        };
        for size in [0, 1, 23, 24, 25, 26, 27, 52, 128, 1000, 1024] {
            let b = make_body(size, &h);
            assert_eq!(b.len(), size);
            let from = if size >= HEADER_LEN { HEADER_LEN } else { 0 };
            for (i, &byte) in b.iter().enumerate().skip(from) {
                assert_eq!(byte, b'a' + (i % 26) as u8, "size {size}, offset {i}");
            }
        }
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
}
