//! ACL over TCP: a broker and a name server with RocketMQ's plain ACL model. Unauthenticated
//! and wrongly signed requests are refused with NO_PERMISSION, permissions hold per topic and
//! group, admin requests need an admin account, and a fake broker cannot register routes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::*;
use shoal_broker::Broker;
use shoal_namesrv::{NameServer, NamesrvConfig};
use shoal_proto::acl::{sign_request, PlainAclConfig, SessionCredentials};
use shoal_proto::body::MessageModel;
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::constants::pull_sys_flag;
use shoal_proto::header::{GetRouteInfoRequestHeader, RegisterBrokerRequestHeader};
use shoal_proto::RemotingCommand;

const ACL: &str = r#"
globalWhiteRemoteAddresses = []

[[accounts]]
accessKey = "producer1"
secretKey = "producer-secret"
defaultTopicPerm = "DENY"
defaultGroupPerm = "SUB"
topicPerms = ["Orders=PUB|SUB", "Audit=SUB", "Secret=DENY"]
groupPerms = ["Blocked=DENY"]

[[accounts]]
accessKey = "operator"
secretKey = "operator-secret"
admin = true
"#;

fn signed(mut cmd: RemotingCommand, ak: &str, sk: &str) -> RemotingCommand {
    sign_request(&mut cmd, &SessionCredentials::new(ak, sk));
    cmd
}

fn acl_file(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("plain_acl.toml");
    std::fs::write(&p, ACL).unwrap();
    p
}

#[tokio::test]
async fn broker_refuses_unsigned_and_enforces_permissions() {
    let files = tempfile::tempdir().unwrap();
    let path = acl_file(files.path());
    let c = Cluster::start_with(|cfg| {
        cfg.acl_enabled = true;
        cfg.acl_file = Some(path.clone());
    })
    .await;
    let client = RawClient::new(&c.broker_addr);
    let (p, ps) = ("producer1", "producer-secret");
    let (op, os) = ("operator", "operator-secret");

    // Admin requests: only the admin account.
    let r = client.call(create_topic_req("Orders", 1)).await;
    assert_eq!(r.code, resp::NO_PERMISSION, "unsigned topic creation");
    let r = client
        .call(signed(create_topic_req("Orders", 1), p, ps))
        .await;
    assert_eq!(r.code, resp::NO_PERMISSION);
    assert!(r.remark.unwrap().contains("admin"));
    for t in ["Orders", "Audit", "Secret", "Other"] {
        ok(&client.call(signed(create_topic_req(t, 1), op, os)).await);
    }

    // Sends: unsigned, unknown key, wrong secret, tampered, then per-topic permissions.
    let r = client.call(send_req("Orders", 0, b"x", "")).await;
    assert_eq!(r.code, resp::NO_PERMISSION);
    assert!(r.remark.unwrap().contains("No accessKey"));
    let r = client
        .call(signed(send_req("Orders", 0, b"x", ""), "nobody12", ps))
        .await;
    assert_eq!(r.code, resp::NO_PERMISSION);
    let r = client
        .call(signed(send_req("Orders", 0, b"x", ""), p, "wrong-secret"))
        .await;
    assert_eq!(r.code, resp::NO_PERMISSION);
    assert!(r.remark.unwrap().contains("signature"));
    let mut tampered = signed(send_req("Orders", 0, b"x", ""), p, ps);
    tampered.body = Some(b"changed".to_vec().into());
    assert_eq!(client.call(tampered).await.code, resp::NO_PERMISSION);
    ok(&client
        .call(signed(send_req("Orders", 0, b"ok", ""), p, ps))
        .await);
    for t in ["Audit", "Secret", "Other"] {
        let r = client.call(signed(send_req(t, 0, b"x", ""), p, ps)).await;
        assert_eq!(r.code, resp::NO_PERMISSION, "send to {t}");
    }
    let b = c.broker.as_ref().unwrap().api();
    assert_eq!(b.store().max_offset("Orders", 0), 1);
    assert_eq!(b.store().max_offset("Audit", 0), 0);

    // Heartbeats and pulls need SUB on the topics and the group.
    let hb = heartbeat_req(
        "c1",
        "Readers",
        &[("Orders", "*")],
        MessageModel::Clustering,
    );
    assert_eq!(client.call(hb.clone()).await.code, resp::NO_PERMISSION);
    ok(&client.call(signed(hb, p, ps)).await);
    let hb = heartbeat_req(
        "c1",
        "Readers",
        &[("Secret", "*")],
        MessageModel::Clustering,
    );
    assert_eq!(
        client.call(signed(hb, p, ps)).await.code,
        resp::NO_PERMISSION
    );
    let hb = heartbeat_req(
        "c1",
        "Blocked",
        &[("Orders", "*")],
        MessageModel::Clustering,
    );
    assert_eq!(
        client.call(signed(hb, p, ps)).await.code,
        resp::NO_PERMISSION
    );
    let pull = |topic: &str, group: &str| {
        let mut r = pull_req(group, topic, 0, 0, pull_sys_flag::SUBSCRIPTION, 0);
        r.ext_fields.as_mut().unwrap().insert("subscription", "*");
        r
    };
    let r = client.call(signed(pull("Orders", "Readers"), p, ps)).await;
    ok(&r);
    assert_eq!(decode(&r).len(), 1);
    assert_eq!(
        client
            .call(signed(pull("Orders", "Blocked"), p, ps))
            .await
            .code,
        resp::NO_PERMISSION
    );
    assert_eq!(
        client
            .call(signed(pull("Secret", "Readers"), p, ps))
            .await
            .code,
        resp::NO_PERMISSION
    );
    assert!(c.counter("shoal_broker_acl_refused_total") >= 10);
    client.shutdown();
    c.stop().await;
}

