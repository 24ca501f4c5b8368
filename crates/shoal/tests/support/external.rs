//! Tests that run programs from outside the workspace (official RocketMQ and Kafka clients, a
//! Java broker, a browser). They skip with a message when their tools are not installed, unless
//! `SHOAL_REQUIRE_EXTERNAL=1` (as `.ci/run` sets it), where a missing tool fails the test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    unreachable_pub,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether a missing external tool must fail the test instead of skipping it.
pub fn required() -> bool {
    std::env::var("SHOAL_REQUIRE_EXTERNAL").is_ok_and(|v| v == "1")
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// Reports a missing tool: panics when external tools are required, else prints and returns.
pub fn skip(what: &str) {
    if required() {
        panic!("{what} (SHOAL_REQUIRE_EXTERNAL=1: a missing external tool is a failure)");
    }
    eprintln!("SKIPPED: {what}");
}

/// Runs a script of `tests/compat` (or elsewhere under the root) with `SHOAL_BIN` set to the
/// built binary. Exit code 77 means "skipped: the tool is not installed".
pub fn run_script(script: &str, args: &[&str]) {
    let root = repo_root();
    let status = Command::new("bash")
        .arg(root.join(script))
        .args(args)
        .current_dir(&root)
        .env("SHOAL_BIN", env!("CARGO_BIN_EXE_shoal"))
        .status()
        .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
    match status.code() {
        Some(0) => {}
        Some(77) => skip(&format!("{script}: its external tool is not installed")),
        _ => panic!("{script} failed: {status}"),
    }
}
