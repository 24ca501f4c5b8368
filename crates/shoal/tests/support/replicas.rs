//! A replicated broker group as separate `shoal` processes on 127.0.0.1 (ports chosen at run
//! time): one name server, one or three controller voters (`shoal controller`, each with its
//! own data directory, so a restarted voter keeps its log), and three brokers of [`GROUP`]
//! with `--controller`, each reaching every voter through a TCP proxy the test controls
//! ([`Replicas::start_groups`]: three brokers of each of several groups). A steady producer and
//! a tracked consumer group put it under load ([`under_load`]).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    unreachable_pub,
    reason = "test code: a failed unwrap is a failed test"
)]

use super::cluster::{Cluster, SteadyProducer, TrackedGroup};
use super::proxy::Proxy;
use super::{free_port, log_sink, shoal, Proc};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long any wait for the group may take.
pub const LIMIT: Duration = Duration::from_secs(60);
/// The topic the load goes to.
pub const TOPIC: &str = "Replicated";
/// The broker group.
pub const GROUP: &str = "broker-a";

/// One controller voter: its address, data directory and process (none while down).
pub struct Voter {
    pub addr: String,
    pub dir: PathBuf,
    pub proc: Option<Proc>,
}

/// The processes of one replicated group.
pub struct Replicas {
    pub cluster: Cluster,
    /// Voter `i` has Raft id `i + 1`.
    pub voters: Vec<Voter>,
    /// Each broker's listen address, data directory and process (none while down).
    pub brokers: Vec<(String, PathBuf, Option<Proc>)>,
    /// Each broker's group: brokers `3 * g .. 3 * g + 3` are those of `groups[g]`.
    pub groups: Vec<String>,
    /// Each broker's links to the voters, one proxy per voter.
    pub links: Vec<Vec<Proxy>>,
    /// With [`Replicas::start_with_peer_proxies`]: a proxy in front of each broker, which it
    /// advertises as its replication address (`--replication-addr`), so every replication
    /// message to broker `i` goes through `peers[i]`. Empty otherwise.
    pub peers: Vec<Proxy>,
    /// With [`Replicas::start_with_kafka`]: each broker's Kafka listener address. Empty
    /// otherwise.
    pub kafka: Vec<String>,
    /// More arguments for every broker.
    extra: Vec<String>,
    /// With [`Replicas::start_on_small_disks`]: the size of each broker's disk, a tmpfs
    /// mounted on its data directory in a mount namespace of its own (gone with the process).
    disk_bytes: Option<u64>,
}

impl Replicas {
    /// One voter, brokers with default settings.
    pub fn start() -> Replicas {
        Self::start_with(1, |_| Vec::new())
    }

    /// `voters` controller voters, brokers started with the arguments `extra` gives (given the
    /// cluster's directory).
    pub fn start_with(voters: usize, extra: impl FnOnce(&Path) -> Vec<String>) -> Replicas {
        Self::start_all(voters, false, false, extra)
    }

    /// One voter, three brokers of each group of `groups` (brokers `3 * g .. 3 * g + 3` are
    /// those of `groups[g]`), with default settings.
    pub fn start_groups(groups: &[&str]) -> Replicas {
        Self::start_in_groups(groups, 1, false, false, |_| Vec::new())
    }

    /// One voter, every broker with a Kafka listener ([`Replicas::kafka`]).
    pub fn start_with_kafka() -> Replicas {
        Self::start_all(1, false, true, |_| Vec::new())
    }

    /// [`Replicas::start_with`], every broker reached by the others through a proxy of
    /// [`Replicas::peers`].
    pub fn start_with_peer_proxies(
        voters: usize,
        extra: impl FnOnce(&Path) -> Vec<String>,
    ) -> Replicas {
        Self::start_all(voters, true, false, extra)
    }

    /// One voter, each broker's data directory a disk of `bytes` of its own (a tmpfs in the
    /// broker's own mount namespace, through `unshare -m`: root only). `None` when this
    /// machine cannot do that.
    pub fn start_on_small_disks(bytes: u64) -> Option<Replicas> {
        let probe = Command::new("unshare")
            .args(["-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"])
            .status();
        if !probe.is_ok_and(|s| s.success()) {
            return None;
        }
        let mut r =
            Self::start_in_groups_with(&[GROUP], 1, false, false, Some(bytes), |_| Vec::new());
        for i in 0..r.brokers.len() {
            r.start_broker(i);
        }
        Some(r)
    }

