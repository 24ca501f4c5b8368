//! The header of a send (SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE) written straight from the
//! producer's values into whichever encoding the request goes out in: the extFields map (what
//! ACL signs), RocketMQ's binary entries, or JSON text, without building the typed header.

use crate::error::Result;
use bytes::Bytes;
use shoal_proto::command::ExtFields;
use shoal_proto::constants::AUTO_CREATE_TOPIC_KEY_TOPIC;
use shoal_proto::header::HeaderValue;
use shoal_proto::message::{
    property, property::encode_pairs_into, property::push_pairs_json, Properties,
};
use shoal_proto::{RawExtFields, RemotingCommand, SerializeType};

/// The fields of a SEND_MESSAGE_V2 header, borrowed from the producer and the message.
pub(crate) struct SendV2<'a> {
    pub(crate) group: &'a str,
    pub(crate) topic: &'a str,
    pub(crate) default_topic_queue_nums: i32,
    pub(crate) queue_id: i32,
    pub(crate) sys_flag: i32,
    pub(crate) born_timestamp: i64,
    pub(crate) flag: i32,
    pub(crate) properties: &'a Properties,
    /// A UNIQ_KEY written after `properties` (one the producer made for this send).
    pub(crate) uniq_key: Option<&'a str>,
    pub(crate) reconsume_times: Option<i32>,
    pub(crate) max_reconsume_times: Option<i32>,
    pub(crate) broker_name: &'a str,
    /// SEND_BATCH_MESSAGE's header (`m` true: the body is a batch).
    pub(crate) batch: bool,
}

impl<'a> SendV2<'a> {
    /// The `m` entry: whether the body is a batch.
    fn batch_text(&self) -> &'static str {
        if self.batch {
            "true"
        } else {
            "false"
        }
    }

    /// The properties sent: the message's, then the UNIQ_KEY made for the send if any.
    fn props(&self) -> impl Iterator<Item = (&'a str, &'a str)> + Clone {
        property::pairs_of(self.properties).chain(self.uniq_key.map(|k| (property::UNIQ_KEY, k)))
    }

    /// The integer entries `d` to `h`, in order.
    fn numbers(&self) -> [(&'static str, i64); 5] {
        [
            ("d", i64::from(self.default_topic_queue_nums)),
            ("e", i64::from(self.queue_id)),
            ("f", i64::from(self.sys_flag)),
            ("g", self.born_timestamp),
            ("h", i64::from(self.flag)),
        ]
    }
}

/// The extFields of [`SendMessageRequestHeaderV2`] for a single send, written straight into
/// the map's buffer (the typed header would copy every string twice): the same entries in the
/// same order, with `k` false, `m` true for a batch, and `c` `TBW102`.
fn send_v2_ext(h: &SendV2<'_>) -> Result<ExtFields> {
    let mut ext = ExtFields::with_capacity(13);
    ext.insert("a", h.group);
    ext.insert("b", h.topic);
    ext.insert("c", AUTO_CREATE_TOPIC_KEY_TOPIC);
    ext.insert_with("d", |o| h.default_topic_queue_nums.push_value(o));
    ext.insert_with("e", |o| h.queue_id.push_value(o));
    ext.insert_with("f", |o| h.sys_flag.push_value(o));
    ext.insert_with("g", |o| h.born_timestamp.push_value(o));
    ext.insert_with("h", |o| h.flag.push_value(o));
    let mut encoded = Ok(());
    ext.insert_with("i", |o| encoded = encode_pairs_into(h.props(), o));
    encoded?;
    if let Some(j) = h.reconsume_times {
        ext.insert_with("j", |o| j.push_value(o));
    }
    ext.insert("k", "false");
    if let Some(l) = h.max_reconsume_times {
        ext.insert_with("l", |o| l.push_value(o));
    }
    ext.insert("m", h.batch_text());
    ext.insert("n", h.broker_name);
    Ok(ext)
}

