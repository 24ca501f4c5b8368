//! The stored / wire message format (spec §4): messages as producers build them
//! ([`Message`]), stored records ([`record`]) decoded into [`MessageExt`], properties
//! ([`property`]), sysFlag bits ([`sys_flag`]), body compression ([`compression`]), offset
//! message ids ([`msg_id`]), client unique keys ([`uniq_key`]) and batch bodies ([`batch`]).
//!
//! For the commit log: encode a record with [`encode_record`] (or [`MessageExt::encode`])
//! outside the append lock, then fill in queue offset, physical offset and store timestamp
//! with [`patch_record`] / [`RecordLayout::patch`] under it. Recovery and index building read
//! records with [`RecordView::parse`] / [`iter_records`] without copying bodies.

pub mod batch;
pub mod compression;
pub mod msg_id;
pub mod property;
pub mod record;
pub mod sys_flag;
pub mod uniq_key;

#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::net::SocketAddr;

use bytes::{BufMut, Bytes};

pub use batch::{
    decode_batch, decode_batch_raw, encode_batch, encode_batch_item, BatchItem, RawBatchItem,
};
pub use compression::{
    compress_body, compress_for_send, decompress_body, CompressionType, DEFAULT_COMPRESS_BODY_OVER,
    DEFAULT_COMPRESS_LEVEL, DEFAULT_MAX_DECOMPRESSED_SIZE, DEFAULT_MAX_MESSAGE_SIZE,
};
pub use msg_id::{offset_msg_id, push_offset_msg_id, push_offset_msg_id_bytes, OffsetMsgId};
pub use property::{decode_properties, encode_properties, Properties};
pub use record::{
    blank_marker, decode_record, decode_records, encode_record, encode_record_to_slice,
    iter_records, patch_record, peek_record_prefix, record_len, store_timestamp_pos, DecodeOptions,
    DecodedRun, MessageVersion, RecordFields, RecordIter, RecordLayout, RecordView,
    BLANK_MAGIC_CODE, BLANK_MARKER_LEN, MAGIC_CODE_V1, MAGIC_CODE_V2, MAX_PROPERTIES_LEN,
    MAX_TOPIC_LEN, MIN_RECORD_LEN,
};
pub use uniq_key::{UniqKey, UniqKeyGenerator};

pub use crate::hash::tags_code;
use crate::Result;

/// BODYCRC of a body (spec §4.3): CRC-32/IEEE (as `java.util.zip.CRC32`) with the top bit
/// cleared.
pub fn body_crc(body: &[u8]) -> u32 {
    crc32fast::hash(body) & 0x7FFF_FFFF
}

/// Property accessors shared by [`Message`] and [`MessageExt`].
macro_rules! property_accessors {
    () => {
        /// One property's value.
        pub fn property(&self, name: &str) -> Option<&str> {
            self.properties.get(name).map(String::as_str)
        }

        /// Sets a property (replacing an earlier value). Errors with
        /// [`crate::ProtoError::BadProperty`] if the key or value contains `\u0001` or `\u0002`.
        pub fn put_property(
            &mut self,
            name: impl Into<String>,
            value: impl Into<String>,
        ) -> Result<()> {
            let (name, value) = (name.into(), value.into());
            property::check_property(&name, &value)?;
            self.properties.insert(name, value);
            Ok(())
        }

        /// Removes a property, returning its value (the order of the others is kept).
        pub fn remove_property(&mut self, name: &str) -> Option<String> {
            self.properties.shift_remove(name)
        }

        /// The `TAGS` property.
        pub fn tags(&self) -> Option<&str> {
            self.property(property::TAGS)
        }

        /// The `KEYS` property (keys separated by a space).
        pub fn keys(&self) -> Option<&str> {
            self.property(property::KEYS)
        }

        /// The individual keys of the `KEYS` property (empty pieces skipped).
        pub fn key_list(&self) -> impl Iterator<Item = &str> + '_ {
            self.keys()
                .unwrap_or_default()
                .split(property::KEY_SEPARATOR)
                .filter(|k| !k.is_empty())
        }

        /// The `UNIQ_KEY` property (client-generated message id).
        pub fn uniq_key(&self) -> Option<&str> {
            self.property(property::UNIQ_KEY)
        }

        /// The `DELAY` level, 0 if absent or not a number.
        pub fn delay_level(&self) -> i32 {
            self.property(property::DELAY)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        }

        /// Whether the producer waits for the store flush (`WAIT`; absent ⇒ true, as Java).
        pub fn wait_store_msg_ok(&self) -> bool {
            self.property(property::WAIT).map_or(true, |v| v == "true")
        }

        /// Tag code for the consume queue (Java `String.hashCode` of `TAGS`, 0 if absent).
        pub fn tags_code(&self) -> i64 {
            tags_code(self.tags())
        }

        /// The properties encoded as the §4.4 string.
        pub fn properties_string(&self) -> Result<String> {
            encode_properties(&self.properties)
        }
    };
}

