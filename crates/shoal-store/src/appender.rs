//! The appender: every put goes through one place that owns the commit log's writer.
//!
//! A put is first **encoded** by its caller (records built with zero offsets, outside any
//! lock), then **queued** as a [`Job`]. Whoever finds the writer free (the caller of a blocking
//! [`MessageStore::put_messages`], or the task polling a [`PutFuture`], or a connection ending
//! its batch with [`MessageStore::drain_appends`]) becomes the appender for that moment: it
//! takes **every job waiting**, assigns queue offsets, writes all their records with one
//! write per segment (a copy into its memory map, or a `pwrite`), adds the consume-queue and
//! index entries, and completes the jobs together. Jobs that arrive meanwhile are taken by the
//! same appender before it lets go (it looks again after unlocking), so nobody waits on a lock
//! and no thread is woken per put.
//!
//! Under sync flush a completed append is not yet acknowledged: its job goes to the group
//! commit thread, which fsyncs everything written so far and then completes every job the fsync
//! covers (one fsync for all of them). Asynchronous puts ([`MessageStore::submit`]) never
//! block their thread on an fsync.

use foldhash::{HashMap, HashMapExt};
use std::borrow::Cow;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};
use shoal_proto::message::property::{find_properties, KEYS, TAGS, UNIQ_KEY, WAIT};
use shoal_proto::message::record::{encode_record, patch_record, RecordFields, RecordLayout};

use crate::config::FlushMode;
use crate::consume_queue::{ConsumeQueue, CqEntry};
use crate::error::Result;
use crate::index::{key_hash_continue, key_hash_prefix};
use crate::record::{for_each_index_key, now_ms, validate_topic, TORN_PROPERTIES_END};
use crate::store::{Inner, MessageStore, WriterState};
use crate::types::{
    AppendedMessage, FlushStatus, MessageArrival, MessageExtBrokerInner, PutMessageResult,
};
use crate::StoreError;

/// One put, encoded and waiting for the appender.
pub(crate) struct Job<'a> {
    msgs: Cow<'a, [MessageExtBrokerInner]>,
    /// The records back to back, offsets and store timestamp still zero.
    encoded: Vec<u8>,
    /// Per record (one list, one allocation): where it is in `encoded`, its tags' hash code,
    /// and where its KEYS and UNIQ_KEY values are in its properties (the index's keys, found
    /// in the same pass over the properties as the tags).
    records: Vec<Record>,
    /// Under sync flush: whether the producer waits for the fsync (RocketMQ's `WAIT`).
    wait: bool,
    /// Where the result goes (queued jobs; the blocking caller's own job has none).
    slot: Option<Arc<Slot>>,
}

