//! RocketMQ 5.x POP-family headers (spec section 8). These codes do not fit the binary header's
//! 16-bit code: send them with JSON headers only.

use super::command_header;

command_header! {
    /// POP_MESSAGE (200050) request header.
    pub struct PopMessageRequestHeader [rpc] {
        /// Consumer group.
        consumer_group: String = "consumerGroup";
        /// Topic.
        topic: String = "topic";
        /// Queue id (−1 = any queue).
        queue_id: i32 = "queueId";
        /// Maximum number of messages.
        max_msg_nums: i32 = "maxMsgNums";
        /// Invisible time, ms.
        invisible_time: i64 = "invisibleTime";
        /// Long-poll time, ms.
        poll_time: i64 = "pollTime";
        /// Client send time, ms.
        born_time: i64 = "bornTime";
        /// 0 = MIN, 1 = MAX when the group has no offset.
        init_mode: i32 = "initMode";
        /// Expression type (`TAG`).
        exp_type: Option<String> = "expType";
        /// Expression.
        exp: Option<String> = "exp";
        /// Orderly pop.
        order: bool = "order", default false;
        /// Attempt id.
        attempt_id: Option<String> = "attemptId";
    }
}

command_header! {
    /// POP_MESSAGE response header.
    pub struct PopMessageResponseHeader {
        /// Pop time, ms.
        pop_time: i64 = "popTime";
        /// Invisible time, ms.
        invisible_time: i64 = "invisibleTime";
        /// Revive queue id (999 = orderly).
        revive_qid: i32 = "reviveQid";
        /// Messages left.
        rest_num: i64 = "restNum";
        /// `"<retryFlag> <queueId> <startOffset>"` entries joined by `;`.
        start_offset_info: Option<String> = "startOffsetInfo";
        /// `"<retryFlag> <queueId> <off1>,<off2>,…"` entries joined by `;`.
        msg_offset_info: Option<String> = "msgOffsetInfo";
        /// Orderly pop counts.
        order_count_info: Option<String> = "orderCountInfo";
    }
}

command_header! {
    /// ACK_MESSAGE (200051) request header.
    pub struct AckMessageRequestHeader [rpc] {
        /// Consumer group.
        consumer_group: String = "consumerGroup";
        /// Topic.
        topic: String = "topic";
        /// Queue id.
        queue_id: i32 = "queueId";
        /// The message's `POP_CK` extra info.
        extra_info: String = "extraInfo";
        /// Queue offset of the message.
        offset: i64 = "offset";
    }
}

command_header! {
    /// CHANGE_MESSAGE_INVISIBLETIME (200053) request header.
    pub struct ChangeInvisibleTimeRequestHeader [rpc] {
        /// Consumer group.
        consumer_group: String = "consumerGroup";
        /// Topic.
        topic: String = "topic";
        /// Queue id.
        queue_id: i32 = "queueId";
        /// The message's `POP_CK` extra info.
        extra_info: String = "extraInfo";
        /// Queue offset of the message.
        offset: i64 = "offset";
        /// New invisible time, ms.
        invisible_time: i64 = "invisibleTime";
    }
}

command_header! {
    /// CHANGE_MESSAGE_INVISIBLETIME response header.
    pub struct ChangeInvisibleTimeResponseHeader {
        /// Pop time, ms.
        pop_time: i64 = "popTime";
        /// Invisible time, ms.
        invisible_time: i64 = "invisibleTime";
        /// Revive queue id.
        revive_qid: i32 = "reviveQid";
    }
}

command_header! {
    /// PEEK_MESSAGE (200052) request header: read without leasing.
    pub struct PeekMessageRequestHeader [rpc] {
        /// Consumer group.
        consumer_group: String = "consumerGroup";
        /// Topic.
        topic: String = "topic";
        /// Queue id (−1 = every queue).
        queue_id: i32 = "queueId";
        /// Maximum number of messages.
        max_msg_nums: i32 = "maxMsgNums";
    }
}

