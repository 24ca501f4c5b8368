//! Message properties (spec §4.4): the `key \u{1} value \u{2}` string and the well-known keys.
//!
//! Properties are kept in a [`Properties`] map (an [`IndexMap`], so encoding is deterministic:
//! insertion order). The encoded form is `key 0x01 value 0x02` per pair, every pair terminated
//! by `0x02` (the trailing separator is included), as Java's `messageProperties2String` writes.
//!
//! The decoder follows Java's `string2messageProperties`: the string is split on `0x02`; a
//! segment is kept only if its first `0x01` is neither its first nor its last character, so
//! pairs with an empty key or an empty value are **dropped**. A later duplicate key replaces
//! the earlier value (as a Java `HashMap` does) but keeps the first position.

use indexmap::IndexMap;

use crate::{ProtoError, Result};

/// Message properties: key → value, in insertion order (hashed with foldhash, seeded per
/// process: a consumer builds one map per message it decodes). Make one with
/// `Properties::default()`.
pub type Properties = IndexMap<String, String, foldhash::fast::RandomState>;

/// Separator between a property key and its value (`\u0001`).
pub const NAME_VALUE_SEPARATOR: char = '\u{1}';
/// Terminator after every property pair (`\u0002`).
pub const PROPERTY_SEPARATOR: char = '\u{2}';
/// Separator between the keys in the [`KEYS`] property (a space).
pub const KEY_SEPARATOR: &str = " ";