impl<'a> Job<'a> {
    /// Validates and encodes `msgs` (no lock held).
    pub(crate) fn encode(inner: &Inner, msgs: Cow<'a, [MessageExtBrokerInner]>) -> Result<Job<'a>> {
        let store_host = inner.config.store_host;
        let total: usize = msgs.iter().map(|m| m.body.len() + 256).sum();
        let mut encoded: Vec<u8> = Vec::with_capacity(total);
        let mut records = Vec::with_capacity(msgs.len());
        // RocketMQ's `WAIT=false` property: the producer does not wait for the flush.
        let mut wait = false;
        for m in msgs.iter() {
            validate_topic(&m.topic)?;
            if m.queue_id < 0 {
                return Err(StoreError::InvalidArgument(format!(
                    "negative queue id {}",
                    m.queue_id
                )));
            }
            // Recovery takes a record whose properties end in a zero byte for a torn write
            // (zeros after the body are not covered by its CRC), so none is ever stored.
            // RocketMQ clients end every property with a separator.
            if m.properties.ends_with(TORN_PROPERTIES_END) {
                return Err(StoreError::InvalidArgument(
                    "message properties end with a NUL character".into(),
                ));
            }
            let fields = RecordFields {
                topic: &m.topic,
                queue_id: m.queue_id,
                flag: m.flag,
                queue_offset: 0,
                physical_offset: 0,
                sys_flag: m.sys_flag,
                born_timestamp: m.born_timestamp,
                born_host: m.born_host,
                store_timestamp: 0,
                store_host,
                reconsume_times: m.reconsume_times,
                prepared_transaction_offset: m.prepared_transaction_offset,
                body: &m.body,
                properties: &m.properties,
            };
            let len = fields.encoded_len()?;
            if len > inner.config.max_message_size {
                return Err(StoreError::MessageTooLarge {
                    size: len,
                    max: inner.config.max_message_size,
                });
            }
            let layout = encode_record(&fields, &mut encoded)?;
            // Found by the sender when it could say (see `KnownProperties`), else here.
            let [tags, wait_prop, keys, uniq] = match m.known.and_then(|k| k.resolve(&m.properties))
            {
                Some(found) => found,
                None => find_properties(&m.properties, [TAGS, WAIT, KEYS, UNIQ_KEY]),
            };
            records.push(Record {
                layout,
                tag_code: shoal_proto::hash::tags_code(tags),
                keys: span(&m.properties, keys),
                uniq: span(&m.properties, uniq),
            });
            wait |= wait_prop != Some("false");
        }
        Ok(Job {
            msgs,
            encoded,
            records,
            wait,
            slot: None,
        })
    }
}

/// One record of a [`Job`].
struct Record {
    layout: RecordLayout,
    tag_code: i64,
    keys: Option<Range<usize>>,
    uniq: Option<Range<usize>>,
}

/// Where `value` (a slice of `within`) is in `within`.
fn span(within: &str, value: Option<&str>) -> Option<Range<usize>> {
    let value = value?;
    let start = (value.as_ptr() as usize).checked_sub(within.as_ptr() as usize)?;
    let at = start..start + value.len();
    debug_assert_eq!(
        within.get(at.clone()),
        Some(value),
        "not a slice of `within`"
    );
    Some(at)
}

/// The slice of `within` a [`span`] gave (nothing if it does not fit, which cannot happen
/// for the string the span was taken from).
fn unspan<'a>(within: &'a str, at: &Option<Range<usize>>) -> Option<&'a str> {
    within.get(at.clone()?)
}

/// Queues named by more records than this in one append are found through a map.
const SCAN_QUEUES: usize = 16;

/// A scratch list that grew past this many bytes is given back after the append.
const SCRATCH_KEEP_BYTES: usize = 1 << 20;

/// Lists an append fills and empties, kept by the writer from one append to the next.
#[derive(Default)]
pub(crate) struct AppendScratch {
    /// Per record, in append order: its size, its (job, message), its queue offset, its
    /// commit-log offset, and which of `queues` it goes to.
    sizes: Vec<usize>,
    refs: Vec<(usize, usize)>,
    queue_offsets: Vec<u64>,
    phys: Vec<u64>,
    slot_of: Vec<usize>,
    /// The queues the append writes to.
    queues: Vec<QueueSlot>,
    /// Records ordered by queue, and one queue's consume-queue entries.
    order: Vec<usize>,
    entries: Vec<CqEntry>,
    /// The bytes of one commit-log write.
    buf: Vec<u8>,
}

/// A queue an append writes to: the first record naming it, and its next offset.
struct QueueSlot {
    first: (usize, usize),
    cq: Arc<ConsumeQueue>,
    next: u64,
}

impl AppendScratch {
    /// Empties every list (the queues are let go), keeping their room unless it grew large.
    fn clear(&mut self) {
        fn clear<T>(v: &mut Vec<T>) {
            v.clear();
            if v.capacity() * std::mem::size_of::<T>() > SCRATCH_KEEP_BYTES {
                *v = Vec::new();
            }
        }
        self.queues.clear();
        clear(&mut self.sizes);
        clear(&mut self.refs);
        clear(&mut self.queue_offsets);
        clear(&mut self.phys);
        clear(&mut self.slot_of);
        clear(&mut self.order);
        clear(&mut self.entries);
        clear(&mut self.buf);
    }
}

