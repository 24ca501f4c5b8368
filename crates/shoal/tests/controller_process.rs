//! The HA controller as separate `shoal controller` processes on 127.0.0.1 (ports chosen at
//! run time): voters elect a Raft leader, brokers' requests (apply for an id, register,
//! heartbeat, lease, in-sync set) are answered over remoting, the group's metadata reaches
//! every voter, and it survives the leader's death. `shoal cluster status` shows it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use serde_json::Value;
use shoal_ha::controller::{Request, Response};
use shoal_net::{NetConfig, NotSupportedProcessor, RemotingClient};
use shoal_proto::RemotingCommand;
use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{free_port, http_request, shoal, Proc};

const LIMIT: Duration = Duration::from_secs(30);

fn start_voter(id: u64, addrs: &[String], extra: &[&str]) -> Proc {
    let mut cmd = Command::new(shoal());
    cmd.args(["controller", "--listen", &addrs[id as usize - 1]])
        .args(["--id", &id.to_string()])
        .args(extra);
    if addrs.len() > 1 {
        let peers: Vec<String> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect();
        cmd.args(["--peers", &peers.join(",")]);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Proc { child }
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

fn code_of(req: &Request) -> i32 {
    match req {
        Request::ApplyBrokerId { .. } => 1013,
        Request::Register { .. } => 1003,
        Request::Heartbeat { .. } => 904,
        Request::RenewLease { .. } => 9081,
        Request::AlterInSyncSet { .. } => 1001,
        Request::ElectMaster { .. } => 1002,
    }
}

/// One request to the controller at `addr`: the response code and the answer.
async fn call(client: &RemotingClient, addr: &str, req: &Request) -> (i32, Response) {
    let cmd = RemotingCommand::request(code_of(req)).with_body(serde_json::to_vec(req).unwrap());
    let reply = client
        .invoke(addr, cmd, Duration::from_secs(10))
        .await
        .unwrap();
    let answer = serde_json::from_slice(reply.body.as_deref().unwrap()).unwrap();
    (reply.code, answer)
}

/// A voter other than `dead` (any: the elect command finds the leader from it).
fn survivor_of(addrs: &[String], dead: u64) -> String {
    addrs[(dead as usize) % addrs.len()].clone()
}

fn heartbeat(broker_id: u64) -> Request {
    Request::Heartbeat {
        group: "broker-a".into(),
        broker_id,
        last_epoch: 0,
        end_offset: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_voters_keep_a_group_through_the_leaders_death() {
    let addrs: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let mut voters: Vec<Proc> = (1..=3).map(|id| start_voter(id, &addrs, &[])).collect();
    let a0 = addrs[0].clone();
    let first = tokio::task::spawn_blocking(move || {
        wait_status(&a0, "no leader elected", |v| v["leaderId"].is_u64())
    })
    .await
    .unwrap();
    let leader = first["leaderId"].as_u64().unwrap();
    let leader_addr = addrs[leader as usize - 1].clone();
    assert_eq!(first["leaderAddr"].as_str(), Some(leader_addr.as_str()));

    let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
    // A follower sends brokers to the leader.
    let follower = addrs[leader as usize % 3].clone();
    let (code, answer) = call(&client, &follower, &heartbeat(1)).await;
    assert_eq!(code, 2007, "CONTROLLER_NOT_LEADER");
    assert_eq!(
        answer,
        Response::NotLeader {
            leader: Some(leader)
        }
    );
    // Two brokers apply for ids (the same token gets the same id) and register.
    let mut ids = Vec::new();
    for token in ["t1", "t2", "t1"] {
        let apply = Request::ApplyBrokerId {
            group: "broker-a".into(),
            addr: format!("127.0.0.1:{token}"),
            token: token.into(),
        };
        match call(&client, &leader_addr, &apply).await {
            (0, Response::BrokerId(id)) => ids.push(id),
            other => panic!("apply: {other:?}"),
        }
    }
    assert_eq!(ids, vec![1, 2, 1]);
    for id in [1, 2] {
        let register = Request::Register {
            group: "broker-a".into(),
            broker_id: id,
            addr: format!("127.0.0.1:{}", 10_000 + id),
        };
        let (code, answer) = call(&client, &leader_addr, &register).await;
        assert_eq!(code, 0, "{answer:?}");
    }
    // Heartbeats until the leader elects a first master (after one session).
    let deadline = Instant::now() + LIMIT;
    let master = loop {
        let mut master = None;
        for id in [1, 2] {
            if let (0, Response::Group(g)) = call(&client, &leader_addr, &heartbeat(id)).await {
                master = g.master;
            }
        }
        if let Some(m) = master {
            break m;
        }
        assert!(Instant::now() < deadline, "no master elected");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let renew = Request::RenewLease {
        group: "broker-a".into(),
        broker_id: master,
        master_epoch: 1,
    };
    let (code, answer) = call(&client, &leader_addr, &renew).await;
    assert_eq!(code, 0, "{answer:?}");
    assert!(matches!(
        answer,
        Response::LeaseGranted {
            master_epoch: 1,
            ..
        }
    ));
    // The master takes the other broker into the in-sync set.
    let other = 3 - master;
    let alter = Request::AlterInSyncSet {
        group: "broker-a".into(),
        master,
        master_epoch: 1,
        in_sync_epoch: 1,
        in_sync: BTreeSet::from([1, 2]),
    };
    let (code, answer) = call(&client, &leader_addr, &alter).await;
    assert_eq!(code, 0, "{answer:?}");
    // The same proposal again is fenced by the in-sync-set epoch.
    let (code, _) = call(&client, &leader_addr, &alter).await;
    assert_eq!(code, 2001, "CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH");

    // Every voter has applied it.
    for addr in addrs.clone() {
        tokio::task::spawn_blocking(move || {
            wait_status(&addr, "the group did not reach this voter", |v| {
                let g = &v["groups"]["broker-a"];
                g["inSync"] == serde_json::json!([1, 2]) && g["masterEpoch"] == 1
            })
        })
        .await
        .unwrap();
    }

    // The leader dies; the others elect a new one, which still knows the group. The brokers
    // keep their session with the new leader, so nothing is re-elected.
    voters[leader as usize - 1].sigkill();
    let survivor = follower.clone();
    let after = tokio::task::spawn_blocking(move || {
        wait_status(&survivor, "no new leader", |v| {
            v["leaderId"].as_u64().is_some_and(|l| l != leader)
        })
    })
    .await
    .unwrap();
    let new_leader = after["leaderAddr"].as_str().unwrap().to_string();
    let deadline = Instant::now() + LIMIT;
    loop {
        match call(&client, &new_leader, &heartbeat(other)).await {
            (0, Response::Group(g)) => {
                assert_eq!(g.master, Some(master));
                assert_eq!(g.master_epoch, 1);
                assert_eq!(g.in_sync, BTreeSet::from([1, 2]));
                break;
            }
            // Not sure of its leadership yet.
            (2007, _) => {}
            other => panic!("heartbeat to the new leader: {other:?}"),
        }
        assert!(Instant::now() < deadline, "the new leader never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // An operator's switch-over to the other broker: answered once the master's lease has
    // certainly expired, while both brokers keep their session.
    let beat = {
        let client = client.clone();
        let leader = new_leader.clone();
        tokio::spawn(async move {
            loop {
                for id in [1, 2] {
                    let _ = call(&client, &leader, &heartbeat(id)).await;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let target = other.to_string();
    let ask = survivor_of(&addrs, leader);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(shoal())
            .args(["cluster", "elect", "broker-a", "--broker", &target])
            .args(["--controller", &ask, "--json"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    beat.abort();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let elected: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(elected["master"], other);
    assert_eq!(elected["masterEpoch"], 2);
    // The leader saw both brokers' heartbeats: the new master's log end and the old one's
    // lag behind it, how long ago, and the group's lease as the leader counts it.
    for (id, end_offset) in [(other, 1_000), (master, 600)] {
        let beat = Request::Heartbeat {
            group: "broker-a".into(),
            broker_id: id,
            last_epoch: 1,
            end_offset,
        };
        let (code, answer) = call(&client, &new_leader, &beat).await;
        assert_eq!(code, 0, "{answer:?}");
    }
    let v = status(&new_leader).unwrap();
    let g = &v["groups"]["broker-a"];
    assert_eq!(g["alive"], serde_json::json!([1, 2]));
    let heard = |id: u64, key: &str| g["heard"][id.to_string()][key].clone();
    assert_eq!(heard(other, "endOffset"), 1_000, "{v}");
    assert_eq!(heard(other, "lagBytes"), 0, "{v}");
    assert_eq!(heard(master, "endOffset"), 600, "{v}");
    assert_eq!(heard(master, "lagBytes"), 400, "{v}");
    assert_eq!(heard(master, "disconnected"), false, "{v}");
    assert!(heard(master, "heardMsAgo").is_u64(), "{v}");
    assert!(g["leaseMsLeft"].is_u64(), "{v}");

    // The text form names the group and the master.
    let out = Command::new(shoal())
        .args(["cluster", "status", "--controller", &new_leader])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("broker-a") && text.contains("master"),
        "{text}"
    );
    assert!(
        text.contains("END-OFFSET") && text.contains("LAG") && text.contains("ms left"),
        "{text}"
    );
    client.shutdown();
}

#[test]
fn a_single_voter_leads_at_once_and_answers_brokers() {
    let addrs = vec![format!("127.0.0.1:{}", free_port())];
    let http = format!("127.0.0.1:{}", free_port());
    let _voter = start_voter(1, &addrs, &["--max-groups", "1", "--http-listen", &http]);
    let v = wait_status(&addrs[0], "the single voter did not lead", |v| {
        v["isLeader"] == true
    });
    assert_eq!(v["voters"], serde_json::json!({"1": addrs[0]}));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
        let apply = Request::ApplyBrokerId {
            group: "broker-b".into(),
            addr: "127.0.0.1:1".into(),
            token: "t".into(),
        };
        assert_eq!(
            call(&client, &addrs[0], &apply).await,
            (0, Response::BrokerId(1))
        );
        // A body that is not the request its code says is refused.
        let cmd = RemotingCommand::request(1003).with_body(serde_json::to_vec(&apply).unwrap());
        let reply = client
            .invoke(&addrs[0], cmd, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(reply.code, 2005, "CONTROLLER_INVALID_REQUEST");
        // --max-groups 1: a second group is refused.
        let other = Request::ApplyBrokerId {
            group: "broker-z".into(),
            addr: "127.0.0.1:2".into(),
            token: "t".into(),
        };
        let (code, answer) = call(&client, &addrs[0], &other).await;
        assert_eq!(code, 2005, "{answer:?}");
        assert_eq!(
            answer,
            Response::Refused(shoal_ha::controller::Refusal::Limit("max_groups".into()))
        );
        client.shutdown();
    });
    let v = status(&addrs[0]).unwrap();
    assert_eq!(v["groups"]["broker-b"]["members"]["1"], "127.0.0.1:1");
    // The voter's metrics at --http-listen (bound just after the voter's port).
    let deadline = Instant::now() + LIMIT;
    while std::net::TcpStream::connect(&http).is_err() {
        assert!(Instant::now() < deadline, "no HTTP port at {http}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, body) = http_request(&http, "GET", "/metrics", "");
    assert_eq!(code, 200);
    for line in [
        "shoal_controller_is_leader 1",
        "shoal_controller_groups 1",
        "shoal_controller_inbox_depth",
        "shoal_controller_applied_index",
    ] {
        assert!(body.contains(line), "{line} in\n{body}");
    }
}

#[test]
fn a_voter_with_a_data_dir_keeps_its_groups_across_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_string();
    let addrs = vec![format!("127.0.0.1:{}", free_port())];
    // Compacted every 4 entries: the file is written again whole along the way.
    let args = ["--data-dir", data.as_str(), "--compact-every", "4"];
    let mut voter = start_voter(1, &addrs, &args);
    wait_status(&addrs[0], "the voter did not lead", |v| {
        v["isLeader"] == true
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let apply = |token: &str| Request::ApplyBrokerId {
        group: "broker-c".into(),
        addr: format!("127.0.0.1:{token}"),
        token: token.into(),
    };
    rt.block_on(async {
        let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
        for id in 1..=10 {
            let token = id.to_string();
            let token = token.as_str();
            assert_eq!(
                call(&client, &addrs[0], &apply(token)).await,
                (0, Response::BrokerId(id))
            );
        }
        client.shutdown();
    });
    voter.sigkill();
    let log = std::fs::read(dir.path().join("controller.log")).unwrap();
    assert!(log.starts_with(b"SHOALCL2"), "the record format");
    let _voter = start_voter(1, &addrs, &args);
    let v = wait_status(&addrs[0], "the restarted voter did not lead", |v| {
        v["isLeader"] == true
    });
    assert_eq!(
        v["groups"]["broker-c"]["members"],
        serde_json::Value::Object(
            (1..=10)
                .map(|i| (i.to_string(), format!("127.0.0.1:{i}").into()))
                .collect()
        )
    );
    // Ids are never given twice: a new broker gets 11, a known token its own id.
    rt.block_on(async {
        let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
        assert_eq!(
            call(&client, &addrs[0], &apply("11")).await,
            (0, Response::BrokerId(11))
        );
        assert_eq!(
            call(&client, &addrs[0], &apply("1")).await,
            (0, Response::BrokerId(1))
        );
        client.shutdown();
    });
}

/// `shoal cluster elect --timeout` bounds the wait for a voter's answer: against a listener
/// that accepts and never answers, the command fails with the address it asked, instead of
/// waiting out a fixed time.
#[test]
fn cluster_elect_gives_up_after_its_timeout() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in silent.incoming().flatten() {
            held.push(s);
        }
    });
    let out = Command::new(shoal())
        .args(["cluster", "elect", "broker-a", "--controller", &addr])
        .args(["--timeout", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("controller {addr}")), "{stderr}");
}
