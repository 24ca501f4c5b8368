//! A cluster of separate `shoal` processes on 127.0.0.1: one name server and brokers started,
//! stopped (SIGTERM) and killed (SIGKILL) one by one; consumers and producers whose every line
//! is kept with the time it was printed (which broker each message went to and came from).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    unreachable_pub,
    reason = "test code: a failed unwrap is a failed test"
)]

use super::{free_port, log_sink, shoal, Dev, Group, Proc, Seen};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running broker process.
pub struct BrokerProc {
    pub proc: Proc,
    pub addr: String,
}

/// A name server process (as `dev`, so the helpers that take a [`Dev`] run against it) and
/// broker processes by name.
pub struct Cluster {
    pub dev: Dev,
    pub brokers: BTreeMap<String, BrokerProc>,
}

impl Cluster {
    /// A name server; `config` is the TOML text of `shoal namesrv --config`, if any.
    pub fn start(config: Option<&str>) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let mut cmd = Command::new(shoal());
        cmd.args(["namesrv", "--listen", &addr]);
        if let Some(text) = config {
            let path = dir.path().join("namesrv.toml");
            std::fs::write(&path, text).unwrap();
            cmd.args(["--config", path.to_str().unwrap()]);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log_sink("namesrv"))
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "the name server did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        Cluster {
            dev: Dev {
                proc: Proc { child },
                namesrv: addr,
                http: String::new(),
                dir,
            },
            brokers: BTreeMap::new(),
        }
    }

    /// Starts broker `name` (its data under the cluster's directory, kept across restarts)
    /// and waits until the name server lists it.
    pub fn start_broker(&mut self, name: &str) {
        self.start_broker_with(name, &[]);
    }

    /// [`Cluster::start_broker`] with `extra` arguments to `shoal broker`.
    pub fn start_broker_with(&mut self, name: &str, extra: &[&str]) {
        let addr = match self.brokers.get(name) {
            Some(b) => b.addr.clone(),
            None => format!("127.0.0.1:{}", free_port()),
        };
        let data = self.dev.dir.path().join(name);
        let child = Command::new(shoal())
            .args([
                "broker",
                "--listen",
                &addr,
                "--namesrv",
                &self.dev.namesrv,
                "--data-dir",
                data.to_str().unwrap(),
                "--broker-name",
                name,
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log_sink(name))
            .spawn()
            .unwrap();
        self.brokers.insert(
            name.to_string(),
            BrokerProc {
                proc: Proc { child },
                addr: addr.clone(),
            },
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = self.dev.cmd(&["cluster", "list", "--json"]);
            if out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&addr) {
                return;
            }
            assert!(Instant::now() < deadline, "broker {name} did not register");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM to broker `name` and wait for it to exit.
    pub fn stop_broker(&mut self, name: &str) {
        let b = self.brokers.get_mut(name).expect("no such broker");
        b.proc.sigterm();
        assert!(
            b.proc.wait_exit(Duration::from_secs(20)),
            "broker {name} did not stop on SIGTERM"
        );
    }

    /// Runs a command that must succeed, and parses its standard output as JSON.
    pub fn json(&self, args: &[&str]) -> Value {
        self.dev.json(args)
    }

    /// Max offsets of `topic`'s queues by (broker, queue id).
    pub fn max_offsets(&self, topic: &str) -> BTreeMap<(String, i64), i64> {
        let v = self.json(&["topic", "status", topic, "--json"]);
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    (
                        r["broker"].as_str().unwrap().to_string(),
                        r["queue"].as_i64().unwrap(),
                    ),
                    r["maxOffset"].as_i64().unwrap(),
                )
            })
            .collect()
    }
}

/// A consumed (or sent) message: when, on which broker and queue, its body, and who consumed
/// it (empty for a send).
#[derive(Debug, Clone)]
pub struct Line {
    pub at: Instant,
    pub broker: String,
    pub queue: i64,
    pub body: String,
    pub member: String,
    /// A consumed message's `atUs` (when the consumer's listener got it, µs since the epoch),
    /// its queue offset; 0 and -1 for a send.
    pub at_us: u64,
    pub offset: i64,
}

/// A [`Group`] whose consumers' lines also keep the broker each message came from.
pub struct TrackedGroup {
    pub group: Group,
    pub lines: Arc<Mutex<Vec<Line>>>,
}

impl TrackedGroup {
    pub fn new(name: &str, topic: &str) -> TrackedGroup {
        TrackedGroup {
            group: Group::new(name, topic),
            lines: Arc::default(),
        }
    }

