//! Consumer ↔ broker headers (spec sections 2.3 and 2.4).

use super::{command_header, BoundaryType, EmptyHeader};

command_header! {
    /// PULL_MESSAGE (11) / LITE_PULL_MESSAGE (361) request header.
    pub struct PullMessageRequestHeader [rpc] {
        /// Consumer group.
        consumer_group: String = "consumerGroup";
        /// Topic.
        topic: String = "topic";
        /// Queue id.
        queue_id: i32 = "queueId";
        /// Offset to read from.
        queue_offset: i64 = "queueOffset";
        /// Maximum number of messages.
        max_msg_nums: i32 = "maxMsgNums";
        /// PullSysFlag bits (spec 5.1, [`crate::constants::pull_sys_flag`]).
        sys_flag: i32 = "sysFlag";
        /// Offset to commit when COMMIT_OFFSET is set.
        commit_offset: i64 = "commitOffset";
        /// Long-polling hold time, ms.
        suspend_timeout_millis: i64 = "suspendTimeoutMillis";
        /// Subscription expression (with SUBSCRIPTION set).
        subscription: Option<String> = "subscription";
        /// Subscription version.
        sub_version: i64 = "subVersion";
        /// `TAG` or `SQL92`.
        expression_type: Option<String> = "expressionType";
        /// Maximum bytes.
        max_msg_bytes: Option<i32> = "maxMsgBytes";
        /// Source of the request (proxy).
        request_source: Option<i32> = "requestSource";
        /// Real client id behind a proxy (Java's spelling).
        proxy_froward_client_id: Option<String> = "proxyFrowardClientId";
    }
}

command_header! {
    /// PULL_MESSAGE response header.
    pub struct PullMessageResponseHeader {
        /// Broker id to pull from next (0 = master).
        suggest_which_broker_id: i64 = "suggestWhichBrokerId";
        /// Next offset to pull.
        next_begin_offset: i64 = "nextBeginOffset";
        /// Queue's minimum offset.
        min_offset: i64 = "minOffset";
        /// Queue's maximum offset (next to be written).
        max_offset: i64 = "maxOffset";
        /// Static topics: added to every message's queue offset.
        offset_delta: Option<i64> = "offsetDelta";
        /// Topic sysFlag.
        topic_sys_flag: Option<i32> = "topicSysFlag";
        /// Group sysFlag.
        group_sys_flag: Option<i32> = "groupSysFlag";
        /// Forbidden type.
        forbidden_type: Option<i32> = "forbiddenType";
    }
}

command_header! {
    /// QUERY_CONSUMER_OFFSET (14) request header.
    pub struct QueryConsumerOffsetRequestHeader [rpc] {
        /// Consumer group.
        consumer_group: String = "consumerGroup";
        /// Topic.
        topic: String = "topic";
        /// Queue id.
        queue_id: i32 = "queueId";
        /// Answer 0 instead of QUERY_NOT_FOUND when possible.
        set_zero_if_not_found: Option<bool> = "setZeroIfNotFound";
    }
}

command_header! {
    /// QUERY_CONSUMER_OFFSET response header.
    pub struct QueryConsumerOffsetResponseHeader {
        /// The committed offset.
        offset: i64 = "offset";
    }
}

command_header! {
    /// UPDATE_CONSUMER_OFFSET (15) request header.
    pub struct UpdateConsumerOffsetRequestHeader [rpc] {
        /// Consumer group.
        consumer_group: String = "consumerGroup";
        /// Topic.
        topic: String = "topic";
        /// Queue id.
        queue_id: i32 = "queueId";
        /// Next offset to consume.
        commit_offset: i64 = "commitOffset";
    }
}

/// UPDATE_CONSUMER_OFFSET response header: no fields.
pub type UpdateConsumerOffsetResponseHeader = EmptyHeader;

command_header! {
    /// GET_MAX_OFFSET (30) request header.
    pub struct GetMaxOffsetRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
        /// Queue id.
        queue_id: i32 = "queueId";
        /// Committed (flushed) max offset; Java default true.
        committed: bool = "committed", default true;
    }
}

