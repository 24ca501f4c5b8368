//! Unit and property tests of the typed headers.

use super::test_support::RandomValue;
use super::*;
use crate::code::request_code;
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestRng};

fn ext(pairs: &[(&str, &str)]) -> ExtFields {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Spec 1.3: the SEND_MESSAGE_V2 request's extFields, exactly as Java sends them.
fn spec_v2_ext() -> ExtFields {
    ext(&[
        ("a", "PG"),
        ("b", "T"),
        ("c", "TBW102"),
        ("d", "4"),
        ("e", "1"),
        ("f", "0"),
        ("g", "1700000000000"),
        ("h", "0"),
        (
            "i",
            "UNIQ_KEY\u{1}ABC\u{2}WAIT\u{1}true\u{2}TAGS\u{1}tagA\u{2}",
        ),
        ("j", "0"),
        ("k", "false"),
        ("m", "false"),
        ("n", "broker-a"),
    ])
}

#[test]
fn spec_send_v2_request_decodes_and_reencodes_exactly() {
    let h = SendMessageRequestHeaderV2::from_ext_fields(&spec_v2_ext()).unwrap();
    assert_eq!(h.a, "PG");
    assert_eq!(h.b, "T");
    assert_eq!(h.c, "TBW102");
    assert_eq!((h.d, h.e, h.f, h.g, h.h), (4, 1, 0, 1_700_000_000_000, 0));
    assert_eq!(h.j, Some(0));
    assert_eq!(h.k, Some(false));
    assert_eq!(h.l, None);
    assert_eq!(h.m, Some(false));
    assert_eq!(h.n.as_deref(), Some("broker-a"));
    // Same entries in the same (a..n) order as the Java example.
    assert_eq!(h.to_ext_fields(), spec_v2_ext());

    let v1 = SendMessageRequestHeader::from(h.clone());
    assert_eq!(v1.producer_group, "PG");
    assert_eq!(v1.default_topic_queue_nums, 4);
    assert_eq!(v1.rpc.broker_name.as_deref(), Some("broker-a"));
    assert_eq!(v1.properties, h.i);
    assert_eq!(SendMessageRequestHeaderV2::from(v1), h);
}

#[test]
fn spec_send_response_decodes() {
    let e = ext(&[
        ("queueId", "1"),
        ("transactionId", "ABC"),
        ("msgId", "7F00000100002A9F0000000000000000"),
        ("TRACE_ON", "true"),
        ("MSG_REGION", "DefaultRegion"),
        ("queueOffset", "0"),
    ]);
    let h = SendMessageResponseHeader::from_ext_fields(&e).unwrap();
    assert_eq!(h.msg_id, "7F00000100002A9F0000000000000000");
    assert_eq!(h.queue_id, 1);
    assert_eq!(h.queue_offset, 0);
    assert_eq!(h.transaction_id.as_deref(), Some("ABC"));
    assert_eq!(h.msg_region.as_deref(), Some("DefaultRegion"));
    assert_eq!(h.trace_on, Some(true));
    let back = h.to_ext_fields();
    for (k, v) in &e {
        assert_eq!(back.get(k), Some(v), "{k}");
    }
    assert_eq!(back.len(), e.len());
}

#[test]
fn spec_pull_request_example_decodes() {
    let e = ext(&[
        ("queueId", "0"),
        ("maxMsgBytes", "262144"),
        ("maxMsgNums", "32"),
        ("sysFlag", "3"),
        ("suspendTimeoutMillis", "15000"),
        ("commitOffset", "5"),
        ("bname", "broker-a"),
        ("topic", "T"),
        ("queueOffset", "0"),
        ("expressionType", "TAG"),
        ("subVersion", "1700000000000"),
        ("consumerGroup", "CG"),
    ]);
    let cmd = RemotingCommand::request(request_code::PULL_MESSAGE).with_ext_fields(e.clone());
    let h: PullMessageRequestHeader = cmd.decode_command_header().unwrap();
    assert_eq!(
        h,
        PullMessageRequestHeader {
            consumer_group: "CG".into(),
            topic: "T".into(),
            queue_id: 0,
            queue_offset: 0,
            max_msg_nums: 32,
            sys_flag: 3,
            commit_offset: 5,
            suspend_timeout_millis: 15000,
            subscription: None,
            sub_version: 1_700_000_000_000,
            expression_type: Some("TAG".into()),
            max_msg_bytes: Some(262_144),
            request_source: None,
            proxy_froward_client_id: None,
            rpc: RpcFields::with_broker_name("broker-a"),
        }
    );
    let mut back = h.to_ext_fields();
    back.sort_keys();
    let mut e = e;
    e.sort_keys();
    assert_eq!(back, e);
}

#[test]
fn notify_consumer_ids_changed_is_exactly_consumer_group() {
    let h = NotifyConsumerIdsChangedRequestHeader {
        consumer_group: "CG".into(),
        ..Default::default()
    };
    let mut cmd =
        RemotingCommand::request_with_header(request_code::NOTIFY_CONSUMER_IDS_CHANGED, &h);
    cmd.set_oneway();
    assert_eq!(cmd.ext_fields, Some(ext(&[("consumerGroup", "CG")])));
    assert_eq!(cmd.flag, 2);
}

#[test]
fn empty_headers_write_empty_maps() {
    let cmd = RemotingCommand::request_with_header(
        request_code::HEART_BEAT,
        &HeartbeatRequestHeader::default(),
    );
    assert_eq!(cmd.ext_fields, Some(ExtFields::new()));
    let cmd = RemotingCommand::response(0, None).with_header(&EmptyHeader);
    assert_eq!(cmd.ext_fields, Some(ExtFields::new()));
    // A command without extFields decodes headers whose fields are all optional.
    let bare = RemotingCommand::request(request_code::GET_ALL_TOPIC_CONFIG);
    let h: GetAllTopicConfigRequestHeader = bare.decode_command_header().unwrap();
    assert_eq!(h, GetAllTopicConfigRequestHeader::default());
}

#[test]
fn missing_required_field_is_named() {
    let mut e = spec_v2_ext();
    e.shift_remove("g");
    assert_eq!(
        SendMessageRequestHeaderV2::from_ext_fields(&e),
        Err(ProtoError::MissingField { field: "g" })
    );
    let bare = RemotingCommand::request(request_code::PULL_MESSAGE);
    assert_eq!(
        bare.decode_command_header::<PullMessageRequestHeader>(),
        Err(ProtoError::MissingField {
            field: "consumerGroup"
        })
    );
    let e = ext(&[("consumerGroup", "CG"), ("topic", "T")]);
    assert_eq!(
        QueryConsumerOffsetRequestHeader::from_ext_fields(&e),
        Err(ProtoError::MissingField { field: "queueId" })
    );
    let err = UnregisterClientRequestHeader::from_ext_fields(&ExtFields::new()).unwrap_err();
    assert_eq!(err.to_string(), "missing required header field `clientID`");
}

#[test]
fn unparsable_numbers_are_invalid_fields() {
    for (key, bad) in [
        ("d", "four"),
        ("e", ""),
        ("e", " 1"),
        ("e", "2147483648"),
        ("g", "1.5"),
        ("g", "9223372036854775808"),
        ("h", "0x10"),
    ] {
        let mut e = spec_v2_ext();
        e.insert(key, bad);
        match SendMessageRequestHeaderV2::from_ext_fields(&e) {
            Err(ProtoError::InvalidField { field, value, .. }) => {
                assert_eq!(field, key);
                assert_eq!(value, bad);
            }
            other => panic!("{key}={bad:?}: {other:?}"),
        }
    }
    // Optional fields too.
    let mut e = spec_v2_ext();
    e.insert("j", "x");
    assert!(matches!(
        SendMessageRequestHeaderV2::from_ext_fields(&e),
        Err(ProtoError::InvalidField { field: "j", .. })
    ));
}

#[test]
fn java_integer_parsing_accepts_signs_and_extremes() {
    let mut e = spec_v2_ext();
    e.insert("e", "-1");
    e.insert("d", "+4");
    e.insert("g", "-9223372036854775808");
    let h = SendMessageRequestHeaderV2::from_ext_fields(&e).unwrap();
    assert_eq!((h.d, h.e, h.g), (4, -1, i64::MIN));
}

#[test]
fn booleans_follow_java_and_cpp() {
    for (v, expected) in [
        ("true", true),
        ("TRUE", true),
        ("True", true),
        ("1", true),
        ("false", false),
        ("0", false),
        ("", false),
        ("yes", false),
        ("t", false),
    ] {
        assert_eq!(parse_java_bool(v), expected, "{v:?}");
        let mut e = spec_v2_ext();
        e.insert("k", v);
        assert_eq!(
            SendMessageRequestHeaderV2::from_ext_fields(&e).unwrap().k,
            Some(expected)
        );
    }
}

#[test]
fn defaulted_fields_follow_java_initialisers() {
    let e = ext(&[("topic", "T"), ("queueId", "0")]);
    assert!(
        GetMaxOffsetRequestHeader::from_ext_fields(&e)
            .unwrap()
            .committed
    );
    let e = ext(&[("topic", "T"), ("queueId", "0"), ("committed", "false")]);
    assert!(
        !GetMaxOffsetRequestHeader::from_ext_fields(&e)
            .unwrap()
            .committed
    );
    assert!(GetMaxOffsetRequestHeader::default().committed);
    let e = ext(&[
        ("topic", "T"),
        ("group", "G"),
        ("timestamp", "5"),
        ("isForce", "true"),
    ]);
    let h = ResetOffsetRequestHeader::from_ext_fields(&e).unwrap();
    assert_eq!(h.queue_id, -1);
    assert!(h.is_force);
    assert_eq!(h.offset, None);
    // Primitive fields are always written.
    let w = GetMaxOffsetRequestHeader::default().to_ext_fields();
    assert_eq!(w.get("committed"), Some("true"));
}

#[test]
fn boundary_type_is_case_insensitive_and_written_upper() {
    let e = ext(&[
        ("topic", "T"),
        ("queueId", "0"),
        ("timestamp", "1"),
        ("boundaryType", "upper"),
    ]);
    let h = SearchOffsetRequestHeader::from_ext_fields(&e).unwrap();
    assert_eq!(h.boundary_type, Some(BoundaryType::Upper));
    assert_eq!(h.to_ext_fields().get("boundaryType"), Some("UPPER"));
    let e = ext(&[
        ("topic", "T"),
        ("queueId", "0"),
        ("timestamp", "1"),
        ("boundaryType", "MIDDLE"),
    ]);
    assert!(matches!(
        SearchOffsetRequestHeader::from_ext_fields(&e),
        Err(ProtoError::InvalidField {
            field: "boundaryType",
            ..
        })
    ));
}

#[test]
fn unknown_keys_are_ignored_and_rpc_fields_kept() {
    let mut e = spec_v2_ext();
    e.insert("AccessKey", "");
    e.insert("Signature", "x");
    e.insert("OnsChannel", "ALIYUN");
    e.insert("bname", "broker-b");
    e.insert("oway", "true");
    e.insert("lo", "false");
    e.insert("ns", "NS");
    e.insert("nsd", "1");
    let h = SendMessageRequestHeaderV2::from_ext_fields(&e).unwrap();
    assert_eq!(
        h.rpc,
        RpcFields {
            namespace: Some("NS".into()),
            namespaced: Some(true),
            broker_name: Some("broker-b".into()),
            oneway: Some(true),
            logical: Some(false),
        }
    );
    // V2 -> V1 prefers `n` for the broker name.
    let v1 = SendMessageRequestHeader::from(h);
    assert_eq!(v1.rpc.broker_name.as_deref(), Some("broker-a"));
    assert_eq!(v1.rpc.namespace.as_deref(), Some("NS"));
}

#[test]
fn add_header_merges_into_existing_fields() {
    let mut cmd = RemotingCommand::response(0, None);
    cmd.add_header(&QueryConsumerOffsetResponseHeader { offset: 7 });
    cmd.add_header(&GetMinOffsetResponseHeader { offset: 9 });
    assert_eq!(cmd.ext("offset"), Some("9"));
    let mut cmd = RemotingCommand::response(0, None).with_ext_fields(ext(&[("x", "1")]));
    cmd.add_header(&QueryConsumerOffsetResponseHeader { offset: 7 });
    assert_eq!(cmd.ext("x"), Some("1"));
    assert_eq!(cmd.ext("offset"), Some("7"));
}

/// Encodes a random header, decodes it, and checks both the value and the map are stable.
/// `cmd` with a ROCKETMQ binary header whose extFields area holds `entries` as written (empty
/// keys and values too), encoded: the frame after its length word.
fn binary_frame(
    mut cmd: crate::command::RemotingCommand,
    entries: &[(String, String)],
) -> bytes::Bytes {
    use crate::command::{RawExtFields, SerializeType};
    let mut area = Vec::new();
    for (k, v) in entries {
        area.extend_from_slice(&(k.len() as i16).to_be_bytes());
        area.extend_from_slice(k.as_bytes());
        area.extend_from_slice(&(v.len() as i32).to_be_bytes());
        area.extend_from_slice(v.as_bytes());
    }
    cmd.serialize_type = SerializeType::RocketMq;
    cmd.ext_fields_raw = Some(RawExtFields::Binary(area));
    let mut wire = bytes::BytesMut::new();
    cmd.encode(&mut wire).unwrap();
    wire.freeze().slice(4..)
}

fn round_trip<H: CommandHeader + RandomValue + PartialEq + std::fmt::Debug>(seed: &[u8; 32]) {
    let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, seed);
    let h = H::random(&mut rng);
    let e = h.to_ext_fields();
    let back = H::from_ext_fields(&e).unwrap();
    assert_eq!(back, h);
    let cmd = RemotingCommand::request_with_header(0, &h);
    assert_eq!(cmd.decode_command_header::<H>().unwrap(), h);
    assert_eq!(back.to_ext_fields(), e);
}

