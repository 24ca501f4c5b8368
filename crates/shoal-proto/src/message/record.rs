//! The stored message record (spec §4.1): encoding with fields patched in at append time,
//! a light borrowed view, full decoding of one record and of a run of records (a pull body).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::Range;

use bytes::{BufMut, Bytes};

use super::compression::{decompress_body, DEFAULT_MAX_DECOMPRESSED_SIZE};
use super::property::{decode_properties, find_property, Properties};
use super::sys_flag::{
    clear_compressed_flag, BORNHOST_V6_FLAG, COMPRESSED_FLAG, STOREHOST_V6_FLAG,
};
use super::{body_crc, offset_msg_id, tags_code, MessageExt};
use crate::{ProtoError, Result};

/// Magic code of a V1 record (topic length in 1 byte).
pub const MAGIC_CODE_V1: u32 = 0xDAA3_20A7;
/// Magic code of a V2 record (topic length in 2 bytes; used when the topic is > 127 bytes).
pub const MAGIC_CODE_V2: u32 = 0xDAA3_20AB;
/// Magic code of the blank / end-of-file marker at the tail of a commit-log segment
/// (never on the wire). The marker is `TOTALSIZE` (the rest of the segment) + this magic.
pub const BLANK_MAGIC_CODE: u32 = 0xCBD4_3194;
/// Length of the blank marker written at the end of a commit-log segment (size + magic).
pub const BLANK_MARKER_LEN: usize = 8;
/// Longest topic a V1 record can carry (`Byte.MAX_VALUE`).
pub const MAX_V1_TOPIC_LEN: usize = 127;
/// Longest topic a V2 record can carry (`Short.MAX_VALUE`).
pub const MAX_TOPIC_LEN: usize = i16::MAX as usize;
/// Longest encoded properties string (`Short.MAX_VALUE` bytes).
pub const MAX_PROPERTIES_LEN: usize = i16::MAX as usize;

/// Byte position of TOTALSIZE in a record.
pub const TOTAL_SIZE_POS: usize = 0;
/// Byte position of MAGICCODE in a record.
pub const MAGIC_CODE_POS: usize = 4;
/// Byte position of BODYCRC in a record.
pub const BODY_CRC_POS: usize = 8;
/// Byte position of QUEUEID in a record.
pub const QUEUE_ID_POS: usize = 12;
/// Byte position of FLAG in a record.
pub const FLAG_POS: usize = 16;
/// Byte position of QUEUEOFFSET (8 bytes) in a record.
pub const QUEUE_OFFSET_POS: usize = 20;
/// Byte position of PHYSICALOFFSET (8 bytes) in a record.
pub const PHYSICAL_OFFSET_POS: usize = 28;
/// Byte position of SYSFLAG in a record.
pub const SYS_FLAG_POS: usize = 36;
/// Byte position of BORNTIMESTAMP (8 bytes) in a record.
pub const BORN_TIMESTAMP_POS: usize = 40;
/// Byte position of BORNHOST in a record.
pub const BORN_HOST_POS: usize = 48;
/// Shortest possible record: IPv4 hosts, empty body, 1-byte topic length, empty topic and
/// properties (4·5 + 8·2 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2 = 91 bytes).
pub const MIN_RECORD_LEN: usize = 91;

/// The length of an encoded host: 8 (IPv4 + port) or 20 (IPv6 + port).
fn host_len(v6: bool) -> usize {
    if v6 {
        20
    } else {
        8
    }
}

/// Byte position of STORETIMESTAMP in a record with this sysFlag (56, or 68 if BORNHOST is
/// IPv6).
pub fn store_timestamp_pos(sys_flag: i32) -> usize {
    BORN_HOST_POS + host_len(sys_flag & BORNHOST_V6_FLAG != 0)
}

/// Record format version, given by the magic code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageVersion {
    /// [`MAGIC_CODE_V1`]: 1-byte topic length.
    V1,
    /// [`MAGIC_CODE_V2`]: 2-byte topic length.
    V2,
}

impl MessageVersion {
    /// The magic code of this version.
    pub fn magic_code(self) -> u32 {
        match self {
            MessageVersion::V1 => MAGIC_CODE_V1,
            MessageVersion::V2 => MAGIC_CODE_V2,
        }
    }

