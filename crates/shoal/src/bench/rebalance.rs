//! `bench rebalance`: a consumer group under steady load while members join, leave, crash and
//! freeze on a schedule; what its users see per event (convergence, take-over, the longest
//! consumption pause, duplicates, deliveries by two owners at once, stale deliveries after a
//! resume, losses) and a summary per kind of event over repeated events.
//!
//! Every member runs on its own OS thread with its own single-threaded runtime (see
//! `track`), so that a `pause` can freeze it with its connections open. The members of one
//! event change `--stagger` apart, as separate processes would, not all at once.

use super::load::{run_producers, start_group, start_producers, LoadPlan, SendStats};
use super::track::{
    converged, overlapping, ownership, start_thread_member, taken_over, Delivery, GroupSpec,
    Member, Tracker,
};
use super::{
    check_strategy, fresh_group, ms, now_us, parse_duration, prepare_topic, progress_bar,
    random_run, round3, spawn_progress, LoadArgs, Report, HEADER_LEN,
};
use crate::admin_cmd::Common;
use anyhow::{bail, Context};
use clap::Args;
use parking_lot::Mutex;
use serde::Serialize;
use shoal_client::ConsumeFromWhere;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// Options of `shoal bench rebalance`.
#[derive(Debug, Args)]
pub(crate) struct RebalanceArgs {
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
    /// `kill:N` (hard stop: connections dropped, no unregister, no final commit), `pause:N`
    /// (frozen for --pause-for with their connections open, then resumed), separated by
    /// commas. Leaves, kills and pauses take the most recently joined members.
    #[arg(long, default_value = "join:4,leave:4,pause:1,kill:1")]
    schedule: String,
    /// Run the schedule this many times (summaries per kind of event over all of them).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Time between the members of one event (each joins, leaves, crashes or freezes this
    /// long after the previous one).
    #[arg(long, value_parser = parse_duration, default_value = "20ms")]
    stagger: Duration,
    /// Time between events (the first event comes one interval after the start). A pause
    /// event lasts --pause-for plus one interval.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    interval: Duration,
    /// How long a `pause` freezes its members (default: the session timeout + 2 s, so that
    /// their queues move).
    #[arg(long, value_parser = parse_duration)]
    pause_for: Option<Duration>,
    /// Consumers' session timeout announced to Shoal brokers (default: the client's, 10 s).
    #[arg(long, value_parser = parse_duration)]
    session_timeout: Option<Duration>,
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
    /// Allocation strategy. Default: AVG in classic mode; in coordinated mode the broker's
    /// default assignor (STICKY: balanced, moves the fewest queues when members come and go).
    #[arg(long)]
    strategy: Option<String>,
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

/// The client's session timeout when none is given.
const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

// ---- schedule -------------------------------------------------------------------------

/// A membership change of `bench rebalance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "n", rename_all = "lowercase")]
pub(super) enum MemberEvent {
    /// N new members start.
    Join(usize),
    /// The N most recent members shut down gracefully.
    Leave(usize),
    /// The N most recent members stop hard (crash).
    Kill(usize),
    /// The N most recent members freeze (connections open), then resume.
    Pause(usize),
}

impl MemberEvent {
    fn kind(&self) -> &'static str {
        match self {
            MemberEvent::Join(_) => "join",
            MemberEvent::Leave(_) => "leave",
            MemberEvent::Kill(_) => "kill",
            MemberEvent::Pause(_) => "pause",
        }
    }

    /// Members the event involves.
    fn count(&self) -> usize {
        match *self {
            MemberEvent::Join(n)
            | MemberEvent::Leave(n)
            | MemberEvent::Kill(n)
            | MemberEvent::Pause(n) => n,
        }
    }
}

impl std::fmt::Display for MemberEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind(), self.count())
    }
}

