//! TLS with the `shoal` binary as separate processes: `shoal namesrv --tls-mode enforcing`, a
//! `shoal broker` with a `[tls]` table (enforcing listener, TLS to the name server), and the
//! CLI sending, consuming and administering over TLS; plaintext refused, a wrong CA refused
//! with a clear error. `shoal dev --tls-mode permissive` serves TLS and plaintext clients.
//! Certificates are made by rcgen (a CA and a server certificate for 127.0.0.1).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::{free_port, http_request, sample, shoal, Proc};

struct Files {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    other_ca: PathBuf,
}

fn ca(name: &str) -> (rcgen::Certificate, KeyPair) {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap();
    (cert, key)
}

fn certificates(dir: &Path) -> Files {
    let (ca_cert, ca_key) = ca("Shoal test CA");
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.subject_alt_names = vec![
        SanType::IpAddress("127.0.0.1".parse().unwrap()),
        SanType::DnsName("localhost".try_into().unwrap()),
    ];
    let key = KeyPair::generate().unwrap();
    let leaf = p.signed_by(&key, &ca_cert, &ca_key).unwrap();
    let (other, _) = ca("Some other CA");
    let files = Files {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
        other_ca: dir.join("other-ca.pem"),
    };
    std::fs::write(&files.ca, ca_cert.pem()).unwrap();
    std::fs::write(&files.cert, leaf.pem()).unwrap();
    std::fs::write(&files.key, key.serialize_pem()).unwrap();
    std::fs::write(&files.other_ca, other.pem()).unwrap();
    files
}

fn spawn(args: &[&str]) -> Proc {
    Proc {
        child: Command::new(shoal())
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    }
}

