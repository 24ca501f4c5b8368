//! `shoal bench` as a process: argument errors, and short produce / consume / e2e / rebalance
//! runs against `shoal dev` whose JSON reports must have the right shape and add up
//! (sent = acknowledged + errors; consumed >= acknowledged; nothing lost; for rebalance in
//! classic mode no overlaps and no stale deliveries).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;
use serde_json::Value;
use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::free_port;

/// A `shoal dev` process, killed on drop.
struct Dev {
    child: Child,
    namesrv: String,
    _dir: tempfile::TempDir,
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Dev {
    fn start() -> Dev {
        let dir = tempfile::tempdir().unwrap();
        let (np, bp) = (free_port(), free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_shoal"))
            .args(["dev", "--namesrv-port", &np.to_string()])
            .args(["--broker-port", &bp.to_string()])
            .arg("--data-dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn shoal dev");
        let dev = Dev {
            child,
            namesrv: format!("127.0.0.1:{np}"),
            _dir: dir,
        };
        // Ready when the broker is registered: a topic can be created through the name server.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = dev.shoal(
                &["topic", "create", "BenchReady", "--queues", "1"],
                Duration::from_secs(10),
            );
            if out.status.success() {
                break;
            }
            assert!(Instant::now() < deadline, "shoal dev never became ready");
            std::thread::sleep(Duration::from_millis(200));
        }
        dev
    }

    fn shoal(&self, args: &[&str], timeout: Duration) -> Output {
        run(
            Command::new(env!("CARGO_BIN_EXE_shoal"))
                .args(["--namesrv", &self.namesrv])
                .args(args),
            timeout,
        )
    }

    /// Runs `shoal bench <args> --json`, checks it succeeded, returns the report.
    fn bench(&self, args: &[&str]) -> Value {
        self.bench_within(args, Duration::from_secs(60))
    }

    /// `bench` with another time limit.
    fn bench_within(&self, args: &[&str], limit: Duration) -> Value {
        let mut all = vec!["--json", "bench"];
        all.extend_from_slice(args);
        let out = self.shoal(&all, limit);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "bench {args:?} failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
    }
}

/// Runs a command with a time limit (killed when it runs over).
fn run(cmd: &mut Command, timeout: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shoal");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stdout.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stderr.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} ran over {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out_reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
    }
}

fn u(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{path} missing or not a count in {v}"))
}

fn f(v: &Value, path: &str) -> f64 {
    v.pointer(path)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{path} missing or not a number in {v}"))
}

fn check_latency(v: &Value, path: &str) {
    let p = |q: &str| f(v, &format!("{path}/{q}"));
    assert!(u(v, &format!("{path}/count")) > 0, "{path}: no samples");
    assert!(p("p50_ms") > 0.0);
    assert!(p("p50_ms") <= p("p90_ms"), "{path}");
    assert!(p("p90_ms") <= p("p99_ms"), "{path}");
    assert!(p("p99_ms") <= p("p999_ms"), "{path}");
    assert!(p("p999_ms") <= p("max_ms"), "{path}");
}

fn check_produce_adds_up(r: &Value) {
    let sent = u(r, "/produce/sent");
    let acked = u(r, "/produce/acknowledged");
    let errors = u(r, "/produce/errors");
    assert_eq!(sent, acked + errors, "sent = acknowledged + errors: {r}");
    let by_kind: u64 = r
        .pointer("/produce/errors_by_kind")
        .and_then(Value::as_object)
        .expect("errors_by_kind")
        .values()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(by_kind, errors, "errors by kind add up: {r}");
    assert!(acked > 0, "nothing acknowledged: {r}");
    assert!(f(r, "/produce/msgs_per_s") > 0.0);
    assert!(f(r, "/produce/mb_per_s") > 0.0);
    check_latency(r, "/produce/ack_latency");
}