/// Parses a schedule (`join:4,leave:4,pause:1,kill:1`) and checks that it never takes the
/// group below one member (a pause keeps at least one member running), starting from
/// `initial` members.
pub(super) fn parse_schedule(s: &str, initial: usize) -> anyhow::Result<Vec<MemberEvent>> {
    let mut out = Vec::new();
    let mut members = initial;
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((kind, n)) = part.split_once(':') else {
            bail!("schedule entry {part:?} is not KIND:N (join:4, leave:2, kill:1, pause:1)");
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
            "pause" => MemberEvent::Pause(n),
            other => {
                bail!("schedule entry {part:?}: unknown kind {other:?} (join, leave, kill, pause)")
            }
        };
        members = match ev {
            MemberEvent::Join(n) => members + n,
            MemberEvent::Leave(n) | MemberEvent::Kill(n) | MemberEvent::Pause(n) => {
                if n >= members {
                    bail!("schedule entry {part:?} would leave no consumer (there are {members})");
                }
                if matches!(ev, MemberEvent::Pause(_)) {
                    members
                } else {
                    members - n
                }
            }
        };
        out.push(ev);
    }
    if out.is_empty() {
        bail!("the schedule is empty");
    }
    Ok(out)
}

// ---- reports --------------------------------------------------------------------------

/// One membership change of `bench rebalance`.
#[derive(Debug, Clone, Serialize, Default)]
pub(crate) struct EventReport {
    /// The change (`start 4` for the initial group, then the schedule).
    pub event: String,
    /// `start`, `join`, `leave`, `kill` or `pause`.
    pub kind: String,
    /// Repetition of the schedule (1-based; 0 for the start).
    pub round: usize,
    /// Members before.
    pub from: usize,
    /// Members after.
    pub to: usize,
    /// Seconds since the run started.
    pub at_s: f64,
    /// How long the change itself took (first member's change until the last one's was done:
    /// started, shut down, killed or frozen), ms.
    pub change_ms: f64,
    /// From the change (a pause: from the last member's resume) until every queue had exactly
    /// one live owner and every queue had been consumed by its owner again, ms (`None`: not
    /// within the interval).
    pub convergence_ms: Option<f64>,
    /// `kill` and `pause`: from each stopped or frozen member's change until every queue it
    /// owned was delivered by another member (the longest over the members), ms (`None`: not
    /// within the interval, or for a pause not before the resume).
    pub takeover_ms: Option<f64>,
    /// `pause`: seconds since the run started when the last frozen member resumed.
    pub resumed_at_s: Option<f64>,
    /// Longest gap between two consumptions of any queue in the event, ms.
    pub pause_ms: f64,
    /// Queues whose owner changed.
    pub moved_queues: usize,
    /// Duplicate deliveries during the event.
    pub duplicates: u64,
    /// Messages delivered by two owners of one queue at once during the event (from the
    /// delivery log: a member delivered a queue again after another member had, while that
    /// one still did).
    pub overlaps: u64,
    /// `pause`: of the queues another member consumed while they were frozen, the messages the
    /// resumed members delivered after the resume while that member still consumed the queue
    /// (two owners), or that had been delivered before (stale offsets or cache).
    pub stale: Option<u64>,
    /// Messages sent (and acknowledged) during the event and never consumed.
    pub lost: u64,
}

/// Percentiles over the events of one kind, ms (nearest rank).
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub(crate) struct Spread {
    /// Samples.
    pub count: usize,
    /// Median, ms.
    pub p50_ms: Option<f64>,
    /// 99th percentile, ms.
    pub p99_ms: Option<f64>,
    /// Maximum, ms.
    pub max_ms: Option<f64>,
}

impl Spread {
    fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let i = ((p * v.len() as f64).ceil() as usize).saturating_sub(1);
            v.get(i).copied()
        };
        Spread {
            count: v.len(),
            p50_ms: rank(0.5),
            p99_ms: rank(0.99),
            max_ms: v.last().copied(),
        }
    }
}

/// All events of one kind.
#[derive(Debug, Clone, Serialize, Default)]
pub(crate) struct EventSummary {
    /// `join`, `leave`, `kill` or `pause`.
    pub kind: String,
    /// Events of this kind.
    pub events: usize,
    /// Convergence over the events that converged.
    pub convergence: Spread,
    /// Events that did not converge within their interval.
    pub not_converged: usize,
    /// Take-over over the `kill` and `pause` events that were taken over.
    pub takeover: Spread,
    /// Longest consumption pause of each event.
    pub pause: Spread,
    /// Duplicates, summed.
    pub duplicates: u64,
    /// Deliveries by two owners at once, summed.
    pub overlaps: u64,
    /// Stale deliveries after resumes, summed (`pause`).
    pub stale: u64,
    /// Losses, summed.
    pub lost: u64,
}

