//! `shoal send --property` and `shoal consume --sql` against `shoal dev` (property filter on):
//! only matching messages reach the consumer, and a selector that does not compile stops the
//! consumer at start with the broker's reason.

mod support;

use std::time::Duration;
use support::Dev;

#[test]
fn consume_with_an_sql92_selector() {
    let dev = Dev::start();
    assert!(dev
        .cmd(&["topic", "create", "SqlTopic", "--queues", "2"])
        .status
        .success());
    let o = dev.cmd(&[
        "send",
        "SqlTopic",
        "--body",
        "order-{i}",
        "--count",
        "8",
        "--property",
        "amount={i}",
        "--property",
        "region=eu",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let o = dev.cmd_within(
        &[
            "consume",
            "SqlTopic",
            "--group",
            "sql-g",
            "--from",
            "first",
            "--count",
            "3",
            "--json",
            "--sql",
            "region = 'eu' AND amount BETWEEN 5 AND 7",
        ],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut bodies: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["body"].as_str().unwrap().to_owned()
        })
        .collect();
    bodies.sort();
    assert_eq!(bodies, ["order-5", "order-6", "order-7"]);

    let o = dev.cmd_within(
        &[
            "consume", "SqlTopic", "--group", "sql-bad", "--sql", "amount >",
        ],
        Duration::from_secs(30),
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("SUBSCRIPTION_PARSE_FAILED") || err.contains("23"),
        "{err}"
    );
    assert!(err.contains("amount >"), "{err}");
}
