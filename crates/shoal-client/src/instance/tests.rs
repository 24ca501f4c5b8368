//! The instance answering requests brokers send it, end to end.

use super::*;
use crate::config::ClientConfig;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use shoal_net::Server;
use shoal_proto::body::{
    ConsumeMessageDirectlyResult, ConsumerData, ConsumerRunningInfo, ResetOffsetBody,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::*;
use shoal_proto::message::MessageExt;
use shoal_proto::{MessageQueue, RemotingCommand};
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// A consumer handle that records what the processor asked of it.
#[derive(Default)]
struct Recorder {
    rebalances: Mutex<usize>,
    resets: Mutex<Vec<(String, BTreeMap<MessageQueue, i64>)>>,
}

impl ConsumerHandle for Recorder {
    fn consumer_data(&self) -> ConsumerData {
        ConsumerData {
            group_name: "G".into(),
            ..Default::default()
        }
    }
    fn subscribed_topics(&self) -> Vec<String> {
        vec!["T".into()]
    }
    fn rebalance_now(&self) {
        *self.rebalances.lock() += 1;
    }
    fn running_info(&self) -> ConsumerRunningInfo {
        let mut info = ConsumerRunningInfo::default();
        info.properties.insert("k".into(), "v".into());
        info
    }
    fn reset_offset(&self, topic: &str, offsets: BTreeMap<MessageQueue, i64>) {
        self.resets.lock().push((topic.to_owned(), offsets));
    }
    fn consume_directly(
        &self,
        _msg: MessageExt,
    ) -> BoxFuture<'static, ConsumeMessageDirectlyResult> {
        Box::pin(async { ConsumeMessageDirectlyResult::default() })
    }
}

/// A broker stand-in that, once the client connected, sends it server-initiated requests.
#[tokio::test]
async fn processor_answers_broker_requests() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let server = Server::bind(
        "127.0.0.1:0",
        Arc::new(shoal_net::processor_fn(move |ctx, _req| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(ctx.connection().clone());
                Ok(Some(RemotingCommand::response(resp::SUCCESS, None)))
            }
        })),
    )
    .await
    .unwrap();
    let addr = server.local_addr().to_string();
    let instance = ClientInstance::start(ClientConfig::new(&addr)).unwrap();
    let rec = Arc::new(Recorder::default());
    let weak: Weak<dyn ConsumerHandle> = Arc::downgrade(&(rec.clone() as Arc<dyn ConsumerHandle>));
    instance.register_consumer("G", weak);
    let r = instance
        .invoke(
            &addr,
            RemotingCommand::request(rc::HEART_BEAT),
            Duration::from_secs(3),
        )
        .await
        .unwrap();
    assert_eq!(r.code, resp::SUCCESS);
    let conn = rx.recv().await.unwrap();
    let t = Duration::from_secs(3);

    // GET_CONSUMER_RUNNING_INFO for a known and an unknown group.
    let req = RemotingCommand::request_with_header(
        rc::GET_CONSUMER_RUNNING_INFO,
        &GetConsumerRunningInfoRequestHeader {
            consumer_group: "G".into(),
            client_id: instance.client_id().into(),
            ..Default::default()
        },
    );
    let r = conn.request(req, t).await.unwrap();
    assert_eq!(r.code, resp::SUCCESS);
    let info: ConsumerRunningInfo = r.decode_json_body().unwrap();
    assert_eq!(info.properties.get("k").map(String::as_str), Some("v"));
    let req = RemotingCommand::request_with_header(
        rc::GET_CONSUMER_RUNNING_INFO,
        &GetConsumerRunningInfoRequestHeader {
            consumer_group: "nope".into(),
            client_id: "x".into(),
            ..Default::default()
        },
    );
    let r = conn.request(req, t).await.unwrap();
    assert_eq!(r.code, resp::SYSTEM_ERROR);
    assert!(r.remark.unwrap().contains("nope"));

    // NOTIFY (oneway) triggers a rebalance; RESET passes the table on.
    let mut notify = RemotingCommand::request_with_header(
        rc::NOTIFY_CONSUMER_IDS_CHANGED,
        &NotifyConsumerIdsChangedRequestHeader {
            consumer_group: "G".into(),
            ..Default::default()
        },
    );
    notify.set_oneway();
    conn.oneway(notify).await.unwrap();
    let mut table = BTreeMap::new();
    table.insert(MessageQueue::new("T", "b", 1), 42);
    let reset = RemotingCommand::request_with_header(
        rc::RESET_CONSUMER_CLIENT_OFFSET,
        &ResetOffsetRequestHeader {
            topic: "T".into(),
            group: "G".into(),
            timestamp: 0,
            ..Default::default()
        },
    )
    .with_json_body(&ResetOffsetBody {
        offset_table: table.clone(),
    })
    .unwrap();
    conn.oneway(reset).await.unwrap();
    for _ in 0..200 {
        if *rec.rebalances.lock() == 1 && rec.resets.lock().len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(*rec.rebalances.lock(), 1);
    assert_eq!(rec.resets.lock()[0], ("T".to_owned(), table));

    // Unknown codes.
    let r = conn
        .request(RemotingCommand::request(999_999), t)
        .await
        .unwrap();
    assert_eq!(r.code, resp::REQUEST_CODE_NOT_SUPPORTED);
    instance.shutdown();
    server.shutdown().await;
}

