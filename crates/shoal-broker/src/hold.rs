//! Long polling: pulls that found nothing wait here until a matching message is stored or
//! their suspend time runs out (RocketMQ's `PullRequestHoldService`, but woken at the moment
//! of store rather than by a periodic scan).

use foldhash::HashMap;
use parking_lot::Mutex;
use shoal_proto::body::SubscriptionData;
use shoal_store::MessageArrival;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::oneshot;

struct Held {
    id: u64,
    /// The pull's requested offset: a message at or after it wakes the pull.
    offset: u64,
    filter: Option<SubscriptionData>,
    wake: oneshot::Sender<()>,
}

/// Held pulls by topic, then queue id (looked up by `&str`: a stored message wakes holds
/// without a copy of its topic).
#[derive(Default)]
pub(crate) struct PullHoldTable {
    held: Mutex<HashMap<String, HashMap<i32, Vec<Held>>>>,
    next_id: AtomicU64,
}

/// Removes `topic`'s entry for `queue_id` when it holds nothing, and the topic's when it has
/// no queue left.
fn prune(map: &mut HashMap<String, HashMap<i32, Vec<Held>>>, topic: &str, queue_id: i32) {
    if let Some(queues) = map.get_mut(topic) {
        if queues.get(&queue_id).is_some_and(Vec::is_empty) {
            queues.remove(&queue_id);
        }
        if queues.is_empty() {
            map.remove(topic);
        }
    }
}

impl std::fmt::Debug for PullHoldTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullHoldTable")
            .field("held", &self.len())
            .finish()
    }
}

/// A registered hold: await [`HoldTicket::wait`], then re-run the pull.
#[derive(Debug)]
pub(crate) struct HoldTicket {
    id: u64,
    key: (String, i32),
    rx: oneshot::Receiver<()>,
}

/// A registered wait on several queues: await [`PullHoldTable::wait_any`].
#[derive(Debug)]
pub(crate) struct MultiHoldTicket {
    tickets: Vec<HoldTicket>,
}

impl PullHoldTable {
    /// Holds a pull of (topic, queue) at `offset`, woken by a message that passes `filter`.
    pub(crate) fn hold(
        &self,
        topic: &str,
        queue_id: i32,
        offset: u64,
        filter: Option<SubscriptionData>,
    ) -> HoldTicket {
        let (tx, rx) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.held
            .lock()
            .entry(topic.to_string())
            .or_default()
            .entry(queue_id)
            .or_default()
            .push(Held {
                id,
                offset,
                filter,
                wake: tx,
            });
        HoldTicket {
            id,
            key: (topic.to_string(), queue_id),
            rx,
        }
    }

    /// A message was stored: wake the holds it satisfies.
    pub(crate) fn notify(&self, arrival: &MessageArrival<'_>) {
        let mut map = self.held.lock();
        let Some(list) = map
            .get_mut(arrival.topic)
            .and_then(|queues| queues.get_mut(&arrival.queue_id))
        else {
            return;
        };
        let mut i = 0;
        while i < list.len() {
            let h = &list[i];
            let matches = arrival.queue_offset >= h.offset
                && h.filter
                    .as_ref()
                    .is_none_or(|f| f.matches_tags_code(arrival.tag_code));
            if matches {
                let h = list.swap_remove(i);
                let _ = h.wake.send(());
            } else {
                i += 1;
            }
        }
        if list.is_empty() {
            prune(&mut map, arrival.topic, arrival.queue_id);
        }
    }

    /// Wakes every hold of a queue whose offset is now below `max_offset` (closes the race
    /// between "nothing found" and registering the hold).
    pub(crate) fn recheck(&self, topic: &str, queue_id: i32, max_offset: u64) {
        let mut map = self.held.lock();
        if let Some(list) = map.get_mut(topic).and_then(|q| q.get_mut(&queue_id)) {
            let (wake, keep): (Vec<Held>, Vec<Held>) = std::mem::take(list)
                .into_iter()
                .partition(|h| h.offset < max_offset);
            *list = keep;
            for h in wake {
                let _ = h.wake.send(());
            }
            prune(&mut map, topic, queue_id);
        }
    }

    fn cancel(&self, ticket_id: u64, key: &(String, i32)) {
        let mut map = self.held.lock();
        let (topic, queue_id) = (key.0.as_str(), key.1);
        if let Some(list) = map.get_mut(topic).and_then(|q| q.get_mut(&queue_id)) {
            list.retain(|h| h.id != ticket_id);
            prune(&mut map, topic, queue_id);
        }
    }

    /// Holds a wait on several queues at once (a Kafka fetch spans partitions): woken by the
    /// first message stored at or after any of the positions (topic, queue id, offset).
    pub(crate) fn hold_any(&self, positions: &[(String, i32, u64)]) -> MultiHoldTicket {
        let tickets = positions
            .iter()
            .map(|(topic, queue_id, offset)| self.hold(topic, *queue_id, *offset, None))
            .collect();
        MultiHoldTicket { tickets }
    }

