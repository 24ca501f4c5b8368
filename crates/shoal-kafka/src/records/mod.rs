//! Record sets of Produce requests checked before kafka-protocol decodes them.
//!
//! kafka-protocol reserves room for a batch's declared record count and a record's declared
//! header count before reading them, and inflates compressed batches without a limit (raw
//! snappy even allocates the declared uncompressed length at once). Here every batch (magic 2)
//! is checked first: its length ends inside the set, its declared record count fits the bytes
//! of its records, each record's length and header count fit, and a compressed batch is
//! inflated by this module, stopping at `limit` bytes. kafka-protocol then decodes the checked
//! batch from the bytes inflated here (CRC-32C and the rest of its checks still apply).
//!
//! Each record's headers are read here too, as the ordered list they are on the wire:
//! kafka-protocol keeps them in a map, which loses a repeated name and the order around it.

use crate::convert::HeaderList;
use bytes::Bytes;
use kafka_protocol::records::{Compression, RecordBatchDecoder, RecordSet};
use std::io::Read;

/// Bytes of a magic-2 batch header up to and including the record count.
const HEADER: usize = 61;

/// Why a record set was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BatchError {
    /// The set is not well formed (the message says where).
    Malformed(String),
    /// Message sets v0/v1 (magic 0 or 1) are not supported.
    LegacyFormat(i8),
    /// A batch inflates to more than the limit.
    TooLarge {
        /// The limit (`max_batch_decompressed_bytes`).
        limit: usize,
    },
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchError::Malformed(m) => f.write_str(m),
            BatchError::LegacyFormat(v) => write!(f, "message sets v{v} are unsupported"),
            BatchError::TooLarge { limit } => {
                write!(f, "a batch inflates to more than {limit} bytes")
            }
        }
    }
}

fn malformed<T>(m: String) -> Result<T, BatchError> {
    Err(BatchError::Malformed(m))
}

/// One batch of a Produce request: kafka-protocol's decoding, and each record's headers as
/// sent (one list per record, in order).
#[derive(Debug)]
pub(crate) struct DecodedBatch {
    pub set: RecordSet,
    pub headers: Vec<HeaderList>,
}

/// Decodes the record set of one partition of a Produce request after checking it.
pub(crate) fn decode_record_set(set: Bytes, limit: usize) -> Result<Vec<DecodedBatch>, BatchError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < set.len() {
        let rest = &set[pos..];
        if rest.len() < 17 {
            return malformed(format!(
                "{} bytes left at byte {pos}, too few for a batch header",
                rest.len()
            ));
        }
        let magic = rest[16] as i8;
        if magic != 2 {
            return Err(BatchError::LegacyFormat(magic));
        }
        let declared = i32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]]);
        let len = usize::try_from(declared)
            .unwrap_or(usize::MAX)
            .saturating_add(12);
        if declared < 0 || len > rest.len() || len < HEADER {
            return malformed(format!(
                "batch at byte {pos} declares {declared} bytes ({} left)",
                rest.len() - 12
            ));
        }
        let batch = set.slice(pos..pos + len);
        let attributes = i16::from_be_bytes([batch[21], batch[22]]);
        let count = i32::from_be_bytes([batch[57], batch[58], batch[59], batch[60]]);
        let compressed = batch.slice(HEADER..);
        let records = match attributes & 0x7 {
            0 => compressed,
            1 => inflate(flate2::read::GzDecoder::new(&compressed[..]), limit, "gzip")?,
            2 => unsnappy(&compressed, limit)?,
            3 => {
                let r = lz4::Decoder::new(&compressed[..])
                    .or_else(|e| malformed(format!("lz4: {e}")))?;
                inflate(r, limit, "lz4")?
            }
            4 => {
                let r = zstd::stream::read::Decoder::new(&compressed[..])
                    .or_else(|e| malformed(format!("zstd: {e}")))?;
                inflate(r, limit, "zstd")?
            }
            other => return malformed(format!("unknown compression {other}")),
        };
        let headers = check_records(&records, count)?;
        let mut b = batch.clone();
        let set = RecordBatchDecoder::decode_with_custom_compression(
            &mut b,
            Some(|_: &mut Bytes, _: Compression| Ok(records.clone())),
        )
        .or_else(|e| malformed(e.to_string()))?;
        if set.records.len() != headers.len() {
            return malformed(format!(
                "batch at byte {pos}: {} records decoded, {} read",
                set.records.len(),
                headers.len()
            ));
        }
        out.push(DecodedBatch { set, headers });
        pos += len;
    }
    Ok(out)
}

/// Whether some batch of `set` is compressed (its attributes name a codec), read from the batch
/// headers alone. A set that is not well framed answers false: it is refused as cheaply as it is
/// read, by [`decode_record_set`].
pub(crate) fn any_compressed(set: &[u8]) -> bool {
    let mut pos = 0;
    while let Some(rest) = set.get(pos..).filter(|r| r.len() >= HEADER) {
        if i16::from_be_bytes([rest[21], rest[22]]) & 0x7 != 0 {
            return true;
        }
        let declared = i32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]]);
        match usize::try_from(declared) {
            Ok(len) if len >= HEADER - 12 => pos += len + 12,
            _ => return false,
        }
    }
    false
}

