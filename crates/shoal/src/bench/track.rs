//! What the consumers of a benchmark group deliver: the tracker (duplicates, gaps per queue,
//! end-to-end latency, and for `bench rebalance` a log of every delivery with its queue,
//! member and time), the group's members and who owns which queue.
//!
//! A member runs either on the command's runtime (`bench consume`, `bench e2e`) or on its own
//! OS thread with its own single-threaded tokio runtime (`bench rebalance`), so that it can be
//! frozen: the consumer spawns its tasks onto the runtime it was started in, and while that
//! thread is blocked none of them runs (no heartbeat, no pull, no dispatch) while its sockets
//! stay open, as with a stopped process.

use super::{client_config, histogram, now_us, parse_body, round1, round3, ConsumeReport, Latency};
use crate::admin_cmd::Common;
use anyhow::Context;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use shoal_client::consumer::{ConsumeConcurrentlyStatus, MessageListener};
use shoal_client::{ConsumeFromWhere, MessageQueue, PushConsumer};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

// ---- consume side ---------------------------------------------------------------------

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct QueueTrack {
    pub(super) last: Option<Instant>,
    pub(super) last_member: usize,
    pub(super) max_gap: Duration,
}

/// One listener call of a tracked queue (this run's messages only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Delivery {
    /// When the listener was called.
    pub(super) at: Instant,
    /// Queue index (the tracker's order of the topic's queues).
    pub(super) queue: u32,
    /// Member id.
    pub(super) member: u32,
    /// Messages of the run in the call.
    pub(super) msgs: u32,
    /// Of them, messages delivered before (to any member).
    pub(super) dups: u32,
}

pub(super) struct TrackState {
    pub(super) consumed: u64,
    pub(super) bytes: u64,
    pub(super) foreign: u64,
    pub(super) duplicates: u64,
    /// Deliveries per (run, key).
    pub(super) seen: foldhash::HashMap<(u32, u64), u32>,
    pub(super) e2e: Histogram<u64>,
    pub(super) first: Option<Instant>,
    pub(super) last: Option<Instant>,
    pub(super) queues: Vec<QueueTrack>,
    /// Every delivery, in the order recorded (only when the tracker keeps a log).
    log: Option<Vec<Delivery>>,
}

/// Shared by every consumer's listener.
pub(super) struct Tracker {
    pub(super) topic: String,
    run: Option<u32>,
    /// The topic's queues (broker name, queue id), in the tracker's order.
    queues: Vec<(String, i32)>,
    pub(super) state: Mutex<TrackState>,
}

impl Tracker {
    pub(super) fn new(run: Option<u32>, queues: &[MessageQueue]) -> Self {
        Tracker {
            topic: queues.first().map(|q| q.topic.clone()).unwrap_or_default(),
            run,
            queues: queues
                .iter()
                .map(|q| (q.broker_name.clone(), q.queue_id))
                .collect(),
            state: Mutex::new(TrackState {
                consumed: 0,
                bytes: 0,
                foreign: 0,
                duplicates: 0,
                seen: foldhash::HashMap::default(),
                e2e: histogram(),
                first: None,
                last: None,
                queues: vec![QueueTrack::default(); queues.len()],
                log: None,
            }),
        }
    }

    /// The tracker's index of a queue of its topic (a scan: a topic has a few dozen queues at
    /// most, and a listener call looks one up without a copy of the broker name).
    pub(super) fn queue_of(&self, mq: &MessageQueue) -> Option<usize> {
        if mq.topic != self.topic {
            return None;
        }
        self.queues
            .iter()
            .position(|(b, id)| *id == mq.queue_id && *b == mq.broker_name)
    }

    /// Number of the topic's queues.
    pub(super) fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// Makes room for `messages` deliveries up front (at most 4 Mi; more grows as usual), so
    /// the duplicate check does not rehash its table while the run is measured.
    pub(super) fn expecting(self, messages: u64) -> Self {
        let room = messages.min(1 << 22) as usize;
        self.state.lock().seen.reserve(room);
        self
    }

    /// Also keeps a log of every delivery (`deliveries()`).
    pub(super) fn with_log(self) -> Self {
        self.state.lock().log = Some(Vec::new());
        self
    }

