//! Decoding ROCKETMQ binary headers: the fixed fields, then the extFields area (into a map,
//! or kept as it came for a caller that reads it itself), with Java's leniencies.

use super::{ExtFields, LanguageCode, RemotingCommand, SerializeType, UNKNOWN_LANGUAGE};
use crate::ext_fields::{Span, INDEX_FROM};
use crate::{ProtoError, Result};
use bytes::Bytes;
use bytestring::ByteString;

/// A bounds-checked big-endian reader over a header.
pub(super) struct HeaderReader<'a> {
    pub(super) buf: &'a [u8],
}

impl<'a> HeaderReader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(ProtoError::Truncated {
                what,
                need: n,
                have: self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    fn i16(&mut self, what: &'static str) -> Result<i16> {
        let b = self.take(2, what)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self, what: &'static str) -> Result<i32> {
        let b = self.take(4, what)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A length-prefixed string; zero length gives `None`.
    fn string(&mut self, len: i64, what: &'static str) -> Result<Option<String>> {
        let s = self.str(len, what)?;
        Ok((!s.is_empty()).then(|| s.to_owned()))
    }

    /// A length-prefixed string, borrowed.
    fn str(&mut self, len: i64, what: &'static str) -> Result<&'a str> {
        let bytes = self.bytes(len, what)?;
        std::str::from_utf8(bytes).map_err(|_| ProtoError::Utf8(what))
    }

    /// Length-prefixed bytes, borrowed.
    fn bytes(&mut self, len: i64, what: &'static str) -> Result<&'a [u8]> {
        if len < 0 {
            return Err(ProtoError::BadLength(format!(
                "negative {what} length {len}"
            )));
        }
        self.take(len as usize, what)
    }
}

/// One entry of a binary header's extFields area: `int16 keyLen | key | int32 valueLen |
/// value`, both borrowed and not yet checked as UTF-8.
pub(super) fn next_rocketmq_entry<'a>(e: &mut HeaderReader<'a>) -> Result<(&'a [u8], &'a [u8])> {
    let key_len = e.i16("extFields key length")?;
    let key = e.bytes(i64::from(key_len), "extFields key")?;
    let value_len = e.i32("extFields value length")?;
    let value = e.bytes(i64::from(value_len), "extFields value")?;
    Ok((key, value))
}

/// Where the entries of a binary extFields area are: `(key, value)` ranges of the area, in
/// order, or `None` once it ends; `Err(())` for a malformed entry (a length that is negative
/// or runs past the area: [`next_rocketmq_entry`] says which).
#[inline]
pub(crate) fn rocketmq_entry_at(
    area: &[u8],
    at: &mut usize,
) -> std::result::Result<Option<(Span, Span)>, ()> {
    let rest = &area[*at..];
    if rest.is_empty() {
        return Ok(None);
    }
    let (key_len, rest) = rest.split_first_chunk::<2>().ok_or(())?;
    let key_len = usize::try_from(i16::from_be_bytes(*key_len)).map_err(|_| ())?;
    let value_len = rest
        .get(key_len..)
        .and_then(<[u8]>::first_chunk::<4>)
        .ok_or(())?;
    let value_len = usize::try_from(i32::from_be_bytes(*value_len)).map_err(|_| ())?;
    let key_start = *at + 2;
    let value_start = key_start + key_len + 4;
    let end = value_start + value_len;
    if end > area.len() {
        return Err(());
    }
    *at = end;
    Ok(Some(((key_start, key_len), (value_start, value_len))))
}

/// A binary header's extFields area: copied once into the map's text with every length field
/// (and every dropped entry) overwritten by spaces, so the text is UTF-8 exactly when each key
/// and value is by itself
/// (an ASCII byte sits before every string and after every one but the last, so no character
/// can straddle two strings), and checked once; entries are spans of it. Entries with an empty
/// key or value are dropped; an area left with none is no extFields at all, as an empty area
/// is (so the command encodes back to itself).
///
/// One pass does it all when every key is new and there are at most `INDEX_FROM` entries (a
/// send's 14, an answer's 5): the entries are recorded while the length fields are blanked;
/// otherwise a second pass records them through the map's general path.
#[inline]
pub(super) fn decode_rocketmq_ext_fields(area: &[u8]) -> Result<Option<ExtFields>> {
    let mut text = area.to_vec();
    // An entry takes at least 8 bytes (2 + 1 + 4 + 1).
    let mut ext = ExtFields::with_text(String::new(), (area.len() / 8).min(INDEX_FROM));
    let mut one_pass = true;
    let mut entries = 0usize;
    let mut at = 0usize;
    loop {
        match rocketmq_entry_at(area, &mut at) {
            Ok(Some(((k, klen), (v, vlen)))) => {
                if klen != 0 && vlen != 0 {
                    text[k - 2..k].fill(b' ');
                    text[v - 4..v].fill(b' ');
                    entries += 1;
                    one_pass = one_pass && ext.push_new((k, klen), &area[k..k + klen], (v, vlen));
                } else {
                    // Dropped: its bytes are not checked either.
                    text[k - 2..v + vlen].fill(b' ');
                }
            }
            Ok(None) => break,
            Err(()) => return Err(rocketmq_area_error(area)),
        }
    }
    if entries == 0 {
        return Ok(None);
    }
    let text = match String::from_utf8(text) {
        Ok(t) => t,
        // Which string is bad, for the error.
        Err(_) => return Err(first_bad_rocketmq_string(area)),
    };
    if one_pass {
        ext.set_text(text);
        return Ok(Some(ext));
    }
    let mut ext = ExtFields::with_text(text, entries);
    let mut at = 0usize;
    while let Ok(Some((key, value))) = rocketmq_entry_at(area, &mut at) {
        if key.1 != 0 && value.1 != 0 {
            ext.record_spans_of(key, &area[key.0..key.0 + key.1], value);
        }
    }
    ext.finish_spans();
    Ok(Some(ext))
}

/// The error of the first malformed entry of a binary extFields area.
#[cold]
fn rocketmq_area_error(area: &[u8]) -> ProtoError {
    let mut e = HeaderReader { buf: area };
    while !e.buf.is_empty() {
        if let Err(err) = next_rocketmq_entry(&mut e) {
            return err;
        }
    }
    ProtoError::BadLength("malformed extFields area".into())
}

/// The error of the first kept key or value of a binary extFields area that is not UTF-8 by
/// itself.
fn first_bad_rocketmq_string(area: &[u8]) -> ProtoError {
    let mut e = HeaderReader { buf: area };
    while !e.buf.is_empty() {
        let (key, value) = match next_rocketmq_entry(&mut e) {
            Ok(kv) => kv,
            Err(err) => return err,
        };
        if key.is_empty() || value.is_empty() {
            continue;
        }
        if std::str::from_utf8(key).is_err() {
            return ProtoError::Utf8("extFields key");
        }
        if std::str::from_utf8(value).is_err() {
            return ProtoError::Utf8("extFields value");
        }
    }
    ProtoError::Utf8("extFields value")
}

pub(super) fn decode_rocketmq_header(header: &[u8]) -> Result<RemotingCommand> {
    let (mut cmd, area) = decode_rocketmq_fixed(header)?;
    if !area.is_empty() {
        cmd.ext_fields = decode_rocketmq_ext_fields(area)?;
    }
    Ok(cmd)
}

/// `area` (a slice of `frame`) as a [`RawExtFields::BinaryArea`], if it qualifies: well
/// formed, at least one entry, no empty key or value (the map drops those), every length
/// field's bytes ASCII and the whole area UTF-8. The last two make every key and value UTF-8
/// by itself: each is bounded by ASCII bytes or the area's ends, and an ASCII byte is never
/// inside a character. Anything else is left to the map's decode (and its errors).
#[inline]
pub(super) fn keepable_area(frame: &Bytes, area: &[u8]) -> Option<ByteString> {
    if area.is_empty() {
        return None;
    }
    let mut at = 0;
    while let Some(((_, kl), (_, vl))) = rocketmq_entry_at(area, &mut at).ok()? {
        let lengths = (kl as u64) << 32 | vl as u64;
        if kl == 0 || vl == 0 || lengths & 0x0000_8080_8080_8080 != 0 {
            return None;
        }
    }
    let start = area.as_ptr() as usize - frame.as_ptr() as usize;
    ByteString::try_from(frame.slice(start..start + area.len())).ok()
}

/// A binary header's fixed fields and remark (the command, without extFields or body) and
/// its extFields area.
#[inline]
pub(super) fn decode_rocketmq_fixed(header: &[u8]) -> Result<(RemotingCommand, &[u8])> {
    let mut r = HeaderReader { buf: header };
    let code = r.i16("binary header code")?;
    let language =
        LanguageCode::from_code(r.u8("binary header language")?).unwrap_or(UNKNOWN_LANGUAGE);
    let version = r.i16("binary header version")?;
    let opaque = r.i32("binary header opaque")?;
    let flag = r.i32("binary header flag")?;
    let remark_len = r.i32("binary header remark length")?;
    let remark = r.string(i64::from(remark_len), "binary header remark")?;
    let ext_len = r.i32("binary header extFields length")?;
    if ext_len < 0 {
        return Err(ProtoError::BadLength(format!(
            "negative extFields length {ext_len}"
        )));
    }
    let ext_area = r.take(ext_len as usize, "binary header extFields")?;
    let cmd = RemotingCommand {
        code: i32::from(code),
        language,
        version: i32::from(version),
        opaque,
        flag,
        remark,
        ext_fields: None,
        ext_fields_raw: None,
        serialize_type: SerializeType::RocketMq,
        body: None,
    };
    Ok((cmd, ext_area))
}