    /// The version with this magic code, if any.
    pub fn from_magic_code(magic: u32) -> Option<Self> {
        match magic {
            MAGIC_CODE_V1 => Some(MessageVersion::V1),
            MAGIC_CODE_V2 => Some(MessageVersion::V2),
            _ => None,
        }
    }

    /// The version Java's store uses for a topic of `topic_len` bytes (V2 iff > 127).
    pub fn for_topic_len(topic_len: usize) -> Self {
        if topic_len > MAX_V1_TOPIC_LEN {
            MessageVersion::V2
        } else {
            MessageVersion::V1
        }
    }

    /// Size of the topic length field: 1 (V1) or 2 (V2).
    pub fn topic_len_size(self) -> usize {
        match self {
            MessageVersion::V1 => 1,
            MessageVersion::V2 => 2,
        }
    }
}

/// Total record length for the given field lengths (Java `calMsgLength`).
pub fn record_len(
    sys_flag: i32,
    body_len: usize,
    topic_len: usize,
    properties_len: usize,
) -> usize {
    let version = MessageVersion::for_topic_len(topic_len);
    4 + 4
        + 4
        + 4
        + 4
        + 8
        + 8
        + 4
        + 8
        + host_len(sys_flag & BORNHOST_V6_FLAG != 0)
        + 8
        + host_len(sys_flag & STOREHOST_V6_FLAG != 0)
        + 4
        + 8
        + 4
        + body_len
        + version.topic_len_size()
        + topic_len
        + 2
        + properties_len
}

/// Everything a stored record contains, borrowed, ready to be encoded.
///
/// `properties` is the already encoded properties string (§4.4; see
/// [`encode_properties`](super::property::encode_properties)). The sysFlag's IPv6 bits
/// (0x10, 0x20) are set or cleared by the encoder from the host address families; all other
/// bits are written as given. `body` is written as is (compress it first if the sysFlag says
/// so); BODYCRC is computed by the encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordFields<'a> {
    /// Topic (1..=32767 UTF-8 bytes).
    pub topic: &'a str,
    /// Queue id.
    pub queue_id: i32,
    /// User flag.
    pub flag: i32,
    /// Consume-queue offset (may be patched at append, see [`patch_record`]).
    pub queue_offset: i64,
    /// Commit-log offset (may be patched at append, see [`patch_record`]).
    pub physical_offset: i64,
    /// sysFlag (§4.2); IPv6 bits are derived from the hosts.
    pub sys_flag: i32,
    /// Born timestamp, ms.
    pub born_timestamp: i64,
    /// Producer address.
    pub born_host: SocketAddr,
    /// Store timestamp, ms (may be patched at append, see [`patch_record`]).
    pub store_timestamp: i64,
    /// Broker address.
    pub store_host: SocketAddr,
    /// Reconsume times.
    pub reconsume_times: i32,
    /// Prepared transaction offset (0 for normal messages).
    pub prepared_transaction_offset: i64,
    /// The (stored, possibly compressed) body.
    pub body: &'a [u8],
    /// The encoded properties string.
    pub properties: &'a str,
}

impl RecordFields<'_> {
    /// The sysFlag that will be written: the given one with the IPv6 bits from the hosts.
    pub fn effective_sys_flag(&self) -> i32 {
        let mut f = self.sys_flag & !(BORNHOST_V6_FLAG | STOREHOST_V6_FLAG);
        if self.born_host.is_ipv6() {
            f |= BORNHOST_V6_FLAG;
        }
        if self.store_host.is_ipv6() {
            f |= STOREHOST_V6_FLAG;
        }
        f
    }

    /// The record version the encoder will use (V2 iff the topic is longer than 127 bytes).
    pub fn version(&self) -> MessageVersion {
        MessageVersion::for_topic_len(self.topic.len())
    }

    /// Validates the field lengths and returns the encoded record length.
    ///
    /// Errors: empty topic or topic over 32767 bytes, properties over 32767 bytes, body or
    /// total over `i32::MAX` bytes ([`ProtoError::BadLength`]).
    pub fn encoded_len(&self) -> Result<usize> {
        if self.topic.is_empty() {
            return Err(ProtoError::BadLength("message topic is empty".to_owned()));
        }
        if self.topic.len() > MAX_TOPIC_LEN {
            return Err(ProtoError::BadLength(format!(
                "message topic is {} bytes, the limit is {MAX_TOPIC_LEN}",
                self.topic.len()
            )));
        }
        if self.properties.len() > MAX_PROPERTIES_LEN {
            return Err(ProtoError::BadLength(format!(
                "message properties are {} bytes, the limit is {MAX_PROPERTIES_LEN}",
                self.properties.len()
            )));
        }
        let len = record_len(
            self.effective_sys_flag(),
            self.body.len(),
            self.topic.len(),
            self.properties.len(),
        );
        if i32::try_from(len).is_err() {
            return Err(ProtoError::BadLength(format!(
                "message record of {len} bytes exceeds i32::MAX"
            )));
        }
        Ok(len)
    }
}