    /// The delivery log so far (empty without `with_log`).
    pub(super) fn deliveries(&self) -> Vec<Delivery> {
        self.state.lock().log.clone().unwrap_or_default()
    }

    pub(super) fn record<'a>(
        &self,
        member: usize,
        bodies: impl Iterator<Item = &'a [u8]>,
        mq: &MessageQueue,
    ) {
        let now_wall = now_us();
        let q = self.queue_of(mq);
        let mut s = self.state.lock();
        // Taken under the lock: the log is in time order.
        let now = Instant::now();
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
        let (mut msgs, mut dups) = (0u32, 0u32);
        for body in bodies {
            match parse_body(body) {
                Some(h) if self.run.is_none_or(|r| r == h.run) => {
                    s.e2e
                        .saturating_record(now_wall.saturating_sub(h.sent_us).max(1));
                    let c = s.seen.entry((h.run, h.key)).or_insert(0);
                    *c += 1;
                    if *c > 1 {
                        s.duplicates += 1;
                        dups += 1;
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
            msgs += 1;
            s.consumed += 1;
            s.bytes += body.len() as u64;
        }
        if msgs > 0 {
            s.first.get_or_insert(now);
            s.last = Some(now);
            if let (Some(queue), Some(log)) = (q, s.log.as_mut()) {
                log.push(Delivery {
                    at: now,
                    queue: queue as u32,
                    member: member as u32,
                    msgs,
                    dups,
                });
            }
        }
    }

    pub(super) fn consumed(&self) -> u64 {
        self.state.lock().consumed
    }

    /// Distinct messages of the run consumed.
    pub(super) fn unique(&self) -> usize {
        self.state.lock().seen.len()
    }

    pub(super) fn report(&self, lost: Option<u64>) -> ConsumeReport {
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
    pub(super) fn missing(&self, acked: &[(u64, u64)]) -> Vec<u64> {
        let run = self.run.unwrap_or_default();
        let s = self.state.lock();
        acked
            .iter()
            .filter(|(k, _)| !s.seen.contains_key(&(run, *k)))
            .map(|&(_, sent)| sent)
            .collect()
    }
}

/// What a member of the group is told to do (members on their own thread).
enum Control {
    /// Block the member's thread, and with it every task of its runtime, for this long.
    Freeze(Duration),
    /// Shut down gracefully (release, commit, unregister), then answer.
    Shutdown(oneshot::Sender<()>),
    /// Stop hard, as a crash: connections closed, nothing released, committed or unregistered.
    Kill,
}

/// One consumer of the benchmark group.
pub(super) struct Member {
    pub(super) id: usize,
    /// A handle of the consumer (its tasks run where it was started).
    pub(super) consumer: PushConsumer,
    /// Cleared when the member is killed: a crashed process's late deliveries do not count.
    pub(super) alive: Arc<AtomicBool>,
    /// Members on their own thread: its control channel and the thread.
    thread: Option<(mpsc::UnboundedSender<Control>, std::thread::JoinHandle<()>)>,
}

impl Member {
    /// Graceful shutdown; returns when the consumer has released everything.
    pub(super) async fn shutdown(&self) {
        match &self.thread {
            None => self.consumer.shutdown().await,
            Some((tx, _)) => {
                let (done, wait) = oneshot::channel();
                if tx.send(Control::Shutdown(done)).is_ok() {
                    let _ = wait.await;
                }
            }
        }
    }

    /// Hard stop: its late deliveries stop counting at once.
    pub(super) fn kill(&self) {
        self.alive.store(false, Ordering::Release);
        match &self.thread {
            None => self.consumer.instance().shutdown(),
            Some((tx, _)) => {
                let _ = tx.send(Control::Kill);
            }
        }
    }

    /// Freezes the member (its own thread only) for `d`; false if it has no thread of its own.
    pub(super) fn freeze(&self, d: Duration) -> bool {
        self.thread
            .as_ref()
            .is_some_and(|(tx, _)| tx.send(Control::Freeze(d)).is_ok())
    }

    /// Waits for the member's thread to end (after `shutdown` or `kill`).
    pub(super) async fn join(mut self) {
        if let Some((tx, handle)) = self.thread.take() {
            drop(tx);
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
    }
}

/// The consumer group of a benchmark.
#[derive(Debug, Clone)]
pub(super) struct GroupSpec {
    pub(super) group: String,
    pub(super) topic: String,
    /// The strategy chosen (`None`: the consumers' default for their mode).
    pub(super) strategy: Option<String>,
    pub(super) protocol: shoal_client::GroupProtocol,
    pub(super) from: ConsumeFromWhere,
    pub(super) from_ts_ms: i64,
    pub(super) rebalance_interval: Duration,
    pub(super) persist_offset_interval: Duration,
    /// Session timeout announced to Shoal brokers (`None`: the client's default).
    pub(super) session_timeout: Option<Duration>,
    pub(super) run: u32,
}

/// Starts member `id`'s consumer on the current runtime.
async fn start_consumer(
    common: &Common,
    spec: &GroupSpec,
    id: usize,
    tracker: &Arc<Tracker>,
    alive: &Arc<AtomicBool>,
) -> anyhow::Result<PushConsumer> {
    let (t, a) = (tracker.clone(), alive.clone());
    let listener = MessageListener::concurrently(move |msgs, ctx| {
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
    let mut builder = PushConsumer::builder(spec.group.clone())
        .client_config(cfg)
        .subscribe(spec.topic.clone(), "*")
        .protocol(spec.protocol)
        .rebalance_interval(spec.rebalance_interval)
        .consume_from_where(spec.from)
        .consume_timestamp_ms(spec.from_ts_ms)
        .consume_batch_size(32);
    if let Some(s) = &spec.strategy {
        builder = builder.allocate_strategy(s.clone());
    }
    if let Some(d) = spec.session_timeout {
        // As `shoal consume --session-timeout-ms`: heartbeats three times per session.
        builder = builder.configure(|c| {
            c.session_timeout = d;
            c.session_heartbeat_interval = (d / 3).min(Duration::from_secs(3));
        });
    }
    builder
        .start(listener)
        .await
        .with_context(|| format!("starting consumer {id}"))
}

/// Starts member `id` on the command's runtime.
pub(super) async fn start_member(
    common: &Common,
    spec: &GroupSpec,
    id: usize,
    tracker: &Arc<Tracker>,
) -> anyhow::Result<Member> {
    let alive = Arc::new(AtomicBool::new(true));
    let consumer = start_consumer(common, spec, id, tracker, &alive).await?;
    Ok(Member {
        id,
        consumer,
        alive,
        thread: None,
    })
}

/// Starts member `id` on its own OS thread with its own single-threaded runtime, which
/// `Member::freeze` can block.
pub(super) async fn start_thread_member(
    common: &Common,
    spec: &GroupSpec,
    id: usize,
    tracker: &Arc<Tracker>,
) -> anyhow::Result<Member> {
    let alive = Arc::new(AtomicBool::new(true));
    let (tx, mut rx) = mpsc::unbounded_channel::<Control>();
    let (started_tx, started) = oneshot::channel();
    let (common, spec, tracker, a) = (common.clone(), spec.clone(), tracker.clone(), alive.clone());
    let handle = std::thread::Builder::new()
        .name(format!("bench-member-{id}"))
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = started_tx.send(Err(anyhow::Error::from(e).context("member runtime")));
                    return;
                }
            };
            let killed = rt.block_on(async move {
                let consumer = match start_consumer(&common, &spec, id, &tracker, &a).await {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                        return false;
                    }
                };
                if started_tx.send(Ok(consumer.clone())).is_err() {
                    consumer.shutdown().await;
                    return false;
                }
                while let Some(c) = rx.recv().await {
                    match c {
                        // Blocking on purpose: nothing of this runtime runs meanwhile.
                        Control::Freeze(d) => std::thread::sleep(d),
                        Control::Shutdown(done) => {
                            consumer.shutdown().await;
                            let _ = done.send(());
                            return false;
                        }
                        Control::Kill => {
                            consumer.instance().shutdown();
                            return true;
                        }
                    }
                }
                consumer.shutdown().await;
                false
            });
            if killed {
                // Every task dropped where it stands, as in a crashed process.
                rt.shutdown_background();
            } else {
                rt.shutdown_timeout(Duration::from_secs(5));
            }
        })
        .context("spawning a member thread")?;
    let consumer = match started.await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
            return Err(e);
        }
        Err(_) => {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
            anyhow::bail!("member {id}'s thread ended before its consumer started");
        }
    };
    Ok(Member {
        id,
        consumer,
        alive,
        thread: Some((tx, handle)),
    })
}

