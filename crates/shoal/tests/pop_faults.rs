//! POP consumption under faults, with real processes: consumers (this test binary re-run as a
//! child, a `PopConsumer` that receives, prints, acks and prints the ack) are killed with
//! SIGKILL while they hold leases, and the broker (`shoal dev`) is killed with SIGKILL and
//! restarted on the same ports and data mid-run, with messages sent before and after.
//!
//! Checked from what the consumers printed (wall-clock milliseconds, one machine):
//! - none lost: every message sent is delivered and acknowledged (an ack whose answer was lost
//!   in the broker's crash counts as delivered, and is reported);
//! - acknowledged at most once: no message has two accepted acks;
//! - nothing delivered after its ack: no receive asked after a message's accepted ack returns
//!   that message;
//! - redeliveries counted: the leases of the killed consumers lapse and their messages come
//!   again with a higher delivery attempt, and the broker's group view counts redeliveries.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::{free_port, shoal, Proc};

const CHILD_ENV: &str = "SHOAL_POP_FAULT_CONSUMER";
const TOPIC: &str = "PopFaults";
const GROUP: &str = "pop-faults";
/// Messages sent before the broker's restart, and again after it.
const HALF: usize = 1000;
/// The consumers' lease: short, so the killed consumers' messages come back within the run.
const INVISIBLE: Duration = Duration::from_secs(3);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The child: a POP consumer of `TOPIC` that prints `R <asked ms> <body> <attempt>` for each
/// message received (asked: when the pop was sent), `S <body>` before it sends the message's
/// ack, then `A <acked ms> <body>` once the ack is accepted, `X <body> refused` when the broker
/// refused it, or `X <body> doubt` when its answer never came. Runs until killed.
fn consume(namesrv: &str) {
    use shoal_client::pop::{PopConsumer, PopConsumerConfig};
    use shoal_client::ClientError;
    // The test harness has printed `test NAME ... ` without a newline: end that line.
    println!();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut config = PopConsumerConfig::new(GROUP, TOPIC);
        config.client.namesrv_addrs = vec![namesrv.to_string()];
        config.client.rpc_timeout = Duration::from_secs(2);
        config.invisible = INVISIBLE;
        config.poll = Duration::from_secs(1);
        config.batch = 8;
        config.from_first = true;
        let consumer = PopConsumer::new(config).unwrap();
        let mut brokers = Vec::new();
        loop {
            if brokers.is_empty() {
                brokers = consumer.brokers().await.unwrap_or_default();
                if brokers.is_empty() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
            for (name, addr) in &brokers {
                let asked = now_ms();
                let batch = match consumer.receive(name, addr, 8).await {
                    Ok(b) => b,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                };
                for m in batch {
                    let body = String::from_utf8_lossy(&m.message.body).into_owned();
                    println!("R {asked} {body} {}", m.attempt);
                    // Some work, so that a kill finds leased messages in hand.
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    println!("S {body}");
                    match consumer.ack(&m).await {
                        Ok(()) => println!("A {} {body}", now_ms()),
                        Err(ClientError::Server { .. }) => println!("X {body} refused"),
                        Err(_) => println!("X {body} doubt"),
                    }
                }
            }
        }
    });
}

/// What the consumers printed, in the order it was read.
#[derive(Default)]
struct Log {
    lines: Vec<(usize, String)>,
}

/// One message's story, from the consumers' lines.
#[derive(Debug, Default)]
struct Story {
    /// Deliveries: (pop asked at ms, attempt).
    deliveries: Vec<(u64, u32)>,
    /// Accepted acks (at ms).
    acks: Vec<u64>,
    /// Acks sent.
    sent: usize,
    /// Acks refused.
    refused: usize,
}

impl Story {
    /// An ack was sent whose answer never came (its consumer or the broker was killed):
    /// the broker may or may not have taken it.
    fn in_doubt(&self) -> bool {
        self.sent > self.acks.len() + self.refused
    }
}

impl Log {
    fn stories(&self) -> HashMap<&str, Story> {
        let mut out: HashMap<&str, Story> = HashMap::new();
        for (_, l) in &self.lines {
            let f: Vec<&str> = l.split(' ').collect();
            match (f[0], f.len()) {
                ("R", 4) => out
                    .entry(f[2])
                    .or_default()
                    .deliveries
                    .push((f[1].parse().unwrap(), f[3].parse().unwrap())),
                ("S", 2) => out.entry(f[1]).or_default().sent += 1,
                ("A", 3) => out
                    .entry(f[2])
                    .or_default()
                    .acks
                    .push(f[1].parse().unwrap()),
                ("X", 3) if f[2] == "refused" => out.entry(f[1]).or_default().refused += 1,
                ("X", 3) => {}
                _ => panic!("unexpected consumer line {l:?}"),
            }
        }
        out
    }