    /// Starts a consumer process with instance name `member` and `extra` arguments.
    pub fn join(&mut self, dev: &Dev, member: &str, extra: &[&str]) {
        let g = &mut self.group;
        let mut args = vec![
            "consume",
            &g.topic,
            "--group",
            &g.name,
            "--json",
            "--from",
            "first",
            "--instance",
            member,
        ];
        args.extend_from_slice(extra);
        let mut child = dev.spawn(&args);
        let stdout = child.stdout.take().unwrap();
        let (seen, lines) = (g.seen.clone(), self.lines.clone());
        let who = member.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let at = Instant::now();
                let body = v["body"].as_str().unwrap_or_default().to_string();
                lines.lock().unwrap().push(Line {
                    at,
                    broker: v["broker"].as_str().unwrap_or_default().to_string(),
                    queue: v["queue"].as_i64().unwrap_or(-1),
                    body: body.clone(),
                    member: who.clone(),
                    at_us: v["atUs"].as_u64().unwrap_or_default(),
                    offset: v["queueOffset"].as_i64().unwrap_or(-1),
                });
                seen.lock().unwrap().push(Seen {
                    consumer: who.clone(),
                    msg_id: v["msgId"].as_str().unwrap_or_default().to_string(),
                    queue: v["queue"].as_i64().unwrap_or(-1),
                    body,
                    at,
                });
            }
        });
        g.members.insert(member.to_string(), Proc { child });
    }

    /// The first message consumed from `broker` at or after `since`.
    pub fn first_from(&self, broker: &str, since: Instant) -> Option<Instant> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.broker == broker && l.at >= since)
            .map(|l| l.at)
            .min()
    }
}

/// A `shoal send` process sending `<prefix>-<i>` every `interval_ms`; every acknowledged send
/// is kept (its broker, and when it was printed), every failed one counted.
pub struct SteadyProducer {
    pub proc: Proc,
    pub sent: Arc<Mutex<Vec<Line>>>,
    pub failed: Arc<Mutex<Vec<String>>>,
}

impl SteadyProducer {
    pub fn start(dev: &Dev, topic: &str, prefix: &str, interval_ms: u64) -> SteadyProducer {
        let body = format!("{prefix}-{{i}}");
        let mut child = Command::new(shoal())
            .args([
                "send",
                topic,
                "--body",
                &body,
                "--count",
                "1000000",
                "--interval-ms",
                &interval_ms.to_string(),
                "--json",
            ])
            .env("SHOAL_NAMESRV", &dev.namesrv)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let sent = Arc::<Mutex<Vec<Line>>>::default();
        let failed = Arc::<Mutex<Vec<String>>>::default();
        let stdout = child.stdout.take().unwrap();
        let s = Arc::clone(&sent);
        let prefix = prefix.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                // The message number the body was made from (failed sends print no line).
                let Some(i) = v["n"].as_u64() else { continue };
                s.lock().unwrap().push(Line {
                    at: Instant::now(),
                    broker: v["broker"].as_str().unwrap_or_default().to_string(),
                    queue: v["queue"].as_i64().unwrap_or(-1),
                    body: format!("{prefix}-{i}"),
                    member: String::new(),
                    at_us: 0,
                    offset: v["queueOffset"].as_i64().unwrap_or(-1),
                });
            }
        });
        let stderr = child.stderr.take().unwrap();
        let f = Arc::clone(&failed);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("not sent") {
                    f.lock().unwrap().push(line);
                }
            }
        });
        SteadyProducer {
            proc: Proc { child },
            sent,
            failed,
        }
    }

    /// The first send acknowledged by `broker` at or after `since`.
    pub fn first_to(&self, broker: &str, since: Instant) -> Option<Instant> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.broker == broker && l.at >= since)
            .map(|l| l.at)
            .min()
    }

    /// Sends acknowledged by `broker` at or after `since`.
    pub fn count_to(&self, broker: &str, since: Instant) -> usize {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.broker == broker && l.at >= since)
            .count()
    }

    /// Stops sending; returns the bodies acknowledged.
    pub fn stop(&mut self) -> Vec<String> {
        self.proc.sigkill();
        // The reader thread drains what was printed before the kill.
        std::thread::sleep(Duration::from_millis(200));
        self.sent
            .lock()
            .unwrap()
            .iter()
            .map(|l| l.body.clone())
            .collect()
    }
}