    /// The path, as this process sees it, of `name` in broker `i`'s data directory (inside its
    /// mount namespace when it has a disk of its own).
    pub fn in_data_dir(&self, i: usize, name: &str) -> PathBuf {
        let (_, dir, proc) = &self.brokers[i];
        match (self.disk_bytes, proc) {
            (Some(_), Some(p)) => PathBuf::from(format!("/proc/{}/root", p.child.id()))
                .join(dir.strip_prefix("/").unwrap())
                .join(name),
            _ => dir.join(name),
        }
    }

    fn start_all(
        voters: usize,
        peer_proxies: bool,
        kafka: bool,
        extra: impl FnOnce(&Path) -> Vec<String>,
    ) -> Replicas {
        Self::start_in_groups(&[GROUP], voters, peer_proxies, kafka, extra)
    }

    fn start_in_groups(
        groups: &[&str],
        voters: usize,
        peer_proxies: bool,
        kafka: bool,
        extra: impl FnOnce(&Path) -> Vec<String>,
    ) -> Replicas {
        let mut r = Self::start_in_groups_with(groups, voters, peer_proxies, kafka, None, extra);
        for i in 0..r.brokers.len() {
            r.start_broker(i);
        }
        r
    }

    /// The processes but the brokers (their voters started).
    fn start_in_groups_with(
        groups: &[&str],
        voters: usize,
        peer_proxies: bool,
        kafka: bool,
        disk_bytes: Option<u64>,
        extra: impl FnOnce(&Path) -> Vec<String>,
    ) -> Replicas {
        let n = 3 * groups.len();
        let cluster = Cluster::start(None);
        let extra = extra(cluster.dev.dir.path());
        let voters: Vec<Voter> = (0..voters)
            .map(|i| Voter {
                addr: format!("127.0.0.1:{}", free_port()),
                dir: cluster.dev.dir.path().join(format!("controller-{}", i + 1)),
                proc: None,
            })
            .collect();
        let links = (0..n)
            .map(|_| voters.iter().map(|v| Proxy::start(&v.addr)).collect())
            .collect();
        let brokers: Vec<(String, PathBuf, Option<Proc>)> = (0..n)
            .map(|i| {
                // The first group's directories keep their names of a one-group cluster.
                let dir = match i / 3 {
                    0 => format!("replica-{i}"),
                    g => format!("{}-replica-{}", groups[g], i % 3),
                };
                (
                    format!("127.0.0.1:{}", free_port()),
                    cluster.dev.dir.path().join(dir),
                    None,
                )
            })
            .collect();
        let peers = match peer_proxies {
            true => brokers.iter().map(|b| Proxy::start(&b.0)).collect(),
            false => Vec::new(),
        };
        let kafka = match kafka {
            true => (0..n)
                .map(|_| format!("127.0.0.1:{}", free_port()))
                .collect(),
            false => Vec::new(),
        };
        let mut r = Replicas {
            brokers,
            groups: (0..n).map(|i| groups[i / 3].to_string()).collect(),
            links,
            peers,
            kafka,
            cluster,
            voters,
            extra,
            disk_bytes,
        };
        for i in 0..r.voters.len() {
            r.start_voter(i);
        }
        r
    }

    /// Starts voter `i` (again), on its address and data directory.
    pub fn start_voter(&mut self, i: usize) {
        let peers: Vec<String> = self
            .voters
            .iter()
            .enumerate()
            .map(|(j, v)| format!("{}={}", j + 1, v.addr))
            .collect();
        let v = &self.voters[i];
        let mut cmd = Command::new(shoal());
        cmd.args(["controller", "--listen", &v.addr])
            .args(["--id", &(i + 1).to_string()])
            .args(["--data-dir", v.dir.to_str().unwrap()]);
        if self.voters.len() > 1 {
            cmd.args(["--peers", &peers.join(",")]);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log_sink(&format!("controller-{}", i + 1)))
            .spawn()
            .unwrap();
        self.voters[i].proc = Some(Proc { child });
    }

    /// SIGKILLs voter `i`.
    pub fn kill_voter(&mut self, i: usize) {
        if let Some(mut p) = self.voters[i].proc.take() {
            p.sigkill();
        }
    }

