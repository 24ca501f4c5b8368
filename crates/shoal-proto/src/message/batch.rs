//! SEND_BATCH_MESSAGE body (spec §4.7): a concatenation of items
//! `TOTALSIZE | MAGICCODE=0 | BODYCRC=0 | FLAG | bodyLen + body | propsLen (short) + props`.

use bytes::{BufMut, Bytes};

use super::property::{decode_properties_bytes, encode_properties, Properties};
use super::record::MAX_PROPERTIES_LEN;
use super::Message;
use crate::{ProtoError, Result};

/// Fixed part of a batch item: TOTALSIZE, MAGICCODE, BODYCRC, FLAG, body length (4 each) and
/// the properties length (2).
pub const BATCH_ITEM_OVERHEAD: usize = 4 + 4 + 4 + 4 + 4 + 2;

/// One message of a batch body, as the broker decodes it (the topic is the batch's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchItem {
    /// User flag.
    pub flag: i32,
    /// Body.
    pub body: Bytes,
    /// The item's own properties.
    pub properties: Properties,
}

impl BatchItem {
    /// The item as a [`Message`] of `topic`.
    pub fn into_message(self, topic: impl Into<String>) -> Message {
        Message {
            topic: topic.into(),
            flag: self.flag,
            properties: self.properties,
            body: self.body,
        }
    }
}

/// Appends one batch item to `out`, with its already encoded properties string.
/// Errors if the properties exceed 32767 bytes or the item exceeds `i32::MAX` bytes.
pub fn encode_batch_item<B: BufMut>(
    flag: i32,
    body: &[u8],
    properties: &str,
    out: &mut B,
) -> Result<()> {
    if properties.len() > MAX_PROPERTIES_LEN {
        return Err(ProtoError::BadLength(format!(
            "batch item properties are {} bytes, the limit is {MAX_PROPERTIES_LEN}",
            properties.len()
        )));
    }
    let total = BATCH_ITEM_OVERHEAD + body.len() + properties.len();
    let total = i32::try_from(total).map_err(|_| {
        ProtoError::BadLength(format!("batch item of {total} bytes exceeds i32::MAX"))
    })?;
    out.put_i32(total);
    out.put_i32(0);
    out.put_i32(0);
    out.put_i32(flag);
    out.put_i32(body.len() as i32);
    out.put_slice(body);
    out.put_i16(properties.len() as i16);
    out.put_slice(properties.as_bytes());
    Ok(())
}

/// Encodes messages into a SEND_BATCH_MESSAGE body (topics are not part of it).
pub fn encode_batch<'a, I>(messages: I) -> Result<Vec<u8>>
where
    I: IntoIterator<Item = &'a Message>,
{
    let mut out = Vec::new();
    for m in messages {
        let props = encode_properties(&m.properties)?;
        encode_batch_item(m.flag, &m.body, &props, &mut out)?;
    }
    Ok(out)
}

fn read_i32(buf: &[u8], at: usize, what: &'static str) -> Result<i32> {
    buf.get(at..at + 4)
        .and_then(|s| <[u8; 4]>::try_from(s).ok())
        .map(i32::from_be_bytes)
        .ok_or(ProtoError::Truncated {
            what,
            need: at + 4,
            have: buf.len(),
        })
}

/// Decodes a SEND_BATCH_MESSAGE body into its items (bodies share `body`).
///
/// Every length is checked: TOTALSIZE must equal the item's field lengths and fit in the
/// buffer. MAGICCODE and BODYCRC are ignored, as the Java broker ignores them.
pub fn decode_batch(body: &Bytes) -> Result<Vec<BatchItem>> {
    decode_batch_raw(body)?
        .into_iter()
        .map(|raw| {
            Ok(BatchItem {
                flag: raw.flag,
                body: raw.body,
                properties: decode_properties_bytes(&raw.properties)?,
            })
        })
        .collect()
}

/// A batch item as it came: its properties still in their encoded form (UTF-8 not checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawBatchItem {
    /// The item's flag.
    pub flag: i32,
    /// The item's body (shares the batch body's buffer).
    pub body: Bytes,
    /// The item's encoded properties (spec 4.4; shares the batch body's buffer).
    pub properties: Bytes,
}