#[test]
fn argument_errors_are_reported() {
    // These fail before any connection is made (the name server is not even there).
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "produce", "--size", "0"], "--size"),
        (&["bench", "produce", "--producers", "0"], "--producers"),
        (&["bench", "produce", "--batch", "0"], "--batch"),
        (&["bench", "produce", "--duration", "soon"], "soon"),
        (
            &["bench", "produce", "--duration", "1s", "--count", "5"],
            "cannot be used with",
        ),
        (&["bench", "e2e", "--size", "10"], "at least 24"),
        (&["bench", "e2e", "--consumers", "0"], "--consumers"),
        (
            &["bench", "e2e", "--strategy", "NOPE"],
            "unknown allocation strategy",
        ),
        (
            &["bench", "rebalance", "--schedule", "leave:4"],
            "no consumer",
        ),
        (
            &["bench", "rebalance", "--schedule", "grow:1"],
            "unknown kind",
        ),
        (&["bench", "rebalance", "--rate", "0"], "positive --rate"),
        (
            &["bench", "rebalance", "--schedule", "pause:4"],
            "no consumer",
        ),
        (&["bench", "rebalance", "--repeat", "0"], "--repeat"),
        (
            &["bench", "rebalance", "--stagger", "1s", "--interval", "1s"],
            "--stagger",
        ),
        (
            &[
                "bench",
                "rebalance",
                "--schedule",
                "join:1,leave:1",
                "--repeat",
                "x",
            ],
            "invalid value",
        ),
        (&["bench", "consume", "--from", "middle"], "middle"),
        (&["bench", "fly"], "unrecognized subcommand"),
    ];
    for (args, needle) in cases {
        let out = run(
            Command::new(env!("CARGO_BIN_EXE_shoal"))
                .args(["--namesrv", "127.0.0.1:1"])
                .args(*args),
            Duration::from_secs(20),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            stderr.contains(needle),
            "{args:?}: {needle:?} not in {stderr}"
        );
    }
}

#[test]
fn short_runs_against_shoal_dev_add_up() {
    let dev = Dev::start();

    // Produce a fixed count in batches: every message is accounted for.
    let r = dev.bench(&[
        "produce",
        "--topic",
        "BenchP",
        "--queues",
        "4",
        "--count",
        "400",
        "--batch",
        "4",
        "--producers",
        "2",
        "--size",
        "64",
    ]);
    assert_eq!(r["mode"], "produce");
    assert_eq!(u(&r, "/produce/sent"), 400);
    check_produce_adds_up(&r);
    assert!(r["consume"].is_null());

    // Drain them with a fresh group of two.
    let r = dev.bench(&[
        "consume",
        "--topic",
        "BenchP",
        "--queues",
        "4",
        "--consumers",
        "2",
        // Stop on the evidence (all 400 seen), not on a quiet second: the second member's
        // join moves queues, and a hand-over pause longer than an idle bound is no loss.
        "--count",
        "400",
        "--duration",
        "60s",
    ]);
    assert_eq!(r["mode"], "consume");
    assert!(u(&r, "/consume/consumed") >= 400, "{r}");
    assert_eq!(u(&r, "/consume/foreign"), 0);

    // The same messages again by POP, another fresh group of two: each once (the leases of
    // 60 s do not lapse in this run).
    let r = dev.bench(&[
        "consume",
        "--topic",
        "BenchP",
        "--queues",
        "4",
        "--consumers",
        "2",
        "--pop",
        "--count",
        "400",
        "--duration",
        "60s",
    ]);
    assert_eq!(r["mode"], "consume");
    assert_eq!(u(&r, "/consume/unique"), 400, "{r}");
    assert_eq!(u(&r, "/consume/duplicates"), 0, "{r}");
    assert_eq!(u(&r, "/consume/foreign"), 0, "{r}");

    // Produce and consume at a fixed rate: at least once, nothing lost.
    let r = dev.bench(&[
        "e2e",
        "--topic",
        "BenchE",
        "--queues",
        "4",
        "--rate",
        "300",
        "--duration",
        "2s",
        "--consumers",
        "2",
        "--drain",
        "10s",
    ]);
    assert_eq!(r["mode"], "e2e");
    check_produce_adds_up(&r);
    let acked = u(&r, "/produce/acknowledged");
    assert!(
        (450..=650).contains(&acked),
        "about 300/s for 2 s expected: {r}"
    );
    assert!(u(&r, "/consume/consumed") >= acked, "consumed >= sent: {r}");
    assert_eq!(u(&r, "/consume/unique"), acked, "{r}");
    assert_eq!(u(&r, "/consume/lost"), 0, "{r}");
    check_latency(&r, "/consume/e2e_latency");
}