/// A message as a producer builds it: topic, user flag, properties, body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    /// Target topic.
    pub topic: String,
    /// User flag (opaque to the broker).
    pub flag: i32,
    /// Properties (tags, keys, UNIQ_KEY, …).
    pub properties: Properties,
    /// Body (uncompressed; the producer compresses it when sending).
    pub body: Bytes,
}

impl Message {
    /// A message with no flag and no properties.
    pub fn new(topic: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Message {
            topic: topic.into(),
            flag: 0,
            properties: Properties::default(),
            body: body.into(),
        }
    }

    property_accessors!();

    /// Sets the `TAGS` property.
    pub fn set_tags(&mut self, tags: impl Into<String>) -> Result<()> {
        self.put_property(property::TAGS, tags)
    }

    /// Sets the `KEYS` property from keys joined by a space.
    pub fn set_keys<I, S>(&mut self, keys: I) -> Result<()>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let joined: Vec<String> = keys.into_iter().map(|k| k.as_ref().to_owned()).collect();
        self.put_property(property::KEYS, joined.join(property::KEY_SEPARATOR))
    }

    /// Sets the `DELAY` level.
    pub fn set_delay_level(&mut self, level: i32) -> Result<()> {
        self.put_property(property::DELAY, level.to_string())
    }

    /// Sets the `WAIT` property.
    pub fn set_wait_store_msg_ok(&mut self, wait: bool) -> Result<()> {
        self.put_property(property::WAIT, if wait { "true" } else { "false" })
    }

    /// Sets the `UNIQ_KEY` property.
    pub fn set_uniq_key(&mut self, key: impl Into<String>) -> Result<()> {
        self.put_property(property::UNIQ_KEY, key)
    }
}

/// A decoded stored message (Java `MessageExt`): every field of the §4.1 record, the
/// properties parsed, and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageExt {
    /// TOTALSIZE of the record it was decoded from (recomputed on encode).
    pub store_size: i32,
    /// BODYCRC as stored (recomputed on encode).
    pub body_crc: u32,
    /// Queue id.
    pub queue_id: i32,
    /// User flag.
    pub flag: i32,
    /// Consume-queue offset.
    pub queue_offset: i64,
    /// Commit-log (physical) offset.
    pub commit_log_offset: i64,
    /// sysFlag (§4.2).
    pub sys_flag: i32,
    /// Born timestamp, ms.
    pub born_timestamp: i64,
    /// Producer address.
    pub born_host: SocketAddr,
    /// Store timestamp, ms.
    pub store_timestamp: i64,
    /// Broker address.
    pub store_host: SocketAddr,
    /// How many times the message was re-consumed.
    pub reconsume_times: i32,
    /// Prepared transaction offset (0 for normal messages).
    pub prepared_transaction_offset: i64,
    /// Body (compressed if the sysFlag's COMPRESSED bit is set).
    pub body: Bytes,
    /// Topic.
    pub topic: String,
    /// Properties.
    pub properties: Properties,
}

impl MessageExt {
    property_accessors!();

    /// The offset message id: store host + commit-log offset (§4.5).
    pub fn offset_msg_id(&self) -> String {
        offset_msg_id(self.store_host, self.commit_log_offset)
    }

    /// The message id applications see: `UNIQ_KEY` if present, else the offset message id.
    pub fn msg_id(&self) -> Cow<'_, str> {
        match self.uniq_key() {
            Some(k) => Cow::Borrowed(k),
            None => Cow::Owned(self.offset_msg_id()),
        }
    }

    /// The record fields of this message, with `properties` the encoded properties string.
    pub fn fields<'a>(&'a self, properties: &'a str) -> RecordFields<'a> {
        RecordFields {
            topic: &self.topic,
            queue_id: self.queue_id,
            flag: self.flag,
            queue_offset: self.queue_offset,
            physical_offset: self.commit_log_offset,
            sys_flag: self.sys_flag,
            born_timestamp: self.born_timestamp,
            born_host: self.born_host,
            store_timestamp: self.store_timestamp,
            store_host: self.store_host,
            reconsume_times: self.reconsume_times,
            prepared_transaction_offset: self.prepared_transaction_offset,
            body: &self.body,
            properties,
        }
    }

    /// Encodes this message as a stored record at the end of `out` (see [`encode_record`]).
    /// `store_size`, `body_crc` and the sysFlag IPv6 bits are recomputed, not copied.
    pub fn encode<B: BufMut + AsRef<[u8]>>(&self, out: &mut B) -> Result<RecordLayout> {
        let props = self.properties_string()?;
        encode_record(&self.fields(&props), out)
    }

    /// Encodes this message as a stored record into a new buffer.
    pub fn to_bytes(&self) -> Result<Bytes> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(Bytes::from(out))
    }

    /// Decompresses the body if the COMPRESSED bit is set, then clears the bit (what the Java
    /// client does). Output over `limit` bytes is an error.
    pub fn decompress_body(&mut self, limit: usize) -> Result<()> {
        if let Some(plain) = decompress_body(self.sys_flag, &self.body, limit)? {
            self.body = Bytes::from(plain);
            self.sys_flag = sys_flag::clear_compressed_flag(self.sys_flag);
        }
        Ok(())
    }
}
