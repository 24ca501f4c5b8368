//! The other direction: Apache RocketMQ 5.3.3's own name server and broker (`NamesrvStartup`,
//! `BrokerStartup` from the Maven artifacts that `.ci/setup.d/20-java.sh` fetches, class path
//! in `target/external/rocketmq-broker5.classpath`) on free ports with a generated
//! `broker.conf`, and the Shoal client and `shoal` CLI against them: topics, produce, push
//! consumers (a join and a leave: exclusive owners), orderly consumption under the broker's
//! locks, the lite pull consumer, `group progress`, `reset-offset`, `message get`, `dlq list`
//! and `dlq resend`, and transactions with the broker's check-back. Skips without java or the
//! class path unless `SHOAL_REQUIRE_EXTERNAL=1`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use serde_json::Value;
use shoal_client::consumer::{ConsumeConcurrentlyStatus, ConsumerConfig, MessageListener};
use shoal_client::lite_pull::LitePullConfig;
use shoal_client::{
    ClientConfig, ConsumeFromWhere, LitePullConsumer, LocalTransactionState, Message, MessageExt,
    Producer, PushConsumer, TransactionProducer,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{free_port, Dev, Group, Proc};

const BOOT: Duration = Duration::from_secs(180);
const T: Duration = Duration::from_secs(60);

/// RocketMQ's name server and broker processes (the broker is `dev.proc`).
struct JavaRocketMq {
    _namesrv: Proc,
    dev: Dev,
}

fn java_classpath() -> Option<String> {
    let cp = support::external::repo_root().join("target/external/rocketmq-broker5.classpath");
    let ok = Command::new("java")
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return None;
    }
    std::fs::read_to_string(cp)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// A broker port whose neighbours RocketMQ also binds (port - 2: fast remoting, port + 1: HA)
/// are free.
fn broker_port() -> u16 {
    loop {
        let p = free_port();
        if !(1026..=65000).contains(&p) {
            continue;
        }
        let free = |q: u16| std::net::TcpListener::bind(("0.0.0.0", q)).is_ok();
        if free(p) && free(p - 2) && free(p + 1) {
            return p;
        }
    }
}

fn java(dir: &Path, cp: &str, heap: &str, main: &str, args: &[&str], log: &str) -> Proc {
    let out = std::fs::File::create(dir.join(format!("{log}.out"))).unwrap();
    let err = out.try_clone().unwrap();
    let child = Command::new("java")
        .args([
            &format!("-Xms{heap}"),
            &format!("-Xmx{heap}"),
            "-XX:+UseG1GC",
            "-XX:-OmitStackTraceInFastThrow",
            &format!("-Duser.home={}", dir.display()),
            &format!("-Drocketmq.home.dir={}", dir.display()),
            "-cp",
            cp,
            main,
        ])
        .args(args)
        .env("ROCKETMQ_HOME", dir)
        .current_dir(dir)
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap();
    Proc { child }
}

fn start_rocketmq(cp: &str) -> JavaRocketMq {
    let mut dir = tempfile::tempdir().unwrap();
    if std::env::var_os("SHOAL_KEEP_TEST_DIRS").is_some() {
        dir.disable_cleanup(true);
        println!("RocketMQ's directory (kept): {}", dir.path().display());
    }
    let ns_port = free_port();
    let port = broker_port();
    let ns = format!("127.0.0.1:{ns_port}");
    std::fs::write(
        dir.path().join("namesrv.conf"),
        format!("listenPort={ns_port}\n"),
    )
    .unwrap();
    let store = dir.path().join("store");
    let conf = format!(
        "brokerClusterName=DefaultCluster\nbrokerName=broker-a\nbrokerId=0\n\
         listenPort={port}\nnamesrvAddr={ns}\nbrokerIP1=127.0.0.1\n\
         storePathRootDir={store}\nstorePathCommitLog={store}/commitlog\n\
         autoCreateTopicEnable=true\nautoCreateSubscriptionGroup=true\n\
         mappedFileSizeCommitLog=67108864\nmappedFileSizeConsumeQueue=600000\n\
         transactionCheckInterval=1000\ntransactionTimeOut=2000\n\
         messageDelayLevel=1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s\n\
         diskMaxUsedSpaceRatio=99\n",
        store = store.display()
    );
    std::fs::write(dir.path().join("broker.conf"), conf).unwrap();
    let namesrv = java(
        dir.path(),
        cp,
        "128m",
        "org.apache.rocketmq.namesrv.NamesrvStartup",
        &["-c", dir.path().join("namesrv.conf").to_str().unwrap()],
        "namesrv",
    );
    let broker = java(
        dir.path(),
        cp,
        "512m",
        "org.apache.rocketmq.broker.BrokerStartup",
        &["-c", dir.path().join("broker.conf").to_str().unwrap()],
        "broker",
    );
    let dev = Dev {
        proc: broker,
        namesrv: ns,
        http: String::new(),
        dir,
    };
    let started = Instant::now();
    loop {
        let out = dev.cmd(&["cluster", "list", "--json"]);
        if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("broker-a") {
            break;
        }
        assert!(
            started.elapsed() < BOOT,
            "RocketMQ did not come up within {BOOT:?}:\n{}\n{}",
            tail(&dev.dir.path().join("namesrv.out")),
            tail(&dev.dir.path().join("broker.out"))
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    println!(
        "RocketMQ 5.3.3 name server and broker up in {:?}",
        started.elapsed()
    );
    JavaRocketMq {
        _namesrv: namesrv,
        dev,
    }
}

fn tail(p: &PathBuf) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = s.lines().filter(|l| !l.contains("|-")).collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn ok(dev: &Dev, args: &[&str]) -> String {
    let out = dev.cmd(args);
    assert!(
        out.status.success(),
        "shoal {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn client_config(ns: &str) -> ClientConfig {
    ClientConfig {
        poll_namesrv_interval: Duration::from_millis(500),
        heartbeat_interval: Duration::from_secs(1),
        persist_offset_interval: Duration::from_millis(200),
        ..ClientConfig::new(ns)
    }
}

fn wait(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out after {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn compat_shoal_client_and_cli_against_rocketmq_broker() {
    let Some(cp) = java_classpath() else {
        support::external::skip(
            "java or target/external/rocketmq-broker5.classpath missing (run .ci/setup.d/20-java.sh)",
        );
        return;
    };
    let rmq = start_rocketmq(&cp);
    let dev = &rmq.dev;
    let ns = dev.namesrv.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();

    // Topics.
    let out = ok(dev, &["topic", "create", "RT", "--queues", "4"]);
    assert!(out.contains("4 queues"), "{out}");
    wait("RT routed", T, || {
        ok(dev, &["topic", "list"])
            .lines()
            .any(|l| l.trim() == "RT")
    });
    let route: Value = dev.json(&["topic", "route", "RT", "--json"]);
    assert!(route.to_string().contains("broker-a"), "{route}");

    // Produce and consume with a group: one member, a join, a leave.
    let first = support::send(dev, "RT", "a", 40);
    let mut g = Group::new("RG", "RT");
    g.join(dev, "m1");
    g.converge(dev, 4, T);
    g.wait_all(&first, T);
    g.join(dev, "m2");
    let join = g.converge(dev, 4, T);
    let second = support::send(dev, "RT", "b", 40);
    g.wait_all(&second, T);
    g.leave("m1");
    let leave = g.converge(dev, 4, T);
    let third = support::send(dev, "RT", "c", 40);
    g.wait_all(&third, T);
    let (_, dups) = g.tally();
    println!("join converged in {join:?}, leave in {leave:?}; {dups} duplicates (at least once)");

    // group progress (owners from the member's running info, through RocketMQ's broker).
    let p: Value = dev.json(&["group", "progress", "RG", "--json"]);
    let rows: Vec<&Value> = p["queues"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["topic"] == "RT")
        .collect();
    assert_eq!(rows.len(), 4);
    assert!(rows
        .iter()
        .all(|r| r["owner"].as_str().is_some_and(|o| o.ends_with("@m2"))));
    wait("lag 0", T, || {
        dev.json(&["group", "progress", "RG", "--json"])["totalLag"] == 0
    });

    // reset-offset with the member online: RocketMQ tells it; it consumes everything again.
    let before = g.seen.lock().unwrap().len();
    ok(
        dev,
        &[
            "group",
            "reset-offset",
            "RG",
            "--topic",
            "RT",
            "--to",
            "earliest",
        ],
    );
    wait("re-consumed after reset", T, || {
        g.seen.lock().unwrap().len() >= before + 120
    });
    g.leave("m2");

    // message get by offset id and by message id.
    let sent: Value = dev.json(&[
        "send", "RT", "--body", "findme", "--key", "k-find", "--json",
    ]);
    let offset_id = sent["offsetMsgId"].as_str().unwrap().to_string();
    let msg_id = sent["msgId"].as_str().unwrap().to_string();
    let got = ok(dev, &["message", "get", &offset_id]);
    assert!(got.contains("findme"), "{got}");
    let got = ok(dev, &["message", "get", &msg_id, "--topic", "RT"]);
    assert!(got.contains("findme"), "{got}");

    // Orderly: per-queue order under RocketMQ's queue locks, with binary request headers.
    ok(dev, &["topic", "create", "OT", "--queues", "2"]);
    wait("OT routed", T, || {
        ok(dev, &["topic", "list"])
            .lines()
            .any(|l| l.trim() == "OT")
    });
    support::send(dev, "OT", "o", 30);
    let out = Command::new(support::shoal())
        .args([
            "consume",
            "OT",
            "--group",
            "OG",
            "--orderly",
            "--from",
            "first",
            "--count",
            "30",
            "--json",
        ])
        .env("SHOAL_NAMESRV", &ns)
        // Every request of this consumer (heartbeat, LOCK_BATCH_MQ, pulls, offsets) goes with
        // RocketMQ's binary headers, which RocketMQ's broker decodes as Shoal's does.
        .env("SHOAL_SERIALIZE_TYPE", "rocketmq")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut per_queue: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        per_queue
            .entry(v["queue"].as_i64().unwrap())
            .or_default()
            .push(v["queueOffset"].as_i64().unwrap());
    }
    assert_eq!(per_queue.values().map(Vec::len).sum::<usize>(), 30);
    for offsets in per_queue.values() {
        assert!(
            offsets.windows(2).all(|w| w[0] < w[1]),
            "in order: {offsets:?}"
        );
    }

    rt.block_on(async {
        // Lite pull: assign, seek, poll, commit.
        let mut cfg = LitePullConfig::new("LG");
        cfg.client = client_config(&ns);
        cfg.auto_commit = false;
        let lite = LitePullConsumer::start(cfg).await.unwrap();
        let admin = shoal_client::AdminClient::new(vec![ns.clone()]);
        let route = admin.topic_route("OT").await.unwrap();
        let queues = route.publish_queues("OT");
        lite.assign(queues.clone()).await.unwrap();
        for q in &queues {
            lite.seek(q, 5).await.unwrap();
        }
        let mut got = Vec::new();
        let deadline = Instant::now() + T;
        while got.len() < 20 && Instant::now() < deadline {
            got.extend(lite.poll(Duration::from_millis(500)).await);
        }
        assert_eq!(
            got.len(),
            20,
            "30 messages in 2 queues, from offset 5 of each"
        );
        assert!(got.iter().all(|m| m.queue_offset >= 5));
        lite.commit_sync().await;
        for q in &queues {
            assert_eq!(lite.committed(q).await.unwrap(), Some(15));
        }
        lite.shutdown().await;
        admin.shutdown();

        // Retry to the DLQ (delay levels of 1 s in this broker.conf), then dlq list / resend.
        let mut c = ConsumerConfig::new("DG");
        c.client = client_config(&ns);
        c.consume_from_where = ConsumeFromWhere::ConsumeFromFirstOffset;
        c.subscriptions.insert("DT".into(), "*".into());
        c.max_reconsume_times = Some(1);
        let attempts = Arc::new(Mutex::new(0usize));
        let a2 = attempts.clone();
        let failing = PushConsumer::start(
            c,
            MessageListener::concurrently(move |_msgs: &[MessageExt], _ctx| {
                *a2.lock().unwrap() += 1;
                ConsumeConcurrentlyStatus::ReconsumeLater
            }),
        )
        .await
        .unwrap();
        let producer = Producer::builder("PG-DT")
            .client_config(client_config(&ns))
            .start()
            .await
            .unwrap();
        producer.send(Message::new("DT", "doomed")).await.unwrap();
        let deadline = Instant::now() + T;
        let mut listed = String::new();
        while Instant::now() < deadline {
            let out = Command::new(support::shoal())
                .args(["dlq", "list", "--group", "DG"])
                .env("SHOAL_NAMESRV", &ns)
                .output()
                .unwrap();
            listed = String::from_utf8_lossy(&out.stdout).into_owned();
            if listed.contains("doomed") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(listed.contains("doomed"), "in the DLQ: {listed}");
        assert!(
            *attempts.lock().unwrap() >= 2,
            "delivered, retried once, then dead"
        );
        failing.shutdown().await;

        // Transactions against RocketMQ's broker: commit, rollback, and a check-back. RocketMQ
        // 5.x writes op messages in batches (transactionOpBatchInterval, 3 s), so its check may
        // also ask about transactions already decided: the checker answers truthfully, as an
        // application's must.
        let checked = Arc::new(Mutex::new(BTreeSet::new()));
        let c2 = checked.clone();
        let tx = TransactionProducer::start(
            Producer::builder("PG-TX").client_config(client_config(&ns)),
            move |m: MessageExt| {
                let body = String::from_utf8_lossy(&m.body).into_owned();
                let state = if body == "tx-rollback" {
                    LocalTransactionState::RollbackMessage
                } else {
                    LocalTransactionState::CommitMessage
                };
                c2.lock().unwrap().insert(body);
                async move { state }
            },
        )
        .await
        .unwrap();
        for (body, state) in [
            ("tx-commit", LocalTransactionState::CommitMessage),
            ("tx-rollback", LocalTransactionState::RollbackMessage),
            ("tx-unknown", LocalTransactionState::Unknown),
        ] {
            let r = tx
                .send_in_transaction(Message::new("TT", body), move |_m, _r| async move { state })
                .await
                .unwrap();
            assert!(r.end_sent);
        }
        let (got, listener) = recorder();
        let mut c = ConsumerConfig::new("TG");
        c.client = client_config(&ns);
        c.consume_from_where = ConsumeFromWhere::ConsumeFromFirstOffset;
        c.subscriptions.insert("TT".into(), "*".into());
        let consumer = PushConsumer::start(c, listener).await.unwrap();
        let deadline = Instant::now() + T;
        while Instant::now() < deadline {
            let b = bodies(&got);
            if b.contains("tx-commit") && b.contains("tx-unknown") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let b = bodies(&got);
        let asked = checked.lock().unwrap().clone();
        assert!(
            b.contains("tx-commit") && b.contains("tx-unknown") && !b.contains("tx-rollback"),
            "consumed {b:?}; the broker asked about {asked:?}"
        );
        assert!(
            asked.contains("tx-unknown"),
            "the broker asked about {asked:?}"
        );
        consumer.shutdown().await;
        tx.shutdown().await;
        producer.shutdown().await;
    });

    // dlq resend: the dead message goes back to its topic, where it can be read by its new id.
    let out = ok(dev, &["dlq", "resend", "--group", "DG", "--json"]);
    let resent: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(resent.len(), 1, "{out}");
    assert_eq!(resent[0]["topic"], "DT", "{out}");
    let new_id = resent[0]["newOffsetMsgId"].as_str().unwrap();
    let got = ok(dev, &["message", "get", new_id]);
    assert!(got.contains("doomed"), "{got}");
    println!("Shoal client and CLI against RocketMQ 5.3.3: all checks passed");
}

fn recorder() -> (Arc<Mutex<Vec<MessageExt>>>, MessageListener) {
    let got: Arc<Mutex<Vec<MessageExt>>> = Arc::default();
    let g = got.clone();
    let listener = MessageListener::concurrently(move |msgs: &[MessageExt], _ctx| {
        g.lock().unwrap().extend(msgs.iter().cloned());
        ConsumeConcurrentlyStatus::ConsumeSuccess
    });
    (got, listener)
}

fn bodies(got: &Mutex<Vec<MessageExt>>) -> BTreeSet<String> {
    got.lock()
        .unwrap()
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect()
}
