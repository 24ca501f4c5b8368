//! Lite pull consumer: assign + poll + seek + pause/resume + manual commit; subscribe with
//! rebalance between two consumers.

mod common;

use common::{wait_until, Cluster};
use shoal_client::lite_pull::{LitePullConfig, LitePullConsumer};
use shoal_client::{ConsumeFromWhere, Message, MessageExt, MessageQueue, Producer};
use std::collections::BTreeMap;
use std::time::Duration;

fn config(cluster: &Cluster, group: &str) -> LitePullConfig {
    let mut c = LitePullConfig::new(group);
    c.client = cluster.client_config();
    c.consume_from_where = ConsumeFromWhere::ConsumeFromFirstOffset;
    c.pull_suspend_ms = 1_000;
    c.pull_delay_on_error = Duration::from_millis(100);
    c
}

async fn poll_n(c: &LitePullConsumer, n: usize) -> Vec<MessageExt> {
    let mut out = Vec::new();
    for _ in 0..100 {
        if out.len() >= n {
            break;
        }
        out.extend(c.poll(Duration::from_millis(200)).await);
    }
    out
}

fn bodies(msgs: &[MessageExt]) -> Vec<String> {
    msgs.iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assign_poll_seek_pause_commit() {
    let cluster = Cluster::start().await;
    cluster.create_topic("LP", 2).await;
    let producer = Producer::builder("PG")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    let q0 = MessageQueue::new("LP", "broker-a", 0);
    let q1 = MessageQueue::new("LP", "broker-a", 1);
    for i in 0..10 {
        producer
            .send_to_queue(Message::new("LP", format!("a{i}")), &q0)
            .await
            .unwrap();
        producer
            .send_to_queue(Message::new("LP", format!("b{i}")), &q1)
            .await
            .unwrap();
    }
    let mut cfg = config(&cluster, "CG-LP");
    cfg.auto_commit = false;
    let c = LitePullConsumer::start(cfg).await.unwrap();
    c.assign(vec![q0.clone(), q1.clone()]).await.unwrap();
    assert_eq!(c.assignment(), vec![q0.clone(), q1.clone()]);
    let got = poll_n(&c, 20).await;
    assert_eq!(got.len(), 20);
    let a: Vec<String> = bodies(&got)
        .into_iter()
        .filter(|b| b.starts_with('a'))
        .collect();
    assert_eq!(
        a,
        (0..10).map(|i| format!("a{i}")).collect::<Vec<_>>(),
        "queue order"
    );

    // Seek back on q0: the same messages again, from offset 5.
    c.seek(&q0, 5).await.unwrap();
    let again = poll_n(&c, 5).await;
    assert_eq!(
        bodies(&again),
        (5..10).map(|i| format!("a{i}")).collect::<Vec<_>>()
    );
    assert!(c.seek(&q0, 99).await.is_err(), "outside [min, max]");

    // Pause q1: new q1 messages are held back until resume.
    c.pause(std::slice::from_ref(&q1));
    producer
        .send_to_queue(Message::new("LP", "b-late"), &q1)
        .await
        .unwrap();
    producer
        .send_to_queue(Message::new("LP", "a-late"), &q0)
        .await
        .unwrap();
    let late = poll_n(&c, 1).await;
    assert_eq!(bodies(&late), vec!["a-late"]);
    assert!(c.poll(Duration::from_millis(300)).await.is_empty());
    c.resume(std::slice::from_ref(&q1));
    let resumed = poll_n(&c, 1).await;
    assert_eq!(bodies(&resumed), vec!["b-late"]);

    // Manual commit, visible on the broker; seek to begin and end.
    assert_eq!(c.committed(&q0).await.unwrap(), None);
    c.commit_sync().await;
    assert_eq!(c.committed(&q0).await.unwrap(), Some(11));
    assert_eq!(c.committed(&q1).await.unwrap(), Some(11));
    let mut explicit = BTreeMap::new();
    explicit.insert(q1.clone(), 3);
    c.commit(&explicit).await.unwrap();
    assert_eq!(c.committed(&q1).await.unwrap(), Some(3));
    c.seek_to_begin(&q1).await.unwrap();
    let from_start = poll_n(&c, 11).await;
    assert_eq!(from_start.len(), 11);
    c.seek_to_end(&q0).await.unwrap();
    assert!(c.poll(Duration::from_millis(300)).await.is_empty());
    let off = c.offset_for_timestamp(&q0, 0).await.unwrap();
    assert_eq!(off, 0);
    c.seek_to_time(&q0, 0).await.unwrap();
    assert_eq!(poll_n(&c, 11).await.len(), 11);
    c.shutdown().await;
    producer.shutdown().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_splits_queues_and_auto_commits() {
    let cluster = Cluster::start().await;
    cluster.create_topic("LPS", 4).await;
    let producer = Producer::builder("PG")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    for i in 0..40 {
        producer
            .send(Message::new("LPS", format!("m{i}")))
            .await
            .unwrap();
    }
    let mut cfg = config(&cluster, "CG-LPS");
    cfg.auto_commit_interval = Duration::from_millis(100);
    let c1 = LitePullConsumer::start(cfg.clone()).await.unwrap();
    c1.subscribe("LPS", "*").await.unwrap();
    // Queues are locked and started by the rebalance driver soon after the subscription.
    assert!(wait_until(Duration::from_secs(10), || c1.assignment().len() == 4).await);
    let c2 = LitePullConsumer::start(cfg).await.unwrap();
    c2.subscribe("LPS", "*").await.unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || c1.assignment().len() == 2
            && c2.assignment().len() == 2)
        .await,
        "{:?} / {:?}",
        c1.assignment(),
        c2.assignment()
    );
    let mut all = poll_n(&c1, 20).await;
    all.extend(poll_n(&c2, 20).await);
    let mut b = bodies(&all);
    b.sort();
    b.dedup();
    assert_eq!(b.len(), 40, "every message, once per queue owner");
    // A poll after the interval commits what earlier polls returned.
    tokio::time::sleep(Duration::from_millis(150)).await;
    c1.poll(Duration::from_millis(10)).await;
    c2.poll(Duration::from_millis(10)).await;
    let total_committed = {
        let mut t = 0;
        for q in 0..4 {
            let mq = MessageQueue::new("LPS", "broker-a", q);
            for _ in 0..50 {
                if let Ok(Some(o)) = c1.committed(&mq).await {
                    if o > 0 {
                        t += o;
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        t
    };
    assert_eq!(total_committed, 40);
    c1.shutdown().await;
    c2.shutdown().await;
    producer.shutdown().await;
    cluster.stop().await;
}
