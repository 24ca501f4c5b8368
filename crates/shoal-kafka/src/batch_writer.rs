//! Fetch answers written straight from stored records: one magic-2 record batch (uncompressed,
//! CRC-32C, the layout kafka-protocol's encoder writes) whose records are read from each stored
//! record's fields and properties as slices, without decoding the record into a message.
//!
//! What a record shows is [`message_to_record`]'s mapping. A stored record whose slices cannot
//! show it exactly (a compressed body, a Kafka header list, a property name written twice,
//! more than [`FAST_MAX_PROPERTIES`] properties) is decoded into a message and converted by
//! [`message_to_record`] itself; both kinds are written by the same record writer.

use crate::convert::{
    message_to_record, BuiltBatch, ShownRecord, EMPTY_KEY, HIDDEN, PROP_HEADERS, PROP_HEADER_LIST,
    PROP_KEY_B64, PROP_NULL_VALUE, PROP_ORIGIN,
};
use crate::epochs::LeaderEpochs;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use shoal_proto::message::property::{self, iter_properties};
use shoal_proto::message::record::{iter_records, DecodeOptions, RecordView};
use shoal_proto::message::sys_flag::COMPRESSED_FLAG;
use std::borrow::Cow;

/// Most properties of a record shown from its slices (the duplicate check compares every pair).
const FAST_MAX_PROPERTIES: usize = 16;

/// Bytes of a magic-2 batch header before its first record.
const BATCH_HEADER: usize = 61;

/// One record as the batch shows it, borrowed from the stored record where it can be.
struct Shown<'a> {
    offset: i64,
    timestamp: i64,
    key: Option<Cow<'a, [u8]>>,
    value: Option<&'a [u8]>,
    headers: Headers<'a>,
}

enum Headers<'a> {
    /// The user properties of the stored record (see [`is_header`]).
    Properties { props: &'a str, from_kafka: bool },
    /// The headers [`message_to_record`] built.
    Built(&'a ShownRecord),
}

/// Whether a property is shown as a header: not bookkeeping ([`HIDDEN`]), and not `KEYS` of a
/// message produced over Kafka (its key).
fn is_header(name: &str, from_kafka: bool) -> bool {
    !(HIDDEN.contains(&name) || (from_kafka && name == property::KEYS))
}

impl Shown<'_> {
    /// Calls `f` with every header, in order.
    fn for_each_header(&self, mut f: impl FnMut(&[u8], Option<&[u8]>)) {
        match self.headers {
            Headers::Properties { props, from_kafka } => {
                for (name, value) in iter_properties(props) {
                    if is_header(name, from_kafka) {
                        f(name.as_bytes(), Some(value.as_bytes()));
                    }
                }
            }
            Headers::Built(r) => {
                for (name, value) in &r.headers {
                    f(name.as_bytes(), value.as_deref());
                }
            }
        }
    }
}

/// The record shown for `view` from its slices, or `None` when it needs
/// [`message_to_record`] (see the module documentation).
fn from_slices<'a>(view: &RecordView<'a>) -> Option<Shown<'a>> {
    if view.sys_flag() & COMPRESSED_FLAG != 0 {
        return None;
    }
    let props = view.properties_str();
    let mut names: [&str; FAST_MAX_PROPERTIES] = [""; FAST_MAX_PROPERTIES];
    let (mut from_kafka, mut null_value) = (false, false);
    let (mut keys, mut key_b64) = (None, None);
    for (n, (name, value)) in iter_properties(props).enumerate() {
        if n == FAST_MAX_PROPERTIES
            || names[..n].contains(&name)
            || name == PROP_HEADERS
            || name == PROP_HEADER_LIST
        {
            return None;
        }
        names[n] = name;
        match name {
            PROP_ORIGIN => from_kafka = true,
            PROP_NULL_VALUE => null_value = true,
            PROP_KEY_B64 => key_b64 = Some(value),
            property::KEYS => keys = Some(value),
            _ => {}
        }
    }
    let key = match key_b64 {
        Some(EMPTY_KEY) => Some(Cow::Borrowed(&[][..])),
        Some(b64) => B64.decode(b64).ok().map(Cow::Owned),
        None => keys.map(|k| Cow::Borrowed(k.as_bytes())),
    };
    Some(Shown {
        offset: view.queue_offset(),
        timestamp: view.born_timestamp(),
        key,
        value: (!null_value).then(|| view.body()),
        headers: Headers::Properties { props, from_kafka },
    })
}

