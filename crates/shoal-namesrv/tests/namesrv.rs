//! The name server over real TCP on 127.0.0.1, driven with raw protocol requests.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use shoal_namesrv::{NameServer, NamesrvConfig};
use shoal_net::{NetConfig, NotSupportedProcessor, RemotingClient};
use shoal_proto::body::{
    ClusterInfo, RegisterBrokerBody, TopicConfig, TopicConfigAndMappingSerializeWrapper, TopicList,
    TopicRouteData,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::{
    GetRouteInfoRequestHeader, RegisterBrokerRequestHeader, UnregisterBrokerRequestHeader,
};
use shoal_proto::RemotingCommand;
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(3);

async fn start(scan: Duration) -> (NameServer, RemotingClient, String) {
    let ns = NameServer::start(NamesrvConfig {
        listen_addr: "127.0.0.1:0".into(),
        scan_interval: scan,
        ..NamesrvConfig::default()
    })
    .await
    .unwrap();
    let addr = ns.local_addr().to_string();
    let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
    (ns, client, addr)
}

fn register(
    name: &str,
    addr: &str,
    topics: &[(&str, i32)],
    timeout_ms: Option<i64>,
) -> RemotingCommand {
    let mut wrapper = TopicConfigAndMappingSerializeWrapper::default();
    for (t, n) in topics {
        wrapper
            .topic_config_table
            .insert(t.to_string(), TopicConfig::new(*t, *n));
    }
    let body = RegisterBrokerBody {
        filter_server_list: vec![],
        topic_config_serialize_wrapper: wrapper,
    };
    let h = RegisterBrokerRequestHeader {
        broker_name: name.into(),
        broker_addr: addr.into(),
        cluster_name: "DefaultCluster".into(),
        ha_server_addr: addr.into(),
        broker_id: 0,
        heartbeat_timeout_millis: timeout_ms,
        ..Default::default()
    };
    RemotingCommand::request_with_header(rc::REGISTER_BROKER, &h)
        .with_json_body(&body)
        .unwrap()
}

fn route_req(topic: &str, version: i32) -> RemotingCommand {
    let mut r = RemotingCommand::request_with_header(
        rc::GET_ROUTEINFO_BY_TOPIC,
        &GetRouteInfoRequestHeader {
            topic: topic.into(),
            ..Default::default()
        },
    );
    r.version = version;
    r
}

#[tokio::test]
async fn register_route_cluster_and_unregister() {
    let (ns, c, addr) = start(Duration::from_secs(5)).await;
    let r = c
        .invoke(
            &addr,
            register("broker-a", "127.0.0.1:10911", &[("T", 4)], None),
            T,
        )
        .await
        .unwrap();
    assert_eq!(r.code, resp::SUCCESS, "{:?}", r.remark);
    c.invoke(
        &addr,
        register("broker-b", "127.0.0.1:10912", &[("T", 2), ("U", 1)], None),
        T,
    )
    .await
    .unwrap();

    let r = c.invoke(&addr, route_req("T", 479), T).await.unwrap();
    assert_eq!(r.code, resp::SUCCESS);
    let body = r.body.clone().unwrap();
    let text = std::str::from_utf8(&body).unwrap();
    assert!(
        text.contains(r#""brokerAddrs":{"0":"127.0.0.1:10911"}"#),
        "{text}"
    );
    let route: TopicRouteData = r.decode_json_body().unwrap();
    assert_eq!(route.queue_datas.len(), 2);
    assert_eq!(route.publish_queues("T").len(), 6);

    // An old client (C++ sends version 63) gets fastjson's bare numeric keys.
    let r = c.invoke(&addr, route_req("T", 63), T).await.unwrap();
    let text = String::from_utf8(r.body.clone().unwrap().to_vec()).unwrap();
    assert!(
        text.contains(r#""brokerAddrs":{0:"127.0.0.1:10911"}"#),
        "{text}"
    );
    let again: TopicRouteData = r.decode_json_body().unwrap();
    assert_eq!(again, route);

    let r = c.invoke(&addr, route_req("missing", 479), T).await.unwrap();
    assert_eq!(r.code, resp::TOPIC_NOT_EXIST);
    assert!(r.remark.unwrap().contains("missing"));

    let r = c
        .invoke(
            &addr,
            RemotingCommand::request(rc::GET_BROKER_CLUSTER_INFO),
            T,
        )
        .await
        .unwrap();
    let info: ClusterInfo = r.decode_json_body().unwrap();
    assert_eq!(info.cluster_addr_table["DefaultCluster"].len(), 2);

    let r = c
        .invoke(
            &addr,
            RemotingCommand::request(rc::GET_ALL_TOPIC_LIST_FROM_NAMESERVER),
            T,
        )
        .await
        .unwrap();
    let list: TopicList = r.decode_json_body().unwrap();
    assert_eq!(
        list.topic_list.into_iter().collect::<Vec<_>>(),
        vec!["T", "U"]
    );

    let un = RemotingCommand::request_with_header(
        rc::UNREGISTER_BROKER,
        &UnregisterBrokerRequestHeader {
            broker_name: "broker-b".into(),
            broker_addr: "127.0.0.1:10912".into(),
            cluster_name: "DefaultCluster".into(),
            broker_id: 0,
            ..Default::default()
        },
    );
    assert_eq!(c.invoke(&addr, un, T).await.unwrap().code, resp::SUCCESS);
    let r = c.invoke(&addr, route_req("U", 479), T).await.unwrap();
    assert_eq!(r.code, resp::TOPIC_NOT_EXIST);
    ns.shutdown().await;
}

#[tokio::test]
async fn errors_are_answered_not_dropped() {
    let (ns, c, addr) = start(Duration::from_secs(5)).await;
    // Unknown request code.
    let r = c
        .invoke(&addr, RemotingCommand::request(9999), T)
        .await
        .unwrap();
    assert_eq!(r.code, resp::REQUEST_CODE_NOT_SUPPORTED);
    assert!(r.remark.unwrap().contains("9999"));
    // Missing header field.
    let r = c
        .invoke(
            &addr,
            RemotingCommand::request(rc::GET_ROUTEINFO_BY_TOPIC),
            T,
        )
        .await
        .unwrap();
    assert_eq!(r.code, resp::SYSTEM_ERROR);
    assert!(r.remark.unwrap().contains("topic"));
    // Body CRC mismatch.
    let mut reg = register("broker-a", "127.0.0.1:10911", &[("T", 4)], None);
    reg.ext_fields
        .as_mut()
        .unwrap()
        .insert("bodyCrc32", "12345");
    let r = c.invoke(&addr, reg, T).await.unwrap();
    assert_eq!(r.code, resp::SYSTEM_ERROR);
    assert_eq!(r.remark.as_deref(), Some("crc32 not match"));
    // Bad body JSON.
    let mut reg = register("broker-a", "127.0.0.1:10911", &[("T", 4)], None);
    reg.body = Some(bytes::Bytes::from_static(b"{nope"));
    let r = c.invoke(&addr, reg, T).await.unwrap();
    assert_eq!(r.code, resp::SYSTEM_ERROR);
    ns.shutdown().await;
}

#[tokio::test]
async fn silent_broker_expires_and_closed_connection_is_removed() {
    let (ns, c, addr) = start(Duration::from_millis(50)).await;
    c.invoke(
        &addr,
        register("broker-a", "127.0.0.1:10911", &[("T", 4)], Some(200)),
        T,
    )
    .await
    .unwrap();
    assert_eq!(
        c.invoke(&addr, route_req("T", 479), T).await.unwrap().code,
        resp::SUCCESS
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let r = c.invoke(&addr, route_req("T", 479), T).await.unwrap();
        if r.code == resp::TOPIC_NOT_EXIST {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A broker registered over a connection that then closes leaves the routes at once.
    let other = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
    other
        .invoke(
            &addr,
            register("broker-b", "127.0.0.1:10912", &[("V", 4)], None),
            T,
        )
        .await
        .unwrap();
    assert_eq!(
        c.invoke(&addr, route_req("V", 479), T).await.unwrap().code,
        resp::SUCCESS
    );
    other.shutdown();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let r = c.invoke(&addr, route_req("V", 479), T).await.unwrap();
        if r.code == resp::TOPIC_NOT_EXIST {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "closed broker stayed in routes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ns.shutdown().await;
}