fn inflate(r: impl Read, limit: usize, what: &str) -> Result<Bytes, BatchError> {
    let mut out = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    r.take(cap)
        .read_to_end(&mut out)
        .or_else(|e| malformed(format!("{what}: {e}")))?;
    if out.len() > limit {
        return Err(BatchError::TooLarge { limit });
    }
    Ok(out.into())
}

/// Snappy as Kafka clients write it: xerial's framing (a 16-byte magic header, then blocks of
/// a 4-byte length and a raw snappy block), or one raw snappy block without the header.
fn unsnappy(data: &[u8], limit: usize) -> Result<Bytes, BatchError> {
    const MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";
    let mut blocks = Vec::new();
    if data.len() >= 16 && data[..8] == MAGIC[..] {
        let mut pos = 16;
        while pos < data.len() {
            let Some(l) = data.get(pos..pos + 4) else {
                return malformed("snappy: truncated block length".into());
            };
            let n = u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize;
            let Some(block) = data.get(pos + 4..(pos + 4).saturating_add(n)) else {
                return malformed("snappy: block past the end".into());
            };
            blocks.push(block);
            pos += 4 + n;
        }
    } else {
        blocks.push(data);
    }
    let mut total = 0usize;
    for b in &blocks {
        let n = snap::raw::decompress_len(b).or_else(|e| malformed(format!("snappy: {e}")))?;
        total = total.saturating_add(n);
        if total > limit {
            return Err(BatchError::TooLarge { limit });
        }
    }
    let mut out = vec![0u8; total];
    let mut at = 0;
    let mut dec = snap::raw::Decoder::new();
    for b in blocks {
        at += dec
            .decompress(b, &mut out[at..])
            .or_else(|e| malformed(format!("snappy: {e}")))?;
    }
    out.truncate(at);
    Ok(out.into())
}

/// Reads a zigzag varint of at most `max` bytes.
fn varint(buf: &[u8], pos: &mut usize, max: usize) -> Option<i64> {
    let mut v: u64 = 0;
    for i in 0..max {
        let b = *buf.get(*pos)?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((v >> 1) as i64 ^ -((v & 1) as i64));
        }
    }
    None
}

/// The records of a batch: `count` fits the bytes; each record's length ends inside, and its
/// header count and headers fit the record's bytes. Returns each record's headers, in order.
fn check_records(records: &Bytes, count: i32) -> Result<Vec<HeaderList>, BatchError> {
    if count < 0 || count as usize > records.len() {
        return malformed(format!(
            "batch declares {count} records in {} bytes",
            records.len()
        ));
    }
    let mut out = Vec::with_capacity(count as usize);
    let mut pos = 0;
    for i in 0..count {
        let bad = |what: &str| malformed(format!("record {i} of the batch: {what}"));
        let Some(size) = varint(records, &mut pos, 5) else {
            return bad("bad length");
        };
        let end = match usize::try_from(size) {
            Ok(s) if s <= records.len() - pos => pos + s,
            _ => return bad(&format!("length {size} past the end")),
        };
        let r = &records[..end];
        pos += 1; // attributes
        let fields = [10, 5]; // timestamp delta (varlong), offset delta (varint)
        for max in fields {
            if varint(r, &mut pos, max).is_none() {
                return bad("truncated");
            }
        }
        for _ in 0..2 {
            // key, value: length (-1 null) and bytes
            match varint(r, &mut pos, 5) {
                Some(-1) => {}
                Some(n) if n >= 0 && (n as usize) <= r.len().saturating_sub(pos) => {
                    pos += n as usize
                }
                _ => return bad("key or value length past the record's end"),
            }
        }
        let n = match varint(r, &mut pos, 5) {
            Some(n) if n >= 0 && (n as usize) <= r.len().saturating_sub(pos) => n as usize,
            Some(n) => {
                return bad(&format!(
                    "{n} headers declared in {} bytes",
                    r.len().saturating_sub(pos)
                ))
            }
            None => return bad("truncated"),
        };
        let mut headers = HeaderList::with_capacity(n);
        for h in 0..n {
            // name: length and UTF-8 bytes (never null); value: length (-1 null) and bytes.
            let name = match varint(r, &mut pos, 5) {
                Some(l) if l >= 0 && (l as usize) <= r.len().saturating_sub(pos) => {
                    let bytes = &r[pos..pos + l as usize];
                    pos += l as usize;
                    match std::str::from_utf8(bytes) {
                        Ok(s) => s.to_string(),
                        Err(_) => return bad(&format!("header {h}'s name is not UTF-8")),
                    }
                }
                _ => return bad(&format!("header {h}'s name length past the record's end")),
            };
            let value = match varint(r, &mut pos, 5) {
                Some(-1) => None,
                Some(l) if l >= 0 && (l as usize) <= r.len().saturating_sub(pos) => {
                    let v = records.slice(pos..pos + l as usize);
                    pos += l as usize;
                    Some(v)
                }
                _ => return bad(&format!("header {h}'s value length past the record's end")),
            };
            headers.push((name, value));
        }
        out.push(headers);
        pos = end;
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