/// What one append did for one job.
pub(crate) struct Appended {
    messages: Vec<AppendedMessage>,
    /// Commit log offset after the job's last record.
    end: u64,
}

/// The jobs of one append, in append order: the blocking caller's own job (if any), then
/// the queued ones (no list of references built per append).
#[derive(Clone, Copy)]
pub(crate) struct Jobs<'j, 'a> {
    own: Option<&'j Job<'a>>,
    queued: &'j [Job<'a>],
}

impl<'j, 'a> Jobs<'j, 'a> {
    fn iter(self) -> impl Iterator<Item = &'j Job<'a>> {
        self.own.into_iter().chain(self.queued)
    }
}

impl<'a> std::ops::Index<usize> for Jobs<'_, 'a> {
    type Output = Job<'a>;
    fn index(&self, i: usize) -> &Job<'a> {
        match self.own {
            Some(own) if i == 0 => own,
            Some(_) => &self.queued[i - 1],
            None => &self.queued[i],
        }
    }
}

/// The completion of a queued job: the result, and the waker of whoever waits for it.
#[derive(Default)]
pub(crate) struct Slot {
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    result: Option<Result<PutMessageResult>>,
    waker: Option<Waker>,
}

impl Slot {
    fn complete(&self, result: Result<PutMessageResult>) {
        let waker = {
            let mut s = self.state.lock();
            s.result = Some(result);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A job appended under sync flush, waiting for the fsync that covers it.
pub(crate) struct SyncWaiter {
    end: u64,
    deadline: Instant,
    slot: Arc<Slot>,
    messages: Vec<AppendedMessage>,
}

/// The queue of jobs waiting for the appender, and those waiting for their fsync.
#[derive(Default)]
pub(crate) struct AppendQueue {
    pub(crate) jobs: Mutex<Vec<Job<'static>>>,
    /// Number of queued jobs (read without the lock).
    pub(crate) queued: std::sync::atomic::AtomicUsize,
    pub(crate) sync_waiters: Mutex<Vec<SyncWaiter>>,
    pub(crate) sync_cv: parking_lot::Condvar,
    /// Whether a group commit thread serves `sync_waiters` (else the appender fsyncs).
    pub(crate) sync_thread: std::sync::atomic::AtomicBool,
}

/// The result of [`MessageStore::submit`]: completes when the messages are appended (and,
/// under sync flush, fsynced). Needs no runtime; any executor can poll it.
pub struct PutFuture {
    inner: Arc<Inner>,
    state: PutState,
}

enum PutState {
    /// Encoded, not yet queued (queued on the first poll).
    Ready(Box<Job<'static>>),
    Queued(Arc<Slot>),
    /// Refused before queueing (boxed: rare, and it would double the future's size).
    Failed(Option<Box<StoreError>>),
    Done,
}

impl std::fmt::Debug for PutFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            PutState::Ready(_) => "ready",
            PutState::Queued(_) => "queued",
            PutState::Failed(_) => "failed",
            PutState::Done => "done",
        };
        f.debug_struct("PutFuture").field("state", &state).finish()
    }
}

impl Drop for PutFuture {
    /// A put dropped while queued is still appended (it cannot be taken back), and it may be
    /// the one whose next poll was to append the queue (see `poll`): appending now keeps the
    /// puts queued behind it from waiting for someone else's.
    fn drop(&mut self) {
        if matches!(self.state, PutState::Queued(_)) {
            self.inner.drain();
        }
    }
}

impl Future for PutFuture {
    type Output = Result<PutMessageResult>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match std::mem::replace(&mut this.state, PutState::Done) {
            PutState::Done => Poll::Ready(Err(StoreError::InvalidArgument(
                "put future polled after completion".into(),
            ))),
            PutState::Failed(e) => Poll::Ready(Err(e.map_or(StoreError::Closed, |e| *e))),
            PutState::Ready(mut job) => {
                let slot = Arc::new(Slot::default());
                slot.state.lock().waker = Some(cx.waker().clone());
                job.slot = Some(Arc::clone(&slot));
                let first = this.inner.enqueue(*job);
                this.state = PutState::Queued(slot);
                // Let the other tasks (or the other requests of this connection) queue their
                // puts first; the next poll appends them all at once. Only the put that found
                // the queue empty asks to be polled again: a put queued behind it is appended
                // by that poll (or by whoever drains first) and woken through its slot. Waking
                // every put would make a `FuturesUnordered` of a connection's requests yield
                // after two of them, splitting its batch into appends of two.
                if first {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
            PutState::Queued(slot) => {
                if let Some(r) = take_result(&slot, cx) {
                    return Poll::Ready(r);
                }
                this.inner.drain();
                if let Some(r) = take_result(&slot, cx) {
                    return Poll::Ready(r);
                }
                this.state = PutState::Queued(slot);
                Poll::Pending
            }
        }
    }
}

/// The result if there is one; else registers the waker.
fn take_result(slot: &Slot, cx: &Context<'_>) -> Option<Result<PutMessageResult>> {
    let mut s = slot.state.lock();
    match s.result.take() {
        Some(r) => Some(r),
        None => {
            if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                s.waker = Some(cx.waker().clone());
            }
            None
        }
    }
}

impl MessageStore {
    /// Appends one message. See [`Self::put_messages`].
    pub fn put_message(&self, msg: &MessageExtBrokerInner) -> Result<PutMessageResult> {
        self.put_messages(std::slice::from_ref(msg))
    }

