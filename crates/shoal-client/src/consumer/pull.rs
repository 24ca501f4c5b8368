//! The pull loop of one owned queue (RocketMQ's `PullRequest`) with flow control, and the
//! hand-off of pulled messages to the consume side.

use super::{Inner, MessageListener, QueueState};
use crate::instance::{PullArgs, PullStatus, PULL_RPC_TIMEOUT};
use crate::process_queue::Cached;
use shoal_proto::code::request_code as rc;
use shoal_proto::constants::pull_sys_flag;
use shoal_proto::message::MessageExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, warn};

impl Inner {
    pub(super) fn spawn_pull_loop(self: &Arc<Self>, state: Arc<QueueState>, start: i64) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut next = start;
            loop {
                if state.cancel.is_cancelled() {
                    return;
                }
                let Some(inner) = weak.upgrade() else { return };
                match inner.pull_once(&state, next).await {
                    Some(n) => next = n,
                    None => {
                        // A failed pull waits, unless a route changes meanwhile (its broker
                        // died and a new master registered: pull from it at once).
                        tokio::select! {
                            _ = state.cancel.cancelled() => return,
                            _ = tokio::time::sleep(inner.config.pull_delay_on_error) => {}
                            () = inner.routes_changed.notified() => {}
                        }
                    }
                }
            }
        });
    }

    /// One pull step; returns the next offset, or `None` to back off.
    async fn pull_once(self: &Arc<Self>, state: &Arc<QueueState>, offset: i64) -> Option<i64> {
        // Flow control.
        loop {
            let (count, bytes, span, dropped) = {
                let pq = state.pq.lock();
                (
                    pq.cached_count(),
                    pq.cached_bytes(),
                    pq.max_span(),
                    pq.dropped,
                )
            };
            if dropped {
                return Some(offset);
            }
            let over = count >= self.config.pull_threshold_for_queue
                || bytes >= self.config.pull_threshold_size_for_queue
                || (!self.listener.is_orderly()
                    && span > self.config.consume_concurrently_max_span);
            if !over {
                break;
            }
            tokio::select! {
                _ = state.cancel.cancelled() => return Some(offset),
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
        let sub = self.subs.get(&state.mq.topic)?;
        // No offset rides on pulls: a pull answered after the queue was handed over must not
        // carry an old position; offsets are committed by the persister and at hand-over.
        let commit = 0;
        let sys_flag = pull_sys_flag::build(false, true, true, false);
        state.pq.lock().last_pull_ms = crate::now_ms_u64();
        self.stats.pulls.fetch_add(1, Ordering::Relaxed);
        let args = PullArgs {
            code: rc::PULL_MESSAGE,
            group: &self.config.group,
            mq: &state.mq,
            offset,
            max_msgs: self.config.pull_batch_size,
            sys_flag,
            commit_offset: commit,
            suspend_ms: self.config.pull_suspend_ms,
            subscription: Some(&sub.sub_string),
            sub_version: sub.sub_version,
            expression_type: sub.expression_type.name(),
            timeout: PULL_RPC_TIMEOUT,
        };
        // Biased: a queue released in the meantime must not send one more pull (its
        // commitOffset could land after the final commit).
        let result = tokio::select! {
            biased;
            _ = state.cancel.cancelled() => return Some(offset),
            r = self.instance.pull(args) => r,
        };
        let result = match result {
            Ok(r) => r,
            Err(e) => {
                debug!(queue = %state.mq, error = %e, "pull failed");
                if e.server_code() == Some(shoal_proto::code::response_code::FLOW_CONTROL) {
                    // The broker is busy: RocketMQ re-pulls after 20 ms, not the error delay.
                    tokio::select! {
                        _ = state.cancel.cancelled() => {}
                        _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                    }
                    return Some(offset);
                }
                return None;
            }
        };
        if state.is_dropped() {
            return Some(offset);
        }
        match result.status {
            PullStatus::Found => {
                let matched: Vec<MessageExt> = result
                    .messages
                    .into_iter()
                    .filter(|m| sub.matches_tags(m.tags()))
                    .collect();
                if matched.is_empty() {
                    self.advance_if_idle(state, result.next_begin_offset);
                } else {
                    self.dispatch(state, matched);
                }
            }
            PullStatus::NoNewMsg | PullStatus::NoMatchedMsg => {
                self.advance_if_idle(state, result.next_begin_offset);
            }
            PullStatus::OffsetIllegal => {
                warn!(queue = %state.mq, offset, next = result.next_begin_offset, "offset illegal; moving");
                self.offsets
                    .lock()
                    .update(&state.mq, result.next_begin_offset, false);
                if self.clustering() && state.may_deliver() {
                    let _ = self
                        .instance
                        .update_consumer_offset(
                            &self.config.group,
                            &state.mq,
                            result.next_begin_offset,
                        )
                        .await;
                }
            }
        }
        Some(result.next_begin_offset)
    }

    /// Nothing cached: the committed offset may follow the pull offset (filtered messages).
    fn advance_if_idle(&self, state: &QueueState, next: i64) {
        let idle = state.pq.lock().is_idle();
        if idle && !state.is_dropped() {
            self.offsets.lock().update(&state.mq, next, true);
        }
    }

    fn dispatch(self: &Arc<Self>, state: &Arc<QueueState>, msgs: Vec<MessageExt>) {
        let orderly = matches!(self.listener, MessageListener::Orderly(_));
        // Only messages the process queue does not hold yet (a pull repeated after a
        // hand-over may return some again) are cached and consumed.
        let (added, fresh) = {
            let mut pq = state.pq.lock();
            let fresh: Vec<MessageExt> = msgs
                .into_iter()
                .filter(|m| !pq.contains(m.queue_offset))
                .collect();
            if orderly {
                // Orderly consumption takes the messages from the process queue.
                let added = pq.put(fresh.into_iter().map(|m| Cached {
                    offset: m.queue_offset,
                    size: m.body.len(),
                    message: Some(Box::new(m)),
                }));
                (added, Vec::new())
            } else {
                let added = pq.put(fresh.iter().map(|m| Cached {
                    offset: m.queue_offset,
                    size: m.body.len(),
                    message: None,
                }));
                (added, fresh)
            }
        };
        if added == 0 {
            return;
        }
        match &self.listener {
            MessageListener::Orderly(_) => state.wake.notify_one(),
            MessageListener::Concurrently(f) => {
                let batch = self.config.consume_batch_size.max(1);
                let mut rest = fresh.into_iter();
                loop {
                    let chunk: Vec<MessageExt> = rest.by_ref().take(batch).collect();
                    if chunk.is_empty() {
                        break;
                    }
                    self.spawn_concurrent(state.clone(), f.clone(), chunk);
                }
            }
        }
    }
}