command_header! {
    /// NOTIFICATION (200054) request header.
    pub struct NotificationRequestHeader [rpc] {
        /// Consumer group.
        consumer_group: String = "consumerGroup";
        /// Topic.
        topic: String = "topic";
        /// Queue id.
        queue_id: i32 = "queueId";
        /// Long-poll time, ms.
        poll_time: i64 = "pollTime";
        /// Client send time, ms.
        born_time: i64 = "bornTime";
        /// Orderly.
        order: bool = "order", default false;
        /// Attempt id.
        attempt_id: Option<String> = "attemptId";
    }
}

command_header! {
    /// NOTIFICATION response header.
    pub struct NotificationResponseHeader {
        /// Messages are available.
        has_msg: bool = "hasMsg";
        /// The broker's polling queue is full.
        polling_full: bool = "pollingFull", default false;
    }
}

/// The retry flag of POP info strings: which topic a queue id refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PopRetryFlag {
    /// `0`: the normal topic.
    #[default]
    Normal,
    /// `1`: the POP retry topic `%RETRY%<group>_<topic>`.
    RetryV1,
    /// `2`: the POP retry topic `%RETRY%<group>+<topic>`.
    RetryV2,
}

impl PopRetryFlag {
    /// The flag of a topic name as Java's `ExtraInfoUtil.getRetry` computes it.
    pub fn of_topic(topic: &str) -> Self {
        if topic.starts_with(crate::constants::RETRY_GROUP_TOPIC_PREFIX) {
            if topic.contains('+') {
                PopRetryFlag::RetryV2
            } else {
                PopRetryFlag::RetryV1
            }
        } else {
            PopRetryFlag::Normal
        }
    }

    /// The wire form: `"0"`, `"1"` or `"2"`.
    pub fn as_str(self) -> &'static str {
        match self {
            PopRetryFlag::Normal => "0",
            PopRetryFlag::RetryV1 => "1",
            PopRetryFlag::RetryV2 => "2",
        }
    }

    /// Parses the wire form; `field` names the header field for the error.
    pub fn parse(field: &'static str, s: &str) -> crate::Result<Self> {
        match s {
            "0" => Ok(PopRetryFlag::Normal),
            "1" => Ok(PopRetryFlag::RetryV1),
            "2" => Ok(PopRetryFlag::RetryV2),
            _ => Err(crate::ProtoError::InvalidField {
                field,
                value: s.to_owned(),
                reason: "retry flag must be 0, 1 or 2".to_owned(),
            }),
        }
    }

    /// The topic actually read for `topic` and consumer `group` under this flag.
    pub fn real_topic(self, topic: &str, group: &str) -> String {
        let prefix = crate::constants::RETRY_GROUP_TOPIC_PREFIX;
        match self {
            PopRetryFlag::Normal => topic.to_owned(),
            PopRetryFlag::RetryV1 => format!("{prefix}{group}_{topic}"),
            PopRetryFlag::RetryV2 => format!("{prefix}{group}+{topic}"),
        }
    }
}