/// Runs a client command against `namesrv` (TLS only through the flags given).
fn run(namesrv: &str, args: &[&str]) -> Output {
    Command::new(shoal())
        .args(args)
        .env("SHOAL_NAMESRV", namesrv)
        .env_remove("SHOAL_TLS_CA")
        .env_remove("SHOAL_TLS_SERVER_NAME")
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn failed(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Waits (bounded, for liveness) until the broker is registered, asking over TLS.
fn wait_registered(namesrv: &str, tls: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut args = vec!["cluster", "list", "--json"];
    args.extend_from_slice(tls);
    loop {
        let out = run(namesrv, &args);
        if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("broker-a") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the broker never registered: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn consumed_bodies(out: &str) -> Vec<String> {
    let mut bodies: Vec<String> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["body"].as_str().map(str::to_string))
        .collect();
    bodies.sort();
    bodies
}

#[test]
fn enforcing_name_server_and_broker_serve_the_cli_over_tls_only() {
    let dir = tempfile::tempdir().unwrap();
    let f = certificates(dir.path());
    let ns = format!("127.0.0.1:{}", free_port());
    let broker = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let _ns = spawn(&[
        "namesrv",
        "--listen",
        &ns,
        "--tls-mode",
        "enforcing",
        "--tls-cert",
        f.cert.to_str().unwrap(),
        "--tls-key",
        f.key.to_str().unwrap(),
    ]);
    let cfg = dir.path().join("broker.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen_addr = \"{broker}\"\nnamesrv_addrs = [\"{ns}\"]\ndata_dir = \"{}\"\n\
             http_listen_addr = \"{http}\"\nauto_create_topic = true\n\n[tls]\n\
             mode = \"enforcing\"\ncert_path = \"{}\"\nkey_path = \"{}\"\n\
             namesrv_tls = true\ntrust_cert_path = \"{}\"\n\n\
             [http]\ntls_mode = \"permissive\"\n",
            dir.path().join("data").display(),
            f.cert.display(),
            f.key.display(),
            f.ca.display()
        ),
    )
    .unwrap();
    let _broker = spawn(&["broker", "--config", cfg.to_str().unwrap()]);
    let ca = f.ca.to_str().unwrap();
    let tls = ["--tls-ca", ca];
    // Registration itself went over TLS (the name server takes nothing else).
    wait_registered(&ns, &tls);

    ok(&run(
        &ns,
        &["topic", "create", "Secure", "--queues", "2", "--tls-ca", ca],
    ));
    let sent = run(
        &ns,
        &[
            "send",
            "Secure",
            "--body",
            "secret {i}",
            "--count",
            "5",
            "--tls-ca",
            ca,
        ],
    );
    ok(&sent);
    let said = String::from_utf8_lossy(&sent.stderr);
    assert!(said.contains("5 messages sent"), "{said}");
    let got = ok(&run(
        &ns,
        &[
            "consume", "Secure", "--group", "tls-g", "--from", "first", "--count", "5", "--json",
            "--tls-ca", ca,
        ],
    ));
    let expected: Vec<String> = (0..5).map(|i| format!("secret {i}")).collect();
    assert_eq!(consumed_bodies(&got), expected, "{got}");

    let status = ok(&run(
        &ns,
        &[
            "broker", "status", "--broker", &broker, "--json", "--tls-ca", ca,
        ],
    ));
    assert!(status.contains("msgPutTotal"), "{status}");

    // Plaintext is refused by both listeners.
    // The plaintext client is told that the server may require TLS.
    let e = failed(&run(&ns, &["topic", "list"]));
    assert!(e.contains(&ns) || e.contains("closed"), "{e}");
    assert!(e.contains("hint:") && e.contains("--tls"), "{e}");
    let e = failed(&run(&ns, &["broker", "status", "--broker", &broker]));
    assert!(e.contains("hint:") && e.contains("--tls"), "{e}");
    // A CA that did not sign the servers' certificate: refused, saying why.
    let e = failed(&run(
        &ns,
        &["topic", "list", "--tls-ca", f.other_ca.to_str().unwrap()],
    ));
    assert!(e.contains("not signed by a trusted CA"), "{e}");
    // --tls alone does not silently trust anything.
    let e = failed(&run(&ns, &["topic", "list", "--tls"]));
    assert!(
        e.contains("--tls-ca") && e.contains("--tls-insecure"),
        "{e}"
    );
    // Insecure mode: encrypted, unverified.
    ok(&run(&ns, &["topic", "list", "--tls-insecure"]));

    // The broker counted its handshakes and the refused plaintext connection.
    let (status, m) = http_request(&http, "GET", "/metrics", "");
    assert_eq!(status, 200);
    let handshakes = sample(
        &m,
        "shoal_broker_tls_handshakes_total{listener=\"remoting\",result=\"ok\"}",
    )
    .unwrap_or(0.0);
    assert!(handshakes >= 2.0, "{m}");
    assert_eq!(
        sample(
            &m,
            "shoal_broker_plaintext_connections_total{listener=\"remoting\",result=\"refused\"}"
        ),
        Some(1.0),
        "{m}"
    );
}

#[test]
fn permissive_dev_serves_tls_and_plaintext_clients() {
    let dir = tempfile::tempdir().unwrap();
    let f = certificates(dir.path());
    let (ns_port, broker_port) = (free_port(), free_port());
    let ns = format!("127.0.0.1:{ns_port}");
    let _dev = spawn(&[
        "dev",
        "--namesrv-port",
        &ns_port.to_string(),
        "--broker-port",
        &broker_port.to_string(),
        "--no-http",
        "--no-kafka",
        "--data-dir",
        dir.path().join("data").to_str().unwrap(),
        "--tls-mode",
        "permissive",
        "--tls-cert",
        f.cert.to_str().unwrap(),
        "--tls-key",
        f.key.to_str().unwrap(),
    ]);
    wait_registered(&ns, &[]);
    let ca = f.ca.to_str().unwrap();
    ok(&run(
        &ns,
        &["send", "Mixed", "--body", "plain {i}", "--count", "3"],
    ));
    ok(&run(
        &ns,
        &[
            "send", "Mixed", "--body", "tls {i}", "--count", "3", "--tls-ca", ca,
        ],
    ));
    let got = ok(&run(
        &ns,
        &[
            "consume", "Mixed", "--group", "mixed-g", "--from", "first", "--count", "6", "--json",
            "--tls-ca", ca,
        ],
    ));
    let mut expected: Vec<String> = (0..3)
        .flat_map(|i| [format!("plain {i}"), format!("tls {i}")])
        .collect();
    expected.sort();
    assert_eq!(consumed_bodies(&got), expected, "{got}");
}

#[test]
fn tls_options_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let f = certificates(dir.path());
    let port = free_port().to_string();
    // A mode without files, files without a mode, unreadable files: clear errors at start.
    let e = failed(&run(
        "127.0.0.1:1",
        &[
            "namesrv",
            "--listen",
            "127.0.0.1:0",
            "--tls-mode",
            "enforcing",
        ],
    ));
    assert!(e.contains("--tls-cert"), "{e}");
    let e = failed(&run(
        "127.0.0.1:1",
        &[
            "namesrv",
            "--tls-cert",
            f.cert.to_str().unwrap(),
            "--tls-key",
            f.key.to_str().unwrap(),
        ],
    ));
    assert!(e.contains("--tls-mode"), "{e}");
    let e = failed(&run(
        "127.0.0.1:1",
        &[
            "dev",
            "--namesrv-port",
            &port,
            "--no-http",
            "--no-kafka",
            "--tls-mode",
            "strict",
        ],
    ));
    assert!(e.contains("disabled, permissive or enforcing"), "{e}");
    let missing = dir.path().join("missing.pem");
    let e = failed(&run(
        "127.0.0.1:1",
        &[
            "namesrv",
            "--listen",
            "127.0.0.1:0",
            "--tls-mode",
            "permissive",
            "--tls-cert",
            missing.to_str().unwrap(),
            "--tls-key",
            f.key.to_str().unwrap(),
        ],
    ));
    assert!(e.contains("missing.pem"), "{e}");
    // The name server takes no client TLS options.
    let e = failed(&run("127.0.0.1:1", &["namesrv", "--tls-insecure"]));
    assert!(e.contains("no client options"), "{e}");
    let e = failed(&run(
        "127.0.0.1:1",
        &["topic", "list", "--tls-ca", "x.pem", "--tls-insecure"],
    ));
    assert!(e.contains("not both"), "{e}");
}