fn register_req(broker_name: &str, addr: &str) -> RemotingCommand {
    RemotingCommand::request_with_header(
        rc::REGISTER_BROKER,
        &RegisterBrokerRequestHeader {
            broker_name: broker_name.into(),
            broker_addr: addr.into(),
            cluster_name: "DefaultCluster".into(),
            ha_server_addr: addr.into(),
            broker_id: 0,
            ..Default::default()
        },
    )
    .with_body(br#"{"topicConfigSerializeWrapper":{"topicConfigTable":{"Hijack":{"topicName":"Hijack","readQueueNums":1,"writeQueueNums":1,"perm":6}},"dataVersion":{"counter":1,"timestamp":1}},"filterServerList":[]}"#.to_vec())
}

#[tokio::test]
async fn name_server_registration_is_authenticated() {
    let dir = tempfile::tempdir().unwrap();
    let acl: PlainAclConfig = toml_acl();
    let ns = NameServer::start(NamesrvConfig {
        listen_addr: "127.0.0.1:0".into(),
        acl: Some(acl),
        ..NamesrvConfig::default()
    })
    .await
    .unwrap();
    let ns_addr = ns.local_addr().to_string();
    let client = RawClient::new(&ns_addr);
    // A fake broker: unsigned, or signed by a non-admin account.
    let r = client.call(register_req("fake", "127.0.0.1:1")).await;
    assert_eq!(r.code, resp::NO_PERMISSION);
    let r = client
        .call(signed(
            register_req("fake", "127.0.0.1:1"),
            "producer1",
            "producer-secret",
        ))
        .await;
    assert_eq!(r.code, resp::NO_PERMISSION);
    let route = RemotingCommand::request_with_header(
        rc::GET_ROUTEINFO_BY_TOPIC,
        &GetRouteInfoRequestHeader {
            topic: "Hijack".into(),
            ..Default::default()
        },
    );
    assert_eq!(client.call(route.clone()).await.code, resp::TOPIC_NOT_EXIST);
    // A real broker signs its registration with an admin account.
    let mut cfg = test_config(dir.path(), &ns_addr);
    cfg.namesrv_access_key = Some("operator".into());
    cfg.namesrv_secret_key = Some("operator-secret".into());
    let broker = Broker::start(cfg).await.unwrap();
    let to_broker = RawClient::new(&broker.local_addr().to_string());
    ok(&to_broker.call(create_topic_req("Real", 1)).await);
    to_broker.shutdown();
    let mut routed = false;
    for _ in 0..100 {
        let r = client
            .call(RemotingCommand::request_with_header(
                rc::GET_ROUTEINFO_BY_TOPIC,
                &GetRouteInfoRequestHeader {
                    topic: "Real".into(),
                    ..Default::default()
                },
            ))
            .await;
        if r.code == resp::SUCCESS {
            routed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(routed, "the signed registration was accepted");
    assert_eq!(client.call(route).await.code, resp::TOPIC_NOT_EXIST);
    assert!(ns.processor().acl_refused() >= 2);
    client.shutdown();
    broker.shutdown().await;
    ns.shutdown().await;
}

fn toml_acl() -> PlainAclConfig {
    let files = tempfile::tempdir().unwrap();
    shoal_broker::read_acl_config(&acl_file(files.path())).unwrap()
}
