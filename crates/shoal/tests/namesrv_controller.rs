//! The HA controller inside the name servers: three `shoal namesrv --controller` processes on
//! 127.0.0.1 (ports chosen at run time) are the three voters; they elect a leader, each
//! answers `shoal cluster status --controller`, the leader's death elects another, and the
//! name servers keep serving routes on their own ports.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{free_port, http_request, shoal, Proc};

const LIMIT: Duration = Duration::from_secs(30);

/// A name server with a voter: (name server address, voter address).
fn start_namesrv(id: usize, voters: &[String], extra: &[&str]) -> (Proc, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut cmd = Command::new(shoal());
    cmd.args(["namesrv", "--listen", &listen, "--controller"])
        .args(["--controller-listen", &voters[id - 1]])
        .args(["--controller-id", &id.to_string()])
        .args(extra);
    if voters.len() > 1 {
        let peers: Vec<String> = voters
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect();
        cmd.args(["--controller-peers", &peers.join(",")]);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (Proc { child }, listen)
}

/// `shoal cluster status --controller ADDR --json`, or `None` while it fails.
fn status(addr: &str) -> Option<Value> {
    let out = Command::new(shoal())
        .args(["cluster", "status", "--controller", addr, "--json"])
        .output()
        .unwrap();
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// Polls `addr`'s status until `ok` holds; the status then.
fn wait_status(addr: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(v) = status(addr) {
            if ok(&v) {
                return v;
            }
        }
        assert!(Instant::now() < deadline, "{addr}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether the name server at `addr` answers the broker list (`shoal cluster list`).
fn namesrv_answers(addr: &str) -> bool {
    Command::new(shoal())
        .args(["cluster", "list", "--namesrv", addr, "--json"])
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
fn three_name_servers_are_the_controllers_voters_and_survive_the_leaders_death() {
    let voters: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let mut procs: Vec<(Proc, String)> =
        (1..=3).map(|id| start_namesrv(id, &voters, &[])).collect();
    let first = wait_status(&voters[0], "no leader elected", |v| v["leaderId"].is_u64());
    let leader = first["leaderId"].as_u64().unwrap();
    assert_eq!(
        first["leaderAddr"].as_str(),
        Some(voters[leader as usize - 1].as_str())
    );
    // Every voter answers, and knows the same leader.
    for addr in &voters {
        let v = wait_status(addr, "this voter does not know the leader", |v| {
            v["leaderId"].as_u64() == Some(leader)
        });
        assert_eq!(v["voters"].as_object().map(|m| m.len()), Some(3));
    }
    for (_, ns) in &procs {
        assert!(namesrv_answers(ns), "name server {ns}");
    }

    // The leader's name server dies; the two others elect a new leader and still serve.
    procs[leader as usize - 1].0.sigkill();
    let survivor = voters[leader as usize % 3].clone();
    let after = wait_status(&survivor, "no new leader", |v| {
        v["leaderId"].as_u64().is_some_and(|l| l != leader)
    });
    let new_leader = after["leaderId"].as_u64().unwrap();
    for id in (1..=3).filter(|id| *id != leader) {
        wait_status(
            &voters[id as usize - 1],
            "the new leader is not known",
            |v| v["leaderId"].as_u64() == Some(new_leader),
        );
        assert!(namesrv_answers(&procs[id as usize - 1].1));
    }
}

#[test]
fn one_name_server_with_a_controller_is_a_single_voter_and_serves_its_metrics() {
    let voters = vec![format!("127.0.0.1:{}", free_port())];
    let http = format!("127.0.0.1:{}", free_port());
    let (_ns, listen) = start_namesrv(1, &voters, &["--http-listen", &http]);
    let v = wait_status(&voters[0], "the single voter did not lead", |v| {
        v["isLeader"] == true
    });
    assert_eq!(v["voters"], serde_json::json!({"1": voters[0]}));
    assert!(namesrv_answers(&listen));
    let deadline = Instant::now() + LIMIT;
    while std::net::TcpStream::connect(&http).is_err() {
        assert!(Instant::now() < deadline, "no HTTP port at {http}");
        std::thread::sleep(Duration::from_millis(100));
    }
    loop {
        let (code, body) = http_request(&http, "GET", "/metrics", "");
        if code == 200 && body.contains("shoal_controller_is_leader 1") {
            assert!(body.contains("shoal_namesrv_connections"), "{body}");
            assert!(body.contains("shoal_controller_term"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "no controller metrics: {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn controller_without_its_own_address_is_refused() {
    let out = Command::new(shoal())
        .args(["namesrv", "--listen", "127.0.0.1:0", "--controller"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--controller-listen"), "{err}");
}

#[test]
fn an_unsafe_lease_is_refused_naming_the_drift_bound() {
    let out = Command::new(shoal())
        .args(["namesrv", "--listen", "127.0.0.1:0", "--controller"])
        .args([
            "--controller-listen",
            "127.0.0.1:0",
            "--controller-lease-ms",
            "2000",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("1%") && err.contains("at least 2041 ms"),
        "{err}"
    );
    let out = Command::new(shoal())
        .args([
            "controller",
            "--listen",
            "127.0.0.1:0",
            "--election-delay-ms",
            "900",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("election_delay_ms"), "{err}");
}
