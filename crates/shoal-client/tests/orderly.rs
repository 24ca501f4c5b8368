//! Orderly consumption: messages of one sharding key go to one queue and are consumed in send
//! order, also while the group changes (a second consumer joins, then the first leaves): the
//! broker lock is taken before a queue is consumed and released at once after the final commit.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::{wait_until, Cluster};
use parking_lot::Mutex;
use shoal_client::consumer::{ConsumeOrderlyStatus, MessageListener};
use shoal_client::{Message, Producer, PushConsumer};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Log = Arc<Mutex<BTreeMap<String, Vec<(u32, String)>>>>;

async fn start(cluster: &Cluster, log: &Log, instance: &str) -> PushConsumer {
    let mut c = cluster.consumer_config("CG-ORD");
    c.subscriptions.insert("ORD".into(), "*".into());
    c.client.instance_name = Some(instance.into());
    c.lock_interval = Duration::from_secs(1);
    c.suspend_current_queue_time = Duration::from_millis(50);
    c.rebalance_interval = Duration::from_secs(60);
    let log = log.clone();
    let who = instance.to_string();
    PushConsumer::start(
        c,
        MessageListener::orderly(move |msgs, _| {
            let mut l = log.lock();
            for m in msgs {
                let key = m.keys().unwrap_or_default().to_string();
                let seq: u32 = std::str::from_utf8(&m.body)
                    .ok()
                    .and_then(|b| b.parse().ok())
                    .unwrap_or(u32::MAX);
                l.entry(key).or_default().push((seq, who.clone()));
            }
            ConsumeOrderlyStatus::Success
        }),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_is_preserved_across_rebalance() {
    let cluster = Cluster::start().await;
    cluster.create_topic("ORD", 8).await;
    let producer = Producer::builder("PG")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    let log: Log = Arc::default();
    let keys: Vec<String> = (0..12).map(|k| format!("order-{k}")).collect();
    let per_key = 30u32;
    let c1 = start(&cluster, &log, "o1").await;
    let p = producer.clone();
    let ks = keys.clone();
    let sender = tokio::spawn(async move {
        for seq in 0..per_key {
            for k in &ks {
                let mut m = Message::new("ORD", seq.to_string());
                m.set_keys([k.as_str()]).unwrap();
                p.send_ordered(m, k).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let joined = Instant::now();
    let c2 = start(&cluster, &log, "o2").await;
    assert!(
        wait_until(Duration::from_secs(15), || c1
            .owned_queues()
            .iter()
            .filter(|q| q.topic == "ORD")
            .count()
            == 4
            && c2
                .owned_queues()
                .iter()
                .filter(|q| q.topic == "ORD")
                .count()
                == 4)
        .await,
        "o1 {:?} o2 {:?}",
        c1.owned_queues(),
        c2.owned_queues()
    );
    println!("orderly join converged after {:?}", joined.elapsed());
    tokio::time::sleep(Duration::from_millis(150)).await;
    let left = Instant::now();
    c1.shutdown().await;
    assert!(
        wait_until(Duration::from_secs(15), || c2
            .owned_queues()
            .iter()
            .filter(|q| q.topic == "ORD")
            .count()
            == 8)
        .await
    );
    println!("orderly leave converged after {:?}", left.elapsed());
    sender.await.unwrap();
    let total = per_key as usize * keys.len();
    assert!(
        wait_until(Duration::from_secs(20), || log
            .lock()
            .values()
            .map(Vec::len)
            .sum::<usize>()
            >= total)
        .await,
        "consumed {} of {total}",
        log.lock().values().map(Vec::len).sum::<usize>()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = log.lock().clone();
    let dups = AtomicU32::new(0);
    let mut switched = 0;
    for k in &keys {
        let seqs = &log[k];
        // In order, each exactly once.
        let only: Vec<u32> = seqs.iter().map(|(s, _)| *s).collect();
        assert_eq!(only, (0..per_key).collect::<Vec<_>>(), "key {k}: {seqs:?}");
        if seqs.windows(2).any(|w| w[0].1 != w[1].1) {
            switched += 1;
        }
        dups.fetch_add(
            (seqs.len() as u32).saturating_sub(per_key),
            Ordering::Relaxed,
        );
    }
    println!(
        "{} keys, {} messages in order, {} keys changed consumer mid-stream, {} duplicates",
        keys.len(),
        total,
        switched,
        dups.load(Ordering::Relaxed)
    );
    assert!(switched > 0, "the test must move keys between consumers");
    c2.shutdown().await;
    producer.shutdown().await;
    cluster.stop().await;
}

/// Hand-over by evidence: a queue whose broker lock another client holds is not consumed,
/// however long that lasts (an official client's lock, renewed); the moment the holder
/// unlocks, the broker tells the waiting member (lock-freed notice) and it starts, from the
/// committed offset. (A Shoal member's own locks last its session: the simulator and the
/// frozen-member scenario show what happens when a session ends.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_locked_by_another_client_waits_for_its_unlock() {
    use shoal_client::{ClientConfig, ClientInstance, MessageQueue};
    use std::sync::atomic::AtomicBool;
    let cluster = Cluster::start_with(1, |c| c.lock_ttl_ms = 300).await;
    cluster.create_topic("LOCK", 1).await;
    let producer = Producer::builder("PG")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    let mq = MessageQueue::new("LOCK", "broker-a", 0);
    // The other client takes the lock first and keeps it alive (the broker TTL is 300 ms).
    let thief = ClientInstance::start(ClientConfig {
        instance_name: Some("thief".into()),
        ..cluster.client_config()
    })
    .unwrap();
    thief.update_route("LOCK").await.unwrap();
    let locked = thief
        .lock_batch("CG-LOCK", "broker-a", "LOCK", vec![mq.clone()])
        .await
        .unwrap();
    assert_eq!(locked, vec![mq.clone()]);
    let stop = Arc::new(AtomicBool::new(false));
    let (t2, mq2, stop2) = (thief.clone(), mq.clone(), stop.clone());
    let renewer = tokio::spawn(async move {
        while !stop2.load(Ordering::SeqCst) {
            let _ = t2
                .lock_batch("CG-LOCK", "broker-a", "LOCK", vec![mq2.clone()])
                .await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    producer
        .send_to_queue(Message::new("LOCK", "while-locked"), &mq)
        .await
        .unwrap();
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let g = got.clone();
    let mut c = cluster.consumer_config("CG-LOCK");
    c.subscriptions.insert("LOCK".into(), "*".into());
    c.consume_from_where = shoal_client::ConsumeFromWhere::ConsumeFromFirstOffset;
    c.rebalance_interval = Duration::from_secs(60);
    let consumer = PushConsumer::start(
        c,
        MessageListener::orderly(move |msgs, _| {
            g.lock().extend(
                msgs.iter()
                    .map(|m| String::from_utf8_lossy(&m.body).into_owned()),
            );
            ConsumeOrderlyStatus::Success
        }),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(got.lock().is_empty(), "consumed without the lock");
    assert!(!consumer.owned_queues().contains(&mq));
    // The holder gives it back: the waiting member is told and starts at once.
    stop.store(true, Ordering::SeqCst);
    renewer.await.unwrap();
    thief
        .unlock_batch("CG-LOCK", "broker-a", "LOCK", vec![mq.clone()])
        .await
        .unwrap();
    let released = Instant::now();
    assert!(wait_until(Duration::from_secs(10), || got.lock().len() == 1).await);
    println!(
        "consumption started {:?} after the lock was released",
        released.elapsed()
    );
    assert_eq!(got.lock().clone(), vec!["while-locked"]);
    thief.shutdown();
    consumer.shutdown().await;
    producer.shutdown().await;
    cluster.stop().await;
}

/// An orderly listener that keeps suspending: with an explicit `max_reconsume_times` the
/// message goes to the DLQ after that many local retries and the queue moves on in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orderly_gives_up_after_max_reconsume_times_and_moves_on() {
    let cluster = Cluster::start().await;
    cluster.create_topic("ORDQ", 1).await;
    let producer = Producer::builder("PG")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    let seen: Arc<Mutex<Vec<(String, i32)>>> = Arc::default();
    let s = seen.clone();
    let mut c = cluster.consumer_config("CG-ORDQ");
    c.subscriptions.insert("ORDQ".into(), "*".into());
    c.max_reconsume_times = Some(2);
    c.suspend_current_queue_time = Duration::from_millis(20);
    let consumer = PushConsumer::start(
        c,
        MessageListener::orderly(move |msgs, _| {
            let mut s = s.lock();
            let mut status = ConsumeOrderlyStatus::Success;
            for m in msgs {
                let body = String::from_utf8_lossy(&m.body).into_owned();
                if body == "poison" {
                    status = ConsumeOrderlyStatus::SuspendCurrentQueueAMoment;
                }
                s.push((body, m.reconsume_times));
            }
            status
        }),
    )
    .await
    .unwrap();
    for b in ["first", "poison", "last"] {
        producer.send(Message::new("ORDQ", b)).await.unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(15), || seen
            .lock()
            .iter()
            .any(|(b, _)| b == "last"))
        .await
    );
    let log = seen.lock().clone();
    assert_eq!(
        log,
        vec![
            ("first".to_string(), 0),
            ("poison".to_string(), 0),
            ("poison".to_string(), 1),
            ("poison".to_string(), 2),
            ("last".to_string(), 0),
        ]
    );
    let admin = cluster.admin();
    let mut dlq = Vec::new();
    for _ in 0..100 {
        dlq = admin.dlq_messages("CG-ORDQ", 10).await.unwrap_or_default();
        if !dlq.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].body.as_ref(), b"poison");
    admin.shutdown();
    consumer.shutdown().await;
    producer.shutdown().await;
    cluster.stop().await;
}
