//! Pushed routes over real TCP on 127.0.0.1: a client that watches a topic's route is told
//! when it really changes (a broker registered, its queues changed, write permission wiped, a
//! broker unregistered), not at every periodic registration; the watch limits refuse and count.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use shoal_namesrv::{NameServer, NamesrvConfig};
use shoal_net::{processor_fn, NetConfig, NotSupportedProcessor, RemotingClient};
use shoal_proto::body::{
    DataVersion, RegisterBrokerBody, TopicConfig, TopicConfigAndMappingSerializeWrapper,
    TopicRouteData,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::{
    GetRouteInfoRequestHeader, RegisterBrokerRequestHeader, UnregisterBrokerRequestHeader,
    WipeWritePermOfBrokerRequestHeader, WipeWritePermOfBrokerResponseHeader,
};
use shoal_proto::route_watch::{self, RouteChangedNotice};
use shoal_proto::RemotingCommand;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

const T: Duration = Duration::from_secs(3);

async fn start(config: NamesrvConfig) -> (NameServer, String) {
    let ns = NameServer::start(NamesrvConfig {
        listen_addr: "127.0.0.1:0".into(),
        ..config
    })
    .await
    .unwrap();
    let addr = ns.local_addr().to_string();
    (ns, addr)
}

/// A client whose server-initiated requests (the notices) land in a channel.
fn watcher() -> (RemotingClient, mpsc::UnboundedReceiver<Vec<String>>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let processor = processor_fn(move |_ctx, req: RemotingCommand| {
        let tx = tx.clone();
        async move {
            assert_eq!(req.code, route_watch::request_code::NOTIFY_ROUTE_CHANGED);
            assert!(req.is_oneway());
            let n: RouteChangedNotice = req.decode_json_body()?;
            let _ = tx.send(n.topics);
            Ok(None)
        }
    });
    (
        RemotingClient::new(NetConfig::default(), Arc::new(processor)),
        rx,
    )
}

fn register(name: &str, addr: &str, topics: &[(&str, i32)], version: i64) -> RemotingCommand {
    let mut wrapper = TopicConfigAndMappingSerializeWrapper::default();
    for (t, n) in topics {
        wrapper
            .topic_config_table
            .insert(t.to_string(), TopicConfig::new(*t, *n));
    }
    wrapper.data_version = DataVersion {
        counter: version,
        state_version: 0,
        timestamp: 1,
    };
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
        ..Default::default()
    };
    RemotingCommand::request_with_header(rc::REGISTER_BROKER, &h)
        .with_json_body(&body)
        .unwrap()
}

fn route_req(topic: &str, watch: bool) -> RemotingCommand {
    let mut r = RemotingCommand::request_with_header(
        rc::GET_ROUTEINFO_BY_TOPIC,
        &GetRouteInfoRequestHeader {
            topic: topic.into(),
            ..Default::default()
        },
    );
    if watch {
        route_watch::watch(&mut r);
    }
    r
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Vec<String>>) -> Vec<String> {
    tokio::time::timeout(T, rx.recv())
        .await
        .expect("no route notice within 3 s")
        .unwrap()
}

/// Nothing arrives for a while (notices are sent at once; 300 ms is plenty on loopback).
async fn quiet(rx: &mut mpsc::UnboundedReceiver<Vec<String>>) {
    if let Ok(n) = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {
        panic!("unexpected route notice {n:?}");
    }
}

