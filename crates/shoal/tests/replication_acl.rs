//! A replicated broker group with ACL on, as separate processes on 127.0.0.1: each broker signs
//! its replication messages (9082, 9083) with `replication.access_key`, an admin account of the
//! ACL file, so the group's brokers accept one another's; an unsigned one, or one signed by an
//! account that is not admin, is refused. A broker with ACL and replication but no such account
//! does not start.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use shoal_net::{NetConfig, NotSupportedProcessor, RemotingClient};
use shoal_proto::acl::{sign_request, SessionCredentials};
use shoal_proto::code::response_code as resp;
use shoal_proto::RemotingCommand;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use support::replicas::{in_sync_len, Replicas};
use support::shoal;

const ACL: &str = r#"
[[accounts]]
accessKey = "app-user"
secretKey = "app-secret-1"
defaultTopicPerm = "PUB|SUB"
defaultGroupPerm = "SUB"

[[accounts]]
accessKey = "replicator"
secretKey = "replicator-secret"
admin = true
"#;

/// Writes the ACL file and a broker TOML turning ACL on, with `replication` lines added.
fn acl_config(dir: &std::path::Path, replication: &str) -> std::path::PathBuf {
    let acl = dir.join("plain_acl.toml");
    std::fs::write(&acl, ACL).unwrap();
    let file = dir.join("acl-broker.toml");
    std::fs::write(
        &file,
        format!(
            "acl_enabled = true\nacl_file = \"{}\"\n[replication]\n{replication}",
            acl.display()
        ),
    )
    .unwrap();
    file
}

#[test]
fn replication_messages_are_signed_under_acl_and_unsigned_ones_refused() {
    let r = Replicas::start_with(1, |dir| {
        let file = acl_config(
            dir,
            "access_key = \"replicator\"\nsecret_key = \"replicator-secret\"\n",
        );
        vec!["-c".into(), file.to_str().unwrap().into()]
    });
    // The replicas catch up from the master and join the in-sync set: the peers' signed
    // messages went through every broker's ACL.
    r.wait_group("three in sync under ACL", |g| {
        g["master"].is_u64() && in_sync_len(g) == 3
    });

    // A replication message as anyone could send it: refused, unsigned or not admin.
    let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ask = |creds: Option<SessionCredentials>| {
        let mut cmd = RemotingCommand::request(shoal_proto::ext::request_code::HA_TO_MASTER)
            .with_body(b"{}".to_vec());
        if let Some(c) = &creds {
            sign_request(&mut cmd, c);
        }
        rt.block_on(client.invoke(&r.brokers[0].0, cmd, Duration::from_secs(10)))
            .unwrap()
    };
    let unsigned = ask(None);
    assert_eq!(unsigned.code, resp::NO_PERMISSION, "{:?}", unsigned.remark);
    let app = ask(Some(SessionCredentials::new("app-user", "app-secret-1")));
    assert_eq!(app.code, resp::NO_PERMISSION, "{:?}", app.remark);
    assert!(
        app.remark.as_deref().unwrap_or("").contains("admin"),
        "{:?}",
        app.remark
    );
    client.shutdown();
}

#[test]
fn a_broker_with_acl_and_replication_but_no_replication_account_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = acl_config(dir.path(), "");
    let mut child = Command::new(shoal())
        .args(["broker", "-c", file.to_str().unwrap()])
        .args(["--controller", "127.0.0.1:1", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A broker that started anyway would run until killed: give it a bound, then fail.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("acl_enabled with replication needs replication.access_key"),
        "{stderr}"
    );
}