    /// Appends messages (any mix of topics and queues) as one batch: queue offsets are
    /// assigned per (topic, queue) in order, the records are written with one write per
    /// segment, and under sync flush the call returns after one fsync covering all of them
    /// (unless every message carries `WAIT=false`, as RocketMQ, then `NotFlushed`).
    /// Either all messages are appended or (on error) none is visible.
    pub fn put_messages(&self, msgs: &[MessageExtBrokerInner]) -> Result<PutMessageResult> {
        let inner = &*self.inner;
        if inner.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        if msgs.is_empty() {
            return Ok(PutMessageResult {
                messages: Vec::new(),
                flush: FlushStatus::NotFlushed,
            });
        }
        // Encoded outside the lock; offsets and store timestamp are patched in under it,
        // together with every put queued by others (see above).
        let job = Job::encode(inner, Cow::Borrowed(msgs))?;
        inner.put_blocking(job)
    }

    /// Queues messages for the appender without blocking: they are validated and encoded now,
    /// appended together with every other put waiting when the returned future is polled again
    /// (or when someone calls [`MessageStore::drain_appends`]), and the future completes when
    /// they are written (under sync flush: fsynced). Semantics as
    /// [`MessageStore::put_messages`]: all messages of one call are appended or none.
    pub fn submit(&self, msgs: Vec<MessageExtBrokerInner>) -> PutFuture {
        let inner = Arc::clone(&self.inner);
        let state = if inner.closed.load(Ordering::Acquire) {
            PutState::Failed(Some(Box::new(StoreError::Closed)))
        } else if msgs.is_empty() {
            PutState::Failed(Some(Box::new(StoreError::InvalidArgument(
                "a put needs at least one message".into(),
            ))))
        } else {
            match Job::encode(&inner, Cow::Owned(msgs)) {
                Ok(job) => PutState::Ready(Box::new(job)),
                Err(e) => PutState::Failed(Some(Box::new(e))),
            }
        };
        PutFuture { inner, state }
    }

    /// Appends every queued put now, unless another thread is appending (which then takes
    /// them before it lets go). Cheap when nothing is queued.
    pub fn drain_appends(&self) {
        self.inner.drain();
    }

