//! The dashboard in a real browser: Debian's chromium driven by playwright-core
//! (`tests/browser/dashboard.cjs`, installed by `.ci/setup.d/40-browser.sh`) against
//! `shoal dev` with a live group that had members join and leave, and a dead-letter queue.
//! Screenshots of every page go to `target/screenshots/` (kept as CI artifacts). A second test
//! signs in to the dashboard of a broker with ACL on (`tests/browser/signin.cjs`).

mod support;

use std::process::Command;
use std::time::{Duration, Instant};
use support::{external, Dev, Group};

#[test]
fn dashboard_shows_owners_lag_and_rebalances_in_a_browser() {
    let root = external::repo_root();
    let modules = root.join("target/external/browser/node_modules");
    if !std::path::Path::new("/usr/bin/chromium").exists()
        || !modules.join("playwright-core/package.json").exists()
    {
        external::skip("chromium or playwright-core not installed (run .ci/setup.d/40-browser.sh)");
        return;
    }
    let dev = Dev::start();
    assert!(dev
        .cmd(&["topic", "create", "Shop", "--queues", "4"])
        .status
        .success());
    let mut g = Group::new("shop", "Shop");
    g.join(&dev, "m1");
    g.converge(&dev, 4, Duration::from_secs(30));
    g.join(&dev, "m2");
    g.converge(&dev, 4, Duration::from_secs(30));
    let bodies = support::send(&dev, "Shop", "shop", 12);
    g.wait_all(&bodies, Duration::from_secs(30));
    g.leave("m2");
    g.converge(&dev, 4, Duration::from_secs(30));

    // A classic-mode group (as official RocketMQ clients make): the broker's own timeline.
    assert!(dev
        .cmd(&["topic", "create", "Legacy", "--queues", "2"])
        .status
        .success());
    let classic = |name: &str| support::Proc {
        child: dev.spawn(&[
            "consume",
            "Legacy",
            "--group",
            "legacy",
            "--protocol",
            "classic",
            "--instance",
            name,
        ]),
    };
    let _l1 = classic("l1");
    std::thread::sleep(Duration::from_secs(2));
    let mut l2 = classic("l2");
    std::thread::sleep(Duration::from_secs(3));
    l2.sigterm();
    assert!(l2.wait_exit(Duration::from_secs(20)));

    // A consumer that fails everything: its messages land in the dead-letter queue.
    let out = dev.cmd(&[
        "send", "Fails", "--body", "bad-{i}", "--key", "k-dlq", "--count", "2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut failing = support::Proc {
        child: dev.spawn(&[
            "consume",
            "Fails",
            "--group",
            "dlqg",
            "--from",
            "first",
            "--fail",
            "*",
            "--max-reconsume-times",
            "0",
        ]),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = dev.cmd(&["dlq", "list", "--group", "dlqg", "--json"]);
        if String::from_utf8_lossy(&out.stdout).lines().count() >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "messages never reached the dead-letter queue"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    failing.sigterm();
    assert!(failing.wait_exit(Duration::from_secs(20)));

    // A group that consumed 3 messages and left; 4 more arrived: its lag is 4.
    support::send(&dev, "Slow", "slow", 3);
    let out = dev.cmd(&[
        "consume", "Slow", "--group", "slow", "--from", "first", "--count", "3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    support::send(&dev, "Slow", "slow-late", 4);

    // What the pages must show: owners and lag from `shoal group progress`, once the live
    // member has committed everything (it commits every 5 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    let p = loop {
        let p = dev.json(&["group", "progress", "shop", "--json"]);
        if p["totalLag"] == 0 {
            break p;
        }
        assert!(Instant::now() < deadline, "shop never caught up: {p}");
        std::thread::sleep(Duration::from_millis(300));
    };
    let mut owners = serde_json::Map::new();
    let mut lag = serde_json::Map::new();
    for q in p["queues"].as_array().unwrap() {
        if q["topic"] != "Shop" {
            continue;
        }
        let key = format!("Shop#{}", q["queue"]);
        owners.insert(key.clone(), q["owner"].clone());
        lag.insert(key, q["lag"].clone());
    }
    assert_eq!(owners.len(), 4);
    assert!(
        owners
            .values()
            .all(|o| o.as_str().is_some_and(|o| o.ends_with("@m1"))),
        "{owners:?}"
    );
    let expect = serde_json::json!({
        "group": "shop", "topic": "Shop", "owners": owners, "lag": lag,
        "left": "127.0.0.1@m2", "dlqGroup": "dlqg", "dlqTopic": "Fails",
        "key": "k-dlq", "keyCount": 2, "slowGroup": "slow", "slowLag": 4,
        "mode": "coordinated", "classicGroup": "legacy", "classicLeft": "127.0.0.1@l2",
    });
    let shots = root.join("target/screenshots");
    let status = Command::new("node")
        .arg(root.join("tests/browser/dashboard.cjs"))
        .env("NODE_PATH", &modules)
        .env("DASHBOARD_URL", format!("http://{}", dev.http))
        .env("EXPECT", expect.to_string())
        .env("SHOAL_BIN", support::shoal())
        .env("SHOAL_NAMESRV", &dev.namesrv)
        .env("SCREENSHOTS", &shots)
        .status()
        .expect("node runs");
    g.leave("m1");
    assert!(status.success(), "the browser checks failed (see above)");
    for page in [
        "cluster",
        "topics",
        "groups",
        "group",
        "group-classic",
        "messages",
        "dlq",
    ] {
        assert!(
            shots.join(format!("{page}.png")).exists(),
            "no screenshot of {page}"
        );
    }
}

/// The dashboard of a broker with ACL on, in a browser: the sign-in form, a wrong secret
/// refused, an admin account's pages, a lookup refused for an account without the
/// permission (shown as a refusal), the token, signing out.
#[test]
fn dashboard_sign_in_with_acl_in_a_browser() {
    let root = external::repo_root();
    let modules = root.join("target/external/browser/node_modules");
    if !std::path::Path::new("/usr/bin/chromium").exists()
        || !modules.join("playwright-core/package.json").exists()
    {
        external::skip("chromium or playwright-core not installed (run .ci/setup.d/40-browser.sh)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("plain_acl.toml");
    std::fs::write(
        &acl,
        "[[accounts]]\naccessKey = \"operator\"\nsecretKey = \"operator-secret\"\nadmin = true\n\n\
         [[accounts]]\naccessKey = \"app-user\"\nsecretKey = \"app-secret-1\"\ndefaultTopicPerm = \"DENY\"\n",
    )
    .unwrap();
    let token = "dashboard-token-0123456789";
    let cfg = dir.path().join("broker.toml");
    std::fs::write(
        &cfg,
        format!(
            "acl_enabled = true\nacl_file = \"{}\"\n[http]\ntoken = \"{token}\"\ntoken_account = \"operator\"\n",
            acl.display()
        ),
    )
    .unwrap();
    let dev = Dev::start_with(&["-c", cfg.to_str().unwrap()]);
    let operator = |args: &[&str]| {
        let o = Command::new(support::shoal())
            .args(args)
            .env("SHOAL_NAMESRV", &dev.namesrv)
            .env("SHOAL_ACCESS_KEY", "operator")
            .env("SHOAL_SECRET_KEY", "operator-secret")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    operator(&["topic", "create", "Secret", "--queues", "1"]);
    operator(&[
        "send",
        "Secret",
        "--body",
        "the-secret-body",
        "--key",
        "k-secret",
    ]);
    let expect = serde_json::json!({
        "admin": ["operator", "operator-secret"], "user": ["app-user", "app-secret-1"],
        "token": token, "topic": "Secret", "key": "k-secret", "body": "the-secret-body",
    });
    let shots = root.join("target/screenshots");
    let status = Command::new("node")
        .arg(root.join("tests/browser/signin.cjs"))
        .env("NODE_PATH", &modules)
        .env("DASHBOARD_URL", format!("http://{}", dev.http))
        .env("EXPECT", expect.to_string())
        .env("SCREENSHOTS", &shots)
        .status()
        .expect("node runs");
    assert!(
        status.success(),
        "the browser sign-in checks failed (see above)"
    );
    for page in ["sign-in", "signed-in", "refused"] {
        assert!(
            shots.join(format!("{page}.png")).exists(),
            "no screenshot of {page}"
        );
    }
}