/// Results of `bench rebalance`.
#[derive(Debug, Clone, Serialize, Default)]
pub(crate) struct RebalanceReport {
    /// Queues in the topic.
    pub queues: usize,
    /// Allocation strategy: the one chosen, `AVG` (classic mode's default) or `default
    /// (STICKY)` (the coordinator's default assignor).
    pub strategy: String,
    /// Group protocol asked for (`auto`, `classic`, `coordinated`).
    pub mode: String,
    /// Time between the members of one event, ms.
    pub stagger_ms: f64,
    /// Repetitions of the schedule.
    pub repeat: usize,
    /// Consumers' session timeout, ms.
    pub session_timeout_ms: f64,
    /// How long a pause freezes its members, ms.
    pub pause_for_ms: f64,
    /// Longest per-queue gap before the first event (steady state), ms.
    pub baseline_pause_ms: f64,
    /// One entry per membership change.
    pub events: Vec<EventReport>,
    /// Per kind of event, over every repetition.
    pub summary: Vec<EventSummary>,
}

fn summarize(events: &[EventReport]) -> Vec<EventSummary> {
    let mut kinds: BTreeMap<&str, Vec<&EventReport>> = BTreeMap::new();
    for e in events.iter().filter(|e| e.kind != "start") {
        kinds.entry(e.kind.as_str()).or_default().push(e);
    }
    let order = ["join", "leave", "pause", "kill"];
    let mut out: Vec<EventSummary> = kinds
        .into_iter()
        .map(|(kind, es)| EventSummary {
            kind: kind.to_string(),
            events: es.len(),
            convergence: Spread::of(es.iter().filter_map(|e| e.convergence_ms).collect()),
            not_converged: es.iter().filter(|e| e.convergence_ms.is_none()).count(),
            takeover: Spread::of(es.iter().filter_map(|e| e.takeover_ms).collect()),
            pause: Spread::of(es.iter().map(|e| e.pause_ms).collect()),
            duplicates: es.iter().map(|e| e.duplicates).sum(),
            overlaps: es.iter().map(|e| e.overlaps).sum(),
            stale: es.iter().filter_map(|e| e.stale).sum(),
            lost: es.iter().map(|e| e.lost).sum(),
        })
        .collect();
    out.sort_by_key(|s| order.iter().position(|k| *k == s.kind));
    out
}

// ---- the run --------------------------------------------------------------------------

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

/// A member stopped hard or frozen during an event: what the delivery log is asked about it.
#[derive(Debug, Clone)]
struct Stopped {
    event: usize,
    member: u32,
    /// Queue indices it owned just before.
    queues: Vec<u32>,
    at: Instant,
    /// A frozen member's resume.
    resumed: Option<Instant>,
}

fn queue_indices(m: &Member, tracker: &Tracker) -> Vec<u32> {
    m.consumer
        .owned_queues()
        .into_iter()
        .filter_map(|q| tracker.queue_of(&q).map(|i| i as u32))
        .collect()
}

fn ms_of(d: Duration) -> f64 {
    ms(d.as_micros() as u64)
}

