//! Topic configuration bodies (spec 3.5): TopicConfig, DataVersion, the topic config
//! wrappers (GET_ALL_TOPIC_CONFIG) and RegisterBrokerBody with its compressed variant.

use super::enums::TopicFilterType;
use crate::constants::perm;
use crate::{ProtoError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};

/// A topic's configuration on a broker (`org.apache.rocketmq.common.TopicConfig`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TopicConfig {
    /// Attributes, e.g. `message.type` → `NORMAL`.
    pub attributes: BTreeMap<String, String>,
    /// Ordered topic.
    pub order: bool,
    /// Permission bits (6 = read | write).
    pub perm: i32,
    /// Number of readable queues (Java default 16).
    pub read_queue_nums: i32,
    /// Filter type.
    pub topic_filter_type: TopicFilterType,
    /// Topic name.
    pub topic_name: String,
    /// Topic sysFlag.
    pub topic_sys_flag: i32,
    /// Number of writable queues (Java default 16).
    pub write_queue_nums: i32,
}

impl Default for TopicConfig {
    fn default() -> Self {
        Self {
            attributes: BTreeMap::new(),
            order: false,
            perm: perm::PERM_READ_WRITE,
            read_queue_nums: 16,
            topic_filter_type: TopicFilterType::SingleTag,
            topic_name: String::new(),
            topic_sys_flag: 0,
            write_queue_nums: 16,
        }
    }
}

impl TopicConfig {
    /// A topic with `queues` read and write queues and the default permission.
    pub fn new(name: impl Into<String>, queues: i32) -> Self {
        Self {
            topic_name: name.into(),
            read_queue_nums: queues,
            write_queue_nums: queues,
            ..Self::default()
        }
    }

    /// Java's `TopicConfig.encode`, used inside the compressed REGISTER_BROKER body:
    /// `"<topicName> <readQ> <writeQ> <perm> <filterType> <attributesJSON>"`.
    pub fn encode_text(&self) -> String {
        let attributes = serde_json::to_string(&self.attributes).unwrap_or_else(|_| "{}".into());
        format!(
            "{} {} {} {} {} {}",
            self.topic_name,
            self.read_queue_nums,
            self.write_queue_nums,
            self.perm,
            self.topic_filter_type,
            attributes
        )
    }

    /// Java's `TopicConfig.decode`. Fewer than five fields, a bad number or an unknown filter
    /// type is an error; unparsable attributes are ignored as Java does (empty map). `order`
    /// and `topicSysFlag` are not part of the text and take their defaults.
    pub fn decode_text(text: &str) -> Result<Self> {
        let bad = |why: &str| ProtoError::Invalid(format!("bad topic config text {text:?}: {why}"));
        let mut parts = text.splitn(6, ' ');
        let mut next = |what: &str| parts.next().ok_or_else(|| bad(&format!("missing {what}")));
        let topic_name = next("topic name")?.to_owned();
        let read_queue_nums = next("readQueueNums")?
            .parse()
            .map_err(|_| bad("readQueueNums"))?;
        let write_queue_nums = next("writeQueueNums")?
            .parse()
            .map_err(|_| bad("writeQueueNums"))?;
        let perm = next("perm")?.parse().map_err(|_| bad("perm"))?;
        let filter = next("topicFilterType")?;
        let topic_filter_type =
            TopicFilterType::from_name(filter).ok_or_else(|| bad("topicFilterType"))?;
        let attributes = parts
            .next()
            .and_then(|a| serde_json::from_str(a).ok())
            .unwrap_or_default();
        Ok(Self {
            attributes,
            order: false,
            perm,
            read_queue_nums,
            topic_filter_type,
            topic_name,
            topic_sys_flag: 0,
            write_queue_nums,
        })
    }
}

/// RocketMQ 5's topic message types (the topic attribute `message.type`). A topic with the
/// attribute takes only messages of its type (MIXED takes every type); a topic without it
/// takes every type too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum TopicMessageType {
    /// No type set.
    Unspecified,
    /// Plain messages.
    Normal,
    /// Messages with a message group (sharding key), consumed in order per group.
    Fifo,
    /// Delayed or timed messages.
    Delay,
    /// Transactional (half) messages.
    Transaction,
    /// Every type.
    Mixed,
}

impl TopicMessageType {
    /// The topic attribute that holds the type.
    pub const ATTRIBUTE: &'static str = "message.type";

    /// The types a producer may set on a message (what a topic of no type accepts).
    pub const MESSAGE_TYPES: [TopicMessageType; 4] = [
        TopicMessageType::Normal,
        TopicMessageType::Fifo,
        TopicMessageType::Delay,
        TopicMessageType::Transaction,
    ];

