//! Producer headers: SEND_MESSAGE (10) and its V2 form (310, 320, 325), END_TRANSACTION (37),
//! CHECK_TRANSACTION_STATE (39). Spec section 2.2.

use super::{
    command_header, parse_java_bool, plain_digits, EmptyHeader, HeaderField, HeaderValue, RpcFields,
};
use crate::command::{ExtFields, RawExtFields, RemotingCommand};
use crate::{ProtoError, Result};
use bytestring::ByteString;

command_header! {
    /// SEND_MESSAGE (10) request header with Java field names. Java producers actually send
    /// [`SendMessageRequestHeaderV2`]; convert with `From`.
    pub struct SendMessageRequestHeader [rpc] {
        /// Producer group.
        producer_group: String = "producerGroup";
        /// Target topic.
        topic: String = "topic";
        /// Auto-create template topic (`TBW102`).
        default_topic: String = "defaultTopic";
        /// Queue count of an auto-created topic (4).
        default_topic_queue_nums: i32 = "defaultTopicQueueNums";
        /// Queue id; negative lets the broker pick.
        queue_id: i32 = "queueId";
        /// Message sysFlag (spec 4.2).
        sys_flag: i32 = "sysFlag";
        /// Born timestamp, ms.
        born_timestamp: i64 = "bornTimestamp";
        /// User flag.
        flag: i32 = "flag";
        /// Encoded properties (spec 4.4).
        properties: Option<String> = "properties";
        /// Reconsume times (retry topics).
        reconsume_times: Option<i32> = "reconsumeTimes";
        /// Unit mode.
        unit_mode: Option<bool> = "unitMode";
        /// True for SEND_BATCH_MESSAGE.
        batch: Option<bool> = "batch";
        /// Max reconsume times (retry topics).
        max_reconsume_times: Option<i32> = "maxReconsumeTimes";
    }
}

command_header! {
    /// The one-letter form of [`SendMessageRequestHeader`] used by SEND_MESSAGE_V2 (310),
    /// SEND_BATCH_MESSAGE (320) and SEND_REPLY_MESSAGE_V2 (325): `a`…`n`.
    pub struct SendMessageRequestHeaderV2 [rpc] {
        /// `producerGroup`.
        a: String = "a";
        /// `topic`.
        b: String = "b";
        /// `defaultTopic`.
        c: String = "c";
        /// `defaultTopicQueueNums`.
        d: i32 = "d";
        /// `queueId`.
        e: i32 = "e";
        /// `sysFlag`.
        f: i32 = "f";
        /// `bornTimestamp`.
        g: i64 = "g";
        /// `flag`.
        h: i32 = "h";
        /// `properties`.
        i: Option<String> = "i";
        /// `reconsumeTimes`.
        j: Option<i32> = "j";
        /// `unitMode`.
        k: Option<bool> = "k";
        /// `maxReconsumeTimes`.
        l: Option<i32> = "l";
        /// `batch`.
        m: Option<bool> = "m";
        /// `brokerName` (the V1 header's `bname`).
        n: Option<String> = "n";
    }
}

impl From<SendMessageRequestHeaderV2> for SendMessageRequestHeader {
    /// Java's `createSendMessageRequestHeaderV1`; `n` becomes `bname` (falling back to a
    /// `bname` the V2 header itself carried).
    fn from(v2: SendMessageRequestHeaderV2) -> Self {
        let broker_name = v2.n.or(v2.rpc.broker_name);
        Self {
            producer_group: v2.a,
            topic: v2.b,
            default_topic: v2.c,
            default_topic_queue_nums: v2.d,
            queue_id: v2.e,
            sys_flag: v2.f,
            born_timestamp: v2.g,
            flag: v2.h,
            properties: v2.i,
            reconsume_times: v2.j,
            unit_mode: v2.k,
            batch: v2.m,
            max_reconsume_times: v2.l,
            rpc: RpcFields {
                broker_name,
                ..v2.rpc
            },
        }
    }
}

