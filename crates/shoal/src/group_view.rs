//! `shoal group describe` and `shoal group history`: tables of the coordinator's answers.

use crate::table::Table;

/// `topic@broker#id` of a queue as the coordinator's JSON writes it.
fn queue_name(q: &serde_json::Value) -> String {
    format!(
        "{}@{}#{}",
        q["topic"].as_str().unwrap_or("?"),
        q["brokerName"].as_str().unwrap_or("?"),
        q["queueId"]
    )
}

/// Queue ids of a list, compactly: `T@b#0,1,5` (grouped by topic and broker).
fn queue_list(list: &serde_json::Value) -> String {
    let mut groups: std::collections::BTreeMap<(String, String), Vec<i64>> = Default::default();
    for q in list.as_array().into_iter().flatten() {
        groups
            .entry((
                q["topic"].as_str().unwrap_or("?").to_string(),
                q["brokerName"].as_str().unwrap_or("?").to_string(),
            ))
            .or_default()
            .push(q["queueId"].as_i64().unwrap_or(-1));
    }
    if groups.is_empty() {
        return "-".into();
    }
    groups
        .into_iter()
        .map(|((t, b), ids)| {
            let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
            format!("{t}@{b}#{}", ids.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A JSON field as text (`-` when absent).
fn text_of(v: &serde_json::Value, k: &str) -> String {
    match &v[k] {
        serde_json::Value::Null => "-".to_string(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A Kafka classic group of the Kafka listener (JoinGroup/SyncGroup: generation, leader,
/// client-side assignor).
fn print_kafka_classic(broker: &str, v: &serde_json::Value) {
    println!(
        "group {}  mode kafkaClassic  state {}  generation {}  protocol {}/{}  leader {}  (broker {broker})",
        text_of(v, "group"),
        text_of(v, "state"),
        text_of(v, "generation"),
        text_of(v, "protocolType"),
        text_of(v, "assignor"),
        text_of(v, "leader"),
    );
    let mut t = Table::new(&[
        "MEMBER", "INSTANCE", "CLIENT", "HOST", "LEADER", "OWNED", "LAG",
    ]);
    for m in v["members"].as_array().into_iter().flatten() {
        t.row(vec![
            text_of(m, "memberId"),
            text_of(m, "instanceId"),
            text_of(m, "clientId"),
            text_of(m, "clientHost"),
            if m["leader"].as_bool() == Some(true) {
                "yes".into()
            } else {
                "-".into()
            },
            queue_list(&m["owned"]),
            text_of(m, "lag"),
        ]);
    }
    t.print();
}

pub(crate) fn print_describe(broker: &str, v: &serde_json::Value) {
    if v["mode"] == "kafkaClassic" {
        return print_kafka_classic(broker, v);
    }
    let text = |k: &str| text_of(v, k);
    let source = match v["assignorSource"].as_str() {
        Some("default") => " (default: balanced, moves the fewest queues)",
        Some("members") => " (chosen by the members)",
        _ => "",
    };
    println!(
        "group {}  mode {}  group epoch {}  target epoch {}  assignor {}{source}  reconciled {}  (coordinator {broker})",
        text("group"),
        text("mode"),
        text("groupEpoch"),
        text("targetEpoch"),
        text("assignor"),
        text("reconciled")
    );
    let mut t = Table::new(&[
        "MEMBER", "INSTANCE", "CLIENT", "HOST", "EPOCH", "STATE", "OWNED", "REVOKING", "TARGET",
        "LAG",
    ]);
    for m in v["members"].as_array().into_iter().flatten() {
        t.row(vec![
            m["memberId"].as_str().unwrap_or("?").to_string(),
            m["instanceId"].as_str().unwrap_or("-").to_string(),
            m["clientId"].as_str().unwrap_or("?").to_string(),
            text_of(m, "clientHost"),
            m["memberEpoch"].to_string(),
            m["state"].as_str().unwrap_or("?").to_string(),
            queue_list(&m["owned"]),
            queue_list(&m["revoking"]),
            queue_list(&m["target"]),
            m["lag"].to_string(),
        ]);
    }
    t.print();
    let classic: Vec<&str> = v["classicClients"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str())
        .collect();
    if !classic.is_empty() {
        println!("classic-only members: {}", classic.join(", "));
    }
    if v["pop"].is_object() {
        print_pop(&v["pop"]);
    }
}

/// The POP section of a group: consumers holding leases, queues, redeliveries, dead letters.
fn print_pop(p: &serde_json::Value) {
    println!(
        "POP: {} in flight under lease, {} leased, {} acked, {} redelivered (lease lapsed), {} receipts refused, {} dead-lettered, {} in the DLQ now",
        text_of(p, "inflight"),
        text_of(p, "leased"),
        text_of(p, "acked"),
        text_of(p, "redeliveries"),
        text_of(p, "refused"),
        text_of(p, "deadLettered"),
        text_of(p, "dlqMessages"),
    );
    let topics: Vec<&str> = p["popModeTopics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.as_str())
        .collect();
    if !topics.is_empty() {
        println!("POP request mode set for: {}", topics.join(", "));
    }
    let mut t = Table::new(&["CONSUMER", "IN FLIGHT"]);
    for c in p["consumers"].as_array().into_iter().flatten() {
        t.row(vec![text_of(c, "consumer"), text_of(c, "inflight")]);
    }
    t.print();
    let mut t = Table::new(&["TOPIC", "QUEUE", "ACKED", "CURSOR", "MAX", "IN FLIGHT"]);
    for q in p["queues"].as_array().into_iter().flatten() {
        t.row(vec![
            text_of(q, "topic"),
            text_of(q, "queueId"),
            text_of(q, "ackedOffset"),
            text_of(q, "cursor"),
            text_of(q, "maxOffset"),
            text_of(q, "inflight"),
        ]);
    }
    t.print();
}

pub(crate) fn print_history(broker: &str, v: &serde_json::Value) {
    println!(
        "group {}  (coordinator {broker})",
        v["group"].as_str().unwrap_or("?")
    );
    let mut t = Table::new(&[
        "EPOCH",
        "TIME",
        "CAUSE",
        "MEMBERS",
        "MOVED",
        "MOVES",
        "RECONCILED IN",
    ]);
    for r in v["rebalances"].as_array().into_iter().flatten() {
        let at = r["atMs"].as_u64().unwrap_or(0);
        let time = humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(at),
        )
        .to_string();
        let cause = &r["cause"];
        let who = cause["member"]
            .as_str()
            .map(str::to_string)
            .or_else(|| {
                cause["members"].as_array().map(|a| {
                    a.iter()
                        .filter_map(|m| m.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                })
            })
            .or_else(|| cause["topic"].as_str().map(str::to_string))
            .or_else(|| cause["assignor"].as_str().map(str::to_string))
            .unwrap_or_default();
        let moves: Vec<String> = r["moves"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                format!(
                    "{} {}->{}",
                    queue_name(&m["queue"]),
                    m["from"].as_str().unwrap_or("-"),
                    m["to"].as_str().unwrap_or("-")
                )
            })
            .collect();
        let moved = r["moves"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["from"].is_string() && m["to"].is_string())
            .count();
        let reconciled = match (r["reconciledAtMs"].as_u64(), r["superseded"].as_bool()) {
            (Some(done), _) => format!("{} ms", done.saturating_sub(at)),
            (None, Some(true)) => "superseded".into(),
            _ => "reconciling".into(),
        };
        t.row(vec![
            r["groupEpoch"].to_string(),
            time,
            format!("{} {who}", cause["kind"].as_str().unwrap_or("?")),
            r["members"].to_string(),
            moved.to_string(),
            if moves.is_empty() {
                "-".into()
            } else {
                moves.join(" ")
            },
            reconciled,
        ]);
    }
    t.print();
}
