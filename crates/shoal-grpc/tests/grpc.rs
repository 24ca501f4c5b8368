//! The gRPC endpoint against a real broker, spoken to by a gRPC client built from the same
//! `apache.rocketmq.v2` definitions: routes with message types, the settings exchange,
//! sends of every type (type conflicts refused), receives under lease with receipts, acks,
//! invisibility changes, redelivery with the delivery attempt, delayed messages, transactions
//! ended by the producer and by the broker's check over Telemetry, dead-lettering, offsets,
//! unsupported calls, and the ACL's signatures.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use shoal_broker::{Broker, BrokerConfig};
use shoal_grpc::pb::messaging_service_client::MessagingServiceClient;
use shoal_grpc::pb::{self, Code};
use shoal_grpc::{GrpcConfig, GrpcServer};
use shoal_namesrv::{NameServer, NamesrvConfig};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

struct Env {
    _dir: tempfile::TempDir,
    namesrv: NameServer,
    broker: Broker,
    grpc: GrpcServer,
}

async fn start(tweak: impl FnOnce(&mut BrokerConfig)) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let namesrv = NameServer::start(NamesrvConfig {
        listen_addr: "127.0.0.1:0".into(),
        ..NamesrvConfig::default()
    })
    .await
    .unwrap();
    let mut cfg = BrokerConfig {
        broker_name: "broker-a".into(),
        listen_addr: "127.0.0.1:0".into(),
        namesrv_addrs: vec![namesrv.local_addr().to_string()],
        data_dir: dir.path().join("broker"),
        commit_log_segment_bytes: 8 * 1024 * 1024,
        delay_levels: "300ms 1s".into(),
        transaction_timeout_ms: 500,
        transaction_check_interval_ms: 300,
        ..BrokerConfig::default()
    };
    tweak(&mut cfg);
    let broker = Broker::start(cfg).await.unwrap();
    let grpc = GrpcServer::start(
        broker.api(),
        GrpcConfig {
            listen: "127.0.0.1:0".into(),
            advertised: None,
            tls: shoal_net::ServerTls::disabled(),
            long_polling: std::time::Duration::from_secs(7),
        },
    )
    .await
    .unwrap();
    Env {
        _dir: dir,
        namesrv,
        broker,
        grpc,
    }
}

impl Env {
    async fn client(&self) -> MessagingServiceClient<Channel> {
        MessagingServiceClient::connect(format!("http://{}", self.grpc.local_addr()))
            .await
            .unwrap()
    }

    async fn stop(self) {
        self.grpc.shutdown().await;
        self.broker.shutdown().await;
        self.namesrv.shutdown().await;
    }
}

fn res(name: &str) -> Option<pb::Resource> {
    Some(pb::Resource {
        resource_namespace: String::new(),
        name: name.into(),
    })
}

fn req<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("x-mq-client-id", "test-client@1".parse().unwrap());
    r
}

fn code(s: &Option<pb::Status>) -> Code {
    Code::try_from(s.as_ref().map_or(0, |s| s.code)).unwrap_or(Code::Unspecified)
}

static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn message(topic: &str, body: &str, kind: pb::MessageType) -> pb::Message {
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    pb::Message {
        topic: res(topic),
        user_properties: [("k".to_string(), body.to_string())].into(),
        system_properties: Some(pb::SystemProperties {
            tag: Some("t".into()),
            message_id: format!("ID{id:08}"),
            message_type: kind as i32,
            ..Default::default()
        }),
        body: body.as_bytes().to_vec(),
    }
}

async fn send(c: &mut MessagingServiceClient<Channel>, m: pb::Message) -> pb::SendMessageResponse {
    c.send_message(req(pb::SendMessageRequest { messages: vec![m] }))
        .await
        .unwrap()
        .into_inner()
}

