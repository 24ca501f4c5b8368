//! Admin headers on the broker (spec section 2.5 and Java's admin header classes).

use super::{command_header, EmptyHeader};

command_header! {
    /// UPDATE_AND_CREATE_TOPIC (17) request header.
    pub struct CreateTopicRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
        /// Template topic.
        default_topic: String = "defaultTopic";
        /// Read queue count.
        read_queue_nums: i32 = "readQueueNums";
        /// Write queue count.
        write_queue_nums: i32 = "writeQueueNums";
        /// Permission bits ([`crate::constants::perm`]).
        perm: i32 = "perm";
        /// `SINGLE_TAG` or `MULTI_TAG`.
        topic_filter_type: String = "topicFilterType";
        /// Topic sysFlag.
        topic_sys_flag: Option<i32> = "topicSysFlag";
        /// Ordered topic.
        order: bool = "order", default false;
        /// Attributes, e.g. `+message.type=NORMAL`, comma-separated.
        attributes: Option<String> = "attributes";
        /// Force the update.
        force: bool = "force", default false;
    }
}

command_header! {
    /// GET_ALL_TOPIC_CONFIG (21) request header (paging; old clients send nothing).
    pub struct GetAllTopicConfigRequestHeader [rpc] {
        /// Page start.
        topic_seq: Option<i32> = "topicSeq";
        /// Data version of the previous page.
        data_version: Option<String> = "dataVersion";
        /// Page size.
        max_topic_num: Option<i32> = "maxTopicNum";
    }
}

command_header! {
    /// GET_ALL_TOPIC_CONFIG response header.
    pub struct GetAllTopicConfigResponseHeader {
        /// Total number of topics.
        total_topic_num: Option<i32> = "totalTopicNum";
    }
}

command_header! {
    /// GET_TOPIC_CONFIG (351) request header.
    pub struct GetTopicConfigRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
    }
}

command_header! {
    /// GET_CONSUMER_CONNECTION_LIST (203) request header.
    pub struct GetConsumerConnectionListRequestHeader [rpc] {
        /// Consumer group.
        consumer_group: String = "consumerGroup";
    }
}

command_header! {
    /// GET_PRODUCER_CONNECTION_LIST (204) request header.
    pub struct GetProducerConnectionListRequestHeader [rpc] {
        /// Producer group.
        producer_group: String = "producerGroup";
    }
}

command_header! {
    /// GET_CONSUME_STATS (208) request header.
    pub struct GetConsumeStatsRequestHeader [rpc] {
        /// Consumer group.
        consumer_group: String = "consumerGroup";
        /// Only this topic.
        topic: Option<String> = "topic";
        /// Only these topics (`;`-separated).
        topic_list: Option<String> = "topicList";
    }
}

command_header! {
    /// DELETE_TOPIC_IN_BROKER (215) request header.
    pub struct DeleteTopicRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
    }
}

command_header! {
    /// GET_TOPIC_STATS_INFO (202) request header (response body: TopicStatsTable).
    pub struct GetTopicStatsInfoRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
    }
}

command_header! {
    /// QUERY_TOPIC_CONSUME_BY_WHO (300) request header (response body: GroupList).
    pub struct QueryTopicConsumeByWhoRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
    }
}

/// INVOKE_BROKER_TO_RESET_OFFSET (222, admin → broker) request header: the same class as
/// RESET_CONSUMER_CLIENT_OFFSET.
pub type InvokeBrokerToResetOffsetRequestHeader = super::ResetOffsetRequestHeader;

/// INVOKE_BROKER_TO_RESET_OFFSET response header: no fields (body = ResetOffsetBody).
pub type InvokeBrokerToResetOffsetResponseHeader = EmptyHeader;

command_header! {
    /// GET_CONSUMER_STATUS_FROM_CLIENT (221) and INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223)
    /// request header.
    pub struct GetConsumerStatusRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
        /// Consumer group.
        group: String = "group";
        /// Only this client address.
        client_addr: Option<String> = "clientAddr";
    }
}

command_header! {
    /// GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) request header (paging; optional).
    pub struct GetAllSubscriptionGroupRequestHeader [rpc] {
        /// Page start.
        group_seq: Option<i32> = "groupSeq";
        /// Data version of the previous page.
        data_version: Option<String> = "dataVersion";
        /// Page size.
        max_group_num: Option<i32> = "maxGroupNum";
    }
}

command_header! {
    /// GET_SUBSCRIPTIONGROUP_CONFIG (352) request header.
    pub struct GetSubscriptionGroupConfigRequestHeader [rpc] {
        /// Group.
        group: String = "group";
    }
}

command_header! {
    /// DELETE_SUBSCRIPTIONGROUP (207) request header.
    pub struct DeleteSubscriptionGroupRequestHeader [rpc] {
        /// Group.
        group_name: String = "groupName";
        /// Also delete the group's offsets.
        clean_offset: bool = "cleanOffset", default false;
    }
}

command_header! {
    /// CLONE_GROUP_OFFSET (314) request header.
    pub struct CloneGroupOffsetRequestHeader [rpc] {
        /// Source group.
        src_group: String = "srcGroup";
        /// Destination group.
        dest_group: String = "destGroup";
        /// Only this topic.
        topic: Option<String> = "topic";
        /// Source group is offline.
        offline: bool = "offline", default false;
    }
}

command_header! {
    /// QUERY_CONSUME_QUEUE (321) request header.
    pub struct QueryConsumeQueueRequestHeader [rpc] {
        /// Topic.
        topic: Option<String> = "topic";
        /// Queue id.
        queue_id: i32 = "queueId", default 0;
        /// First consume-queue index.
        index: i64 = "index", default 0;
        /// Number of entries.
        count: i32 = "count", default 0;
        /// Group whose subscription filters the entries.
        consumer_group: Option<String> = "consumerGroup";
    }
}

command_header! {
    /// QUERY_CONSUME_TIME_SPAN (303) request header.
    pub struct QueryConsumeTimeSpanRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
        /// Consumer group.
        group: String = "group";
    }
}

command_header! {
    /// GET_BROKER_CONFIG (26) response header (body = properties text).
    pub struct GetBrokerConfigResponseHeader {
        /// Config data version (JSON of DataVersion).
        version: String = "version";
    }
}
