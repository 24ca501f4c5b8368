//! Producer headers: SEND_MESSAGE (10) and its V2 form (310, 320, 325), END_TRANSACTION (37),
//! CHECK_TRANSACTION_STATE (39). Spec section 2.2.

use super::{command_header, EmptyHeader, RpcFields};

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