/// Runs `bench rebalance`.
pub(super) async fn run(common: &Common, a: RebalanceArgs) -> anyhow::Result<Report> {
    if a.consumers == 0 {
        bail!("--consumers must be at least 1");
    }
    check_strategy(a.strategy.as_deref())?;
    if a.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    let one = parse_schedule(&a.schedule, a.consumers)?;
    let schedule = parse_schedule(&vec![a.schedule.as_str(); a.repeat].join(","), a.consumers)
        .context("the repeated schedule")?;
    if a.size < HEADER_LEN {
        bail!("rebalance needs --size of at least {HEADER_LEN} bytes (the benchmark header)");
    }
    if !(a.rate.is_finite() && a.rate > 0.0) {
        bail!("rebalance needs a positive --rate (steady load)");
    }
    if a.interval < Duration::from_millis(500) {
        bail!("--interval must be at least 500ms");
    }
    let largest = schedule.iter().map(MemberEvent::count).max().unwrap_or(1);
    if a.stagger * (largest as u32) >= a.interval {
        bail!("--stagger x the largest event ({largest} members) must be shorter than --interval");
    }
    let session = a.session_timeout.unwrap_or(DEFAULT_SESSION_TIMEOUT);
    let pause_for = a.pause_for.unwrap_or(session + Duration::from_secs(2));
    if pause_for.is_zero() {
        bail!("--pause-for must be positive");
    }
    let pauses = schedule
        .iter()
        .filter(|e| matches!(e, MemberEvent::Pause(_)))
        .count() as u32;
    let run = random_run();
    let load = LoadArgs {
        producers: a.producers,
        size: a.size,
        batch: 1,
        rate: a.rate,
        inflight: None,
        // An upper bound: the load is stopped after the last event's interval.
        duration: a.interval * (schedule.len() as u32 + 4) + pause_for * pauses,
        count: None,
        send_timeout: Duration::from_secs(3),
    };
    let plan = Arc::new(LoadPlan::new(&a.topic, &load, run)?);
    let queues = prepare_topic(common, &a.topic, a.queues, !a.no_create).await?;
    let nq = queues.len();
    let tracker = Arc::new(Tracker::new(Some(run), &queues).with_log());
    let spec = GroupSpec {
        group: a.group.clone().unwrap_or_else(|| fresh_group(run)),
        topic: a.topic.clone(),
        strategy: a.strategy.clone(),
        protocol: a.mode,
        from: ConsumeFromWhere::ConsumeFromTimestamp,
        from_ts_ms: (now_us() / 1000) as i64 - 1000,
        rebalance_interval: a.rebalance_interval,
        persist_offset_interval: a.persist_offset_interval,
        session_timeout: a.session_timeout,
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
    let mut windows = vec![change0];
    let mut members =
        start_group(common, &spec, a.consumers, &tracker, Duration::ZERO, true).await?;
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
        kind: "start".into(),
        from: 0,
        to: a.consumers,
        change_ms: ms_of(start_change),
        convergence_ms: start_conv.map(ms_of),
        pause_ms: ms_of(baseline),
        moved_queues: nq,
        ..EventReport::default()
    });
    let mut stopped: Vec<Stopped> = Vec::new();
    let mut finished: Vec<Member> = Vec::new();
    for (i, ev) in schedule.iter().enumerate() {
        let from = members.len();
        let round = i / one.len() + 1;
        *extra.lock() = format!("| round {round}: {ev} ({from} members)");
        reset_gaps(&tracker);
        let dups_before = tracker.state.lock().duplicates;
        let t0 = Instant::now();
        wall_starts.push(now_us());
        windows.push(t0);
        let mut resumed = None;
        match *ev {
            MemberEvent::Join(n) => {
                // As separate processes started by a scale-out: `stagger` apart.
                let mut starting = JoinSet::new();
                for (k, id) in (next_id..next_id + n).enumerate() {
                    let (c, sp, t) = (common.clone(), spec.clone(), tracker.clone());
                    let at = t0 + a.stagger * k as u32;
                    starting.spawn(async move {
                        tokio::time::sleep_until(at.into()).await;
                        start_thread_member(&c, &sp, id, &t).await
                    });
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
                // A graceful leave finishes its in-flight messages and commits their offsets:
                // they count as consumed.
                let leaving: Vec<Member> = (0..n).filter_map(|_| members.pop()).collect();
                let mut stopping = JoinSet::new();
                for (k, m) in leaving.into_iter().enumerate() {
                    let at = t0 + a.stagger * k as u32;
                    stopping.spawn(async move {
                        tokio::time::sleep_until(at.into()).await;
                        m.shutdown().await;
                        m.alive.store(false, Ordering::Release);
                        m
                    });
                }
                while let Some(r) = stopping.join_next().await {
                    finished.push(r.context("a consumer shutdown task failed")?);
                }
            }
            MemberEvent::Kill(n) => {
                for k in 0..n {
                    tokio::time::sleep_until((t0 + a.stagger * k as u32).into()).await;
                    if let Some(m) = members.pop() {
                        let queues = queue_indices(&m, &tracker);
                        stopped.push(Stopped {
                            event: events.len(),
                            member: m.id as u32,
                            queues,
                            at: Instant::now(),
                            resumed: None,
                        });
                        m.kill();
                        finished.push(m);
                    }
                }
            }
            MemberEvent::Pause(n) => {
                let count = members.len();
                for (k, m) in members
                    .iter()
                    .skip(count.saturating_sub(n))
                    .rev()
                    .enumerate()
                {
                    tokio::time::sleep_until((t0 + a.stagger * k as u32).into()).await;
                    let queues = queue_indices(m, &tracker);
                    let at = Instant::now();
                    if !m.freeze(pause_for) {
                        bail!("member {} cannot be frozen (its thread ended)", m.id);
                    }
                    stopped.push(Stopped {
                        event: events.len(),
                        member: m.id as u32,
                        queues,
                        at,
                        resumed: Some(at + pause_for),
                    });
                    resumed = Some(at + pause_for);
                }
            }
        }
        let change = t0.elapsed();
        // A pause converges after the resume; the interval starts there.
        let since = match resumed {
            Some(r) => {
                *extra.lock() = format!("| round {round}: {ev} (frozen)");
                tokio::time::sleep_until(r.into()).await;
                r
            }
            None => t0,
        };
        let end = since + a.interval;
        let result = wait_converged(&members, &tracker, nq, since, end).await;
        let convergence = result.as_ref().map(|(at, _)| at.duration_since(since));
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
            kind: ev.kind().into(),
            round,
            from,
            to: members.len(),
            at_s: round3(t0.duration_since(t_start).as_secs_f64()),
            change_ms: ms_of(change),
            convergence_ms: convergence.map(ms_of),
            resumed_at_s: resumed.map(|r| round3(r.duration_since(t_start).as_secs_f64())),
            pause_ms: ms_of(pause),
            moved_queues: moved,
            duplicates: tracker.state.lock().duplicates - dups_before,
            ..EventReport::default()
        });
    }
    stop.store(true, Ordering::Release);
    load_task.await.context("the load task failed")?;
    *extra.lock() = "| draining".into();
    let lost = super::load::drain(&stats, &tracker, a.drain).await;
    let end = Instant::now();
    for (e, n) in events
        .iter_mut()
        .zip(losses_per_interval(&wall_starts, &lost))
    {
        e.lost = n;
    }
    windows.push(end);
    judge(&mut events, &tracker.deliveries(), &windows, &stopped);
    for m in &members {
        m.shutdown().await;
    }
    for m in members.into_iter().chain(finished) {
        m.join().await;
    }
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
            strategy: strategy_label(a.strategy.as_deref(), a.mode),
            mode: format!("{:?}", a.mode).to_ascii_lowercase(),
            stagger_ms: ms_of(a.stagger),
            repeat: a.repeat,
            session_timeout_ms: ms_of(session),
            pause_for_ms: ms_of(pause_for),
            baseline_pause_ms: ms_of(baseline),
            summary: summarize(&events),
            events,
        }),
    })
}