macro_rules! round_trip_all {
    ($seed:expr, $($t:ty,)*) => {{ $( round_trip::<$t>($seed); )* }};
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_header_round_trips_through_ext_fields(seed in any::<[u8; 32]>()) {
        round_trip_all!(&seed,
        SendMessageRequestHeader,
        SendMessageRequestHeaderV2,
        SendMessageResponseHeader,
        EndTransactionRequestHeader,
        CheckTransactionStateRequestHeader,
        CheckTransactionStateResponseHeader,
        PullMessageRequestHeader,
        PullMessageResponseHeader,
        QueryConsumerOffsetRequestHeader,
        QueryConsumerOffsetResponseHeader,
        UpdateConsumerOffsetRequestHeader,
        GetMaxOffsetRequestHeader,
        GetMaxOffsetResponseHeader,
        GetMinOffsetRequestHeader,
        GetMinOffsetResponseHeader,
        SearchOffsetRequestHeader,
        SearchOffsetResponseHeader,
        GetEarliestMsgStoretimeRequestHeader,
        GetEarliestMsgStoretimeResponseHeader,
        ViewMessageByIdRequestHeader,
        QueryMessageRequestHeader,
        QueryMessageResponseHeader,
        HeartbeatRequestHeader,
        UnregisterClientRequestHeader,
        ConsumerSendMsgBackRequestHeader,
        GetConsumerListByGroupRequestHeader,
        NotifyConsumerIdsChangedRequestHeader,
        LockBatchMqRequestHeader,
        UnlockBatchMqRequestHeader,
        GetConsumerRunningInfoRequestHeader,
        ConsumeMessageDirectlyRequestHeader,
        ResetOffsetRequestHeader,
        CreateTopicRequestHeader,
        GetAllTopicConfigRequestHeader,
        GetAllTopicConfigResponseHeader,
        GetTopicConfigRequestHeader,
        GetConsumerConnectionListRequestHeader,
        GetProducerConnectionListRequestHeader,
        GetConsumeStatsRequestHeader,
        DeleteTopicRequestHeader,
        GetTopicStatsInfoRequestHeader,
        QueryTopicConsumeByWhoRequestHeader,
        GetConsumerStatusRequestHeader,
        GetAllSubscriptionGroupRequestHeader,
        GetSubscriptionGroupConfigRequestHeader,
        DeleteSubscriptionGroupRequestHeader,
        CloneGroupOffsetRequestHeader,
        QueryConsumeQueueRequestHeader,
        QueryConsumeTimeSpanRequestHeader,
        GetBrokerConfigResponseHeader,
        GetRouteInfoRequestHeader,
        RegisterBrokerRequestHeader,
        RegisterBrokerResponseHeader,
        UnregisterBrokerRequestHeader,
        BrokerHeartbeatRequestHeader,
        DeleteTopicFromNamesrvRequestHeader,
        RegisterTopicRequestHeader,
        GetTopicsByClusterRequestHeader,
        GetKvConfigRequestHeader,
        GetKvConfigResponseHeader,
        PutKvConfigRequestHeader,
        DeleteKvConfigRequestHeader,
        GetKvListByNamespaceRequestHeader,
        WipeWritePermOfBrokerRequestHeader,
        WipeWritePermOfBrokerResponseHeader,
        AddWritePermOfBrokerRequestHeader,
        AddWritePermOfBrokerResponseHeader,
        QueryDataVersionRequestHeader,
        QueryDataVersionResponseHeader,
        PopMessageRequestHeader,
        PopMessageResponseHeader,
        AckMessageRequestHeader,
        ChangeInvisibleTimeRequestHeader,
        ChangeInvisibleTimeResponseHeader,
        NotificationRequestHeader,
        NotificationResponseHeader,
            RpcFields,
        );
    }

    #[test]
    fn send_v1_v2_conversions_are_inverse(seed in any::<[u8; 32]>()) {
        let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
        let mut v1 = SendMessageRequestHeader::random(&mut rng);
        let v2 = SendMessageRequestHeaderV2::from(v1.clone());
        prop_assert_eq!(SendMessageRequestHeader::from(v2.clone()), v1.clone());
        // Through the wire too.
        let v2_back = SendMessageRequestHeaderV2::from_ext_fields(&v2.to_ext_fields()).unwrap();
        v1.rpc.broker_name = v2_back.n.clone();
        prop_assert_eq!(SendMessageRequestHeader::from(v2_back), v1);
    }

    #[test]
    fn integer_fields_parse_as_rust_parses(value in prop_oneof![
        "[0-9]{0,20}", "[+-]?[0-9]{1,20}", "0*[0-9]{1,12}", "[0-9 a+-]{0,10}", "\\PC{0,6}",
    ]) {
        // The digits-only fast path of `parse_value` answers as `str::parse` does, up to the
        // last digit before overflow.
        prop_assert_eq!(i32::parse_value("f", &value).ok(), value.parse::<i32>().ok());
        prop_assert_eq!(i64::parse_value("g", &value).ok(), value.parse::<i64>().ok());
    }

    #[test]
    fn the_borrowed_send_header_reads_what_the_owned_ones_read(
        entries in proptest::collection::vec(
            (prop_oneof![
                Just("a"), Just("b"), Just("c"), Just("d"), Just("e"), Just("f"), Just("g"),
                Just("h"), Just("i"), Just("j"), Just("k"), Just("l"), Just("m"), Just("n"),
                Just("producerGroup"), Just("topic"), Just("defaultTopic"),
                Just("defaultTopicQueueNums"), Just("queueId"), Just("sysFlag"),
                Just("bornTimestamp"), Just("flag"), Just("properties"), Just("reconsumeTimes"),
                Just("unitMode"), Just("maxReconsumeTimes"), Just("batch"), Just("bname"),
                Just("x"),
            ], prop_oneof![
                Just("0".to_owned()), Just("-1".to_owned()), Just("4".to_owned()),
                Just("true".to_owned()), Just("1700000000000".to_owned()),
                Just("99999999999".to_owned()), "\\PC{0,8}",
            ]),
            0..30,
        )
    ) {
        let e: ExtFields = entries.into_iter().collect();
        fn owned(r: SendHeaderRef<'_>) -> SendMessageRequestHeader {
            SendMessageRequestHeader {
                producer_group: r.producer_group.to_owned(),
                topic: r.topic.to_owned(),
                default_topic: r.default_topic.to_owned(),
                default_topic_queue_nums: r.default_topic_queue_nums,
                queue_id: r.queue_id,
                sys_flag: r.sys_flag,
                born_timestamp: r.born_timestamp,
                flag: r.flag,
                properties: r.properties.map(str::to_owned),
                reconsume_times: r.reconsume_times,
                unit_mode: r.unit_mode,
                batch: r.batch,
                max_reconsume_times: r.max_reconsume_times,
                rpc: RpcFields::default(),
            }
        }
        let strip = |h: SendMessageRequestHeader| SendMessageRequestHeader { rpc: RpcFields::default(), ..h };
        let v1 = SendMessageRequestHeader::from_ext_fields(&e).map(strip);
        let v2 = SendMessageRequestHeaderV2::from_ext_fields(&e)
            .map(|h| strip(SendMessageRequestHeader::from(h)));
        let r1 = SendHeaderRef::decode(&e, false).map(owned);
        let r2 = SendHeaderRef::decode(&e, true).map(owned);
        prop_assert_eq!(format!("{v1:?}"), format!("{r1:?}"));
        prop_assert_eq!(format!("{v2:?}"), format!("{r2:?}"));
    }

    #[test]
    fn a_kept_binary_area_reads_as_its_map(
        entries in proptest::collection::vec(
            (prop_oneof![
                4 => prop_oneof![
                    Just("a"), Just("b"), Just("c"), Just("d"), Just("e"), Just("f"), Just("g"),
                    Just("h"), Just("i"), Just("j"), Just("k"), Just("m"), Just("n"),
                    Just("topic"), Just("queueId"), Just("properties"), Just("batch"),
                ].prop_map(str::to_owned),
                1 => "\\PC{0,3}",
            ], prop_oneof![
                Just("0".to_owned()), Just("-1".to_owned()), Just("4".to_owned()),
                Just("true".to_owned()), Just("1700000000000".to_owned()),
                Just(String::new()), "\\PC{0,8}", "[a-z]{120,300}",
            ]),
            0..20,
        ),
        code in prop_oneof![Just(request_code::SEND_MESSAGE), Just(request_code::SEND_MESSAGE_V2)],
    ) {
        use crate::command::{RawExtFields, RemotingCommand};
        // The area as a sender writes it (empty keys and values too: the map drops them, so
        // an area holding one is not kept), in a request frame.
        let cmd = RemotingCommand::request(code).with_body(bytes::Bytes::from_static(b"x"));
        let frame = binary_frame(cmd, &entries);
        let map = RemotingCommand::decode(frame.clone());
        let kept = RemotingCommand::decode_with(frame.clone(), |c| c.code == code);
        match (&map, &kept) {
            (Ok(map), Ok(kept)) => {
                let as_text = |h: Result<SendHeaderRef<'_>>| format!("{h:?}");
                prop_assert_eq!(
                    as_text(SendHeaderRef::of_request(map)),
                    as_text(SendHeaderRef::of_request(kept))
                );
                if let Some(RawExtFields::BinaryArea(_)) = &kept.ext_fields_raw {
                    prop_assert!(kept.ext_fields.is_none());
                    // Without repeated keys the kept entries are the map's, in order.
                    let raw = kept.ext_fields_raw.as_ref().unwrap();
                    let keys: Vec<&[u8]> = raw.binary_entries().map(|(k, _)| k).collect();
                    let mut unique = keys.clone();
                    unique.sort();
                    unique.dedup();
                    if unique.len() == keys.len() {
                        let from_map: Vec<(&[u8], &[u8])> = map
                            .ext_fields
                            .as_ref()
                            .map(|m| m.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())).collect())
                            .unwrap_or_default();
                        prop_assert_eq!(raw.binary_entries().collect::<Vec<_>>(), from_map);
                    }
                } else {
                    prop_assert_eq!(format!("{map:?}"), format!("{kept:?}"));
                }
                // Not kept when the caller does not ask.
                let other = RemotingCommand::decode_with(frame.clone(), |c| c.code != code).unwrap();
                prop_assert_eq!(format!("{map:?}"), format!("{other:?}"));
            }
            (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
            _ => prop_assert!(false, "{map:?} / {kept:?}"),
        }
    }

    #[test]
    fn a_send_answer_written_from_borrowed_values_is_the_typed_headers(seed in any::<[u8; 32]>()) {
        let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
        let h = SendMessageResponseHeader {
            batch_uniq_id: None,
            recall_handle: None,
            ..SendMessageResponseHeader::random(&mut rng)
        };
        let direct = send_response_ext_fields(
            &h.msg_id,
            h.queue_id,
            h.queue_offset,
            h.transaction_id.as_deref(),
            h.msg_region.as_deref(),
            h.trace_on,
        );
        let typed = h.to_ext_fields();
        prop_assert_eq!(
            direct.iter().collect::<Vec<_>>(),
            typed.iter().collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_borrowed_send_answer_reads_what_the_typed_header_reads(
        entries in proptest::collection::vec(
            (prop_oneof![
                Just("msgId"), Just("queueId"), Just("queueOffset"), Just("transactionId"),
                Just("MSG_REGION"), Just("TRACE_ON"), Just("x"),
            ], prop_oneof![
                Just("0".to_owned()), Just("-1".to_owned()), Just("7".to_owned()),
                Just("99999999999".to_owned()), Just("7F0000010000".to_owned()), "\\PC{0,8}",
            ]),
            0..10,
        )
    ) {
        let e: ExtFields = entries.into_iter().collect();
        // The typed header also parses TRACE_ON, which a send result does not use.
        let mut without_trace = e.clone();
        without_trace.remove("TRACE_ON");
        let typed = SendMessageResponseHeader::from_ext_fields(&without_trace)
            .map(|h| (h.msg_id, h.queue_id, h.queue_offset));
        let borrowed = SendResponseRef::decode(Some(&e))
            .map(|r| (r.msg_id.to_owned(), r.queue_id, r.queue_offset));
        prop_assert_eq!(format!("{typed:?}"), format!("{borrowed:?}"));
        prop_assert!(SendResponseRef::decode(None).is_err());
    }

    #[test]
    fn a_kept_answer_area_reads_as_its_map(
        entries in proptest::collection::vec(
            (prop_oneof![
                4 => prop_oneof![
                    Just("msgId"), Just("queueId"), Just("queueOffset"), Just("transactionId"),
                    Just("MSG_REGION"), Just("TRACE_ON"),
                ].prop_map(str::to_owned),
                1 => "\\PC{0,3}",
            ], prop_oneof![
                Just("0".to_owned()), Just("-1".to_owned()), Just("7".to_owned()),
                Just("99999999999".to_owned()), Just("7F0000010000".to_owned()),
                Just(String::new()), "\\PC{0,8}", "[0-9A-F,]{120,300}",
            ]),
            0..10,
        ),
        code in prop_oneof![Just(0), Just(1), Just(10)],
    ) {
        use crate::command::{RawExtFields, RemotingCommand};
        // An answer's area as a broker writes it (empty keys and values too: an area holding
        // one is not kept), in a response frame.
        let mut cmd = RemotingCommand::response(code, None);
        cmd.opaque = 42;
        let frame = binary_frame(cmd, &entries);
        let map = RemotingCommand::decode(frame.clone());
        let mut asked = None;
        let kept = RemotingCommand::decode_with(frame, |c| {
            asked = Some((c.is_response(), c.opaque, c.code));
            true
        });
        match (&map, &kept) {
            (Ok(map), Ok(kept)) => {
                // Asked once, with the fixed fields, when there is an area.
                prop_assert_eq!(asked, (!entries.is_empty()).then_some((true, 42, code)));
                let read = |r: &RemotingCommand| {
                    format!("{:?}", SendResponseRef::of_response(r))
                };
                prop_assert_eq!(read(map), read(kept));
                prop_assert_eq!(
                    read(map),
                    format!("{:?}", SendResponseRef::decode(map.ext_fields.as_ref()))
                );
                if !matches!(kept.ext_fields_raw, Some(RawExtFields::BinaryArea(_))) {
                    prop_assert_eq!(format!("{map:?}"), format!("{kept:?}"));
                }
            }
            (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
            _ => prop_assert!(false, "{map:?} / {kept:?}"),
        }
    }

    #[test]
    fn a_send_answer_written_as_json_encodes_as_its_map(
        // Offset message ids and the region are the broker's own text, written as is: never
        // a character that needs an escape.
        msg_id in "[0-9A-F,]{0,40}|[^\"\\\\\\p{C}]{0,10}",
        queue_id in any::<i32>(),
        queue_offset in any::<i64>(),
        transaction_id in proptest::option::of("\\PC{0,12}|[\"\\\\\\x00-\\x1f/é]{0,6}"),
        msg_region in proptest::option::of("[^\"\\\\\\p{C}]{0,12}"),
        trace_on in proptest::option::of(any::<bool>()),
        opaque in any::<i32>(),
    ) {
        let mut with_map = RemotingCommand::response(0, None);
        with_map.opaque = opaque;
        let mut with_json = with_map.clone();
        with_map.ext_fields = Some(send_response_ext_fields(
            &msg_id, queue_id, queue_offset, transaction_id.as_deref(), msg_region.as_deref(), trace_on,
        ));
        with_json.ext_fields_raw = Some(crate::RawExtFields::Json(send_response_json(
            |out: &mut String| out.push_str(&msg_id), queue_id, queue_offset, transaction_id.as_deref(), msg_region.as_deref(), trace_on,
        )));
        let (mut a, mut b) = (bytes::BytesMut::new(), bytes::BytesMut::new());
        with_map.encode_header(&mut a).unwrap();
        with_json.encode_header(&mut b).unwrap();
        prop_assert_eq!(&a[..], &b[..]);
        // What a peer decodes is the map.
        let decoded = RemotingCommand::decode_header(crate::SerializeType::Json, &b).unwrap();
        prop_assert_eq!(&decoded.ext_fields, &with_map.ext_fields);
        // A binary header cannot carry it.
        with_json.serialize_type = crate::SerializeType::RocketMq;
        prop_assert!(with_json.encode_header(&mut bytes::BytesMut::new()).is_err());
        // Written as a binary area, it encodes as the map does in a binary header, and as the
        // map does in a JSON header too.
        let mut with_binary = with_map.clone();
        with_binary.ext_fields = None;
        with_binary.ext_fields_raw = Some(crate::RawExtFields::Binary(send_response_binary(
            |o| o.extend_from_slice(msg_id.as_bytes()), queue_id, queue_offset, transaction_id.as_deref(), msg_region.as_deref(), trace_on,
        ).unwrap()));
        for st in [crate::SerializeType::RocketMq, crate::SerializeType::Json] {
            with_map.serialize_type = st;
            with_binary.serialize_type = st;
            let (mut a, mut b) = (bytes::BytesMut::new(), bytes::BytesMut::new());
            with_map.encode_header(&mut a).unwrap();
            with_binary.encode_header(&mut b).unwrap();
            prop_assert_eq!(&a[..], &b[..]);
        }
    }

    #[test]
    fn arbitrary_ext_fields_never_panic(
        entries in proptest::collection::vec(
            (prop_oneof![
                Just("a".to_owned()), Just("d".to_owned()), Just("g".to_owned()), Just("k".to_owned()),
                Just("queueId".to_owned()), Just("topic".to_owned()), Just("consumerGroup".to_owned()),
                Just("offset".to_owned()), Just("boundaryType".to_owned()), "\\PC{0,6}",
            ], "\\PC{0,12}"),
            0..12,
        )
    ) {
        let e: ExtFields = entries.into_iter().collect();
        let _ = SendMessageRequestHeaderV2::from_ext_fields(&e);
        let _ = PullMessageRequestHeader::from_ext_fields(&e);
        let _ = SearchOffsetRequestHeader::from_ext_fields(&e);
        let _ = QueryConsumerOffsetResponseHeader::from_ext_fields(&e);
        let _ = PopMessageRequestHeader::from_ext_fields(&e);
        let _ = RegisterBrokerRequestHeader::from_ext_fields(&e);
    }
}

#[test]
fn a_send_area_is_kept_when_it_qualifies() {
    use crate::command::{
        push_binary_entry, RawExtFields, RemotingCommand, SerializeType, FLAG_RESPONSE,
    };
    let frame = |entries: &[(&str, &str)], flag: i32| {
        let mut area = Vec::new();
        for (k, v) in entries {
            push_binary_entry(&mut area, k, v).unwrap();
        }
        let mut cmd = RemotingCommand::request(request_code::SEND_MESSAGE_V2);
        cmd.flag = flag;
        cmd.serialize_type = SerializeType::RocketMq;
        cmd.ext_fields_raw = Some(RawExtFields::Binary(area));
        let mut wire = bytes::BytesMut::new();
        cmd.encode(&mut wire).unwrap();
        wire.freeze().slice(4..)
    };
    let kept = |f: bytes::Bytes| {
        let cmd = RemotingCommand::decode_with(f, |c| {
            !c.is_response() && c.code == request_code::SEND_MESSAGE_V2
        })
        .unwrap();
        matches!(cmd.ext_fields_raw, Some(RawExtFields::BinaryArea(_)))
    };
    // Java's send header (spec 1.3).
    let spec = spec_v2_ext();
    let send: Vec<(&str, &str)> = spec.iter().collect();
    assert!(kept(frame(&send, 0)));
    // Read from the area as from the map.
    let f = frame(&send, 0);
    let area = RemotingCommand::decode_with(f.clone(), |_| true).unwrap();
    let map = RemotingCommand::decode(f).unwrap();
    assert_eq!(
        SendHeaderRef::of_request(&area).unwrap(),
        SendHeaderRef::of_request(&map).unwrap()
    );
    assert_eq!(SendHeaderRef::of_request(&area).unwrap().topic, "T");
    // The caller decides from the fixed fields (here: requests only); an area with a length
    // byte of 0x80 or more (a value of 200 bytes), an empty value, or non-ASCII text next to
    // a length field that is not ASCII is never kept.
    assert!(!kept(frame(&send, FLAG_RESPONSE)));
    let long = "x".repeat(200);
    assert!(!kept(frame(&[("a", "G"), ("i", &long)], 0)));
    assert!(kept(frame(&[("a", "G"), ("i", &"x".repeat(300))], 0)));
    assert!(!kept(frame(&[("a", "G"), ("i", "")], 0)));
    assert!(kept(frame(&[("a", "Gé"), ("b", "ü")], 0)));
}