    /// Whether puts are queued for the appender (waiting for a poll of their future or for
    /// [`MessageStore::drain_appends`]). One atomic load.
    pub fn appends_queued(&self) -> bool {
        self.inner.appends.queued.load(Ordering::Acquire) > 0
    }
}

/// The writer locked for something other than appending. A put that finds the writer busy
/// leaves its job to the holder (`Inner::drain`), so the holder must look at the queue once
/// it lets go: this guard does, on drop.
pub(crate) struct WriterUse<'a> {
    inner: &'a Inner,
    guard: Option<MutexGuard<'a, WriterState>>,
}

impl std::ops::Deref for WriterUse<'_> {
    type Target = WriterState;
    #[allow(clippy::expect_used, reason = "the guard is taken only in drop")]
    fn deref(&self) -> &WriterState {
        self.guard.as_deref().expect("held until drop")
    }
}

impl std::ops::DerefMut for WriterUse<'_> {
    #[allow(clippy::expect_used, reason = "the guard is taken only in drop")]
    fn deref_mut(&mut self) -> &mut WriterState {
        self.guard.as_deref_mut().expect("held until drop")
    }
}

impl Drop for WriterUse<'_> {
    fn drop(&mut self) {
        self.guard = None;
        self.inner.drain();
    }
}