impl From<SendMessageRequestHeader> for SendMessageRequestHeaderV2 {
    /// Java's `createSendMessageRequestHeaderV2`; `bname` becomes `n`.
    fn from(v1: SendMessageRequestHeader) -> Self {
        Self {
            a: v1.producer_group,
            b: v1.topic,
            c: v1.default_topic,
            d: v1.default_topic_queue_nums,
            e: v1.queue_id,
            f: v1.sys_flag,
            g: v1.born_timestamp,
            h: v1.flag,
            i: v1.properties,
            j: v1.reconsume_times,
            k: v1.unit_mode,
            l: v1.max_reconsume_times,
            m: v1.batch,
            n: v1.rpc.broker_name,
            rpc: RpcFields {
                broker_name: None,
                ..v1.rpc
            },
        }
    }
}

command_header! {
    /// Response header of the send family. A Java client needs it on every SUCCESS.
    pub struct SendMessageResponseHeader {
        /// Offset message id (comma-joined for a batch).
        msg_id: String = "msgId";
        /// Queue the message was stored in.
        queue_id: i32 = "queueId";
        /// Consume-queue offset of the (first) message.
        queue_offset: i64 = "queueOffset";
        /// The message's UNIQ_KEY.
        transaction_id: Option<String> = "transactionId";
        /// Batch unique id (inner-batch topics).
        batch_uniq_id: Option<String> = "batchUniqId";
        /// Recall handle (5.x).
        recall_handle: Option<String> = "recallHandle";
        /// Region id the broker adds (`DefaultRegion`).
        msg_region: Option<String> = "MSG_REGION";
        /// Trace switch the broker adds.
        trace_on: Option<bool> = "TRACE_ON";
    }
}

/// What a broker reads of a send request's header (SEND_MESSAGE's Java field names, or the
/// one-letter keys of SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE), borrowed from the command's
/// extFields: the same fields, rules and errors as [`SendMessageRequestHeader`] and
/// [`SendMessageRequestHeaderV2`] (less the RPC fields), without a `String` per field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendHeaderRef<'a> {
    /// Producer group (`producerGroup` / `a`).
    pub producer_group: &'a str,
    /// Target topic (`topic` / `b`).
    pub topic: &'a str,
    /// Auto-create template topic (`defaultTopic` / `c`).
    pub default_topic: &'a str,
    /// Queue count of an auto-created topic (`defaultTopicQueueNums` / `d`).
    pub default_topic_queue_nums: i32,
    /// Queue id; negative lets the broker pick (`queueId` / `e`).
    pub queue_id: i32,
    /// Message sysFlag (`sysFlag` / `f`).
    pub sys_flag: i32,
    /// Born timestamp, ms (`bornTimestamp` / `g`).
    pub born_timestamp: i64,
    /// User flag (`flag` / `h`).
    pub flag: i32,
    /// Encoded properties (`properties` / `i`).
    pub properties: Option<&'a str>,
    /// Reconsume times (`reconsumeTimes` / `j`).
    pub reconsume_times: Option<i32>,
    /// Unit mode (`unitMode` / `k`).
    pub unit_mode: Option<bool>,
    /// Max reconsume times (`maxReconsumeTimes` / `l`).
    pub max_reconsume_times: Option<i32>,
    /// Batch (`batch` / `m`).
    pub batch: Option<bool>,
}

/// The keys of [`SendHeaderRef`]'s fields in its order, Java names then one-letter ones (the
/// lookup in [`SendHeaderRef::decode`] matches them in the same order).
const SEND_KEYS: [[&str; 13]; 2] = [
    [
        "producerGroup",
        "topic",
        "defaultTopic",
        "defaultTopicQueueNums",
        "queueId",
        "sysFlag",
        "bornTimestamp",
        "flag",
        "properties",
        "reconsumeTimes",
        "unitMode",
        "maxReconsumeTimes",
        "batch",
    ],
    [
        "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m",
    ],
];