/// A short rebalance schedule run twice: a staggered join of two, a pause longer than the
/// session, a crash, a graceful leave. Classic mode (hand-over by locks): every safety figure
/// must be zero (no overlaps, no stale delivery after the resume, nothing lost), the frozen
/// member's queues must move before it resumes, and every field must carry a real value.
#[test]
fn rebalance_schedule_with_pause_and_repeats() {
    let dev = Dev::start();
    let r = dev.bench_within(
        &[
            "rebalance",
            "--topic",
            "BenchR",
            "--queues",
            "4",
            "--consumers",
            "1",
            "--schedule",
            "join:2,pause:1,kill:1,leave:1",
            "--repeat",
            "2",
            "--stagger",
            "20ms",
            "--interval",
            "2s",
            "--session-timeout",
            "2s",
            "--pause-for",
            "3500ms",
            "--mode",
            "classic",
            "--rate",
            "200",
            "--drain",
            "15s",
            "--persist-offset-interval",
            "500ms",
        ],
        Duration::from_secs(150),
    );
    assert_eq!(r["mode"], "rebalance");
    check_produce_adds_up(&r);
    let acked = u(&r, "/produce/acknowledged");
    assert!(u(&r, "/consume/consumed") >= acked, "{r}");
    assert_eq!(u(&r, "/consume/lost"), 0, "{r}");
    assert_eq!(u(&r, "/rebalance/queues"), 4);
    assert_eq!(
        r.pointer("/rebalance/mode").and_then(Value::as_str),
        Some("classic")
    );
    assert_eq!(f(&r, "/rebalance/stagger_ms"), 20.0);
    assert_eq!(u(&r, "/rebalance/repeat"), 2);
    assert_eq!(f(&r, "/rebalance/session_timeout_ms"), 2000.0);
    assert_eq!(f(&r, "/rebalance/pause_for_ms"), 3500.0);
    let events = r
        .pointer("/rebalance/events")
        .and_then(Value::as_array)
        .expect("events");
    let names: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(
        names,
        [
            "start 1", "join 2", "pause 1", "kill 1", "leave 1", "join 2", "pause 1", "kill 1",
            "leave 1"
        ],
        "{r}"
    );
    let rounds: Vec<u64> = events.iter().map(|e| u(e, "/round")).collect();
    assert_eq!(rounds, [0, 1, 1, 1, 1, 2, 2, 2, 2]);
    let sizes: Vec<(u64, u64)> = events
        .iter()
        .map(|e| (u(e, "/from"), u(e, "/to")))
        .collect();
    assert_eq!(
        sizes,
        [
            (0, 1),
            (1, 3),
            (3, 3),
            (3, 2),
            (2, 1),
            (1, 3),
            (3, 3),
            (3, 2),
            (2, 1)
        ]
    );
    for e in events {
        let kind = e["kind"].as_str().expect("kind");
        // Safety: never two owners of a queue at once, nothing lost.
        assert_eq!(u(e, "/overlaps"), 0, "two owners at once: {e}\n{r}");
        assert_eq!(u(e, "/lost"), 0, "{e}");
        let conv = e["convergence_ms"]
            .as_f64()
            .unwrap_or_else(|| panic!("no convergence within the interval: {e}"));
        assert!(conv > 0.0, "{e}");
        assert!(f(e, "/pause_ms") > 0.0, "{e}");
        match kind {
            "pause" => {
                // Frozen past its session: its queues moved to the others before it resumed
                // (a generous liveness bound: before the resume), and once resumed it
                // delivered nothing stale.
                let t = f(e, "/takeover_ms");
                assert!(t > 0.0 && t < 3500.0, "{e}");
                assert_eq!(u(e, "/stale"), 0, "stale deliveries after the resume: {e}");
                assert!(f(e, "/resumed_at_s") > f(e, "/at_s") + 3.0, "{e}");
                // Its pause is the freeze, at least until the session expired.
                assert!(f(e, "/pause_ms") >= 1000.0, "{e}");
            }
            "kill" => {
                assert!(f(e, "/takeover_ms") > 0.0, "{e}");
                assert!(e["stale"].is_null(), "{e}");
            }
            _ => {
                assert!(e["takeover_ms"].is_null(), "{e}");
                assert!(e["stale"].is_null(), "{e}");
                assert!(e["resumed_at_s"].is_null(), "{e}");
            }
        }
    }
    let dups: u64 = events.iter().map(|e| u(e, "/duplicates")).sum();
    assert!(dups <= u(&r, "/consume/duplicates"), "{r}");
    // The summary: one entry per kind, over both rounds, its figures from the events.
    let summary = r
        .pointer("/rebalance/summary")
        .and_then(Value::as_array)
        .expect("summary");
    let kinds: Vec<&str> = summary.iter().filter_map(|k| k["kind"].as_str()).collect();
    assert_eq!(kinds, ["join", "leave", "pause", "kill"], "{r}");
    for k in summary {
        let kind = k["kind"].as_str().unwrap_or_default();
        assert_eq!(u(k, "/events"), 2, "{k}");
        assert_eq!(u(k, "/not_converged"), 0, "{k}");
        assert_eq!(u(k, "/convergence/count"), 2, "{k}");
        let (p50, p99, max) = (
            f(k, "/convergence/p50_ms"),
            f(k, "/convergence/p99_ms"),
            f(k, "/convergence/max_ms"),
        );
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{k}");
        let of_kind: Vec<&Value> = events.iter().filter(|e| e["kind"] == kind).collect();
        let most = of_kind
            .iter()
            .map(|e| f(e, "/convergence_ms"))
            .fold(0.0, f64::max);
        assert_eq!(max, most, "{k}");
        let d: u64 = of_kind.iter().map(|e| u(e, "/duplicates")).sum();
        assert_eq!(u(k, "/duplicates"), d, "{k}");
        assert_eq!(u(k, "/overlaps"), 0, "{k}");
        assert_eq!(u(k, "/stale"), 0, "{k}");
        assert_eq!(u(k, "/lost"), 0, "{k}");
        if kind == "pause" || kind == "kill" {
            assert_eq!(u(k, "/takeover/count"), 2, "{k}");
            assert!(f(k, "/takeover/p50_ms") <= f(k, "/takeover/p99_ms"), "{k}");
        } else {
            assert_eq!(u(k, "/takeover/count"), 0, "{k}");
            assert!(
                k.pointer("/takeover/p50_ms").is_some_and(Value::is_null),
                "{k}"
            );
        }
    }
}