/// Fills in what the delivery log says about each event: overlaps (event `i` owns the
/// deliveries from `windows[i]` to `windows[i + 1]`, judged on their own), take-over of stopped and frozen
/// members, and stale deliveries after a resume.
fn judge(events: &mut [EventReport], log: &[Delivery], windows: &[Instant], stopped: &[Stopped]) {
    for (i, e) in events.iter_mut().enumerate() {
        let (Some(&from), Some(&to)) = (windows.get(i), windows.get(i + 1)) else {
            continue;
        };
        let marks = overlapping(log, from, to);
        e.overlaps = log
            .iter()
            .zip(&marks)
            .filter(|(d, m)| **m && d.at >= from && d.at < to)
            .map(|(d, _)| u64::from(d.msgs))
            .sum();
        let mine: Vec<&Stopped> = stopped.iter().filter(|s| s.event == i).collect();
        if mine.is_empty() {
            continue;
        }
        let mut takeover = Some(Duration::ZERO);
        for s in &mine {
            let until = s.resumed.unwrap_or(to);
            let t = taken_over(log, s.member, &s.queues, s.at, until);
            takeover = takeover.zip(t).map(|(a, b)| a.max(b));
        }
        e.takeover_ms = takeover.map(ms_of);
        if e.kind == "pause" {
            let mut stale = 0u64;
            for s in &mine {
                let Some(r) = s.resumed else {
                    continue;
                };
                // Queues another member consumed while this one was frozen.
                let moved: HashSet<u32> = log
                    .iter()
                    .filter(|d| d.member != s.member && d.at >= s.at && d.at < r)
                    .map(|d| d.queue)
                    .collect();
                stale += log
                    .iter()
                    .zip(&marks)
                    .filter(|(d, _)| {
                        d.member == s.member && d.at >= r && d.at < to && moved.contains(&d.queue)
                    })
                    .map(|(d, m)| u64::from(if *m { d.msgs } else { d.dups }))
                    .sum::<u64>();
            }
            e.stale = Some(stale);
        }
    }
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

/// The strategy a report names: the one chosen, else the consumers' default for the mode.
fn strategy_label(chosen: Option<&str>, mode: shoal_client::GroupProtocol) -> String {
    match (chosen, mode) {
        (Some(s), _) => s.to_string(),
        (None, shoal_client::GroupProtocol::Classic) => {
            shoal_client::consumer::CLASSIC_DEFAULT_STRATEGY.to_string()
        }
        (None, shoal_client::GroupProtocol::Coordinated) => "default (STICKY)".to_string(),
        (None, _) => "default".to_string(),
    }
}

// ---- rendering ------------------------------------------------------------------------

fn opt_ms(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_string(), |c| format!("{c:.1}"))
}

