//! Runs the built `shoal` binary as separate processes: a dev server, consumers that print JSON
//! lines, producers and admin commands. Everything on 127.0.0.1 with ports chosen at run time.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    unreachable_pub,
    reason = "test code: a failed unwrap is a failed test"
)]
#![allow(dead_code)]

pub mod cluster;
pub mod external;
pub mod kafka_wire;
pub mod proxy;
pub mod replicas;

use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The `shoal` binary the tests run: this build's, or the one `SHOAL_TEST_BIN` names (to run a
/// scenario against another build, e.g. a release binary when measuring).
pub fn shoal() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("SHOAL_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_shoal").to_string())
    })
}

/// A free port on 127.0.0.1, never one this process was given before (two servers on one port
/// fail with "Address already in use"), and below the system's ephemeral range: a port the
/// kernel hands out for ephemeral use can be taken by any outgoing connection of a test running
/// beside this one between this call and the server's bind (`tools/free_ports.py` does the same
/// for scripts). `SHOAL_TEST_PORTS=LOW-HIGH` confines the choice to that range (runs sharing a
/// machine each keep to their own).
pub fn free_port() -> u16 {
    use rand::Rng;
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let high = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768)
        .saturating_sub(1);
    let low = if high > 11_000 { 10_000 } else { 1024 };
    let (low, high) = std::env::var("SHOAL_TEST_PORTS")
        .ok()
        .and_then(|r| {
            let (l, h) = r.split_once('-')?;
            Some((l.trim().parse::<u16>().ok()?, h.trim().parse::<u16>().ok()?))
        })
        .filter(|(l, h)| l <= h)
        .unwrap_or((low, high));
    let mut rng = rand::thread_rng();
    loop {
        let port = rng.gen_range(low..=high);
        let mut given = GIVEN.lock().unwrap();
        if given.contains(&port) || std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        given.push(port);
        return port;
    }
}