/// Every queue owned by exactly one member: the owner per queue index.
pub(super) fn ownership(members: &[Member], tracker: &Tracker, nq: usize) -> Option<Vec<usize>> {
    let mut owner: Vec<Option<usize>> = vec![None; nq];
    for m in members {
        for q in m.consumer.owned_queues() {
            if q.topic != tracker.topic {
                continue;
            }
            if let Some(i) = tracker.queue_of(&q) {
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
pub(super) fn converged(
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

/// Marks the deliveries of two owners at once among those from `from` to `until`, from the
/// delivery log (in time order). Per queue, the deliveries of the window, after the queue's
/// last delivery before it (its owner when the window began), form runs (consecutive
/// deliveries by one member). A run by X is marked when the runs around it are by one other
/// member Y and X had delivered the queue before that Y run: X, Y, **X**, Y. X handed the
/// queue to Y (or Y took it), yet delivered it again while Y still did. A hand-over (X then
/// Y) and a return after one (X, Y, X: Y left or a later change gave it back) are not marked;
/// a frozen member that resumes and delivers a queue its successor still consumes is. The
/// window should hold one membership change (an event): across several, legitimate hand-overs
/// back and forth (X, Y, X, Y over three changes) would look the same.
pub(super) fn overlapping(log: &[Delivery], from: Instant, until: Instant) -> Vec<bool> {
    let mut marks = vec![false; log.len()];
    // The owner of each queue when the window began: its last delivery before.
    let mut seed: HashMap<u32, u32> = HashMap::new();
    for d in log.iter().take_while(|d| d.at < from) {
        seed.insert(d.queue, d.member);
    }
    // Per queue: runs of (member, indices into the log; none for the seed).
    let mut runs: HashMap<u32, Vec<(u32, Vec<usize>)>> = seed
        .into_iter()
        .map(|(q, m)| (q, vec![(m, Vec::new())]))
        .collect();
    for (i, d) in log.iter().enumerate() {
        if d.at < from || d.at >= until {
            continue;
        }
        let q = runs.entry(d.queue).or_default();
        match q.last_mut() {
            Some((m, idx)) if *m == d.member => idx.push(i),
            _ => q.push((d.member, vec![i])),
        }
    }
    for q in runs.values() {
        for w in q.windows(4) {
            let [(a, _), (y, _), (x, run), (b, _)] = w else {
                continue;
            };
            if a == x && b == y && x != y {
                for &i in run {
                    if let Some(m) = marks.get_mut(i) {
                        *m = true;
                    }
                }
            }
        }
    }
    marks
}

/// How long after `from` the queues in `queues` were each delivered by a member other than
/// `member` (the longest of them), if all were before `until`.
pub(super) fn taken_over(
    log: &[Delivery],
    member: u32,
    queues: &[u32],
    from: Instant,
    until: Instant,
) -> Option<Duration> {
    let mut longest = Duration::ZERO;
    for &q in queues {
        let first = log
            .iter()
            .find(|d| d.queue == q && d.member != member && d.at >= from && d.at < until)?;
        longest = longest.max(first.at.saturating_duration_since(from));
    }
    Some(longest)
}

#[cfg(test)]
mod tests {
    use super::super::{make_body, BodyHeader};
    use super::*;

    fn log(t0: Instant, entries: &[(u64, u32, u32)]) -> Vec<Delivery> {
        entries
            .iter()
            .map(|&(ms, queue, member)| Delivery {
                at: t0 + Duration::from_millis(ms),
                queue,
                member,
                msgs: 2,
                dups: 0,
            })
            .collect()
    }

    #[test]
    fn overlaps_are_interleaved_runs_not_hand_overs() {
        let t0 = Instant::now();
        // Queue 0: a clean hand-over 1 -> 2, then 2 leaves and 1 takes it back.
        // Queue 1: 3 hands over to 4 but delivers once more while 4 consumes (two owners).
        let l = log(
            t0,
            &[
                (0, 0, 1),
                (1, 1, 3),
                (2, 0, 1),
                (3, 1, 3),
                (4, 0, 2),
                (5, 1, 4),
                (6, 0, 2),
                (7, 1, 3),
                (8, 0, 1),
                (9, 1, 4),
                (10, 1, 4),
            ],
        );
        let marks = overlapping(&l, t0, t0 + Duration::from_secs(1));
        let marked: Vec<(u64, u32, u32)> = l
            .iter()
            .zip(&marks)
            .filter(|(_, m)| **m)
            .map(|(d, _)| {
                (
                    d.at.duration_since(t0).as_millis() as u64,
                    d.queue,
                    d.member,
                )
            })
            .collect();
        assert_eq!(marked, vec![(7, 1, 3)]);
        assert!(overlapping(&[], t0, t0).is_empty());
        // Hand-overs back and forth over several events are not overlaps when each event is
        // looked at alone: queue 0 goes 1 -> 2 (event 1), 2 -> 1 (event 2), 1 -> 2 (event 3).
        let l = log(t0, &[(0, 0, 1), (10, 0, 2), (20, 0, 1), (30, 0, 2)]);
        let at = |ms| t0 + Duration::from_millis(ms);
        for (from, to) in [(5, 15), (15, 25), (25, 35)] {
            assert!(!overlapping(&l, at(from), at(to)).contains(&true));
        }
        // One event holding all of it: the owner at its start (the seed) counts.
        let marks = overlapping(&l, at(5), at(35));
        assert_eq!(marks, vec![false, false, true, false]);
    }

    #[test]
    fn take_over_is_the_last_queue_delivered_by_another_member() {
        let t0 = Instant::now();
        let l = log(
            t0,
            &[(0, 0, 1), (5, 0, 2), (9, 1, 1), (12, 1, 3), (20, 2, 1)],
        );
        let d = |ms| Duration::from_millis(ms);
        assert_eq!(
            taken_over(&l, 1, &[0, 1], t0 + d(1), t0 + d(30)),
            Some(d(11))
        );
        // Queue 2 was never delivered by anyone else.
        assert_eq!(taken_over(&l, 1, &[0, 2], t0, t0 + d(30)), None);
        // Not before `until`.
        assert_eq!(taken_over(&l, 1, &[1], t0, t0 + d(12)), None);
    }

    #[test]
    fn tracker_expecting_a_count_has_room_for_it_and_counts_the_same() {
        let qs = vec![MessageQueue::new("T", "b", 0)];
        let t = Tracker::new(None, &qs).expecting(10_000);
        assert!(t.state.lock().seen.capacity() >= 10_000);
        let bodies: Vec<Vec<u8>> = (0..3)
            .map(|key| {
                make_body(
                    32,
                    &BodyHeader {
                        run: 1,
                        key: key % 2,
                        sent_us: now_us(),
                    },
                )
            })
            .collect();
        t.record(0, bodies.iter().map(|b| &b[..]), &qs[0]);
        let r = t.report(None);
        assert_eq!((r.consumed, r.unique, r.duplicates), (3, 2, 1));
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
        {
            let s = t.state.lock();
            assert_eq!(s.queues[0].last_member, 0);
            assert_eq!(s.queues[1].last_member, 1);
        }
        // No log unless asked for; with one, every call with run messages is in it.
        assert!(t.deliveries().is_empty());
        let t = Tracker::new(Some(5), &qs).with_log();
        t.record(0, [mk(5, 1), mk(5, 2)].iter().map(|b| &b[..]), &qs[0]);
        t.record(1, [mk(5, 1), mk(6, 1)].iter().map(|b| &b[..]), &qs[1]);
        t.record(1, [mk(6, 2)].iter().map(|b| &b[..]), &qs[1]);
        let l = t.deliveries();
        let rows: Vec<(u32, u32, u32, u32)> = l
            .iter()
            .map(|d| (d.queue, d.member, d.msgs, d.dups))
            .collect();
        assert_eq!(rows, vec![(0, 0, 2, 0), (1, 1, 1, 1)]);
        assert!(l[0].at <= l[1].at);
    }
}