/// User keys of the message, separated by [`KEY_SEPARATOR`] (indexed by the broker).
pub const KEYS: &str = "KEYS";
/// The message tag (filtering, spec §5.3).
pub const TAGS: &str = "TAGS";
/// `"true"`/`"false"`: whether the producer waits for the store flush (Java default `true`).
pub const WAIT: &str = "WAIT";
/// Delay level (1..=18); the broker parks the message in `SCHEDULE_TOPIC_XXXX`.
pub const DELAY: &str = "DELAY";
/// Original topic of a retry message.
pub const RETRY_TOPIC: &str = "RETRY_TOPIC";
/// Original topic of a message parked in the schedule, timer or transaction half topic.
pub const REAL_TOPIC: &str = "REAL_TOPIC";
/// Original queue id of a message parked in the schedule, timer or transaction half topic.
pub const REAL_QID: &str = "REAL_QID";
/// `"true"` on transactional half messages.
pub const TRAN_MSG: &str = "TRAN_MSG";
/// Producer group (transactional messages; used by the check-back).
pub const PGROUP: &str = "PGROUP";
/// Minimum offset of the queue, added by the client on pull.
pub const MIN_OFFSET: &str = "MIN_OFFSET";
/// Maximum offset of the queue, added by the client on pull.
pub const MAX_OFFSET: &str = "MAX_OFFSET";
/// Buyer id (legacy reserved key).
pub const BUYER_ID: &str = "BUYER_ID";
/// First message id of a message re-sent to a retry or dead-letter topic.
pub const ORIGIN_MESSAGE_ID: &str = "ORIGIN_MESSAGE_ID";
/// Transfer flag (legacy reserved key).
pub const TRANSFER_FLAG: &str = "TRANSFER_FLAG";
/// Correction flag (legacy reserved key).
pub const CORRECTION_FLAG: &str = "CORRECTION_FLAG";
/// MQ2 flag (legacy reserved key).
pub const MQ2_FLAG: &str = "MQ2_FLAG";
/// Reconsume count, when a client re-sends to `%RETRY%` as a normal message.
pub const RECONSUME_TIME: &str = "RECONSUME_TIME";
/// Region id (the broker adds it; default `DefaultRegion`).
pub const MSG_REGION: &str = "MSG_REGION";
/// Trace switch `"true"`/`"false"` (the broker may add it).
pub const TRACE_ON: &str = "TRACE_ON";
/// Client-generated unique message id (spec §4.6); what applications see as the msg id.
pub const UNIQ_KEY: &str = "UNIQ_KEY";
/// Extended unique info (reserved).
pub const EXTEND_UNIQ_INFO: &str = "EXTEND_UNIQ_INFO";
/// Maximum reconsume count, when a client re-sends to `%RETRY%` as a normal message.
pub const MAX_RECONSUME_TIMES: &str = "MAX_RECONSUME_TIMES";
/// Set by the client when consumption starts (consume-timeout detection).
pub const CONSUME_START_TIME: &str = "CONSUME_START_TIME";
/// Number of messages wrapped in an inner batch.
pub const INNER_NUM: &str = "INNER_NUM";
/// Base queue offset of an inner batch.
pub const INNER_BASE: &str = "INNER_BASE";
/// Duplicate info (reserved).
pub const DUP_INFO: &str = "DUP_INFO";
/// Transaction check immunity, in seconds.
pub const CHECK_IMMUNITY_TIME_IN_SECONDS: &str = "CHECK_IMMUNITY_TIME_IN_SECONDS";
/// Queue offset of the prepared (half) message of a transaction.
pub const TRAN_PREPARED_QUEUE_OFFSET: &str = "TRAN_PREPARED_QUEUE_OFFSET";
/// Transaction id.
pub const TRANSACTION_ID: &str = "__transactionId__";
/// How many times the broker has checked a transaction.
pub const TRANSACTION_CHECK_TIMES: &str = "TRANSACTION_CHECK_TIMES";
/// Instance id (reserved).
pub const INSTANCE_ID: &str = "INSTANCE_ID";
/// Request/reply correlation id.
pub const CORRELATION_ID: &str = "CORRELATION_ID";
/// Client id a reply message is to be pushed to.
pub const REPLY_TO_CLIENT: &str = "REPLY_TO_CLIENT";
/// Time to live of a request/reply message.
pub const TTL: &str = "TTL";
/// Arrival time of a reply message.
pub const ARRIVE_TIME: &str = "ARRIVE_TIME";
/// Time a reply was pushed.
pub const PUSH_REPLY_TIME: &str = "PUSH_REPLY_TIME";
/// Broker cluster name, added by the broker on store.
pub const CLUSTER: &str = "CLUSTER";
/// Message type (e.g. `reply`).
pub const MSG_TYPE: &str = "MSG_TYPE";
/// POP checkpoint info (spec §8).
pub const POP_CK: &str = "POP_CK";
/// POP checkpoint offset.
pub const POP_CK_OFFSET: &str = "POP_CK_OFFSET";
/// Time of the first POP of a message.
pub const FIRST_POP_TIME: &str = "1ST_POP_TIME";
/// Sharding key of an ordered message.
pub const SHARDING_KEY: &str = "__SHARDINGKEY";
/// Forward queue id (reserved).
pub const FORWARD_QUEUE_ID: &str = "PROPERTY_FORWARD_QUEUE_ID";
/// Redirect flag (reserved).
pub const REDIRECT: &str = "REDIRECT";
/// Light message queue dispatch targets.
pub const INNER_MULTI_DISPATCH: &str = "INNER_MULTI_DISPATCH";
/// Light message queue offsets.
pub const INNER_MULTI_QUEUE_OFFSET: &str = "INNER_MULTI_QUEUE_OFFSET";
/// Trace context.
pub const TRACE_CONTEXT: &str = "TRACE_CONTEXT";
/// 5.x timer: delay in seconds.
pub const TIMER_DELAY_SEC: &str = "TIMER_DELAY_SEC";
/// 5.x timer: absolute delivery time in ms.
pub const TIMER_DELIVER_MS: &str = "TIMER_DELIVER_MS";
/// 5.x timer: delay in ms.
pub const TIMER_DELAY_MS: &str = "TIMER_DELAY_MS";
/// 5.x timer: enqueue time in ms.
pub const TIMER_ENQUEUE_MS: &str = "TIMER_ENQUEUE_MS";
/// 5.x timer: dequeue time in ms.
pub const TIMER_DEQUEUE_MS: &str = "TIMER_DEQUEUE_MS";
/// 5.x timer: roll count.
pub const TIMER_ROLL_TIMES: &str = "TIMER_ROLL_TIMES";
/// 5.x timer: timeout time in ms.
pub const TIMER_OUT_MS: &str = "TIMER_OUT_MS";
/// 5.x timer: unique key of a deleted timer message.
pub const TIMER_DEL_UNIQKEY: &str = "TIMER_DEL_UNIQKEY";
/// 5.x timer: delay level.
pub const TIMER_DELAY_LEVEL: &str = "TIMER_DELAY_LEVEL";
/// Born host carried as a property (proxy).
pub const BORN_HOST: &str = "__BORNHOST";
/// Born timestamp carried as a property (proxy).
pub const BORN_TIMESTAMP: &str = "BORN_TIMESTAMP";
/// Original topic of a dead-lettered message.
pub const DLQ_ORIGIN_TOPIC: &str = "DLQ_ORIGIN_TOPIC";
/// Original message id of a dead-lettered message.
pub const DLQ_ORIGIN_MESSAGE_ID: &str = "DLQ_ORIGIN_MESSAGE_ID";
/// Start-deliver time (legacy timed delivery).
pub const START_DELIVER_TIME: &str = "__STARTDELIVERTIME";
/// CRC32 of the body carried as a property.
pub const CRC32: &str = "__CRC32#";

