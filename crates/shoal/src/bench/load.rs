//! The producers (`SendStats`, `LoadPlan`, open- and closed-loop send loops) and the commands
//! `bench produce`, `bench consume` and `bench e2e`.

use super::track::{ownership, start_member, start_thread_member, GroupSpec, Member, Tracker};
use super::{
    check_group, client_config, fresh_group, histogram, make_body, now_us, parse_duration,
    prepare_topic, progress_bar, random_run, round1, round3, spawn_progress, BodyHeader, GroupArgs,
    Latency, LoadArgs, ProduceReport, Report, TopicArgs, HEADER_LEN, MAX_BODY,
};
use crate::admin_cmd::Common;
use anyhow::{bail, Context};
use clap::Args;
use futures::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use shoal_client::{ClientError, ConsumeFromWhere, Message, Producer};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

#[derive(Debug, Args)]
pub(crate) struct ProduceArgs {
    #[command(flatten)]
    topic: TopicArgs,
    #[command(flatten)]
    load: LoadArgs,
}

/// Options of `shoal bench consume`.
#[derive(Debug, Args)]
pub(crate) struct ConsumeArgs {
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
    /// Consume by POP (RocketMQ 5: the broker picks the queue of each pop and leases every
    /// message until its ack) instead of pulling the queues a rebalance assigned.
    #[arg(long)]
    pop: bool,
}

