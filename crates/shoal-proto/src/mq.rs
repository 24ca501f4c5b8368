//! [`MessageQueue`]: the identity of one queue of one topic on one broker.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A queue of a topic on a broker: Java's `org.apache.rocketmq.common.message.MessageQueue`.
///
/// Serialises exactly as Java does: `{"brokerName":…,"queueId":…,"topic":…}`. Ordering is
/// Java's `compareTo`: by topic, then broker name, then queue id; strings compare by UTF-16
/// code units as Java does (see [`java_str_cmp`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MessageQueue {
    /// Broker name (not address), e.g. `broker-a`.
    #[serde(rename = "brokerName", default)]
    pub broker_name: String,
    /// Queue id within the topic on that broker.
    #[serde(rename = "queueId", default)]
    pub queue_id: i32,
    /// Topic name.
    #[serde(default)]
    pub topic: String,
}

impl MessageQueue {
    /// Builds a queue identity.
    pub fn new(topic: impl Into<String>, broker_name: impl Into<String>, queue_id: i32) -> Self {
        Self {
            broker_name: broker_name.into(),
            queue_id,
            topic: topic.into(),
        }
    }
}

impl Ord for MessageQueue {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        java_str_cmp(&self.topic, &other.topic)
            .then_with(|| java_str_cmp(&self.broker_name, &other.broker_name))
            .then_with(|| self.queue_id.cmp(&other.queue_id))
    }
}

impl PartialOrd for MessageQueue {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for MessageQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}#{}", self.topic, self.broker_name, self.queue_id)
    }
}

/// Compares two strings as Java's `String.compareTo` does: by UTF-16 code units.
///
/// This differs from Rust's byte order only for characters outside the Basic Multilingual
/// Plane versus characters in U+E000..U+FFFF, but clients that sort consumer ids for
/// allocation must agree with Java exactly.
pub fn java_str_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    // UTF-8 byte order is code point order, which UTF-16 order equals unless a character at
    // U+E000 or above (lead bytes 0xEE..) is involved: then only the slow path is exact.
    if !a.bytes().chain(b.bytes()).any(|c| c >= 0xEE) {
        return a.as_bytes().cmp(b.as_bytes());
    }
    a.encode_utf16().cmp(b.encode_utf16())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_like_java() {
        let mq = MessageQueue::new("T", "broker-a", 1);
        assert_eq!(
            serde_json::to_string(&mq).unwrap(),
            r#"{"brokerName":"broker-a","queueId":1,"topic":"T"}"#
        );
    }

    #[test]
    fn orders_by_topic_broker_queue() {
        let mut v = [
            MessageQueue::new("B", "a", 0),
            MessageQueue::new("A", "b", 0),
            MessageQueue::new("A", "a", 2),
            MessageQueue::new("A", "a", 1),
        ];
        v.sort();
        let ids: Vec<String> = v.iter().map(|m| m.to_string()).collect();
        assert_eq!(ids, ["A@a#1", "A@a#2", "A@b#0", "B@a#0"]);
    }

    #[test]
    fn java_order_is_utf16_order() {
        // U+FF61 sorts before U+1F600 in UTF-8 byte order but after it in UTF-16 order.
        assert_eq!(
            java_str_cmp("\u{FF61}", "\u{1F600}"),
            std::cmp::Ordering::Greater
        );
        assert_eq!("\u{FF61}".cmp("\u{1F600}"), std::cmp::Ordering::Less);
        // The byte-order fast path agrees with UTF-16 order everywhere else.
        let words = [
            "",
            "a",
            "ab",
            "b",
            "\u{e9}",
            "\u{7ff}",
            "\u{d7ff}",
            "\u{e000}",
            "\u{ffff}",
            "\u{10000}",
            "z\u{1F600}",
        ];
        for a in words {
            for b in words {
                assert_eq!(
                    java_str_cmp(a, b),
                    a.encode_utf16().cmp(b.encode_utf16()),
                    "{a:?} {b:?}"
                );
            }
        }
    }
}