command_header! {
    /// GET_MAX_OFFSET response header.
    pub struct GetMaxOffsetResponseHeader {
        /// Next consume-queue offset to be written.
        offset: i64 = "offset";
    }
}

command_header! {
    /// GET_MIN_OFFSET (31) request header.
    pub struct GetMinOffsetRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
        /// Queue id.
        queue_id: i32 = "queueId";
    }
}

command_header! {
    /// GET_MIN_OFFSET response header.
    pub struct GetMinOffsetResponseHeader {
        /// Minimum offset.
        offset: i64 = "offset";
    }
}

command_header! {
    /// SEARCH_OFFSET_BY_TIMESTAMP (29) request header.
    pub struct SearchOffsetRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
        /// Queue id.
        queue_id: i32 = "queueId";
        /// Timestamp, ms.
        timestamp: i64 = "timestamp";
        /// LOWER (default) or UPPER.
        boundary_type: Option<BoundaryType> = "boundaryType";
    }
}

command_header! {
    /// SEARCH_OFFSET_BY_TIMESTAMP response header.
    pub struct SearchOffsetResponseHeader {
        /// The offset found.
        offset: i64 = "offset";
    }
}

command_header! {
    /// GET_EARLIEST_MSG_STORETIME (32) request header.
    pub struct GetEarliestMsgStoretimeRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
        /// Queue id.
        queue_id: i32 = "queueId";
    }
}

command_header! {
    /// GET_EARLIEST_MSG_STORETIME response header.
    pub struct GetEarliestMsgStoretimeResponseHeader {
        /// Store time of the earliest message, ms.
        timestamp: i64 = "timestamp";
    }
}

command_header! {
    /// VIEW_MESSAGE_BY_ID (33) request header (Java `ViewMessageRequestHeader`).
    pub struct ViewMessageByIdRequestHeader [rpc] {
        /// Topic.
        topic: Option<String> = "topic";
        /// Commit-log offset from an offset message id.
        offset: i64 = "offset";
    }
}

/// VIEW_MESSAGE_BY_ID response header: no fields (body = the stored message).
pub type ViewMessageByIdResponseHeader = EmptyHeader;

command_header! {
    /// QUERY_MESSAGE (12) request header.
    pub struct QueryMessageRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
        /// Key (or UNIQ_KEY with `_UNIQUE_KEY_QUERY`).
        key: String = "key";
        /// Maximum number of messages.
        max_num: i32 = "maxNum";
        /// Start of the time range, ms.
        begin_timestamp: i64 = "beginTimestamp";
        /// End of the time range, ms.
        end_timestamp: i64 = "endTimestamp";
        /// Look up by UNIQ_KEY instead of KEYS.
        unique_key_query: Option<bool> = "_UNIQUE_KEY_QUERY";
    }
}

command_header! {
    /// QUERY_MESSAGE response header.
    pub struct QueryMessageResponseHeader {
        /// Index last update time, ms.
        index_last_update_timestamp: i64 = "indexLastUpdateTimestamp";
        /// Index last update physical offset.
        index_last_update_phyoffset: i64 = "indexLastUpdatePhyoffset";
    }
}

command_header! {
    /// HEART_BEAT (34) request header: only the RPC fields (body = HeartbeatData).
    pub struct HeartbeatRequestHeader [rpc] {}
}

command_header! {
    /// UNREGISTER_CLIENT (35) request header.
    pub struct UnregisterClientRequestHeader [rpc] {
        /// Client id (Java's capital `ID`).
        client_id: String = "clientID";
        /// Producer group being unregistered.
        producer_group: Option<String> = "producerGroup";
        /// Consumer group being unregistered.
        consumer_group: Option<String> = "consumerGroup";
    }
}

/// UNREGISTER_CLIENT response header: no fields.
pub type UnregisterClientResponseHeader = EmptyHeader;