    /// The name RocketMQ writes.
    pub fn name(self) -> &'static str {
        match self {
            TopicMessageType::Unspecified => "UNSPECIFIED",
            TopicMessageType::Normal => "NORMAL",
            TopicMessageType::Fifo => "FIFO",
            TopicMessageType::Delay => "DELAY",
            TopicMessageType::Transaction => "TRANSACTION",
            TopicMessageType::Mixed => "MIXED",
        }
    }

    /// Parses a name (any case).
    pub fn parse(s: &str) -> Option<Self> {
        [
            TopicMessageType::Unspecified,
            TopicMessageType::Normal,
            TopicMessageType::Fifo,
            TopicMessageType::Delay,
            TopicMessageType::Transaction,
            TopicMessageType::Mixed,
        ]
        .into_iter()
        .find(|t| t.name().eq_ignore_ascii_case(s.trim()))
    }

    /// A message's type from its properties, as RocketMQ decides it: TRAN_MSG=true is
    /// TRANSACTION; a delay level or a timer property is DELAY; a sharding key (message group)
    /// is FIFO; anything else NORMAL.
    pub fn of_message<'a>(property: impl Fn(&str) -> Option<&'a str>) -> Self {
        use crate::message::property as p;
        if property(p::TRAN_MSG) == Some("true") {
            TopicMessageType::Transaction
        } else if [
            p::DELAY,
            p::TIMER_DELIVER_MS,
            p::TIMER_DELAY_SEC,
            p::TIMER_DELAY_MS,
        ]
        .iter()
        .any(|k| property(k).is_some())
        {
            TopicMessageType::Delay
        } else if property(p::SHARDING_KEY).is_some() {
            TopicMessageType::Fifo
        } else {
            TopicMessageType::Normal
        }
    }

    /// Whether a topic of this type takes a message of type `message`.
    pub fn accepts(self, message: TopicMessageType) -> bool {
        matches!(
            self,
            TopicMessageType::Unspecified | TopicMessageType::Mixed
        ) || self == message
    }

    /// The message types a topic of this type takes (for routes: what clients may send).
    pub fn accepted(self) -> Vec<TopicMessageType> {
        match self {
            TopicMessageType::Unspecified | TopicMessageType::Mixed => Self::MESSAGE_TYPES.to_vec(),
            t => vec![t],
        }
    }
}

impl std::fmt::Display for TopicMessageType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl TopicConfig {
    /// The topic's message type (UNSPECIFIED when it has none, or one RocketMQ does not
    /// define).
    pub fn message_type(&self) -> TopicMessageType {
        self.attributes
            .get(TopicMessageType::ATTRIBUTE)
            .and_then(|t| TopicMessageType::parse(t))
            .unwrap_or(TopicMessageType::Unspecified)
    }
}

/// A version stamp of a broker's configuration tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DataVersion {
    /// Change counter.
    pub counter: i64,
    /// State version.
    pub state_version: i64,
    /// Time of the last change, ms.
    pub timestamp: i64,
}

impl DataVersion {
    /// A version at `timestamp` with counter 0.
    pub fn new(timestamp: i64) -> Self {
        Self {
            counter: 0,
            state_version: 0,
            timestamp,
        }
    }

    /// Java's `nextVersion`: counter + 1 and a new timestamp.
    pub fn next_version(&mut self, now_ms: i64) {
        self.timestamp = now_ms;
        self.counter = self.counter.wrapping_add(1);
    }
}

/// Topic configs of a broker with their data version (older form).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TopicConfigSerializeWrapper {
    /// Data version.
    pub data_version: DataVersion,
    /// Topic name → config.
    pub topic_config_table: BTreeMap<String, TopicConfig>,
}

/// Topic configs plus static-topic mappings: the GET_ALL_TOPIC_CONFIG body and the
/// `topicConfigSerializeWrapper` of RegisterBrokerBody.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TopicConfigAndMappingSerializeWrapper {
    /// Data version of the topic table.
    pub data_version: DataVersion,
    /// Data version of the mapping tables.
    pub mapping_data_version: DataVersion,
    /// Topic name → config.
    pub topic_config_table: BTreeMap<String, TopicConfig>,
    /// Static-topic mapping details (passed through untyped).
    pub topic_queue_mapping_detail_map: BTreeMap<String, serde_json::Value>,
    /// Static-topic mapping infos (passed through untyped).
    pub topic_queue_mapping_info_map: BTreeMap<String, serde_json::Value>,
}

impl From<TopicConfigSerializeWrapper> for TopicConfigAndMappingSerializeWrapper {
    fn from(w: TopicConfigSerializeWrapper) -> Self {
        Self {
            data_version: w.data_version,
            topic_config_table: w.topic_config_table,
            ..Self::default()
        }
    }
}

/// REGISTER_BROKER body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RegisterBrokerBody {
    /// Filter server addresses.
    pub filter_server_list: Vec<String>,
    /// The broker's topics.
    pub topic_config_serialize_wrapper: TopicConfigAndMappingSerializeWrapper,
}

/// Broker version (MQVersion ordinal of V5_0_0) from which the compressed body carries the
/// static-topic mapping section.
pub const V5_0_0: i32 = 413;