    /// Waits until any hold of the ticket is woken or `timeout` passes; every hold of the
    /// ticket is removed either way (also when the returned future is dropped early).
    /// Returns true when woken by a message.
    pub(crate) async fn wait_any(
        &self,
        ticket: MultiHoldTicket,
        timeout: std::time::Duration,
    ) -> bool {
        struct Cancel<'a> {
            table: &'a PullHoldTable,
            holds: Vec<(u64, (String, i32))>,
        }
        impl Drop for Cancel<'_> {
            fn drop(&mut self) {
                for (id, key) in &self.holds {
                    self.table.cancel(*id, key);
                }
            }
        }
        let mut receivers = Vec::with_capacity(ticket.tickets.len());
        let mut cancel = Cancel {
            table: self,
            holds: Vec::with_capacity(ticket.tickets.len()),
        };
        for t in ticket.tickets {
            cancel.holds.push((t.id, t.key));
            receivers.push(t.rx);
        }
        if receivers.is_empty() {
            tokio::time::sleep(timeout).await;
            return false;
        }
        matches!(
            tokio::time::timeout(timeout, futures::future::select_all(receivers)).await,
            Ok((Ok(()), _, _))
        )
    }

    /// Number of held pulls.
    pub(crate) fn len(&self) -> usize {
        self.held
            .lock()
            .values()
            .flat_map(|queues| queues.values())
            .map(Vec::len)
            .sum()
    }

    /// True when nothing is held.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until the ticket is woken or `timeout` passes; the hold is removed either way.
    /// Returns true when woken by a message.
    pub(crate) async fn wait(&self, ticket: HoldTicket, timeout: std::time::Duration) -> bool {
        let HoldTicket { id, key, rx } = ticket;
        let woken = matches!(tokio::time::timeout(timeout, rx).await, Ok(Ok(())));
        if !woken {
            self.cancel(id, &key);
        }
        woken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn arrival(offset: u64, tag_code: i64) -> MessageArrival<'static> {
        MessageArrival {
            topic: "T",
            queue_id: 0,
            queue_offset: offset,
            tag_code,
            store_timestamp: 0,
        }
    }

    #[tokio::test]
    async fn wakes_on_matching_arrival_only() {
        let t = PullHoldTable::default();
        let filter = SubscriptionData::from_tag_expression("T", "tagA", 0);
        let ticket = t.hold("T", 0, 5, Some(filter));
        t.notify(&arrival(4, shoal_proto::hash::tags_code(Some("tagA"))));
        t.notify(&arrival(5, shoal_proto::hash::tags_code(Some("tagB"))));
        assert_eq!(t.len(), 1);
        t.notify(&arrival(6, shoal_proto::hash::tags_code(Some("tagA"))));
        assert!(t.is_empty());
        assert!(t.wait(ticket, Duration::from_secs(1)).await);
    }

    #[tokio::test]
    async fn times_out_and_cleans_up() {
        let t = PullHoldTable::default();
        let ticket = t.hold("T", 0, 0, None);
        assert!(!t.wait(ticket, Duration::from_millis(20)).await);
        assert!(t.is_empty());
    }

    #[tokio::test]
    async fn a_multi_queue_hold_wakes_on_any_queue_and_cleans_up() {
        let t = std::sync::Arc::new(PullHoldTable::default());
        let ticket = t.hold_any(&[("T".into(), 0, 5), ("T".into(), 1, 2)]);
        assert_eq!(t.len(), 2);
        let t2 = t.clone();
        let waiter = tokio::spawn(async move { t2.wait_any(ticket, Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        t.notify(&MessageArrival {
            queue_id: 1,
            ..arrival(2, 0)
        });
        assert!(waiter.await.unwrap());
        assert!(t.is_empty(), "the other queue's hold is released too");
        let ticket = t.hold_any(&[("T".into(), 0, 5)]);
        assert!(!t.wait_any(ticket, Duration::from_millis(20)).await);
        assert!(t.is_empty());
    }

    #[tokio::test]
    async fn queues_and_topics_without_holds_are_removed() {
        let t = PullHoldTable::default();
        let a = t.hold("T", 0, 1, None);
        let b = t.hold("T", 1, 1, None);
        let c = t.hold("U", 0, 1, None);
        t.notify(&arrival(1, 0));
        assert!(t.wait(a, Duration::from_secs(1)).await);
        assert_eq!(t.held.lock().get("T").map(|q| q.len()), Some(1));
        assert!(!t.wait(b, Duration::from_millis(1)).await);
        assert!(!t.held.lock().contains_key("T"));
        t.recheck("U", 0, 2);
        assert!(t.wait(c, Duration::from_secs(1)).await);
        assert!(t.held.lock().is_empty());
    }

    #[tokio::test]
    async fn recheck_wakes_holds_behind_max() {
        let t = PullHoldTable::default();
        let a = t.hold("T", 0, 3, None);
        let _b = t.hold("T", 0, 9, None);
        t.recheck("T", 0, 4);
        assert_eq!(t.len(), 1);
        assert!(t.wait(a, Duration::from_secs(1)).await);
    }
}