fn invalid(field: &'static str, value: &str, reason: &str) -> crate::ProtoError {
    crate::ProtoError::InvalidField {
        field,
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

fn num<T: std::str::FromStr>(field: &'static str, whole: &str, part: &str) -> crate::Result<T> {
    part.parse()
        .map_err(|_| invalid(field, whole, &format!("{part:?} is not a number")))
}

/// A message's POP checkpoint info (`POP_CK` property, the `extraInfo` of ACK and
/// CHANGE_MESSAGE_INVISIBLETIME): `"<ckQueueOffset> <popTime> <invisibleTime> <reviveQid>
/// <retryFlag> <brokerName> <queueId> [<msgQueueOffset>]"`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct PopExtraInfo {
    /// Queue offset of the checkpoint (first message of the pop batch).
    pub ck_queue_offset: i64,
    /// Pop time, ms.
    pub pop_time: i64,
    /// Invisible time, ms.
    pub invisible_time: i64,
    /// Revive queue id (999 = orderly).
    pub revive_qid: i32,
    /// Which topic the queue belongs to.
    pub retry: PopRetryFlag,
    /// Broker name.
    pub broker_name: String,
    /// Queue id.
    pub queue_id: i32,
    /// Queue offset of this message (absent in the 7-field form).
    pub msg_queue_offset: Option<i64>,
}

impl PopExtraInfo {
    /// The space-separated wire form.
    pub fn to_extra_info(&self) -> String {
        let mut s = format!(
            "{} {} {} {} {} {} {}",
            self.ck_queue_offset,
            self.pop_time,
            self.invisible_time,
            self.revive_qid,
            self.retry.as_str(),
            self.broker_name,
            self.queue_id
        );
        if let Some(off) = self.msg_queue_offset {
            s.push(' ');
            s.push_str(&off.to_string());
        }
        s
    }

    /// Parses the wire form (7 or 8 fields); errors name the `extraInfo` field.
    pub fn parse(s: &str) -> crate::Result<Self> {
        const F: &str = "extraInfo";
        let parts: Vec<&str> = s.split(' ').collect();
        let [ck, pop, inv, revive, retry, broker, qid, rest @ ..] = parts.as_slice() else {
            return Err(invalid(F, s, "expected at least 7 space-separated fields"));
        };
        let msg_queue_offset = match rest {
            [] => None,
            [off] => Some(num(F, s, off)?),
            _ => return Err(invalid(F, s, "expected at most 8 fields")),
        };
        Ok(Self {
            ck_queue_offset: num(F, s, ck)?,
            pop_time: num(F, s, pop)?,
            invisible_time: num(F, s, inv)?,
            revive_qid: num(F, s, revive)?,
            retry: PopRetryFlag::parse(F, retry)?,
            broker_name: (*broker).to_owned(),
            queue_id: num(F, s, qid)?,
            msg_queue_offset,
        })
    }
}

/// One entry of a POP response's `startOffsetInfo`: `"<retryFlag> <queueId> <startOffset>"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PopStartOffset {
    /// Which topic.
    pub retry: PopRetryFlag,
    /// Queue id.
    pub queue_id: i32,
    /// First popped offset.
    pub start_offset: i64,
}

/// One entry of a POP response's `msgOffsetInfo`: `"<retryFlag> <queueId> <off1>,<off2>,…"`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PopMsgOffsets {
    /// Which topic.
    pub retry: PopRetryFlag,
    /// Queue id.
    pub queue_id: i32,
    /// Offsets of the popped messages.
    pub offsets: Vec<i64>,
}

/// One entry of a FIFO POP response's `orderCountInfo`, per message:
/// `"<retryFlag> qo<queueId>%<queueOffset> <count>"`, where the count is how many times the
/// message was delivered before (the client makes it the message's reconsume times when it is
/// above 0; a 5.x client's delivery attempt is that plus one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PopOrderCount {
    /// Which topic.
    pub retry: PopRetryFlag,
    /// Queue id.
    pub queue_id: i32,
    /// Queue offset of the message.
    pub queue_offset: i64,
    /// Earlier deliveries of the message.
    pub count: i32,
}

