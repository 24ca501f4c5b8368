//! Typed headers and JSON bodies through whole frames (the `command` codec), against the
//! byte-exact examples of the protocol spec (sections 1.3, 1.4, 2, 3, 8, 10).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use bytes::Bytes;
use shoal_proto::body::{
    from_json_slice, GetConsumerListByGroupResponseBody, HeartbeatData, LockBatchRequestBody,
    QueryAssignmentRequestBody, TopicRouteData,
};
use shoal_proto::code::{request_code, response_code};
use shoal_proto::header::{
    CommandHeader, HeartbeatRequestHeader, NotifyConsumerIdsChangedRequestHeader,
    PopMessageRequestHeader, PullMessageRequestHeader, RpcFields, SendMessageRequestHeader,
    SendMessageRequestHeaderV2, SendMessageResponseHeader,
};
use shoal_proto::{LanguageCode, RemotingCommand, SerializeType};

const SPEC_1_3_REQUEST: &str = r#"{"code":310,"extFields":{"a":"PG","b":"T","c":"TBW102","d":"4","e":"1","f":"0","g":"1700000000000","h":"0","i":"UNIQ_KEY\u0001ABC\u0002WAIT\u0001true\u0002TAGS\u0001tagA\u0002","j":"0","k":"false","m":"false","n":"broker-a"},"flag":0,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":479}"#;

fn spec_v2_header() -> SendMessageRequestHeaderV2 {
    SendMessageRequestHeaderV2 {
        a: "PG".into(),
        b: "T".into(),
        c: "TBW102".into(),
        d: 4,
        e: 1,
        f: 0,
        g: 1_700_000_000_000,
        h: 0,
        i: Some("UNIQ_KEY\u{1}ABC\u{2}WAIT\u{1}true\u{2}TAGS\u{1}tagA\u{2}".into()),
        j: Some(0),
        k: Some(false),
        l: None,
        m: Some(false),
        n: Some("broker-a".into()),
        rpc: RpcFields::default(),
    }
}

fn spec_request() -> RemotingCommand {
    let mut cmd =
        RemotingCommand::request_with_header(request_code::SEND_MESSAGE_V2, &spec_v2_header())
            .with_opaque(7)
            .with_body(Bytes::from_static(b"hi"));
    cmd.language = LanguageCode::Java;
    cmd
}

fn json_header_of(frame: &[u8]) -> &str {
    let hdr_len = u32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]) & 0x00FF_FFFF;
    std::str::from_utf8(&frame[8..8 + hdr_len as usize]).unwrap()
}

#[test]
fn spec_1_3_send_v2_request_frame_is_byte_exact() {
    let frame = spec_request().to_frame().unwrap();
    assert_eq!(json_header_of(&frame), SPEC_1_3_REQUEST);
    assert_eq!(
        &frame[..8],
        &[0x00, 0x00, 0x01, 0x3c, 0x00, 0x00, 0x01, 0x36]
    );
    assert_eq!(&frame[frame.len() - 2..], b"hi");

    let decoded = RemotingCommand::decode(frame.slice(4..)).unwrap();
    let h: SendMessageRequestHeaderV2 = decoded.decode_command_header().unwrap();
    assert_eq!(h, spec_v2_header());
    let v1 = SendMessageRequestHeader::from(h);
    assert_eq!(v1.topic, "T");
    assert_eq!(v1.rpc.broker_name.as_deref(), Some("broker-a"));
}

#[test]
fn spec_1_4_send_v2_binary_frame() {
    let mut cmd = spec_request();
    cmd.serialize_type = SerializeType::RocketMq;
    let frame = cmd.to_frame().unwrap();
    assert_eq!(frame.len(), 4 + 196);
    assert_eq!(
        &frame[..8],
        &[0x00, 0x00, 0x00, 0xc4, 0x01, 0x00, 0x00, 0xbe]
    );
    // extLen = 169, as in the spec.
    assert_eq!(&frame[21..25], &0u32.to_be_bytes()); // remarkLen
    assert_eq!(&frame[25..29], &169u32.to_be_bytes());
    let decoded = RemotingCommand::decode(frame.slice(4..)).unwrap();
    assert_eq!(
        decoded
            .decode_command_header::<SendMessageRequestHeaderV2>()
            .unwrap(),
        spec_v2_header()
    );
}

