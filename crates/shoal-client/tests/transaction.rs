//! Transactional messages against an in-process Shoal broker: commit, rollback, the broker's
//! check-back for undecided half messages, discard after the check limit, idempotent
//! END_TRANSACTION, and pending half messages found again after a broker restart.

mod common;

use common::{broker_config, wait_until, Cluster};
use parking_lot::Mutex;
use shoal_broker::Broker;
use shoal_client::consumer::{ConsumeConcurrentlyStatus, MessageListener};
use shoal_client::{
    LocalTransactionState, Message, MessageExt, Producer, PushConsumer, TransactionProducer,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::EndTransactionRequestHeader;
use shoal_proto::message::OffsetMsgId;
use shoal_proto::RemotingCommand;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

fn fast_checks(cfg: &mut shoal_broker::BrokerConfig) {
    cfg.transaction_check_interval_ms = 200;
    cfg.transaction_timeout_ms = 500;
}

fn recorder() -> (Arc<Mutex<Vec<MessageExt>>>, MessageListener) {
    let got: Arc<Mutex<Vec<MessageExt>>> = Arc::default();
    let g = got.clone();
    let listener = MessageListener::concurrently(move |msgs, _ctx| {
        g.lock().extend(msgs.iter().cloned());
        ConsumeConcurrentlyStatus::ConsumeSuccess
    });
    (got, listener)
}

fn bodies(got: &Mutex<Vec<MessageExt>>) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for msg in got.lock().iter() {
        *m.entry(String::from_utf8_lossy(&msg.body).into_owned())
            .or_default() += 1;
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_rollback_and_check_back() {
    let cluster = Cluster::start_with(1, fast_checks).await;
    cluster.create_topic("TX", 4).await;
    let (got, listener) = recorder();
    let consumer = PushConsumer::start(
        {
            let mut c = cluster.consumer_config("CG-TX");
            c.subscriptions.insert("TX".into(), "*".into());
            c
        },
        listener,
    )
    .await
    .unwrap();

    // The check listener: "unknown" is committed on the second check.
    let checks: Arc<Mutex<Vec<MessageExt>>> = Arc::default();
    let c2 = checks.clone();
    let producer = TransactionProducer::start(
        Producer::builder("PG-TX").client_config(cluster.client_config()),
        move |m: MessageExt| {
            let c2 = c2.clone();
            async move {
                let n = {
                    let mut c = c2.lock();
                    c.push(m);
                    c.len()
                };
                if n >= 2 {
                    LocalTransactionState::CommitMessage
                } else {
                    LocalTransactionState::Unknown
                }
            }
        },
    )
    .await
    .unwrap();

    let committed = producer
        .send_in_transaction(Message::new("TX", "commit"), |_m, _r| async {
            LocalTransactionState::CommitMessage
        })
        .await
        .unwrap();
    assert!(committed.end_sent);
    producer
        .send_in_transaction(Message::new("TX", "rollback"), |_m, _r| async {
            LocalTransactionState::RollbackMessage
        })
        .await
        .unwrap();
    let unknown = producer
        .send_in_transaction(Message::new("TX", "unknown"), |_m, _r| async {
            LocalTransactionState::Unknown
        })
        .await
        .unwrap();

    assert!(
        wait_until(T, || bodies(&got).contains_key("commit")).await,
        "the committed message is delivered"
    );
    assert!(
        !bodies(&got).contains_key("unknown"),
        "an undecided half message is invisible"
    );
    assert!(
        wait_until(T, || bodies(&got).contains_key("unknown")).await,
        "committed by the second check"
    );
    {
        let checks = checks.lock();
        assert!(checks.len() >= 2);
        assert_eq!(checks[0].topic, "TX", "the check shows the real topic");
        assert_eq!(&checks[0].body[..], b"unknown");
        assert_eq!(checks[0].msg_id(), unknown.send.msg_id.as_str());
    }

    // A second END_TRANSACTION for the committed one changes nothing.
    let inst = producer.producer().instance();
    let addr = inst.master_addrs()[0].clone();
    let header = EndTransactionRequestHeader {
        topic: Some("TX".into()),
        producer_group: "PG-TX".into(),
        tran_state_table_offset: committed.send.queue_offset,
        commit_log_offset: OffsetMsgId::parse(&committed.send.offset_msg_id)
            .unwrap()
            .commit_log_offset,
        commit_or_rollback: 8,
        from_transaction_check: false,
        msg_id: committed.send.msg_id.clone(),
        transaction_id: Some(committed.send.msg_id.clone()),
        ..Default::default()
    };
    let r = inst
        .invoke(
            &addr,
            RemotingCommand::request_with_header(rc::END_TRANSACTION, &header),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(r.code, resp::SUCCESS);
    // A wrong producer group is refused.
    let mut wrong = header.clone();
    wrong.producer_group = "other".into();
    let r = inst
        .invoke(
            &addr,
            RemotingCommand::request_with_header(rc::END_TRANSACTION, &wrong),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(r.code, resp::SYSTEM_ERROR);

    tokio::time::sleep(Duration::from_millis(800)).await;
    let seen = bodies(&got);
    assert_eq!(seen.get("commit"), Some(&1), "committed once: {seen:?}");
    assert_eq!(seen.get("unknown"), Some(&1), "committed once: {seen:?}");
    assert!(
        !seen.contains_key("rollback"),
        "rolled back: never delivered"
    );
    let committed_msg = got
        .lock()
        .iter()
        .find(|m| &m.body[..] == b"commit")
        .cloned()
        .unwrap();
    assert_eq!(committed_msg.msg_id(), committed.send.msg_id.as_str());
    assert!(committed_msg.property("REAL_TOPIC").is_none());
    assert_eq!(
        committed_msg.prepared_transaction_offset,
        OffsetMsgId::parse(&committed.send.offset_msg_id)
            .unwrap()
            .commit_log_offset,
        "preparedTransactionOffset names the half message"
    );

    let events = transaction_events(&cluster.brokers[0]);
    assert_eq!(events("half_stored"), 3);
    assert_eq!(events("committed"), 2);
    assert_eq!(events("rolled_back"), 1);
    assert!(events("duplicate_decision") >= 1);

    consumer.shutdown().await;
    producer.shutdown().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discarded_after_the_check_limit() {
    let cluster = Cluster::start_with(1, |c| {
        fast_checks(c);
        c.transaction_check_max = 2;
    })
    .await;
    cluster.create_topic("TXD", 1).await;
    let asked = Arc::new(AtomicUsize::new(0));
    let a2 = asked.clone();
    let producer = TransactionProducer::start(
        Producer::builder("PG-TXD").client_config(cluster.client_config()),
        move |_m| {
            a2.fetch_add(1, Ordering::Relaxed);
            async { LocalTransactionState::Unknown }
        },
    )
    .await
    .unwrap();
    producer
        .send_in_transaction(Message::new("TXD", "never"), |_m, _r| async {
            LocalTransactionState::Unknown
        })
        .await
        .unwrap();
    let store = cluster.brokers[0].api().store();
    assert!(
        wait_until(T, || store.max_offset("TRANS_CHECK_MAX_TIME_TOPIC", 0) == 1).await,
        "moved to TRANS_CHECK_MAX_TIME_TOPIC"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        asked.load(Ordering::Relaxed),
        2,
        "checked exactly check-max times"
    );
    assert_eq!(store.max_offset("TXD", 0), 0, "never committed");
    producer.shutdown().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_half_messages_survive_a_restart() {
    let mut cluster = Cluster::start_with(1, |c| {
        // No check before the restart.
        c.transaction_check_interval_ms = 60_000;
    })
    .await;
    cluster.create_topic("TXR", 1).await;
    let producer = Producer::builder("PG-TXR")
        .client_config(cluster.client_config())
        .start()
        .await
        .unwrap();
    let tx = TransactionProducer::start(
        Producer::builder("PG-TXR-OLD").client_config(cluster.client_config()),
        |_m| async { LocalTransactionState::Unknown },
    )
    .await
    .unwrap();
    let _ = producer; // a plain producer of another group: not asked
    let mut sent = Vec::new();
    for i in 0..3 {
        let mut m = Message::new("TXR", format!("pending-{i}"));
        m.put_property("n", i.to_string()).unwrap();
        sent.push(
            tx.send_in_transaction(m, |_m, _r| async { LocalTransactionState::Unknown })
                .await
                .unwrap(),
        );
    }
    tx.shutdown().await;

    // Restart the broker on the same data directory, checking fast now.
    let old = cluster.brokers.remove(0);
    let dir = cluster.dir.path().to_path_buf();
    old.shutdown().await;
    let mut cfg = broker_config(&dir, &cluster.namesrv_addr, "broker-a");
    fast_checks(&mut cfg);
    cluster.brokers.push(Broker::start(cfg).await.unwrap());

    // A producer of the same group answers the checks after the restart: commit.
    let asked = Arc::new(AtomicUsize::new(0));
    let a2 = asked.clone();
    let tx = TransactionProducer::start(
        Producer::builder("PG-TXR-OLD").client_config(cluster.client_config()),
        move |_m| {
            a2.fetch_add(1, Ordering::Relaxed);
            async { LocalTransactionState::CommitMessage }
        },
    )
    .await
    .unwrap();
    // The restarted application sends a new transaction (so the broker knows it again).
    tx.send_in_transaction(Message::new("TXR", "new"), |_m, _r| async {
        LocalTransactionState::CommitMessage
    })
    .await
    .unwrap();
    let store = cluster.brokers[0].api().store();
    assert!(
        wait_until(T, || store.max_offset("TXR", 0) == 4).await,
        "the three pending half messages were checked and committed after the restart (asked {})",
        asked.load(Ordering::Relaxed)
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(store.max_offset("TXR", 0), 4, "each committed once");
    assert_eq!(
        asked.load(Ordering::Relaxed),
        3,
        "asked about the three pending ones"
    );
    tx.shutdown().await;
    producer.shutdown().await;
    cluster.stop().await;
}

/// The broker's transaction event counters, as `/metrics` exports them.
fn transaction_events(broker: &shoal_broker::Broker) -> impl Fn(&str) -> u64 {
    let text = broker.api().metrics().encode_text();
    move |event: &str| {
        let label = format!("event=\"{event}\"");
        text.lines()
            .find(|l| l.starts_with("shoal_broker_transaction_events_total{") && l.contains(&label))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0)
    }
}
