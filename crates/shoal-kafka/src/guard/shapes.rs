//! Request layouts of the APIs the listener implements: per message structure, its fields
//! with the versions they appear in (Kafka's message schemas as kafka-protocol 0.18 decodes
//! them), and the version from which each message is flexible (compact lengths, tagged
//! fields). `tests.rs` checks every table against kafka-protocol's encoder and decoder.

use super::{f, t, Shape, Ty, MAX, NEVER};
use kafka_protocol::messages::ApiKey;

static PRODUCE_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str),                                             // transactional_id
        f(0, MAX, Ty::Fixed(2)),                                        // acks
        f(0, MAX, Ty::Fixed(4)),                                        // timeout_ms
        f(0, MAX, Ty::Array(&Ty::Struct(&PRODUCE_TOPIC_PRODUCE_DATA))), // topic_data
    ],
    tagged: &[],
};

static PRODUCE_TOPIC_PRODUCE_DATA: Shape = Shape {
    fields: &[
        f(0, 12, Ty::Str),         // name
        f(13, MAX, Ty::Fixed(16)), // topic_id
        f(
            0,
            MAX,
            Ty::Array(&Ty::Struct(&PRODUCE_PARTITION_PRODUCE_DATA)),
        ), // partition_data
    ],
    tagged: &[],
};

static PRODUCE_PARTITION_PRODUCE_DATA: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Fixed(4)), // index
        f(0, MAX, Ty::Bytes),    // records
    ],
    tagged: &[],
};

static FETCH_REQUEST: Shape = Shape {
    fields: &[
        f(0, 14, Ty::Fixed(4)),                                    // replica_id
        f(0, MAX, Ty::Fixed(4)),                                   // max_wait_ms
        f(0, MAX, Ty::Fixed(4)),                                   // min_bytes
        f(0, MAX, Ty::Fixed(4)),                                   // max_bytes
        f(0, MAX, Ty::Fixed(1)),                                   // isolation_level
        f(7, MAX, Ty::Fixed(4)),                                   // session_id
        f(7, MAX, Ty::Fixed(4)),                                   // session_epoch
        f(0, MAX, Ty::Array(&Ty::Struct(&FETCH_TOPIC))),           // topics
        f(7, MAX, Ty::Array(&Ty::Struct(&FETCH_FORGOTTEN_TOPIC))), // forgotten_topics_data
        f(11, MAX, Ty::Str),                                       // rack_id
    ],
    tagged: &[
        t(0, 0, Ty::Str),                           // cluster_id
        t(1, 15, Ty::Struct(&FETCH_REPLICA_STATE)), // replica_state
    ],
};

static FETCH_TOPIC: Shape = Shape {
    fields: &[
        f(0, 12, Ty::Str),                                   // topic
        f(13, MAX, Ty::Fixed(16)),                           // topic_id
        f(0, MAX, Ty::Array(&Ty::Struct(&FETCH_PARTITION))), // partitions
    ],
    tagged: &[],
};

static FETCH_PARTITION: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Fixed(4)),  // partition
        f(9, MAX, Ty::Fixed(4)),  // current_leader_epoch
        f(0, MAX, Ty::Fixed(8)),  // fetch_offset
        f(12, MAX, Ty::Fixed(4)), // last_fetched_epoch
        f(5, MAX, Ty::Fixed(8)),  // log_start_offset
        f(0, MAX, Ty::Fixed(4)),  // partition_max_bytes
    ],
    tagged: &[
        t(0, 17, Ty::Fixed(16)), // replica_directory_id
        t(1, 18, Ty::Fixed(8)),  // high_watermark
    ],
};

static FETCH_FORGOTTEN_TOPIC: Shape = Shape {
    fields: &[
        f(7, 12, Ty::Str),                   // topic
        f(13, MAX, Ty::Fixed(16)),           // topic_id
        f(7, MAX, Ty::Array(&Ty::Fixed(4))), // partitions
    ],
    tagged: &[],
};

static FETCH_REPLICA_STATE: Shape = Shape {
    fields: &[
        f(15, MAX, Ty::Fixed(4)), // replica_id
        f(15, MAX, Ty::Fixed(8)), // replica_epoch
    ],
    tagged: &[],
};

