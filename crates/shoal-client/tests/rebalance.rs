//! Classic rebalance with 1 -> 3 -> 5 -> 2 consumers over 8 and 16 queues, against the Shoal
//! broker: after each change every queue has exactly one owner (checked through the admin
//! client's consumer progress, i.e. GET_CONSUMER_RUNNING_INFO of each member), no message is
//! lost, duplicates are counted, and the time to converge after the membership change is
//! measured (the safety-net timer is set to 60 s so convergence can only come from the
//! broker's NOTIFY_CONSUMER_IDS_CHANGED). Graceful leave must give zero duplicates.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::{wait_until, Cluster};
use parking_lot::Mutex;
use shoal_client::consumer::{ConsumeConcurrentlyStatus, MessageListener};
use shoal_client::{Message, MessageQueue, Producer, PushConsumer};
use shoal_group::{strategy_by_name, AllocationInput};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Seen = Arc<Mutex<HashMap<u64, u32>>>;

fn duplicates(seen: &Seen) -> u64 {
    seen.lock().values().map(|c| u64::from(c - 1)).sum()
}

async fn start_consumer(cluster: &Cluster, group: &str, topic: &str, seen: &Seen) -> PushConsumer {
    let mut c = cluster.consumer_config(group);
    c.subscriptions.insert(topic.into(), "*".into());
    c.rebalance_interval = Duration::from_secs(60);
    // The layout checked is AVG's: chosen explicitly (a coordinated group's default is the
    // coordinator's sticky assignor).
    c.allocate_strategy = Some("AVG".into());
    let seen = seen.clone();
    PushConsumer::start(
        c,
        MessageListener::concurrently(move |msgs, _| {
            let mut s = seen.lock();
            for m in msgs {
                if let Some(seq) = std::str::from_utf8(&m.body)
                    .ok()
                    .and_then(|b| b.parse::<u64>().ok())
                {
                    *s.entry(seq).or_insert(0) += 1;
                }
            }
            ConsumeConcurrentlyStatus::ConsumeSuccess
        }),
    )
    .await
    .unwrap()
}

fn expected_assignment(
    group: &str,
    queues: &[MessageQueue],
    consumers: &[PushConsumer],
) -> BTreeMap<String, BTreeSet<MessageQueue>> {
    let ids: Vec<String> = consumers.iter().map(|c| c.client_id().to_owned()).collect();
    let input = AllocationInput::new(group, queues.to_vec(), ids.clone());
    let avg = strategy_by_name("AVG").unwrap();
    ids.iter()
        .map(|id| {
            (
                id.clone(),
                avg.allocate(&input, id).unwrap().into_iter().collect(),
            )
        })
        .collect()
}

fn converged(
    topic: &str,
    expected: &BTreeMap<String, BTreeSet<MessageQueue>>,
    consumers: &[PushConsumer],
) -> bool {
    consumers.iter().all(|c| {
        let owned: BTreeSet<MessageQueue> = c
            .owned_queues()
            .into_iter()
            .filter(|q| q.topic == topic)
            .collect();
        expected.get(c.client_id()) == Some(&owned)
    })
}