impl<'a> SendHeaderRef<'a> {
    /// Reads the header from `ext` in one pass over its keys: with the one-letter keys of V2 when
    /// `one_letter`, else with Java's field names. Fails as the owned headers do: a missing
    /// required field is [`ProtoError::MissingField`], a bad number
    /// [`ProtoError::InvalidField`].
    pub fn decode(ext: &'a ExtFields, one_letter: bool) -> Result<Self> {
        let found: [Option<&'a str>; 13] = if one_letter {
            // Keys `a` to `m`, in the order of `SEND_KEYS`.
            ext.letter_values(b'a')
        } else {
            // Keys are matched as bytes; only the values of the fields found are sliced as text.
            let mut found = [None; 13];
            for (key, value) in ext.iter_keyed() {
                if let Some(i) = long_key_index(key) {
                    found[i] = Some(value);
                }
            }
            found
        };
        Self::from_found(found, one_letter)
    }

    /// Reads the header of a send request from whichever form its extFields came in: the map,
    /// or the binary area the decoder kept ([`RawExtFields::BinaryArea`], see
    /// [`RemotingCommand::decode_with`]); no extFields read as an empty map. V2's one-letter
    /// keys unless the code is SEND_MESSAGE.
    pub fn of_request(req: &'a RemotingCommand) -> Result<Self> {
        static NO_FIELDS: ExtFields = ExtFields::new();
        let one_letter = req.code != crate::code::request_code::SEND_MESSAGE;
        match (&req.ext_fields, &req.ext_fields_raw) {
            (None, Some(RawExtFields::BinaryArea(area))) => Self::decode_area(area, one_letter),
            (ext, _) => Self::decode(ext.as_ref().unwrap_or(&NO_FIELDS), one_letter),
        }
    }