static LIST_OFFSETS_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Fixed(4)),                                // replica_id
        f(2, MAX, Ty::Fixed(1)),                                // isolation_level
        f(0, MAX, Ty::Array(&Ty::Struct(&LIST_OFFSETS_TOPIC))), // topics
        f(10, MAX, Ty::Fixed(4)),                               // timeout_ms
    ],
    tagged: &[],
};

static LIST_OFFSETS_TOPIC: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str),                                         // name
        f(0, MAX, Ty::Array(&Ty::Struct(&LIST_OFFSETS_PARTITION))), // partitions
    ],
    tagged: &[],
};

static LIST_OFFSETS_PARTITION: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Fixed(4)), // partition_index
        f(4, MAX, Ty::Fixed(4)), // current_leader_epoch
        f(0, MAX, Ty::Fixed(8)), // timestamp
    ],
    tagged: &[],
};

static METADATA_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Array(&Ty::Struct(&METADATA_REQUEST_TOPIC))), // topics
        f(4, MAX, Ty::Fixed(1)),                                    // allow_auto_topic_creation
        f(8, 10, Ty::Fixed(1)),  // include_cluster_authorized_operations
        f(8, MAX, Ty::Fixed(1)), // include_topic_authorized_operations
    ],
    tagged: &[],
};

static METADATA_REQUEST_TOPIC: Shape = Shape {
    fields: &[
        f(10, MAX, Ty::Fixed(16)), // topic_id
        f(0, MAX, Ty::Str),        // name
    ],
    tagged: &[],
};

static OFFSET_COMMIT_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str),                                              // group_id
        f(0, MAX, Ty::Fixed(4)), // generation_id_or_member_epoch
        f(0, MAX, Ty::Str),      // member_id
        f(7, MAX, Ty::Str),      // group_instance_id
        f(0, 4, Ty::Fixed(8)),   // retention_time_ms
        f(0, MAX, Ty::Array(&Ty::Struct(&OFFSET_COMMIT_REQUEST_TOPIC))), // topics
    ],
    tagged: &[],
};

static OFFSET_COMMIT_REQUEST_TOPIC: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str), // name
        f(
            0,
            MAX,
            Ty::Array(&Ty::Struct(&OFFSET_COMMIT_REQUEST_PARTITION)),
        ), // partitions
    ],
    tagged: &[],
};

static OFFSET_COMMIT_REQUEST_PARTITION: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Fixed(4)), // partition_index
        f(0, MAX, Ty::Fixed(8)), // committed_offset
        f(6, MAX, Ty::Fixed(4)), // committed_leader_epoch
        f(0, MAX, Ty::Str),      // committed_metadata
    ],
    tagged: &[],
};

static OFFSET_FETCH_REQUEST: Shape = Shape {
    fields: &[
        f(0, 7, Ty::Str),                                               // group_id
        f(0, 7, Ty::Array(&Ty::Struct(&OFFSET_FETCH_REQUEST_TOPIC))),   // topics
        f(8, MAX, Ty::Array(&Ty::Struct(&OFFSET_FETCH_REQUEST_GROUP))), // groups
        f(7, MAX, Ty::Fixed(1)),                                        // require_stable
    ],
    tagged: &[],
};

static OFFSET_FETCH_REQUEST_TOPIC: Shape = Shape {
    fields: &[
        f(0, 7, Ty::Str),                  // name
        f(0, 7, Ty::Array(&Ty::Fixed(4))), // partition_indexes
    ],
    tagged: &[],
};

static OFFSET_FETCH_REQUEST_GROUP: Shape = Shape {
    fields: &[
        f(8, MAX, Ty::Str),                                              // group_id
        f(9, MAX, Ty::Str),                                              // member_id
        f(9, MAX, Ty::Fixed(4)),                                         // member_epoch
        f(8, MAX, Ty::Array(&Ty::Struct(&OFFSET_FETCH_REQUEST_TOPICS))), // topics
    ],
    tagged: &[],
};

static OFFSET_FETCH_REQUEST_TOPICS: Shape = Shape {
    fields: &[
        f(8, MAX, Ty::Str),                  // name
        f(8, MAX, Ty::Array(&Ty::Fixed(4))), // partition_indexes
    ],
    tagged: &[],
};