command_header! {
    /// CONSUMER_SEND_MSG_BACK (36) request header.
    pub struct ConsumerSendMsgBackRequestHeader [rpc] {
        /// Commit-log offset of the failed message.
        offset: i64 = "offset";
        /// Consumer group.
        group: String = "group";
        /// Delay level (0 = broker decides, −1 = DLQ).
        delay_level: i32 = "delayLevel";
        /// Original message id (UNIQ_KEY).
        origin_msg_id: Option<String> = "originMsgId";
        /// Original topic.
        origin_topic: Option<String> = "originTopic";
        /// Unit mode (always sent by Java).
        unit_mode: bool = "unitMode", default false;
        /// Max reconsume times.
        max_reconsume_times: Option<i32> = "maxReconsumeTimes";
    }
}

/// CONSUMER_SEND_MSG_BACK response header: no fields.
pub type ConsumerSendMsgBackResponseHeader = EmptyHeader;

/// NOTIFY_CONSUMER_IDS_CHANGED has no response (oneway); a client that answers anyway sends
/// no fields.
pub type NotifyConsumerIdsChangedResponseHeader = EmptyHeader;

command_header! {
    /// GET_CONSUMER_LIST_BY_GROUP (38) request header.
    pub struct GetConsumerListByGroupRequestHeader [rpc] {
        /// Consumer group.
        consumer_group: String = "consumerGroup";
    }
}

/// GET_CONSUMER_LIST_BY_GROUP response header: no fields (body required).
pub type GetConsumerListByGroupResponseHeader = EmptyHeader;

command_header! {
    /// NOTIFY_CONSUMER_IDS_CHANGED (40, broker → client, oneway) request header.
    pub struct NotifyConsumerIdsChangedRequestHeader [rpc] {
        /// Consumer group whose membership changed.
        consumer_group: String = "consumerGroup";
    }
}

command_header! {
    /// LOCK_BATCH_MQ (41) request header: only the RPC fields (body = LockBatchRequestBody).
    pub struct LockBatchMqRequestHeader [rpc] {}
}

command_header! {
    /// UNLOCK_BATCH_MQ (42) request header: only the RPC fields.
    pub struct UnlockBatchMqRequestHeader [rpc] {}
}

command_header! {
    /// GET_CONSUMER_RUNNING_INFO (307) request header.
    pub struct GetConsumerRunningInfoRequestHeader [rpc] {
        /// Consumer group.
        consumer_group: String = "consumerGroup";
        /// Client id.
        client_id: String = "clientId";
        /// Include a thread dump.
        jstack_enable: bool = "jstackEnable", default false;
    }
}

command_header! {
    /// CONSUME_MESSAGE_DIRECTLY (309) request header (Java
    /// `ConsumeMessageDirectlyResultRequestHeader`).
    pub struct ConsumeMessageDirectlyRequestHeader [rpc] {
        /// Consumer group.
        consumer_group: String = "consumerGroup";
        /// Client id.
        client_id: Option<String> = "clientId";
        /// Message id.
        msg_id: Option<String> = "msgId";
        /// Broker name.
        broker_name: Option<String> = "brokerName";
        /// Topic.
        topic: Option<String> = "topic";
        /// Topic sysFlag.
        topic_sys_flag: Option<i32> = "topicSysFlag";
        /// Group sysFlag.
        group_sys_flag: Option<i32> = "groupSysFlag";
    }
}

command_header! {
    /// RESET_CONSUMER_CLIENT_OFFSET (220, broker → client, oneway) request header.
    pub struct ResetOffsetRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
        /// Consumer group.
        group: String = "group";
        /// Queue id (−1 = all).
        queue_id: i32 = "queueId", default -1;
        /// Offset to reset to.
        offset: Option<i64> = "offset";
        /// Timestamp to reset to, ms.
        timestamp: i64 = "timestamp";
        /// Reset even forward.
        is_force: bool = "isForce";
    }
}