impl Inner {
    /// Locks the writer for something other than appending (see [`WriterUse`]).
    pub(crate) fn lock_writer(&self) -> WriterUse<'_> {
        WriterUse {
            inner: self,
            guard: Some(self.writer.lock()),
        }
    }

    /// Queues `job`; true when the queue was empty (the caller must then see to a drain).
    fn enqueue(&self, job: Job<'static>) -> bool {
        let mut q = self.appends.jobs.lock();
        q.push(job);
        self.appends.queued.store(q.len(), Ordering::Release);
        q.len() == 1
    }

    fn take_queued(&self) -> Vec<Job<'static>> {
        if self.appends.queued.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut q = self.appends.jobs.lock();
        self.appends.queued.store(0, Ordering::Release);
        std::mem::take(&mut *q)
    }

    /// Appends queued jobs while the writer is free.
    pub(crate) fn drain(&self) {
        loop {
            if self.appends.queued.load(Ordering::Acquire) == 0 {
                return;
            }
            let Some(mut w) = self.writer.try_lock() else {
                // The holder looks at the queue again after unlocking.
                return;
            };
            let jobs = self.take_queued();
            let list = Jobs {
                own: None,
                queued: &jobs,
            };
            let outcome = self.append_locked(&mut w, list);
            drop(w);
            self.finish(jobs, outcome);
        }
    }

    /// The blocking put: appends `own` together with whatever is queued, then waits for the
    /// fsync if needed.
    pub(crate) fn put_blocking(&self, own: Job<'_>) -> Result<PutMessageResult> {
        let mut w = self.writer.lock();
        let others = self.take_queued();
        let list = Jobs {
            own: Some(&own),
            queued: &others,
        };
        let outcome = self.append_locked(&mut w, list);
        drop(w);
        let (mine, rest) = match outcome {
            Ok(mut per_job) => {
                let rest = per_job.split_off(1);
                // Listeners hear of this job first, then (in `finish`) of the others: append
                // order.
                self.notify_arrivals(std::iter::once(&own).zip(&per_job));
                (per_job.pop(), Ok(rest))
            }
            Err(e) => {
                let shared = e.to_string();
                self.finish(others, Err(StoreError::WriteFailed(shared)));
                return Err(e);
            }
        };
        self.finish(others, rest);
        // Jobs queued while this thread held the writer.
        self.drain();
        let mine = mine.ok_or_else(|| StoreError::InvalidArgument("nothing appended".into()))?;
        let flush = match self.config.flush_mode {
            FlushMode::Sync if own.wait => self.wait_durable(mine.end),
            _ => FlushStatus::NotFlushed,
        };
        Ok(PutMessageResult {
            messages: mine.messages,
            flush,
        })
    }

    /// Completes appended jobs (or fails them all).
    fn finish(&self, jobs: Vec<Job<'static>>, outcome: Result<Vec<Appended>>) {
        let per_job = match outcome {
            Ok(per_job) => per_job,
            Err(e) => {
                let text = e.to_string();
                for job in jobs {
                    if let Some(slot) = job.slot {
                        slot.complete(Err(StoreError::WriteFailed(text.clone())));
                    }
                }
                return;
            }
        };
        self.notify_arrivals(jobs.iter().zip(&per_job));
        let sync = self.config.flush_mode == FlushMode::Sync;
        let mut waiters = Vec::new();
        for (job, done) in jobs.into_iter().zip(per_job) {
            let Some(slot) = job.slot else { continue };
            if sync && job.wait {
                waiters.push(SyncWaiter {
                    end: done.end,
                    deadline: Instant::now() + self.config.sync_flush_timeout,
                    slot,
                    messages: done.messages,
                });
            } else {
                slot.complete(Ok(PutMessageResult {
                    messages: done.messages,
                    flush: FlushStatus::NotFlushed,
                }));
            }
        }
        if waiters.is_empty() {
            return;
        }
        if self.appends.sync_thread.load(Ordering::Acquire) {
            self.appends.sync_waiters.lock().extend(waiters);
            self.appends.sync_cv.notify_one();
        } else {
            // No group commit thread (tests without background threads): fsync here.
            let end = waiters.iter().map(|w| w.end).max().unwrap_or(0);
            let status = self.wait_durable(end);
            for w in waiters {
                w.slot.complete(Ok(PutMessageResult {
                    messages: w.messages,
                    flush: status,
                }));
            }
        }
    }

    /// Tells the listeners of every message of the appended jobs, in append order. A
    /// replicated store's records arrive when they are dispatched (below the confirmed
    /// offset): this dispatches what is due instead.
    fn notify_arrivals<'j, 'a: 'j>(
        &self,
        appended: impl Iterator<Item = (&'j Job<'a>, &'j Appended)>,
    ) {
        if self.config.replicated {
            self.dispatch_confirmed();
            return;
        }
        let listeners = self.listeners.read();
        if listeners.is_empty() {
            return;
        }
        for (job, done) in appended {
            for ((m, r), a) in job.msgs.iter().zip(&job.records).zip(&done.messages) {
                let arrival = MessageArrival {
                    topic: &m.topic,
                    queue_id: m.queue_id,
                    queue_offset: a.queue_offset,
                    tag_code: r.tag_code,
                    store_timestamp: a.store_timestamp,
                };
                for l in listeners.iter() {
                    l(&arrival);
                }
            }
        }
    }

    /// The group commit thread: fsyncs what is written whenever appends wait for it, then
    /// completes every job the fsync covers.
    pub(crate) fn group_commit_loop(&self) {
        loop {
            let batch = {
                let mut waiters = self.appends.sync_waiters.lock();
                while waiters.is_empty() {
                    if self.stop.is_raised() {
                        return;
                    }
                    self.appends
                        .sync_cv
                        .wait_for(&mut waiters, std::time::Duration::from_millis(200));
                }
                std::mem::take(&mut *waiters)
            };
            let end = batch.iter().map(|w| w.end).max().unwrap_or(0);
            let status = self.wait_durable(end);
            let now = Instant::now();
            for w in batch {
                let flush = match status {
                    FlushStatus::Flushed if now > w.deadline => FlushStatus::FlushTimeout,
                    s => s,
                };
                w.slot.complete(Ok(PutMessageResult {
                    messages: w.messages,
                    flush,
                }));
            }
        }
    }

    /// Fails every job still waiting (shutdown).
    pub(crate) fn fail_waiting(&self) {
        for job in self.take_queued() {
            if let Some(slot) = job.slot {
                slot.complete(Err(StoreError::Closed));
            }
        }
        let waiters = std::mem::take(&mut *self.appends.sync_waiters.lock());
        for w in waiters {
            let status = if self.commit_log.flushed() >= w.end {
                FlushStatus::Flushed
            } else {
                FlushStatus::FlushTimeout
            };
            w.slot.complete(Ok(PutMessageResult {
                messages: w.messages,
                flush: status,
            }));
        }
    }

    /// Appends the jobs' records in one commit-log write (per segment), assigning queue offsets
    /// per (topic, queue) in order, then writes their consume-queue and index entries. All or
    /// nothing: on error no record becomes visible.
    fn append_locked(
        &self,
        w: &mut MutexGuard<'_, WriterState>,
        jobs: Jobs<'_, '_>,
    ) -> Result<Vec<Appended>> {
        if let Some(reason) = &w.failed {
            return Err(StoreError::WriteFailed(reason.clone()));
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        if self.puts_refused.load(Ordering::Acquire) {
            return Err(StoreError::PutsRefused);
        }
        let ts = now_ms().max(w.last_store_timestamp);
        // Lists reused from one append to the next (no allocation per append once warm).
        let mut scratch = std::mem::take(&mut w.scratch);
        if let Err(e) = self.write_and_dispatch(w, &mut scratch, jobs, ts) {
            scratch.clear();
            w.scratch = scratch;
            return Err(e);
        }
        let AppendScratch {
            sizes,
            refs,
            queue_offsets,
            phys,
            ..
        } = &scratch;
        if !self.config.replicated {
            let end = self.commit_log.write_pos();
            self.dispatched.store(end, Ordering::Release);
        }
        let store_host = self.config.store_host;
        let mut per_job: Vec<Appended> = jobs
            .iter()
            .map(|j| Appended {
                messages: Vec::with_capacity(j.records.len()),
                end: 0,
            })
            .collect();
        for (i, &(j, _)) in refs.iter().enumerate() {
            let done = &mut per_job[j];
            done.messages.push(AppendedMessage {
                physical_offset: phys[i],
                queue_offset: queue_offsets[i],
                store_timestamp: ts,
                size: sizes[i] as u32,
                store_host,
            });
            done.end = phys[i] + sizes[i] as u64;
        }
        scratch.clear();
        w.scratch = scratch;
        Ok(per_job)
    }

    /// Writes the jobs' records (one commit-log write per segment) and their consume-queue
    /// and index entries, leaving in `s` each record's size, place, queue offset and
    /// commit-log offset. On a dispatch failure the writer is marked failed.
    fn write_and_dispatch(
        &self,
        w: &mut MutexGuard<'_, WriterState>,
        s: &mut AppendScratch,
        jobs: Jobs<'_, '_>,
        ts: i64,
    ) -> Result<()> {
        let replicated = self.config.replicated;
        for (j, job) in jobs.iter().enumerate() {
            for (k, r) in job.records.iter().enumerate() {
                s.sizes.push(r.layout.len);
                s.refs.push((j, k));
            }
        }
        // Queue offsets per (topic, queue) in order. An append names few queues: they are
        // found by a scan, or through a map once there are many.
        let mut many: Option<HashMap<(&str, i32), usize>> = None;
        for &(j, k) in &s.refs {
            let m = &jobs[j].msgs[k];
            let found = match &many {
                Some(map) => map.get(&(m.topic.as_str(), m.queue_id)).copied(),
                None => s.queues.iter().position(|q| {
                    let first = &jobs[q.first.0].msgs[q.first.1];
                    first.queue_id == m.queue_id && first.topic == m.topic
                }),
            };
            let slot = match found {
                Some(slot) => slot,
                None => {
                    let cq = self
                        .queues
                        .get(&m.topic, m.queue_id, true)?
                        .ok_or_else(|| StoreError::InvalidArgument("queue not created".into()))?;
                    // A replicated store's queue numbering also counts the records waiting
                    // for their dispatch.
                    let next = if replicated {
                        cq.next_offset()
                    } else {
                        cq.max_offset()
                    };
                    s.queues.push(QueueSlot {
                        first: (j, k),
                        cq,
                        next,
                    });
                    let slot = s.queues.len() - 1;
                    if let Some(map) = &mut many {
                        map.insert((m.topic.as_str(), m.queue_id), slot);
                    } else if s.queues.len() > SCAN_QUEUES {
                        let mut map = HashMap::with_capacity(2 * SCAN_QUEUES);
                        for (i, q) in s.queues.iter().enumerate() {
                            let first = &jobs[q.first.0].msgs[q.first.1];
                            map.insert((first.topic.as_str(), first.queue_id), i);
                        }
                        many = Some(map);
                    }
                    slot
                }
            };
            s.queue_offsets.push(s.queues[slot].next);
            s.queues[slot].next += 1;
            s.slot_of.push(slot);
        }
        let (refs, queue_offsets) = (&s.refs, &s.queue_offsets);
        self.commit_log
            .append(&s.sizes, &mut s.phys, &mut s.buf, |i, phys, buf| {
                let (j, k) = refs[i];
                let job = &jobs[j];
                let start = buf.len();
                let range = job.records[k].layout.range();
                buf.extend_from_slice(job.encoded.get(range).unwrap_or(&[]));
                patch_record(&mut buf[start..], queue_offsets[i] as i64, phys as i64, ts)?;
                Ok(())
            })?;
        w.last_store_timestamp = ts;
        if replicated {
            // Dispatched once confirmed (`Inner::dispatch_confirmed`, from the commit log).
            for q in &s.queues {
                q.cq.note_assigned(q.next);
            }
            return Ok(());
        }
        // Dispatch: consume-queue entries grouped per queue (records in order within each),
        // then index entries.
        let dispatch = |s: &mut AppendScratch| -> Result<()> {
            s.order.extend(0..s.refs.len());
            let slot_of = &s.slot_of;
            s.order.sort_by_key(|&i| slot_of[i]);
            let mut at = 0;
            while at < s.order.len() {
                let slot = s.slot_of[s.order[at]];
                s.entries.clear();
                while at < s.order.len() && s.slot_of[s.order[at]] == slot {
                    let i = s.order[at];
                    let (j, k) = s.refs[i];
                    s.entries.push(CqEntry {
                        phys_offset: s.phys[i],
                        size: s.sizes[i] as u32,
                        tag_code: jobs[j].records[k].tag_code,
                    });
                    at += 1;
                }
                s.queues[slot].cq.append(&s.entries)?;
            }
            // Every key of the batch under one lock of the index.
            self.index.put_all(
                |batch| {
                    // The hash's state after `topic#`, for the records of one job (one topic
                    // per request; a batch's records share it too).
                    let mut prefix: Option<(&str, u64)> = None;
                    for (&(j, k), &at) in s.refs.iter().zip(&s.phys) {
                        let (m, r) = (&jobs[j].msgs[k], &jobs[j].records[k]);
                        let (p, topic) = (m.properties.as_str(), m.topic.as_str());
                        let state = match prefix {
                            Some((t, state)) if t == topic => state,
                            _ => {
                                let state = key_hash_prefix(topic);
                                prefix = Some((topic, state));
                                state
                            }
                        };
                        for_each_index_key(unspan(p, &r.keys), unspan(p, &r.uniq), |key| {
                            batch.push((key_hash_continue(state, key), at));
                        });
                    }
                },
                ts,
            )?;
            Ok(())
        };
        if let Err(e) = dispatch(s) {
            w.failed = Some(format!("dispatch after a commit log append failed: {e}"));
            self.write_failed.store(true, Ordering::Release);
            return Err(e);
        }
        Ok(())
    }
}
