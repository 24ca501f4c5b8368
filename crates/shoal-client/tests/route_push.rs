//! Route changes pushed by the name server reach producers and classic groups without the
//! periodic route poll (set to 60 s here, so it cannot explain anything): a topic added on a
//! second broker is used by the producer and split by two consumers over the same queue list
//! (AVG over different lists would leave queues without an owner). Without pushes, a
//! broker's NOTIFY_CONSUMER_IDS_CHANGED about a topic's queues makes each member refresh the
//! route before it allocates.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::{wait_until, Cluster};
use parking_lot::Mutex;
use shoal_client::admin::TopicSpec;
use shoal_client::consumer::{ConsumeConcurrentlyStatus, MessageListener};
use shoal_client::{GroupProtocol, Message, MessageQueue, Producer, PushConsumer};
use shoal_group::{strategy_by_name, AllocationInput};
use shoal_namesrv::NamesrvConfig;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bodies seen, by body.
type Seen = Arc<Mutex<BTreeMap<String, u32>>>;

/// Far beyond a round trip, far below the 60 s poll.
const LIMIT: Duration = Duration::from_secs(10);

fn no_poll(cluster: &Cluster) -> shoal_client::ClientConfig {
    shoal_client::ClientConfig {
        poll_namesrv_interval: Duration::from_secs(60),
        ..cluster.client_config()
    }
}

async fn consumer(cluster: &Cluster, group: &str, topic: &str, seen: &Seen) -> PushConsumer {
    let mut c = cluster.consumer_config(group);
    c.client = no_poll(cluster);
    c.subscriptions.insert(topic.into(), "*".into());
    c.rebalance_interval = Duration::from_secs(60);
    c.protocol = GroupProtocol::Classic;
    let seen = seen.clone();
    PushConsumer::start(
        c,
        MessageListener::concurrently(move |msgs, _| {
            let mut s = seen.lock();
            for m in msgs {
                *s.entry(String::from_utf8_lossy(&m.body).into_owned())
                    .or_insert(0) += 1;
            }
            ConsumeConcurrentlyStatus::ConsumeSuccess
        }),
    )
    .await
    .unwrap()
}

fn queues(topic: &str, layout: &[(&str, i32)]) -> Vec<MessageQueue> {
    layout
        .iter()
        .flat_map(|(b, n)| (0..*n).map(move |q| MessageQueue::new(topic, *b, q)))
        .collect()
}

/// Every member owns exactly what AVG gives it over `all`: each queue has one owner.
fn converged(group: &str, all: &[MessageQueue], consumers: &[PushConsumer]) -> bool {
    let ids: Vec<String> = consumers.iter().map(|c| c.client_id().to_owned()).collect();
    let input = AllocationInput::new(group, all.to_vec(), ids);
    let avg = strategy_by_name("AVG").unwrap();
    let topic = all.first().map(|q| q.topic.clone()).unwrap_or_default();
    consumers.iter().all(|c| {
        let want: BTreeSet<MessageQueue> = avg
            .allocate(&input, c.client_id())
            .unwrap()
            .into_iter()
            .collect();
        let owned: BTreeSet<MessageQueue> = c
            .owned_queues()
            .into_iter()
            .filter(|q| q.topic == topic)
            .collect();
        owned == want
    })
}

async fn send(producer: &Producer, topic: &str, prefix: &str, n: usize) -> Vec<String> {
    let mut bodies = Vec::new();
    for i in 0..n {
        let body = format!("{prefix}-{i}");
        producer
            .send(Message::new(topic, body.clone()))
            .await
            .unwrap();
        bodies.push(body);
    }
    bodies
}