/// The rebalance part of the table.
pub(super) fn render(s: &mut String, rb: &RebalanceReport) {
    s.push_str(&format!(
        "rebalance over {} queues ({}, {} mode), members {:.0} ms apart, session {:.0} ms, \
         pause for {:.0} ms, steady-state pause {:.1} ms\n",
        rb.queues,
        rb.strategy,
        rb.mode,
        rb.stagger_ms,
        rb.session_timeout_ms,
        rb.pause_for_ms,
        rb.baseline_pause_ms
    ));
    s.push_str(&format!(
        "{:<10} {:>7} {:>8} {:>10} {:>13} {:>11} {:>10} {:>6} {:>6} {:>8} {:>6} {:>6}\n",
        "event",
        "members",
        "at (s)",
        "change ms",
        "converged ms",
        "takeover ms",
        "pause ms",
        "moved",
        "dups",
        "overlaps",
        "stale",
        "lost"
    ));
    for e in &rb.events {
        let conv = e
            .convergence_ms
            .map_or_else(|| "no".to_string(), |c| format!("{c:.1}"));
        s.push_str(&format!(
            "{:<10} {:>7} {:>8.1} {:>10.1} {:>13} {:>11} {:>10.1} {:>6} {:>6} {:>8} {:>6} {:>6}\n",
            e.event,
            format!("{}->{}", e.from, e.to),
            e.at_s,
            e.change_ms,
            conv,
            opt_ms(e.takeover_ms),
            e.pause_ms,
            e.moved_queues,
            e.duplicates,
            e.overlaps,
            e.stale.map_or_else(|| "-".to_string(), |x| x.to_string()),
            e.lost
        ));
    }
    s.push_str(&format!(
        "{:<7} {:>6} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9} {:>6} {:>8} {:>6} {:>6}\n",
        "summary",
        "events",
        "conv p50",
        "conv p99",
        "conv max",
        "no",
        "take p50",
        "take p99",
        "dups",
        "overlaps",
        "stale",
        "lost"
    ));
    for k in &rb.summary {
        s.push_str(&format!(
            "{:<7} {:>6} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9} {:>6} {:>8} {:>6} {:>6}\n",
            k.kind,
            k.events,
            opt_ms(k.convergence.p50_ms),
            opt_ms(k.convergence.p99_ms),
            opt_ms(k.convergence.max_ms),
            k.not_converged,
            opt_ms(k.takeover.p50_ms),
            opt_ms(k.takeover.p99_ms),
            k.duplicates,
            k.overlaps,
            k.stale,
            k.lost
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::super::{render as render_report, ConsumeReport, ProduceReport};
    use super::*;

    #[test]
    fn schedule_parsing() {
        assert_eq!(
            parse_schedule("join:4, leave:4,pause:2,kill:1", 4).unwrap(),
            vec![
                MemberEvent::Join(4),
                MemberEvent::Leave(4),
                MemberEvent::Pause(2),
                MemberEvent::Kill(1)
            ]
        );
        // A pause keeps its members.
        assert!(parse_schedule("pause:3,pause:3,leave:3", 4).is_ok());
        for (bad, why) in [
            ("", "empty"),
            ("join", "KIND:N"),
            ("join:x", "not a count"),
            ("join:0", "at least 1"),
            ("grow:2", "unknown kind"),
            ("leave:4", "no consumer"),
            ("pause:4", "no consumer"),
            ("join:1,kill:5", "no consumer"),
        ] {
            let e = parse_schedule(bad, 4).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert_eq!(MemberEvent::Pause(2).to_string(), "pause 2");
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
    fn spreads_are_nearest_rank() {
        let s = Spread::of((1..=100).rev().map(f64::from).collect());
        assert_eq!(
            (s.count, s.p50_ms, s.p99_ms, s.max_ms),
            (100, Some(50.0), Some(99.0), Some(100.0))
        );
        let one = Spread::of(vec![7.0]);
        assert_eq!((one.p50_ms, one.p99_ms), (Some(7.0), Some(7.0)));
        assert_eq!(Spread::of(vec![]), Spread::default());
    }

    #[test]
    fn judge_counts_overlaps_takeover_and_stale_per_event() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let d = |ms, queue, member, dups| Delivery {
            at: at(ms),
            queue,
            member,
            msgs: 3,
            dups,
        };
        // Event 0 [0, 100): member 1 owns queues 0 and 1. Event 1 [100, 400): member 1 is
        // frozen at 100 and resumes at 250; member 2 takes queue 0 at 130 and queue 1 at 160;
        // after the resume member 1 delivers queue 0 once while 2 still does (stale, overlap),
        // then gets queue 1 back cleanly, one message of it a duplicate (stale). Queue 2,
        // which nobody else consumed meanwhile, it re-delivers from its committed offset:
        // duplicates, not stale.
        let log = vec![
            d(10, 0, 1, 0),
            d(20, 1, 1, 0),
            d(130, 0, 2, 0),
            d(160, 1, 2, 0),
            d(255, 0, 1, 0),
            d(260, 0, 2, 0),
            d(300, 1, 1, 1),
            d(320, 2, 1, 2),
        ];
        let mut events = vec![
            EventReport {
                kind: "start".into(),
                ..EventReport::default()
            },
            EventReport {
                kind: "pause".into(),
                ..EventReport::default()
            },
        ];
        let stopped = [Stopped {
            event: 1,
            member: 1,
            queues: vec![0, 1],
            at: at(100),
            resumed: Some(at(250)),
        }];
        judge(&mut events, &log, &[at(0), at(100), at(400)], &stopped);
        assert_eq!(events[0].overlaps, 0);
        assert_eq!(events[0].takeover_ms, None);
        assert_eq!(events[1].overlaps, 3);
        assert_eq!(events[1].takeover_ms, Some(60.0));
        assert_eq!(events[1].stale, Some(4));
        // Not taken over before the resume: no take-over figure.
        let early = [Stopped {
            resumed: Some(at(140)),
            ..stopped[0].clone()
        }];
        judge(&mut events, &log, &[at(0), at(100), at(400)], &early);
        assert_eq!(events[1].takeover_ms, None);

        let sum = summarize(&events);
        assert_eq!(sum.len(), 1);
        assert_eq!((sum[0].kind.as_str(), sum[0].events), ("pause", 1));
        assert_eq!(sum[0].overlaps, 3);
    }

    #[test]
    fn render_has_every_section() {
        let mut rb = RebalanceReport {
            queues: 16,
            strategy: "AVG".into(),
            mode: "auto".into(),
            baseline_pause_ms: 3.0,
            events: vec![
                EventReport {
                    event: "join 4".into(),
                    kind: "join".into(),
                    from: 4,
                    to: 8,
                    at_s: 10.0,
                    change_ms: 5.0,
                    pause_ms: 100.0,
                    moved_queues: 8,
                    ..EventReport::default()
                },
                EventReport {
                    event: "pause 1".into(),
                    kind: "pause".into(),
                    from: 8,
                    to: 8,
                    convergence_ms: Some(12.0),
                    takeover_ms: Some(10_400.0),
                    stale: Some(0),
                    ..EventReport::default()
                },
            ],
            ..RebalanceReport::default()
        };
        rb.summary = summarize(&rb.events);
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
            rebalance: Some(rb),
        };
        let text = render_report(&r);
        for needle in [
            "send ack",
            "end to end",
            "join 4",
            "4->8",
            "p99.9",
            "no ",
            "pause 1",
            "10400.0",
            "summary",
            "overlaps",
        ] {
            assert!(text.contains(needle), "{needle} missing in\n{text}");
        }
    }
}
