//! End-to-end test of `shoal rebalance simulate` and `shoal rebalance sweep`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::process::Command;

fn shoal(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(args)
        .output()
        .expect("run shoal");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn simulate_json_reports_every_step_and_strategy() {
    let out = shoal(&[
        "rebalance",
        "simulate",
        "--queues",
        "8",
        "--members",
        "3",
        "--steps",
        "join,leave:c2,crash:mid",
        "--strategy",
        "avg,sticky,balanced-sticky",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let steps = v["steps"].as_array().expect("steps");
    // start, join, leave, crash, expire
    assert_eq!(steps.len(), 5);
    assert_eq!(steps[1]["step"], "join c4");
    let join = steps[1]["results"].as_array().expect("results");
    assert_eq!(join.len(), 3);
    assert_eq!(join[0]["strategy"], "AVG");
    // AVG: 8 queues, 3 -> 4 members moves 5 (minimum 2); STICKY moves exactly 2.
    assert_eq!(join[0]["moved"], 5);
    assert_eq!(join[0]["minimum_moves"], 2);
    assert_eq!(join[1]["moved"], 2);
    // The crash row: the crashed member's queues are stalled, so not complete.
    assert_eq!(steps[3]["results"][0]["complete"], false);
    assert_eq!(steps[4]["results"][0]["complete"], true);
    assert_eq!(steps[4]["results"][0]["exclusive"], true);
}

#[test]
fn simulate_table_and_show() {
    let out = shoal(&[
        "rebalance",
        "simulate",
        "--queues",
        "8",
        "--members",
        "3",
        "--steps",
        "join",
        "--strategy",
        "avg",
        "--show",
    ]);
    assert!(out.contains("== join c4 -> 4 members"), "{out}");
    assert!(out.contains("c1           ##......"), "{out}");
}

#[test]
fn sweep_reports_ratios() {
    let out = shoal(&[
        "rebalance",
        "sweep",
        "--queues",
        "16",
        "--max-members",
        "4",
        "--strategy",
        "avg,sticky",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v[1]["strategy"], "STICKY");
    assert_eq!(v[1]["moved"], v[1]["minimum_moves"]);
}

#[test]
fn bad_input_is_an_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["rebalance", "simulate", "--strategy", "nope"])
        .output()
        .expect("run shoal");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown allocation strategy"));
}
