//! Edges of `shoal send` and `shoal consume` a user hit (issue 45), run from the `shoal` binary
//! as separate processes against `shoal dev`, checked by what the user sees.

mod support;

use std::time::Duration;
use support::*;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_string()
}

/// A counter of the dev server's `/metrics` (0 when absent).
fn metric(dev: &Dev, series: &str) -> u64 {
    let (status, text) = dev.http_get("/metrics");
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn send_and_consume_edges() {
    let dev = Dev::start();

    // `--key` without a body on an empty standard input: nothing read, said so, exit 1.
    let o = dev.cmd_within(&["send", "Edges", "--key", "K"], Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(
        stderr(&o),
        "error: standard input was empty: nothing read, no message sent to Edges (give the body with --body or --size, or lines on standard input)"
    );

    // A one-shot send goes with binary headers, as the library's sends to a Shoal broker do
    // once it knows the broker: the broker counts it.
    let series = "shoal_broker_net_requests_binary_header_total{listener=\"remoting\"}";
    let before = metric(&dev, series);
    send(&dev, "Edges", "edge", 3);
    let after = metric(&dev, series);
    assert!(
        after >= before + 3,
        "three sends with binary headers: {before} -> {after}"
    );

    // `--count N --fail TEXT` ends after N deliveries, failed or not.
    let o = dev.cmd_within(
        &[
            "consume", "Edges", "--group", "edges", "--from", "first", "--count", "2", "--fail",
            "*",
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        out.lines().filter(|l| l.starts_with("FAILED ")).count(),
        2,
        "{out}"
    );
    assert!(
        stderr(&o).contains("2 messages consumed (2 failed, sent back for a later attempt)"),
        "{}",
        stderr(&o)
    );
}

/// A coordinated group whose consumers choose no strategy runs the coordinator's default
/// assignor, and `group describe` says so; a consumer that chooses one is followed.
#[test]
fn group_describe_says_where_the_assignor_comes_from() {
    let dev = Dev::start();
    let o = dev.cmd(&["topic", "create", "Assigned", "--queues", "4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let describe = |dev: &Dev| {
        let o = dev.cmd(&["group", "describe", "assigned"]);
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let wait = |what: &str, f: &dyn Fn(&str) -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let text = describe(&dev);
            if f(&text) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what} not seen: {text}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let _default = Proc {
        child: dev.spawn(&[
            "consume",
            "Assigned",
            "--group",
            "assigned",
            "--protocol",
            "coordinated",
        ]),
    };
    wait("the default assignor", &|t| {
        t.contains("assignor STICKY (default: balanced, moves the fewest queues)")
    });
    let v = dev.json(&["group", "describe", "assigned", "--json"]);
    assert_eq!(v["assignorSource"], "default", "{v}");
    let _chosen = Proc {
        child: dev.spawn(&[
            "consume",
            "Assigned",
            "--group",
            "assigned",
            "--protocol",
            "coordinated",
            "--strategy",
            "AVG",
        ]),
    };
    wait("the chosen assignor", &|t| {
        t.contains("assignor AVG (chosen by the members)")
    });
}
