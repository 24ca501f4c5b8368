//! `shoal consume --pop` against `shoal dev`: messages leased and acknowledged, a failed one
//! delivered again (attempt 2, through the POP retry topic), and `shoal group describe`
//! showing the POP group.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use std::time::Duration;
use support::Dev;

fn json_lines(out: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn consume_by_pop_acks_retries_and_describes() {
    let dev = Dev::start();
    assert!(dev
        .cmd(&["topic", "create", "PopTopic", "--queues", "2"])
        .status
        .success());
    let o = dev.cmd(&["send", "PopTopic", "--body", "order-{i}", "--count", "4"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // order-1 fails: it is printed FAILED and made invisible for the retry delay; the other
    // three are acknowledged.
    let pop = |extra: &[&str]| {
        let mut args = vec![
            "consume", "PopTopic", "--group", "pop-g", "--pop", "--from", "first", "--json",
        ];
        args.extend_from_slice(extra);
        dev.cmd_within(&args, Duration::from_secs(60))
    };
    let o = pop(&[
        "--count",
        "3",
        "--fail",
        "order-1",
        "--retry-delay-secs",
        "1",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines = json_lines(&o.stdout);
    let mut ok: Vec<&str> = lines
        .iter()
        .filter(|v| v["failed"] == false)
        .map(|v| v["body"].as_str().unwrap())
        .collect();
    ok.sort();
    assert_eq!(ok, ["order-0", "order-2", "order-3"]);
    assert!(lines
        .iter()
        .any(|v| v["failed"] == true && v["body"] == "order-1" && v["attempt"] == 1));

    // It comes back to the next consumer of the group: second attempt, reconsumed once.
    let o = pop(&["--count", "1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines = json_lines(&o.stdout);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["body"], "order-1");
    assert_eq!(lines[0]["attempt"], 2);
    assert_eq!(lines[0]["topic"], "PopTopic");

    let o = dev.cmd(&["group", "describe", "pop-g", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["pop"]["acked"], 4, "{v}");
    assert_eq!(v["pop"]["inflight"], 0, "{v}");
    assert!(v["pop"]["redeliveries"].as_u64().unwrap() >= 1, "{v}");
    let o = dev.cmd(&["group", "describe", "pop-g"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("POP: 0 in flight under lease"), "{text}");
}
