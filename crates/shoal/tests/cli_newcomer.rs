//! Issue 16's "the CLI, as a new user found it": each rough edge, run from the `shoal` binary
//! as separate processes against `shoal dev`, checked by what the user sees.

mod support;

use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_string()
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn bodies(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| v["body"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Messages stored in a topic (sum of max offsets).
fn stored(dev: &Dev, topic: &str) -> i64 {
    let out = dev.cmd(&["topic", "status", topic, "--json"]);
    if !out.status.success() {
        return 0;
    }
    serde_json::from_slice::<Value>(&out.stdout)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|q| q["maxOffset"].as_i64().unwrap_or(0))
        .sum()
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen in {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn banner_commands_work_as_printed() {
    let dir = tempfile::tempdir().unwrap();
    let ns = free_port();
    let mut dev = Proc {
        child: Command::new(shoal())
            .args([
                "dev",
                "--namesrv-port",
                &ns.to_string(),
                "--broker-port",
                &free_port().to_string(),
                "--http-port",
                "0",
                "--data-dir",
                dir.path().join("data").to_str().unwrap(),
            ])
            .env_remove("SHOAL_NAMESRV")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    };
    let mut lines = BufReader::new(dev.child.stdout.take().unwrap()).lines();
    let mut hints = Vec::new();
    let mut in_hints = false;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if in_hints {
            hints.push(line.trim().to_string());
            if hints.len() == 2 {
                break;
            }
        } else if line.trim() == "Try it:" {
            in_hints = true;
        }
    }
    assert_eq!(hints.len(), 2, "{hints:?}");
    let ns_flag = format!("--namesrv 127.0.0.1:{ns}");
    assert!(
        hints.iter().all(|h| h.ends_with(&ns_flag)),
        "the hints name the name server on a non-default port: {hints:?}"
    );
    // Run them as printed, by a shell, with `shoal` on the PATH and no SHOAL_NAMESRV.
    let bin_dir = std::path::Path::new(shoal()).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    let run = |line: &str| {
        Command::new("bash")
            .args(["-c", line])
            .env("PATH", &path)
            .env_remove("SHOAL_NAMESRV")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let sent = run(&hints[0]);
    assert!(sent.status.success(), "{}: {}", hints[0], stderr(&sent));
    assert_eq!(stdout(&sent).lines().count(), 3, "{}", stdout(&sent));
    let got = run(&hints[1]);
    assert!(got.status.success(), "{}: {}", hints[1], stderr(&got));
    let printed: BTreeSet<String> = stdout(&got)
        .lines()
        .filter_map(|l| l.split("body=").nth(1).map(str::to_string))
        .collect();
    assert_eq!(
        printed,
        BTreeSet::from(["hello 0".into(), "hello 1".into(), "hello 2".into()]),
        "{}",
        stdout(&got)
    );
    dev.sigterm();
    assert!(dev.wait_exit(Duration::from_secs(20)));
    drop(lines);
}

#[test]
fn send_and_consume_as_a_newcomer_expects() {
    let dev = Dev::start();
    assert!(dev
        .cmd(&["topic", "create", "Count", "--queues", "4"])
        .status
        .success());
    let all: BTreeSet<String> = send(&dev, "Count", "c", 10).into_iter().collect();

    // consume --count 1 prints one message and commits at most that one.
    let o = dev.cmd_within(
        &[
            "consume", "Count", "--group", "cnt", "--from", "first", "--count", "1", "--json",
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let first = bodies(&stdout(&o));
    assert_eq!(first.len(), 1, "{}", stdout(&o));
    assert!(!stderr(&o).contains("WARN"), "{}", stderr(&o));
    let p = dev.json(&["group", "progress", "cnt", "--json"]);
    let committed: i64 = p["queues"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|q| q["topic"] == "Count")
        .map(|q| q["consumerOffset"].as_i64().unwrap())
        .sum();
    assert!(
        committed <= 1,
        "committed {committed} after one message: {p}"
    );
    // The rest is still there for the group: nothing fetched beyond the count was lost, even
    // from a queue the first consumer locked but had not started when its count was reached
    // (the position it chose is committed with the release), though this one starts from last.
    let rest = (10 - committed).to_string();
    let o = dev.cmd_within(
        &[
            "consume", "Count", "--group", "cnt", "--count", &rest, "--json",
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let mut seen: BTreeSet<String> = bodies(&stdout(&o)).into_iter().collect();
    seen.extend(first);
    assert_eq!(seen, all);

    // send reads standard input line by line and sends each line as it arrives.
    let mut live = Command::new(shoal())
        .args(["send", "Live"])
        .env("SHOAL_NAMESRV", &dev.namesrv)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = live.stdin.take().unwrap();
    writeln!(stdin, "line one").unwrap();
    stdin.flush().unwrap();
    wait_for(
        "the first line sent while stdin is open",
        Duration::from_secs(30),
        || stored(&dev, "Live") == 1,
    );
    writeln!(stdin, "line two").unwrap();
    drop(stdin);
    let out = live.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stored(&dev, "Live"), 2);

    // --count limits the lines read from standard input.
    let mut five = Command::new(shoal())
        .args(["send", "Five", "--count", "2"])
        .env("SHOAL_NAMESRV", &dev.namesrv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    five.stdin
        .take()
        .unwrap()
        .write_all(b"1\n2\n3\n4\n5\n")
        .unwrap();
    let out = five.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 2);
    assert_eq!(stored(&dev, "Five"), 2);

    // A failed send does not stop the others; the exit code and the last line say how many.
    let mut mixed = Command::new(shoal())
        .args(["send", "Mixed"])
        .env("SHOAL_NAMESRV", &dev.namesrv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let big = "x".repeat(5 * 1024 * 1024);
    mixed
        .stdin
        .take()
        .unwrap()
        .write_all(format!("small-a\n{big}\nsmall-b\n").as_bytes())
        .unwrap();
    let out = mixed.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("error: message 1 to Mixed not sent"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).ends_with("error: 1 of 3 messages not sent to Mixed (2 sent)"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stored(&dev, "Mixed"), 2);

    // bench produce --rate max, as documented.
    let o = dev.cmd(&[
        "bench", "produce", "--topic", "Bench", "--rate", "max", "--count", "20",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stored(&dev, "Bench"), 20);

    // A consumer started before its topic exists gets the first message at once (not after
    // the client's 30 s route refresh), even from the default `--from last`.
    let mut early = Proc {
        child: dev.spawn(&["consume", "Later", "--group", "early", "--json"]),
    };
    std::thread::sleep(Duration::from_secs(1));
    send(&dev, "Later", "later", 1);
    let mut lines = BufReader::new(early.child.stdout.take().unwrap()).lines();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if let Some(Ok(l)) = lines.next() {
            let _ = tx.send(l);
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("the early consumer printed the message within 15 s");
    assert!(line.contains("later-0"), "{line}");
    early.sigterm();
    assert!(early.wait_exit(Duration::from_secs(20)));

    // consume --fail and --max-reconsume-times 0: the message goes to the dead-letter queue;
    // dlq list shows it and dlq resend sends it back.
    send(&dev, "Bad", "bad", 1);
    let mut failing = Proc {
        child: dev.spawn(&[
            "consume",
            "Bad",
            "--group",
            "badg",
            "--from",
            "first",
            "--fail",
            "bad",
            "--max-reconsume-times",
            "0",
        ]),
    };
    wait_for("a dead letter", Duration::from_secs(60), || {
        let o = dev.cmd(&["dlq", "list", "--group", "badg", "--json"]);
        stdout(&o).contains("bad-0")
    });
    failing.sigterm();
    assert!(failing.wait_exit(Duration::from_secs(20)));
    let o = dev.cmd(&["dlq", "resend", "--group", "badg"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("-> Bad"), "{}", stdout(&o));
    assert_eq!(stored(&dev, "Bad"), 2);
}

#[test]
fn admin_verbs_operators_use_daily() {
    let dev = Dev::start();
    // topic create refuses an existing topic; update warns when queues shrink.
    assert!(dev
        .cmd(&["topic", "create", "Shop", "--queues", "4"])
        .status
        .success());
    let o = dev.cmd(&["topic", "create", "Shop", "--queues", "2"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "error: topic Shop exists already (4 queues on broker-a); use `shoal topic update` (or --update) to change it"
    );
    let v = dev.json(&["topic", "route", "Shop", "--json"]);
    assert_eq!(v["queueDatas"][0]["writeQueueNums"], 4, "nothing changed");
    let o = dev.cmd(&["topic", "update", "Shop", "--queues", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).starts_with("warning: topic Shop shrinks from 4 to 2 queues on broker-a"),
        "{}",
        stderr(&o)
    );
    let o = dev.cmd(&["topic", "create", "Shop", "--queues", "4", "--update"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).is_empty(),
        "growing warns of nothing: {}",
        stderr(&o)
    );

    // A live group: two members with one client id and different subscriptions.
    let keys: Vec<String> = (0..6).map(|i| format!("key-{i}")).collect();
    let o = dev.cmd(&[
        "send",
        "Shop",
        "--body",
        "order-{i}",
        "--key",
        "key-{i}",
        "--count",
        "6",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut m1 = Proc {
        child: dev.spawn(&[
            "consume",
            "Shop",
            "--group",
            "shop",
            "--from",
            "first",
            "--instance",
            "same",
        ]),
    };
    wait_for("shop consumed everything", Duration::from_secs(30), || {
        let o = dev.cmd(&["group", "progress", "shop", "--topic", "Shop", "--json"]);
        serde_json::from_slice::<Value>(&o.stdout)
            .map(|p| {
                p["totalLag"] == 0
                    && p["queues"]
                        .as_array()
                        .is_some_and(|q| q.iter().all(|q| !q["owner"].is_null()))
            })
            .unwrap_or(false)
    });
    // Consumed positions come from the owner at once; committed offsets follow every 5 s.
    let p = dev.json(&["group", "progress", "shop", "--topic", "Shop", "--json"]);
    let queues = p["queues"].as_array().unwrap();
    assert!(queues.iter().all(|q| q["topic"] == "Shop"), "{p}");
    assert!(
        queues
            .iter()
            .all(|q| q["brokerOffset"] == 0 || q["consumedOffset"].is_i64()),
        "the owner reports its position: {p}"
    );
    let consumed: i64 = queues
        .iter()
        .map(|q| q["consumedOffset"].as_i64().unwrap_or(0))
        .sum();
    assert_eq!(consumed, 6, "{p}");
    let o = dev.cmd(&["group", "progress", "shop"]);
    let header = stdout(&o).lines().next().unwrap_or_default().to_string();
    for col in ["COMMITTED", "CONSUMED", "LAST COMMITTED MESSAGE STORED AT"] {
        assert!(header.contains(col), "{header}");
    }
    let o = dev.cmd(&["group", "progress", "shop", "--topic", "Nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "error: consumer group shop has no queue of topic Nope"
    );
    // --watch prints again until stopped.
    let mut watch = Proc {
        child: dev.spawn(&["group", "progress", "shop", "--watch", "1"]),
    };
    let mut out = BufReader::new(watch.child.stdout.take().unwrap()).lines();
    let mut headers = 0;
    while headers < 2 {
        let line = out.next().expect("watch keeps printing").unwrap();
        if line.starts_with("TOPIC") {
            headers += 1;
        }
    }
    watch.sigkill();

    // Duplicate client ids and inconsistent subscriptions show in the text output.
    let mut m2 = Proc {
        child: dev.spawn(&[
            "consume",
            "Shop",
            "--group",
            "shop",
            "--instance",
            "same",
            "--tag-expr",
            "vip",
        ]),
    };
    wait_for("both warnings", Duration::from_secs(30), || {
        let o = dev.cmd(&["group", "connections", "shop"]);
        let text = stdout(&o);
        text.contains("WARNING: client ids used by more than one connection: 127.0.0.1@same")
            && text.contains("WARNING: members subscribe differently to: Shop")
    });
    m2.sigterm();
    assert!(m2.wait_exit(Duration::from_secs(20)));

    // group list: members, mode, lag, state.
    let o = dev.cmd(&[
        "consume", "Shop", "--group", "gone", "--from", "first", "--count", "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = dev.cmd(&["group", "list"]);
    assert!(stdout(&o).starts_with("GROUP"), "{}", stdout(&o));
    let mut list = Value::Null;
    wait_for(
        "group list shows shop stable",
        Duration::from_secs(30),
        || {
            list = dev.json(&["group", "list", "--json"]);
            list.as_array().unwrap().iter().any(|g| {
                g["group"] == "shop" && g["members"] == 1 && g["state"] == "STABLE" && g["lag"] == 0
            })
        },
    );
    let gone = list
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == "gone")
        .cloned()
        .unwrap_or_else(|| panic!("{list}"));
    assert_eq!(gone["members"], 0);
    assert_eq!(gone["state"], "EMPTY");
    assert!(gone["lag"].as_i64().unwrap() >= 4, "{gone}");

    // group delete: refused while members are online, done when they left.
    let o = dev.cmd(&["group", "delete", "shop"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "error: consumer group shop has 1 member(s) online; stop them first"
    );
    let o = dev.cmd(&["group", "delete", "gone"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let list = dev.json(&["group", "list", "--json"]);
    assert!(
        !list
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["group"] == "gone"),
        "{list}"
    );
    m1.sigterm();
    assert!(m1.wait_exit(Duration::from_secs(20)));

    // message query --key.
    let found = dev.cmd(&[
        "message", "query", "--topic", "Shop", "--key", &keys[3], "--json",
    ]);
    assert!(found.status.success(), "{}", stderr(&found));
    assert_eq!(bodies(&stdout(&found)), vec!["order-3".to_string()]);

    // broker status: the broker's runtime counters.
    let s = dev.json(&["broker", "status", "--json"]);
    let (_, table) = s.as_object().unwrap().iter().next().unwrap();
    let put: i64 = table["msgPutTotal"].as_str().unwrap().parse().unwrap();
    assert!(put >= 6, "{s}");

    // topic list hides system topics unless --system.
    let topics = dev.json(&["topic", "list", "--json"]);
    let topics: Vec<&str> = topics
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    assert!(topics.contains(&"Shop"), "{topics:?}");
    assert!(!topics.iter().any(|t| t.starts_with('%')), "{topics:?}");
    let all = dev.json(&["topic", "list", "--system", "--json"]);
    let all: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    assert!(topics.iter().all(|t| all.contains(t)), "{all:?}");
    assert!(
        all.len() > topics.len(),
        "system topics with --system: {all:?}"
    );
}

#[test]
fn small_things_a_newcomer_tripped_on() {
    let unreachable = format!("127.0.0.1:{}", free_port());
    let run = |args: &[&str]| {
        Command::new(shoal())
            .args(args)
            .env_remove("SHOAL_NAMESRV")
            .output()
            .unwrap()
    };
    // --delay-level out of range is refused, not clamped.
    let o = run(&["send", "T", "--body", "x", "--delay-level", "99"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("99 is not in 1..=18"), "{}", stderr(&o));
    // --from's error names the words its help names.
    let o = run(&[
        "consume",
        "T",
        "--group",
        "g",
        "--from",
        "yesterday",
        "--namesrv",
        &unreachable,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "error: cannot read --from \"yesterday\": use first, last, epoch milliseconds, an RFC 3339 time or a duration ago such as 10m"
    );
    // The server commands neither list nor accept the client options.
    for sub in ["namesrv", "dev", "controller"] {
        let o = run(&[sub, "--help"]);
        assert_eq!(o.status.code(), Some(0));
        let help = stdout(&o);
        for flag in ["--namesrv ", "--json", "--access-key", "--credentials-file"] {
            assert!(!help.contains(flag), "{sub} --help lists {flag}: {help}");
        }
        let o = run(&[sub, "--namesrv", "127.0.0.1:1"]);
        assert_eq!(o.status.code(), Some(2));
        assert!(
            stderr(&o).contains("takes no client options"),
            "{}",
            stderr(&o)
        );
        let o = run(&[sub, "--json"]);
        assert_eq!(o.status.code(), Some(2));
    }
    // --json version.
    let o = run(&["--json", "version"]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(v["remotingVersion"].is_number());
    // A send to an unreachable name server: one error, said once.
    let o = run(&["send", "T", "--body", "x", "--namesrv", &unreachable]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert_eq!(
        e.matches("Connection refused").count(),
        1,
        "the cause is said once: {e}"
    );
    // A consumer with a wrong name server says so and exits, instead of "subscribed".
    let o = run(&["consume", "T", "--group", "g", "--namesrv", &unreachable]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.starts_with(&format!("error: no name server reachable ({unreachable})")),
        "{e}"
    );
    assert!(!e.contains("subscribed"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn broker_reads_namesrv_addrs_from_its_config_file() {
    let dev = Dev::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broker.toml");
    std::fs::write(
        &file,
        format!(
            "broker_name = \"broker-t\"\nlisten_addr = \"127.0.0.1:{}\"\nnamesrv_addrs = [\"{}\"]\ndata_dir = \"{}\"\n",
            free_port(),
            dev.namesrv,
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let mut broker = Proc {
        child: Command::new(shoal())
            .args(["broker", "-c", file.to_str().unwrap()])
            .env_remove("SHOAL_NAMESRV")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    };
    wait_for(
        "broker-t registered with the file's name server",
        Duration::from_secs(30),
        || stdout(&dev.cmd(&["cluster", "list"])).contains("broker-t"),
    );
    broker.sigterm();
    assert!(broker.wait_exit(Duration::from_secs(20)));
}