#[tokio::test]
async fn watchers_are_told_of_real_route_changes_only() {
    let (ns, addr) = start(NamesrvConfig::default()).await;
    let broker = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
    let ok = |r: RemotingCommand| assert_eq!(r.code, resp::SUCCESS, "{:?}", r.remark);
    ok(broker
        .invoke(
            &addr,
            register("broker-a", "127.0.0.1:1", &[("T", 4)], 1),
            T,
        )
        .await
        .unwrap());

    let (client, mut rx) = watcher();
    let r = client.invoke(&addr, route_req("T", true), T).await.unwrap();
    ok(r.clone());
    assert_eq!(r.ext(route_watch::field::WATCHED), Some("true"));
    // A plain route request (an official client) is not watched, and its answer says nothing.
    let (plain, mut plain_rx) = watcher();
    let r = plain.invoke(&addr, route_req("T", false), T).await.unwrap();
    assert_eq!(r.ext(route_watch::field::WATCHED), None);
    assert_eq!(ns.processor().route_watches(), 1);

    // The periodic registration changes nothing: no notice.
    ok(broker
        .invoke(
            &addr,
            register("broker-a", "127.0.0.1:1", &[("T", 4)], 1),
            T,
        )
        .await
        .unwrap());
    quiet(&mut rx).await;

    // A second broker with the topic, another topic nobody watches.
    ok(broker
        .invoke(
            &addr,
            register("broker-b", "127.0.0.1:2", &[("T", 2), ("U", 1)], 1),
            T,
        )
        .await
        .unwrap());
    assert_eq!(next(&mut rx).await, ["T"]);

    // The topic grows on broker-a (a new data version): told.
    ok(broker
        .invoke(
            &addr,
            register("broker-a", "127.0.0.1:1", &[("T", 8)], 2),
            T,
        )
        .await
        .unwrap());
    assert_eq!(next(&mut rx).await, ["T"]);

    // broker-b's write permission wiped: told, and the route says read-only.
    let wipe = RemotingCommand::request_with_header(
        rc::WIPE_WRITE_PERM_OF_BROKER,
        &WipeWritePermOfBrokerRequestHeader {
            broker_name: "broker-b".into(),
            ..Default::default()
        },
    );
    let r = broker.invoke(&addr, wipe, T).await.unwrap();
    ok(r.clone());
    let h: WipeWritePermOfBrokerResponseHeader = r.decode_command_header().unwrap();
    assert_eq!(h.wipe_topic_count, 2);
    assert_eq!(next(&mut rx).await, ["T"]);
    let route: TopicRouteData = client
        .invoke(&addr, route_req("T", true), T)
        .await
        .unwrap()
        .decode_json_body()
        .unwrap();
    let queues = route.publish_queues("T");
    assert!(
        queues.iter().all(|q| q.broker_name == "broker-a"),
        "{queues:?}"
    );
    assert_eq!(route.subscribe_queues("T").len(), 10);

    // broker-b leaves: told.
    let unregister = RemotingCommand::request_with_header(
        rc::UNREGISTER_BROKER,
        &UnregisterBrokerRequestHeader {
            broker_name: "broker-b".into(),
            broker_addr: "127.0.0.1:2".into(),
            cluster_name: "DefaultCluster".into(),
            broker_id: 0,
            ..Default::default()
        },
    );
    ok(broker.invoke(&addr, unregister, T).await.unwrap());
    assert_eq!(next(&mut rx).await, ["T"]);

    // The broker's connection closes (a killed broker): broker-a leaves the routes, told.
    broker.shutdown();
    assert_eq!(next(&mut rx).await, ["T"]);
    quiet(&mut plain_rx).await;

    // A watcher that goes away takes its watches with it.
    client.shutdown();
    let deadline = tokio::time::Instant::now() + T;
    while ns.processor().route_watches() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "watch not forgotten"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ns.shutdown().await;
}

#[tokio::test]
async fn watch_limits_refuse_count_and_still_answer() {
    let (ns, addr) = start(NamesrvConfig {
        max_route_watches: 3,
        max_route_watches_per_connection: 2,
        ..NamesrvConfig::default()
    })
    .await;
    let broker = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
    broker
        .invoke(
            &addr,
            register(
                "broker-a",
                "127.0.0.1:1",
                &[("A", 1), ("B", 1), ("C", 1)],
                1,
            ),
            T,
        )
        .await
        .unwrap();
    let (one, _rx1) = watcher();
    let watched = |r: RemotingCommand| {
        assert_eq!(r.code, resp::SUCCESS);
        r.ext(route_watch::field::WATCHED).map(str::to_string)
    };
    for t in ["A", "B"] {
        let r = one.invoke(&addr, route_req(t, true), T).await.unwrap();
        assert_eq!(watched(r).as_deref(), Some("true"));
    }
    // Over the per-connection limit: answered, not watched.
    let r = one.invoke(&addr, route_req("C", true), T).await.unwrap();
    assert!(r.body.is_some());
    assert_eq!(watched(r).as_deref(), Some("false"));
    let (two, _rx2) = watcher();
    let r = two.invoke(&addr, route_req("A", true), T).await.unwrap();
    assert_eq!(watched(r).as_deref(), Some("true"));
    // Over the total limit.
    let r = two.invoke(&addr, route_req("B", true), T).await.unwrap();
    assert_eq!(watched(r).as_deref(), Some("false"));
    assert_eq!(ns.processor().route_watches(), 3);
    // The running name server's registry (what `/metrics` serves).
    let text = ns.processor().metrics().registry.encode_text();
    for line in [
        "shoal_namesrv_route_watches 3\n",
        "shoal_namesrv_route_watch_refused_total{limit=\"max_route_watches\"} 1\n",
        "shoal_namesrv_route_watch_refused_total{limit=\"max_route_watches_per_connection\"} 1\n",
    ] {
        assert!(text.contains(line), "{line} not in {text}");
    }
    ns.shutdown().await;
}