/// Checks that a key or value contains neither separator.
fn check_text(what: &str, text: &str, key: &str) -> Result<()> {
    // Both separators are ASCII, so a byte comparison finds exactly them (no byte of a
    // multi-byte character is below 0x80); it needs no decoding of characters, and without
    // an early exit the compiler compares many bytes at once.
    if text
        .bytes()
        .fold(false, |found, b| found | (b.wrapping_sub(1) < 2))
    {
        return Err(ProtoError::BadProperty(format!(
            "{what} of property {key:?} contains a separator (\\u0001 or \\u0002)"
        )));
    }
    Ok(())
}

/// Checks that a property can be encoded: neither the key nor the value may contain
/// `\u0001` or `\u0002`.
pub fn check_property(key: &str, value: &str) -> Result<()> {
    check_text("key", key, key)?;
    check_text("value", value, key)
}

/// The encoded length in bytes of `properties` (what [`encode_properties`] would produce),
/// without validating them.
pub fn encoded_properties_len(properties: &Properties) -> usize {
    properties.iter().map(|(k, v)| k.len() + v.len() + 2).sum()
}

/// Appends the encoded properties string to `out`.
///
/// Every pair is written (also pairs with an empty key or value, as Java does; the decoder
/// drops those). Errors with [`ProtoError::BadProperty`] if a key or value contains a
/// separator; `out` is left unchanged then.
pub fn encode_properties_into(properties: &Properties, out: &mut String) -> Result<()> {
    encode_pairs_into(pairs_of(properties), out)
}

/// [`encode_properties_into`] for pairs that are not (all) in a [`Properties`] map, e.g. a
/// message's properties followed by one the producer adds only to what it sends.
pub fn encode_pairs_into<'a, I>(pairs: I, out: &mut String) -> Result<()>
where
    I: Iterator<Item = (&'a str, &'a str)> + Clone,
{
    let mut len = 0;
    for (k, v) in pairs.clone() {
        check_property(k, v)?;
        len += k.len() + v.len() + 2;
    }
    out.reserve(len);
    for (k, v) in pairs {
        out.push_str(k);
        out.push(NAME_VALUE_SEPARATOR);
        out.push_str(v);
        out.push(PROPERTY_SEPARATOR);
    }
    Ok(())
}

/// Appends the string [`encode_properties`] makes as a JSON string (what
/// [`crate::command::push_json_str`] writes for it) in one pass, without the encoded string.
///
/// Errors with [`ProtoError::BadProperty`] if a key or value contains a separator; `out` is
/// left unchanged then.
pub fn push_properties_json(properties: &Properties, out: &mut String) -> Result<()> {
    push_pairs_json(pairs_of(properties), out)
}

/// [`push_properties_json`] for pairs that are not (all) in a [`Properties`] map.
pub fn push_pairs_json<'a, I>(pairs: I, out: &mut String) -> Result<()>
where
    I: Iterator<Item = (&'a str, &'a str)> + Clone,
{
    let (mut len, mut n) = (0, 0);
    for (k, v) in pairs.clone() {
        check_property(k, v)?;
        len += k.len() + v.len() + 2;
        n += 1;
    }
    // Each separator is written as a six-byte escape.
    out.reserve(len + 10 * n + 2);
    out.push('"');
    for (k, v) in pairs {
        crate::command::push_json_str_contents(out, k);
        out.push_str("\\u0001");
        crate::command::push_json_str_contents(out, v);
        out.push_str("\\u0002");
    }
    out.push('"');
    Ok(())
}