static FIND_COORDINATOR_REQUEST: Shape = Shape {
    fields: &[
        f(0, 3, Ty::Str),               // key
        f(1, MAX, Ty::Fixed(1)),        // key_type
        f(4, MAX, Ty::Array(&Ty::Str)), // coordinator_keys
    ],
    tagged: &[],
};

static JOIN_GROUP_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str),                                              // group_id
        f(0, MAX, Ty::Fixed(4)),                                         // session_timeout_ms
        f(1, MAX, Ty::Fixed(4)),                                         // rebalance_timeout_ms
        f(0, MAX, Ty::Str),                                              // member_id
        f(5, MAX, Ty::Str),                                              // group_instance_id
        f(0, MAX, Ty::Str),                                              // protocol_type
        f(0, MAX, Ty::Array(&Ty::Struct(&JOIN_GROUP_REQUEST_PROTOCOL))), // protocols
        f(8, MAX, Ty::Str),                                              // reason
    ],
    tagged: &[],
};

static JOIN_GROUP_REQUEST_PROTOCOL: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str),   // name
        f(0, MAX, Ty::Bytes), // metadata
    ],
    tagged: &[],
};

static HEARTBEAT_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str),      // group_id
        f(0, MAX, Ty::Fixed(4)), // generation_id
        f(0, MAX, Ty::Str),      // member_id
        f(3, MAX, Ty::Str),      // group_instance_id
    ],
    tagged: &[],
};

static LEAVE_GROUP_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str),                                              // group_id
        f(0, 2, Ty::Str),                                                // member_id
        f(3, MAX, Ty::Array(&Ty::Struct(&LEAVE_GROUP_MEMBER_IDENTITY))), // members
    ],
    tagged: &[],
};

static LEAVE_GROUP_MEMBER_IDENTITY: Shape = Shape {
    fields: &[
        f(3, MAX, Ty::Str), // member_id
        f(3, MAX, Ty::Str), // group_instance_id
        f(5, MAX, Ty::Str), // reason
    ],
    tagged: &[],
};

static SYNC_GROUP_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str),      // group_id
        f(0, MAX, Ty::Fixed(4)), // generation_id
        f(0, MAX, Ty::Str),      // member_id
        f(3, MAX, Ty::Str),      // group_instance_id
        f(5, MAX, Ty::Str),      // protocol_type
        f(5, MAX, Ty::Str),      // protocol_name
        f(
            0,
            MAX,
            Ty::Array(&Ty::Struct(&SYNC_GROUP_REQUEST_ASSIGNMENT)),
        ), // assignments
    ],
    tagged: &[],
};

static SYNC_GROUP_REQUEST_ASSIGNMENT: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str),   // member_id
        f(0, MAX, Ty::Bytes), // assignment
    ],
    tagged: &[],
};

static DESCRIBE_GROUPS_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Array(&Ty::Str)), // groups
        f(3, MAX, Ty::Fixed(1)),        // include_authorized_operations
    ],
    tagged: &[],
};

static LIST_GROUPS_REQUEST: Shape = Shape {
    fields: &[
        f(4, MAX, Ty::Array(&Ty::Str)), // states_filter
        f(5, MAX, Ty::Array(&Ty::Str)), // types_filter
    ],
    tagged: &[],
};

static SASL_HANDSHAKE_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str), // mechanism
    ],
    tagged: &[],
};

static API_VERSIONS_REQUEST: Shape = Shape {
    fields: &[
        f(3, MAX, Ty::Str), // client_software_name
        f(3, MAX, Ty::Str), // client_software_version
    ],
    tagged: &[],
};

static CREATE_TOPICS_REQUEST: Shape = Shape {
    fields: &[
        f(
            0,
            MAX,
            Ty::Array(&Ty::Struct(&CREATE_TOPICS_CREATABLE_TOPIC)),
        ), // topics
        f(0, MAX, Ty::Fixed(4)), // timeout_ms
        f(0, MAX, Ty::Fixed(1)), // validate_only
    ],
    tagged: &[],
};