/// Rebuilds one record batch from stored message records (a `get_messages` answer); see the
/// module documentation. Bodies compressed by RocketMQ producers are decompressed (up to
/// `max_decompressed` bytes each). A record that cannot be read ends the batch before it (an
/// error when it is the first). The batch carries the leader epoch of its first record
/// (`epochs`, by commit-log offset) and ends before the first record of a later epoch.
#[allow(
    clippy::expect_used,
    reason = "every record not shown was built, in order, just above"
)]
pub(crate) fn write_batch(
    stored: &Bytes,
    max_decompressed: usize,
    epochs: &LeaderEpochs,
) -> Result<BuiltBatch, String> {
    let opts = DecodeOptions {
        verify_crc: false,
        decompress_body: true,
        max_decompressed_size: max_decompressed,
    };
    // The views first: the batch header needs the smallest and largest timestamps and offsets,
    // and every record's timestamp is written relative to the smallest.
    let mut views: Vec<RecordView<'_>> = Vec::new();
    let mut error = None;
    let mut epoch = 0;
    let mut epoch_end = None;
    for v in iter_records(stored) {
        match v {
            Ok(v) => {
                let phys = u64::try_from(v.physical_offset()).unwrap_or(0);
                if views.is_empty() {
                    epoch = epochs.epoch_at(phys);
                    epoch_end = epochs.end_of_epoch_at(phys);
                } else if epoch_end.is_some_and(|end| phys >= end) {
                    break;
                }
                views.push(v);
            }
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    // Records that need the full conversion, converted up front (they are borrowed below).
    let mut built: Vec<ShownRecord> = Vec::new();
    let mut shown: Vec<Option<Shown<'_>>> = Vec::with_capacity(views.len());
    for v in &views {
        let s = from_slices(v);
        if s.is_none() {
            match v.to_message_ext(&opts) {
                Ok(m) => built.push(message_to_record(&m)),
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
        }
        shown.push(s);
    }
    let mut built = built.iter();
    let records: Vec<Shown<'_>> = shown
        .into_iter()
        .map(|s| {
            s.unwrap_or_else(|| {
                let r = built.next().expect("one built record per record not shown");
                Shown {
                    offset: r.offset,
                    timestamp: r.timestamp,
                    key: r.key.as_deref().map(Cow::Borrowed),
                    value: r.value.as_deref(),
                    headers: Headers::Built(r),
                }
            })
        })
        .collect();
    if let Some(e) = &error {
        if records.is_empty() {
            return Err(format!("stored record undecodable: {e}"));
        }
        tracing::warn!(error = %e, "a stored record could not be decoded; the fetch stops before it");
    }
    let Some(first) = records.first() else {
        return Ok(BuiltBatch {
            bytes: Bytes::new(),
            records: 0,
            next_offset: None,
        });
    };
    let min_offset = records
        .iter()
        .map(|r| r.offset)
        .min()
        .unwrap_or(first.offset);
    let max_offset = records
        .iter()
        .map(|r| r.offset)
        .max()
        .unwrap_or(first.offset);
    let min_ts = records.iter().map(|r| r.timestamp).min().unwrap_or(0);
    let max_ts = records.iter().map(|r| r.timestamp).max().unwrap_or(0);
    let size: usize = records
        .iter()
        .map(|r| r.value.map_or(0, <[u8]>::len) + 64)
        .sum();
    let mut buf = BytesMut::with_capacity(BATCH_HEADER + size + stored.len() / 4);
    buf.put_i64(min_offset);
    buf.put_i32(0); // batch length, filled in below
    buf.put_i32(epoch); // partition leader epoch
    buf.put_i8(2); // magic
    buf.put_u32(0); // CRC-32C, filled in below
    buf.put_i16(0); // attributes: no compression, not transactional, not control
    buf.put_i32(
        i32::try_from(max_offset - min_offset).map_err(|_| "offsets too far apart".to_string())?,
    );
    buf.put_i64(min_ts);
    buf.put_i64(max_ts);
    buf.put_i64(-1); // producer id
    buf.put_i16(-1); // producer epoch
                     // Records are numbered from -1 ("no sequence") at the smallest offset, as the
                     // kafka-protocol encoder is asked to do by the conversion this replaces.
    buf.put_i32((-1i64 - (first.offset - min_offset)) as i32);
    buf.put_i32(i32::try_from(records.len()).map_err(|_| "too many records".to_string())?);
    for r in &records {
        put_record(&mut buf, r, min_offset, min_ts)?;
    }
    let batch_len = i32::try_from(buf.len() - 12).map_err(|_| "batch too large".to_string())?;
    buf[8..12].copy_from_slice(&batch_len.to_be_bytes());
    let crc = crc32c::crc32c(&buf[21..]);
    buf[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(BuiltBatch {
        bytes: buf.freeze(),
        records: records.len(),
        next_offset: records.last().map(|r| r.offset + 1),
    })
}

/// Writes one record (its length first, then attributes, deltas, key, value and headers).
fn put_record(
    buf: &mut BytesMut,
    r: &Shown<'_>,
    min_offset: i64,
    min_ts: i64,
) -> Result<(), String> {
    let offset_delta =
        i32::try_from(r.offset - min_offset).map_err(|_| "offsets too far apart".to_string())?;
    let ts_delta = r.timestamp - min_ts;
    let key = r.key.as_deref();
    let mut headers = 0usize;
    let mut headers_len = 0usize;
    r.for_each_header(|k, v| {
        headers += 1;
        headers_len += varint_len(zigzag32(k.len() as i32))
            + k.len()
            + v.map_or(1, |v| varint_len(zigzag32(v.len() as i32)) + v.len());
    });
    let len = 1
        + varint_len(zigzag64(ts_delta))
        + varint_len(zigzag32(offset_delta))
        + bytes_len(key)
        + bytes_len(r.value)
        + varint_len(zigzag32(headers as i32))
        + headers_len;
    put_varint(buf, zigzag32(len as i32));
    buf.put_i8(0); // attributes
    put_varint(buf, zigzag64(ts_delta));
    put_varint(buf, zigzag32(offset_delta));
    put_bytes(buf, key);
    put_bytes(buf, r.value);
    put_varint(buf, zigzag32(headers as i32));
    r.for_each_header(|k, v| {
        put_varint(buf, zigzag32(k.len() as i32));
        buf.put_slice(k);
        put_bytes(buf, v);
    });
    Ok(())
}

/// Bytes of a length-prefixed byte string (-1 for none).
fn bytes_len(b: Option<&[u8]>) -> usize {
    b.map_or(1, |b| varint_len(zigzag32(b.len() as i32)) + b.len())
}

fn put_bytes(buf: &mut BytesMut, b: Option<&[u8]>) {
    match b {
        Some(b) => {
            put_varint(buf, zigzag32(b.len() as i32));
            buf.put_slice(b);
        }
        None => put_varint(buf, zigzag32(-1)),
    }
}

fn zigzag32(v: i32) -> u64 {
    u64::from(((v << 1) ^ (v >> 31)) as u32)
}

fn zigzag64(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn put_varint(buf: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

#[cfg(test)]
mod tests;