/// Largest decompressed REGISTER_BROKER body accepted (a guard against zip bombs).
pub const MAX_DECOMPRESSED_REGISTER_BODY: usize = 256 * 1024 * 1024;

impl RegisterBrokerBody {
    /// The compressed layout of spec 3.5 (header `compressed=true`): a zlib stream (level 9)
    /// of length-prefixed DataVersion JSON, topic configs in text form, filter server list JSON
    /// and the mapping infos.
    pub fn encode_compressed(&self) -> Result<Vec<u8>> {
        let io = |e: std::io::Error| ProtoError::Compression(e.to_string());
        let json = |e: serde_json::Error| ProtoError::Json {
            what: "RegisterBrokerBody",
            reason: e.to_string(),
        };
        let wrapper = &self.topic_config_serialize_wrapper;
        let mut raw = Vec::new();
        put_chunk(
            &mut raw,
            &serde_json::to_vec(&wrapper.data_version).map_err(json)?,
        )?;
        put_len(&mut raw, wrapper.topic_config_table.len())?;
        for config in wrapper.topic_config_table.values() {
            put_chunk(&mut raw, config.encode_text().as_bytes())?;
        }
        put_chunk(
            &mut raw,
            &serde_json::to_vec(&self.filter_server_list).map_err(json)?,
        )?;
        put_len(&mut raw, wrapper.topic_queue_mapping_info_map.len())?;
        for info in wrapper.topic_queue_mapping_info_map.values() {
            put_chunk(&mut raw, &serde_json::to_vec(info).map_err(json)?)?;
        }
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(&raw).map_err(io)?;
        encoder.finish().map_err(io)
    }

    /// Decodes the compressed layout. `broker_version` is the REGISTER_BROKER command's
    /// `version`: from [`V5_0_0`] on, the mapping section is read (mapping infos are keyed by
    /// their `topic` field).
    pub fn decode_compressed(data: &[u8], broker_version: i32) -> Result<Self> {
        let mut raw = Vec::new();
        flate2::read::ZlibDecoder::new(data)
            .take(MAX_DECOMPRESSED_REGISTER_BODY as u64 + 1)
            .read_to_end(&mut raw)
            .map_err(|e| ProtoError::Compression(e.to_string()))?;
        if raw.len() > MAX_DECOMPRESSED_REGISTER_BODY {
            return Err(ProtoError::Compression(format!(
                "decompressed REGISTER_BROKER body exceeds {MAX_DECOMPRESSED_REGISTER_BODY} bytes"
            )));
        }
        let json = |e: serde_json::Error| ProtoError::Json {
            what: "compressed RegisterBrokerBody",
            reason: e.to_string(),
        };
        let mut cur = Cursor { buf: &raw, pos: 0 };
        let mut body = RegisterBrokerBody::default();
        let wrapper = &mut body.topic_config_serialize_wrapper;
        wrapper.data_version = serde_json::from_slice(cur.chunk("data version")?).map_err(json)?;
        let topics = cur.count("topic count")?;
        for _ in 0..topics {
            let text = std::str::from_utf8(cur.chunk("topic config")?)
                .map_err(|_| ProtoError::Utf8("topic config"))?;
            let config = TopicConfig::decode_text(text)?;
            wrapper
                .topic_config_table
                .insert(config.topic_name.clone(), config);
        }
        body.filter_server_list =
            serde_json::from_slice(cur.chunk("filter server list")?).map_err(json)?;
        if broker_version >= V5_0_0 {
            let mappings = cur.count("mapping count")?;
            for _ in 0..mappings {
                let info: serde_json::Value =
                    serde_json::from_slice(cur.chunk("mapping info")?).map_err(json)?;
                let topic = info
                    .get("topic")
                    .and_then(|t| t.as_str())
                    .unwrap_or_default()
                    .to_owned();
                body.topic_config_serialize_wrapper
                    .topic_queue_mapping_info_map
                    .insert(topic, info);
            }
        }
        Ok(body)
    }
}

fn put_len(out: &mut Vec<u8>, len: usize) -> Result<()> {
    let len = i32::try_from(len)
        .map_err(|_| ProtoError::BadLength(format!("{len} does not fit a Java int")))?;
    out.extend_from_slice(&len.to_be_bytes());
    Ok(())
}

fn put_chunk(out: &mut Vec<u8>, chunk: &[u8]) -> Result<()> {
    put_len(out, chunk.len())?;
    out.extend_from_slice(chunk);
    Ok(())
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        let have = self.buf.len() - self.pos;
        if n > have {
            return Err(ProtoError::Truncated {
                what,
                need: n,
                have,
            });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn count(&mut self, what: &'static str) -> Result<usize> {
        let bytes = self.take(4, what)?;
        let n = i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        usize::try_from(n).map_err(|_| ProtoError::BadLength(format!("negative {what}: {n}")))
    }

    fn chunk(&mut self, what: &'static str) -> Result<&'a [u8]> {
        let n = self.count(what)?;
        self.take(n, what)
    }
}