/// Options of `shoal bench e2e`.
#[derive(Debug, Args)]
pub(crate) struct E2eArgs {
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

// ---- send side ------------------------------------------------------------------------

/// Kind of a send error, for the report.
pub(super) fn error_kind(e: &ClientError) -> String {
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

/// Send-side counters shared by the producers.
pub(super) struct SendStats {
    pub(super) sent: AtomicU64,
    pub(super) acked: AtomicU64,
    pub(super) errors: AtomicU64,
    ack_latency: Mutex<Histogram<u64>>,
    errors_by_kind: Mutex<BTreeMap<String, u64>>,
    /// Keys acknowledged with their send times (only kept when a consumer checks losses).
    acked_keys: Option<Mutex<Vec<(u64, u64)>>>,
    first_send: Mutex<Option<Instant>>,
    last_ack: Mutex<Option<Instant>>,
}

impl SendStats {
    pub(super) fn new(keep_keys: bool) -> Self {
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

    pub(super) fn report(&self, size: usize) -> ProduceReport {
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

/// What the producers do.
#[derive(Debug, Clone)]
pub(super) struct LoadPlan {
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
    pub(super) fn new(topic: &str, l: &LoadArgs, run: u32) -> anyhow::Result<Self> {
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

pub(super) async fn start_producers(
    common: &Common,
    plan: &LoadPlan,
) -> anyhow::Result<Vec<Producer>> {
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
pub(super) async fn run_producers(
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

/// What one send of a producer loop carries: one message goes as a plain send, several as a
/// batch.
enum Payload {
    One(Message),
    Batch(Vec<Message>),
}

/// How one send (or batch) ended, handed from its future to the producer's loop.
struct SendOutcome {
    n: u64,
    done: Instant,
    took: Duration,
    error: Option<String>,
}

/// A producer's own share of the send statistics: kept by its loop without a lock per send
/// (the loops run on different threads), merged into [`SendStats`] when the loop ends.
struct LocalSendStats {
    ack_latency: Histogram<u64>,
    last_ack: Option<Instant>,
}

impl LocalSendStats {
    fn new() -> Self {
        LocalSendStats {
            ack_latency: histogram(),
            last_ack: None,
        }
    }

    fn note(&mut self, stats: &SendStats, o: SendOutcome) {
        match o.error {
            None => {
                stats.acked.fetch_add(o.n, Ordering::AcqRel);
                self.ack_latency
                    .saturating_record(o.took.as_micros().max(1) as u64);
                if self.last_ack.is_none_or(|l| l < o.done) {
                    self.last_ack = Some(o.done);
                }
            }
            Some(kind) => {
                stats.errors.fetch_add(o.n, Ordering::AcqRel);
                *stats.errors_by_kind.lock().entry(kind).or_insert(0) += o.n;
            }
        }
    }

    fn merge_into(self, stats: &SendStats) {
        if let Err(e) = stats.ack_latency.lock().add(&self.ack_latency) {
            tracing::warn!(error = %e, "could not merge a producer's latencies");
        }
        let mut last = stats.last_ack.lock();
        if let Some(mine) = self.last_ack {
            if last.is_none_or(|l| l < mine) {
                *last = Some(mine);
            }
        }
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
    // The sends in flight are polled by this task (no task spawned per send): completing one
    // frees its slot.
    let mut sends = FuturesUnordered::new();
    let mut local = LocalSendStats::new();
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
            // Sends in flight complete while waiting for the tick.
            let tick_at = tokio::time::sleep_until(at.into());
            tokio::pin!(tick_at);
            loop {
                tokio::select! {
                    () = &mut tick_at => break,
                    Some(o) = sends.next(), if !sends.is_empty() => local.note(&stats, o),
                }
            }
            if stop.load(Ordering::Acquire) {
                break;
            }
        }
        tick = tick.saturating_add(1);
        // Latency counts from here. Open loop: the timer's own lateness (tokio's timer has
        // 1 ms resolution) is not the broker's, but a wait for an in-flight slot is. Closed
        // loop: a slot frees when the previous send completes, so the wait is not counted.
        let queued_at = period.map(|_| Instant::now());
        while sends.len() >= plan.inflight {
            if let Some(o) = sends.next().await {
                local.note(&stats, o);
            }
        }
        let due = queued_at.unwrap_or_else(Instant::now);
        let sent_us = now_us();
        let first_seq = seq;
        let mut message = |seq: u64| {
            let h = BodyHeader {
                run: plan.run,
                key: (idx << 40) | seq,
                sent_us,
            };
            Message::new(plan.topic.clone(), make_body(plan.size, &h))
        };
        let send = if n == 1 {
            Payload::One(message(first_seq))
        } else {
            Payload::Batch(
                (first_seq..first_seq + n as u64)
                    .map(&mut message)
                    .collect(),
            )
        };
        seq += n as u64;
        stats.sent.fetch_add(n as u64, Ordering::AcqRel);
        let (p, stats) = (producer.clone(), stats.clone());
        // Boxed where it is made: the send's future is large, and `push` would otherwise move
        // it three times (a measurable share of the client's CPU per unbatched send).
        sends.push(Box::pin(async move {
            let r = match send {
                Payload::One(m) => p.send(m).await.map(drop),
                Payload::Batch(batch) => p.send_batch(batch).await.map(drop),
            };
            let done = Instant::now();
            let error = match r {
                Ok(()) => {
                    if let Some(k) = &stats.acked_keys {
                        let keys =
                            (first_seq..first_seq + n as u64).map(|s| ((idx << 40) | s, sent_us));
                        k.lock().extend(keys);
                    }
                    None
                }
                Err(e) => Some(error_kind(&e)),
            };
            SendOutcome {
                n: n as u64,
                done,
                took: done.saturating_duration_since(due),
                error,
            }
        }));
    }
    while let Some(o) = sends.next().await {
        local.note(&stats, o);
    }
    local.merge_into(&stats);
}

pub(super) async fn produce(common: &Common, a: ProduceArgs) -> anyhow::Result<Report> {
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

/// Starts `n` members (each on its own thread when `threaded`) and waits (up to 15 s) until
/// every queue has one owner and the assignment stayed the same for `settle` (members joining
/// one after the other can pass through states that look complete).
pub(super) async fn start_group(
    common: &Common,
    spec: &GroupSpec,
    n: usize,
    tracker: &Arc<Tracker>,
    settle: Duration,
    threaded: bool,
) -> anyhow::Result<Vec<Member>> {
    let mut members = Vec::with_capacity(n);
    for id in 0..n {
        members.push(if threaded {
            start_thread_member(common, spec, id, tracker).await?
        } else {
            start_member(common, spec, id, tracker).await?
        });
    }
    let nq = tracker.queue_count();
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
            for m in members {
                m.shutdown().await;
                m.join().await;
            }
            bail!("the consumer group did not settle on an assignment of every queue within 15 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(members)
}

pub(super) async fn consume(common: &Common, a: ConsumeArgs) -> anyhow::Result<Report> {
    check_group(&a.group)?;
    if a.count == Some(0) {
        bail!("--count must be at least 1");
    }
    let run = random_run();
    let queues = prepare_topic(common, &a.topic.topic, a.topic.queues, !a.topic.no_create).await?;
    let mut tracker = Tracker::new(None, &queues);
    if let Some(n) = a.count {
        tracker = tracker.expecting(n);
    }
    let tracker = Arc::new(tracker);
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
        session_timeout: None,
        run,
    };
    let pb = progress_bar();
    let prog = spawn_progress(pb.clone(), None, Some(tracker.clone()), Arc::default());
    let t0 = Instant::now();
    let (members, pops) = if a.pop {
        let from_first = a.from == "first";
        let pops =
            super::pop::start_pop_members(common, &spec, a.group.consumers, from_first, &tracker)
                .await?;
        (Vec::new(), pops)
    } else {
        let members = start_group(
            common,
            &spec,
            a.group.consumers,
            &tracker,
            Duration::from_secs(1),
            false,
        )
        .await?;
        (members, Vec::new())
    };
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
        m.shutdown().await;
    }
    for p in &pops {
        p.shutdown().await;
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
pub(super) async fn drain(stats: &SendStats, tracker: &Tracker, drain: Duration) -> Vec<u64> {
    let deadline = Instant::now() + drain;
    loop {
        let acked = stats
            .acked_keys
            .as_ref()
            .map(|k| k.lock().clone())
            .unwrap_or_default();
        let unique = tracker.unique();
        if unique >= acked.len() || Instant::now() >= deadline {
            let missing = tracker.missing(&acked);
            if missing.is_empty() || Instant::now() >= deadline {
                return missing;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(super) async fn e2e(common: &Common, a: E2eArgs) -> anyhow::Result<Report> {
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
        session_timeout: None,
        run,
    };
    let members = start_group(
        common,
        &spec,
        a.group.consumers,
        &tracker,
        Duration::from_secs(1),
        false,
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
        m.shutdown().await;
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

#[cfg(test)]
mod tests {
    use super::super::check_strategy;
    use super::*;
    use crate::bench::tests::parse;
    use crate::bench::BenchCmd;

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
        assert!(check_strategy(Some("NOPE")).is_err());
        assert!(check_strategy(Some("AVG")).is_ok() && check_strategy(None).is_ok());
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
}