/// A map's pairs as borrowed text, in its order.
pub fn pairs_of(properties: &Properties) -> impl Iterator<Item = (&str, &str)> + Clone {
    properties.iter().map(|(k, v)| (k.as_str(), v.as_str()))
}

/// Encodes properties as the `key \u0001 value \u0002 ...` string.
///
/// Errors with [`ProtoError::BadProperty`] if a key or value contains a separator.
pub fn encode_properties(properties: &Properties) -> Result<String> {
    let mut out = String::new();
    encode_properties_into(properties, &mut out)?;
    Ok(out)
}

/// Iterates over the `(key, value)` pairs the Java decoder would keep, in string order
/// (duplicates included; a later one wins when collected into a map).
pub fn iter_properties(s: &str) -> PropertyIter<'_> {
    PropertyIter { rest: s }
}

/// Iterator returned by [`iter_properties`].
#[derive(Debug, Clone)]
pub struct PropertyIter<'a> {
    rest: &'a str,
}

impl<'a> Iterator for PropertyIter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        while !self.rest.is_empty() {
            // 0x02 is ASCII: `at` and `at + 1` are character boundaries. (`memchr` rather than
            // `split_once`, whose search costs twice as much on these short strings.)
            let (segment, rest) =
                match memchr::memchr(PROPERTY_SEPARATOR as u8, self.rest.as_bytes()) {
                    Some(at) => (&self.rest[..at], &self.rest[at + 1..]),
                    None => (self.rest, ""),
                };
            self.rest = rest;
            // Java: the first 0x01 of the segment must be neither its first nor its last char.
            // Keys are short: a byte loop finds it sooner than a `memchr` call.
            let sep = NAME_VALUE_SEPARATOR as u8;
            if let Some(at) = segment.bytes().position(|b| b == sep) {
                // 0x01 is ASCII: `at` and `at + 1` are character boundaries.
                let (key, value) = (&segment[..at], &segment[at + 1..]);
                if !key.is_empty() && !value.is_empty() {
                    return Some((key, value));
                }
            }
        }
        None
    }
}

/// The index of the first byte of `bytes` that is 0x00, 0x01 or 0x02 (a NUL or one of the two
/// separators), looking at eight bytes at a time: for checks that walk a properties string's
/// pairs.
pub fn find_separator(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
    let mut i = 0;
    while let Some(chunk) = bytes.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        // Per byte: the high bit is set in (x - 3) & !x when x < 3. Borrows only run upwards
        // from a byte that matches, so the lowest flagged byte is the first match.
        let found = w.wrapping_sub(ONES * 3) & !w & HIGH_BITS;
        if found != 0 {
            return Some(i + (found.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    bytes[i..].iter().position(|&b| b <= 2).map(|p| i + p)
}

/// Decodes a properties string with Java's rules (see the module documentation).
///
/// Never fails: like Java, malformed segments are skipped.
pub fn decode_properties(s: &str) -> Properties {
    let pairs = s.bytes().filter(|b| *b == 0x02).count() + 1;
    let mut map = Properties::with_capacity_and_hasher(pairs.min(64), Default::default());
    for (k, v) in iter_properties(s) {
        map.insert(k.to_owned(), v.to_owned());
    }
    map
}

/// Looks one property up in an encoded properties string without building a map.
///
/// Returns the value the Java decoder would end up with (the last occurrence wins).
pub fn find_property<'a>(s: &'a str, name: &str) -> Option<&'a str> {
    iter_properties(s)
        .filter(|(k, _)| *k == name)
        .last()
        .map(|(_, v)| v)
}

/// [`find_property`] for several names in one pass over `s`: the value of each (the last
/// one when a key repeats), in the order of `names`.
pub fn find_properties<'a, const N: usize>(s: &'a str, names: [&str; N]) -> [Option<&'a str>; N] {
    let mut found = [None; N];
    for (k, v) in iter_properties(s) {
        if let Some(i) = names.iter().position(|n| *n == k) {
            found[i] = Some(v);
        }
    }
    found
}