/// Coordinated mode with no strategy chosen: the coordinator's default assignor, balanced and
/// moving the minimum. 16 queues: 4 members joining 4 move 8 queues (AVG moved 14), 4 leaving
/// move their 8.
#[test]
fn coordinated_rebalance_moves_the_minimum_by_default() {
    let dev = Dev::start();
    let r = dev.bench_within(
        &[
            "rebalance",
            "--topic",
            "BenchC",
            "--queues",
            "16",
            "--consumers",
            "4",
            "--schedule",
            "join:4,leave:4",
            "--stagger",
            "20ms",
            "--interval",
            "4s",
            "--mode",
            "coordinated",
            "--rate",
            "100",
            "--drain",
            "10s",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(
        r.pointer("/rebalance/strategy").and_then(Value::as_str),
        Some("default (STICKY)"),
        "{r}"
    );
    let events = r
        .pointer("/rebalance/events")
        .and_then(Value::as_array)
        .expect("events");
    let moved: Vec<(&str, u64)> = events
        .iter()
        .filter(|e| e["kind"] != "start")
        .map(|e| (e["event"].as_str().unwrap_or("?"), u(e, "/moved_queues")))
        .collect();
    assert_eq!(moved, [("join 4", 8), ("leave 4", 8)], "{r}");
    assert_eq!(u(&r, "/consume/lost"), 0, "{r}");
}
