//! The store's public types: what a put hands in and gets back, what a read returns, and what
//! recovery and retention report.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use shoal_proto::message::property::{KEYS, UNIQ_KEY};

#[cfg(doc)]
use crate::{CorruptRecordPolicy, MessageStore, StoreConfig};

/// A message handed to the store by the broker (RocketMQ `MessageExtBrokerInner`): everything
/// but the fields the store fills in (queue offset, physical offset, store timestamp, store
/// host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageExtBrokerInner {
    /// Topic.
    pub topic: String,
    /// Queue id within the topic.
    pub queue_id: i32,
    /// User flag.
    pub flag: i32,
    /// Message sysFlag (spec section 4.2); the IPv6 host bits are derived from the addresses.
    pub sys_flag: i32,
    /// Born timestamp (ms).
    pub born_timestamp: i64,
    /// Producer address.
    pub born_host: SocketAddr,
    /// Reconsume times.
    pub reconsume_times: i32,
    /// Prepared transaction offset (0 for normal messages).
    pub prepared_transaction_offset: i64,
    /// Body as stored (already compressed if the sysFlag says so).
    pub body: Bytes,
    /// Encoded properties string (spec section 4.4).
    pub properties: String,
    /// Where the properties the store reads are in `properties`, when whoever wrote them
    /// found them already (`None`: the store finds them). Whoever replaces `properties`
    /// must reset it.
    pub known: Option<KnownProperties>,
}

/// Where the values of the properties the store reads (TAGS, WAIT, KEYS, UNIQ_KEY) are in a
/// message's properties string, as byte ranges, for a sender that went over the pairs
/// already (the broker's send handler checks every pair): the store then skips its own pass.
///
/// A range must be the value of a whole `KEY\u{1}value\u{2}` pair of its key, and a key given
/// as absent must not be in the string. A range that is not (a stale or wrong one) makes the
/// store find the properties itself; absence cannot be checked, so it must be right.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KnownProperties {
    /// TAGS's value.
    pub tags: Option<(u32, u32)>,
    /// WAIT's value.
    pub wait: Option<(u32, u32)>,
    /// KEYS's value.
    pub keys: Option<(u32, u32)>,
    /// UNIQ_KEY's value.
    pub uniq: Option<(u32, u32)>,
}

impl KnownProperties {
    /// The values in `properties` of TAGS, WAIT, KEYS and UNIQ_KEY, in that order; `None` when
    /// a range is not the value of its key's pair there.
    pub(crate) fn resolve<'a>(&self, properties: &'a str) -> Option<[Option<&'a str>; 4]> {
        use shoal_proto::message::property::{TAGS, WAIT};
        let one = |at: Option<(u32, u32)>, key: &str| -> Option<Option<&'a str>> {
            let Some((start, end)) = at else {
                return Some(None);
            };
            let (start, end) = (start as usize, end as usize);
            let value = properties.get(start..end)?;
            let bytes = properties.as_bytes();
            let pair_start = start.checked_sub(key.len() + 1)?;
            let whole = bytes.get(pair_start..start - 1) == Some(key.as_bytes())
                && bytes.get(start - 1) == Some(&1)
                && (pair_start == 0 || bytes.get(pair_start - 1) == Some(&2))
                && bytes.get(end) == Some(&2);
            whole.then_some(Some(value))
        };
        Some([
            one(self.tags, TAGS)?,
            one(self.wait, WAIT)?,
            one(self.keys, KEYS)?,
            one(self.uniq, UNIQ_KEY)?,
        ])
    }
}

/// Where and how one message was appended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendedMessage {
    /// Commit log (physical) offset of the record.
    pub physical_offset: u64,
    /// Offset in the consume queue of (topic, queue id).
    pub queue_offset: u64,
    /// Store timestamp written into the record (ms).
    pub store_timestamp: i64,
    /// Size of the stored record.
    pub size: u32,
    /// The store host written into the record (with the physical offset, the offset message
    /// id: see [`AppendedMessage::offset_msg_id`]).
    pub store_host: SocketAddr,
}

impl AppendedMessage {
    /// The offset message id (store host + physical offset, spec section 4.5).
    pub fn offset_msg_id(&self) -> String {
        shoal_proto::message::offset_msg_id(self.store_host, self.physical_offset as i64)
    }

    /// Appends the offset message id to `out` (32 or 56 uppercase hex digits).
    pub fn push_offset_msg_id(&self, out: &mut String) {
        shoal_proto::message::push_offset_msg_id(out, self.store_host, self.physical_offset as i64);
    }