/// Where an encoded record and its append-time fields lie in the output buffer.
///
/// All positions are absolute indexes into the buffer the record was encoded into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordLayout {
    /// Index of the record's first byte.
    pub start: usize,
    /// Record length (= TOTALSIZE).
    pub len: usize,
    /// Index of QUEUEOFFSET (8 bytes).
    pub queue_offset_at: usize,
    /// Index of PHYSICALOFFSET (8 bytes).
    pub physical_offset_at: usize,
    /// Index of STORETIMESTAMP (8 bytes).
    pub store_timestamp_at: usize,
}

impl RecordLayout {
    /// The layout of a record of `len` bytes with this sysFlag starting at `start`.
    pub fn new(start: usize, len: usize, sys_flag: i32) -> Self {
        RecordLayout {
            start,
            len,
            queue_offset_at: start + QUEUE_OFFSET_POS,
            physical_offset_at: start + PHYSICAL_OFFSET_POS,
            store_timestamp_at: start + store_timestamp_pos(sys_flag),
        }
    }

    /// The record's byte range in the buffer.
    pub fn range(&self) -> Range<usize> {
        self.start..self.start + self.len
    }

    /// Writes queue offset, physical offset and store timestamp into the record in `buf`.
    /// Errors (without writing) if `buf` is too short.
    pub fn patch(
        &self,
        buf: &mut [u8],
        queue_offset: i64,
        physical_offset: i64,
        store_timestamp: i64,
    ) -> Result<()> {
        let have = buf.len();
        let record = buf.get_mut(self.range()).ok_or(ProtoError::Truncated {
            what: "message record to patch",
            need: self.start + self.len,
            have,
        })?;
        let rel_ts = self.store_timestamp_at - self.start;
        put_i64(record, QUEUE_OFFSET_POS, queue_offset)?;
        put_i64(record, PHYSICAL_OFFSET_POS, physical_offset)?;
        put_i64(record, rel_ts, store_timestamp)
    }
}

fn put_i64(buf: &mut [u8], at: usize, v: i64) -> Result<()> {
    let have = buf.len();
    let dst = buf.get_mut(at..at + 8).ok_or(ProtoError::Truncated {
        what: "message record to patch",
        need: at + 8,
        have,
    })?;
    dst.copy_from_slice(&v.to_be_bytes());
    Ok(())
}

/// Patches queue offset, physical offset and store timestamp into an encoded record that
/// starts at `record[0]` (the store timestamp position is found from the record's sysFlag).
///
/// This is what the commit log does under its append lock, after encoding outside it.
/// Errors if `record` is shorter than the fields; nothing is written then.
pub fn patch_record(
    record: &mut [u8],
    queue_offset: i64,
    physical_offset: i64,
    store_timestamp: i64,
) -> Result<()> {
    let sys_flag = read_i32(record, SYS_FLAG_POS, "message record to patch")?;
    let ts = store_timestamp_pos(sys_flag);
    if record.len() < ts + 8 {
        return Err(ProtoError::Truncated {
            what: "message record to patch",
            need: ts + 8,
            have: record.len(),
        });
    }
    put_i64(record, QUEUE_OFFSET_POS, queue_offset)?;
    put_i64(record, PHYSICAL_OFFSET_POS, physical_offset)?;
    put_i64(record, ts, store_timestamp)
}

