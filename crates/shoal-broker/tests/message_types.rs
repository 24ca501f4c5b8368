//! RocketMQ 5's topic message types: set by UPDATE_AND_CREATE_TOPIC's attributes
//! (`+message.type=FIFO`), enforced on send with a clear error, changed or removed by a later
//! update (`-message.type`); a topic without a type takes every type.

mod common;

use common::*;
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::CreateTopicRequestHeader;
use shoal_proto::RemotingCommand;

fn create_typed(topic: &str, attributes: &str) -> RemotingCommand {
    RemotingCommand::request_with_header(
        rc::UPDATE_AND_CREATE_TOPIC,
        &CreateTopicRequestHeader {
            topic: topic.into(),
            default_topic: "TBW102".into(),
            read_queue_nums: 2,
            write_queue_nums: 2,
            perm: 6,
            topic_filter_type: "SINGLE_TAG".into(),
            attributes: Some(attributes.into()),
            ..Default::default()
        },
    )
}

#[tokio::test]
async fn typed_topics_refuse_other_types_and_untyped_take_all() {
    let cluster = Cluster::start().await;
    let c = RawClient::new(&cluster.broker_addr);
    ok(&c.call(create_typed("Fifo", "+message.type=FIFO")).await);
    let api = cluster.broker.as_ref().unwrap().api();
    assert_eq!(
        api.topic("Fifo").unwrap().attributes.get("message.type"),
        Some(&"FIFO".to_string())
    );
    let normal = props(&[]);
    let fifo = props(&[("__SHARDINGKEY", "order-1")]);
    let delay = props(&[("DELAY", "2")]);
    let r = c.call(send_req("Fifo", 0, b"x", &normal)).await;
    assert_eq!(r.code, resp::MESSAGE_ILLEGAL);
    let why = r.remark.unwrap_or_default();
    assert!(why.contains("FIFO") && why.contains("NORMAL"), "{why}");
    ok(&c.call(send_req("Fifo", 0, b"x", &fifo)).await);
    assert_eq!(
        c.call(send_req("Fifo", 0, b"x", &delay)).await.code,
        resp::MESSAGE_ILLEGAL
    );

    // An unknown type is refused at creation.
    let r = c.call(create_typed("Bad", "+message.type=SOMETIMES")).await;
    assert_eq!(r.code, resp::INVALID_PARAMETER);

    // Untyped (and MIXED) topics take every type.
    ok(&c.call(create_topic_req("Any", 2)).await);
    ok(&c.call(create_typed("Mixed", "+message.type=MIXED")).await);
    for t in ["Any", "Mixed"] {
        for p in [&normal, &fifo, &delay] {
            ok(&c.call(send_req(t, 0, b"x", p)).await);
        }
    }

    // An update without attributes keeps the type; `-message.type` removes it.
    ok(&c.call(create_topic_req("Fifo", 2)).await);
    assert_eq!(
        c.call(send_req("Fifo", 0, b"x", &normal)).await.code,
        resp::MESSAGE_ILLEGAL
    );
    ok(&c.call(create_typed("Fifo", "-message.type")).await);
    ok(&c.call(send_req("Fifo", 0, b"x", &normal)).await);

    // The API's typed topics too.
    api.create_typed_topic(
        "Tx",
        1,
        Some(shoal_proto::body::TopicMessageType::Transaction),
    )
    .unwrap();
    assert_eq!(
        c.call(send_req("Tx", 0, b"x", &normal)).await.code,
        resp::MESSAGE_ILLEGAL
    );
    c.shutdown();
    cluster.stop().await;
}
