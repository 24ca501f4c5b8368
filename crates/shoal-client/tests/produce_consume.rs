//! Producer and push consumer against an in-process Shoal name server and broker: tags, keys,
//! user properties, delay, batch, async and oneway sends, retry up to the DLQ, broadcasting.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::{wait_until, Cluster};
use parking_lot::Mutex;
use shoal_client::consumer::{ConsumeConcurrentlyStatus, MessageListener};
use shoal_client::{
    ClientConfig, Message, MessageExt, MessageModel, Producer, PushConsumer, SendStatus,
};
use shoal_proto::SerializeType;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

fn recorder() -> (Arc<Mutex<Vec<MessageExt>>>, MessageListener) {
    let got: Arc<Mutex<Vec<MessageExt>>> = Arc::default();
    let g = got.clone();
    let listener = MessageListener::concurrently(move |msgs, _ctx| {
        g.lock().extend(msgs.iter().cloned());
        ConsumeConcurrentlyStatus::ConsumeSuccess
    });
    (got, listener)
}

/// Every request as JSON, sends included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_tags_keys_delay_batch_async_oneway() {
    round_trip(SerializeType::Json, false).await;
}

/// The default: JSON, but sends go binary once the broker is known to be Shoal's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_with_binary_sends_to_shoal() {
    round_trip(SerializeType::Json, true).await;
}

/// The same round trip with every request header of producer and consumer in RocketMQ's
/// binary encoding (`rocketmq.serialize.type=ROCKETMQ`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_with_binary_headers() {
    round_trip(SerializeType::RocketMq, false).await;
}