fn put_host<B: BufMut>(out: &mut B, host: &SocketAddr) {
    match host.ip() {
        IpAddr::V4(ip) => out.put_slice(&ip.octets()),
        IpAddr::V6(ip) => out.put_slice(&ip.octets()),
    }
    out.put_i32(i32::from(host.port()));
}

/// Encodes one stored record at the end of `out` and returns where it and its append-time
/// fields lie. Nothing is written if the fields are invalid (see
/// [`RecordFields::encoded_len`]).
pub fn encode_record<B>(fields: &RecordFields<'_>, out: &mut B) -> Result<RecordLayout>
where
    B: BufMut + AsRef<[u8]>,
{
    let len = fields.encoded_len()?;
    let start = out.as_ref().len();
    write_record(fields, len, out);
    Ok(RecordLayout::new(start, len, fields.effective_sys_flag()))
}

/// Encodes one stored record into the start of `dst` (e.g. straight into a memory-mapped
/// commit-log segment) and returns its layout (positions relative to `dst`). Errors, without
/// writing, if the fields are invalid or `dst` is shorter than the record.
pub fn encode_record_to_slice(fields: &RecordFields<'_>, dst: &mut [u8]) -> Result<RecordLayout> {
    let len = fields.encoded_len()?;
    let have = dst.len();
    let mut window = dst.get_mut(..len).ok_or(ProtoError::Truncated {
        what: "buffer for message record",
        need: len,
        have,
    })?;
    write_record(fields, len, &mut window);
    Ok(RecordLayout::new(0, len, fields.effective_sys_flag()))
}

/// Writes exactly `len` bytes (the validated [`RecordFields::encoded_len`]).
fn write_record<B: BufMut>(fields: &RecordFields<'_>, len: usize, out: &mut B) {
    let version = fields.version();
    out.put_i32(len as i32);
    out.put_u32(version.magic_code());
    out.put_u32(body_crc(fields.body));
    out.put_i32(fields.queue_id);
    out.put_i32(fields.flag);
    out.put_i64(fields.queue_offset);
    out.put_i64(fields.physical_offset);
    out.put_i32(fields.effective_sys_flag());
    out.put_i64(fields.born_timestamp);
    put_host(out, &fields.born_host);
    out.put_i64(fields.store_timestamp);
    put_host(out, &fields.store_host);
    out.put_i32(fields.reconsume_times);
    out.put_i64(fields.prepared_transaction_offset);
    out.put_i32(fields.body.len() as i32);
    out.put_slice(fields.body);
    match version {
        MessageVersion::V1 => out.put_u8(fields.topic.len() as u8),
        MessageVersion::V2 => out.put_i16(fields.topic.len() as i16),
    }
    out.put_slice(fields.topic.as_bytes());
    out.put_i16(fields.properties.len() as i16);
    out.put_slice(fields.properties.as_bytes());
}

/// The 8-byte blank / end-of-file marker for a segment tail of `remaining` bytes:
/// TOTALSIZE = `remaining`, MAGICCODE = [`BLANK_MAGIC_CODE`].
pub fn blank_marker(remaining: i32) -> [u8; BLANK_MARKER_LEN] {
    let mut m = [0u8; BLANK_MARKER_LEN];
    m[..4].copy_from_slice(&remaining.to_be_bytes());
    m[4..].copy_from_slice(&BLANK_MAGIC_CODE.to_be_bytes());
    m
}

/// Reads TOTALSIZE and MAGICCODE at the start of `buf` without validating anything else
/// (the store uses it to recognise [`BLANK_MAGIC_CODE`] and zeroed space during recovery).
pub fn peek_record_prefix(buf: &[u8]) -> Result<(i32, u32)> {
    let size = read_i32(buf, TOTAL_SIZE_POS, "message record prefix")?;
    let magic = read_i32(buf, MAGIC_CODE_POS, "message record prefix")? as u32;
    Ok((size, magic))
}

fn read_array<const N: usize>(buf: &[u8], at: usize, what: &'static str) -> Result<[u8; N]> {
    buf.get(at..at + N)
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or(ProtoError::Truncated {
            what,
            need: at + N,
            have: buf.len(),
        })
}

fn read_i32(buf: &[u8], at: usize, what: &'static str) -> Result<i32> {
    read_array::<4>(buf, at, what).map(i32::from_be_bytes)
}

fn read_i64(buf: &[u8], at: usize, what: &'static str) -> Result<i64> {
    read_array::<8>(buf, at, what).map(i64::from_be_bytes)
}

/// A field-by-field reader over one record, with positions and precise errors.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn i16(&mut self, what: &'static str) -> Result<i16> {
        let v = read_array::<2>(self.buf, self.pos, what).map(i16::from_be_bytes)?;
        self.pos += 2;
        Ok(v)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8> {
        let v = read_array::<1>(self.buf, self.pos, what)?;
        self.pos += 1;
        Ok(v[0])
    }
    fn i32(&mut self, what: &'static str) -> Result<i32> {
        let v = read_i32(self.buf, self.pos, what)?;
        self.pos += 4;
        Ok(v)
    }
    fn i64(&mut self, what: &'static str) -> Result<i64> {
        let v = read_i64(self.buf, self.pos, what)?;
        self.pos += 8;
        Ok(v)
    }
    fn range(&mut self, len: usize, what: &'static str) -> Result<Range<usize>> {
        let end = self.pos.checked_add(len).filter(|e| *e <= self.buf.len());
        match end {
            Some(end) => {
                let r = self.pos..end;
                self.pos = end;
                Ok(r)
            }
            None => Err(ProtoError::Truncated {
                what,
                need: self.pos.saturating_add(len),
                have: self.buf.len(),
            }),
        }
    }
    fn host(&mut self, v6: bool, what: &'static str) -> Result<SocketAddr> {
        let ip = if v6 {
            IpAddr::V6(Ipv6Addr::from(read_array::<16>(self.buf, self.pos, what)?))
        } else {
            IpAddr::V4(Ipv4Addr::from(read_array::<4>(self.buf, self.pos, what)?))
        };
        self.pos += if v6 { 16 } else { 4 };
        let port = self.i32(what)?;
        let port = u16::try_from(port)
            .map_err(|_| ProtoError::Invalid(format!("{what} port {port} is out of range")))?;
        Ok(SocketAddr::new(ip, port))
    }
}

