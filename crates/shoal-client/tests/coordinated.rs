//! Coordinated mode end to end (push consumers against the Shoal broker as coordinator):
//! 16 queues, 4 -> 8 -> 4 members with STICKY under steady load; every change is checked for
//! single ownership (coordinator and members agree), no loss and no duplicates (graceful
//! joins and leaves hand over by evidence); a static member's restart moves nothing; a member
//! killed without leaving is replaced without loss.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::{wait_until, Cluster};
use parking_lot::Mutex;
use shoal_client::consumer::{ConsumeConcurrentlyStatus, MessageListener};
use shoal_client::{GroupProtocol, Message, MessageQueue, Producer, PushConsumer};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Seen = Arc<Mutex<HashMap<u64, u32>>>;

fn duplicates(seen: &Seen) -> u64 {
    seen.lock().values().map(|c| u64::from(c - 1)).sum()
}

async fn start(cluster: &Cluster, seen: &Seen, instance: Option<&str>) -> PushConsumer {
    start_on(cluster, seen, instance, "CG-COORD", "COORD").await
}

async fn start_on(
    cluster: &Cluster,
    seen: &Seen,
    instance: Option<&str>,
    group: &str,
    topic: &str,
) -> PushConsumer {
    let mut c = cluster.consumer_config(group);
    c.subscriptions.insert(topic.into(), "*".into());
    c.rebalance_interval = Duration::from_secs(60);
    c.allocate_strategy = Some("STICKY".into());
    c.protocol = GroupProtocol::Coordinated;
    c.instance_id = instance.map(str::to_string);
    start_with_config(c, seen).await
}

/// Every queue of the topic owned by exactly one member, loads 16/n, the coordinator
/// reconciled.
async fn settled(
    admin: &shoal_client::AdminClient,
    consumers: &[PushConsumer],
    group: &str,
    topic: &str,
    queues: usize,
) -> bool {
    let mut owners: HashMap<MessageQueue, usize> = HashMap::new();
    for c in consumers {
        for q in c.owned_queues().into_iter().filter(|q| q.topic == topic) {
            *owners.entry(q).or_default() += 1;
        }
    }
    if owners.len() != queues || owners.values().any(|n| *n != 1) {
        return false;
    }
    matches!(admin.group_describe(group).await, Ok((_, d)) if d["reconciled"] == true && d["mode"] == "coordinated")
}

async fn converge(admin: &shoal_client::AdminClient, consumers: &[PushConsumer]) -> Duration {
    converge_on(admin, consumers, "CG-COORD", "COORD", 16).await
}