    /// [`SendHeaderRef::decode`] over a kept binary area: the same fields, rules and errors as
    /// over the map the area decodes to (a later entry of a key wins, as in the map).
    pub fn decode_area(area: &'a ByteString, one_letter: bool) -> Result<Self> {
        let text: &'a str = area;
        let bytes = text.as_bytes();
        let mut found: [Option<&'a str>; 13] = [None; 13];
        let mut at = 0;
        while let Ok(Some(((k, kl), (v, vl)))) = crate::command::rocketmq_entry_at(bytes, &mut at) {
            let i = if one_letter {
                match bytes[k..k + kl] {
                    [letter @ b'a'..=b'm'] => usize::from(letter - b'a'),
                    _ => continue,
                }
            } else {
                match long_key_index(&bytes[k..k + kl]) {
                    Some(i) => i,
                    None => continue,
                }
            };
            // Every key and value of a kept area is UTF-8 by itself: these are boundaries.
            found[i] = text.get(v..v + vl);
        }
        Self::from_found(found, one_letter)
    }

    /// The fields from the values found for `SEND_KEYS`' keys, in order.
    fn from_found(found: [Option<&'a str>; 13], one_letter: bool) -> Result<Self> {
        let keys = &SEND_KEYS[usize::from(one_letter)];
        fn required<'v>(v: Option<&'v str>, key: &'static str) -> Result<&'v str> {
            v.ok_or(ProtoError::MissingField { field: key })
        }
        // Fields in the owned header's order, so that the first error is the same one.
        Ok(Self {
            producer_group: required(found[0], keys[0])?,
            topic: required(found[1], keys[1])?,
            default_topic: required(found[2], keys[2])?,
            default_topic_queue_nums: int(required(found[3], keys[3])?, keys[3])?,
            queue_id: int(required(found[4], keys[4])?, keys[4])?,
            sys_flag: int(required(found[5], keys[5])?, keys[5])?,
            born_timestamp: long(required(found[6], keys[6])?, keys[6])?,
            flag: int(required(found[7], keys[7])?, keys[7])?,
            properties: found[8],
            reconsume_times: found[9].map(|v| int(v, keys[9])).transpose()?,
            unit_mode: found[10].map(parse_java_bool),
            max_reconsume_times: found[11].map(|v| int(v, keys[11])).transpose()?,
            batch: found[12].map(parse_java_bool),
        })
    }
}

/// The index in `SEND_KEYS[0]` of a SEND_MESSAGE (V1) header key.
#[inline]
fn long_key_index(key: &[u8]) -> Option<usize> {
    Some(match key {
        b"producerGroup" => 0,
        b"topic" => 1,
        b"defaultTopic" => 2,
        b"defaultTopicQueueNums" => 3,
        b"queueId" => 4,
        b"sysFlag" => 5,
        b"bornTimestamp" => 6,
        b"flag" => 7,
        b"properties" => 8,
        b"reconsumeTimes" => 9,
        b"unitMode" => 10,
        b"maxReconsumeTimes" => 11,
        b"batch" => 12,
        _ => return None,
    })
}

/// An `int` field: plain digits read here, anything else (a sign, an overflow, text) by
/// [`HeaderValue::parse_value`], which decides it and words its error.
#[inline(always)]
fn int(value: &str, key: &'static str) -> Result<i32> {
    match plain_digits(value, 9) {
        // Nine digits fit an i32.
        Some(n) => Ok(n as i32),
        None => int_general(value, key),
    }
}

#[cold]
#[inline(never)]
fn int_general(value: &str, key: &'static str) -> Result<i32> {
    i32::parse_value(key, value)
}

/// A `long` field, as [`int`].
#[inline(always)]
fn long(value: &str, key: &'static str) -> Result<i64> {
    match plain_digits(value, 18) {
        Some(n) => Ok(n),
        None => long_general(value, key),
    }
}

#[cold]
#[inline(never)]
fn long_general(value: &str, key: &'static str) -> Result<i64> {
    i64::parse_value(key, value)
}

/// What a producer reads of a send's answer (the fields of [`SendMessageResponseHeader`] a
/// send result needs), borrowed from the command's extFields: the same rules and errors for
/// these fields, without a `String` per field or a lookup per optional field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendResponseRef<'a> {
    /// Offset message id (`msgId`; comma-joined for a batch).
    pub msg_id: &'a str,
    /// Queue the message was stored in (`queueId`).
    pub queue_id: i32,
    /// Consume-queue offset of the (first) message (`queueOffset`).
    pub queue_offset: i64,
}

impl<'a> SendResponseRef<'a> {
    /// Reads the answer's header in one pass over `ext` (`None`: the answer had none).
    pub fn decode(ext: Option<&'a ExtFields>) -> Result<Self> {
        Self::from_entries(ext.into_iter().flat_map(ExtFields::iter_keyed))
    }

    /// Reads an answer's header from its map ([`RemotingCommand::ext_fields`]) or from the
    /// binary area the decoder kept ([`RawExtFields::BinaryArea`], see
    /// [`RemotingCommand::decode_with`]): the same fields and errors either way (a later entry
    /// of a key wins, as in the map).
    pub fn of_response(r: &'a RemotingCommand) -> Result<Self> {
        match (&r.ext_fields, &r.ext_fields_raw) {
            (None, Some(RawExtFields::BinaryArea(area))) => {
                let text: &'a str = area;
                let bytes = text.as_bytes();
                let mut at = 0;
                Self::from_entries(std::iter::from_fn(|| {
                    let ((k, kl), (v, vl)) =
                        crate::command::rocketmq_entry_at(bytes, &mut at).ok()??;
                    // Every key and value of a kept area is UTF-8 by itself: boundaries.
                    Some((&bytes[k..k + kl], text.get(v..v + vl)?))
                }))
            }
            (ext, _) => Self::decode(ext.as_ref()),
        }
    }