async fn scenario(queues: i32) {
    let cluster = Cluster::start().await;
    let topic = format!("RB{queues}");
    let group = format!("CG-RB{queues}");
    cluster.create_topic(&topic, queues).await;
    let all_queues: Vec<MessageQueue> = (0..queues)
        .map(|q| MessageQueue::new(topic.clone(), "broker-a", q))
        .collect();
    let producer = Producer::builder("PG")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    let admin = cluster.admin();
    let seen: Seen = Arc::default();
    let mut consumers: Vec<PushConsumer> = Vec::new();
    let mut next_seq = 0u64;
    let per_phase = 200u64;
    println!("== {queues} queues ==");
    for target in [1usize, 3, 5, 2] {
        let dups_before = duplicates(&seen);
        let from = consumers.len();
        // Messages flow while the group changes.
        let p = producer.clone();
        let t = topic.clone();
        let first = next_seq;
        let sender = tokio::spawn(async move {
            for seq in first..first + per_phase {
                p.send(Message::new(t.clone(), seq.to_string()))
                    .await
                    .unwrap();
                if seq % 20 == 0 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        });
        next_seq += per_phase;
        let changed_at = Instant::now();
        while consumers.len() < target {
            consumers.push(start_consumer(&cluster, &group, &topic, &seen).await);
        }
        while consumers.len() > target {
            if let Some(c) = consumers.pop() {
                c.shutdown().await;
            }
        }
        let change_took = changed_at.elapsed();
        let expected = expected_assignment(&group, &all_queues, &consumers);
        let ok = wait_until(Duration::from_secs(15), || {
            converged(&topic, &expected, &consumers)
        })
        .await;
        let convergence = changed_at.elapsed();
        assert!(
            ok,
            "{from} -> {target}: no convergence within 15 s (timer is 60 s)"
        );
        sender.await.unwrap();
        let total = next_seq;
        let all_seen = wait_until(Duration::from_secs(20), || {
            let s = seen.lock();
            (0..total).all(|q| s.contains_key(&q))
        })
        .await;
        let missing: Vec<u64> = {
            let s = seen.lock();
            (0..total).filter(|q| !s.contains_key(q)).collect()
        };
        assert!(all_seen, "lost messages: {missing:?}");
        // Exactly one owner per queue, as the members themselves report it.
        let live: BTreeSet<String> = consumers.iter().map(|c| c.client_id().to_owned()).collect();
        let mut owners_ok = false;
        let mut last = String::new();
        for _ in 0..50 {
            let progress = admin.group_progress(&group).await.unwrap();
            let mine: Vec<_> = progress
                .queues
                .iter()
                .filter(|q| q.mq.topic == topic)
                .collect();
            owners_ok = mine.len() == queues as usize
                && mine.iter().all(|q| {
                    q.owner
                        .as_deref()
                        .is_some_and(|o| !o.contains(',') && live.contains(o))
                });
            last = format!(
                "{:?}",
                mine.iter()
                    .map(|q| (q.mq.queue_id, q.owner.clone()))
                    .collect::<Vec<_>>()
            );
            if owners_ok {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(owners_ok, "{from} -> {target}: owners {last}");
        let phase_dups = duplicates(&seen) - dups_before;
        println!(
            "{from} -> {target} consumers: membership change took {change_took:?}, converged after {convergence:?}, \
             {phase_dups} duplicate(s) in this phase, {total} messages consumed, none lost"
        );
        if target < from {
            assert_eq!(phase_dups, 0, "graceful leave must not duplicate");
        }
    }
    println!(
        "{queues} queues: {} duplicate(s) in total over {next_seq} messages",
        duplicates(&seen)
    );
    for c in consumers {
        c.shutdown().await;
    }
    producer.shutdown().await;
    admin.shutdown();
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_1_3_5_2_over_8_queues() {
    scenario(8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_1_3_5_2_over_16_queues() {
    scenario(16).await;
}

/// A member that dies without leaving (its connections drop, no unregister, no final commit):
/// the broker notices the closed connection and notifies the others at once; its queues are
/// taken over from the last committed offsets (duplicates possible, counted), nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_member_is_replaced_without_loss() {
    let cluster = Cluster::start().await;
    let (topic, group) = ("RBK", "CG-RBK");
    cluster.create_topic(topic, 12).await;
    let all_queues: Vec<MessageQueue> = (0..12)
        .map(|q| MessageQueue::new(topic, "broker-a", q))
        .collect();
    let producer = Producer::builder("PG")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    let seen: Seen = Arc::default();
    let mut consumers = Vec::new();
    for _ in 0..3 {
        consumers.push(start_consumer(&cluster, group, topic, &seen).await);
    }
    let expected = expected_assignment(group, &all_queues, &consumers);
    assert!(
        wait_until(Duration::from_secs(15), || converged(
            topic, &expected, &consumers
        ))
        .await
    );
    let p = producer.clone();
    let sender = tokio::spawn(async move {
        for seq in 0..300u64 {
            p.send(Message::new(topic, seq.to_string())).await.unwrap();
            if seq % 20 == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let victim = consumers.pop().unwrap();
    let killed_at = Instant::now();
    victim.instance().shutdown();
    let expected = expected_assignment(group, &all_queues, &consumers);
    assert!(
        wait_until(Duration::from_secs(15), || converged(
            topic, &expected, &consumers
        ))
        .await,
        "no convergence after a kill"
    );
    let convergence = killed_at.elapsed();
    sender.await.unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || {
            let s = seen.lock();
            (0..300).all(|q| s.contains_key(&q))
        })
        .await,
        "messages lost after a kill"
    );
    println!(
        "killed 1 of 3 consumers over 12 queues: converged after {convergence:?}, {} duplicate(s) over 300 messages, none lost",
        duplicates(&seen)
    );
    drop(victim);
    for c in consumers {
        c.shutdown().await;
    }
    producer.shutdown().await;
    cluster.stop().await;
}

/// One listener call of the slow-listener test: who, which queue and offset, when.
#[derive(Debug, Clone)]
struct Call {
    member: &'static str,
    queue: i32,
    offset: i64,
    start: Instant,
    end: Instant,
}

/// A listener call on a lost queue that outlasts `drop_wait` keeps the queue: its member holds
/// the lock (renewed by its session) until the call returns, commits after it, and only then
/// unlocks, so the next owner starts after the call ended, from the offset after it. Checked
/// on the listener calls themselves: no two members run calls of one queue at the same time,
/// the slow message is not consumed again, nothing is lost. (Before, the lock was released
/// `drop_wait` after the stop, under the running call.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_listener_keeps_its_queue_until_the_call_returns() {
    let cluster = Cluster::start().await;
    let (topic, group) = ("RBSLOW", "CG-RBSLOW");
    cluster.create_topic(topic, 2).await;
    let producer = Producer::builder("PG")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
    let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let drop_wait = Duration::from_millis(200);
    // The first message of each queue takes 10 drop_waits in the first member's listener.
    let slow = drop_wait * 10;
    let start = |member: &'static str| {
        let mut c = cluster.consumer_config(group);
        c.subscriptions.insert(topic.into(), "*".into());
        c.rebalance_interval = Duration::from_secs(60);
        c.drop_wait = drop_wait;
        c.consume_batch_size = 1;
        let (calls, running) = (calls.clone(), running.clone());
        PushConsumer::start(
            c,
            MessageListener::concurrently(move |msgs, ctx| {
                let start = Instant::now();
                running.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if member == "a" && msgs.iter().any(|m| m.queue_offset == 0) {
                    std::thread::sleep(slow);
                }
                running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                let mut c = calls.lock();
                for m in msgs {
                    c.push(Call {
                        member,
                        queue: ctx.message_queue.queue_id,
                        offset: m.queue_offset,
                        start,
                        end: Instant::now(),
                    });
                }
                ConsumeConcurrentlyStatus::ConsumeSuccess
            }),
        )
    };
    // Only the topic's queues: a member also owns its group's retry queue once that topic's
    // route is known (at once in coordinated mode).
    let mine = |c: &PushConsumer| c.owned_queues().iter().filter(|q| q.topic == topic).count();
    let a = start("a").await.unwrap();
    assert!(
        wait_until(Duration::from_secs(15), || mine(&a) == 2).await,
        "the first member did not take both queues"
    );
    for q in 0..2 {
        let mq = MessageQueue::new(topic, "broker-a", q);
        producer
            .send_to_queue(Message::new(topic, format!("{q}-0")), &mq)
            .await
            .unwrap();
    }
    // Both slow calls run; then a second member joins and takes one of the queues.
    assert!(
        wait_until(Duration::from_secs(15), || running
            .load(std::sync::atomic::Ordering::SeqCst)
            == 2)
        .await,
        "the slow calls did not start"
    );
    let b = start("b").await.unwrap();
    // Messages for both queues while the slow calls still run.
    for i in 1..=20 {
        for q in 0..2 {
            let mq = MessageQueue::new(topic, "broker-a", q);
            producer
                .send_to_queue(Message::new(topic, format!("{q}-{i}")), &mq)
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        wait_until(Duration::from_secs(30), || {
            let c = calls.lock();
            (0..2).all(|q| (0..=20).all(|o| c.iter().any(|x| x.queue == q && x.offset == o)))
        })
        .await,
        "messages lost: {:?}",
        calls.lock()
    );
    assert!(
        wait_until(Duration::from_secs(15), || mine(&a) == 1 && mine(&b) == 1).await,
        "no convergence: a owns {:?}, b owns {:?}, a {:?}, b {:?}",
        a.owned_queues(),
        b.owned_queues(),
        a.stats(),
        b.stats()
    );
    let calls = calls.lock().clone();
    let moved: BTreeSet<i32> = calls
        .iter()
        .filter(|c| c.member == "b")
        .map(|c| c.queue)
        .collect();
    assert_eq!(moved.len(), 1, "the joiner consumed one queue: {calls:?}");
    for x in &calls {
        for y in &calls {
            if x.queue == y.queue && x.member != y.member {
                assert!(
                    x.end <= y.start || y.end <= x.start,
                    "two members consumed queue {} at once: {x:?} and {y:?}",
                    x.queue
                );
            }
        }
    }
    let mut per_message: HashMap<(i32, i64), u32> = HashMap::new();
    for c in &calls {
        *per_message.entry((c.queue, c.offset)).or_default() += 1;
    }
    let dups: Vec<_> = per_message.iter().filter(|(_, n)| **n > 1).collect();
    assert!(dups.is_empty(), "consumed twice: {dups:?}");
    assert!(
        a.stats()
            .slow_drains
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1,
        "the slow drain was not reported"
    );
    b.shutdown().await;
    a.shutdown().await;
    producer.shutdown().await;
    cluster.stop().await;
}