    /// Starts broker `i` (again), on its address and data directory.
    pub fn start_broker(&mut self, i: usize) {
        let controllers: Vec<&str> = self.links[i].iter().map(|p| p.addr.as_str()).collect();
        let peer: Vec<&str> = match self.peers.get(i) {
            Some(p) => vec!["--replication-addr", p.addr.as_str()],
            None => Vec::new(),
        };
        let kafka: Vec<&str> = match self.kafka.get(i) {
            Some(k) => vec!["--kafka-listen", k.as_str()],
            None => Vec::new(),
        };
        let group = self.groups[i].as_str();
        let (addr, dir, proc) = &mut self.brokers[i];
        let mut cmd = match self.disk_bytes {
            Some(bytes) => {
                std::fs::create_dir_all(&*dir).unwrap();
                let mut c = Command::new("unshare");
                c.args(["-m", "--propagation", "private", "sh", "-c"])
                    .arg(format!(
                        "mount -t tmpfs -o size={bytes} tmpfs \"$0\" && exec \"$@\""
                    ))
                    .arg(dir.to_str().unwrap())
                    .arg(shoal());
                c
            }
            None => Command::new(shoal()),
        };
        let child = cmd
            .args([
                "broker",
                "--listen",
                addr,
                "--namesrv",
                &self.cluster.dev.namesrv,
            ])
            .args(["--data-dir", dir.to_str().unwrap(), "--broker-name", group])
            .args(["--controller", &controllers.join(","), "--flush", "sync"])
            .arg("--auto-create-topic")
            .args(&peer)
            .args(&kafka)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log_sink(&format!("{group}-replica-{i}")))
            .spawn()
            .unwrap();
        *proc = Some(Proc { child });
    }

    /// SIGKILLs broker `i`.
    pub fn kill_broker(&mut self, i: usize) {
        if let Some(p) = self.brokers[i].2.as_mut() {
            p.sigkill();
        }
    }

    /// Cuts broker `i` off from every voter (both ways: its connections close).
    pub fn cut_from_controller(&self, i: usize) {
        self.links[i].iter().for_each(Proxy::cut);
    }

    /// Heals what [`Replicas::cut_from_controller`] cut.
    pub fn heal_to_controller(&self, i: usize) {
        self.links[i].iter().for_each(Proxy::heal);
    }

    /// `shoal cluster status --controller ADDR --json` of voter `i`, while it answers.
    pub fn status_of(&self, i: usize) -> Option<Value> {
        let out = Command::new(shoal())
            .args([
                "cluster",
                "status",
                "--controller",
                &self.voters[i].addr,
                "--json",
            ])
            .output()
            .unwrap();
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice::<Value>(&out.stdout).ok()
    }

    /// The group as a running voter shows it, once `ok` holds.
    pub fn wait_group(&self, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        self.wait_group_named(GROUP, what, ok)
    }

    /// Group `name` as a running voter shows it, once `ok` holds.
    pub fn wait_group_named(&self, name: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + LIMIT;
        loop {
            for i in 0..self.voters.len() {
                if self.voters[i].proc.is_none() {
                    continue;
                }
                if let Some(v) = self.status_of(i) {
                    let g = &v["groups"][name];
                    if ok(g) {
                        return g.clone();
                    }
                }
            }
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The index of the voter that leads, as running voter `from` knows it, once it knows one
    /// for which `ok` holds.
    pub fn wait_leader(&self, from: usize, what: &str, ok: impl Fn(usize) -> bool) -> usize {
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(id) = self.status_of(from).and_then(|v| v["leaderId"].as_u64()) {
                let i = id as usize - 1;
                if ok(i) {
                    return i;
                }
            }
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The index of the broker with controller id `id` (registered with its listen address,
    /// or its proxy's).
    pub fn index_of(&self, group: &Value, id: u64) -> usize {
        let addr = group["members"][id.to_string()].as_str().unwrap();
        match self.peers.iter().position(|p| p.addr == addr) {
            Some(i) => i,
            None => self.brokers.iter().position(|(a, _, _)| a == addr).unwrap(),
        }
    }

    /// The controller id of broker `i` in `group`.
    pub fn id_of(&self, group: &Value, i: usize) -> u64 {
        group["members"]
            .as_object()
            .unwrap()
            .keys()
            .map(|id| id.parse::<u64>().unwrap())
            .find(|id| self.index_of(group, *id) == i)
            .unwrap()
    }
}

/// The size of the group's in-sync set.
pub fn in_sync_len(g: &Value) -> usize {
    g["inSync"].as_array().map_or(0, Vec::len)
}

/// Waits until `group` consumed every message of `acked`.
pub fn wait_all_consumed(group: &TrackedGroup, acked: &BTreeSet<String>) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let seen: BTreeSet<String> = group
            .lines
            .lock()
            .unwrap()
            .iter()
            .map(|l| l.body.clone())
            .collect();
        let missing: Vec<&String> = acked.difference(&seen).collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} acknowledged messages never consumed, e.g. {:?}",
            missing.len(),
            acked.len(),
            &missing[..missing.len().min(5)]
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Checks in Jepsen's spirit over what a run's producer and a group's consumers printed
/// (call it once every acknowledged message was consumed):
/// - the producer's acknowledgements name increasing queue offsets per (broker, queue): it
///   sends one message at a time, so a lower one would be a place handed out twice;
/// - every acknowledged message was consumed at the place its acknowledgement named (a copy
///   elsewhere, from a send the client retried, does not count): an acknowledged message keeps
///   its place in the log across failovers;
/// - no place (broker, queue, offset) was consumed with two different bodies: no consumer was
///   shown a message that a failover then cut from the log.
pub fn check_history(producer: &SteadyProducer, group: &TrackedGroup) {
    use std::collections::BTreeMap;
    let sent = producer.sent.lock().unwrap().clone();
    let consumed = group.lines.lock().unwrap().clone();
    let mut last: BTreeMap<(&str, i64), (i64, &str)> = BTreeMap::new();
    for l in &sent {
        if let Some((offset, body)) = last.get(&(l.broker.as_str(), l.queue)) {
            assert!(
                l.offset > *offset,
                "{} acknowledged at {}#{} offset {}, after {body} at offset {offset}",
                l.body,
                l.broker,
                l.queue,
                l.offset
            );
        }
        last.insert((l.broker.as_str(), l.queue), (l.offset, l.body.as_str()));
    }
    let mut at: BTreeMap<(&str, i64, i64), &str> = BTreeMap::new();
    for l in &consumed {
        let place = (l.broker.as_str(), l.queue, l.offset);
        if let Some(other) = at.insert(place, l.body.as_str()) {
            assert_eq!(
                other, l.body,
                "{}#{} offset {} was consumed as {other} and as {} ({} of group {})",
                l.broker, l.queue, l.offset, l.body, l.member, group.group.name
            );
        }
    }
    for l in &sent {
        let place = (l.broker.as_str(), l.queue, l.offset);
        assert_eq!(
            at.get(&place).copied(),
            Some(l.body.as_str()),
            "{} was acknowledged at {}#{} offset {} but group {} consumed {:?} there",
            l.body,
            l.broker,
            l.queue,
            l.offset,
            group.group.name,
            at.get(&place)
        );
    }
}

/// Waits until `producer` has `more` acknowledgements beyond what it had.
pub fn wait_sends(producer: &SteadyProducer, more: usize, what: &str) {
    let before = producer.sent.lock().unwrap().len();
    let deadline = Instant::now() + LIMIT;
    while producer.sent.lock().unwrap().len() < before + more {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The bodies `producer` has had acknowledged so far (it goes on sending).
pub fn acknowledged(producer: &SteadyProducer) -> BTreeSet<String> {
    producer
        .sent
        .lock()
        .unwrap()
        .iter()
        .map(|l| l.body.clone())
        .collect()
}

/// The longest time between two acknowledgements of `producer` from `since` (counted from
/// `since` itself) to its latest one.
pub fn longest_gap(producer: &SteadyProducer, since: Instant) -> Duration {
    let mut at: Vec<Instant> = producer
        .sent
        .lock()
        .unwrap()
        .iter()
        .map(|l| l.at)
        .filter(|at| *at >= since)
        .collect();
    at.sort();
    let mut last = since;
    let mut gap = Duration::ZERO;
    for t in at {
        gap = gap.max(t - last);
        last = t;
    }
    gap
}

/// A group with its first master and all three in sync, under load.
pub struct Loaded {
    /// The first master's epoch.
    pub epoch: u64,
    /// The indexes of the master and of its two replicas.
    pub master: usize,
    pub replica: usize,
    pub other: usize,
    /// Sends every 10 ms to [`TOPIC`], created on the master only.
    pub producer: SteadyProducer,
    /// One tracked consumer, `c1`.
    pub group: TrackedGroup,
}

/// Waits for a master with three in sync, creates [`TOPIC`] on it (the replicas learn it from
/// the group's log), starts a producer (bodies `prefix-N`) and a consumer of `group`.
pub fn under_load(r: &Replicas, prefix: &str, group: &str) -> Loaded {
    let g = r.wait_group("no master with three in sync", |g| {
        g["master"].is_u64() && in_sync_len(g) == 3
    });
    let epoch = g["masterEpoch"].as_u64().unwrap();
    let master = r.index_of(&g, g["master"].as_u64().unwrap());
    let (replica, other) = match master {
        0 => (1, 2),
        1 => (2, 0),
        _ => (0, 1),
    };
    let master_addr = r.brokers[master].0.clone();
    let mut args = vec!["topic", "create", TOPIC, "--queues", "4", "--brokers"];
    args.extend([master_addr.as_str(), "--json"]);
    r.cluster.json(&args);
    let producer = SteadyProducer::start(&r.cluster.dev, TOPIC, prefix, 10);
    let mut tracked = TrackedGroup::new(group, TOPIC);
    tracked.join(&r.cluster.dev, "c1", &[]);
    Loaded {
        epoch,
        master,
        replica,
        other,
        producer,
        group: tracked,
    }
}