    fn acked(&self) -> usize {
        self.lines
            .iter()
            .filter(|(_, l)| l.starts_with("A "))
            .count()
    }

    /// Whether consumer `c` holds a message under lease that it has not begun to ack.
    fn holds(&self, c: usize) -> bool {
        let mut open = 0i64;
        for (who, l) in &self.lines {
            if *who == c {
                if l.starts_with("R ") {
                    open += 1;
                } else if l.starts_with("S ") {
                    open -= 1;
                }
            }
        }
        open > 0
    }
}

struct Consumers {
    exe: std::path::PathBuf,
    namesrv: String,
    log: Arc<Mutex<Log>>,
    procs: Vec<Option<Proc>>,
}

impl Consumers {
    fn spawn(&mut self) -> usize {
        let id = self.procs.len();
        let mut child = Command::new(&self.exe)
            .args([
                "--exact",
                "pop_leases_survive_killed_consumers_and_a_broker_restart",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_ENV, &self.namesrv)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let log = self.log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if ["R ", "S ", "A ", "X "].iter().any(|p| line.starts_with(p)) {
                    log.lock().unwrap().lines.push((id, line));
                }
            }
        });
        self.procs.push(Some(Proc { child }));
        id
    }

    /// Kills consumer `c` with SIGKILL once it holds a leased message it has not answered.
    fn kill_holding(&mut self, c: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.log.lock().unwrap().holds(c) {
            assert!(
                Instant::now() < deadline,
                "consumer {c} never held a message: {}",
                {
                    let l = self.log.lock().unwrap();
                    let mut per: BTreeMap<usize, usize> = BTreeMap::new();
                    for (who, _) in &l.lines {
                        *per.entry(*who).or_default() += 1;
                    }
                    format!("lines per consumer {per:?}, {} acked", l.acked())
                }
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(mut p) = self.procs[c].take() {
            p.sigkill();
        }
    }
}

/// `shoal dev` on fixed ports and data directory, so that it can be killed and started again.
struct Broker {
    args: Vec<String>,
    log: std::path::PathBuf,
    namesrv: String,
    proc: Option<Proc>,
}

impl Broker {
    fn new(dir: &std::path::Path) -> Broker {
        let ns = free_port();
        let args = vec![
            "dev".to_string(),
            "--namesrv-port".into(),
            ns.to_string(),
            "--broker-port".into(),
            free_port().to_string(),
            "--data-dir".into(),
            dir.join("data").to_str().unwrap().into(),
            "--no-http".into(),
            "--no-kafka".into(),
            "--no-grpc".into(),
        ];
        let _ = std::fs::create_dir_all(dir);
        let mut b = Broker {
            args,
            log: dir.join("broker.log"),
            namesrv: format!("127.0.0.1:{ns}"),
            proc: None,
        };
        b.start();
        b
    }

    fn cmd(&self, args: &[&str]) -> std::process::Output {
        Command::new(shoal())
            .args(args)
            .env("SHOAL_NAMESRV", &self.namesrv)
            .output()
            .unwrap()
    }

    fn start(&mut self) {
        // The broker's log, for a failure's message.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(shoal())
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.proc = Some(Proc { child });
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.cmd(&["cluster", "list", "--json"]);
            if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("broker-a") {
                break;
            }
            assert!(Instant::now() < deadline, "shoal dev did not come up");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn send(&self, prefix: &str, count: usize) -> Vec<String> {
        let body = format!("{prefix}-{{i}}");
        let out = self.cmd(&[
            "send",
            TOPIC,
            "--body",
            &body,
            "--count",
            &count.to_string(),
        ]);
        assert!(
            out.status.success(),
            "send failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (0..count).map(|i| format!("{prefix}-{i}")).collect()
    }
}

fn wait_acked(log: &Mutex<Log>, at_least: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let n = log.lock().unwrap().acked();
        if n >= at_least {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {n} of {at_least} messages acknowledged within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn pop_leases_survive_killed_consumers_and_a_broker_restart() {
    if let Ok(namesrv) = std::env::var(CHILD_ENV) {
        consume(&namesrv);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::new(dir.path());
    let o = broker.cmd(&["topic", "create", TOPIC, "--queues", "4"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut sent = broker.send("before", HALF);

    let log = Arc::new(Mutex::new(Log::default()));
    let mut consumers = Consumers {
        exe: std::env::current_exe().unwrap(),
        namesrv: broker.namesrv.clone(),
        log: log.clone(),
        procs: Vec::new(),
    };
    for _ in 0..3 {
        consumers.spawn();
    }
    let limit = Duration::from_secs(60);

    // A consumer killed while it holds leases; another takes its place.
    wait_acked(&log, HALF / 5, limit);
    consumers.kill_holding(0);
    consumers.spawn();

    // The broker killed while consumers hold leases and acks are in flight, then restarted
    // on its data; more messages after it.
    wait_acked(&log, HALF / 2, limit);
    consumers.kill_holding(1);
    broker.proc.take().unwrap().sigkill();
    std::thread::sleep(Duration::from_millis(500));
    broker.start();
    consumers.spawn();
    sent.extend(broker.send("after", HALF));

    // Another consumer killed holding leases after the restart.
    wait_acked(&log, HALF + HALF / 4, limit);
    consumers.kill_holding(2);
    consumers.spawn();

    // Every message acknowledged, or with an ack whose answer was lost to a kill, then past
    // a lease and more, so that a wrong redelivery would show.
    let deadline = Instant::now() + limit;
    loop {
        let l = log.lock().unwrap();
        let stories = l.stories();
        let missing: Vec<&String> = sent
            .iter()
            .filter(|b| {
                stories
                    .get(b.as_str())
                    .is_none_or(|s| s.acks.is_empty() && !s.in_doubt())
            })
            .collect();
        if missing.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            let seen: Vec<&(usize, String)> = l
                .lines
                .iter()
                .filter(|(_, x)| {
                    missing
                        .iter()
                        .any(|m| x.split(' ').any(|w| w == m.as_str()))
                })
                .collect();
            let o = broker.cmd(&["group", "describe", GROUP, "--json"]);
            if std::env::var_os("SHOAL_KEEP_TEST_DIRS").is_some() {
                eprintln!("kept {}", dir.keep().display());
            }
            let log = std::fs::read_to_string(&broker.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            panic!(
                "{} messages lost (never acknowledged, no ack in doubt): {missing:?}; their \
                 lines: {seen:?}; group: {}; broker log (last lines first):\n{}",
                missing.len(),
                String::from_utf8_lossy(&o.stdout),
                tail.join("\n")
            );
        }
        drop(l);
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(INVISIBLE * 2);
    let describe = broker.cmd(&["group", "describe", GROUP, "--json"]);
    for p in consumers.procs.iter_mut().flatten() {
        p.sigkill();
    }

    let log = log.lock().unwrap();
    let stories = log.stories();
    let sent_set: HashSet<&str> = sent.iter().map(String::as_str).collect();
    let unknown: Vec<&&str> = stories.keys().filter(|b| !sent_set.contains(**b)).collect();
    assert!(unknown.is_empty(), "delivered but never sent: {unknown:?}");
    let lost: Vec<&&str> = sent_set
        .iter()
        .filter(|b| stories.get(**b).is_none_or(|s| s.deliveries.is_empty()))
        .collect();
    assert!(lost.is_empty(), "never delivered: {lost:?}");
    let twice: BTreeMap<&&str, &Story> = stories.iter().filter(|(_, s)| s.acks.len() > 1).collect();
    assert!(twice.is_empty(), "acknowledged more than once: {twice:?}");
    let mut after_ack = Vec::new();
    for (body, s) in &stories {
        if let Some(&acked) = s.acks.first() {
            after_ack.extend(
                s.deliveries
                    .iter()
                    .filter(|(asked, _)| *asked > acked)
                    .map(|d| (*body, *d, acked)),
            );
        }
    }
    assert!(
        after_ack.is_empty(),
        "delivered again after an accepted ack (body, (asked ms, attempt), acked ms): {after_ack:?}"
    );
    let deliveries: Vec<&(u64, u32)> = stories.values().flat_map(|s| &s.deliveries).collect();
    let acked = stories.values().filter(|s| !s.acks.is_empty()).count();
    let doubt = stories.values().filter(|s| s.acks.is_empty()).count();
    let refused: usize = stories.values().map(|s| s.refused).sum();
    let redelivered = deliveries
        .iter()
        .filter(|(_, attempt)| *attempt > 1)
        .count();
    let delivered = deliveries.len();
    assert!(
        redelivered > 0,
        "the killed consumers' leased messages came again"
    );
    assert!(
        describe.status.success(),
        "{}",
        String::from_utf8_lossy(&describe.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&describe.stdout).unwrap();
    assert_eq!(v["pop"]["inflight"], 0, "{v}");
    assert!(v["pop"]["redeliveries"].as_u64().unwrap_or(0) > 0, "{v}");
    eprintln!(
        "pop faults: {} sent, {delivered} deliveries ({redelivered} with attempt > 1), {acked} \
         acknowledged, {doubt} only with an ack in doubt (its answer lost to a kill), {refused} \
         acks refused (lapsed leases), broker: {}",
        sent.len(),
        v["pop"]
    );
}
