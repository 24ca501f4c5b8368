//! Helpers shared by the integration tests.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    unreachable_pub,
    reason = "test code: a failed unwrap is a failed test"
)]
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use shoal_proto::message::iter_records;
use shoal_store::backend::MemBackend;
use shoal_store::{FlushMode, GetMessageStatus, MessageExtBrokerInner, MessageStore, StoreConfig};

/// A small-file configuration on an in-memory backend, no background threads.
pub fn mem_config(be: &MemBackend, mode: FlushMode) -> StoreConfig {
    let mut c = StoreConfig::new(PathBuf::from("/data"));
    c.backend = Arc::new(be.clone());
    c.commit_log_segment_size = 4096;
    c.consume_queue_file_entries = 16;
    c.index_file_entries = 32;
    c.max_message_size = 2048;
    c.flush_mode = mode;
    c.background_threads = false;
    c
}

/// A message whose body is `id` padded to `size` bytes, with a tag, keys and a unique key.
pub fn msg(topic: &str, queue_id: i32, id: &str, size: usize, tag: &str) -> MessageExtBrokerInner {
    let mut body = id.as_bytes().to_vec();
    body.push(b'|');
    while body.len() < size {
        body.push(b'x');
    }
    let born: SocketAddr = "192.168.0.2:53000"
        .parse()
        .unwrap_or_else(|_| unreachable!());
    let mut properties = String::new();
    if !tag.is_empty() {
        properties.push_str(&format!("TAGS\u{1}{tag}\u{2}"));
    }
    properties.push_str(&format!(
        "KEYS\u{1}k-{id} shared\u{2}UNIQ_KEY\u{1}U{id}\u{2}WAIT\u{1}true\u{2}"
    ));
    MessageExtBrokerInner {
        topic: topic.to_string(),
        queue_id,
        flag: 0,
        sys_flag: 0,
        born_timestamp: 1_700_000_000_000,
        born_host: born,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
        body: Bytes::from(body),
        properties,
        known: None,
    }
}

/// The id a test message was created with.
pub fn id_of(body: &[u8]) -> String {
    let end = body.iter().position(|b| *b == b'|').unwrap_or(body.len());
    String::from_utf8_lossy(&body[..end]).into_owned()
}

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rec {
    pub topic: String,
    pub queue_id: i32,
    pub queue_offset: i64,
    pub physical_offset: i64,
    pub id: String,
    pub body: Vec<u8>,
    pub tags: Option<String>,
}

/// Decodes a pull body, asserting every record is valid.
pub fn decode(buf: &[u8]) -> Vec<Rec> {
    iter_records(buf)
        .map(|r| {
            let v = r.expect("valid record in pull body");
            v.verify_crc().expect("crc");
            Rec {
                topic: v.topic().to_string(),
                queue_id: v.queue_id(),
                queue_offset: v.queue_offset(),
                physical_offset: v.physical_offset(),
                id: id_of(v.body()),
                body: v.body().to_vec(),
                tags: v.tags().map(String::from),
            }
        })
        .collect()
}

/// Reads every message of every queue through `get_messages`; asserts queue offsets are
/// consecutive from the min offset and match the records.
pub fn read_all(store: &MessageStore) -> BTreeMap<(String, i32), Vec<Rec>> {
    let mut out = BTreeMap::new();
    for topic in store.topics() {
        for q in store.queue_ids(&topic) {
            let mut recs = Vec::new();
            let min = store.min_offset(&topic, q);
            let max = store.max_offset(&topic, q);
            let mut off = min;
            while off < max {
                let r = store
                    .get_messages(&topic, q, off, 7, 1 << 20, &|_| true)
                    .expect("get");
                assert_eq!(r.status, GetMessageStatus::Found, "{topic}/{q}@{off}");
                let got = decode(&r.messages);
                assert_eq!(got.len(), r.message_count);
                for (i, rec) in got.iter().enumerate() {
                    assert_eq!(rec.topic, topic);
                    assert_eq!(rec.queue_id, q);
                    assert_eq!(rec.queue_offset as u64, off + i as u64);
                    assert_eq!(r.queue_offsets[i], off + i as u64);
                }
                off = r.next_begin_offset;
                recs.extend(got);
            }
            let end = store
                .get_messages(&topic, q, max, 7, 1 << 20, &|_| true)
                .expect("get");
            if max > 0 {
                assert_eq!(end.status, GetMessageStatus::OffsetOverflowOne);
            }
            out.insert((topic.clone(), q), recs);
        }
    }
    out
}

/// Walks the commit log record by record (via `message_by_physical_offset`) and returns the
/// number of records; asserts it agrees with the consume queues.
pub fn walk_commit_log(store: &MessageStore) -> Vec<Rec> {
    let seg = store.config().commit_log_segment_size;
    let mut pos = store.commit_log_min_offset();
    let end = store.commit_log_max_offset();
    let mut out = Vec::new();
    while pos < end {
        match store.message_by_physical_offset(pos).expect("read") {
            Some(rec) => {
                let mut d = decode(&rec);
                assert_eq!(d.len(), 1);
                let r = d.remove(0);
                assert_eq!(r.physical_offset as u64, pos);
                pos += rec.len() as u64;
                out.push(r);
            }
            None => {
                // blank marker: next segment
                let next = pos - pos % seg + seg;
                assert!(
                    next - pos >= 8,
                    "no record and no room for a marker at {pos}"
                );
                pos = next;
            }
        }
    }
    assert_eq!(pos, end);
    out
}
