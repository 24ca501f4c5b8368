//! The HTTP port of a broker with ACL on (`shoal dev -c` with `acl_enabled`, `[http]` and
//! `[tls]`), over HTTP and HTTPS: the API needs a sign-in (an ACL account or the token),
//! refusals are refusals, every POST needs the page's token and a same-site origin, and
//! `/metrics` takes its own token.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
use serde_json::Value;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;
use support::Dev;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;

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

const TOKEN: &str = "dashboard-token-0123456789";
const METRICS_TOKEN: &str = "metrics-token-0123456789";

/// One HTTP answer: status, headers (lower-case names), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The session cookie set by this answer (`shoal_session=...`).
    fn cookie(&self) -> String {
        let c = self.header("set-cookie").expect("a session cookie");
        c.split(';').next().unwrap().to_string()
    }
}

/// The port, over HTTP or over HTTPS trusting `ca`.
struct Port {
    addr: String,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Port {
    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
        let tcp = std::net::TcpStream::connect(&self.addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        head.push_str(body);
        let mut raw = Vec::new();
        match &self.tls {
            None => {
                let mut s = tcp;
                s.write_all(head.as_bytes()).unwrap();
                let _ = s.read_to_end(&mut raw);
            }
            Some(cfg) => {
                let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
                let conn = rustls::ClientConnection::new(cfg.clone(), name).unwrap();
                let mut s = rustls::StreamOwned::new(conn, tcp);
                s.write_all(head.as_bytes()).unwrap();
                let _ = s.read_to_end(&mut raw);
            }
        }
        let text = String::from_utf8_lossy(&raw).to_string();
        let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        let body = if chunked {
            dechunk(rest)
        } else {
            rest.to_string()
        };
        Answer {
            status,
            headers,
            body,
        }
    }

    fn get(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        self.request("GET", path, headers, "")
    }

    /// The token POSTs without a session carry.
    fn port_csrf(&self) -> String {
        let s = self.get("/api/session", &[]).json();
        s["csrf"].as_str().unwrap().to_string()
    }

    /// Signs in; returns (cookie, the session's token).
    fn sign_in(&self, body: &str) -> (String, String) {
        let csrf = self.port_csrf();
        let a = self.request("POST", "/api/session", &[("X-Shoal-Csrf", &csrf)], body);
        assert_eq!(a.status, 200, "sign-in: {}", a.body);
        (a.cookie(), a.json()["csrf"].as_str().unwrap().to_string())
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A CA, and a certificate it signed for 127.0.0.1: (CA PEM, certificate file, key file).
fn certificates(dir: &std::path::Path) -> (String, std::path::PathBuf, std::path::PathBuf) {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(DnType::CommonName, "Shoal test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca = p.self_signed(&ca_key).unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse().unwrap())];
    let key = KeyPair::generate().unwrap();
    let leaf = p.signed_by(&key, &ca, &ca_key).unwrap();
    let (cert_file, key_file) = (dir.join("server.pem"), dir.join("server.key"));
    std::fs::write(&cert_file, leaf.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    (ca.pem(), cert_file, key_file)
}

fn trusting(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

/// A `shoal dev` whose broker runs with ACL on and an `[http]` table; `tls`: the HTTP port
/// (and the broker's listener) in permissive mode with a CA-signed certificate.
fn start(dir: &std::path::Path) -> (Dev, String) {
    let acl = dir.join("plain_acl.toml");
    std::fs::write(&acl, ACL).unwrap();
    let (ca_pem, cert, key) = certificates(dir);
    let cfg = dir.join("broker.toml");
    std::fs::write(
        &cfg,
        format!(
            "acl_enabled = true\nacl_file = \"{}\"\n\n[tls]\nmode = \"permissive\"\ncert_path = \"{}\"\nkey_path = \"{}\"\n\n[http]\ntoken = \"{TOKEN}\"\ntoken_account = \"operator\"\nmetrics_token = \"{METRICS_TOKEN}\"\n",
            acl.display(),
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    (Dev::start_with(&["-c", cfg.to_str().unwrap()]), ca_pem)
}

fn cli(dev: &Dev, args: &[&str], account: (&str, &str)) -> std::process::Output {
    std::process::Command::new(support::shoal())
        .args(args)
        .env("SHOAL_NAMESRV", &dev.namesrv)
        .env("SHOAL_ACCESS_KEY", account.0)
        .env("SHOAL_SECRET_KEY", account.1)
        .output()
        .unwrap()
}

#[test]
fn the_http_port_is_behind_the_acl() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, ca_pem) = start(dir.path());
    let operator = ("operator", "operator-secret");
    let o = cli(
        &dev,
        &["topic", "create", "Orders", "--queues", "2"],
        operator,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = cli(
        &dev,
        &[
            "send",
            "Orders",
            "--body",
            "order-{i}",
            "--count",
            "2",
            "--json",
        ],
        ("app-user", "app-secret-1"),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sent: Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().next().unwrap()).unwrap();
    let offset_id = sent["offsetMsgId"].as_str().unwrap().to_string();
    // A topic app-user may not read (its default topic permission is DENY).
    let o = cli(
        &dev,
        &["topic", "create", "Secret", "--queues", "1"],
        operator,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = cli(
        &dev,
        &["send", "Secret", "--body", "secret", "--key", "k-secret"],
        operator,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    for port in [
        Port {
            addr: dev.http.clone(),
            tls: None,
        },
        Port {
            addr: dev.http.clone(),
            tls: Some(trusting(&ca_pem)),
        },
    ] {
        let over = if port.tls.is_some() { "HTTPS" } else { "HTTP" };
        // Without a session: the page (it shows the sign-in form), but no data.
        assert_eq!(port.get("/", &[]).status, 200, "{over}");
        for path in [
            "/api/topics",
            "/api/groups",
            "/api/cluster",
            "/api/messages?id=x",
        ] {
            let a = port.get(path, &[]);
            assert_eq!(a.status, 401, "{over} {path}: {}", a.body);
            assert_eq!(a.json()["signIn"], true);
            assert!(!a.body.contains("Orders"), "{}", a.body);
        }
        let s = port.get("/api/session", &[]).json();
        assert_eq!(
            (s["required"].as_bool(), s["signedIn"].as_bool()),
            (Some(true), Some(false))
        );

        // Sign-in: refused with a wrong secret; a POST without the page's token or from
        // another site is refused before anything is looked at.
        let csrf = port.port_csrf();
        let wrong = port.request(
            "POST",
            "/api/session",
            &[("X-Shoal-Csrf", &csrf)],
            r#"{"accessKey":"operator","secretKey":"nope-nope"}"#,
        );
        assert_eq!(wrong.status, 401, "{}", wrong.body);
        assert!(wrong.json()["error"]
            .as_str()
            .unwrap()
            .contains("sign-in refused"));
        let good = r#"{"accessKey":"operator","secretKey":"operator-secret"}"#;
        for headers in [
            vec![],
            vec![("X-Shoal-Csrf", "forged")],
            vec![
                ("X-Shoal-Csrf", csrf.as_str()),
                ("Origin", "http://evil.example"),
            ],
            vec![
                ("X-Shoal-Csrf", csrf.as_str()),
                ("Sec-Fetch-Site", "cross-site"),
            ],
        ] {
            let a = port.request("POST", "/api/session", &headers, good);
            assert_eq!(a.status, 403, "{over} {headers:?}: {}", a.body);
            assert!(a.header("set-cookie").is_none());
        }

        // Signed in as the admin account: the data, its requests signed.
        let (cookie, session_csrf) = port.sign_in(good);
        let with = [("Cookie", cookie.as_str())];
        let topics = port.get("/api/topics", &with);
        assert_eq!(topics.status, 200, "{}", topics.body);
        assert!(topics.body.contains("\"Orders\""), "{}", topics.body);
        let m = port.get(&format!("/api/messages?id={offset_id}"), &with);
        assert_eq!(m.status, 200, "{over}: {}", m.body);
        assert!(m.body.contains("order-0"), "{}", m.body);
        let me = port.get("/api/session", &with).json();
        assert_eq!(me["account"], "operator");
        assert_eq!(me["csrf"], session_csrf.as_str());
        // A POST with the session but without its token: refused.
        let a = port.request("POST", "/api/dlq/readers/resend", &with, "");
        assert_eq!(a.status, 403, "{}", a.body);
        let a = port.request(
            "POST",
            "/api/dlq/readers/resend",
            &[("Cookie", cookie.as_str()), ("X-Shoal-Csrf", &session_csrf)],
            "",
        );
        assert_eq!(
            a.status, 404,
            "no dead letters, but past the guard: {}",
            a.body
        );

        let secret = "/api/messages?key=k-secret&topic=Secret";
        let a = port.get(secret, &with);
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(a.body.contains("\"secret\""), "{}", a.body);

        // Signed in as an account that may not read Secret: the broker refuses the lookup,
        // and the dashboard says it was refused (not "not found").
        let (user, _) = port.sign_in(r#"{"accessKey":"app-user","secretKey":"app-secret-1"}"#);
        let a = port.get(secret, &[("Cookie", user.as_str())]);
        assert_eq!(a.status, 403, "{}", a.body);
        assert!(a.body.contains("refused by the ACL"), "{}", a.body);
        assert!(!a.body.contains("\"secret\""), "{}", a.body);

        // The token: a session acting as token_account.
        let (t, _) = port.sign_in(&format!(r#"{{"token":"{TOKEN}"}}"#));
        let me = port.get("/api/session", &[("Cookie", t.as_str())]).json();
        assert_eq!(me["account"], "operator");
        assert_eq!(
            port.get("/api/cluster", &[("Cookie", t.as_str())]).status,
            200
        );

        // Signing out ends the session.
        let a = port.request(
            "POST",
            "/api/session/end",
            &[
                ("Cookie", t.as_str()),
                ("X-Shoal-Csrf", me["csrf"].as_str().unwrap()),
            ],
            "",
        );
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(
            port.get("/api/cluster", &[("Cookie", t.as_str())]).status,
            401
        );

        // /metrics: its own token.
        assert_eq!(port.get("/metrics", &[]).status, 401);
        let bearer = format!("Bearer {METRICS_TOKEN}");
        let m = port.get("/metrics", &[("Authorization", bearer.as_str())]);
        assert_eq!(m.status, 200);
        assert!(
            m.body.contains("shoal_http_requests_refused_total"),
            "{}",
            m.body
        );
        assert!(m.body.contains("shoal_http_sign_ins_total"), "{}", m.body);
    }
    // The session cookie of an HTTPS sign-in is Secure; over HTTP it is not (it would not be
    // kept).
    let https = Port {
        addr: dev.http.clone(),
        tls: Some(trusting(&ca_pem)),
    };
    let csrf = https.port_csrf();
    let a = https.request(
        "POST",
        "/api/session",
        &[("X-Shoal-Csrf", &csrf)],
        r#"{"accessKey":"operator","secretKey":"operator-secret"}"#,
    );
    let c = a.header("set-cookie").unwrap();
    assert!(
        c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.contains("Secure"),
        "{c}"
    );
}

/// Without ACL and without a token the port needs no sign-in (as before), but a POST still
/// needs the page's token and a same-site origin, and `/metrics` stays open.
#[test]
fn an_open_port_still_refuses_cross_site_posts() {
    let dev = Dev::start();
    let port = Port {
        addr: dev.http.clone(),
        tls: None,
    };
    let s = port.get("/api/session", &[]).json();
    assert_eq!(s["required"], false);
    assert_eq!(port.get("/api/topics", &[]).status, 200);
    assert_eq!(port.get("/metrics", &[]).status, 200);
    let a = port.request("POST", "/api/dlq/nobody/resend", &[], "");
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a.body.contains("cross-site request refused"), "{}", a.body);
    let csrf = port.port_csrf();
    let a = port.request(
        "POST",
        "/api/dlq/nobody/resend",
        &[("X-Shoal-Csrf", &csrf), ("Origin", "http://evil.example")],
        "",
    );
    assert_eq!(a.status, 403, "{}", a.body);
    let a = port.request(
        "POST",
        "/api/dlq/nobody/resend",
        &[("X-Shoal-Csrf", &csrf)],
        "",
    );
    assert_eq!(a.status, 404, "past the guard: {}", a.body);
}
