//! Coverage-guided fuzzing with libFuzzer, bounded in time, as CI runs it: every target of the
//! repository's `fuzz/` folder (the same functions as `shoal_fuzz::TARGETS`) for
//! `SHOAL_LIBFUZZER_SECS` seconds each (default 15), starting from the seeds of
//! `shoal_fuzz::seeds` and from the corpus earlier runs left in `target/fuzz-corpus/<target>`.
//!
//! It needs a nightly toolchain and cargo-fuzz (`.ci/setup.d/50-cargo-fuzz.sh` installs
//! cargo-fuzz under `target/external/cargo-fuzz`; one on `PATH` is used too). Without them the
//! test is skipped, unless `SHOAL_REQUIRE_EXTERNAL=1` (as `.ci/run` sets it), where it fails.
//! A crash fails the test with the input's path under `target/fuzz-artifacts/<target>/` and the
//! command that reproduces it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use shoal_fuzz::{seeds, TARGETS};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

fn required() -> bool {
    std::env::var("SHOAL_REQUIRE_EXTERNAL").is_ok_and(|v| v == "1")
}

fn skip(what: &str) {
    if required() {
        panic!("{what} (SHOAL_REQUIRE_EXTERNAL=1: a missing external tool is a failure)");
    }
    eprintln!("SKIPPED: {what}");
}

fn seconds_per_target() -> u64 {
    match std::env::var("SHOAL_LIBFUZZER_SECS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("SHOAL_LIBFUZZER_SECS={v:?} is not a number of seconds")),
        Err(_) => 15,
    }
}

/// cargo-fuzz as the setup script installs it, else from `PATH`.
fn cargo_fuzz(root: &Path) -> Option<PathBuf> {
    let installed = root.join("target/external/cargo-fuzz/bin/cargo-fuzz");
    if installed.is_file() {
        return Some(installed);
    }
    let on_path = Command::new("cargo-fuzz").arg("--version").output();
    on_path
        .is_ok_and(|o| o.status.success())
        .then(|| PathBuf::from("cargo-fuzz"))
}

fn nightly_present() -> bool {
    Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A cargo-fuzz command that builds with the nightly toolchain, whatever toolchain runs this
/// test (cargo's own variables of the outer `cargo test` are not passed on).
fn fuzz_command(cargo_fuzz: &Path, root: &Path) -> Command {
    let mut cmd = Command::new(cargo_fuzz);
    cmd.current_dir(root).env("RUSTUP_TOOLCHAIN", "nightly");
    for var in [
        "CARGO",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTFLAGS",
        "CARGO_TARGET_DIR",
    ] {
        cmd.env_remove(var);
    }
    // The same build options as the setup script, so that a prepared build is reused.
    cmd.args(["fuzz", "run", "--fuzz-dir", "fuzz", "-O", "-a"])
        .args(["--target-dir", "target/fuzz"]);
    cmd
}

fn write_seeds(dir: &Path, target: &str) {
    fs::create_dir_all(dir).expect("corpus directory");
    for (i, seed) in seeds::for_target(target).iter().enumerate() {
        fs::write(dir.join(format!("seed-{i:03}")), seed).expect("seed file");
    }
}

#[test]
fn every_target_runs_clean_for_a_bounded_time() {
    let root = repo_root();
    let Some(cargo_fuzz) = cargo_fuzz(&root) else {
        skip("cargo-fuzz is not installed (run .ci/setup.d/50-cargo-fuzz.sh)");
        return;
    };
    if !nightly_present() {
        skip("no nightly Rust toolchain (cargo-fuzz needs one)");
        return;
    }
    let secs = seconds_per_target();
    let manifest = fs::read_to_string(root.join("fuzz/Cargo.toml")).expect("fuzz/Cargo.toml");
    for (target, _) in TARGETS {
        assert!(
            manifest.contains(&format!("name = \"{target}\"")),
            "shoal_fuzz::TARGETS has {target}, fuzz/Cargo.toml has no such bin"
        );
        let corpus = root.join("target/fuzz-corpus").join(target);
        let artifacts = root.join("target/fuzz-artifacts").join(target);
        write_seeds(&corpus, target);
        fs::create_dir_all(&artifacts).expect("artifact directory");
        let started = Instant::now();
        let out = fuzz_command(&cargo_fuzz, &root)
            .arg(target)
            .arg(&corpus)
            .arg("--")
            .arg(format!("-max_total_time={secs}"))
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg("-rss_limit_mb=2048")
            .arg("-timeout=20")
            .arg("-print_final_stats=1")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", cargo_fuzz.display()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            let found: Vec<_> = fs::read_dir(&artifacts)
                .map(|d| d.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            let tail: String = stderr
                .lines()
                .rev()
                .take(60)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            panic!(
                "libFuzzer target {target} failed ({}); inputs: {found:?}\n\
                 reproduce: cargo +nightly fuzz run --fuzz-dir fuzz {target} <input>\n{tail}",
                out.status
            );
        }
        let runs = stderr
            .lines()
            .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
            .map(str::trim)
            .unwrap_or("?");
        let units = fs::read_dir(&corpus).map(|d| d.count()).unwrap_or(0);
        println!(
            "{target}: {runs} inputs in {:.1} s, corpus {units} inputs, no crash",
            started.elapsed().as_secs_f64()
        );
        assert_ne!(runs, "0", "libFuzzer ran no input of {target}");
    }
}