/// Joins `orderCountInfo` entries with `;`.
pub fn build_order_count_info(entries: &[PopOrderCount]) -> String {
    entries
        .iter()
        .map(|e| {
            format!(
                "{} qo{}%{} {}",
                e.retry.as_str(),
                e.queue_id,
                e.queue_offset,
                e.count
            )
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// Parses `orderCountInfo` (empty string = no entries). Entries of the per-queue form
/// (`"<retryFlag> <queueId> <count>"`, no queue offset) have `queue_offset` −1.
pub fn parse_order_count_info(s: &str) -> crate::Result<Vec<PopOrderCount>> {
    const F: &str = "orderCountInfo";
    s.split(';')
        .filter(|e| !e.is_empty())
        .map(|e| {
            let parts: Vec<&str> = e.split(' ').collect();
            let [retry, key, count] = parts.as_slice() else {
                return Err(invalid(F, s, "expected `<retry> <key> <count>` entries"));
            };
            let (queue_id, queue_offset) = match key.strip_prefix("qo") {
                Some(rest) => {
                    let (q, o) = rest
                        .split_once('%')
                        .ok_or_else(|| invalid(F, s, "expected `qo<queueId>%<offset>`"))?;
                    (num(F, s, q)?, num(F, s, o)?)
                }
                None => (num(F, s, key)?, -1),
            };
            Ok(PopOrderCount {
                retry: PopRetryFlag::parse(F, retry)?,
                queue_id,
                queue_offset,
                count: num(F, s, count)?,
            })
        })
        .collect()
}

/// Joins `startOffsetInfo` entries with `;`.
pub fn build_start_offset_info(entries: &[PopStartOffset]) -> String {
    entries
        .iter()
        .map(|e| format!("{} {} {}", e.retry.as_str(), e.queue_id, e.start_offset))
        .collect::<Vec<_>>()
        .join(";")
}

/// Parses `startOffsetInfo` (empty string = no entries).
pub fn parse_start_offset_info(s: &str) -> crate::Result<Vec<PopStartOffset>> {
    const F: &str = "startOffsetInfo";
    s.split(';')
        .filter(|e| !e.is_empty())
        .map(|e| {
            let parts: Vec<&str> = e.split(' ').collect();
            let [retry, qid, off] = parts.as_slice() else {
                return Err(invalid(
                    F,
                    s,
                    "expected `<retry> <queueId> <offset>` entries",
                ));
            };
            Ok(PopStartOffset {
                retry: PopRetryFlag::parse(F, retry)?,
                queue_id: num(F, s, qid)?,
                start_offset: num(F, s, off)?,
            })
        })
        .collect()
}

/// Joins `msgOffsetInfo` entries with `;`.
pub fn build_msg_offset_info(entries: &[PopMsgOffsets]) -> String {
    entries
        .iter()
        .map(|e| {
            let offs: Vec<String> = e.offsets.iter().map(i64::to_string).collect();
            format!("{} {} {}", e.retry.as_str(), e.queue_id, offs.join(","))
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// Parses `msgOffsetInfo` (empty string = no entries).
pub fn parse_msg_offset_info(s: &str) -> crate::Result<Vec<PopMsgOffsets>> {
    const F: &str = "msgOffsetInfo";
    s.split(';')
        .filter(|e| !e.is_empty())
        .map(|e| {
            let parts: Vec<&str> = e.split(' ').collect();
            let [retry, qid, offs] = parts.as_slice() else {
                return Err(invalid(
                    F,
                    s,
                    "expected `<retry> <queueId> <offsets>` entries",
                ));
            };
            let offsets = offs
                .split(',')
                .filter(|o| !o.is_empty())
                .map(|o| num(F, s, o))
                .collect::<crate::Result<Vec<i64>>>()?;
            Ok(PopMsgOffsets {
                retry: PopRetryFlag::parse(F, retry)?,
                queue_id: num(F, s, qid)?,
                offsets,
            })
        })
        .collect()
}

#[cfg(test)]
mod extra_info_tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn extra_info_round_trip_and_errors() {
        let e = PopExtraInfo {
            ck_queue_offset: 10,
            pop_time: 1_700_000_000_000,
            invisible_time: 60_000,
            revive_qid: 999,
            retry: PopRetryFlag::RetryV1,
            broker_name: "broker-a".into(),
            queue_id: 3,
            msg_queue_offset: Some(12),
        };
        let s = e.to_extra_info();
        assert_eq!(s, "10 1700000000000 60000 999 1 broker-a 3 12");
        assert_eq!(PopExtraInfo::parse(&s).unwrap(), e);
        let seven = PopExtraInfo::parse("10 1 2 3 0 b 4").unwrap();
        assert_eq!(seven.msg_queue_offset, None);
        for bad in [
            "",
            "1 2 3",
            "x 1 2 3 0 b 4",
            "1 2 3 4 9 b 4",
            "1 2 3 4 0 b 4 5 6",
        ] {
            assert!(matches!(
                PopExtraInfo::parse(bad),
                Err(crate::ProtoError::InvalidField {
                    field: "extraInfo",
                    ..
                })
            ));
        }
    }

    #[test]
    fn retry_flags_follow_java() {
        assert_eq!(PopRetryFlag::of_topic("T"), PopRetryFlag::Normal);
        assert_eq!(PopRetryFlag::of_topic("%RETRY%CG_T"), PopRetryFlag::RetryV1);
        assert_eq!(PopRetryFlag::of_topic("%RETRY%CG+T"), PopRetryFlag::RetryV2);
        assert_eq!(PopRetryFlag::RetryV1.real_topic("T", "CG"), "%RETRY%CG_T");
        assert_eq!(PopRetryFlag::RetryV2.real_topic("T", "CG"), "%RETRY%CG+T");
        assert_eq!(PopRetryFlag::Normal.real_topic("T", "CG"), "T");
    }

    #[test]
    fn offset_infos() {
        let starts = vec![
            PopStartOffset {
                retry: PopRetryFlag::Normal,
                queue_id: 0,
                start_offset: 5,
            },
            PopStartOffset {
                retry: PopRetryFlag::RetryV2,
                queue_id: 1,
                start_offset: 0,
            },
        ];
        let s = build_start_offset_info(&starts);
        assert_eq!(s, "0 0 5;2 1 0");
        assert_eq!(parse_start_offset_info(&s).unwrap(), starts);
        let msgs = vec![PopMsgOffsets {
            retry: PopRetryFlag::Normal,
            queue_id: 2,
            offsets: vec![5, 6, 7],
        }];
        let s = build_msg_offset_info(&msgs);
        assert_eq!(s, "0 2 5,6,7");
        assert_eq!(parse_msg_offset_info(&s).unwrap(), msgs);
        assert!(parse_start_offset_info("").unwrap().is_empty());
        assert!(parse_start_offset_info("0 x 1").is_err());
        assert!(parse_msg_offset_info("0 1").is_err());
        assert!(parse_msg_offset_info("0 1 2,x").is_err());
    }

    #[test]
    fn order_count_info_as_java_builds_it() {
        let e = vec![
            PopOrderCount {
                retry: PopRetryFlag::Normal,
                queue_id: 2,
                queue_offset: 17,
                count: 0,
            },
            PopOrderCount {
                retry: PopRetryFlag::Normal,
                queue_id: 2,
                queue_offset: 18,
                count: 3,
            },
        ];
        let s = build_order_count_info(&e);
        assert_eq!(s, "0 qo2%17 0;0 qo2%18 3");
        assert_eq!(parse_order_count_info(&s).unwrap(), e);
        let per_queue = parse_order_count_info("1 4 2").unwrap();
        assert_eq!(per_queue[0].queue_id, 4);
        assert_eq!(per_queue[0].queue_offset, -1);
        assert_eq!(per_queue[0].count, 2);
        assert!(parse_order_count_info("0 qo2 1").is_err());
        assert!(parse_order_count_info("0 qo2%x 1").is_err());
    }

    proptest! {
        #[test]
        fn extra_info_parse_never_panics(s in "[0-9a-z -]{0,40}") {
            let _ = PopExtraInfo::parse(&s);
            let _ = parse_start_offset_info(&s);
            let _ = parse_msg_offset_info(&s);
            let _ = parse_order_count_info(&s);
        }

        #[test]
        fn extra_info_round_trips(
            ck in any::<i64>(), pop in any::<i64>(), inv in any::<i64>(), revive in any::<i32>(),
            flag in 0..3u8, broker in "[A-Za-z0-9_-]{0,10}", qid in any::<i32>(),
            off in proptest::option::of(any::<i64>()),
        ) {
            let retry = [PopRetryFlag::Normal, PopRetryFlag::RetryV1, PopRetryFlag::RetryV2][flag as usize];
            let e = PopExtraInfo { ck_queue_offset: ck, pop_time: pop, invisible_time: inv, revive_qid: revive,
                retry, broker_name: broker, queue_id: qid, msg_queue_offset: off };
            prop_assert_eq!(PopExtraInfo::parse(&e.to_extra_info()).unwrap(), e);
        }
    }
}