/// A send request (`code`) with header `h`: its entries as a map when the request is to be
/// `signed` (ACL signs the map), otherwise as binary entries (`binary`) or JSON text written
/// straight from the values, with no map built.
pub(crate) fn send_command(
    code: i32,
    h: &SendV2<'_>,
    body: Bytes,
    binary: bool,
    signed: bool,
) -> Result<RemotingCommand> {
    let mut req = RemotingCommand::request(code).with_body(body);
    if binary {
        req.serialize_type = SerializeType::RocketMq;
    }
    req.ext_fields_raw = match (signed, binary) {
        (true, _) => {
            req.ext_fields = Some(send_v2_ext(h)?);
            None
        }
        (false, true) => Some(RawExtFields::Binary(send_v2_binary(h)?)),
        (false, false) => Some(RawExtFields::Json(send_v2_json(h)?)),
    };
    Ok(req)
}

/// [`send_v2_ext`]'s entries, in its order, as a ROCKETMQ binary header's extFields area
/// ([`RawExtFields::Binary`]): no map is built, and nothing is escaped.
fn send_v2_binary(h: &SendV2<'_>) -> Result<Vec<u8>> {
    use shoal_proto::{push_binary_decimal as number, push_binary_entry as entry};
    let mut props_len = 0;
    for (k, v) in h.props() {
        // A separator inside a key or a value is an error, as with the map.
        property::check_property(k, v)?;
        props_len += k.len() + v.len() + 2;
    }
    let mut out =
        Vec::with_capacity(150 + h.group.len() + h.topic.len() + h.broker_name.len() + props_len);
    entry(&mut out, "a", h.group)?;
    entry(&mut out, "b", h.topic)?;
    entry(&mut out, "c", AUTO_CREATE_TOPIC_KEY_TOPIC)?;
    // `numbers()`'s entries, written one by one so that each key is a constant.
    number(&mut out, "d", i64::from(h.default_topic_queue_nums))?;
    number(&mut out, "e", i64::from(h.queue_id))?;
    number(&mut out, "f", i64::from(h.sys_flag))?;
    number(&mut out, "g", h.born_timestamp)?;
    number(&mut out, "h", i64::from(h.flag))?;
    // The properties' text, `key 0x01 value 0x02` per pair, written in place.
    shoal_proto::push_binary_entry_with(&mut out, "i", |o| {
        for (k, v) in h.props() {
            o.extend_from_slice(k.as_bytes());
            o.push(property::NAME_VALUE_SEPARATOR as u8);
            o.extend_from_slice(v.as_bytes());
            o.push(property::PROPERTY_SEPARATOR as u8);
        }
    })?;
    if let Some(j) = h.reconsume_times {
        number(&mut out, "j", i64::from(j))?;
    }
    entry(&mut out, "k", "false")?;
    if let Some(l) = h.max_reconsume_times {
        number(&mut out, "l", i64::from(l))?;
    }
    entry(&mut out, "m", h.batch_text())?;
    entry(&mut out, "n", h.broker_name)?;
    Ok(out)
}

