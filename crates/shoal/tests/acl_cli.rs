//! ACL with the `shoal` binary as separate processes: `shoal namesrv --acl-file` and `shoal
//! broker --config` with ACL on; the CLI works with credentials (flags, environment, key
//! file) and is refused without them.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::free_port;

const ACL: &str = r#"
[[accounts]]
accessKey = "app-user"
secretKey = "app-secret-1"
defaultTopicPerm = "DENY"
defaultGroupPerm = "SUB"
topicPerms = ["Orders=PUB|SUB"]

[[accounts]]
accessKey = "operator"
secretKey = "operator-secret"
admin = true
"#;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn shoal(namesrv: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(args)
        .env("SHOAL_NAMESRV", namesrv)
        .env_remove("SHOAL_ACCESS_KEY")
        .env_remove("SHOAL_SECRET_KEY")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn start(dir: &Path) -> (Proc, Proc, String) {
    let acl = dir.join("plain_acl.toml");
    std::fs::write(&acl, ACL).unwrap();
    let ns = format!("127.0.0.1:{}", free_port());
    let broker_addr = format!("127.0.0.1:{}", free_port());
    let cfg = dir.join("broker.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen_addr = \"{broker_addr}\"\nnamesrv_addrs = [\"{ns}\"]\ndata_dir = \"{}\"\nacl_enabled = true\nacl_file = \"{}\"\nnamesrv_access_key = \"operator\"\nnamesrv_secret_key = \"operator-secret\"\n",
            dir.join("data").display(),
            acl.display()
        ),
    )
    .unwrap();
    // Each process logs to a file in the test's directory, quoted when it does not come up.
    let spawn = |name: &str, args: &[&str]| {
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        Proc(
            Command::new(env!("CARGO_BIN_EXE_shoal"))
                .args(args)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    };
    let n = spawn(
        "namesrv",
        &[
            "namesrv",
            "--listen",
            &ns,
            "--acl-file",
            acl.to_str().unwrap(),
        ],
    );
    // `--namesrv` too: the global `--namesrv` default currently overrides the file's
    // `namesrv_addrs` (noted in the status file).
    let b = spawn(
        "broker",
        &[
            "broker",
            "--config",
            cfg.to_str().unwrap(),
            "--namesrv",
            &ns,
        ],
    );
    // The broker is registered (its signed registration was accepted) when the cluster lists it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = shoal(&ns, &["cluster", "list", "--json"], &[]);
        if o.status.success() && String::from_utf8_lossy(&o.stdout).contains("broker-a") {
            break;
        }
        if Instant::now() >= deadline {
            let log = |name: &str| {
                std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
            };
            panic!(
                "broker never registered within 20 s; last cluster list: {} {}\n--- namesrv log\n{}\n--- broker log\n{}",
                o.status,
                String::from_utf8_lossy(&o.stderr),
                log("namesrv"),
                log("broker")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (n, b, ns)
}

#[test]
fn cli_with_and_without_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let (_ns, _broker, ns) = start(dir.path());
    let err = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();

    // Admin: refused without credentials and for a non-admin account.
    let o = shoal(&ns, &["topic", "create", "Orders", "--queues", "2"], &[]);
    assert!(!o.status.success());
    assert!(
        err(&o).contains("16") || err(&o).contains("accessKey"),
        "{}",
        err(&o)
    );
    let o = shoal(
        &ns,
        &[
            "topic",
            "create",
            "Orders",
            "--access-key",
            "app-user",
            "--secret-key",
            "app-secret-1",
        ],
        &[],
    );
    assert!(
        !o.status.success() && err(&o).contains("admin"),
        "{}",
        err(&o)
    );
    let o = shoal(
        &ns,
        &["topic", "create", "Orders", "--queues", "2"],
        &[
            ("SHOAL_ACCESS_KEY", "operator"),
            ("SHOAL_SECRET_KEY", "operator-secret"),
        ],
    );
    assert!(o.status.success(), "{}", err(&o));

    // Send: refused without credentials, accepted with a key file.
    let o = shoal(&ns, &["send", "Orders", "--body", "x", "--count", "1"], &[]);
    assert!(!o.status.success(), "unsigned send accepted");
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "AccessKey=app-user\nSecretKey=app-secret-1\n").unwrap();
    let o = shoal(
        &ns,
        &[
            "send",
            "Orders",
            "--body",
            "m{i}",
            "--count",
            "3",
            "--credentials-file",
            key_file.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", err(&o));

    // Consume with credentials gets them all.
    let o = shoal(
        &ns,
        &[
            "consume", "Orders", "--group", "readers", "--from", "first", "--count", "3", "--json",
        ],
        &[
            ("SHOAL_ACCESS_KEY", "app-user"),
            ("SHOAL_SECRET_KEY", "app-secret-1"),
        ],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 3);
}