/// A name server stand-in that answers every route lookup with `broker-a` known only by its
/// replica (brokerId 1: no master, as during a failover), counting the lookups.
async fn masterless_namesrv(lookups: Arc<std::sync::atomic::AtomicUsize>) -> Server {
    use shoal_proto::body::{BrokerData, QueueData, TopicRouteData};
    Server::bind(
        "127.0.0.1:0",
        Arc::new(shoal_net::processor_fn(move |_ctx, req| {
            let lookups = lookups.clone();
            async move {
                assert_eq!(req.code, rc::GET_ROUTEINFO_BY_TOPIC);
                lookups.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let route = TopicRouteData {
                    queue_datas: vec![QueueData {
                        broker_name: "broker-a".into(),
                        perm: 6,
                        read_queue_nums: 4,
                        write_queue_nums: 4,
                        ..Default::default()
                    }],
                    broker_datas: vec![BrokerData {
                        broker_name: "broker-a".into(),
                        cluster: "c".into(),
                        broker_addrs: [(1, "127.0.0.1:1".to_string())].into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                };
                Ok(Some(
                    RemotingCommand::response(resp::SUCCESS, None)
                        .with_json_body(&route)
                        .unwrap(),
                ))
            }
        })),
    )
    .await
    .unwrap()
}

/// Sends that find no writable master all look the route up again; those that do so while a
/// lookup is under way share it: one name-server round trip for twenty, then one more for a
/// lookup after it ended.
#[tokio::test]
async fn concurrent_route_lookups_of_a_topic_share_one_round_trip() {
    let lookups = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let server = masterless_namesrv(lookups.clone()).await;
    let instance =
        ClientInstance::start(ClientConfig::new(&server.local_addr().to_string())).unwrap();
    // join_all polls each lookup once before any answer can arrive: the first leads, the
    // other nineteen find it under way.
    let all = futures::future::join_all((0..20).map(|_| instance.update_route_shared("T"))).await;
    assert_eq!(lookups.load(std::sync::atomic::Ordering::SeqCst), 1);
    for r in all {
        let route = r.unwrap();
        assert_eq!(
            route.broker_datas[0]
                .broker_addrs
                .keys()
                .collect::<Vec<_>>(),
            [&1]
        );
        assert!(
            route.publish_queues("T").is_empty(),
            "no master: nothing writable"
        );
    }
    assert_eq!(instance.inner.route_lookups.len(), 0);
    instance.update_route_shared("T").await.unwrap();
    assert_eq!(lookups.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// A lookup whose caller gives up (its future dropped) ends: calls waiting for it return the
/// cached route, or NoRoute when there is none, and never hang.
#[tokio::test]
async fn a_dropped_route_lookup_releases_the_calls_waiting_for_it() {
    let (_tx, rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    // A name server that never answers.
    let server = Server::bind(
        "127.0.0.1:0",
        Arc::new(shoal_net::processor_fn(move |_ctx, _req| {
            let rx = rx.clone();
            async move {
                let _ = rx.lock().await.recv().await;
                Ok(None)
            }
        })),
    )
    .await
    .unwrap();
    let instance =
        ClientInstance::start(ClientConfig::new(&server.local_addr().to_string())).unwrap();
    let mut lead = Box::pin(instance.update_route_shared("T"));
    assert!(futures::poll!(&mut lead).is_pending());
    let mut waiting = Box::pin(instance.update_route_shared("T"));
    assert!(futures::poll!(&mut waiting).is_pending());
    drop(lead);
    let r = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("released when the lookup it waited for was dropped");
    assert!(matches!(r, Err(ClientError::NoRoute(t)) if t == "T"));
}