/// [`send_v2_ext`]'s entries, in its order, as the JSON object of a JSON header's
/// `extFields` ([`RemotingCommand::ext_fields_raw`]): no map is built, and only strings that
/// can need escapes are scanned for them.
fn send_v2_json(h: &SendV2<'_>) -> Result<String> {
    use shoal_proto::command::push_json_str;
    let props_len: usize = h.props().map(|(k, v)| k.len() + v.len() + 12).sum();
    let mut out = String::with_capacity(
        200 + h.group.len() + h.topic.len() + h.broker_name.len() + props_len,
    );
    out.push_str("{\"a\":");
    push_json_str(&mut out, h.group);
    out.push_str(",\"b\":");
    push_json_str(&mut out, h.topic);
    out.push_str(",\"c\":");
    push_json_str(&mut out, AUTO_CREATE_TOPIC_KEY_TOPIC);
    for (key, value) in h.numbers() {
        out.push_str(",\"");
        out.push_str(key);
        out.push_str("\":\"");
        value.push_value(&mut out);
        out.push('"');
    }
    out.push_str(",\"i\":");
    push_pairs_json(h.props(), &mut out)?;
    if let Some(j) = h.reconsume_times {
        out.push_str(",\"j\":\"");
        j.push_value(&mut out);
        out.push('"');
    }
    out.push_str(",\"k\":\"false\"");
    if let Some(l) = h.max_reconsume_times {
        out.push_str(",\"l\":\"");
        l.push_value(&mut out);
        out.push('"');
    }
    out.push_str(",\"m\":\"");
    out.push_str(h.batch_text());
    out.push_str("\",\"n\":");
    push_json_str(&mut out, h.broker_name);
    out.push('}');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::code::request_code as rc;
    use shoal_proto::header::{CommandHeader, SendMessageRequestHeaderV2};
    use shoal_proto::message::encode_properties;

    #[test]
    fn send_v2_json_encodes_as_send_v2_ext() {
        let mut props = Properties::default();
        props.insert(property::UNIQ_KEY.into(), "ABC".into());
        props.insert(property::TAGS.into(), "t\"ag\\".into());
        props.insert("KEYS".into(), "k\u{7}é".into());
        // The same without UNIQ_KEY, which the send adds.
        let mut without = props.clone();
        without.shift_remove(property::UNIQ_KEY);
        let cases = [
            (None, None, &props, None),
            (Some(3), Some(16), &props, None),
            (Some(-1), None, &without, Some("ABC\"")),
        ];
        for (j, l, props, uniq_key) in cases {
            let h = SendV2 {
                group: "G\"x",
                topic: "T",
                default_topic_queue_nums: 4,
                queue_id: -2,
                sys_flag: 1,
                born_timestamp: 1_700_000_000_000,
                flag: i32::MIN,
                properties: props,
                uniq_key,
                reconsume_times: j,
                max_reconsume_times: l,
                broker_name: "broker-a",
                batch: false,
            };
            let mut with_map = RemotingCommand::request(rc::SEND_MESSAGE_V2);
            let mut with_json = with_map.clone();
            let mut with_binary = with_map.clone();
            with_map.ext_fields = Some(send_v2_ext(&h).unwrap());
            with_json.ext_fields_raw = Some(RawExtFields::Json(send_v2_json(&h).unwrap()));
            let (mut a, mut b) = (bytes::BytesMut::new(), bytes::BytesMut::new());
            with_map.encode_header(&mut a).unwrap();
            with_json.encode_header(&mut b).unwrap();
            assert_eq!(
                std::str::from_utf8(&a).unwrap(),
                std::str::from_utf8(&b).unwrap()
            );
            // The binary area: the map's binary header, byte for byte.
            with_binary.ext_fields_raw = Some(RawExtFields::Binary(send_v2_binary(&h).unwrap()));
            with_map.serialize_type = SerializeType::RocketMq;
            with_binary.serialize_type = SerializeType::RocketMq;
            let (mut a, mut b) = (bytes::BytesMut::new(), bytes::BytesMut::new());
            with_map.encode_header(&mut a).unwrap();
            with_binary.encode_header(&mut b).unwrap();
            assert_eq!(a, b);
        }
    }

    #[test]
    fn send_v2_ext_is_the_typed_header() {
        let mut props = Properties::default();
        props.insert(property::UNIQ_KEY.into(), "ABC".into());
        props.insert(property::TAGS.into(), "t".into());
        // UNIQ_KEY added by the send comes after the message's properties, as if inserted.
        let mut tags_only = Properties::default();
        tags_only.insert(property::TAGS.into(), "t".into());
        let mut tags_then_uniq = tags_only.clone();
        tags_then_uniq.insert(property::UNIQ_KEY.into(), "XYZ".into());
        let cases = [
            (None, None, &props, None, &props),
            (Some(3), Some(16), &props, None, &props),
            (None, Some(2), &tags_only, Some("XYZ"), &tags_then_uniq),
        ];
        for (j, l, props, uniq_key, sent) in cases {
            let ext = send_v2_ext(&SendV2 {
                group: "G",
                topic: "T",
                default_topic_queue_nums: 4,
                queue_id: 2,
                sys_flag: 1,
                born_timestamp: 1_700_000_000_000,
                flag: -5,
                properties: props,
                uniq_key,
                reconsume_times: j,
                max_reconsume_times: l,
                broker_name: "broker-a",
                batch: false,
            })
            .unwrap();
            let typed = SendMessageRequestHeaderV2 {
                a: "G".into(),
                b: "T".into(),
                c: AUTO_CREATE_TOPIC_KEY_TOPIC.into(),
                d: 4,
                e: 2,
                f: 1,
                g: 1_700_000_000_000,
                h: -5,
                i: Some(encode_properties(sent).unwrap()),
                j,
                k: Some(false),
                l,
                m: Some(false),
                n: Some("broker-a".into()),
                ..Default::default()
            }
            .to_ext_fields();
            // Same entries in the same order, so the same bytes on the wire.
            assert_eq!(
                ext.iter().collect::<Vec<_>>(),
                typed.iter().collect::<Vec<_>>()
            );
        }
    }

    /// SEND_BATCH_MESSAGE's header as RocketMQ's producer writes it (`j` 0, `k` false, `m`
    /// true), in each encoding, with no map built unless the request is signed.
    #[test]
    fn batch_header_is_written_straight_in_each_encoding() {
        let mut props = Properties::default();
        props.insert(property::WAIT.into(), "true".into());
        props.insert(property::UNIQ_KEY.into(), "ABC".into());
        let h = SendV2 {
            group: "G",
            topic: "T",
            default_topic_queue_nums: 4,
            queue_id: 1,
            sys_flag: 0,
            born_timestamp: 1_700_000_000_000,
            flag: 0,
            properties: &props,
            uniq_key: None,
            reconsume_times: Some(0),
            max_reconsume_times: None,
            broker_name: "broker-a",
            batch: true,
        };
        let typed = SendMessageRequestHeaderV2 {
            a: "G".into(),
            b: "T".into(),
            c: AUTO_CREATE_TOPIC_KEY_TOPIC.into(),
            d: 4,
            e: 1,
            f: 0,
            g: 1_700_000_000_000,
            h: 0,
            i: Some(encode_properties(&props).unwrap()),
            j: Some(0),
            k: Some(false),
            m: Some(true),
            n: Some("broker-a".into()),
            ..Default::default()
        };
        let body = Bytes::from_static(b"batch");
        let header = |req: &RemotingCommand| {
            let mut b = bytes::BytesMut::new();
            req.encode_header(&mut b).unwrap();
            b
        };
        for binary in [false, true] {
            let mut expected = RemotingCommand::request_with_header(rc::SEND_BATCH_MESSAGE, &typed);
            if binary {
                expected.serialize_type = SerializeType::RocketMq;
            }
            let unsigned =
                send_command(rc::SEND_BATCH_MESSAGE, &h, body.clone(), binary, false).unwrap();
            assert!(unsigned.ext_fields.is_none(), "no map for an unsigned send");
            assert!(matches!(
                (&unsigned.ext_fields_raw, binary),
                (Some(RawExtFields::Binary(_)), true) | (Some(RawExtFields::Json(_)), false)
            ));
            assert_eq!(header(&unsigned), header(&expected), "binary {binary}");
            let signed =
                send_command(rc::SEND_BATCH_MESSAGE, &h, body.clone(), binary, true).unwrap();
            assert_eq!(
                signed
                    .ext_fields
                    .as_ref()
                    .map(|e| e.iter().collect::<Vec<_>>()),
                Some(typed.to_ext_fields().iter().collect::<Vec<_>>())
            );
            assert_eq!(header(&signed), header(&expected));
        }
    }
}
