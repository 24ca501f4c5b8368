//! Concurrent consumption: batches run in parallel (bounded by `consume_thread_max`), each
//! handed to the listener only while the queue's lease is valid.

use super::{
    ConcurrentlyFn, ConsumeConcurrentlyStatus, ConsumeContext, Inner, MessageListener, QueueState,
};
use shoal_proto::message::MessageExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

impl Inner {
    pub(super) fn spawn_concurrent(
        self: &Arc<Self>,
        state: Arc<QueueState>,
        f: Arc<ConcurrentlyFn>,
        msgs: Vec<MessageExt>,
    ) {
        let inner = self.clone();
        state.begin();
        tokio::spawn(async move {
            inner.consume_concurrently(&state, f, msgs).await;
            state.end();
        });
    }

    async fn consume_concurrently(
        self: &Arc<Self>,
        state: &Arc<QueueState>,
        f: Arc<ConcurrentlyFn>,
        msgs: Vec<MessageExt>,
    ) {
        let Ok(_permit) = self.permits.clone().acquire_owned().await else {
            return;
        };
        if state.fenced.load(std::sync::atomic::Ordering::Relaxed) {
            // Not consumed: stays below the committed offset for the next owner.
            return;
        }
        let offsets: Vec<i64> = msgs.iter().map(|m| m.queue_offset).collect();
        let (first, last) = (
            offsets.iter().copied().min().unwrap_or(-1),
            offsets.iter().copied().max().unwrap_or(-1),
        );
        // The listener sees a retried message under its original topic; the retry topic is
        // put back afterwards for a send-back. The messages move to the listener's thread and
        // back, uncopied.
        let mut msgs = msgs;
        let retry_topics = self.for_listener_in_place(&mut msgs);
        let ctx = ConsumeContext {
            message_queue: state.mq.clone(),
            stopped: state.cancel.clone(),
        };
        let started = Instant::now();
        // Fencing: checked on the listener's thread right before the call; a member past its
        // lease, or a stopped queue (except gaps below what it delivered), hands over nothing
        // (the messages stay below the committed offset). A listener that panics asks for the
        // batch to be consumed later, as one that returns ReconsumeLater.
        let st = state.clone();
        let Ok((status, mut msgs)) = tokio::task::spawn_blocking(move || {
            let status = st.admit_concurrent(first, last).then(|| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&msgs, &ctx)))
                    .unwrap_or(ConsumeConcurrentlyStatus::ReconsumeLater)
            });
            (status, msgs)
        })
        .await
        else {
            // The runtime is shutting down: nothing was consumed.
            return;
        };
        for (i, topic) in retry_topics {
            msgs[i].topic = topic;
        }
        let Some(status) = status else {
            debug!(queue = %state.mq, n = msgs.len(), "queue stopped or lease not valid: batch not delivered");
            return;
        };
        state.pq.lock().last_consume_ms = crate::now_ms_u64();
        debug!(queue = %state.mq, n = msgs.len(), ?status, elapsed = ?started.elapsed(), "consumed");
        let mut keep: Vec<MessageExt> = Vec::new();
        match status {
            ConsumeConcurrentlyStatus::ConsumeSuccess => {
                self.stats
                    .consumed_ok
                    .fetch_add(msgs.len() as u64, Ordering::Relaxed);
            }
            ConsumeConcurrentlyStatus::ReconsumeLater => {
                self.stats
                    .consumed_failed
                    .fetch_add(msgs.len() as u64, Ordering::Relaxed);
                if state.is_dropped() {
                    // The queue was stopped meanwhile (as Java leaves a dropped queue's result
                    // unprocessed): nothing is sent back, the messages stay below the
                    // committed offset and its next owner consumes them again.
                    keep = std::mem::take(&mut msgs);
                } else if self.clustering() {
                    for m in &msgs {
                        if !self.send_back(&state.mq, m).await {
                            keep.push(m.clone());
                        }
                    }
                } else {
                    warn!(queue = %state.mq, n = msgs.len(), "broadcasting: failed messages are dropped");
                }
            }
        }
        let done: Vec<i64> = offsets
            .into_iter()
            .filter(|o| !keep.iter().any(|k| k.queue_offset == *o))
            .collect();
        let commit = state.pq.lock().remove(&done);
        if let Some(c) = commit {
            if !state.is_dropped() {
                self.offsets.lock().update(&state.mq, c, true);
            }
        }
        if !keep.is_empty() && !state.is_dropped() {
            // Neither send-back nor the retry topic worked: consume again here in 5 s.
            let inner = self.clone();
            let state = state.clone();
            let f = match &self.listener {
                MessageListener::Concurrently(f) => f.clone(),
                MessageListener::Orderly(_) => return,
            };
            state.begin();
            tokio::spawn(async move {
                tokio::select! {
                    _ = state.cancel.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {
                        inner.spawn_concurrent(state.clone(), f, keep);
                    }
                }
                state.end();
            });
        }
    }
}