/// As [`decode_batch`], with every length checked the same way, but the items' properties
/// are left encoded: a broker that stores them as they came needs no map per item.
pub fn decode_batch_raw(body: &Bytes) -> Result<Vec<RawBatchItem>> {
    let mut items = Vec::new();
    let mut pos = 0;
    while pos < body.len() {
        let rest = body.get(pos..).unwrap_or_default();
        let total = read_i32(rest, 0, "batch item TOTALSIZE")?;
        let total = usize::try_from(total)
            .ok()
            .filter(|t| *t >= BATCH_ITEM_OVERHEAD)
            .ok_or_else(|| ProtoError::BadLength(format!("batch item TOTALSIZE {total}")))?;
        let item = rest.get(..total).ok_or(ProtoError::Truncated {
            what: "batch item",
            need: total,
            have: rest.len(),
        })?;
        let flag = read_i32(item, 12, "batch item FLAG")?;
        let body_len = read_i32(item, 16, "batch item body length")?;
        let body_len = usize::try_from(body_len)
            .ok()
            .filter(|n| *n <= total - BATCH_ITEM_OVERHEAD)
            .ok_or_else(|| {
                ProtoError::BadLength(format!(
                    "batch item body length {body_len} does not fit TOTALSIZE {total}"
                ))
            })?;
        let props_at = 20 + body_len;
        let props_len = item
            .get(props_at..props_at + 2)
            .and_then(|s| <[u8; 2]>::try_from(s).ok())
            .map(i16::from_be_bytes)
            .ok_or(ProtoError::Truncated {
                what: "batch item properties length",
                need: props_at + 2,
                have: item.len(),
            })?;
        let props_len = usize::try_from(props_len).map_err(|_| {
            ProtoError::BadLength(format!("negative batch item properties length {props_len}"))
        })?;
        if BATCH_ITEM_OVERHEAD + body_len + props_len != total {
            return Err(ProtoError::BadLength(format!(
                "batch item TOTALSIZE {total} disagrees with body length {body_len} and \
                 properties length {props_len}"
            )));
        }
        items.push(RawBatchItem {
            flag,
            body: body.slice(pos + 20..pos + 20 + body_len),
            properties: body.slice(pos + props_at + 2..pos + total),
        });
        pos += total;
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_example() {
        let mut m = Message::new("T", &b"hello"[..]);
        m.put_property("UNIQ_KEY", "X1").unwrap();
        m.put_property("WAIT", "true").unwrap();
        m.put_property("TAGS", "tagA").unwrap();
        let expected: Vec<u8> = [
            0x00, 0x00, 0x00, 0x3b, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x05, 0x68, 0x65, 0x6c, 0x6c, 0x6f, 0x00, 0x20, 0x55,
            0x4e, 0x49, 0x51, 0x5f, 0x4b, 0x45, 0x59, 0x01, 0x58, 0x31, 0x02, 0x57, 0x41, 0x49,
            0x54, 0x01, 0x74, 0x72, 0x75, 0x65, 0x02, 0x54, 0x41, 0x47, 0x53, 0x01, 0x74, 0x61,
            0x67, 0x41, 0x02,
        ]
        .to_vec();
        let encoded = encode_batch([&m]).unwrap();
        assert_eq!(encoded, expected);
        let items = decode_batch(&Bytes::from(expected)).unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].clone().into_message("T"), m);
    }

    #[test]
    fn lying_lengths_are_errors() {
        let m = Message::new("T", &b"hello"[..]);
        let good = encode_batch([&m, &m]).unwrap();
        assert_eq!(decode_batch(&Bytes::from(good.clone())).unwrap().len(), 2);
        for cut in 1..good.len() {
            if cut == good.len() / 2 {
                continue;
            }
            assert!(
                decode_batch(&Bytes::copy_from_slice(&good[..cut])).is_err(),
                "{cut}"
            );
        }
        let mut bad = good.clone();
        bad[3] += 1; // TOTALSIZE one too big
        assert!(decode_batch(&Bytes::from(bad)).is_err());
        let mut bad = good.clone();
        bad[19] = 0xff; // body length too big
        assert!(decode_batch(&Bytes::from(bad)).is_err());
        let mut bad = good;
        bad[16] = 0x80; // negative body length
        assert!(decode_batch(&Bytes::from(bad)).is_err());
        assert!(decode_batch(&Bytes::new()).unwrap().is_empty());
    }
}
