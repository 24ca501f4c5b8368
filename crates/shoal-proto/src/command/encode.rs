//! Writing commands: whole frames, JSON headers as fastjson writes them, ROCKETMQ binary
//! headers, and the pieces of both (binary extFields entries, JSON strings, decimals).

use super::json_fast;
use super::{
    RawExtFields, RemotingCommand, SerializeType, MAX_HEADER_LEN, ROCKETMQ_HEADER_FIXED_LEN,
};
use crate::{ProtoError, Result};
use bytes::{BufMut, Bytes, BytesMut};

/// Appends the decimal digits of `v` (and its sign) to `out`, as `i64::to_string` writes them.
pub fn push_decimal(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// Appends one entry of a ROCKETMQ binary extFields area to `out` whose value is `v` in
/// decimal ([`push_decimal`]'s text), with the entry's length fields and digits written in
/// one copy.
///
/// # Errors
/// A key longer than 32767 bytes (nothing appended).
#[inline]
pub fn push_binary_decimal(out: &mut Vec<u8>, key: &str, v: i64) -> Result<()> {
    push_binary_entry_parts(out, key, itoa::Buffer::new().format(v).as_bytes())
}

/// Appends one entry of a ROCKETMQ binary extFields area to `out` whose value `write`
/// appends (UTF-8 text, as every header value is): no copy of the value made first.
///
/// # Errors
/// A key longer than 32767 bytes or a value longer than `i32::MAX` bytes (nothing appended).
#[inline]
pub fn push_binary_entry_with(
    out: &mut Vec<u8>,
    key: &str,
    write: impl FnOnce(&mut Vec<u8>),
) -> Result<()> {
    let start = out.len();
    push_binary_entry(out, key, "")?;
    let value_at = out.len();
    write(out);
    match len_i32(out.len() - value_at, "extFields value") {
        Ok(n) => {
            out[value_at - 4..value_at].copy_from_slice(&n.to_be_bytes());
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// Appends one entry of a ROCKETMQ binary extFields area to `out`
/// ([`RawExtFields::Binary`]).
///
/// # Errors
/// A key longer than 32767 bytes or a value longer than `i32::MAX` bytes (nothing appended).
#[inline]
pub fn push_binary_entry(out: &mut Vec<u8>, key: &str, value: &str) -> Result<()> {
    push_binary_entry_parts(out, key, value.as_bytes())
}

/// [`push_binary_entry`] for a value given as (UTF-8) bytes. Always inlined, so that a
/// constant key is written with stores rather than copies.
#[inline(always)]
fn push_binary_entry_parts(out: &mut Vec<u8>, key: &str, value: &[u8]) -> Result<()> {
    let Ok(key_len) = i16::try_from(key.len()) else {
        return Err(long_binary_key(key));
    };
    let value_len = len_i32(value.len(), "extFields value")?;
    out.reserve(6 + key.len() + value.len());
    out.extend_from_slice(&key_len.to_be_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&value_len.to_be_bytes());
    out.extend_from_slice(value);
    Ok(())
}

/// The error for a key that does not fit a binary entry's 16-bit length (out of line: the
/// writers above are inlined).
#[cold]
fn long_binary_key(key: &str) -> ProtoError {
    ProtoError::InvalidField {
        field: "extFields",
        value: key.chars().take(64).collect(),
        reason: format!(
            "key of {} bytes exceeds the 32767-byte limit of a ROCKETMQ binary header",
            key.len()
        ),
    }
}

impl RemotingCommand {
    /// Appends this command as one whole frame to `dst`:
    /// `int32 length | int32 (type<<24)|hdrLen | header | body`.
    ///
    /// The header is JSON or ROCKETMQ binary according to [`RemotingCommand::serialize_type`].
    /// JSON is written exactly as Java's fastjson does (see [`RemotingCommand::encode_header`]).
    /// No frame-size limit is applied here beyond what the format can represent; a transport
    /// enforces its own limit. On error nothing is left appended to `dst`.
    ///
    /// # Errors
    /// With a binary header: a `code` or `version` outside the 16-bit range, or an extFields key
    /// longer than 32767 bytes. Any header over 16 MiB − 1 or a frame over `i32::MAX` bytes.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<()> {
        let start = dst.len();
        let result = self.encode_inner(dst, start);
        if result.is_err() {
            dst.truncate(start);
        }
        result
    }

    fn encode_inner(&self, dst: &mut BytesMut, start: usize) -> Result<()> {
        let body_len = self.body.as_ref().map_or(0, Bytes::len);
        dst.reserve(8 + 256 + body_len);
        dst.put_u64(0); // length and header-length words, patched below
        self.encode_header(dst)?;
        let header_len = dst.len() - start - 8;
        if header_len > MAX_HEADER_LEN {
            return Err(ProtoError::FrameTooLarge {
                len: header_len,
                max: MAX_HEADER_LEN,
            });
        }
        let frame_len = 4 + header_len + body_len;
        let Ok(frame_len_i32) = i32::try_from(frame_len) else {
            return Err(ProtoError::FrameTooLarge {
                len: frame_len + 4,
                max: i32::MAX as usize,
            });
        };
        if let Some(body) = &self.body {
            dst.extend_from_slice(body);
        }
        let word = (u32::from(self.serialize_type.code()) << 24) | header_len as u32;
        dst[start..start + 4].copy_from_slice(&frame_len_i32.to_be_bytes());
        dst[start + 4..start + 8].copy_from_slice(&word.to_be_bytes());
        Ok(())
    }

    /// Encodes this command as one whole frame into new bytes (see [`RemotingCommand::encode`]).
    ///
    /// # Errors
    /// As [`RemotingCommand::encode`].
    pub fn to_frame(&self) -> Result<Bytes> {
        let mut dst = BytesMut::new();
        self.encode(&mut dst)?;
        Ok(dst.freeze())
    }

    /// Appends only the header (no length words, no body) to `dst`, in the format given by
    /// [`RemotingCommand::serialize_type`].
    ///
    /// JSON headers are what fastjson emits for Java's `RemotingCommand`: keys sorted (`code`,
    /// `extFields`, `flag`, `language`, `opaque`, `remark`, `serializeTypeCurrentRPC`,
    /// `version`), `null`s omitted (`extFields` when `None`, `remark` when `None`), `extFields`
    /// entries in map order, `serializeTypeCurrentRPC` always `"JSON"`, strings with standard
    /// JSON escaping (control characters as `\u0001`, no escaping of `/` or non-ASCII).
    ///
    /// # Errors
    /// As [`RemotingCommand::encode`] (only binary headers can fail).
    pub fn encode_header(&self, dst: &mut BytesMut) -> Result<()> {
        match self.serialize_type {
            SerializeType::Json => {
                self.encode_json_header(dst);
                Ok(())
            }
            SerializeType::RocketMq => self.encode_rocketmq_header(dst),
        }
    }

    fn encode_json_header(&self, dst: &mut BytesMut) {
        // Room for the whole header when no string needs escapes: the fixed text with four
        // 11-character integers and the longest language name (160 bytes), the remark and its
        // key, and per extFields entry its text (`text_len` counts it, and may count more)
        // with two pairs of quotes, a colon and a comma.
        let ext_len = self
            .ext_fields
            .as_ref()
            .map_or(0, |ext| ext.text_len() + 6 * ext.len());
        let remark_len = self.remark.as_ref().map_or(0, |r| r.len() + 12);
        let json_len = match &self.ext_fields_raw {
            Some(RawExtFields::Json(j)) => j.len() + 13,
            _ => 0,
        };
        dst.reserve(160 + ext_len + remark_len + json_len);
        dst.extend_from_slice(b"{\"code\":");
        put_decimal(dst, self.code);
        if let Some(RawExtFields::Json(json)) = &self.ext_fields_raw {
            debug_assert!(self.ext_fields.is_none(), "both extFields forms set");
            dst.extend_from_slice(b",\"extFields\":");
            dst.extend_from_slice(json.as_bytes());
        } else if let Some(ext) = &self.ext_fields {
            dst.extend_from_slice(b",\"extFields\":{");
            for (i, (k, v)) in ext.iter_bytes().enumerate() {
                if i > 0 {
                    dst.put_u8(b',');
                }
                put_json_str(dst, k);
                dst.put_u8(b':');
                put_json_str(dst, v);
            }
            dst.put_u8(b'}');
        } else if let Some(raw) = self
            .ext_fields_raw
            .as_ref()
            .filter(|r| r.binary_area().is_some())
        {
            // Written for a binary header, sent as JSON after all: the same entries (their
            // strings are UTF-8, see `push_binary_entry`).
            dst.extend_from_slice(b",\"extFields\":{");
            for (i, (k, v)) in raw.binary_entries().enumerate() {
                if i > 0 {
                    dst.put_u8(b',');
                }
                put_json_str(dst, k);
                dst.put_u8(b':');
                put_json_str(dst, v);
            }
            dst.put_u8(b'}');
        }
        dst.extend_from_slice(b",\"flag\":");
        put_decimal(dst, self.flag);
        dst.extend_from_slice(b",\"language\":\"");
        dst.extend_from_slice(self.language.name().as_bytes());
        dst.extend_from_slice(b"\",\"opaque\":");
        put_decimal(dst, self.opaque);
        if let Some(remark) = &self.remark {
            dst.extend_from_slice(b",\"remark\":");
            put_json_str(dst, remark.as_bytes());
        }
        dst.extend_from_slice(b",\"serializeTypeCurrentRPC\":\"JSON\",\"version\":");
        put_decimal(dst, self.version);
        dst.put_u8(b'}');
    }

    fn encode_rocketmq_header(&self, dst: &mut BytesMut) -> Result<()> {
        let code = i16::try_from(self.code).map_err(|_| ProtoError::InvalidField {
            field: "code",
            value: self.code.to_string(),
            reason: "does not fit the 16-bit code of a ROCKETMQ binary header; use JSON".into(),
        })?;
        let version = i16::try_from(self.version).map_err(|_| ProtoError::InvalidField {
            field: "version",
            value: self.version.to_string(),
            reason: "does not fit the 16-bit version of a ROCKETMQ binary header".into(),
        })?;
        if let Some(RawExtFields::Json(_)) = &self.ext_fields_raw {
            return Err(ProtoError::InvalidField {
                field: "extFields",
                value: String::new(),
                reason: "extFields written as JSON cannot go in a ROCKETMQ binary header".into(),
            });
        }
        let raw = self
            .ext_fields_raw
            .as_ref()
            .and_then(RawExtFields::binary_area);
        debug_assert!(
            raw.is_none() || self.ext_fields.is_none(),
            "both extFields forms set"
        );
        let remark = self.remark.as_deref().unwrap_or("");
        let remark_len = len_i32(remark.len(), "remark")?;
        // One pass over the entries: the area's length is written once they are.
        let ext_room = self
            .ext_fields
            .as_ref()
            .map_or(0, |ext| ext.text_len() + 6 * ext.len());
        let raw_len = raw.map_or(0, <[u8]>::len);
        dst.reserve(ROCKETMQ_HEADER_FIXED_LEN + remark.len() + ext_room + raw_len);
        let start = dst.len();
        dst.put_i16(code);
        dst.put_u8(self.language.code());
        dst.put_i16(version);
        dst.put_i32(self.opaque);
        dst.put_i32(self.flag);
        dst.put_i32(remark_len);
        dst.extend_from_slice(remark.as_bytes());
        let ext_at = dst.len();
        dst.put_i32(0);
        if let Some(area) = raw {
            dst.extend_from_slice(area);
        } else if let Some(ext) = &self.ext_fields {
            for (k, v) in ext.iter_bytes() {
                let Ok(key_len) = i16::try_from(k.len()) else {
                    dst.truncate(start);
                    return Err(ProtoError::InvalidField {
                        field: "extFields",
                        value: String::from_utf8_lossy(k).chars().take(64).collect(),
                        reason: format!(
                            "key of {} bytes exceeds the 32767-byte limit of a ROCKETMQ binary header",
                            k.len()
                        ),
                    });
                };
                let value_len = match len_i32(v.len(), "extFields value") {
                    Ok(n) => n,
                    Err(e) => {
                        dst.truncate(start);
                        return Err(e);
                    }
                };
                dst.put_i16(key_len);
                dst.extend_from_slice(k);
                dst.put_i32(value_len);
                dst.extend_from_slice(v);
            }
        }
        let ext_len = match len_i32(dst.len() - ext_at - 4, "extFields") {
            Ok(n) => n,
            Err(e) => {
                dst.truncate(start);
                return Err(e);
            }
        };
        dst[ext_at..ext_at + 4].copy_from_slice(&ext_len.to_be_bytes());
        Ok(())
    }
}

/// `len` as a frame's int32 length field (inlined: a check on every header entry written; its
/// error is built out of line).
#[inline]
fn len_i32(len: usize, what: &'static str) -> Result<i32> {
    match i32::try_from(len) {
        Ok(n) => Ok(n),
        Err(_) => Err(too_long(len, what)),
    }
}

#[cold]
fn too_long(len: usize, what: &'static str) -> ProtoError {
    ProtoError::BadLength(format!(
        "{what} of {len} bytes does not fit an int32 length"
    ))
}

/// Writes `v` in decimal without going through `fmt`.
pub(super) fn put_decimal(dst: &mut BytesMut, v: i32) {
    dst.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Writes `s` as a JSON string with standard escaping: `\"`, `\\`, `\b`, `\f`, `\n`, `\r`,
/// `\t`, other control characters as `\u00XX`, everything else (`/`, DEL, non-ASCII) as is.
/// Runs without escapes are found eight bytes at a time and copied whole.
pub(super) fn put_json_str(dst: &mut BytesMut, bytes: &[u8]) {
    dst.reserve(bytes.len() + 2);
    dst.put_u8(b'"');
    let mut start = 0;
    loop {
        let i = json_fast::find_special(bytes, start);
        dst.extend_from_slice(&bytes[start..i]);
        let Some(&b) = bytes.get(i) else { break };
        match json_fast::ESCAPE[usize::from(b)] {
            b'u' => dst.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]),
            short => dst.extend_from_slice(&[b'\\', short]),
        }
        start = i + 1;
    }
    dst.put_u8(b'"');
}

/// `\u00XX` for each control character (one `push_str` per escape: RocketMQ's property
/// separators 0x01 and 0x02 are escaped several times in every send's header).
const CONTROL_ESCAPES: [&str; 32] = [
    "\\u0000", "\\u0001", "\\u0002", "\\u0003", "\\u0004", "\\u0005", "\\u0006", "\\u0007",
    "\\u0008", "\\u0009", "\\u000a", "\\u000b", "\\u000c", "\\u000d", "\\u000e", "\\u000f",
    "\\u0010", "\\u0011", "\\u0012", "\\u0013", "\\u0014", "\\u0015", "\\u0016", "\\u0017",
    "\\u0018", "\\u0019", "\\u001a", "\\u001b", "\\u001c", "\\u001d", "\\u001e", "\\u001f",
];

/// Appends `s` to `out` as a JSON string (quoted, escaped as the JSON header encoder escapes
/// strings), for callers writing [`RemotingCommand::ext_fields_raw`].
pub fn push_json_str(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    push_json_str_contents(out, s);
    out.push('"');
}

/// [`push_json_str`] without the quotes, for writers of a string in pieces.
pub(crate) fn push_json_str_contents(out: &mut String, s: &str) {
    let bytes = s.as_bytes();
    let mut start = 0;
    loop {
        let i = json_fast::find_special(bytes, start);
        // `i` is at a special byte (ASCII) or at the end: a character boundary.
        out.push_str(&s[start..i]);
        let Some(&b) = bytes.get(i) else { break };
        match json_fast::ESCAPE[usize::from(b)] {
            b'u' => out.push_str(CONTROL_ESCAPES[usize::from(b)]),
            short => {
                out.push('\\');
                out.push(char::from(short));
            }
        }
        start = i + 1;
    }
}

/// The byte-at-a-time `put_json_str` this module had before, kept as the reference the
/// current one must match byte for byte.
#[cfg(test)]
pub(super) fn put_json_str_reference(dst: &mut BytesMut, s: &str) {
    dst.reserve(s.len() + 2);
    dst.put_u8(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        dst.extend_from_slice(&bytes[start..i]);
        start = i + 1;
        if short.is_empty() {
            dst.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 0xf) as usize],
            ]);
        } else {
            dst.extend_from_slice(short);
        }
    }
    dst.extend_from_slice(&bytes[start..]);
    dst.put_u8(b'"');
}