/// True once the peer has closed `sock` (a read returns 0 or a reset).
pub fn closed_within(sock: &mut std::net::TcpStream, limit: Duration) -> bool {
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match std::io::Read::read(sock, &mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

/// A child process killed (SIGKILL) when dropped.
pub struct Proc {
    pub child: Child,
}

impl Proc {
    pub fn sigterm(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }

    pub fn sigkill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `limit` for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `shoal dev` process.
pub struct Dev {
    pub proc: Proc,
    pub namesrv: String,
    /// HTTP address (metrics, dashboard): `127.0.0.1:PORT`.
    pub http: String,
    pub dir: tempfile::TempDir,
}

impl Dev {
    /// `shoal dev` without the Kafka listener.
    pub fn start() -> Dev {
        Self::start_with(&["--no-kafka"])
    }

    /// `shoal dev` with the Kafka listener on a free port; returns its address too. Nothing
    /// has connected to the Kafka port yet: readiness is the HTTP port's, which `shoal dev`
    /// opens after the Kafka listener is bound.
    pub fn start_with_kafka() -> (Dev, String) {
        let port = free_port().to_string();
        let dev = Self::start_with(&["--kafka-port", &port]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&dev.http).is_err() {
            assert!(
                Instant::now() < deadline,
                "shoal dev's HTTP port did not open"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        (dev, format!("127.0.0.1:{port}"))
    }

    /// `shoal dev` on free ports, with `extra` arguments.
    pub fn start_with(extra: &[&str]) -> Dev {
        let dir = tempfile::tempdir().unwrap();
        let ns = free_port();
        let broker = free_port();
        let http = free_port();
        let child = Command::new(shoal())
            .args([
                "dev",
                "--namesrv-port",
                &ns.to_string(),
                "--broker-port",
                &broker.to_string(),
                "--http-port",
                &http.to_string(),
                "--data-dir",
                dir.path().join("data").to_str().unwrap(),
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log_sink("dev"))
            .spawn()
            .unwrap();
        let dev = Dev {
            proc: Proc { child },
            namesrv: format!("127.0.0.1:{ns}"),
            http: format!("127.0.0.1:{http}"),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = dev.cmd(&["cluster", "list", "--json"]);
            if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("broker-a") {
                break;
            }
            assert!(Instant::now() < deadline, "shoal dev did not come up");
            std::thread::sleep(Duration::from_millis(100));
        }
        dev
    }

    /// GET `path` from the dev server's HTTP port: (status, body).
    pub fn http_get(&self, path: &str) -> (u16, String) {
        http_request(&self.http, "GET", path, "")
    }

    /// Runs an admin/client command to completion.
    pub fn cmd(&self, args: &[&str]) -> Output {
        Command::new(shoal())
            .args(args)
            .env("SHOAL_NAMESRV", &self.namesrv)
            .output()
            .unwrap()
    }

    /// Runs a command that must end within `limit`: one that does not is killed and the test
    /// fails with what it printed (a hang is a failure, not a stuck test run).
    pub fn cmd_within(&self, args: &[&str], limit: Duration) -> Output {
        let mut child = Command::new(shoal())
            .args(args)
            .env("SHOAL_NAMESRV", &self.namesrv)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let read = |mut r: Box<dyn std::io::Read + Send>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = r.read_to_end(&mut buf);
                buf
            })
        };
        let out = read(Box::new(child.stdout.take().unwrap()));
        let err = read(Box::new(child.stderr.take().unwrap()));
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
        match status {
            Some(status) => Output {
                status,
                stdout,
                stderr,
            },
            None => panic!(
                "{args:?} did not end within {limit:?}; it printed:\n{}\n{}",
                String::from_utf8_lossy(&stdout),
                String::from_utf8_lossy(&stderr)
            ),
        }
    }

    /// Runs a command and parses its stdout as JSON.
    pub fn json(&self, args: &[&str]) -> Value {
        let out = self.cmd(args);
        assert!(
            out.status.success(),
            "{args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{args:?} printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Starts a background command with stdout piped.
    pub fn spawn(&self, args: &[&str]) -> Child {
        Command::new(shoal())
            .args(args)
            .env("SHOAL_NAMESRV", &self.namesrv)
            .stdout(Stdio::piped())
            .stderr(log_sink(&args.join(" ")))
            .spawn()
            .unwrap()
    }
}

/// Where a spawned process's stderr goes: a file in `SHOAL_TEST_LOG_DIR` when it is set (one
/// per process, named `tag` and a counter, to read after a failing run), or nowhere.
pub fn log_sink(tag: &str) -> Stdio {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let Some(dir) = std::env::var_os("SHOAL_TEST_LOG_DIR") else {
        return Stdio::null();
    };
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tag: String = tag
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let path = std::path::Path::new(&dir).join(format!("{n:03}-{tag}.log"));
    std::fs::File::create(path).map_or(Stdio::null(), Stdio::from)
}

/// One message as a consumer printed it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub consumer: String,
    pub msg_id: String,
    pub queue: i64,
    pub body: String,
    pub at: Instant,
}

/// Consumer processes of one group, and everything they printed.
pub struct Group {
    pub name: String,
    pub topic: String,
    pub members: BTreeMap<String, Proc>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl Group {
    pub fn new(name: &str, topic: &str) -> Group {
        Group {
            name: name.into(),
            topic: topic.into(),
            members: BTreeMap::new(),
            seen: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Starts a consumer process with instance name `member`.
    pub fn join(&mut self, dev: &Dev, member: &str) {
        let mut child = dev.spawn(&[
            "consume",
            &self.topic,
            "--group",
            &self.name,
            "--json",
            "--from",
            "first",
            "--instance",
            member,
        ]);
        let stdout = child.stdout.take().unwrap();
        let seen = self.seen.clone();
        let who = member.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                seen.lock().unwrap().push(Seen {
                    consumer: who.clone(),
                    msg_id: v["msgId"].as_str().unwrap_or_default().to_string(),
                    queue: v["queue"].as_i64().unwrap_or(-1),
                    body: v["body"].as_str().unwrap_or_default().to_string(),
                    at: Instant::now(),
                });
            }
        });
        self.members.insert(member.to_string(), Proc { child });
    }

    /// Stops a member gracefully (SIGTERM) and waits for it to exit.
    pub fn leave(&mut self, member: &str) {
        if let Some(mut p) = self.members.remove(member) {
            p.sigterm();
            assert!(
                p.wait_exit(Duration::from_secs(20)),
                "{member} did not stop on SIGTERM"
            );
        }
    }

    /// Kills a member (SIGKILL): no hand-over at all.
    pub fn crash(&mut self, member: &str) {
        if let Some(mut p) = self.members.remove(member) {
            p.sigkill();
        }
    }

    /// Polls `shoal group progress --json` until every queue of the topic has exactly one owner
    /// and the owners are exactly the live members (when there are at most as many members as
    /// queues). Returns the time it took, or panics after `limit`.
    pub fn converge(&self, dev: &Dev, queues: usize, limit: Duration) -> Duration {
        let start = Instant::now();
        let live: Vec<&String> = self.members.keys().collect();
        loop {
            let out = dev.cmd(&["group", "progress", &self.name, "--json"]);
            if out.status.success() {
                if let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) {
                    if converged(&v, &self.topic, queues, &live) {
                        return start.elapsed();
                    }
                }
            }
            assert!(
                start.elapsed() < limit,
                "group {} did not converge within {limit:?} with members {live:?}: {}",
                self.name,
                String::from_utf8_lossy(&out.stdout)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Distinct messages seen, and how many deliveries were duplicates.
    pub fn tally(&self) -> (HashMap<String, usize>, usize) {
        let seen = self.seen.lock().unwrap();
        let mut counts: HashMap<String, usize> = HashMap::new();
        for s in seen.iter() {
            *counts.entry(s.body.clone()).or_default() += 1;
        }
        let dups = counts.values().map(|c| c - 1).sum();
        (counts, dups)
    }

    /// Waits until every body in `expected` has been seen at least once.
    pub fn wait_all(&self, expected: &[String], limit: Duration) {
        let start = Instant::now();
        loop {
            let (counts, _) = self.tally();
            let missing: Vec<&String> = expected
                .iter()
                .filter(|b| !counts.contains_key(*b))
                .collect();
            if missing.is_empty() {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "{} messages never consumed, e.g. {:?}",
                missing.len(),
                missing.iter().take(5).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn converged(v: &Value, topic: &str, queues: usize, live: &[&String]) -> bool {
    let Some(rows) = v["queues"].as_array() else {
        return false;
    };
    let rows: Vec<&Value> = rows.iter().filter(|r| r["topic"] == topic).collect();
    if rows.len() != queues {
        return false;
    }
    let mut owners_seen = std::collections::BTreeSet::new();
    for r in rows {
        let Some(owner) = r["owner"].as_str() else {
            return false;
        };
        if owner.contains(',') {
            return false;
        }
        let Some(m) = live.iter().find(|m| owner.ends_with(&format!("@{m}"))) else {
            return false;
        };
        owners_seen.insert(m.to_string());
    }
    // Every live member owns something when there are enough queues.
    live.len() > queues || owners_seen.len() == live.len()
}

/// Sends `count` messages with bodies `<prefix>-<i>` (synchronously, through the CLI).
pub fn send(dev: &Dev, topic: &str, prefix: &str, count: usize) -> Vec<String> {
    let body = format!("{prefix}-{{i}}");
    let out = dev.cmd(&[
        "send",
        topic,
        "--body",
        &body,
        "--count",
        &count.to_string(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "send failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

/// Starts a producer that sends one message every `interval_ms` until killed.
pub fn steady_producer(
    dev: &Dev,
    topic: &str,
    prefix: &str,
    count: usize,
    interval_ms: u64,
) -> Proc {
    let body = format!("{prefix}-{{i}}");
    let child = Command::new(shoal())
        .args([
            "send",
            topic,
            "--body",
            &body,
            "--count",
            &count.to_string(),
            "--interval-ms",
            &interval_ms.to_string(),
            "--json",
        ])
        .env("SHOAL_NAMESRV", &dev.namesrv)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Proc { child }
}

pub fn data_dir(dev: &Dev) -> PathBuf {
    dev.dir.path().join("data")
}

/// One HTTP/1.1 request to `addr` with `Connection: close`: (status, body).
pub fn http_request(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    http_exchange(addr, method, path, body, "*/*")
}

/// GET with an `Accept` header.
pub fn http_request_accept(addr: &str, path: &str, accept: &str) -> (u16, String) {
    http_exchange(addr, "GET", path, "", accept)
}

fn http_exchange(addr: &str, method: &str, path: &str, body: &str, accept: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    (status, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The value of the Prometheus sample `series` (name with labels, exactly as printed).
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}