/// A borrowed, validated view of one stored record: every fixed field parsed, body, topic and
/// properties as ranges of the buffer (nothing copied, properties not parsed).
///
/// [`RecordView::parse`] checks the magic code, every length, that TOTALSIZE equals the sum of
/// the field lengths, that the topic and properties are UTF-8 and that ports are in range. It
/// does not check the body CRC (see [`RecordView::verify_crc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    record: &'a [u8],
    version: MessageVersion,
    body_crc: u32,
    queue_id: i32,
    flag: i32,
    queue_offset: i64,
    physical_offset: i64,
    sys_flag: i32,
    born_timestamp: i64,
    born_host: SocketAddr,
    store_timestamp: i64,
    store_host: SocketAddr,
    reconsume_times: i32,
    prepared_transaction_offset: i64,
    body_start: usize,
    body_end: usize,
    topic: &'a str,
    properties: &'a str,
}

impl<'a> RecordView<'a> {
    /// Parses the record at the start of `buf` (which may continue with more records).
    pub fn parse(buf: &'a [u8]) -> Result<Self> {
        let mut c = Cursor { buf, pos: 0 };
        let total = c.i32("message TOTALSIZE")?;
        let magic = c.i32("message MAGICCODE")? as u32;
        let version = MessageVersion::from_magic_code(magic).ok_or(ProtoError::BadMagic(magic))?;
        let total = usize::try_from(total)
            .ok()
            .filter(|t| *t >= MIN_RECORD_LEN)
            .ok_or_else(|| {
                ProtoError::BadLength(format!(
                    "message TOTALSIZE {total} is below the minimum record length {MIN_RECORD_LEN}"
                ))
            })?;
        if buf.len() < total {
            return Err(ProtoError::Truncated {
                what: "message record",
                need: total,
                have: buf.len(),
            });
        }
        // From here on read only inside the record, so field lengths cannot run past it; a
        // field that would is a TOTALSIZE that lies, not a short buffer.
        let record = buf.get(..total).unwrap_or_default();
        c.buf = record;
        Self::parse_fields(record, version, c).map_err(|e| match e {
            ProtoError::Truncated { what, .. } => ProtoError::BadLength(format!(
                "message TOTALSIZE {total} is too small for its fields ({what} runs past it)"
            )),
            other => other,
        })
    }