async fn converge_on(
    admin: &shoal_client::AdminClient,
    consumers: &[PushConsumer],
    group: &str,
    topic: &str,
    queues: usize,
) -> Duration {
    let t = Instant::now();
    for _ in 0..300 {
        if settled(admin, consumers, group, topic, queues).await {
            return t.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no convergence within 6 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_eight_four_static_restart_and_kill() {
    let cluster = Cluster::start().await;
    cluster.create_topic("COORD", 16).await;
    let admin = cluster.admin();
    let producer = Producer::builder("PG-COORD")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    let seen: Seen = Arc::default();
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let load = {
        let (p, sent, stop) = (producer.clone(), sent.clone(), stop.clone());
        tokio::spawn(async move {
            let mut seq = 0u64;
            while !stop.is_cancelled() {
                if p.send(Message::new("COORD", seq.to_string())).await.is_ok() {
                    seq += 1;
                    sent.store(seq, std::sync::atomic::Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let mut consumers = Vec::new();
    for i in 0..4 {
        consumers.push(start(&cluster, &seen, (i == 0).then_some("static-0")).await);
    }
    let t = converge(&admin, &consumers).await;
    println!("0 -> 4: converged in {t:?}");
    for step in [8usize, 4] {
        let dups = duplicates(&seen);
        while consumers.len() < step {
            consumers.push(start(&cluster, &seen, None).await);
        }
        while consumers.len() > step {
            if let Some(c) = consumers.pop() {
                c.shutdown().await;
            }
        }
        let t = converge(&admin, &consumers).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let d = duplicates(&seen) - dups;
        println!("-> {step}: converged in {t:?}, {d} duplicate(s)");
        assert_eq!(d, 0, "graceful change to {step} members duplicated");
    }
    // Static restart: the member with instance id static-0 leaves and a new process takes its
    // place: same queues, no rebalance.
    let (_, before) = admin.group_describe("CG-COORD").await.unwrap();
    let old_queues: BTreeSet<MessageQueue> = consumers[0].owned_queues().into_iter().collect();
    let old = consumers.remove(0);
    old.shutdown().await;
    let new = start(&cluster, &seen, Some("static-0")).await;
    consumers.insert(0, new);
    let t = converge(&admin, &consumers).await;
    let (_, after) = admin.group_describe("CG-COORD").await.unwrap();
    let new_queues: BTreeSet<MessageQueue> = consumers[0].owned_queues().into_iter().collect();
    println!(
        "static restart: converged in {t:?}, group epoch {} -> {}",
        before["groupEpoch"], after["groupEpoch"]
    );
    assert_eq!(
        old_queues, new_queues,
        "the static member's restart moved queues"
    );
    assert_eq!(
        before["groupEpoch"], after["groupEpoch"],
        "a static restart is not a rebalance"
    );
    // A member killed: its connection closes without leave.
    let killed = consumers.pop().unwrap();
    killed.instance().shutdown();
    let t = converge(&admin, &consumers).await;
    println!("kill: converged in {t:?}");
    stop.cancel();
    load.await.unwrap();
    let total = sent.load(std::sync::atomic::Ordering::SeqCst);
    let all = wait_until(Duration::from_secs(20), || {
        let s = seen.lock();
        (0..total).all(|q| s.contains_key(&q))
    })
    .await;
    assert!(all, "messages lost");
    println!(
        "{total} messages, {} duplicate(s) in total",
        duplicates(&seen)
    );
    let (_, h) = admin.group_history("CG-COORD").await.unwrap();
    assert!(h["rebalances"].as_array().is_some_and(|r| r.len() >= 8));
    for c in consumers {
        c.shutdown().await;
    }
    producer.shutdown().await;
    admin.shutdown();
    cluster.stop().await;
}

/// Two brokers: one coordinator (the same for every member) assigns the queues of both.
#[tokio::test]
async fn one_coordinator_assigns_every_broker_s_queues() {
    let cluster = Cluster::start_with(2, |_| {}).await;
    cluster.create_topic("COORD2", 4).await;
    let admin = cluster.admin();
    let seen: Seen = Arc::default();
    let mut consumers = Vec::new();
    for _ in 0..3 {
        consumers.push(start_on(&cluster, &seen, None, "CG-COORD2", "COORD2").await);
    }
    let t = converge_on(&admin, &consumers, "CG-COORD2", "COORD2", 8).await;
    let (coordinator, d) = admin.group_describe("CG-COORD2").await.unwrap();
    println!("2 brokers, 3 members: converged in {t:?}, coordinator {coordinator}");
    assert_eq!(d["members"].as_array().map(Vec::len), Some(3));
    // Lag counts every broker's offsets: all consumed, all committed -> 0 everywhere.
    let producer = Producer::builder("PG-COORD2")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    for i in 0..20u64 {
        producer
            .send(Message::new("COORD2", i.to_string()))
            .await
            .unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(20), || {
            let s = seen.lock();
            (0..20u64).all(|q| s.contains_key(&q))
        })
        .await
    );
    let mut lags = Vec::new();
    for _ in 0..100 {
        let (_, d) = admin.group_describe("CG-COORD2").await.unwrap();
        lags = d["members"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| m["lag"].as_i64().unwrap_or(-1))
            .collect();
        if lags.iter().all(|l| *l == 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(lags.iter().all(|l| *l == 0), "lag per member {lags:?}");
    producer.shutdown().await;
    for c in consumers {
        c.shutdown().await;
    }
    admin.shutdown();
    cluster.stop().await;
}

/// Creates `topic` with `queues` queues on one broker only.
async fn create_on(addr: std::net::SocketAddr, topic: &str, queues: i32) {
    use shoal_proto::code::request_code as rc;
    use shoal_proto::header::CreateTopicRequestHeader;
    let net = shoal_net::RemotingClient::new(
        shoal_net::NetConfig::default(),
        Arc::new(shoal_net::NotSupportedProcessor),
    );
    let req = shoal_proto::RemotingCommand::request_with_header(
        rc::UPDATE_AND_CREATE_TOPIC,
        &CreateTopicRequestHeader {
            topic: topic.into(),
            default_topic: "TBW102".into(),
            read_queue_nums: queues,
            write_queue_nums: queues,
            perm: 6,
            topic_filter_type: "SINGLE_TAG".into(),
            ..Default::default()
        },
    );
    let r = net
        .invoke(&addr.to_string(), req, Duration::from_secs(3))
        .await
        .unwrap();
    assert_eq!(r.code, 0, "{:?}", r.remark);
    net.shutdown();
}

/// The topic grows onto a second broker whose turn it is to coordinate the group: the members
/// leave the old coordinator, drop their queues, join the new one, and every broker's queues
/// are owned once again; nothing is lost.
#[tokio::test]
async fn the_coordinator_moves_when_the_routes_change() {
    let cluster = Cluster::start_with(2, |_| {}).await;
    // A group whose coordinator is broker-b once both brokers serve the topic.
    let group = (0..)
        .map(|i| format!("CG-MOVE{i}"))
        .find(|g| shoal_proto::hash::java_string_hash(g).unsigned_abs() % 2 == 1)
        .unwrap();
    create_on(cluster.brokers[0].local_addr(), "MOVE", 4).await;
    let admin = cluster.admin();
    for _ in 0..100 {
        if admin.topic_route("MOVE").await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen: Seen = Arc::default();
    let mut consumers = Vec::new();
    for _ in 0..2 {
        consumers.push(start_on(&cluster, &seen, None, &group, "MOVE").await);
    }
    converge_on(&admin, &consumers, &group, "MOVE", 4).await;
    let (first, _) = admin.group_describe(&group).await.unwrap();
    create_on(cluster.brokers[1].local_addr(), "MOVE", 4).await;
    let t = Instant::now();
    let mut moved = None;
    for _ in 0..300 {
        if settled(&admin, &consumers, &group, "MOVE", 8).await {
            let (now, _) = admin.group_describe(&group).await.unwrap();
            if now != first {
                moved = Some(now);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let now = moved.expect("the coordinator did not move to the second broker");
    println!(
        "coordinator moved {first} -> {now}, 8 queues owned after {:?}",
        t.elapsed()
    );
    assert_eq!(now, cluster.brokers[1].local_addr().to_string());
    let producer = Producer::builder("PG-MOVE")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    for i in 0..40u64 {
        producer
            .send(Message::new("MOVE", i.to_string()))
            .await
            .unwrap();
    }
    let all = wait_until(Duration::from_secs(20), || {
        let s = seen.lock();
        (0..40u64).all(|q| s.contains_key(&q))
    })
    .await;
    assert!(all, "messages lost after the move");
    producer.shutdown().await;
    for c in consumers {
        c.shutdown().await;
    }
    admin.shutdown();
    cluster.stop().await;
}

/// `Auto` speaks coordinated mode only to a broker that lists `coordinator` in
/// GET_BROKER_FEATURES: against one with `[coordinator] enabled = false` the consumers
/// allocate client-side (classic) and still consume everything, and `Coordinated` refuses to
/// start.
#[tokio::test]
async fn auto_is_coordinated_only_where_the_broker_lists_the_coordinator() {
    use shoal_client::instance::ClientInstance;
    // A broker that coordinates: listed, and an Auto consumer joins the coordinator.
    let on = Cluster::start().await;
    on.create_topic("AUTO", 4).await;
    let probe = ClientInstance::start(on.client_config()).unwrap();
    let addr = on.brokers[0].local_addr().to_string();
    assert!(probe.broker_kind(&addr).await.unwrap().has_coordinator());
    probe.shutdown();
    let seen: Seen = Arc::default();
    let mut c = on.consumer_config("CG-AUTO");
    c.subscriptions.insert("AUTO".into(), "*".into());
    let auto = start_with_config(c, &seen).await;
    let admin = on.admin();
    assert!(
        wait_until_async(Duration::from_secs(20), || async {
            matches!(admin.group_describe("CG-AUTO").await, Ok((_, d)) if d["mode"] == "coordinated" && d["members"].as_array().map(Vec::len) == Some(1))
        })
        .await,
        "the Auto consumer joined the coordinator"
    );
    auto.shutdown().await;
    admin.shutdown();
    on.stop().await;

    // A broker that does not: not listed, Auto runs classic, Coordinated is refused.
    let off = Cluster::start_with(1, |b| b.coordinator.enabled = false).await;
    off.create_topic("AUTO", 4).await;
    let probe = ClientInstance::start(off.client_config()).unwrap();
    let addr = off.brokers[0].local_addr().to_string();
    let kind = probe.broker_kind(&addr).await.unwrap();
    assert!(
        kind.has_session_locks() && !kind.has_coordinator(),
        "{kind:?}"
    );
    probe.shutdown();
    let seen: Seen = Arc::default();
    let mut consumers = Vec::new();
    for _ in 0..2 {
        let mut c = off.consumer_config("CG-AUTO");
        c.subscriptions.insert("AUTO".into(), "*".into());
        consumers.push(start_with_config(c, &seen).await);
    }
    // Classic allocation: the two split the four queues between them.
    assert!(
        wait_until(Duration::from_secs(20), || {
            // The topic's queues only (each also owns its share of the retry topic).
            let of_topic = |c: &PushConsumer| -> Vec<MessageQueue> {
                c.owned_queues()
                    .into_iter()
                    .filter(|q| q.topic == "AUTO")
                    .collect()
            };
            let mut all: Vec<MessageQueue> = consumers.iter().flat_map(of_topic).collect();
            let n = all.len();
            all.sort();
            all.dedup();
            n == 4 && all.len() == 4 && consumers.iter().all(|c| of_topic(c).len() == 2)
        })
        .await,
        "classic allocation over 2 members"
    );
    let producer = Producer::builder("PG-AUTO")
        .client_config(off.client_config())
        .start()
        .await
        .unwrap();
    for i in 0..20u64 {
        producer
            .send(Message::new("AUTO", i.to_string()))
            .await
            .unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(20), || {
            let s = seen.lock();
            (0..20u64).all(|q| s.contains_key(&q))
        })
        .await,
        "every message consumed in classic mode"
    );
    let admin = off.admin();
    let (_, d) = admin.group_describe("CG-AUTO").await.unwrap();
    assert_ne!(d["mode"], "coordinated", "{d}");
    let mut c = off.consumer_config("CG-AUTO-C");
    c.subscriptions.insert("AUTO".into(), "*".into());
    c.protocol = GroupProtocol::Coordinated;
    let refused = PushConsumer::start(
        c,
        MessageListener::concurrently(|_, _| ConsumeConcurrentlyStatus::ConsumeSuccess),
    )
    .await;
    assert!(
        refused.is_err(),
        "protocol = coordinated against a broker without a coordinator"
    );
    producer.shutdown().await;
    for c in consumers {
        c.shutdown().await;
    }
    admin.shutdown();
    off.stop().await;
}

async fn start_with_config(c: shoal_client::ConsumerConfig, seen: &Seen) -> PushConsumer {
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

async fn wait_until_async<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t = Instant::now();
    while t.elapsed() < limit {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}
