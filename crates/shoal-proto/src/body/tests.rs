//! Byte-exact tests against the JSON examples of spec sections 3 and 8, plus property tests.

use super::*;
use crate::code::request_code;
use crate::MessageQueue;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// Removes the line breaks (and the indentation after them) of a multi-line spec example.
fn one_line(s: &str) -> String {
    s.lines().map(str::trim_start).collect()
}

fn enc<T: serde::Serialize>(v: &T) -> String {
    String::from_utf8(to_json_bytes(v).unwrap()).unwrap()
}

fn dec<T: serde::de::DeserializeOwned>(s: &str) -> T {
    from_json_slice(s.as_bytes()).unwrap()
}

fn mq(topic: &str, broker: &str, id: i32) -> MessageQueue {
    MessageQueue::new(topic, broker, id)
}

const ROUTE: &str = r#"{"brokerDatas":[{"brokerAddrs":{"0":"192.168.0.1:10911","1":"192.168.0.3:10911"},"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false}],
 "filterServerTable":{},
 "queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}"#;

fn route_value() -> TopicRouteData {
    TopicRouteData {
        broker_datas: vec![BrokerData {
            broker_addrs: BTreeMap::from([
                (0, "192.168.0.1:10911".to_owned()),
                (1, "192.168.0.3:10911".to_owned()),
            ]),
            broker_name: "broker-a".into(),
            cluster: "DefaultCluster".into(),
            enable_acting_master: false,
            zone_name: None,
            kafka_listeners: None,
        }],
        filter_server_table: BTreeMap::new(),
        order_topic_conf: None,
        queue_datas: vec![QueueData {
            broker_name: "broker-a".into(),
            perm: 6,
            read_queue_nums: 4,
            topic_sys_flag: 0,
            write_queue_nums: 4,
        }],
        topic_queue_mapping_by_broker: None,
        kafka_departed: None,
    }
}

#[test]
fn spec_3_2_topic_route_data() {
    assert_eq!(enc(&route_value()), one_line(ROUTE));
    assert_eq!(dec::<TopicRouteData>(ROUTE), route_value());
    // The fastjson form with bare numeric keys (old name servers, old clients).
    let fastjson = one_line(ROUTE)
        .replace(r#""0":"#, "0:")
        .replace(r#""1":"#, "1:");
    assert!(fastjson.contains("{0:\"192.168.0.1:10911\",1:"));
    assert_eq!(dec::<TopicRouteData>(&fastjson), route_value());
}

#[test]
fn route_queue_derivation() {
    let mut r = route_value();
    r.queue_datas.push(QueueData {
        broker_name: "broker-0".into(),
        perm: 6,
        read_queue_nums: 1,
        topic_sys_flag: 0,
        write_queue_nums: 1,
    });
    // broker-0 has no BrokerData (no master): subscribable but not publishable.
    let publish = r.publish_queues("T");
    assert_eq!(
        publish,
        (0..4).map(|i| mq("T", "broker-a", i)).collect::<Vec<_>>()
    );
    let subscribe = r.subscribe_queues("T");
    assert_eq!(subscribe.len(), 5);
    r.queue_datas[0].perm = 4; // read only
    assert!(r.publish_queues("T").is_empty());
    assert_eq!(r.broker_datas[0].master_addr(), Some("192.168.0.1:10911"));
}

const HEARTBEAT: &str = r#"{"clientID":"192.168.0.2@12345#123456789",
 "consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","consumeType":"CONSUME_PASSIVELY","groupName":"CG","messageModel":"CLUSTERING",
   "subscriptionDataSet":[
     {"classFilterMode":false,"codeSet":[],"expressionType":"TAG","subString":"*","subVersion":1700000000001,"tagsSet":[],"topic":"%RETRY%CG"},
     {"classFilterMode":false,"codeSet":[3552231,3552232],"expressionType":"TAG","subString":"tagA || tagB","subVersion":1700000000000,"tagsSet":["tagA","tagB"],"topic":"T"}],
   "unitMode":false}],
 "heartbeatFingerprint":0,
 "producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"}],
 "withoutSub":false}"#;

fn heartbeat_value() -> HeartbeatData {
    HeartbeatData {
        client_id: "192.168.0.2@12345#123456789".into(),
        consumer_data_set: vec![ConsumerData {
            consume_from_where: ConsumeFromWhere::ConsumeFromLastOffset,
            consume_type: ConsumeType::ConsumePassively,
            group_name: "CG".into(),
            message_model: MessageModel::Clustering,
            subscription_data_set: vec![
                SubscriptionData::from_tag_expression("%RETRY%CG", "*", 1_700_000_000_001),
                SubscriptionData::from_tag_expression("T", "tagA || tagB", 1_700_000_000_000),
            ],
            unit_mode: false,
        }],
        heartbeat_fingerprint: 0,
        producer_data_set: vec![ProducerData {
            group_name: crate::constants::CLIENT_INNER_PRODUCER_GROUP.into(),
        }],
        without_sub: false,
    }
}

#[test]
fn spec_3_3_heartbeat_data() {
    assert_eq!(enc(&heartbeat_value()), one_line(HEARTBEAT));
    assert_eq!(dec::<HeartbeatData>(HEARTBEAT), heartbeat_value());
}