    /// [`AppendedMessage::push_offset_msg_id`] into bytes (a binary header's value).
    pub fn push_offset_msg_id_bytes(&self, out: &mut Vec<u8>) {
        shoal_proto::message::push_offset_msg_id_bytes(
            out,
            self.store_host,
            self.physical_offset as i64,
        );
    }
}

/// Durability of an append, for the broker's answer (FLUSH_DISK_TIMEOUT under sync flush).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushStatus {
    /// The bytes were fsynced before the call returned (sync flush).
    Flushed,
    /// Written to the OS only; the flusher thread will fsync them (async flush).
    NotFlushed,
    /// Sync flush: the fsync did not complete within `sync_flush_timeout`.
    FlushTimeout,
    /// Sync flush: the fsync failed; the store refuses further appends until reopened.
    FlushFailed,
}

/// Result of [`MessageStore::put_message`] / [`MessageStore::put_messages`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutMessageResult {
    /// One entry per message, in the order given.
    pub messages: Vec<AppendedMessage>,
    /// Durability of the whole put.
    pub flush: FlushStatus,
}

/// Notice that a message was appended to (topic, queue id), for long polling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageArrival<'a> {
    /// Topic (borrowed from the appended message: listeners copy what they keep).
    pub topic: &'a str,
    /// Queue id.
    pub queue_id: i32,
    /// Queue offset of the message.
    pub queue_offset: u64,
    /// Tag hash code of the message.
    pub tag_code: i64,
    /// Store timestamp of the message.
    pub store_timestamp: i64,
}

/// A callback told about every appended message (called on the appending thread after the
/// writer lock is released; keep it short and non-blocking, e.g. send on a channel). In a
/// replicated store ([`crate::StoreConfig::replicated`]) a message arrives when it becomes
/// visible (confirmed and dispatched), on the thread that dispatches it, in log order.
pub type ArrivalListener = Arc<dyn Fn(&MessageArrival<'_>) + Send + Sync>;

/// Outcome of a [`MessageStore::get_messages`] (RocketMQ `GetMessageStatus`); the broker maps
/// it to a response code as spec section 5.2 says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetMessageStatus {
    /// At least one matching message (SUCCESS).
    Found,
    /// Entries were scanned but none matched the filter (PULL_RETRY_IMMEDIATELY).
    NoMatchedMessage,
    /// The queue holds nothing (max offset 0, or the queue does not exist): PULL_NOT_FOUND if
    /// the requested offset is 0, else PULL_OFFSET_MOVED; next begin offset 0.
    NoMessageInQueue,
    /// Requested offset below the min offset (PULL_OFFSET_MOVED, next = min offset).
    OffsetTooSmall,
    /// Requested offset equals the max offset: nothing new yet (PULL_NOT_FOUND, next = offset).
    OffsetOverflowOne,
    /// Requested offset beyond the max offset (PULL_OFFSET_MOVED, next = max offset).
    OffsetOverflowBadly,
}

/// Result of [`MessageStore::get_messages`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetMessageResult {
    /// Status, see [`GetMessageStatus`].
    pub status: GetMessageStatus,
    /// The stored records back to back, ready to be a pull response body.
    pub messages: Bytes,
    /// Number of records in `messages`.
    pub message_count: usize,
    /// Queue offsets of the records in `messages`.
    pub queue_offsets: Vec<u64>,
    /// Where the next pull should start.
    pub next_begin_offset: u64,
    /// The queue's min offset.
    pub min_offset: u64,
    /// The queue's max offset (next offset to be written).
    pub max_offset: u64,
    /// Corrupt records (body CRC failed) left out of `messages` under
    /// [`CorruptRecordPolicy::Skip`].
    pub corrupt_skipped: usize,
}

/// Which end of a run of equal-time messages [`MessageStore::offset_by_timestamp`] picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundaryType {
    /// The first offset whose store time is at or after the timestamp (max offset if none).
    Lower,
    /// The last offset whose store time is at or before the timestamp (min offset if none).
    Upper,
}

