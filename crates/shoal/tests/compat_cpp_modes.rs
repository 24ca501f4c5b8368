//! A group moving between coordinated and classic mode when Apache RocketMQ's official C++
//! client (PyPI `rocketmq` 0.4.4, venv from `.ci/setup.d/10-cpp-client.sh`) joins and leaves:
//! two `shoal consume --protocol auto` members run coordinated; the C++ consumer joins and the
//! group turns classic (every member allocates AVG client-side, as the C++ client does); it
//! leaves and the group is coordinated again. Every message sent in each phase is consumed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

const LIMIT: Duration = Duration::from_secs(60);
const TOPIC: &str = "CppModes";
const GROUP: &str = "cpp-modes";

fn join_shoal(dev: &Dev, g: &mut Group, member: &str) {
    let mut child = dev.spawn(&[
        "consume",
        TOPIC,
        "--group",
        GROUP,
        "--json",
        "--from",
        "first",
        "--instance",
        member,
        "--protocol",
        "auto",
        "--strategy",
        "AVG",
    ]);
    let stdout = child.stdout.take().unwrap();
    let seen = g.seen.clone();
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
    g.members.insert(member.to_string(), Proc { child });
}

fn wait_mode(dev: &Dev, mode: &str, members: Option<usize>) -> Value {
    let start = Instant::now();
    loop {
        let d = dev.json(&["group", "describe", GROUP, "--json"]);
        let ok = d["mode"] == mode
            && members.is_none_or(|n| {
                d["reconciled"] == true && d["members"].as_array().map(Vec::len) == Some(n)
            });
        if ok {
            return d;
        }
        assert!(start.elapsed() < LIMIT, "group never {mode}: {d}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn official_cpp_client_turns_the_group_classic_and_back() {
    let root = external::repo_root();
    let python = root.join("target/external/venv-cpp/bin/python");
    let importable = Command::new(&python)
        .args(["-c", "import rocketmq.client"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !importable {
        external::skip("the C++ client venv (run .ci/setup.d/10-cpp-client.sh)");
        return;
    }
    let dev = Dev::start();
    assert!(dev
        .cmd(&["topic", "create", TOPIC, "--queues", "8"])
        .status
        .success());
    let mut g = Group::new(GROUP, TOPIC);
    join_shoal(&dev, &mut g, "s1");
    join_shoal(&dev, &mut g, "s2");
    wait_mode(&dev, "coordinated", Some(2));
    let p1 = send(&dev, TOPIC, "coordinated", 40);
    g.wait_all(&p1, LIMIT);
    println!("phase 1 (coordinated, 2 Shoal members): 40 consumed");

    // The official client joins the group.
    let mut cpp = Command::new(&python)
        .arg(root.join("tests/compat/cpp_group_member.py"))
        .args([&dev.namesrv, GROUP, TOPIC])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = cpp.stdout.take().unwrap();
    let seen = g.seen.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(body) = line else { break };
            if body == "STARTED" {
                continue;
            }
            seen.lock().unwrap().push(Seen {
                consumer: "cpp".into(),
                msg_id: String::new(),
                queue: -1,
                body,
                at: Instant::now(),
            });
        }
    });
    let d = wait_mode(&dev, "classic", None);
    println!(
        "C++ client joined: mode classic, classic-only members {}",
        d["classicClients"]
    );
    // Let the three members agree on the classic allocation, then send.
    std::thread::sleep(Duration::from_secs(3));
    let p2 = send(&dev, TOPIC, "classic", 40);
    g.wait_all(&p2, LIMIT);
    let by_cpp = g
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.consumer == "cpp" && s.body.starts_with("classic-"))
        .count();
    println!("phase 2 (classic, 2 Shoal + 1 C++): 40 consumed, {by_cpp} by the C++ client");

    // The official client leaves (clean shutdown unregisters it).
    drop(cpp.stdin.take());
    let _ = cpp.wait();
    wait_mode(&dev, "coordinated", Some(2));
    let d = dev.json(&["group", "describe", GROUP, "--json"]);
    let owned: usize = d["members"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["owned"].as_array().cloned().unwrap_or_default())
        .filter(|q| q["topic"] == TOPIC)
        .count();
    assert_eq!(owned, 8, "coordinated again, every queue owned: {d}");
    let p3 = send(&dev, TOPIC, "again", 40);
    g.wait_all(&p3, LIMIT);
    let (_, dups) = g.tally();
    println!("phase 3 (coordinated again): 40 consumed; {dups} duplicates over the three phases");
}
