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