static CREATE_TOPICS_CREATABLE_TOPIC: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str),      // name
        f(0, MAX, Ty::Fixed(4)), // num_partitions
        f(0, MAX, Ty::Fixed(2)), // replication_factor
        f(
            0,
            MAX,
            Ty::Array(&Ty::Struct(&CREATE_TOPICS_CREATABLE_REPLICA_ASSIGNMENT)),
        ), // assignments
        f(
            0,
            MAX,
            Ty::Array(&Ty::Struct(&CREATE_TOPICS_CREATABLE_TOPIC_CONFIG)),
        ), // configs
    ],
    tagged: &[],
};

static CREATE_TOPICS_CREATABLE_REPLICA_ASSIGNMENT: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Fixed(4)),             // partition_index
        f(0, MAX, Ty::Array(&Ty::Fixed(4))), // broker_ids
    ],
    tagged: &[],
};

static CREATE_TOPICS_CREATABLE_TOPIC_CONFIG: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str), // name
        f(0, MAX, Ty::Str), // value
    ],
    tagged: &[],
};

static DELETE_TOPICS_REQUEST: Shape = Shape {
    fields: &[
        f(
            6,
            MAX,
            Ty::Array(&Ty::Struct(&DELETE_TOPICS_DELETE_TOPIC_STATE)),
        ), // topics
        f(0, 5, Ty::Array(&Ty::Str)), // topic_names
        f(0, MAX, Ty::Fixed(4)),      // timeout_ms
    ],
    tagged: &[],
};

static DELETE_TOPICS_DELETE_TOPIC_STATE: Shape = Shape {
    fields: &[
        f(6, MAX, Ty::Str),       // name
        f(6, MAX, Ty::Fixed(16)), // topic_id
    ],
    tagged: &[],
};

static INIT_PRODUCER_ID_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str),      // transactional_id
        f(0, MAX, Ty::Fixed(4)), // transaction_timeout_ms
        f(3, MAX, Ty::Fixed(8)), // producer_id
        f(3, MAX, Ty::Fixed(2)), // producer_epoch
    ],
    tagged: &[],
};

static OFFSET_FOR_LEADER_EPOCH_REQUEST: Shape = Shape {
    fields: &[
        f(3, MAX, Ty::Fixed(4)), // replica_id
        f(
            0,
            MAX,
            Ty::Array(&Ty::Struct(
                &OFFSET_FOR_LEADER_EPOCH_OFFSET_FOR_LEADER_TOPIC,
            )),
        ), // topics
    ],
    tagged: &[],
};

static OFFSET_FOR_LEADER_EPOCH_OFFSET_FOR_LEADER_TOPIC: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str), // topic
        f(
            0,
            MAX,
            Ty::Array(&Ty::Struct(
                &OFFSET_FOR_LEADER_EPOCH_OFFSET_FOR_LEADER_PARTITION,
            )),
        ), // partitions
    ],
    tagged: &[],
};

static OFFSET_FOR_LEADER_EPOCH_OFFSET_FOR_LEADER_PARTITION: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Fixed(4)), // partition
        f(0, MAX, Ty::Fixed(4)), // current_leader_epoch
        f(0, MAX, Ty::Fixed(4)), // leader_epoch
    ],
    tagged: &[],
};

static DESCRIBE_CONFIGS_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Array(&Ty::Struct(&DESCRIBE_CONFIGS_RESOURCE))), // resources
        f(0, MAX, Ty::Fixed(1)),                                       // include_synonyms
        f(3, MAX, Ty::Fixed(1)),                                       // include_documentation
    ],
    tagged: &[],
};

static DESCRIBE_CONFIGS_RESOURCE: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Fixed(1)),        // resource_type
        f(0, MAX, Ty::Str),             // resource_name
        f(0, MAX, Ty::Array(&Ty::Str)), // configuration_keys
    ],
    tagged: &[],
};

static CREATE_PARTITIONS_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Array(&Ty::Struct(&CREATE_PARTITIONS_TOPIC))), // topics
        f(0, MAX, Ty::Fixed(4)),                                     // timeout_ms
        f(0, MAX, Ty::Fixed(1)),                                     // validate_only
    ],
    tagged: &[],
};

static CREATE_PARTITIONS_TOPIC: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str),      // name
        f(0, MAX, Ty::Fixed(4)), // count
        f(
            0,
            MAX,
            Ty::Array(&Ty::Struct(&CREATE_PARTITIONS_ASSIGNMENT)),
        ), // assignments
    ],
    tagged: &[],
};