/// What recovery found and did when the store was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The abort marker was present: the previous run did not shut down cleanly.
    pub abnormal_shutdown: bool,
    /// Records were checked (magic, size, CRC) from the checkpoint's segment onwards; false
    /// when a clean shutdown allowed the fast path.
    pub full_check: bool,
    /// Commit log offset where the check started.
    pub checked_from: u64,
    /// Records validated by the check.
    pub records_checked: u64,
    /// End of the valid commit log (next write position).
    pub commit_log_end: u64,
    /// Bytes of torn or invalid tail removed from the commit log.
    pub truncated_bytes: u64,
    /// Why the check stopped where it did, if it stopped on bad data (not a clean end).
    pub truncation_reason: Option<String>,
    /// Zeros found after the last record, to the end of the last segment file: space reserved
    /// ahead of memory-mapped appends ([`StoreConfig::mmap_commit_log`]) by a run that did not
    /// shut down cleanly. A clean end, not data: given back, not counted in `truncated_bytes`.
    pub reserved_tail_bytes: u64,
    /// Consume-queue entries dropped because they pointed past the commit log end.
    pub consume_queue_entries_dropped: u64,
    /// Consume-queue entries re-created from the commit log.
    pub consume_queue_entries_rebuilt: u64,
    /// Index entries dropped because they pointed past the commit log end.
    pub index_entries_dropped: u64,
    /// Commit log offsets of records whose framing is intact but whose body CRC failed; they
    /// keep their place (and queue offset) and are skipped or refused on read.
    pub corrupt_records: Vec<u64>,
    /// Consume queues (`topic/queueId`) found damaged or missing and rebuilt from the whole
    /// commit log, with the reason.
    pub consume_queues_rebuilt: Vec<String>,
    /// Time recovery took.
    pub duration: Duration,
}

/// What a retention run deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Start offsets of the deleted commit log segments.
    pub deleted_segments: Vec<u64>,
    /// Index files deleted.
    pub deleted_index_files: usize,
    /// New min commit log offset.
    pub min_commit_log_offset: u64,
}

#[cfg(test)]
mod known_properties_tests {
    use super::*;
    use proptest::prelude::*;
    use shoal_proto::message::property::{find_properties, TAGS, WAIT};

    /// The ranges a sender that went over the pairs would give.
    fn known_of(properties: &str) -> KnownProperties {
        let mut known = KnownProperties::default();
        let mut pos = 0;
        for pair in properties.split_terminator('\u{2}') {
            let (key, value) = pair.split_once('\u{1}').unwrap_or((pair, ""));
            let start = (pos + key.len() + 1) as u32;
            let at = Some((start, start + value.len() as u32));
            match key {
                k if k == TAGS => known.tags = at,
                k if k == WAIT => known.wait = at,
                k if k == KEYS => known.keys = at,
                k if k == UNIQ_KEY => known.uniq = at,
                _ => {}
            }
            pos += pair.len() + 1;
        }
        known
    }

    proptest! {
        /// Ranges of a pass over the pairs resolve to what the store's own search finds.
        #[test]
        fn known_ranges_give_what_the_search_finds(
            pairs in proptest::collection::btree_map(
                prop_oneof![
                    Just("TAGS".to_owned()), Just("WAIT".to_owned()), Just("KEYS".to_owned()),
                    Just("UNIQ_KEY".to_owned()), Just("XTAGS".to_owned()), Just("AGS".to_owned()),
                    "[A-Z_]{1,8}",
                ],
                "[ -~]{1,12}",
                0..8,
            ),
        ) {
            let properties: String =
                pairs.iter().map(|(k, v)| format!("{k}\u{1}{v}\u{2}")).collect();
            let known = known_of(&properties);
            prop_assert_eq!(
                known.resolve(&properties),
                Some(find_properties(&properties, [TAGS, WAIT, KEYS, UNIQ_KEY]))
            );
        }
    }

    #[test]
    fn ranges_that_are_not_their_keys_values_are_refused() {
        let p = "TAGS\u{1}a\u{2}KEYS\u{1}k1 k2\u{2}XUNIQ_KEY\u{1}U\u{2}";
        let good = known_of("TAGS\u{1}a\u{2}KEYS\u{1}k1 k2\u{2}");
        assert_eq!(
            good.resolve(p),
            Some([Some("a"), None, Some("k1 k2"), None])
        );
        // The value of another key, part of a value, past the end, a key's tail.
        for bad in [
            KnownProperties {
                tags: Some((12, 17)),
                ..good
            },
            KnownProperties {
                keys: Some((12, 14)),
                ..good
            },
            KnownProperties {
                keys: Some((12, 99)),
                ..good
            },
            KnownProperties {
                uniq: Some((28, 29)),
                ..good
            },
        ] {
            assert_eq!(bad.resolve(p), None, "{bad:?}");
        }
    }
}