async fn round_trip(serialize_type: SerializeType, binary_sends_to_shoal: bool) {
    let cluster = Cluster::start().await;
    cluster.create_topic("RT", 4).await;
    let producer = Producer::builder("PG")
        .client_config(ClientConfig {
            serialize_type,
            binary_sends_to_shoal,
            ..cluster.client_config()
        })
        .start()
        .await
        .unwrap();

    // Start the consumer first; it subscribes tagA || tagC only.
    let (got, listener) = recorder();
    let consumer = PushConsumer::start(
        {
            let mut c = cluster.consumer_config("CG-RT");
            c.client.serialize_type = serialize_type;
            c.client.binary_sends_to_shoal = binary_sends_to_shoal;
            c.subscriptions.insert("RT".into(), "tagA || tagC".into());
            c
        },
        listener,
    )
    .await
    .unwrap();

    let mut expected = BTreeMap::new();
    for i in 0..10 {
        let tag = if i % 2 == 0 { "tagA" } else { "tagB" };
        let mut m = Message::new("RT", format!("body-{i}"));
        m.set_tags(tag).unwrap();
        m.set_keys([format!("key-{i}"), "common".to_string()])
            .unwrap();
        m.put_property("user-prop", format!("v{i}")).unwrap();
        let r = producer.send(m).await.unwrap();
        assert_eq!(r.status, SendStatus::SendOk);
        assert_eq!(r.message_queue.topic, "RT");
        if tag == "tagA" {
            expected.insert(format!("body-{i}"), r.msg_id.clone());
        }
    }
    // Delay level 1 (20 ms in the test broker).
    let mut m = Message::new("RT", "delayed");
    m.set_tags("tagC").unwrap();
    m.set_delay_level(1).unwrap();
    let sent_at = Instant::now();
    let r = producer.send(m).await.unwrap();
    expected.insert("delayed".into(), r.msg_id);
    // A batch of 5 and an async send, and a oneway send.
    let batch: Vec<Message> = (0..5)
        .map(|i| {
            let mut m = Message::new("RT", format!("batch-{i}"));
            m.set_tags("tagA").unwrap();
            m
        })
        .collect();
    let r = producer.send_batch(batch).await.unwrap();
    let ids: Vec<&str> = r.msg_id.split(',').collect();
    assert_eq!(ids.len(), 5);
    for (i, id) in ids.iter().enumerate() {
        expected.insert(format!("batch-{i}"), id.to_string());
    }
    let mut m = Message::new("RT", "async");
    m.set_tags("tagA").unwrap();
    let fut = producer.send_async(m);
    let r = fut.await.unwrap();
    expected.insert("async".into(), r.msg_id);
    let mut m = Message::new("RT", "oneway");
    m.set_tags("tagA").unwrap();
    producer.send_oneway(m).await.unwrap();

    let n = expected.len() + 1;
    assert!(
        wait_until(T, || got.lock().len() >= n).await,
        "got {} of {n}",
        got.lock().len()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = got.lock().clone();
    assert_eq!(got.len(), n, "no duplicates and no tagB");
    let by_body: BTreeMap<String, &MessageExt> = got
        .iter()
        .map(|m| (String::from_utf8_lossy(&m.body).into_owned(), m))
        .collect();
    for (body, id) in &expected {
        let m = by_body
            .get(body)
            .unwrap_or_else(|| panic!("{body} missing"));
        assert_eq!(m.msg_id(), id.as_str(), "UNIQ_KEY is the message id");
        assert_eq!(m.topic, "RT");
    }
    assert!(by_body.contains_key("oneway"));
    let m0 = by_body["body-0"];
    assert_eq!(m0.tags(), Some("tagA"));
    assert_eq!(m0.key_list().collect::<Vec<_>>(), vec!["key-0", "common"]);
    assert_eq!(m0.property("user-prop"), Some("v0"));
    assert!(by_body.values().all(|m| m.tags() != Some("tagB")));
    println!(
        "delayed message consumed within {:?} of its send",
        sent_at.elapsed()
    );

    consumer.shutdown().await;
    producer.shutdown().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_are_compressed_and_restored() {
    let cluster = Cluster::start().await;
    cluster.create_topic("BIG", 2).await;
    let producer = Producer::builder("PG")
        .client_config(cluster.client_config())
        .compress_over(1024)
        .start()
        .await
        .unwrap();
    let body: Vec<u8> = (0..20_000u32).map(|i| (i % 7) as u8).collect();
    producer
        .send(Message::new("BIG", body.clone()))
        .await
        .unwrap();
    let (got, listener) = recorder();
    let consumer = PushConsumer::start(
        {
            let mut c = cluster.consumer_config("CG-BIG");
            c.subscriptions.insert("BIG".into(), "*".into());
            c
        },
        listener,
    )
    .await
    .unwrap();
    assert!(wait_until(T, || !got.lock().is_empty()).await);
    assert_eq!(got.lock()[0].body.as_ref(), body.as_slice());
    // Too large: refused before sending.
    let err = producer
        .send(Message::new("BIG", vec![0u8; 5 * 1024 * 1024]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("limit"), "{err}");
    consumer.shutdown().await;
    producer.shutdown().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconsume_later_retries_then_dead_letters_and_resend() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let cluster = Cluster::start().await;
    cluster.create_topic("RETRY-T", 2).await;
    let producer = Producer::builder("PG")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    let got: Arc<Mutex<Vec<MessageExt>>> = Arc::default();
    let failing = Arc::new(AtomicBool::new(true));
    let (g, f) = (got.clone(), failing.clone());
    let consumer = PushConsumer::start(
        {
            let mut c = cluster.consumer_config("CG-RETRY");
            c.subscriptions.insert("RETRY-T".into(), "*".into());
            c.max_reconsume_times = Some(2);
            c
        },
        MessageListener::concurrently(move |msgs, _| {
            g.lock().extend(msgs.iter().cloned());
            let fail = f.load(Ordering::SeqCst) && msgs.iter().any(|m| m.tags() == Some("fail"));
            if fail {
                ConsumeConcurrentlyStatus::ReconsumeLater
            } else {
                ConsumeConcurrentlyStatus::ConsumeSuccess
            }
        }),
    )
    .await
    .unwrap();
    let mut bad = Message::new("RETRY-T", "bad");
    bad.set_tags("fail").unwrap();
    let bad_id = producer.send(bad).await.unwrap().msg_id;
    let mut good = Message::new("RETRY-T", "good");
    good.set_tags("ok").unwrap();
    producer.send(good).await.unwrap();

    // Delivered once and re-delivered twice (max reconsume times 2), then dead-lettered.
    let bad_deliveries = || {
        got.lock()
            .iter()
            .filter(|m| m.body.as_ref() == b"bad")
            .map(|m| (m.topic.clone(), m.reconsume_times))
            .collect::<Vec<_>>()
    };
    assert!(
        wait_until(T, || bad_deliveries().len() >= 3).await,
        "{:?}",
        bad_deliveries()
    );
    let admin = cluster.admin();
    let mut dlq: Vec<MessageExt>;
    let found = {
        let deadline = Instant::now() + T;
        loop {
            dlq = admin.dlq_messages("CG-RETRY", 10).await.unwrap_or_default();
            if !dlq.is_empty() || Instant::now() > deadline {
                break !dlq.is_empty();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    assert!(found, "nothing in the DLQ");
    let deliveries = bad_deliveries();
    assert_eq!(
        deliveries,
        vec![
            ("RETRY-T".to_string(), 0),
            ("RETRY-T".to_string(), 1),
            ("RETRY-T".to_string(), 2)
        ],
        "real topic restored for the listener, reconsume count grows"
    );
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].body.as_ref(), b"bad");
    assert_eq!(dlq[0].msg_id(), bad_id.as_str());
    assert_eq!(
        got.lock()
            .iter()
            .filter(|m| m.body.as_ref() == b"good")
            .count(),
        1
    );
    // Send it back to its topic: consumed once more, successfully.
    failing.store(false, Ordering::SeqCst);
    let (topic, _) = admin.resend_dlq_message(&dlq[0]).await.unwrap();
    assert_eq!(topic, "RETRY-T");
    assert!(wait_until(T, || bad_deliveries().len() >= 4).await);
    println!("bad message deliveries: {:?}", bad_deliveries());
    admin.shutdown();
    consumer.shutdown().await;
    producer.shutdown().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcasting_every_consumer_gets_everything_and_offsets_survive_restart() {
    let cluster = Cluster::start().await;
    cluster.create_topic("BC", 4).await;
    let producer = Producer::builder("PG")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    let config = |instance: &str| {
        let mut c = cluster.consumer_config("CG-BC");
        c.subscriptions.insert("BC".into(), "*".into());
        c.message_model = MessageModel::Broadcasting;
        c.client.instance_name = Some(instance.into());
        c
    };
    let (got1, l1) = recorder();
    let (got2, l2) = recorder();
    let c1 = PushConsumer::start(config("b1"), l1).await.unwrap();
    let c2 = PushConsumer::start(config("b2"), l2).await.unwrap();
    for i in 0..20 {
        producer
            .send(Message::new("BC", format!("m{i}")))
            .await
            .unwrap();
    }
    assert!(wait_until(T, || got1.lock().len() >= 20 && got2.lock().len() >= 20).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(got1.lock().len(), 20);
    assert_eq!(got2.lock().len(), 20);
    assert_eq!(c1.owned_queues().len(), 4, "broadcasting takes every queue");
    c1.shutdown().await;
    for i in 20..30 {
        producer
            .send(Message::new("BC", format!("m{i}")))
            .await
            .unwrap();
    }
    // Same instance name, same client id, same local offset file: only the 10 new ones.
    let (again, l1b) = recorder();
    let c1b = PushConsumer::start(config("b1"), l1b).await.unwrap();
    assert!(wait_until(T, || again.lock().len() >= 10).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bodies: BTreeSet<String> = again
        .lock()
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    let want: BTreeSet<String> = (20..30).map(|i| format!("m{i}")).collect();
    assert_eq!(bodies, want);
    assert_eq!(again.lock().len(), 10);
    assert!(wait_until(T, || got2.lock().len() >= 30).await);
    c1b.shutdown().await;
    c2.shutdown().await;
    producer.shutdown().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_group_from_last_offset_then_reset_by_time_reconsumes() {
    let cluster = Cluster::start().await;
    cluster.create_topic("RS", 2).await;
    let producer = Producer::builder("PG")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    for i in 0..6 {
        producer
            .send(Message::new("RS", format!("old{i}")))
            .await
            .unwrap();
    }
    // A new group starting from the last offset skips what was sent before it started.
    let (got, listener) = recorder();
    let consumer = PushConsumer::start(
        {
            let mut c = cluster.consumer_config("CG-RS");
            c.subscriptions.insert("RS".into(), "*".into());
            c.consume_from_where = shoal_client::ConsumeFromWhere::ConsumeFromLastOffset;
            c
        },
        listener,
    )
    .await
    .unwrap();
    assert!(
        wait_until(T, || consumer
            .owned_queues()
            .iter()
            .filter(|q| q.topic == "RS")
            .count()
            == 2)
        .await
    );
    for i in 0..4 {
        producer
            .send(Message::new("RS", format!("new{i}")))
            .await
            .unwrap();
    }
    assert!(wait_until(T, || got.lock().len() >= 4).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bodies = |g: &[MessageExt]| -> BTreeSet<String> {
        g.iter()
            .map(|m| String::from_utf8_lossy(&m.body).into_owned())
            .collect()
    };
    assert_eq!(
        bodies(&got.lock()),
        (0..4).map(|i| format!("new{i}")).collect::<BTreeSet<_>>()
    );
    // Reset to the beginning of time: the broker tells the consumer, which drops its queues
    // and starts again from the reset offsets.
    let admin = cluster.admin();
    let plan = admin.reset_offset("CG-RS", "RS", 0, false).await.unwrap();
    assert!(plan.iter().all(|r| r.to == 0), "{plan:?}");
    assert!(
        wait_until(T, || got.lock().len() >= 14).await,
        "got {}",
        got.lock().len()
    );
    let all = bodies(&got.lock());
    assert_eq!(all.len(), 10, "old and new all consumed: {all:?}");
    admin.shutdown();
    consumer.shutdown().await;
    producer.shutdown().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_bounds_the_cache_of_a_slow_consumer() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let cluster = Cluster::start().await;
    cluster.create_topic("FC", 1).await;
    let producer = Producer::builder("PG")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    for i in 0..100 {
        producer
            .send(Message::new("FC", format!("m{i}")))
            .await
            .unwrap();
    }
    let open = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let (o, d) = (open.clone(), done.clone());
    let consumer = PushConsumer::start(
        {
            let mut c = cluster.consumer_config("CG-FC");
            c.subscriptions.insert("FC".into(), "*".into());
            c.pull_threshold_for_queue = 10;
            c.pull_batch_size = 5;
            c.consume_thread_max = 2;
            c
        },
        MessageListener::concurrently(move |msgs, _| {
            while !o.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            d.fetch_add(msgs.len(), Ordering::SeqCst);
            ConsumeConcurrentlyStatus::ConsumeSuccess
        }),
    )
    .await
    .unwrap();
    let cached_now = || -> i32 {
        consumer
            .running_info()
            .mq_table
            .iter()
            .filter(|(mq, _)| mq.topic == "FC")
            .map(|(_, pq)| pq.cached_msg_count)
            .sum()
    };
    wait_until(T, || cached_now() >= 10).await;
    // Give the pull loop time to overshoot if flow control did not hold it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cached = cached_now();
    let pulls = consumer.stats().pulls.load(Ordering::Relaxed);
    println!("slow consumer: {cached} messages cached, {pulls} pulls made");
    // Let the listeners go before asserting, so that a failure does not leave them spinning.
    open.store(true, Ordering::SeqCst);
    assert!(cached > 0 && cached < 10 + 5, "cached {cached}");
    assert!(wait_until(T, || done.load(Ordering::SeqCst) >= 100).await);
    consumer.shutdown().await;
    producer.shutdown().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_group_from_timestamp_starts_at_that_time() {
    let cluster = Cluster::start().await;
    cluster.create_topic("TS", 1).await;
    let producer = Producer::builder("PG")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    for i in 0..3 {
        producer
            .send(Message::new("TS", format!("before{i}")))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in 0..3 {
        producer
            .send(Message::new("TS", format!("after{i}")))
            .await
            .unwrap();
    }
    let (got, listener) = recorder();
    let consumer = PushConsumer::start(
        {
            let mut c = cluster.consumer_config("CG-TS");
            c.subscriptions.insert("TS".into(), "*".into());
            c.consume_from_where = shoal_client::ConsumeFromWhere::ConsumeFromTimestamp;
            c.consume_timestamp_ms = since;
            c
        },
        listener,
    )
    .await
    .unwrap();
    assert!(wait_until(T, || got.lock().len() >= 3).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut bodies: Vec<String> = got
        .lock()
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    // A concurrent listener may see the three messages in any order.
    bodies.sort();
    assert_eq!(bodies, vec!["after0", "after1", "after2"]);
    consumer.shutdown().await;
    producer.shutdown().await;
    cluster.stop().await;
}