#[test]
fn spec_1_3_send_response_decodes() {
    let json = r#"{"code":0,"extFields":{"queueId":"1","transactionId":"ABC","msgId":"7F00000100002A9F0000000000000000","TRACE_ON":"true","MSG_REGION":"DefaultRegion","queueOffset":"0"},"flag":1,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":479}"#;
    let cmd = RemotingCommand::decode_header(SerializeType::Json, json.as_bytes()).unwrap();
    assert_eq!(cmd.code, response_code::SUCCESS);
    let h: SendMessageResponseHeader = cmd.decode_command_header().unwrap();
    assert_eq!(h.msg_id, "7F00000100002A9F0000000000000000");
    assert_eq!((h.queue_id, h.queue_offset), (1, 0));
    assert_eq!(h.trace_on, Some(true));
}

#[test]
fn cpp_client_header_with_numbers_and_01_booleans() {
    // Spec 10: no serializeTypeCurrentRPC, numbers and booleans as JSON scalars, "1"/"0"
    // booleans, AccessKey/Signature/OnsChannel, empty remark.
    let json = r#"{"code":310,"language":"CPP","version":63,"opaque":3,"flag":0,"remark":"","extFields":{"a":"PG","b":"T","c":"TBW102","d":4,"e":1,"f":0,"g":1700000000000,"h":0,"i":"TAGS\u0001x\u0002","j":0,"k":false,"l":16,"m":"0","AccessKey":"","Signature":"s","OnsChannel":"ALIYUN"}}"#;
    let cmd = RemotingCommand::decode_header(SerializeType::Json, json.as_bytes()).unwrap();
    let h: SendMessageRequestHeaderV2 = cmd.decode_command_header().unwrap();
    assert_eq!((h.d, h.e, h.g, h.l), (4, 1, 1_700_000_000_000, Some(16)));
    assert_eq!(h.k, Some(false));
    assert_eq!(h.m, Some(false));
    let json = json.replace(r#""m":"0""#, r#""m":"1""#);
    let cmd = RemotingCommand::decode_header(SerializeType::Json, json.as_bytes()).unwrap();
    assert_eq!(
        cmd.decode_command_header::<SendMessageRequestHeaderV2>()
            .unwrap()
            .m,
        Some(true)
    );
}

#[test]
fn spec_2_3_pull_request_through_a_frame() {
    let ext = r#"{"queueId":"0","maxMsgBytes":"262144","maxMsgNums":"32","sysFlag":"3","suspendTimeoutMillis":"15000","commitOffset":"5","bname":"broker-a","topic":"T","queueOffset":"0","expressionType":"TAG","subVersion":"1700000000000","consumerGroup":"CG"}"#;
    let json = format!(
        r#"{{"code":11,"extFields":{ext},"flag":0,"language":"JAVA","opaque":9,"version":479}}"#
    );
    let cmd = RemotingCommand::decode_header(SerializeType::Json, json.as_bytes()).unwrap();
    let h: PullMessageRequestHeader = cmd.decode_command_header().unwrap();
    assert_eq!(h.consumer_group, "CG");
    assert_eq!(
        (h.queue_id, h.queue_offset, h.max_msg_nums, h.sys_flag),
        (0, 0, 32, 3)
    );
    assert_eq!((h.commit_offset, h.suspend_timeout_millis), (5, 15000));
    assert_eq!(h.sub_version, 1_700_000_000_000);
    assert_eq!(h.rpc.broker_name.as_deref(), Some("broker-a"));
    // Re-encode through a binary frame and back.
    let mut out = RemotingCommand::request_with_header(request_code::PULL_MESSAGE, &h);
    out.serialize_type = SerializeType::RocketMq;
    let frame = out.to_frame().unwrap();
    let back = RemotingCommand::decode(frame.slice(4..)).unwrap();
    assert_eq!(
        back.decode_command_header::<PullMessageRequestHeader>()
            .unwrap(),
        h
    );
}

#[test]
fn spec_7_5_notify_consumer_ids_changed_frame() {
    let h = NotifyConsumerIdsChangedRequestHeader {
        consumer_group: "CG".into(),
        ..Default::default()
    };
    let mut cmd =
        RemotingCommand::request_with_header(request_code::NOTIFY_CONSUMER_IDS_CHANGED, &h)
            .with_opaque(12);
    cmd.set_oneway();
    let frame = cmd.to_frame().unwrap();
    let header = json_header_of(&frame);
    assert!(
        header.starts_with(r#"{"code":40,"extFields":{"consumerGroup":"CG"},"flag":2,"#),
        "{header}"
    );
}

#[test]
fn heartbeat_and_lock_requests_carry_empty_ext_fields() {
    let cmd = RemotingCommand::request_with_header(
        request_code::HEART_BEAT,
        &HeartbeatRequestHeader::default(),
    );
    let frame = cmd.to_frame().unwrap();
    assert!(json_header_of(&frame).starts_with(r#"{"code":34,"extFields":{},"#));
}

#[test]
fn pop_request_uses_json_and_round_trips() {
    let h = PopMessageRequestHeader {
        consumer_group: "CG".into(),
        topic: "T".into(),
        queue_id: -1,
        max_msg_nums: 32,
        invisible_time: 60_000,
        poll_time: 15_000,
        born_time: 1_700_000_000_000,
        init_mode: 0,
        exp_type: Some("TAG".into()),
        exp: Some("*".into()),
        order: false,
        attempt_id: None,
        rpc: RpcFields::with_broker_name("broker-a"),
    };
    let cmd = RemotingCommand::request_with_header(request_code::POP_MESSAGE, &h);
    let frame = cmd.to_frame().unwrap();
    let back = RemotingCommand::decode(frame.slice(4..)).unwrap();
    assert_eq!(back.code, 200_050);
    assert_eq!(
        back.decode_command_header::<PopMessageRequestHeader>()
            .unwrap(),
        h
    );
    assert_eq!(h.to_ext_fields().get("order"), Some("false"));
}

#[test]
fn bodies_through_frames() {
    let route = r#"{"brokerDatas":[{"brokerAddrs":{0:"192.168.0.1:10911"},"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}"#;
    let resp = RemotingCommand::response(response_code::SUCCESS, None)
        .with_body(route.as_bytes().to_vec());
    let frame = resp.to_frame().unwrap();
    let back = RemotingCommand::decode(frame.slice(4..)).unwrap();
    let r: TopicRouteData = back.decode_json_body().unwrap();
    assert_eq!(r.publish_queues("T").len(), 4);

    let list = GetConsumerListByGroupResponseBody {
        consumer_id_list: vec!["a".into(), "b".into()],
    };
    let cmd = RemotingCommand::response(0, None)
        .with_json_body(&list)
        .unwrap();
    assert_eq!(
        cmd.body.as_deref(),
        Some(&br#"{"consumerIdList":["a","b"]}"#[..])
    );
}

#[test]
fn section_8_and_3_examples_parse_from_raw_bytes() {
    let q: QueryAssignmentRequestBody = from_json_slice(
        br#"{"clientId":"cid","consumerGroup":"CG","messageModel":"CLUSTERING","strategyName":"AVG","topic":"T"}"#,
    )
    .unwrap();
    assert_eq!(q.strategy_name, "AVG");
    let l: LockBatchRequestBody = from_json_slice(
        br#"{"clientId":"c","consumerGroup":"CG","mqSet":[{"brokerName":"broker-a","queueId":1,"topic":"T"}],"onlyThisBroker":false}"#,
    )
    .unwrap();
    assert_eq!(l.mq_set[0].queue_id, 1);
    let h: HeartbeatData = from_json_slice(br#"{"clientID":"x"}"#).unwrap();
    assert_eq!(h.client_id, "x");
}