/// One receive: (status, messages).
async fn receive(
    c: &mut MessagingServiceClient<Channel>,
    group: &str,
    topic: &str,
    invisible: Duration,
    poll: Duration,
) -> (Code, Vec<pb::Message>) {
    let mut s = c
        .receive_message(req(pb::ReceiveMessageRequest {
            group: res(group),
            message_queue: Some(pb::MessageQueue {
                topic: res(topic),
                id: -1,
                ..Default::default()
            }),
            filter_expression: Some(pb::FilterExpression {
                r#type: pb::FilterType::Tag as i32,
                expression: "*".into(),
            }),
            batch_size: 16,
            invisible_duration: Some(prost_types::Duration {
                seconds: invisible.as_secs() as i64,
                nanos: invisible.subsec_nanos() as i32,
            }),
            auto_renew: false,
            long_polling_timeout: Some(prost_types::Duration {
                seconds: poll.as_secs() as i64,
                nanos: poll.subsec_nanos() as i32,
            }),
            attempt_id: None,
        }))
        .await
        .unwrap()
        .into_inner();
    let mut status = Code::Unspecified;
    let mut out = Vec::new();
    while let Some(r) = s.message().await.unwrap() {
        match r.content {
            Some(pb::receive_message_response::Content::Status(st)) => {
                status = Code::try_from(st.code).unwrap_or(Code::Unspecified)
            }
            Some(pb::receive_message_response::Content::Message(m)) => out.push(m),
            _ => {}
        }
    }
    (status, out)
}

fn handle(m: &pb::Message) -> String {
    m.system_properties
        .as_ref()
        .and_then(|s| s.receipt_handle.clone())
        .unwrap()
}

fn attempt(m: &pb::Message) -> i32 {
    m.system_properties
        .as_ref()
        .and_then(|s| s.delivery_attempt)
        .unwrap()
}