static CREATE_PARTITIONS_ASSIGNMENT: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Array(&Ty::Fixed(4))), // broker_ids
    ],
    tagged: &[],
};

static DELETE_GROUPS_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Array(&Ty::Str)), // groups_names
    ],
    tagged: &[],
};

static CONSUMER_GROUP_HEARTBEAT_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Str),             // group_id
        f(0, MAX, Ty::Str),             // member_id
        f(0, MAX, Ty::Fixed(4)),        // member_epoch
        f(0, MAX, Ty::Str),             // instance_id
        f(0, MAX, Ty::Str),             // rack_id
        f(0, MAX, Ty::Fixed(4)),        // rebalance_timeout_ms
        f(0, MAX, Ty::Array(&Ty::Str)), // subscribed_topic_names
        f(1, MAX, Ty::Str),             // subscribed_topic_regex
        f(0, MAX, Ty::Str),             // server_assignor
        f(
            0,
            MAX,
            Ty::Array(&Ty::Struct(&CONSUMER_GROUP_HEARTBEAT_TOPIC_PARTITIONS)),
        ), // topic_partitions
    ],
    tagged: &[],
};

static CONSUMER_GROUP_HEARTBEAT_TOPIC_PARTITIONS: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Fixed(16)),            // topic_id
        f(0, MAX, Ty::Array(&Ty::Fixed(4))), // partitions
    ],
    tagged: &[],
};

static CONSUMER_GROUP_DESCRIBE_REQUEST: Shape = Shape {
    fields: &[
        f(0, MAX, Ty::Array(&Ty::Str)), // group_ids
        f(0, MAX, Ty::Fixed(1)),        // include_authorized_operations
    ],
    tagged: &[],
};

/// The layout of `key`'s request body and the version it is flexible from.
pub(crate) fn request_shape(key: ApiKey) -> Option<(&'static Shape, i16)> {
    Some(match key {
        ApiKey::Produce => (&PRODUCE_REQUEST, 9),
        ApiKey::Fetch => (&FETCH_REQUEST, 12),
        ApiKey::ListOffsets => (&LIST_OFFSETS_REQUEST, 6),
        ApiKey::Metadata => (&METADATA_REQUEST, 9),
        ApiKey::OffsetCommit => (&OFFSET_COMMIT_REQUEST, 8),
        ApiKey::OffsetFetch => (&OFFSET_FETCH_REQUEST, 6),
        ApiKey::FindCoordinator => (&FIND_COORDINATOR_REQUEST, 3),
        ApiKey::JoinGroup => (&JOIN_GROUP_REQUEST, 6),
        ApiKey::Heartbeat => (&HEARTBEAT_REQUEST, 4),
        ApiKey::LeaveGroup => (&LEAVE_GROUP_REQUEST, 4),
        ApiKey::SyncGroup => (&SYNC_GROUP_REQUEST, 4),
        ApiKey::DescribeGroups => (&DESCRIBE_GROUPS_REQUEST, 5),
        ApiKey::ListGroups => (&LIST_GROUPS_REQUEST, 3),
        ApiKey::SaslHandshake => (&SASL_HANDSHAKE_REQUEST, NEVER),
        ApiKey::ApiVersions => (&API_VERSIONS_REQUEST, 3),
        ApiKey::CreateTopics => (&CREATE_TOPICS_REQUEST, 5),
        ApiKey::DeleteTopics => (&DELETE_TOPICS_REQUEST, 4),
        ApiKey::InitProducerId => (&INIT_PRODUCER_ID_REQUEST, 2),
        ApiKey::OffsetForLeaderEpoch => (&OFFSET_FOR_LEADER_EPOCH_REQUEST, 4),
        ApiKey::DescribeConfigs => (&DESCRIBE_CONFIGS_REQUEST, 4),
        ApiKey::CreatePartitions => (&CREATE_PARTITIONS_REQUEST, 2),
        ApiKey::DeleteGroups => (&DELETE_GROUPS_REQUEST, 2),
        ApiKey::ConsumerGroupHeartbeat => (&CONSUMER_GROUP_HEARTBEAT_REQUEST, 0),
        ApiKey::ConsumerGroupDescribe => (&CONSUMER_GROUP_DESCRIBE_REQUEST, 0),
        _ => return None,
    })
}