    fn parse_fields(record: &'a [u8], version: MessageVersion, mut c: Cursor<'a>) -> Result<Self> {
        let total = record.len();
        let body_crc = c.i32("message BODYCRC")? as u32;
        let queue_id = c.i32("message QUEUEID")?;
        let flag = c.i32("message FLAG")?;
        let queue_offset = c.i64("message QUEUEOFFSET")?;
        let physical_offset = c.i64("message PHYSICALOFFSET")?;
        let sys_flag = c.i32("message SYSFLAG")?;
        let born_timestamp = c.i64("message BORNTIMESTAMP")?;
        let born_host = c.host(sys_flag & BORNHOST_V6_FLAG != 0, "message BORNHOST")?;
        let store_timestamp = c.i64("message STORETIMESTAMP")?;
        let store_host = c.host(sys_flag & STOREHOST_V6_FLAG != 0, "message STOREHOST")?;
        let reconsume_times = c.i32("message RECONSUMETIMES")?;
        let prepared_transaction_offset = c.i64("message PREPAREDTRANSACTIONOFFSET")?;
        let body_len = c.i32("message BODY length")?;
        let body_len = usize::try_from(body_len).map_err(|_| {
            ProtoError::BadLength(format!("negative message body length {body_len}"))
        })?;
        let body = c.range(body_len, "message BODY")?;
        let topic_len = match version {
            MessageVersion::V1 => {
                // Java reads a signed byte: 128..=255 would be negative.
                let n = c.u8("message TOPIC length")?;
                if usize::from(n) > MAX_V1_TOPIC_LEN {
                    return Err(ProtoError::BadLength(format!(
                        "V1 message topic length {n} exceeds {MAX_V1_TOPIC_LEN}"
                    )));
                }
                usize::from(n)
            }
            MessageVersion::V2 => {
                let n = c.i16("message TOPIC length")?;
                usize::try_from(n).map_err(|_| {
                    ProtoError::BadLength(format!("negative message topic length {n}"))
                })?
            }
        };
        let topic = c.range(topic_len, "message TOPIC")?;
        let props_len = c.i16("message PROPERTIES length")?;
        let props_len = usize::try_from(props_len).map_err(|_| {
            ProtoError::BadLength(format!("negative message properties length {props_len}"))
        })?;
        let props = c.range(props_len, "message PROPERTIES")?;
        if c.pos != total {
            return Err(ProtoError::BadLength(format!(
                "message TOTALSIZE {total} disagrees with its fields ({} bytes)",
                c.pos
            )));
        }
        let topic = std::str::from_utf8(record.get(topic).unwrap_or_default())
            .map_err(|_| ProtoError::Utf8("message topic"))?;
        let properties = std::str::from_utf8(record.get(props).unwrap_or_default())
            .map_err(|_| ProtoError::Utf8("message properties"))?;
        Ok(RecordView {
            record,
            version,
            body_crc,
            queue_id,
            flag,
            queue_offset,
            physical_offset,
            sys_flag,
            born_timestamp,
            born_host,
            store_timestamp,
            store_host,
            reconsume_times,
            prepared_transaction_offset,
            body_start: body.start,
            body_end: body.end,
            topic,
            properties,
        })
    }

