//! Idempotent producers' batches in the log: the first record of every batch an idempotent
//! producer writes carries [`PROP_PRODUCER`] (`producer id:epoch:first sequence:last
//! sequence`, hidden from fetches). A leader that meets a producer it has no state for on a
//! partition (a new master after a failover, this broker after a restart, a producer whose
//! state was evicted) reads the partition's last [`SCAN_MESSAGES`] messages for that
//! producer's batches before it checks the first one: a batch the previous leader wrote (and
//! replicated) is then answered as a duplicate with its offset when the producer sends it
//! again, instead of being stored twice.
//!
//! A new master reads only once its log's tail from the previous master is visible (confirmed
//! by its in-sync set); until then such a batch is answered NOT_LEADER_OR_FOLLOWER and the
//! producer sends it again.

use crate::convert::PROP_PRODUCER;
use crate::producer::{LoggedBatch, ProducerEntry};
use crate::state::State;
use kafka_protocol::ResponseError;
use parking_lot::Mutex;
use shoal_proto::message::property;
use shoal_proto::message::{decode_records, DecodeOptions};
use shoal_store::MessageExtBrokerInner;

/// Messages of a partition read back at most for one producer's batches (its last five
/// batches are what duplicate detection needs; a batch in flight at a failover is at the end).
pub(crate) const SCAN_MESSAGES: u64 = 2048;

/// Bytes read per store call.
const READ_BYTES: usize = 4 << 20;

/// Marks `msgs` (one batch) as the producer's.
pub(crate) fn mark(msgs: &mut [MessageExtBrokerInner], id: i64, epoch: i16, first: i32, last: i32) {
    if let Some(m) = msgs.first_mut() {
        m.properties.push_str(&format!(
            "{PROP_PRODUCER}{}{id}:{epoch}:{first}:{last}{}",
            property::NAME_VALUE_SEPARATOR,
            property::PROPERTY_SEPARATOR
        ));
    }
}

fn parse(value: &str) -> Option<(i64, LoggedBatch)> {
    let mut it = value.split(':');
    let id = it.next()?.parse().ok()?;
    let epoch = it.next()?.parse().ok()?;
    let first = it.next()?.parse().ok()?;
    let last = it.next()?.parse().ok()?;
    it.next().is_none().then_some((id, (epoch, first, last, 0)))
}

/// Before the first batch of producer `id` on a partition the entry has no state for: reads
/// the partition's tail (queue `queue` of `topic`) for the producer's batches and gives them
/// to the entry.
pub(crate) async fn rebuild(
    state: &State,
    entry: &Mutex<ProducerEntry>,
    topic: &str,
    partition: i32,
    queue: i32,
    id: i64,
) -> Result<(), (ResponseError, String)> {
    if !previous_leaders_visible(state) {
        return Err((
            ResponseError::NotLeaderOrFollower,
            "this broker became leader and is still confirming the previous leader's records"
                .into(),
        ));
    }
    let store = state.store.clone();
    let t = topic.to_string();
    let found = tokio::task::spawn_blocking(move || scan(&store, &t, queue, id))
        .await
        .map_err(|e| (ResponseError::KafkaStorageError, e.to_string()))?
        .map_err(|e| (ResponseError::KafkaStorageError, e.to_string()))?;
    entry.lock().rebuilt(topic, partition, &found);
    Ok(())
}

/// Whether every record the previous masters of a replicated group wrote is visible here
/// (always, without replication).
fn previous_leaders_visible(state: &State) -> bool {
    let epochs = state.host.leader_epochs();
    if epochs.current == 0 {
        return true;
    }
    let store = &state.store;
    let own_start = match epochs.entries.last() {
        Some((e, start)) if *e == epochs.current => *start,
        _ => store.commit_log_max_offset(),
    };
    store.dispatched_offset() >= own_start
}

/// The producer's batches among the queue's last [`SCAN_MESSAGES`] messages, oldest first.
fn scan(
    store: &shoal_store::MessageStore,
    topic: &str,
    queue: i32,
    id: i64,
) -> Result<Vec<LoggedBatch>, shoal_store::StoreError> {
    let end = store.max_offset(topic, queue);
    let mut at = end
        .saturating_sub(SCAN_MESSAGES)
        .max(store.min_offset(topic, queue));
    let mut found = Vec::new();
    while at < end {
        let got = store.get_messages(topic, queue, at, 256, READ_BYTES, &|_| true)?;
        if got.message_count == 0 {
            if got.next_begin_offset > at {
                at = got.next_begin_offset;
                continue;
            }
            break;
        }
        let run = decode_records(&got.messages, &DecodeOptions::default());
        for msg in &run.messages {
            let Some(value) = msg.properties.get(PROP_PRODUCER) else {
                continue;
            };
            if let Some((pid, (epoch, first, last, _))) = parse(value) {
                if pid == id {
                    found.push((epoch, first, last, msg.queue_offset));
                }
            }
        }
        at = got.next_begin_offset.max(at + 1);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_is_read_back() {
        assert_eq!(parse("42:3:10:14"), Some((42, (3, 10, 14, 0))));
        for bad in ["42:3:10", "42:3:10:14:1", "x:3:10:14", ""] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