async fn all_consumed(seen: &Seen, expected: &[String]) {
    let ok = wait_until(Duration::from_secs(20), || {
        let s = seen.lock();
        expected.iter().all(|b| s.contains_key(b))
    })
    .await;
    let missing: Vec<String> = {
        let s = seen.lock();
        expected
            .iter()
            .filter(|b| !s.contains_key(*b))
            .cloned()
            .collect()
    };
    assert!(ok, "never consumed: {missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_added_on_a_second_broker_is_used_without_a_route_poll() {
    let cluster = Cluster::start_with(2, |_| {}).await;
    let admin = cluster.admin();
    let (topic, group) = ("Spread", "CG-Spread");
    admin
        .create_topic_on(&TopicSpec::new(topic, 4), &["broker-a".into()])
        .await
        .unwrap();
    let deadline = Instant::now() + LIMIT;
    while admin.topic_route(topic).await.is_err() {
        assert!(Instant::now() < deadline, "topic never routed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let producer = Producer::builder("PG-Spread")
        .client_config(no_poll(&cluster))
        .start()
        .await
        .unwrap();
    let seen: Seen = Arc::default();
    let consumers = vec![
        consumer(&cluster, group, topic, &seen).await,
        consumer(&cluster, group, topic, &seen).await,
    ];
    let on_a = queues(topic, &[("broker-a", 4)]);
    assert!(
        wait_until(LIMIT, || converged(group, &on_a, &consumers)).await,
        "two members never split broker-a's 4 queues"
    );
    let mut expected = send(&producer, topic, "a", 20).await;
    all_consumed(&seen, &expected).await;

    // The topic is created on broker-b: its registration changes the route, the name server
    // tells the watchers.
    let grown = Instant::now();
    admin
        .create_topic_on(&TopicSpec::new(topic, 4), &["broker-b".into()])
        .await
        .unwrap();
    let p = producer.clone();
    let producer_sees = wait_until(LIMIT, || {
        p.instance()
            .cached_publish_queues(topic)
            .is_some_and(|q| q.iter().any(|q| q.broker_name == "broker-b"))
    })
    .await;
    let producer_took = grown.elapsed();
    assert!(producer_sees, "the producer never saw broker-b's queues");
    let both = queues(topic, &[("broker-a", 4), ("broker-b", 4)]);
    assert!(
        wait_until(LIMIT, || converged(group, &both, &consumers)).await,
        "the group never split 8 queues over 2 brokers: {:?}",
        consumers
            .iter()
            .map(|c| c.owned_queues())
            .collect::<Vec<_>>()
    );
    let group_took = grown.elapsed();
    println!(
        "topic added on broker-b: the producer used it after {producer_took:?}, the group \
         owned its queues after {group_took:?} (route poll 60 s, rebalance timer 60 s)"
    );
    // Sends spread over both brokers; everything is consumed, broker-b's queues included.
    expected.extend(send(&producer, topic, "b", 40).await);
    all_consumed(&seen, &expected).await;
    let progress = admin.group_progress(group).await.unwrap();
    let consumed_on_b: i64 = progress
        .queues
        .iter()
        .filter(|q| q.mq.topic == topic && q.mq.broker_name == "broker-b")
        .map(|q| q.broker_offset)
        .sum();
    assert!(consumed_on_b > 0, "no message went to broker-b");

    for c in consumers {
        c.shutdown().await;
    }
    producer.shutdown().await;
    admin.shutdown();
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pushed_routes_a_queue_notice_refreshes_the_route_before_allocating() {
    // max_route_watches 0: the name server pushes nothing.
    let cluster = Cluster::start_configured(
        1,
        NamesrvConfig {
            max_route_watches: 0,
            ..NamesrvConfig::default()
        },
        |_| {},
    )
    .await;
    let (topic, group) = ("Grow", "CG-Grow");
    cluster.create_topic(topic, 4).await;
    let producer = Producer::builder("PG-Grow")
        .client_config(no_poll(&cluster))
        .start()
        .await
        .unwrap();
    let seen: Seen = Arc::default();
    let consumers = vec![
        consumer(&cluster, group, topic, &seen).await,
        consumer(&cluster, group, topic, &seen).await,
    ];
    assert!(
        wait_until(LIMIT, || converged(
            group,
            &queues(topic, &[("broker-a", 4)]),
            &consumers
        ))
        .await
    );
    let mut expected = send(&producer, topic, "four", 20).await;
    // The topic grows on its broker: the broker tells the group (a queue change: no member
    // list), each member fetches the route, then allocates.
    let grown = Instant::now();
    cluster
        .admin()
        .create_topic(&TopicSpec::new(topic, 8), None)
        .await
        .unwrap();
    let eight = queues(topic, &[("broker-a", 8)]);
    assert!(
        wait_until(LIMIT, || converged(group, &eight, &consumers)).await,
        "the group never split 8 queues: {:?}",
        consumers
            .iter()
            .map(|c| c.owned_queues())
            .collect::<Vec<_>>()
    );
    println!(
        "without pushed routes: 4 -> 8 queues owned by the group after {:?} (the broker's notice)",
        grown.elapsed()
    );
    // The producer has no notice of its own: it still sends to 4 queues until its poll.
    assert_eq!(
        producer
            .instance()
            .cached_publish_queues(topic)
            .map(|q| q.len()),
        Some(4)
    );
    expected.extend(send(&producer, topic, "eight", 20).await);
    all_consumed(&seen, &expected).await;
    for c in consumers {
        c.shutdown().await;
    }
    producer.shutdown().await;
    cluster.stop().await;
}