    /// The record's bytes (exactly TOTALSIZE of them).
    pub fn as_bytes(&self) -> &'a [u8] {
        self.record
    }
    /// Record length in bytes (TOTALSIZE).
    pub fn len(&self) -> usize {
        self.record.len()
    }
    /// Always false: a record is at least [`MIN_RECORD_LEN`] bytes.
    pub fn is_empty(&self) -> bool {
        self.record.is_empty()
    }
    /// TOTALSIZE as stored.
    pub fn total_size(&self) -> i32 {
        self.record.len() as i32
    }
    /// Record version (from the magic code).
    pub fn version(&self) -> MessageVersion {
        self.version
    }
    /// The magic code.
    pub fn magic_code(&self) -> u32 {
        self.version.magic_code()
    }
    /// BODYCRC as stored.
    pub fn body_crc(&self) -> u32 {
        self.body_crc
    }
    /// QUEUEID.
    pub fn queue_id(&self) -> i32 {
        self.queue_id
    }
    /// FLAG (user flag).
    pub fn flag(&self) -> i32 {
        self.flag
    }
    /// QUEUEOFFSET.
    pub fn queue_offset(&self) -> i64 {
        self.queue_offset
    }
    /// PHYSICALOFFSET (commit-log offset).
    pub fn physical_offset(&self) -> i64 {
        self.physical_offset
    }
    /// SYSFLAG.
    pub fn sys_flag(&self) -> i32 {
        self.sys_flag
    }
    /// BORNTIMESTAMP, ms.
    pub fn born_timestamp(&self) -> i64 {
        self.born_timestamp
    }
    /// BORNHOST.
    pub fn born_host(&self) -> SocketAddr {
        self.born_host
    }
    /// STORETIMESTAMP, ms.
    pub fn store_timestamp(&self) -> i64 {
        self.store_timestamp
    }
    /// STOREHOST.
    pub fn store_host(&self) -> SocketAddr {
        self.store_host
    }
    /// RECONSUMETIMES.
    pub fn reconsume_times(&self) -> i32 {
        self.reconsume_times
    }
    /// PREPARED TRANSACTION OFFSET.
    pub fn prepared_transaction_offset(&self) -> i64 {
        self.prepared_transaction_offset
    }
    /// The stored body (possibly compressed).
    pub fn body(&self) -> &'a [u8] {
        self.record
            .get(self.body_start..self.body_end)
            .unwrap_or_default()
    }
    /// Range of the body within the record.
    pub fn body_range(&self) -> Range<usize> {
        self.body_start..self.body_end
    }
    /// The topic.
    pub fn topic(&self) -> &'a str {
        self.topic
    }
    /// The encoded properties string.
    pub fn properties_str(&self) -> &'a str {
        self.properties
    }
    /// Range of the properties string within the record.
    pub fn properties_range(&self) -> Range<usize> {
        let end = self.record.len();
        end - self.properties.len()..end
    }
    /// The properties, parsed.
    pub fn properties(&self) -> Properties {
        decode_properties(self.properties)
    }
    /// One property, without parsing the others.
    pub fn property(&self, name: &str) -> Option<&'a str> {
        find_property(self.properties, name)
    }
    /// The `TAGS` property.
    pub fn tags(&self) -> Option<&'a str> {
        self.property(super::property::TAGS)
    }
    /// The `KEYS` property.
    pub fn keys(&self) -> Option<&'a str> {
        self.property(super::property::KEYS)
    }
    /// The `UNIQ_KEY` property.
    pub fn uniq_key(&self) -> Option<&'a str> {
        self.property(super::property::UNIQ_KEY)
    }
    /// Tag hash code for the consume queue (Java `String.hashCode` of `TAGS`, 0 if absent).
    pub fn tags_code(&self) -> i64 {
        tags_code(self.tags())
    }
    /// The offset message id (store host + physical offset).
    pub fn offset_msg_id(&self) -> String {
        offset_msg_id(self.store_host, self.physical_offset)
    }
    /// CRC32 (masked) of the stored body.
    pub fn computed_body_crc(&self) -> u32 {
        body_crc(self.body())
    }
    /// Checks BODYCRC against the body.
    pub fn verify_crc(&self) -> Result<()> {
        let computed = self.computed_body_crc();
        if computed != self.body_crc {
            return Err(ProtoError::BadCrc {
                stored: self.body_crc,
                computed,
            });
        }
        Ok(())
    }

    /// Builds the owned [`MessageExt`], copying the body (the view has no `Bytes` to share).
    pub fn to_message_ext(&self, opts: &DecodeOptions) -> Result<MessageExt> {
        self.build(Bytes::copy_from_slice(self.body()), opts)
    }

    fn build(&self, body: Bytes, opts: &DecodeOptions) -> Result<MessageExt> {
        if opts.verify_crc {
            self.verify_crc()?;
        }
        let mut sys_flag = self.sys_flag;
        let mut body = body;
        if opts.decompress_body && sys_flag & COMPRESSED_FLAG != 0 {
            if let Some(plain) = decompress_body(sys_flag, &body, opts.max_decompressed_size)? {
                body = Bytes::from(plain);
                sys_flag = clear_compressed_flag(sys_flag);
            }
        }
        Ok(MessageExt {
            store_size: self.total_size(),
            body_crc: self.body_crc,
            queue_id: self.queue_id,
            flag: self.flag,
            queue_offset: self.queue_offset,
            commit_log_offset: self.physical_offset,
            sys_flag,
            born_timestamp: self.born_timestamp,
            born_host: self.born_host,
            store_timestamp: self.store_timestamp,
            store_host: self.store_host,
            reconsume_times: self.reconsume_times,
            prepared_transaction_offset: self.prepared_transaction_offset,
            body,
            topic: self.topic.to_owned(),
            properties: self.properties(),
        })
    }
}

