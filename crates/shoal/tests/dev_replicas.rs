//! `shoal dev --replicas` as a separate process: its replicas are child processes, and they
//! stop when dev is SIGKILLed (their stdin, a pipe from dev, closes), so a killed dev leaves no
//! broker behind holding its ports and data directories.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{free_port, log_sink, shoal};

/// Longest wait for the replicas to exit after dev's death (they stop gracefully).
const LIMIT: Duration = Duration::from_secs(30);

fn alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped by init) is not alive.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z")
        })
        .unwrap_or(false)
}

#[test]
fn replicas_stop_when_dev_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let mut dev = Command::new(shoal())
        .args(["dev", "--replicas", "2", "--data-dir"])
        .arg(dir.path())
        .args(["--namesrv-port", &free_port().to_string()])
        .args(["--broker-port", &free_port().to_string()])
        .stdout(Stdio::piped())
        .stderr(log_sink("dev-killed"))
        .spawn()
        .unwrap();
    let mut pids: Vec<u32> = Vec::new();
    for line in std::io::BufReader::new(dev.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.trim_start().starts_with("replica ") {
            let words: Vec<&str> = line.split_whitespace().collect();
            let pid = words[words.iter().position(|w| *w == "pid").unwrap() + 1];
            pids.push(pid.trim_end_matches(',').parse().unwrap());
        }
        if line.starts_with("Try it") {
            break;
        }
    }
    assert_eq!(pids.len(), 2, "dev printed both replicas");
    assert!(pids.iter().all(|p| alive(*p)), "the replicas run");
    dev.kill().unwrap();
    dev.wait().unwrap();
    let deadline = Instant::now() + LIMIT;
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    for pid in &left {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(
        left.is_empty(),
        "replicas {left:?} outlived a SIGKILLed dev"
    );
}