    fn from_entries(entries: impl Iterator<Item = (&'a [u8], &'a str)>) -> Result<Self> {
        let mut found: [Option<&'a str>; 3] = [None; 3];
        for (key, value) in entries {
            let i = match key {
                b"msgId" => 0,
                b"queueId" => 1,
                b"queueOffset" => 2,
                _ => continue,
            };
            found[i] = Some(value);
        }
        Ok(Self {
            msg_id: found[0].ok_or(ProtoError::MissingField { field: "msgId" })?,
            queue_id: i32::read_value(found[1], "queueId")?,
            queue_offset: i64::read_value(found[2], "queueOffset")?,
        })
    }
}

/// The extFields of a send's answer, written straight from borrowed values: the entries
/// [`SendMessageResponseHeader`] writes for the same values, in its order (no batch unique id
/// or recall handle), without a `String` per field.
pub fn send_response_ext_fields(
    msg_id: &str,
    queue_id: i32,
    queue_offset: i64,
    transaction_id: Option<&str>,
    msg_region: Option<&str>,
    trace_on: Option<bool>,
) -> ExtFields {
    // Keys (54 bytes), two numbers (at most 31), the strings: room for it all at once.
    let text = 54
        + 31
        + msg_id.len()
        + transaction_id.map_or(0, str::len)
        + msg_region.map_or(0, str::len)
        + 5;
    let mut ext = ExtFields::with_text_capacity(6, text);
    ext.insert("msgId", msg_id);
    ext.insert_with("queueId", |out| queue_id.push_value(out));
    ext.insert_with("queueOffset", |out| queue_offset.push_value(out));
    if let Some(t) = transaction_id {
        ext.insert("transactionId", t);
    }
    if let Some(r) = msg_region {
        ext.insert("MSG_REGION", r);
    }
    if let Some(t) = trace_on {
        ext.insert_with("TRACE_ON", |out| t.push_value(out));
    }
    ext
}

/// The same entries as [`send_response_ext_fields`], in its order, already written as a
/// ROCKETMQ binary extFields area (for [`RawExtFields::Binary`](crate::RawExtFields::Binary)):
/// no map is built.
pub fn send_response_binary(
    msg_id: impl FnOnce(&mut Vec<u8>),
    queue_id: i32,
    queue_offset: i64,
    transaction_id: Option<&str>,
    msg_region: Option<&str>,
    trace_on: Option<bool>,
) -> crate::Result<Vec<u8>> {
    use crate::command::{push_binary_decimal, push_binary_entry, push_binary_entry_with};
    let mut out = Vec::with_capacity(
        150 + transaction_id.map_or(0, str::len) + msg_region.map_or(0, str::len),
    );
    push_binary_entry_with(&mut out, "msgId", msg_id)?;
    push_binary_decimal(&mut out, "queueId", i64::from(queue_id))?;
    push_binary_decimal(&mut out, "queueOffset", queue_offset)?;
    if let Some(t) = transaction_id {
        push_binary_entry(&mut out, "transactionId", t)?;
    }
    if let Some(r) = msg_region {
        push_binary_entry(&mut out, "MSG_REGION", r)?;
    }
    if let Some(t) = trace_on {
        push_binary_entry(&mut out, "TRACE_ON", if t { "true" } else { "false" })?;
    }
    Ok(out)
}

/// The same entries as [`send_response_ext_fields`], in its order, already written as the
/// JSON object of a JSON header's `extFields` (for
/// [`RemotingCommand::ext_fields_raw`](crate::RemotingCommand::ext_fields_raw)): no map is
/// built, and only the transaction id (the producer's unique key) is scanned for characters
/// that need escapes. `msg_id` writes the offset message ids (hex digits, commas between a
/// batch's) straight into the text, and `msg_region` (the broker's region name) is written
/// as it is: both are the broker's own text and must need no escapes (checked in debug
/// builds).
pub fn send_response_json(
    msg_id: impl FnOnce(&mut String),
    queue_id: i32,
    queue_offset: i64,
    transaction_id: Option<&str>,
    msg_region: Option<&str>,
    trace_on: Option<bool>,
) -> String {
    let mut out = String::with_capacity(
        140 + transaction_id.map_or(0, |t| t.len() + 20) + msg_region.map_or(0, |r| r.len() + 16),
    );
    out.push_str("{\"msgId\":\"");
    let id_at = out.len();
    msg_id(&mut out);
    debug_assert!(!needs_escape(&out[id_at..]), "{:?}", &out[id_at..]);
    out.push('"');
    out.push_str(",\"queueId\":\"");
    queue_id.push_value(&mut out);
    out.push_str("\",\"queueOffset\":\"");
    queue_offset.push_value(&mut out);
    out.push('"');
    if let Some(t) = transaction_id {
        out.push_str(",\"transactionId\":");
        crate::command::push_json_str(&mut out, t);
    }
    if let Some(r) = msg_region {
        debug_assert!(!needs_escape(r), "{r:?}");
        out.push_str(",\"MSG_REGION\":\"");
        out.push_str(r);
        out.push('"');
    }
    if let Some(t) = trace_on {
        out.push_str(if t {
            ",\"TRACE_ON\":\"true\""
        } else {
            ",\"TRACE_ON\":\"false\""
        });
    }
    out.push('}');
    out
}

/// True when `s` holds a character a JSON string must escape.
fn needs_escape(s: &str) -> bool {
    s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20)
}

command_header! {
    /// END_TRANSACTION (37, oneway) request header.
    pub struct EndTransactionRequestHeader [rpc] {
        /// Topic of the half message.
        topic: Option<String> = "topic";
        /// Producer group.
        producer_group: String = "producerGroup";
        /// Send result queue offset.
        tran_state_table_offset: i64 = "tranStateTableOffset";
        /// Commit-log offset from the offset message id.
        commit_log_offset: i64 = "commitLogOffset";
        /// 0 unknown, 8 commit, 12 rollback.
        commit_or_rollback: i32 = "commitOrRollback";
        /// True when answering CHECK_TRANSACTION_STATE.
        from_transaction_check: bool = "fromTransactionCheck", default false;
        /// The message's UNIQ_KEY.
        msg_id: String = "msgId";
        /// Transaction id.
        transaction_id: Option<String> = "transactionId";
    }
}

/// END_TRANSACTION response header: no fields.
pub type EndTransactionResponseHeader = EmptyHeader;

command_header! {
    /// CHECK_TRANSACTION_STATE (39, broker → client, oneway) request header.
    pub struct CheckTransactionStateRequestHeader [rpc] {
        /// Topic of the half message.
        topic: Option<String> = "topic";
        /// Queue offset of the half message.
        tran_state_table_offset: i64 = "tranStateTableOffset";
        /// Commit-log offset of the half message.
        commit_log_offset: i64 = "commitLogOffset";
        /// The message's UNIQ_KEY.
        msg_id: Option<String> = "msgId";
        /// Transaction id.
        transaction_id: Option<String> = "transactionId";
        /// Offset message id.
        offset_msg_id: Option<String> = "offsetMsgId";
    }
}

command_header! {
    /// CHECK_TRANSACTION_STATE response header (unused by Java clients, which answer with
    /// END_TRANSACTION).
    pub struct CheckTransactionStateResponseHeader {
        /// Producer group.
        producer_group: String = "producerGroup";
        /// Queue offset of the half message.
        tran_state_table_offset: i64 = "tranStateTableOffset";
        /// Commit-log offset of the half message.
        commit_log_offset: i64 = "commitLogOffset";
        /// 0 unknown, 8 commit, 12 rollback.
        commit_or_rollback: i32 = "commitOrRollback";
    }
}