#[test]
fn heartbeat_from_cpp_client() {
    // Enums as ordinals, subVersion as a string, tagsSet/codeSet/expressionType/
    // classFilterMode/producerDataSet missing (spec 10).
    let cpp = r#"{"clientID":"7587-127.0.0.1@DEFAULT","consumerDataSet":[{"consumeFromWhere":4,
        "consumeType":1,"groupName":"CG","messageModel":1,"subscriptionDataSet":[{"subString":"a || b",
        "subVersion":"1700000000000","topic":"T"},{"subString":"*","subVersion":"5","topic":"U"}],
        "unitMode":false}]}"#;
    let h: HeartbeatData = dec(cpp);
    // jsoncpp's FastWriter ends its output with a newline.
    assert_eq!(dec::<HeartbeatData>(&format!("{cpp}\n")), h);
    assert!(h.producer_data_set.is_empty());
    let c = &h.consumer_data_set[0];
    assert_eq!(
        c.consume_from_where,
        ConsumeFromWhere::ConsumeFromFirstOffset
    );
    assert_eq!(c.consume_type, ConsumeType::ConsumePassively);
    assert_eq!(c.message_model, MessageModel::Clustering);
    let s = &c.subscription_data_set[0];
    assert_eq!(s.sub_version, 1_700_000_000_000);
    assert_eq!(s.expression_type, ExpressionType::Tag);
    assert_eq!(s.tags_set, BTreeSet::from(["a".to_owned(), "b".to_owned()]));
    assert_eq!(s.code_set, BTreeSet::from([97, 98]));
    let all = &c.subscription_data_set[1];
    assert!(all.tags_set.is_empty() && all.code_set.is_empty() && all.is_sub_all());
    // Enum names given as digit strings and out-of-range ordinals.
    let s: SubscriptionData = dec(r#"{"expressionType":"1","topic":"T","subString":"a>1"}"#);
    assert_eq!(s.expression_type, ExpressionType::Sql92);
    assert!(s.tags_set.is_empty());
    assert!(from_json_slice::<ConsumerData>(br#"{"consumeType":7}"#).is_err());
    assert!(from_json_slice::<ConsumerData>(br#"{"consumeType":-1}"#).is_err());
    assert!(from_json_slice::<ConsumerData>(br#"{"messageModel":"CLUSTER"}"#).is_err());
}

/// The HEART_BEAT body of Apache RocketMQ's Go client (rocketmq-client-go v2) with a push
/// consumer subscribed `TagA || TagB`: `codeSet` as strings of digits, `messageModel` as
/// `Clustering`, `subVersion` in nanoseconds. Apache's broker (fastjson: numbers from strings,
/// enum names in any case) accepts it; so must Shoal.
#[test]
fn heartbeat_from_go_client() {
    let go = r#"{"clientID":"127.0.0.1@1234#5678","producerDataSet":[{"groupName":"PG"}],
        "consumerDataSet":[{"groupName":"CG","consumeType":"CONSUME_PASSIVELY",
        "messageModel":"Clustering","consumeFromWhere":"CONSUME_FROM_FIRST_OFFSET",
        "subscriptionDataSet":[{"classFilterMode":false,"topic":"T","subString":"TagA || TagB",
        "tagsSet":["TagA","TagB"],"codeSet":["2598919","2598920"],"subVersion":1733356800123456789,
        "expressionType":"TAG"},{"classFilterMode":false,"topic":"%RETRY%CG","subString":"*",
        "tagsSet":[],"codeSet":[],"subVersion":1733356800123456790,"expressionType":"TAG"}],
        "unitMode":false}]}"#;
    let h: HeartbeatData = dec(go);
    let c = &h.consumer_data_set[0];
    assert_eq!(c.message_model, MessageModel::Clustering);
    assert_eq!(
        c.consume_from_where,
        ConsumeFromWhere::ConsumeFromFirstOffset
    );
    let s = &c.subscription_data_set[0];
    assert_eq!(s.code_set, BTreeSet::from([2598919, 2598920]));
    assert_eq!(
        s.code_set,
        SubscriptionData::from_tag_expression("T", "TagA || TagB", 0).code_set
    );
    assert_eq!(s.sub_version, 1_733_356_800_123_456_789);
    assert!(c.subscription_data_set[1].is_sub_all());
    // Broadcasting as the Go client spells it; numbers still read as numbers.
    let b: ConsumerData = dec(
        r#"{"messageModel":"BroadCasting","subscriptionDataSet":[{"topic":"T","subString":"a","codeSet":[97]}]}"#,
    );
    assert_eq!(b.message_model, MessageModel::Broadcasting);
    assert_eq!(b.subscription_data_set[0].code_set, BTreeSet::from([97]));
    // Not numbers: still an error.
    assert!(from_json_slice::<SubscriptionData>(br#"{"topic":"T","codeSet":["x"]}"#).is_err());
    assert!(
        from_json_slice::<SubscriptionData>(br#"{"topic":"T","codeSet":["99999999999"]}"#).is_err()
    );
}

#[test]
fn subscription_from_tag_expressions() {
    let s = SubscriptionData::from_tag_expression("T", "", 1);
    assert_eq!(s.sub_string, "*");
    assert!(s.tags_set.is_empty() && s.code_set.is_empty());
    let s = SubscriptionData::from_tag_expression("T", " tagA ||  || tagB||tagA ", 1);
    assert_eq!(s.sub_string, " tagA ||  || tagB||tagA ");
    assert_eq!(
        s.tags_set,
        BTreeSet::from(["tagA".to_owned(), "tagB".to_owned()])
    );
    assert_eq!(s.code_set, BTreeSet::from([3552231, 3552232]));
    assert!(s.matches_tags_code(3552231));
    assert!(!s.matches_tags_code(42));
    assert!(s.matches_tags(Some("tagB")));
    assert!(!s.matches_tags(Some("tagC")));
    assert!(!s.matches_tags(None));
    let all = SubscriptionData::from_tag_expression("T", "*", 1);
    assert!(all.matches_tags_code(12345) && all.matches_tags(None));
    let sql = SubscriptionData::sql92("T", "a > 1", 0);
    assert_eq!(
        enc(&sql),
        r#"{"classFilterMode":false,"codeSet":[],"expressionType":"SQL92","subString":"a > 1","subVersion":0,"tagsSet":[],"topic":"T"}"#
    );
}

#[test]
fn spec_3_4_small_bodies() {
    let list = r#"{"consumerIdList":["192.168.0.2@1#1","192.168.0.4@2#2"]}"#;
    let v = GetConsumerListByGroupResponseBody {
        consumer_id_list: vec!["192.168.0.2@1#1".into(), "192.168.0.4@2#2".into()],
    };
    assert_eq!(enc(&v), list);
    assert_eq!(dec::<GetConsumerListByGroupResponseBody>(list), v);

    let lock = r#"{"clientId":"192.168.0.2@12345#123456789","consumerGroup":"CG","mqSet":[{"brokerName":"broker-a","queueId":1,"topic":"T"},{"brokerName":"broker-a","queueId":0,"topic":"T"}],"onlyThisBroker":false}"#;
    let v = LockBatchRequestBody {
        client_id: "192.168.0.2@12345#123456789".into(),
        consumer_group: "CG".into(),
        mq_set: vec![mq("T", "broker-a", 1), mq("T", "broker-a", 0)],
        only_this_broker: false,
    };
    assert_eq!(enc(&v), lock);
    assert_eq!(dec::<LockBatchRequestBody>(lock), v);
    let u = UnlockBatchRequestBody {
        client_id: v.client_id.clone(),
        consumer_group: v.consumer_group.clone(),
        mq_set: v.mq_set.clone(),
        only_this_broker: false,
    };
    assert_eq!(enc(&u), lock);
    assert_eq!(dec::<UnlockBatchRequestBody>(lock), u);

    let resp = r#"{"lockOKMQSet":[{"brokerName":"broker-a","queueId":0,"topic":"T"}]}"#;
    let v = LockBatchResponseBody {
        lock_ok_mq_set: vec![mq("T", "broker-a", 0)],
    };
    assert_eq!(enc(&v), resp);
    assert_eq!(dec::<LockBatchResponseBody>(resp), v);
}

#[test]
fn spec_3_4_cluster_info_fastjson_and_standard() {
    let fastjson = r#"{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"192.168.0.1:10911",1:"192.168.0.3:10911"},"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false}},"clusterAddrTable":{"DefaultCluster":["broker-a"]}}"#;
    let v = ClusterInfo {
        broker_addr_table: BTreeMap::from([(
            "broker-a".to_owned(),
            route_value().broker_datas[0].clone(),
        )]),
        cluster_addr_table: BTreeMap::from([(
            "DefaultCluster".to_owned(),
            BTreeSet::from(["broker-a".to_owned()]),
        )]),
    };
    assert_eq!(dec::<ClusterInfo>(fastjson), v);
    // Shoal writes the standard form: the same text with quoted numeric keys.
    let standard = fastjson.replace("{0:", "{\"0\":").replace(",1:", ",\"1\":");
    assert_eq!(enc(&v), standard);
}

const REGISTER: &str = r#"{"filterServerList":[],
 "topicConfigSerializeWrapper":{"dataVersion":{"counter":0,"stateVersion":0,"timestamp":1700000000000},
   "mappingDataVersion":{"counter":0,"stateVersion":0,"timestamp":1795980751774},
   "topicConfigTable":{"T":{"attributes":{},"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"T","topicSysFlag":0,"writeQueueNums":4}},
   "topicQueueMappingDetailMap":{},"topicQueueMappingInfoMap":{}}}"#;

fn register_value() -> RegisterBrokerBody {
    RegisterBrokerBody {
        filter_server_list: vec![],
        topic_config_serialize_wrapper: TopicConfigAndMappingSerializeWrapper {
            data_version: DataVersion::new(1_700_000_000_000),
            mapping_data_version: DataVersion::new(1_795_980_751_774),
            topic_config_table: BTreeMap::from([("T".to_owned(), TopicConfig::new("T", 4))]),
            topic_queue_mapping_detail_map: BTreeMap::new(),
            topic_queue_mapping_info_map: BTreeMap::new(),
        },
    }
}

#[test]
fn spec_3_5_register_broker_body() {
    assert_eq!(enc(&register_value()), one_line(REGISTER));
    assert_eq!(dec::<RegisterBrokerBody>(REGISTER), register_value());
}

#[test]
fn register_broker_body_compressed_round_trip() {
    let mut body = register_value();
    let mut t2 = TopicConfig::new("%RETRY%CG", 1);
    t2.attributes
        .insert("+message.type".into(), "NORMAL".into());
    t2.topic_filter_type = TopicFilterType::MultiTag;
    t2.perm = 7;
    body.topic_config_serialize_wrapper
        .topic_config_table
        .insert(t2.topic_name.clone(), t2);
    body.filter_server_list.push("10.0.0.1:7777".into());
    body.topic_config_serialize_wrapper
        .topic_queue_mapping_info_map
        .insert(
            "S".into(),
            serde_json::json!({"topic":"S","totalQueues":8,"bname":"broker-a","epoch":1}),
        );
    let bytes = body.encode_compressed().unwrap();
    // zlib stream, best compression header.
    assert_eq!(bytes[0], 0x78);
    let mut expected = body.clone();
    expected.topic_config_serialize_wrapper.mapping_data_version = DataVersion::default();
    assert_eq!(
        RegisterBrokerBody::decode_compressed(&bytes, 479).unwrap(),
        expected
    );
    // An old broker (< V5_0_0) has no mapping section: it is not read.
    let old = RegisterBrokerBody::decode_compressed(&bytes, 412).unwrap();
    assert!(old
        .topic_config_serialize_wrapper
        .topic_queue_mapping_info_map
        .is_empty());
    assert_eq!(old.filter_server_list, expected.filter_server_list);
}

#[test]
fn compressed_register_body_malformed_is_error() {
    assert!(RegisterBrokerBody::decode_compressed(b"not zlib", 479).is_err());
    let bytes = register_value().encode_compressed().unwrap();
    assert!(RegisterBrokerBody::decode_compressed(&bytes[..bytes.len() / 2], 479).is_err());
    // Negative and oversized lengths inside a valid zlib stream.
    use std::io::Write;
    for raw in [
        (-1i32).to_be_bytes().to_vec(),
        1000i32.to_be_bytes().to_vec(),
        [
            2i32.to_be_bytes().to_vec(),
            b"{}".to_vec(),
            5i32.to_be_bytes().to_vec(),
        ]
        .concat(),
    ] {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(&raw).unwrap();
        let z = e.finish().unwrap();
        assert!(RegisterBrokerBody::decode_compressed(&z, 479).is_err());
    }
}

#[test]
fn topic_config_text_codec() {
    let mut t = TopicConfig::new("T", 4);
    assert_eq!(t.encode_text(), "T 4 4 6 SINGLE_TAG {}");
    t.attributes.insert("+message.type".into(), "NORMAL".into());
    t.attributes.insert("a".into(), "x y".into());
    let text = t.encode_text();
    assert_eq!(
        text,
        r#"T 4 4 6 SINGLE_TAG {"+message.type":"NORMAL","a":"x y"}"#
    );
    assert_eq!(TopicConfig::decode_text(&text).unwrap(), t);
    let t5 = TopicConfig::decode_text("T 1 2 7 MULTI_TAG").unwrap();
    assert_eq!(
        (t5.read_queue_nums, t5.write_queue_nums, t5.perm),
        (1, 2, 7)
    );
    assert_eq!(t5.topic_filter_type, TopicFilterType::MultiTag);
    for bad in ["", "T 1 2 7", "T x 2 7 SINGLE_TAG", "T 1 2 7 NO_TAG"] {
        assert!(TopicConfig::decode_text(bad).is_err(), "{bad:?}");
    }
}

const CONNECTION: &str = r#"{"connectionSet":[{"clientAddr":"192.168.0.2:53000","clientId":"192.168.0.2@12345#1","language":"JAVA","version":479}],
 "consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING",
 "subscriptionTable":{"T":{"classFilterMode":false,"codeSet":[],"expressionType":"TAG","subString":"*","subVersion":1700000000000,"tagsSet":[],"topic":"T"}}}"#;

#[test]
fn spec_3_6_consumer_connection() {
    let v = ConsumerConnection {
        connection_set: vec![Connection {
            client_addr: "192.168.0.2:53000".into(),
            client_id: "192.168.0.2@12345#1".into(),
            language: crate::LanguageCode::Java,
            version: 479,
        }],
        consume_from_where: Some(ConsumeFromWhere::ConsumeFromLastOffset),
        consume_type: Some(ConsumeType::ConsumePassively),
        message_model: Some(MessageModel::Clustering),
        subscription_table: BTreeMap::from([(
            "T".to_owned(),
            SubscriptionData::from_tag_expression("T", "*", 1_700_000_000_000),
        )]),
    };
    assert_eq!(enc(&v), one_line(CONNECTION));
    assert_eq!(dec::<ConsumerConnection>(CONNECTION), v);
    let c: Connection = dec(r#"{"language":1,"version":63}"#);
    assert_eq!(c.language, crate::LanguageCode::Cpp);
    assert!(from_json_slice::<Connection>(br#"{"language":"COBOL"}"#).is_err());
}

#[test]
fn spec_3_7_consume_stats() {
    let fastjson = r#"{"consumeTps":1.5,"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:{"brokerOffset":10,"consumerOffset":7,"lastTimestamp":1700000000000,"pullOffset":8}}}"#;
    let v = ConsumeStats {
        consume_tps: 1.5,
        offset_table: BTreeMap::from([(
            mq("T", "broker-a", 0),
            OffsetWrapper {
                broker_offset: 10,
                consumer_offset: 7,
                last_timestamp: 1_700_000_000_000,
                pull_offset: 8,
            },
        )]),
    };
    assert_eq!(dec::<ConsumeStats>(fastjson), v);
    let standard = r#"{"consumeTps":1.5,"offsetTable":{"{\"brokerName\":\"broker-a\",\"queueId\":0,\"topic\":\"T\"}":{"brokerOffset":10,"consumerOffset":7,"lastTimestamp":1700000000000,"pullOffset":8}}}"#;
    assert_eq!(enc(&v), standard);
    assert_eq!(dec::<ConsumeStats>(standard), v);
}

#[test]
fn spec_3_7_reset_offset_body() {
    let fastjson = r#"{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:5}}"#;
    let v = ResetOffsetBody {
        offset_table: BTreeMap::from([(mq("T", "broker-a", 0), 5)]),
    };
    assert_eq!(dec::<ResetOffsetBody>(fastjson), v);
    assert_eq!(
        enc(&v),
        r#"{"offsetTable":{"{\"brokerName\":\"broker-a\",\"queueId\":0,\"topic\":\"T\"}":5}}"#
    );
    // A key that is not a MessageQueue is an error naming it.
    let err = from_json_slice::<ResetOffsetBody>(br#"{"offsetTable":{"nope":5}}"#).unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
}

#[test]
fn spec_3_7_consumer_running_info() {
    let fastjson = r#"{"mqPopTable":{},"mqTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:{"cachedMsgCount":0,"cachedMsgMaxOffset":0,"cachedMsgMinOffset":0,"cachedMsgSizeInMiB":0,"commitOffset":5,"droped":false,"lastConsumeTimestamp":0,"lastLockTimestamp":0,"lastPullTimestamp":0,"locked":false,"transactionMsgCount":0,"transactionMsgMaxOffset":0,"transactionMsgMinOffset":0,"tryUnlockTimes":0}},"properties":{"PROP_CONSUMER_START_TIMESTAMP":"1700000000000","consumeType":"CONSUME_PASSIVELY"},"statusTable":{"T":{"consumeFailedMsgs":0,"consumeFailedTPS":0.0,"consumeOKTPS":0.0,"consumeRT":0.0,"pullRT":0.0,"pullTPS":0.0}},"subscriptionSet":[{"classFilterMode":false,"codeSet":[],"expressionType":"TAG","subString":"*","subVersion":1700000000000,"tagsSet":[],"topic":"T"}],"userConsumerInfo":{}}"#;
    let v = ConsumerRunningInfo {
        jstack: None,
        mq_pop_table: BTreeMap::new(),
        mq_table: BTreeMap::from([(
            mq("T", "broker-a", 0),
            ProcessQueueInfo {
                commit_offset: 5,
                ..Default::default()
            },
        )]),
        properties: BTreeMap::from([
            (
                "PROP_CONSUMER_START_TIMESTAMP".to_owned(),
                "1700000000000".to_owned(),
            ),
            ("consumeType".to_owned(), "CONSUME_PASSIVELY".to_owned()),
        ]),
        status_table: BTreeMap::from([("T".to_owned(), ConsumeStatus::default())]),
        subscription_set: vec![SubscriptionData::from_tag_expression(
            "T",
            "*",
            1_700_000_000_000,
        )],
        user_consumer_info: BTreeMap::new(),
    };
    assert_eq!(dec::<ConsumerRunningInfo>(fastjson), v);
    let key = r#"{{"brokerName":"broker-a","queueId":0,"topic":"T"}:"#;
    let standard = fastjson.replace(
        key,
        r#"{"{\"brokerName\":\"broker-a\",\"queueId\":0,\"topic\":\"T\"}":"#,
    );
    assert_eq!(enc(&v), standard);
}

#[test]
fn running_info_properties_accept_scalars() {
    let r: ConsumerRunningInfo = dec(r#"{"properties":{"a":1,"b":true,"c":"x","d":null}}"#);
    assert_eq!(
        r.properties,
        BTreeMap::from([
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), "true".to_owned()),
            ("c".to_owned(), "x".to_owned()),
        ])
    );
    assert!(from_json_slice::<ConsumerRunningInfo>(br#"{"properties":{"a":[1]}}"#).is_err());
}

#[test]
fn spec_2_4_consume_message_directly_result() {
    let s = r#"{"autoCommit":true,"consumeResult":"CR_SUCCESS","order":false,"remark":"ok","spentTimeMills":3}"#;
    let v = ConsumeMessageDirectlyResult {
        remark: Some("ok".into()),
        spent_time_mills: 3,
        ..Default::default()
    };
    assert_eq!(enc(&v), s);
    assert_eq!(dec::<ConsumeMessageDirectlyResult>(s), v);
    let r: ConsumeMessageDirectlyResult = dec(r#"{"consumeResult":4}"#);
    assert_eq!(r.consume_result, ConsumeResult::ThrowException);
    assert!(r.auto_commit);
}

#[test]
fn spec_8_query_assignment_and_request_mode() {
    let req = r#"{"clientId":"cid","consumerGroup":"CG","messageModel":"CLUSTERING","strategyName":"AVG","topic":"T"}"#;
    let v = QueryAssignmentRequestBody {
        client_id: "cid".into(),
        consumer_group: "CG".into(),
        message_model: MessageModel::Clustering,
        strategy_name: "AVG".into(),
        topic: "T".into(),
    };
    assert_eq!(enc(&v), req);
    assert_eq!(dec::<QueryAssignmentRequestBody>(req), v);

    let resp = r#"{"messageQueueAssignments":[{"messageQueue":{"brokerName":"broker-a","queueId":0,"topic":"T"},"mode":"POP"}]}"#;
    let v = QueryAssignmentResponseBody {
        message_queue_assignments: vec![MessageQueueAssignment {
            attachments: None,
            message_queue: mq("T", "broker-a", 0),
            mode: MessageRequestMode::Pop,
        }],
    };
    assert_eq!(enc(&v), resp);
    assert_eq!(dec::<QueryAssignmentResponseBody>(resp), v);

    let mode = r#"{"consumerGroup":"CG","mode":"POP","popShareQueueNum":0,"topic":"T"}"#;
    let v = SetMessageRequestModeRequestBody {
        consumer_group: "CG".into(),
        mode: MessageRequestMode::Pop,
        pop_share_queue_num: 0,
        topic: "T".into(),
    };
    assert_eq!(enc(&v), mode);
    assert_eq!(dec::<SetMessageRequestModeRequestBody>(mode), v);
}

#[test]
fn other_bodies_encode_sorted() {
    let t = TopicList {
        broker_addr: None,
        topic_list: BTreeSet::from(["b".to_owned(), "a".to_owned()]),
    };
    assert_eq!(enc(&t), r#"{"topicList":["a","b"]}"#);
    let kv = KVTable {
        table: BTreeMap::from([
            ("z".to_owned(), "1".to_owned()),
            ("a".to_owned(), "2".to_owned()),
        ]),
    };
    assert_eq!(enc(&kv), r#"{"table":{"a":"2","z":"1"}}"#);
    let g = GroupList {
        group_list: BTreeSet::from(["G".to_owned()]),
    };
    assert_eq!(enc(&g), r#"{"groupList":["G"]}"#);
    let stats = TopicStatsTable {
        offset_table: BTreeMap::from([(
            mq("T", "b", 1),
            TopicOffset {
                last_update_timestamp: 3,
                max_offset: 2,
                min_offset: 1,
            },
        )]),
        topic_put_tps: 0.0,
    };
    let s = enc(&stats);
    assert_eq!(
        s,
        r#"{"offsetTable":{"{\"brokerName\":\"b\",\"queueId\":1,\"topic\":\"T\"}":{"lastUpdateTimestamp":3,"maxOffset":2,"minOffset":1}},"topicPutTps":0.0}"#
    );
    assert_eq!(dec::<TopicStatsTable>(&s), stats);
    // Integer-keyed nested maps in fastjson form (GET_ALL_CONSUMER_OFFSET).
    let offsets: ConsumerOffsetSerializeWrapper = dec(r#"{"offsetTable":{"T@CG":{0:5,1:-1}}}"#);
    assert_eq!(
        offsets.offset_table["T@CG"],
        BTreeMap::from([(0, 5), (1, -1)])
    );
    assert_eq!(enc(&offsets), r#"{"offsetTable":{"T@CG":{"0":5,"1":-1}}}"#);
}

#[test]
fn missing_fields_default_and_unknown_fields_ignored() {
    let r: TopicRouteData = dec(r#"{"unknown":[1,{"x":2}]}"#);
    assert_eq!(r, TopicRouteData::default());
    let t: TopicConfig = dec(r#"{"topicName":"T"}"#);
    assert_eq!((t.read_queue_nums, t.perm), (16, 6));
    let s: SubscriptionGroupConfig =
        dec(r#"{"groupName":"G","groupRetryPolicy":{"type":"CUSTOMIZED"}}"#);
    assert_eq!(s.retry_max_times, 16);
    assert!(s.group_retry_policy.is_some());
}

#[test]
fn bad_json_is_an_error() {
    for bad in [
        &b""[..],
        b"{",
        b"nul",
        b"{\"consumerIdList\":[1]}",
        b"{\"consumerIdList\":\"x\"}",
        b"[1,2]",
        b"\xff\xfe",
        b"{0:}",
    ] {
        let r = from_json_slice::<GetConsumerListByGroupResponseBody>(bad);
        assert!(
            matches!(r, Err(crate::ProtoError::Json { .. })),
            "{bad:?}: {r:?}"
        );
    }
}

#[test]
fn command_body_helpers() {
    let body = LockBatchResponseBody {
        lock_ok_mq_set: vec![mq("T", "b", 0)],
    };
    let cmd = crate::RemotingCommand::response(0, None)
        .with_json_body(&body)
        .unwrap();
    assert_eq!(
        cmd.decode_json_body::<LockBatchResponseBody>().unwrap(),
        body
    );
    let empty = crate::RemotingCommand::request(request_code::LOCK_BATCH_MQ);
    assert!(empty.decode_json_body::<LockBatchResponseBody>().is_err());
}

#[test]
fn enums_by_name_and_ordinal() {
    for (i, v) in ConsumeFromWhere::ALL.iter().enumerate() {
        assert_eq!(v.ordinal(), i);
        assert_eq!(ConsumeFromWhere::from_ordinal(i as u64), Some(*v));
        assert_eq!(ConsumeFromWhere::from_name(v.name()), Some(*v));
        let by_name: ConsumeFromWhere = serde_json::from_str(&format!("\"{}\"", v.name())).unwrap();
        let by_ordinal: ConsumeFromWhere = serde_json::from_str(&i.to_string()).unwrap();
        assert_eq!((by_name, by_ordinal), (*v, *v));
    }
    assert_eq!(ConsumeFromWhere::ConsumeFromTimestamp.ordinal(), 5);
    assert_eq!(MessageModel::Clustering.ordinal(), 1);
    assert_eq!(ConsumeType::ConsumePop.ordinal(), 2);
    assert_eq!(ConsumeResult::ReturnNull.name(), "CR_RETURN_NULL");
}

fn arb_mq() -> impl Strategy<Value = MessageQueue> {
    ("\\PC{0,8}", "[{}:,\"\\\\a-z]{0,8}", any::<i32>()).prop_map(|(t, b, q)| mq(&t, &b, q))
}

fn arb_subscription() -> impl Strategy<Value = SubscriptionData> {
    (
        "\\PC{0,8}",
        "[a-z ]{0,5}( \\|\\| [a-z]{0,4}){0,3}",
        any::<i64>(),
    )
        .prop_map(|(t, e, v)| SubscriptionData::from_tag_expression(t, &e, v))
}

fn round_trip<T>(v: &T) -> std::result::Result<(), TestCaseError>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let bytes = to_json_bytes(v).unwrap();
    let back: T = from_json_slice(&bytes).unwrap();
    prop_assert_eq!(&back, v);
    // Writing is deterministic: the re-encoded bytes are identical.
    prop_assert_eq!(to_json_bytes(&back).unwrap(), bytes);
    Ok(())
}

/// Floats with short exact decimal forms: serde_json (without its `float_roundtrip` feature)
/// may parse long decimals to a neighbouring f64, which is fine for TPS statistics.
fn arb_f64() -> impl Strategy<Value = f64> {
    (-1_000_000_000i64..1_000_000_000).prop_map(|n| n as f64 / 4.0)
}

proptest! {
    #[test]
    fn more_bodies_round_trip(
        mqs in proptest::collection::vec(arb_mq(), 0..5),
        names in proptest::collection::btree_set("\\PC{0,8}", 0..4),
        subs in proptest::collection::vec(arb_subscription(), 0..3),
        nums in proptest::collection::vec(any::<i64>(), 6),
        tps in arb_f64(),
        lang in 0..14u8,
        flag in any::<bool>(),
        text in "\\PC{0,12}",
    ) {
        round_trip(&LockBatchRequestBody {
            client_id: text.clone(),
            consumer_group: text.clone(),
            mq_set: mqs.clone(),
            only_this_broker: flag,
        })?;
        round_trip(&LockBatchResponseBody { lock_ok_mq_set: mqs.clone() })?;
        round_trip(&ClusterInfo {
            broker_addr_table: names.iter().map(|n| (n.clone(), BrokerData {
                broker_addrs: BTreeMap::from([(nums[0], text.clone())]),
                broker_name: n.clone(),
                cluster: text.clone(),
                enable_acting_master: flag,
                zone_name: flag.then(|| text.clone()),
                kafka_listeners: flag.then(|| BTreeMap::from([(nums[0], KafkaListener {
                    node_id: 7,
                    addr: text.clone(),
                    leader_epoch: flag.then_some(3),
                    in_sync: flag.then(|| nums.clone()),
                })])),
            })).collect(),
            cluster_addr_table: BTreeMap::from([(text.clone(), names.clone())]),
        })?;
        round_trip(&ConsumerConnection {
            connection_set: vec![Connection {
                client_addr: text.clone(),
                client_id: text.clone(),
                language: crate::LanguageCode::from_code(lang).unwrap(),
                version: nums[1] as i32,
            }],
            consume_from_where: flag.then_some(ConsumeFromWhere::ConsumeFromTimestamp),
            consume_type: Some(ConsumeType::ConsumeActively),
            message_model: None,
            subscription_table: subs.iter().map(|s| (s.topic.clone(), s.clone())).collect(),
        })?;
        round_trip(&ConsumeStats {
            consume_tps: tps,
            offset_table: mqs.iter().map(|m| (m.clone(), OffsetWrapper {
                broker_offset: nums[2], consumer_offset: nums[3], last_timestamp: nums[4], pull_offset: nums[5],
            })).collect(),
        })?;
        round_trip(&ConsumerRunningInfo {
            jstack: flag.then(|| text.clone()),
            mq_pop_table: mqs.iter().map(|m| (m.clone(), PopProcessQueueInfo {
                droped: flag, last_pop_timestamp: nums[0], wait_ack_count: nums[1] as i32,
            })).collect(),
            mq_table: mqs.iter().map(|m| (m.clone(), ProcessQueueInfo {
                commit_offset: nums[2], locked: flag, try_unlock_times: nums[3], ..Default::default()
            })).collect(),
            properties: BTreeMap::from([(text.clone(), text.clone())]),
            status_table: BTreeMap::from([(text.clone(), ConsumeStatus {
                consume_failed_msgs: nums[4], consume_failed_tps: tps, consume_ok_tps: tps,
                consume_rt: tps, pull_rt: tps, pull_tps: tps,
            })]),
            subscription_set: subs.clone(),
            user_consumer_info: BTreeMap::new(),
        })?;
        round_trip(&QueryAssignmentResponseBody {
            message_queue_assignments: mqs.iter().map(|m| MessageQueueAssignment {
                attachments: flag.then(|| BTreeMap::from([(text.clone(), text.clone())])),
                message_queue: m.clone(),
                mode: if flag { MessageRequestMode::Pop } else { MessageRequestMode::Pull },
            }).collect(),
        })?;
        round_trip(&TopicStatsTable {
            offset_table: mqs.iter().map(|m| (m.clone(), TopicOffset {
                last_update_timestamp: nums[0], max_offset: nums[1], min_offset: nums[2],
            })).collect(),
            topic_put_tps: tps,
        })?;
        round_trip(&ConsumeMessageDirectlyResult {
            auto_commit: flag,
            consume_result: ConsumeResult::from_ordinal(u64::from(lang % 6)).unwrap(),
            order: !flag,
            remark: Some(text.clone()),
            spent_time_mills: nums[0],
        })?;
        round_trip(&KVTable { table: BTreeMap::from([(text.clone(), text.clone())]) })?;
        round_trip(&TopicList { broker_addr: Some(text.clone()), topic_list: names.clone() })?;
        round_trip(&GroupList { group_list: names })?;
    }

    #[test]
    fn heartbeat_round_trips(
        client in "\\PC{0,20}",
        groups in proptest::collection::vec(("\\PC{0,8}", 0..3u64, 0..2u64, 0..6u64,
            proptest::collection::vec(arb_subscription(), 0..3), any::<bool>()), 0..3),
        producers in proptest::collection::vec("\\PC{0,8}", 0..3),
        fingerprint in any::<i32>(),
        without_sub in any::<bool>(),
    ) {
        let h = HeartbeatData {
            client_id: client,
            consumer_data_set: groups.into_iter().map(|(g, t, m, f, subs, u)| ConsumerData {
                consume_from_where: ConsumeFromWhere::from_ordinal(f).unwrap(),
                consume_type: ConsumeType::from_ordinal(t).unwrap(),
                group_name: g,
                message_model: MessageModel::from_ordinal(m).unwrap(),
                subscription_data_set: subs,
                unit_mode: u,
            }).collect(),
            heartbeat_fingerprint: fingerprint,
            producer_data_set: producers.into_iter().map(|g| ProducerData { group_name: g }).collect(),
            without_sub,
        };
        let bytes = to_json_bytes(&h).unwrap();
        prop_assert_eq!(from_json_slice::<HeartbeatData>(&bytes).unwrap(), h);
    }

    #[test]
    fn mq_keyed_bodies_round_trip_standard_and_fastjson(
        table in proptest::collection::btree_map(arb_mq(), any::<i64>(), 0..6),
    ) {
        let body = ResetOffsetBody { offset_table: table.clone() };
        let bytes = to_json_bytes(&body).unwrap();
        prop_assert_eq!(from_json_slice::<ResetOffsetBody>(&bytes).unwrap(), body.clone());
        // fastjson form: object keys.
        let entries: Vec<String> = table.iter()
            .map(|(k, v)| format!("{}:{v}", serde_json::to_string(k).unwrap()))
            .collect();
        let fastjson = format!("{{\"offsetTable\":{{{}}}}}", entries.join(","));
        prop_assert_eq!(from_json_slice::<ResetOffsetBody>(fastjson.as_bytes()).unwrap(), body);
    }

    #[test]
    fn route_round_trips_with_numeric_keys(
        addrs in proptest::collection::btree_map(any::<i64>(), "\\PC{0,12}", 0..4),
        name in "\\PC{0,8}",
        perm in any::<i32>(),
        queues in any::<i32>(),
    ) {
        let r = TopicRouteData {
            broker_datas: vec![BrokerData { broker_addrs: addrs.clone(), broker_name: name.clone(), ..Default::default() }],
            queue_datas: vec![QueueData { broker_name: name, perm, read_queue_nums: queues, write_queue_nums: queues, topic_sys_flag: 0 }],
            ..Default::default()
        };
        let bytes = to_json_bytes(&r).unwrap();
        prop_assert_eq!(from_json_slice::<TopicRouteData>(&bytes).unwrap(), r.clone());
        let entries: Vec<String> = addrs.iter()
            .map(|(k, v)| format!("{k}:{}", serde_json::to_string(v).unwrap()))
            .collect();
        let text = String::from_utf8(bytes).unwrap();
        let standard_addrs = serde_json::to_string(&addrs).unwrap();
        let fastjson = text.replacen(&standard_addrs, &format!("{{{}}}", entries.join(",")), 1);
        prop_assert_eq!(from_json_slice::<TopicRouteData>(fastjson.as_bytes()).unwrap(), r);
    }

    #[test]
    fn topic_config_wrapper_round_trips(
        topics in proptest::collection::btree_map("[A-Za-z0-9%_-]{1,10}",
            (any::<i32>(), any::<i32>(), 0..8i32, any::<bool>(),
             proptest::collection::btree_map("[a-z.+]{1,6}", "[A-Za-z ]{0,6}", 0..3)), 0..5),
        ts in any::<i64>(),
        counter in any::<i64>(),
    ) {
        let mut body = RegisterBrokerBody::default();
        let w = &mut body.topic_config_serialize_wrapper;
        w.data_version = DataVersion { counter, state_version: 0, timestamp: ts };
        for (name, (r, wq, p, multi, attrs)) in topics {
            let mut t = TopicConfig::new(name.clone(), 0);
            t.read_queue_nums = r;
            t.write_queue_nums = wq;
            t.perm = p;
            t.topic_filter_type = if multi { TopicFilterType::MultiTag } else { TopicFilterType::SingleTag };
            t.attributes = attrs;
            w.topic_config_table.insert(name, t);
        }
        let json = to_json_bytes(&body).unwrap();
        prop_assert_eq!(from_json_slice::<RegisterBrokerBody>(&json).unwrap(), body.clone());
        let z = body.encode_compressed().unwrap();
        prop_assert_eq!(RegisterBrokerBody::decode_compressed(&z, 479).unwrap(), body);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = from_json_slice::<HeartbeatData>(&bytes);
        let _ = from_json_slice::<ConsumeStats>(&bytes);
        let _ = RegisterBrokerBody::decode_compressed(&bytes, 479);
    }
}

/// What Apache RocketMQ's C++ client (librocketmq, PyPI `rocketmq` 0.4.4) answers to
/// GET_CONSUMER_RUNNING_INFO, as captured from a live consumer: pretty-printed object keys, 64-bit
/// fields as strings, `subVersion` as a string, no `statusTable`.
#[test]
fn consumer_running_info_from_the_cpp_client() {
    let cpp = r#"{"mqTable":{{
   "brokerName" : "broker-a",
   "queueId" : 0,
   "topic" : "CppX"
}:{
   "cachedMsgCount" : 0,
   "cachedMsgMaxOffset" : "4",
   "cachedMsgMinOffset" : "0",
   "commitOffset" : "5",
   "droped" : false,
   "lastConsumeTimestamp" : "1796121823743",
   "lastLockTimestamp" : "825292860872982528",
   "lastPullTimestamp" : "1796121823742",
   "locked" : false,
   "transactionMsgCount" : 0,
   "transactionMsgMaxOffset" : "0",
   "transactionMsgMinOffset" : "0",
   "tryUnlockTimes" : 0
}
},"jstack":"","properties":{"PROP_CLIENT_VERSION":"V3_1_8","PROP_CONSUMEORDERLY":"flase","PROP_CONSUMER_START_TIMESTAMP":"1796121803637","PROP_CONSUME_TYPE":"CONSUME_PASSIVELY","PROP_NAMESERVER_ADDR":"127.0.0.1:23001","PROP_THREADPOOL_CORE_SIZE":"2"},"subscriptionSet":[{"subString":"*","subVersion":"1796121803638","topic":"CppX"}]}"#;
    let info: ConsumerRunningInfo = from_json_slice(cpp.as_bytes()).unwrap();
    let pq = info.mq_table[&mq("CppX", "broker-a", 0)];
    assert_eq!(pq.commit_offset, 5);
    assert_eq!(pq.cached_msg_max_offset, 4);
    assert_eq!(pq.last_pull_timestamp, 1_796_121_823_742);
    assert!(!pq.droped);
    assert_eq!(info.subscription_set[0].sub_version, 1_796_121_803_638);
    assert_eq!(info.properties["PROP_CONSUME_TYPE"], "CONSUME_PASSIVELY");
    // Strings that are not numbers are still an error naming the value.
    let bad = cpp.replace(r#""commitOffset" : "5""#, r#""commitOffset" : "five""#);
    let err = from_json_slice::<ConsumerRunningInfo>(bad.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("five"), "{err}");
}

#[test]
fn batch_ack_body_as_fastjson_writes_it() {
    // RocketMQ 5.x: short names, the bit set as fastjson2 writes BitSet.toByteArray().
    let java = r#"{"acks":[{"b":[5,-128],"c":"CG","it":60000,"pt":1700000000000,"q":1,"r":"0","rq":0,"so":10,"t":"T"}],"brokerName":"broker-a"}"#;
    let v: BatchAckMessageRequestBody = dec(java);
    assert_eq!(v.broker_name, "broker-a");
    let a = &v.acks[0];
    assert_eq!(a.consumer_group, "CG");
    assert_eq!(a.offsets(100), [10, 12, 25]);
    assert_eq!(a.offsets(2), [10, 12]);
    assert_eq!(enc(&v), java);
    // The long names and a base64 bit set read too.
    let long = r#"{"brokerName":"b","acks":[{"consumerGroup":"CG","topic":"T","retry":"1","startOffset":3,"queueId":0,"popTime":1,"invisibleTime":2,"bitSet":"Aw=="}]}"#;
    let v: BatchAckMessageRequestBody = dec(long);
    assert_eq!(v.acks[0].offsets(10), [3, 4]);
    assert_eq!(v.acks[0].retry.as_deref(), Some("1"));
    let mut built = BatchAck {
        start_offset: 7,
        ..Default::default()
    };
    built.set_offsets(&[7, 9, 22]);
    assert_eq!(built.offsets(10), [7, 9, 22]);
    assert!(from_json_slice::<BatchAckMessageRequestBody>(br#"{"acks":[{"b":[300]}]}"#).is_err());
}

#[test]
fn topic_message_types_as_rocketmq_decides_them() {
    use crate::message::property as p;
    let of = |pairs: &[(&'static str, &'static str)]| {
        let pairs = pairs.to_vec();
        TopicMessageType::of_message(move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| *v))
    };
    assert_eq!(of(&[]), TopicMessageType::Normal);
    assert_eq!(of(&[(p::SHARDING_KEY, "g1")]), TopicMessageType::Fifo);
    assert_eq!(of(&[(p::DELAY, "3")]), TopicMessageType::Delay);
    assert_eq!(of(&[(p::TIMER_DELIVER_MS, "1")]), TopicMessageType::Delay);
    assert_eq!(
        of(&[(p::TRAN_MSG, "true"), (p::SHARDING_KEY, "g")]),
        TopicMessageType::Transaction
    );
    assert_eq!(of(&[(p::TRAN_MSG, "false")]), TopicMessageType::Normal);
    let mut t = TopicConfig::new("T", 4);
    assert_eq!(t.message_type(), TopicMessageType::Unspecified);
    assert!(t.message_type().accepts(TopicMessageType::Fifo));
    assert_eq!(t.message_type().accepted().len(), 4);
    t.attributes
        .insert(TopicMessageType::ATTRIBUTE.into(), "fifo".into());
    assert_eq!(t.message_type(), TopicMessageType::Fifo);
    assert!(!t.message_type().accepts(TopicMessageType::Normal));
    assert_eq!(t.message_type().accepted(), [TopicMessageType::Fifo]);
    assert!(TopicMessageType::Mixed.accepts(TopicMessageType::Delay));
    assert_eq!(TopicMessageType::parse("nope"), None);
}
