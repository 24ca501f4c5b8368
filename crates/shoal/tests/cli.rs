//! Each `shoal` subcommand's happy path and its errors, with the exact message a user sees.

mod support;

use std::process::Command;
use support::*;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_string()
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

#[test]
fn errors_are_one_line_with_a_non_zero_exit() {
    // Unreachable name server.
    let port = free_port();
    let o = Command::new(shoal())
        .args(["topic", "list", "--namesrv", &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.starts_with(&format!("error: no name server reachable (127.0.0.1:{port}): cannot connect to 127.0.0.1:{port}")),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
    // Bad arguments are clap's usage errors (exit 2).
    let o = Command::new(shoal())
        .args(["topic", "create"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("<TOPIC>"), "{}", stderr(&o));
    let o = Command::new(shoal())
        .args(["consume", "T"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--group"), "{}", stderr(&o));
    // A bad time is refused before anything is contacted.
    let o = Command::new(shoal())
        .args([
            "group",
            "reset-offset",
            "G",
            "--topic",
            "T",
            "--to",
            "someday",
            "--namesrv",
            "127.0.0.1:1",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "error: cannot read time \"someday\": use earliest, latest, epoch milliseconds, an RFC 3339 time or a duration ago such as 10m"
    );
    // Every subcommand has --help.
    for sub in [
        vec!["dev"],
        vec!["namesrv"],
        vec!["controller"],
        vec!["broker"],
        vec!["send"],
        vec!["consume"],
        vec!["topic", "create"],
        vec!["topic", "status"],
        vec!["group", "progress"],
        vec!["group", "reset-offset"],
        vec!["cluster", "list"],
        vec!["cluster", "status"],
        vec!["cluster", "elect"],
        vec!["message", "get"],
        vec!["dlq", "list"],
        vec!["dlq", "resend"],
        vec!["rebalance", "simulate"],
    ] {
        let mut args = sub.clone();
        args.push("--help");
        let o = Command::new(shoal()).args(&args).output().unwrap();
        assert!(o.status.success(), "{args:?} --help failed");
        assert!(stdout(&o).contains("Usage:"), "{args:?}");
    }
}

#[test]
fn topic_cluster_message_and_group_commands() {
    let dev = Dev::start();
    // topic create / list / route / status / update / delete
    let o = dev.cmd(&["topic", "create", "CliTopic", "--queues", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).starts_with("topic CliTopic with 3 queues on 127.0.0.1:"),
        "{}",
        stdout(&o)
    );
    let v = dev.json(&["topic", "list", "--json"]);
    assert!(v.as_array().unwrap().iter().any(|t| t == "CliTopic"));
    let v = dev.json(&["topic", "route", "CliTopic", "--json"]);
    assert_eq!(v["queueDatas"][0]["writeQueueNums"], 3);
    let o = dev.cmd(&["topic", "route", "NoSuchTopic"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "error: topic NoSuchTopic does not exist (no route on the name server)"
    );
    let o = dev.cmd(&["topic", "create", "bad topic"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("topic name \"bad topic\" is invalid"),
        "{}",
        stderr(&o)
    );
    assert!(dev
        .cmd(&["topic", "update", "CliTopic", "--queues", "4"])
        .status
        .success());
    // cluster list
    let o = dev.cmd(&["cluster", "list"]);
    assert!(
        stdout(&o).contains("DefaultCluster  broker-a  0"),
        "{}",
        stdout(&o)
    );

    // send (JSON lines), status, message get
    let o = dev.cmd(&[
        "send",
        "CliTopic",
        "--body",
        "hello-{i}",
        "--count",
        "4",
        "--tag",
        "t",
        "--key",
        "k{i}",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let sent: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(sent.len(), 4);
    let v = dev.json(&["topic", "status", "CliTopic", "--json"]);
    let stored: i64 = v
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["maxOffset"].as_i64().unwrap())
        .sum();
    assert_eq!(stored, 4);
    let id = sent[0]["offsetMsgId"].as_str().unwrap();
    let m = dev.json(&["message", "get", id, "--json"]);
    assert_eq!(m["body"], "hello-0");
    assert_eq!(m["keys"], "k0");
    let uniq = sent[1]["msgId"].as_str().unwrap();
    let m = dev.json(&["message", "get", uniq, "--topic", "CliTopic", "--json"]);
    assert_eq!(m["body"], "hello-1");
    let o = dev.cmd(&["message", "get", "ZZZ"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "error: ZZZ is not an offset message id; give --topic to look it up by its message key"
    );

    // consume --count exits after that many messages; stdin sends one message per line.
    let o = dev.cmd(&[
        "consume", "CliTopic", "--group", "cli-g", "--from", "first", "--count", "4", "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bodies: std::collections::BTreeSet<String> = stdout(&o)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["body"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(bodies.len(), 4);

    // group list / progress / connections / reset-offset
    let v = dev.json(&["group", "list", "--json"]);
    assert!(v.as_array().unwrap().iter().any(|g| g["group"] == "cli-g"));
    let p = dev.json(&["group", "progress", "cli-g", "--json"]);
    assert!(p["queues"]
        .as_array()
        .unwrap()
        .iter()
        .any(|q| q["topic"] == "CliTopic"));
    let o = dev.cmd(&["group", "progress", "nobody"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "error: consumer group nobody is not known to any broker"
    );
    let o = dev.cmd(&["group", "connections", "cli-g"]);
    assert_eq!(o.status.code(), Some(1), "the consumer has left");
    let plan = dev.json(&[
        "group",
        "reset-offset",
        "cli-g",
        "--topic",
        "CliTopic",
        "--to",
        "earliest",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(plan["dryRun"], true);
    assert!(plan["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["to"] == 0));
    let done = dev.json(&[
        "group",
        "reset-offset",
        "cli-g",
        "--topic",
        "CliTopic",
        "--to",
        "earliest",
        "--json",
    ]);
    assert_eq!(done["dryRun"], false);
    let p = dev.json(&["group", "progress", "cli-g", "--json"]);
    assert_eq!(p["totalLag"], 4, "{p}");

    // dlq list on a group without dead letters; resend with nothing to resend.
    let o = dev.cmd(&["dlq", "list", "--group", "cli-g"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("0 messages in the dead-letter queue of cli-g"));
    let o = dev.cmd(&["dlq", "resend", "--group", "cli-g"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "error: no matching message in the dead-letter queue of cli-g"
    );

    // topic delete
    assert!(dev.cmd(&["topic", "delete", "CliTopic"]).status.success());
    assert_eq!(
        dev.cmd(&["topic", "route", "CliTopic"]).status.code(),
        Some(1)
    );
}

#[test]
fn topics_with_a_message_type() {
    let dev = Dev::start();
    let o = dev.cmd(&[
        "topic",
        "create",
        "Orders",
        "--queues",
        "2",
        "--message-type",
        "fifo",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("(message type FIFO)"), "{}", stdout(&o));
    // A plain message is refused with the reason; one with a message group is taken.
    let o = dev.cmd(&["send", "Orders", "--body", "x"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("takes FIFO messages, not NORMAL"),
        "{}",
        stderr(&o)
    );
    let o = dev.cmd(&[
        "send",
        "Orders",
        "--body",
        "x",
        "--property",
        "__SHARDINGKEY=o1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // --message-group names the message group (and orders by it): each group on one queue.
    let o = dev.cmd(&[
        "--json",
        "send",
        "Orders",
        "--body",
        "g{i}",
        "--count",
        "4",
        "--message-group",
        "o2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let queues: std::collections::BTreeSet<i64> = stdout(&o)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["queue"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(queues.len(), 1, "{}", stdout(&o));
    let o = dev.cmd(&[
        "--json", "consume", "Orders", "--group", "og", "--from", "first", "--count", "5",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let groups: Vec<String> = stdout(&o)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|m| m["properties"]["__SHARDINGKEY"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        groups.iter().filter(|g| *g == "o2").count(),
        4,
        "{}",
        stdout(&o)
    );
    let o = dev.cmd(&["topic", "create", "Odd", "--message-type", "sometimes"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--message-type"), "{}", stderr(&o));
}