/// Decodes properties from raw bytes, which must be UTF-8.
pub fn decode_properties_bytes(bytes: &[u8]) -> Result<Properties> {
    let s = std::str::from_utf8(bytes).map_err(|_| ProtoError::Utf8("message properties"))?;
    Ok(decode_properties(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Properties written as a JSON string in one pass are the encoded string escaped,
        /// and a bad pair is refused the same way, leaving the output as it was.
        #[test]
        fn properties_as_json_are_the_encoded_string_escaped(
            pairs in proptest::collection::vec(
                ("[a-zA-Z\"\\\\\u{1}\u{2}\u{7}é]{0,6}", "[a-z0-9\"\\\\\n\u{1f}\u{2}é]{0,8}"),
                0..6,
            ),
        ) {
            let props: Properties = pairs.into_iter().collect();
            let mut out = String::from("x");
            let direct = push_properties_json(&props, &mut out);
            match encode_properties(&props) {
                Ok(encoded) => {
                    let mut expected = String::from("x");
                    crate::command::push_json_str(&mut expected, &encoded);
                    prop_assert!(direct.is_ok());
                    prop_assert_eq!(out, expected);
                }
                Err(e) => {
                    prop_assert_eq!(direct.unwrap_err().to_string(), e.to_string());
                    prop_assert_eq!(out, "x");
                }
            }
        }

        /// The word-at-a-time search finds what a byte loop finds, wherever the first
        /// separator falls (separators and bytes just above them are likely).
        #[test]
        fn find_separator_is_the_first_byte_up_to_2(
            bytes in proptest::collection::vec(
                prop_oneof![4 => 3u8..=255, 1 => 0u8..=4, 1 => Just(0x82u8)],
                0..40,
            ),
        ) {
            prop_assert_eq!(find_separator(&bytes), bytes.iter().position(|&b| b <= 2));
        }
    }

    fn props(pairs: &[(&str, &str)]) -> Properties {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn encodes_with_trailing_separator() {
        let p = props(&[("TAGS", "tagA"), ("UNIQ_KEY", "X1")]);
        assert_eq!(
            encode_properties(&p).unwrap(),
            "TAGS\u{1}tagA\u{2}UNIQ_KEY\u{1}X1\u{2}"
        );
        assert_eq!(encoded_properties_len(&p), 22);
        assert_eq!(encode_properties(&Properties::default()).unwrap(), "");
    }

    #[test]
    fn decoder_follows_java_rules() {
        // Empty value, empty key, no separator, lone separators: all dropped.
        let s = "A\u{1}1\u{2}B\u{1}\u{2}\u{1}x\u{2}junk\u{2}\u{2}\u{1}\u{2}C\u{1}3";
        assert_eq!(decode_properties(s), props(&[("A", "1"), ("C", "3")]));
        // A value may contain 0x01 after the first one (Java keeps it).
        assert_eq!(
            decode_properties("K\u{1}a\u{1}b\u{2}"),
            props(&[("K", "a\u{1}b")])
        );
        // Later duplicate wins.
        assert_eq!(
            decode_properties("K\u{1}a\u{2}L\u{1}b\u{2}K\u{1}c\u{2}"),
            props(&[("K", "c"), ("L", "b")])
        );
        assert_eq!(find_property("K\u{1}a\u{2}K\u{1}c\u{2}", "K"), Some("c"));
        assert_eq!(find_property("K\u{1}a\u{2}", "L"), None);
        assert_eq!(
            find_properties("K\u{1}a\u{2}L\u{1}b\u{2}K\u{1}c\u{2}", ["K", "M", "L"]),
            [Some("c"), None, Some("b")]
        );
    }

    #[test]
    fn separators_are_rejected() {
        for (k, v) in [
            ("a\u{1}", "v"),
            ("a", "v\u{2}"),
            ("\u{2}", ""),
            ("k", "\u{1}"),
        ] {
            let err = encode_properties(&props(&[("ok", "fine"), (k, v)])).unwrap_err();
            assert!(matches!(err, ProtoError::BadProperty(_)), "{err:?}");
        }
    }

    #[test]
    fn invalid_utf8_is_an_error() {
        assert_eq!(
            decode_properties_bytes(&[b'K', 1, 0xff, 2]),
            Err(ProtoError::Utf8("message properties"))
        );
    }
}
