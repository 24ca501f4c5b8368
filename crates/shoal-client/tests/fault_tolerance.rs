//! Latency fault tolerance against a broker made slow: broker-b is reached through a proxy
//! that delays every answer by 600 ms (it registers the proxy's address with the name
//! server). RocketMQ's table makes a broker with a 550..1800 ms send latency unavailable for
//! 2 s, so with fault tolerance on the producer sends almost everything to broker-a; with it
//! off, round-robin keeps hitting the slow broker.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::{broker_config, Cluster};
use shoal_broker::Broker;
use shoal_client::{Message, Producer};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const DELAY: Duration = Duration::from_millis(600);

/// Forwards connections from `listener` to `target`; answers are held back by `DELAY`.
fn spawn_slow_proxy(listener: TcpListener, target: String) {
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&target).await else {
                    return;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                });
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match sr.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    tokio::time::sleep(DELAY).await;
                    if cw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
}

async fn run(cluster: &Cluster, fault: bool, sends: usize) -> (BTreeMap<String, usize>, Duration) {
    let producer = Producer::builder(format!("PG-{fault}"))
        .client_config(cluster.client_config())
        .latency_fault(fault)
        .send_timeout(Duration::from_secs(5))
        .start()
        .await
        .unwrap();
    let mut per_broker: BTreeMap<String, usize> = BTreeMap::new();
    let started = Instant::now();
    for i in 0..sends {
        let r = producer
            .send(Message::new("FT", format!("m{i}")))
            .await
            .unwrap();
        *per_broker.entry(r.message_queue.broker_name).or_default() += 1;
    }
    let took = started.elapsed();
    println!(
        "fault tolerance {}: {sends} sends took {took:?}, per broker {per_broker:?}, \
         last broker-b latency {:?} ms, broker-b available now: {}",
        if fault { "on" } else { "off" },
        producer.broker_latency("broker-b"),
        producer.broker_available("broker-b"),
    );
    producer.shutdown().await;
    (per_broker, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_broker_is_avoided_with_fault_tolerance() {
    let mut cluster = Cluster::start().await;
    // broker-b behind the slow proxy.
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_addr = proxy.local_addr().unwrap().to_string();
    let mut cfg = broker_config(cluster.dir.path(), &cluster.namesrv_addr, "broker-b");
    cfg.announce_addr = Some(proxy_addr);
    let b = Broker::start(cfg).await.unwrap();
    spawn_slow_proxy(proxy, b.local_addr().to_string());
    cluster.brokers.push(b);
    cluster.create_topic("FT", 2).await;

    let sends = 12;
    let (on, took_on) = run(&cluster, true, sends).await;
    let (off, took_off) = run(&cluster, false, sends).await;
    let b_on = on.get("broker-b").copied().unwrap_or(0);
    let b_off = off.get("broker-b").copied().unwrap_or(0);
    assert!(
        b_on <= 2,
        "fault tolerance on: broker-b got {b_on} of {sends}"
    );
    assert!(
        b_off >= sends / 2 - 1,
        "fault tolerance off: round-robin should hit broker-b, got {b_off}"
    );
    assert!(b_on < b_off);
    println!("total send time: on {took_on:?}, off {took_off:?}");
    cluster.stop().await;
}

/// A broker that went away while the producer's route still names it: the send to it fails,
/// the broker is isolated, and the retry goes to the other broker; later sends avoid it while
/// isolated. (The name server runs without pushed routes, as an Apache RocketMQ name server:
/// a Shoal one would tell the producer at once that broker-b left, and nothing would fail.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_send_is_retried_on_another_broker() {
    let mut cluster = Cluster::start_configured(
        2,
        shoal_namesrv::NamesrvConfig {
            max_route_watches: 0,
            ..shoal_namesrv::NamesrvConfig::default()
        },
        |_| {},
    )
    .await;
    cluster.create_topic("FT2", 2).await;
    let producer = Producer::builder("PG-retry")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    // Learn the route while both brokers are up, then stop broker-b.
    producer.publish_queues("FT2").await.unwrap();
    if let Some(b) = cluster.brokers.pop() {
        b.shutdown().await;
    }
    let mut per_broker: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..8 {
        let r = producer
            .send(Message::new("FT2", format!("m{i}")))
            .await
            .unwrap();
        *per_broker.entry(r.message_queue.broker_name).or_default() += 1;
    }
    println!(
        "with broker-b down: per broker {per_broker:?}, broker-b available: {}",
        producer.broker_available("broker-b")
    );
    assert_eq!(per_broker.get("broker-a"), Some(&8));
    assert!(
        !producer.broker_available("broker-b"),
        "isolated after the failure"
    );
    producer.shutdown().await;
    cluster.stop().await;
}
