//! Orderly consumption: one batch at a time per queue, in offset order, only while the queue's
//! lease (its broker lock) is valid.

use super::{
    ConsumeContext, ConsumeOrderlyStatus, Held, Inner, MessageListener, OrderlyFn, QueueState,
};
use crate::process_queue::ProcessQueue;
use shoal_proto::message::MessageExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Inner {
    pub(super) fn spawn_orderly_loop(self: &Arc<Self>, state: Arc<QueueState>) {
        let MessageListener::Orderly(f) = &self.listener else {
            return;
        };
        let f = f.clone();
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = state.cancel.cancelled() => return,
                    _ = state.wake.notified() => {}
                }
                let Some(inner) = weak.upgrade() else { return };
                inner.consume_orderly(&state, &f).await;
            }
        });
    }

    fn may_consume_orderly(&self, state: &QueueState, pq: &ProcessQueue<Held>) -> bool {
        !pq.dropped && state.lease_valid()
    }

    async fn consume_orderly(self: &Arc<Self>, state: &Arc<QueueState>, f: &Arc<OrderlyFn>) {
        loop {
            let batch: Vec<MessageExt> = {
                let mut pq = state.pq.lock();
                if !self.may_consume_orderly(state, &pq) {
                    return;
                }
                let taken: Vec<MessageExt> = pq
                    .take(self.config.consume_batch_size)
                    .into_iter()
                    .filter_map(|c| c.message.as_deref().cloned())
                    .collect();
                if taken.is_empty() {
                    return;
                }
                pq.consuming_now = true;
                taken
            };
            state.begin();
            let suspends: Vec<i32> = {
                let s = state.suspends.lock();
                batch
                    .iter()
                    .map(|m| s.get(&m.queue_offset).copied().unwrap_or(0))
                    .collect()
            };
            let for_listener: Vec<MessageExt> = batch
                .iter()
                .cloned()
                .zip(&suspends)
                .map(|(mut m, n)| {
                    m.reconsume_times += n;
                    self.for_listener(m)
                })
                .collect();
            let ctx = ConsumeContext {
                message_queue: state.mq.clone(),
                stopped: state.cancel.clone(),
            };
            let f2 = f.clone();
            let st = state.clone();
            let status = tokio::task::spawn_blocking(move || {
                st.may_deliver().then(|| f2(&for_listener, &ctx))
            })
            .await
            .unwrap_or(Some(ConsumeOrderlyStatus::SuspendCurrentQueueAMoment));
            let Some(status) = status else {
                // Past the lease: nothing delivered; the fence drops the queue.
                state.pq.lock().return_taken();
                state.pq.lock().consuming_now = false;
                state.end();
                return;
            };
            let mut suspend = false;
            match status {
                ConsumeOrderlyStatus::Success => {
                    self.stats
                        .consumed_ok
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    self.commit_orderly(state, &batch);
                }
                ConsumeOrderlyStatus::SuspendCurrentQueueAMoment => {
                    self.stats
                        .consumed_failed
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    let exceeded = self.config.max_reconsume_times.is_some_and(|max| {
                        batch
                            .iter()
                            .zip(&suspends)
                            .all(|(m, n)| m.reconsume_times + n + 1 > max)
                    });
                    if exceeded && self.clustering() {
                        // Past max reconsume times: to the retry topic (the broker diverts to
                        // the DLQ), then move on.
                        let max = self.max_reconsume();
                        let mut all_sent = true;
                        for (m, n) in batch.iter().zip(&suspends) {
                            let mut m = m.clone();
                            m.reconsume_times += n;
                            all_sent &= self.send_to_retry_topic(&m, max, 0).await;
                        }
                        if all_sent {
                            self.commit_orderly(state, &batch);
                        } else {
                            state.pq.lock().return_taken();
                            suspend = true;
                        }
                    } else {
                        {
                            let mut s = state.suspends.lock();
                            for m in &batch {
                                *s.entry(m.queue_offset).or_insert(0) += 1;
                            }
                        }
                        state.pq.lock().return_taken();
                        suspend = true;
                    }
                }
            }
            state.pq.lock().consuming_now = false;
            state.end();
            if suspend {
                tokio::select! {
                    _ = state.cancel.cancelled() => return,
                    _ = tokio::time::sleep(self.config.suspend_current_queue_time) => {}
                }
            }
        }
    }

    fn commit_orderly(&self, state: &QueueState, batch: &[MessageExt]) {
        let commit = state.pq.lock().commit_taken();
        {
            let mut s = state.suspends.lock();
            for m in batch {
                s.remove(&m.queue_offset);
            }
        }
        if let Some(c) = commit {
            if !state.is_dropped() {
                self.offsets.lock().update(&state.mq, c, true);
            }
        }
    }
}
