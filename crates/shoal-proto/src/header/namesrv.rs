//! Name server headers (spec section 2.6 and Java's `header/namesrv` classes).

use super::{command_header, EmptyHeader};

command_header! {
    /// GET_ROUTEINFO_BY_TOPIC (105) request header.
    pub struct GetRouteInfoRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
        /// Ask for standard JSON (quoted map keys) regardless of version.
        accept_standard_json_only: Option<bool> = "acceptStandardJsonOnly";
    }
}

command_header! {
    /// REGISTER_BROKER (103) request header.
    pub struct RegisterBrokerRequestHeader [rpc] {
        /// Broker name.
        broker_name: String = "brokerName";
        /// Broker address `ip:port`.
        broker_addr: String = "brokerAddr";
        /// Cluster name.
        cluster_name: String = "clusterName";
        /// HA server address.
        ha_server_addr: String = "haServerAddr";
        /// Broker id (0 = master).
        broker_id: i64 = "brokerId";
        /// Expiry time the name server should apply, ms (default 120000).
        heartbeat_timeout_millis: Option<i64> = "heartbeatTimeoutMillis";
        /// Acting-master mode.
        enable_acting_master: Option<bool> = "enableActingMaster";
        /// Body is the compressed layout.
        compressed: bool = "compressed", default false;
        /// CRC32 of the body (0 = unchecked).
        body_crc32: i32 = "bodyCrc32", default 0;
        /// Zone name (extra extField).
        zone_name: Option<String> = "__ZONE_NAME";
    }
}

command_header! {
    /// REGISTER_BROKER response header.
    pub struct RegisterBrokerResponseHeader {
        /// HA server address of the master.
        ha_server_addr: Option<String> = "haServerAddr";
        /// Master address.
        master_addr: Option<String> = "masterAddr";
    }
}

command_header! {
    /// UNREGISTER_BROKER (104) request header.
    pub struct UnregisterBrokerRequestHeader [rpc] {
        /// Broker name.
        broker_name: String = "brokerName";
        /// Broker address.
        broker_addr: String = "brokerAddr";
        /// Cluster name.
        cluster_name: String = "clusterName";
        /// Broker id.
        broker_id: i64 = "brokerId";
    }
}

command_header! {
    /// BROKER_HEARTBEAT (904) request header.
    pub struct BrokerHeartbeatRequestHeader [rpc] {
        /// Cluster name.
        cluster_name: String = "clusterName";
        /// Broker address.
        broker_addr: String = "brokerAddr";
        /// Broker name.
        broker_name: String = "brokerName";
        /// Broker id.
        broker_id: Option<i64> = "brokerId";
        /// Controller epoch.
        epoch: Option<i32> = "epoch";
        /// Max commit-log offset.
        max_offset: Option<i64> = "maxOffset";
        /// Confirmed offset.
        confirm_offset: Option<i64> = "confirmOffset";
        /// Heartbeat timeout, ms (Java's spelling).
        heartbeat_timeout_mills: Option<i64> = "heartbeatTimeoutMills";
        /// Election priority.
        election_priority: Option<i32> = "electionPriority";
    }
}

command_header! {
    /// DELETE_TOPIC_IN_NAMESRV (216) request header.
    pub struct DeleteTopicFromNamesrvRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
        /// Only in this cluster.
        cluster_name: Option<String> = "clusterName";
    }
}

command_header! {
    /// REGISTER_TOPIC_IN_NAMESRV (217) request header (body = TopicRouteData).
    pub struct RegisterTopicRequestHeader [rpc] {
        /// Topic.
        topic: String = "topic";
    }
}

command_header! {
    /// GET_TOPICS_BY_CLUSTER (224) request header (response body: TopicList).
    pub struct GetTopicsByClusterRequestHeader [rpc] {
        /// Cluster name.
        cluster: String = "cluster";
    }
}

command_header! {
    /// GET_KV_CONFIG (101) request header.
    pub struct GetKvConfigRequestHeader [rpc] {
        /// Namespace.
        namespace: String = "namespace";
        /// Key.
        key: String = "key";
    }
}

command_header! {
    /// GET_KV_CONFIG response header.
    pub struct GetKvConfigResponseHeader {
        /// Value (absent when not found).
        value: Option<String> = "value";
    }
}

command_header! {
    /// PUT_KV_CONFIG (100) request header.
    pub struct PutKvConfigRequestHeader [rpc] {
        /// Namespace.
        namespace: String = "namespace";
        /// Key.
        key: String = "key";
        /// Value.
        value: String = "value";
    }
}

command_header! {
    /// DELETE_KV_CONFIG (102) request header.
    pub struct DeleteKvConfigRequestHeader [rpc] {
        /// Namespace.
        namespace: String = "namespace";
        /// Key.
        key: String = "key";
    }
}

command_header! {
    /// GET_KVLIST_BY_NAMESPACE (219) request header (response body: KVTable).
    pub struct GetKvListByNamespaceRequestHeader [rpc] {
        /// Namespace.
        namespace: String = "namespace";
    }
}

command_header! {
    /// WIPE_WRITE_PERM_OF_BROKER (205) request header.
    pub struct WipeWritePermOfBrokerRequestHeader [rpc] {
        /// Broker name.
        broker_name: String = "brokerName";
    }
}

command_header! {
    /// WIPE_WRITE_PERM_OF_BROKER response header.
    pub struct WipeWritePermOfBrokerResponseHeader {
        /// Number of topics changed.
        wipe_topic_count: i32 = "wipeTopicCount";
    }
}

command_header! {
    /// ADD_WRITE_PERM_OF_BROKER (327) request header.
    pub struct AddWritePermOfBrokerRequestHeader [rpc] {
        /// Broker name.
        broker_name: String = "brokerName";
    }
}

command_header! {
    /// ADD_WRITE_PERM_OF_BROKER response header.
    pub struct AddWritePermOfBrokerResponseHeader {
        /// Number of topics changed.
        add_topic_count: i32 = "addTopicCount";
    }
}

command_header! {
    /// QUERY_DATA_VERSION (322) request header (body = DataVersion).
    pub struct QueryDataVersionRequestHeader [rpc] {
        /// Broker name.
        broker_name: String = "brokerName";
        /// Broker address.
        broker_addr: String = "brokerAddr";
        /// Cluster name.
        cluster_name: String = "clusterName";
        /// Broker id.
        broker_id: i64 = "brokerId";
    }
}

command_header! {
    /// QUERY_DATA_VERSION response header.
    pub struct QueryDataVersionResponseHeader {
        /// Whether the name server's data version differs.
        changed: Option<bool> = "changed";
    }
}

/// UNREGISTER_BROKER response header: no fields.
pub type UnregisterBrokerResponseHeader = EmptyHeader;