async fn ack(c: &mut MessagingServiceClient<Channel>, group: &str, topic: &str, h: &str) -> Code {
    let r = c
        .ack_message(req(pb::AckMessageRequest {
            group: res(group),
            topic: res(topic),
            entries: vec![pb::AckMessageEntry {
                message_id: String::new(),
                receipt_handle: h.into(),
                lite_topic: None,
            }],
        }))
        .await
        .unwrap()
        .into_inner();
    code(&r.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_settings_sends_receives_acks_and_redelivery() {
    let env = start(|_| {}).await;
    let api = env.broker.api();
    let mut c = env.client().await;

    // No such topic (auto-create is off).
    let r = c
        .query_route(req(pb::QueryRouteRequest {
            topic: res("Orders"),
            endpoints: None,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.status), Code::TopicNotFound);
    api.create_typed_topic("Orders", 2, Some(shoal_proto::body::TopicMessageType::Fifo))
        .unwrap();
    api.create_topic("Plain", 2).unwrap();
    let r = c
        .query_route(req(pb::QueryRouteRequest {
            topic: res("Orders"),
            endpoints: None,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.status), Code::Ok);
    assert_eq!(r.message_queues.len(), 2);
    let q = &r.message_queues[0];
    assert_eq!(q.accept_message_types, [pb::MessageType::Fifo as i32]);
    assert_eq!(q.permission, pb::Permission::ReadWrite as i32);
    let broker = q.broker.as_ref().unwrap();
    assert_eq!(broker.name, "broker-a");
    let ep = broker.endpoints.as_ref().unwrap();
    assert_eq!(ep.addresses[0].port as u16, env.grpc.local_addr().port());
    // An untyped topic takes every type.
    let r = c
        .query_route(req(pb::QueryRouteRequest {
            topic: res("Plain"),
            endpoints: None,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.message_queues[0].accept_message_types.len(), 4);

    // Sends: the FIFO topic refuses a normal message, takes a FIFO one.
    let r = send(&mut c, message("Orders", "n", pb::MessageType::Normal)).await;
    assert_eq!(code(&r.status), Code::MessagePropertyConflictWithType);
    let mut fifo = message("Orders", "f1", pb::MessageType::Fifo);
    fifo.system_properties.as_mut().unwrap().message_group = Some("order-7".into());
    let r = send(&mut c, fifo).await;
    assert_eq!(code(&r.status), Code::Ok, "{r:?}");
    for i in 0..3 {
        let r = send(
            &mut c,
            message("Plain", &format!("p{i}"), pb::MessageType::Normal),
        )
        .await;
        assert_eq!(code(&r.status), Code::Ok, "{r:?}");
        assert_eq!(r.entries[0].message_id.len(), 10);
    }

    // Receive under lease: all three, first attempt, user properties and tag kept.
    let (st, got) = receive(
        &mut c,
        "G",
        "Plain",
        Duration::from_secs(1),
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(st, Code::Ok);
    assert_eq!(got.len(), 3);
    for m in &got {
        assert_eq!(attempt(m), 1);
        let sys = m.system_properties.as_ref().unwrap();
        assert_eq!(sys.tag.as_deref(), Some("t"));
        assert_eq!(
            m.user_properties.get("k").map(String::as_bytes),
            Some(m.body.as_slice())
        );
        let digest = sys.body_digest.as_ref().unwrap();
        assert_eq!(digest.checksum, format!("{:X}", crc32fast::hash(&m.body)));
    }
    // Nothing more while leased (long polling answers MESSAGE_NOT_FOUND at its end).
    let started = Instant::now();
    let (st, none) = receive(
        &mut c,
        "G",
        "Plain",
        Duration::from_secs(1),
        Duration::from_millis(900),
    )
    .await;
    assert!(none.is_empty());
    assert_eq!(st, Code::MessageNotFound);
    assert!(started.elapsed() >= Duration::from_millis(300));

    // Ack the first; acking it again is refused. Change the second's lease: the new handle
    // acks, the old one no longer does. The third lapses: delivered again, attempt 2.
    assert_eq!(ack(&mut c, "G", "Plain", &handle(&got[0])).await, Code::Ok);
    assert_eq!(
        ack(&mut c, "G", "Plain", &handle(&got[0])).await,
        Code::InvalidReceiptHandle
    );
    let ch = c
        .change_invisible_duration(req(pb::ChangeInvisibleDurationRequest {
            group: res("G"),
            topic: res("Plain"),
            receipt_handle: handle(&got[1]),
            invisible_duration: Some(prost_types::Duration {
                seconds: 30,
                nanos: 0,
            }),
            message_id: String::new(),
            lite_topic: None,
            suspend: None,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&ch.status), Code::Ok);
    assert_eq!(
        ack(&mut c, "G", "Plain", &handle(&got[1])).await,
        Code::InvalidReceiptHandle
    );
    assert_eq!(
        ack(&mut c, "G", "Plain", &ch.receipt_handle).await,
        Code::Ok
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut again = Vec::new();
    while again.is_empty() && Instant::now() < deadline {
        again = receive(
            &mut c,
            "G",
            "Plain",
            Duration::from_secs(5),
            Duration::from_secs(2),
        )
        .await
        .1;
    }
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].body, got[2].body);
    assert_eq!(attempt(&again[0]), 2);
    assert_eq!(again[0].topic.as_ref().unwrap().name, "Plain");
    // Given up on: the dead-letter queue.
    let r = c
        .forward_message_to_dead_letter_queue(req(pb::ForwardMessageToDeadLetterQueueRequest {
            group: res("G"),
            topic: res("Plain"),
            receipt_handle: handle(&again[0]),
            message_id: String::new(),
            delivery_attempt: 2,
            max_delivery_attempts: 2,
            lite_topic: None,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.status), Code::Ok, "{r:?}");
    let dlq = api.topic("%DLQ%G").expect("dead-letter topic");
    assert_eq!(dlq.topic_name, "%DLQ%G");
    assert_eq!(api.queue_bounds("%DLQ%G", 0).1, 1);

    // Offsets of the group: everything of Plain acknowledged.
    let total: i64 = (0..2)
        .filter_map(|q| api.consumer_offset("G", "Plain", q))
        .sum();
    assert_eq!(total, 3);
    let r = c
        .query_offset(req(pb::QueryOffsetRequest {
            message_queue: Some(pb::MessageQueue {
                topic: res("Plain"),
                id: 0,
                ..Default::default()
            }),
            query_offset_policy: pb::QueryOffsetPolicy::End as i32,
            timestamp: None,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.status), Code::Ok);
    assert_eq!(r.offset as u64, api.queue_bounds("Plain", 0).1);

    // Unsupported calls say so.
    let mut s = c
        .pull_message(req(pb::PullMessageRequest::default()))
        .await
        .unwrap()
        .into_inner();
    match s.message().await.unwrap().unwrap().content {
        Some(pb::pull_message_response::Content::Status(st)) => {
            assert_eq!(st.code, Code::Unsupported as i32)
        }
        other => panic!("{other:?}"),
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_delays_and_transactions_with_check_back() {
    let env = start(|_| {}).await;
    let api = env.broker.api();
    api.create_topic("Tx", 1).unwrap();
    api.create_topic("Later", 1).unwrap();
    let mut c = env.client().await;

    // Telemetry: the producer says its settings, the server answers with its own.
    let (out, rx) = tokio::sync::mpsc::channel::<pb::TelemetryCommand>(8);
    let mut inbound = c
        .telemetry(req(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    out.send(pb::TelemetryCommand {
        status: None,
        command: Some(pb::telemetry_command::Command::Settings(pb::Settings {
            client_type: Some(pb::ClientType::Producer as i32),
            pub_sub: Some(pb::settings::PubSub::Publishing(pb::Publishing {
                topics: vec![res("Tx").unwrap()],
                max_body_size: 0,
                validate_message_type: false,
            })),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let settings = inbound.message().await.unwrap().unwrap();
    match settings.command {
        Some(pb::telemetry_command::Command::Settings(s)) => match s.pub_sub {
            Some(pb::settings::PubSub::Publishing(p)) => {
                assert!(p.validate_message_type);
                assert!(p.max_body_size > 0);
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    // A consumer is told the endpoint's long polling (its GrpcConfig, 7 s here).
    let (cout, crx) = tokio::sync::mpsc::channel::<pb::TelemetryCommand>(8);
    let mut cin = c
        .telemetry(req(tokio_stream::wrappers::ReceiverStream::new(crx)))
        .await
        .unwrap()
        .into_inner();
    cout.send(pb::TelemetryCommand {
        status: None,
        command: Some(pb::telemetry_command::Command::Settings(pb::Settings {
            client_type: Some(pb::ClientType::PushConsumer as i32),
            pub_sub: Some(pb::settings::PubSub::Subscription(pb::Subscription {
                group: res("g-settings"),
                ..Default::default()
            })),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    match cin.message().await.unwrap().unwrap().command {
        Some(pb::telemetry_command::Command::Settings(s)) => match s.pub_sub {
            Some(pb::settings::PubSub::Subscription(s)) => {
                let d = s.long_polling_timeout.unwrap();
                assert_eq!((d.seconds, d.nanos), (7, 0));
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }

    // A delayed message is not received before its time.
    let due = shoal_broker::BrokerApi::wall_ms() + 1_200;
    let mut m = message("Later", "later", pb::MessageType::Delay);
    m.system_properties.as_mut().unwrap().delivery_timestamp = Some(prost_types::Timestamp {
        seconds: due / 1000,
        nanos: ((due % 1000) * 1_000_000) as i32,
    });
    assert_eq!(code(&send(&mut c, m).await.status), Code::Ok);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.is_empty() && Instant::now() < deadline {
        got = receive(
            &mut c,
            "GD",
            "Later",
            Duration::from_secs(10),
            Duration::from_secs(2),
        )
        .await
        .1;
    }
    assert_eq!(got.len(), 1);
    assert!(shoal_broker::BrokerApi::wall_ms() >= due);
    assert!(got[0]
        .system_properties
        .as_ref()
        .unwrap()
        .delivery_timestamp
        .is_some());

    // Transactions: committed by the producer, then one left open and committed when the
    // broker asks (RecoverOrphanedTransactionCommand over Telemetry).
    let r = send(&mut c, message("Tx", "tx1", pb::MessageType::Transaction)).await;
    assert_eq!(code(&r.status), Code::Ok);
    let e = &r.entries[0];
    assert_eq!(e.transaction_id.len(), 32);
    let (_, nothing) = receive(
        &mut c,
        "GT",
        "Tx",
        Duration::from_secs(10),
        Duration::from_millis(600),
    )
    .await;
    assert!(nothing.is_empty(), "a half message is not visible");
    let end = |id: &str, tx: &str, source: pb::TransactionSource| pb::EndTransactionRequest {
        topic: res("Tx"),
        message_id: id.into(),
        transaction_id: tx.into(),
        resolution: pb::TransactionResolution::Commit as i32,
        source: source as i32,
        trace_context: String::new(),
    };
    let r2 = c
        .end_transaction(req(end(
            &e.message_id,
            &e.transaction_id,
            pb::TransactionSource::SourceClient,
        )))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r2.status), Code::Ok, "{r2:?}");
    let r = send(&mut c, message("Tx", "tx2", pb::MessageType::Transaction)).await;
    assert_eq!(code(&r.status), Code::Ok);
    let check = tokio::time::timeout(Duration::from_secs(10), inbound.message())
        .await
        .expect("the broker checks the open transaction")
        .unwrap()
        .unwrap();
    let (msg, tx) = match check.command {
        Some(pb::telemetry_command::Command::RecoverOrphanedTransactionCommand(c)) => {
            (c.message.unwrap(), c.transaction_id)
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(msg.body, b"tx2");
    let id = msg.system_properties.as_ref().unwrap().message_id.clone();
    let r3 = c
        .end_transaction(req(end(&id, &tx, pb::TransactionSource::SourceServerCheck)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r3.status), Code::Ok, "{r3:?}");
    let mut bodies = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while bodies.len() < 2 && Instant::now() < deadline {
        for m in receive(
            &mut c,
            "GT",
            "Tx",
            Duration::from_secs(10),
            Duration::from_secs(1),
        )
        .await
        .1
        {
            bodies.push(String::from_utf8(m.body).unwrap());
        }
    }
    bodies.sort();
    assert_eq!(bodies, ["tx1", "tx2"]);
    drop(out);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_signatures_and_permissions() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        r#"
globalWhiteRemoteAddresses = []

[[accounts]]
accessKey = "producer1"
secretKey = "producer-secret"
defaultTopicPerm = "DENY"
defaultGroupPerm = "SUB"
topicPerms = ["Orders=PUB|SUB"]
"#,
    )
    .unwrap();
    let env = start(|c| {
        c.acl_enabled = true;
        c.acl_file = Some(acl.clone());
    })
    .await;
    env.broker.api().create_topic("Orders", 1).unwrap();
    env.broker.api().create_topic("Secret", 1).unwrap();
    let mut c = env.client().await;
    let signed = |m: pb::Message, ak: &str, sk: &str| {
        let mut r = req(pb::SendMessageRequest { messages: vec![m] });
        let date = "20250101T000000Z";
        let sig = shoal_grpc::auth::sign(sk, date);
        r.metadata_mut()
            .insert("x-mq-date-time", date.parse().unwrap());
        r.metadata_mut().insert(
            "authorization",
            format!(
                "MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={sig}"
            )
            .parse()
            .unwrap(),
        );
        r
    };
    let e = c
        .send_message(req(pb::SendMessageRequest {
            messages: vec![message("Orders", "x", pb::MessageType::Normal)],
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    let e = c
        .send_message(signed(
            message("Orders", "x", pb::MessageType::Normal),
            "producer1",
            "wrong-secret",
        ))
        .await
        .unwrap_err();
    assert!(e.message().contains("signature"), "{e:?}");
    let ok = c
        .send_message(signed(
            message("Orders", "x", pb::MessageType::Normal),
            "producer1",
            "producer-secret",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&ok.status), Code::Ok);
    let e = c
        .send_message(signed(
            message("Secret", "x", pb::MessageType::Normal),
            "producer1",
            "producer-secret",
        ))
        .await
        .unwrap_err();
    assert!(e.message().contains("No permission"), "{e:?}");
    env.stop().await;
}
