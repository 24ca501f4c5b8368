//! The POP consumer: two consumers share a topic's queues with no rebalance (every message
//! once), a slow listener keeps its message by renewing the lease, a failed message comes back
//! with its attempt count, and the simple API's receipts are checked by the broker.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::{wait_until, Cluster};
use shoal_client::pop::{PopConsumeResult, PopConsumer, PopConsumerConfig};
use shoal_client::{Message, Producer};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Deliveries by body: (consumer, attempt).
type Seen = Arc<Mutex<BTreeMap<String, Vec<(usize, u32)>>>>;

fn config(cluster: &Cluster, group: &str, topic: &str) -> PopConsumerConfig {
    let mut c = PopConsumerConfig::new(group, topic);
    c.client = cluster.client_config();
    c.from_first = true;
    c.poll = Duration::from_millis(500);
    c
}

async fn send(cluster: &Cluster, topic: &str, n: usize) {
    let producer = Producer::builder("PG")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    for i in 0..n {
        producer
            .send(Message::new(topic, format!("m{i}")))
            .await
            .unwrap();
    }
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_queues_slow_listener_and_retry() {
    let cluster = Cluster::start().await;
    cluster.create_topic("PT", 2).await;
    send(&cluster, "PT", 20).await;

    let seen: Seen = Arc::default();
    let mut consumers = Vec::new();
    for who in 0..2 {
        let seen = seen.clone();
        let mut c = config(&cluster, "CG-POP", "PT");
        // Short leases: the slow message (3 s) outlives two of them.
        c.invisible = Duration::from_secs(1);
        c.retry_delay = Duration::from_secs(1);
        consumers.push(
            PopConsumer::start(c, move |m| {
                let body = String::from_utf8_lossy(&m.message.body).into_owned();
                seen.lock()
                    .unwrap()
                    .entry(body.clone())
                    .or_default()
                    .push((who, m.attempt));
                match body.as_str() {
                    "m3" => std::thread::sleep(Duration::from_secs(3)),
                    "m7" if m.attempt == 1 => return PopConsumeResult::Later,
                    _ => {}
                }
                PopConsumeResult::Success
            })
            .await
            .unwrap(),
        );
    }
    let acked = || {
        consumers
            .iter()
            .map(|c| c.stats().acked.load(std::sync::atomic::Ordering::Relaxed))
            .sum::<u64>()
    };
    assert!(
        wait_until(Duration::from_secs(20), || acked() == 20).await,
        "acked {} of 20: {:?}",
        acked(),
        seen.lock().unwrap()
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 20);
    for (body, deliveries) in &seen {
        match body.as_str() {
            // Failed once: delivered again, second attempt.
            "m7" => assert_eq!(
                deliveries.iter().map(|d| d.1).collect::<Vec<_>>(),
                [1, 2],
                "{body}"
            ),
            // The slow one was renewed, not handed to anyone else.
            _ => assert_eq!(deliveries.len(), 1, "{body}: {deliveries:?}"),
        }
    }
    // Both consumers got messages: the broker shares the queues.
    assert!(seen.values().any(|d| d[0].0 == 0) && seen.values().any(|d| d[0].0 == 1));
    assert!(
        consumers
            .iter()
            .map(|c| c.stats().renewed.load(std::sync::atomic::Ordering::Relaxed))
            .sum::<u64>()
            >= 1
    );
    for c in &consumers {
        c.shutdown().await;
    }
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_api_receipts() {
    let cluster = Cluster::start().await;
    cluster.create_topic("ST", 1).await;
    send(&cluster, "ST", 2).await;
    let mut cfg = config(&cluster, "CG-SIMPLE", "ST");
    cfg.invisible = Duration::from_secs(30);
    let c = PopConsumer::new(cfg).unwrap();
    let (name, addr) = c.brokers().await.unwrap().remove(0);
    let mut got = c.receive(&name, &addr, 2).await.unwrap();
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|m| m.attempt == 1));
    // Nothing more while both are leased.
    assert!(c.receive(&name, &addr, 2).await.unwrap().is_empty());
    let old = got[0].clone();
    c.change_invisible(&mut got[0], Duration::from_secs(60))
        .await
        .unwrap();
    // The old receipt is void; the new one acks, once.
    assert!(c.ack(&old).await.is_err());
    c.ack(&got[0]).await.unwrap();
    assert!(c.ack(&got[0]).await.is_err());
    c.ack(&got[1]).await.unwrap();
    c.shutdown().await;
    cluster.stop().await;
}