/// Options for decoding records into [`MessageExt`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Check BODYCRC ([`ProtoError::BadCrc`] on mismatch).
    pub verify_crc: bool,
    /// Decompress a compressed body and clear the COMPRESSED bit, as the Java client does.
    pub decompress_body: bool,
    /// Largest decompressed body accepted.
    pub max_decompressed_size: usize,
}

impl Default for DecodeOptions {
    /// No CRC check, no decompression (what the broker/store wants).
    fn default() -> Self {
        DecodeOptions {
            verify_crc: false,
            decompress_body: false,
            max_decompressed_size: DEFAULT_MAX_DECOMPRESSED_SIZE,
        }
    }
}

impl DecodeOptions {
    /// What a consumer wants: CRC checked, body decompressed (bounded by the default limit).
    pub fn client() -> Self {
        DecodeOptions {
            verify_crc: true,
            decompress_body: true,
            max_decompressed_size: DEFAULT_MAX_DECOMPRESSED_SIZE,
        }
    }
}

/// Decodes the record at `pos` in `buf`, sharing the body with `buf` (no copy unless it is
/// decompressed). Returns the message and the record length.
pub fn decode_record(buf: &Bytes, pos: usize, opts: &DecodeOptions) -> Result<(MessageExt, usize)> {
    let tail = buf.get(pos..).ok_or(ProtoError::Truncated {
        what: "message record",
        need: pos,
        have: buf.len(),
    })?;
    let view = RecordView::parse(tail)?;
    let body_range = view.body_range();
    let body = buf.slice(pos + body_range.start..pos + body_range.end);
    Ok((view.build(body, opts)?, view.len()))
}

/// The outcome of decoding a run of records (a pull body).
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedRun {
    /// The messages decoded, in order.
    pub messages: Vec<MessageExt>,
    /// Bytes consumed by those messages.
    pub consumed: usize,
    /// Why decoding stopped before the end of the buffer, if it did.
    pub error: Option<ProtoError>,
}

impl DecodedRun {
    /// Whether decoding stopped at an undecodable record before the end of the buffer.
    pub fn stopped_early(&self) -> bool {
        self.error.is_some()
    }
}

/// Decodes records from the start of `buf` until it is exhausted, stopping at the first
/// undecodable record (as the Java client does); bodies share `buf`.
pub fn decode_records(buf: &Bytes, opts: &DecodeOptions) -> DecodedRun {
    let mut messages = Vec::new();
    let mut pos = 0;
    let mut error = None;
    while pos < buf.len() {
        match decode_record(buf, pos, opts) {
            Ok((msg, len)) => {
                messages.push(msg);
                pos += len;
            }
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    DecodedRun {
        messages,
        consumed: pos,
        error,
    }
}

/// Iterates over the records of a buffer as [`RecordView`]s: yields `Ok` views until the
/// buffer is exhausted, or one `Err` at the first undecodable record and then ends.
pub fn iter_records(buf: &[u8]) -> RecordIter<'_> {
    RecordIter {
        buf,
        pos: 0,
        failed: false,
    }
}

/// Iterator returned by [`iter_records`].
#[derive(Debug, Clone)]
pub struct RecordIter<'a> {
    buf: &'a [u8],
    pos: usize,
    failed: bool,
}

impl RecordIter<'_> {
    /// Bytes consumed by the records yielded so far (the position of the next record).
    pub fn consumed(&self) -> usize {
        self.pos
    }
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = Result<RecordView<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let rest = self.buf.get(self.pos..).filter(|r| !r.is_empty())?;
        match RecordView::parse(rest) {
            Ok(view) => {
                self.pos += view.len();
                Some(Ok(view))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests;
