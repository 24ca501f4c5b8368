//! TLS on the transport, over TCP on 127.0.0.1 with certificates made by rcgen: the three
//! server modes, client verification (wrong CA, wrong name, insecure), and the bounded
//! handshake.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use shoal_net::{
    processor_fn, ClientTls, NetConfig, NetError, NetStats, NotSupportedProcessor, RemotingClient,
    Server, ServerTls, TlsMode, TrustRoots,
};
use shoal_proto::code::response_code::SUCCESS;
use shoal_proto::RemotingCommand;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(30);
const ECHO: i32 = 100;

async fn bounded<F: Future<Output = ()>>(f: F) {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("shoal_net=debug")
        .try_init();
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("test exceeded its time bound");
}

/// A CA and a server certificate it signed for 127.0.0.1 and `localhost`.
struct Pki {
    ca: CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

fn ca(name: &str) -> (rcgen::Certificate, KeyPair) {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap();
    (cert, key)
}

fn pki() -> Pki {
    let (ca, ca_key) = ca("Shoal test CA");
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.subject_alt_names = vec![
        SanType::IpAddress("127.0.0.1".parse().unwrap()),
        SanType::DnsName("localhost".try_into().unwrap()),
    ];
    p.distinguished_name
        .push(DnType::CommonName, "shoal test server");
    let key = KeyPair::generate().unwrap();
    let leaf = p.signed_by(&key, &ca, &ca_key).unwrap();
    Pki {
        ca: ca.der().clone(),
        chain: vec![leaf.der().clone()],
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    }
}

fn server_tls(pki: &Pki, mode: TlsMode) -> ServerTls {
    ServerTls::new(mode, pki.chain.clone(), pki.key.clone_key()).unwrap()
}

fn trusting(pki: &Pki) -> ClientTls {
    ClientTls::new(TrustRoots::Certificates(vec![pki.ca.clone()]), None).unwrap()
}

/// A server answering ECHO with the request's body.
async fn echo_server(tls: ServerTls) -> Server {
    let processor = processor_fn(|_ctx, req: RemotingCommand| async move {
        let mut r = RemotingCommand::response(SUCCESS, None);
        r.body = req.body.clone();
        Ok(Some(r))
    });
    Server::bind_with_tls(
        "127.0.0.1:0",
        Arc::new(processor),
        NetConfig::default(),
        tls,
    )
    .await
    .unwrap()
}

fn client(tls: Option<ClientTls>) -> RemotingClient {
    RemotingClient::with_tls(NetConfig::default(), Arc::new(NotSupportedProcessor), tls)
}

async fn echo(client: &RemotingClient, addr: &str, body: &'static [u8]) -> Result<(), NetError> {
    let mut req = RemotingCommand::request(ECHO);
    req.body = Some(bytes::Bytes::from_static(body));
    let resp = client.invoke(addr, req, Duration::from_secs(5)).await?;
    assert_eq!(resp.code, SUCCESS);
    assert_eq!(resp.body.as_deref(), Some(body));
    Ok(())
}

/// Waits (bounded) until a counter of the server reaches `n`.
async fn counted(stats: &NetStats, what: &str, f: impl Fn(&NetStats) -> u64, n: u64) {
    for _ in 0..500 {
        if f(stats) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what} never reached {n}: {:?}", stats.snapshot());
}

#[tokio::test]
async fn enforcing_serves_tls_and_refuses_plaintext() {
    bounded(async {
        let pki = pki();
        let server = echo_server(server_tls(&pki, TlsMode::Enforcing)).await;
        let addr = server.local_addr().to_string();
        let stats = server.stats();

        let tls = client(Some(trusting(&pki)));
        echo(&tls, &addr, b"over tls").await.unwrap();
        echo(&tls, &addr, b"same connection").await.unwrap();
        assert_eq!(stats.snapshot().tls_handshakes, 1);

        let plain = client(None);
        let err = echo(&plain, &addr, b"in the clear").await.unwrap_err();
        assert!(
            matches!(err, NetError::ConnectionClosed { .. }),
            "plaintext must be refused by closing: {err}"
        );
        counted(
            &stats,
            "plaintext_refused",
            |s| s.snapshot().plaintext_refused,
            1,
        )
        .await;
        assert_eq!(
            stats.snapshot().requests_received,
            2,
            "nothing of the plaintext request was read"
        );
        // The TLS client is unaffected.
        echo(&tls, &addr, b"still here").await.unwrap();
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn permissive_serves_tls_and_plaintext_side_by_side() {
    bounded(async {
        let pki = pki();
        let server = echo_server(server_tls(&pki, TlsMode::Permissive)).await;
        let addr = server.local_addr().to_string();
        let tls = client(Some(trusting(&pki)));
        let plain = client(None);
        for _ in 0..3 {
            echo(&tls, &addr, b"tls").await.unwrap();
            echo(&plain, &addr, b"plain").await.unwrap();
        }
        let s = server.stats().snapshot();
        assert_eq!((s.tls_handshakes, s.plaintext_accepted), (1, 1), "{s:?}");
        assert_eq!(s.plaintext_refused, 0);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn disabled_serves_plaintext_and_a_tls_client_is_told_why_it_fails() {
    bounded(async {
        let server = echo_server(ServerTls::disabled()).await;
        let addr = server.local_addr().to_string();
        echo(&client(None), &addr, b"plain").await.unwrap();
        let insecure = ClientTls::new(TrustRoots::Insecure, None).unwrap();
        let err = echo(&client(Some(insecure)), &addr, b"tls")
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, NetError::TlsHandshake { .. }), "{text}");
        assert!(
            text.contains(&addr) && text.contains("does it serve TLS?"),
            "{text}"
        );
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused_with_a_clear_error() {
    bounded(async {
        let pki = pki();
        let server = echo_server(server_tls(&pki, TlsMode::Enforcing)).await;
        let addr = server.local_addr().to_string();
        let (other_ca, _) = ca("Some other CA");
        let wrong =
            ClientTls::new(TrustRoots::Certificates(vec![other_ca.der().clone()]), None).unwrap();
        let err = echo(&client(Some(wrong)), &addr, b"x").await.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, NetError::TlsHandshake { .. }), "{text}");
        assert!(
            text.contains("not signed by a trusted CA") && text.contains("UnknownIssuer"),
            "{text}"
        );
        // The server saw the client give up (an alert) and counted a failed handshake.
        counted(
            &server.stats(),
            "tls_handshake_failures",
            |s| s.snapshot().tls_handshake_failures,
            1,
        )
        .await;
        assert_eq!(server.stats().snapshot().tls_handshakes, 0);
        server.shutdown().await;
    })
    .await;
}

/// A server whose own certificate is a CA certificate (what `openssl req -x509` makes unless
/// told `CA:FALSE`): the client's error says what to change.
#[tokio::test]
async fn a_ca_certificate_as_the_servers_own_is_refused_with_what_to_do() {
    bounded(async {
        let mut p = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        p.subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        let tls = ServerTls::new(
            TlsMode::Enforcing,
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
        let server = echo_server(tls).await;
        let addr = server.local_addr().to_string();
        let trusting_it =
            ClientTls::new(TrustRoots::Certificates(vec![cert.der().clone()]), None).unwrap();
        let err = echo(&client(Some(trusting_it)), &addr, b"x")
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, NetError::TlsHandshake { .. }), "{text}");
        assert!(
            text.contains("presents a CA certificate as its own (CaUsedAsEndEntity)")
                && text.contains("basicConstraints=critical,CA:FALSE"),
            "{text}"
        );
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn the_server_name_is_verified_and_can_be_given() {
    bounded(async {
        let pki = pki();
        let server = echo_server(server_tls(&pki, TlsMode::Enforcing)).await;
        let addr = server.local_addr().to_string();
        let roots = TrustRoots::Certificates(vec![pki.ca.clone()]);
        let other = ClientTls::new(roots.clone(), Some("broker.example")).unwrap();
        let text = echo(&client(Some(other)), &addr, b"x")
            .await
            .unwrap_err()
            .to_string();
        assert!(text.contains("not valid for \"broker.example\""), "{text}");
        // The certificate's DNS name works when given in place of the address.
        let named = ClientTls::new(roots, Some("localhost")).unwrap();
        echo(&client(Some(named)), &addr, b"by name").await.unwrap();
        // Insecure mode does not verify at all, but still encrypts.
        let insecure = ClientTls::new(TrustRoots::Insecure, Some("broker.example")).unwrap();
        echo(&client(Some(insecure)), &addr, b"insecure")
            .await
            .unwrap();
        assert_eq!(server.stats().snapshot().tls_handshakes, 2);
        server.shutdown().await;
    })
    .await;
}

/// Reads until the server closes the connection (EOF or reset), bounded for liveness.
async fn closed_by_server(mut s: TcpStream) {
    let mut buf = [0u8; 64];
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the server kept a stalled connection open");
}

#[tokio::test]
async fn stalled_handshakes_are_closed_after_the_timeout_without_holding_up_others() {
    bounded(async {
        let pki = pki();
        let tls =
            server_tls(&pki, TlsMode::Enforcing).with_handshake_timeout(Duration::from_millis(300));
        assert_eq!(tls.handshake_timeout(), Duration::from_millis(300));
        let server = echo_server(tls).await;
        let addr = server.local_addr().to_string();
        // One peer starts a handshake record and stops; another never sends a byte.
        let mut half = TcpStream::connect(&addr).await.unwrap();
        half.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
        let silent = TcpStream::connect(&addr).await.unwrap();
        // Meanwhile a real client is served at once.
        echo(&client(Some(trusting(&pki))), &addr, b"not held up")
            .await
            .unwrap();
        closed_by_server(half).await;
        closed_by_server(silent).await;
        let s = server.stats().snapshot();
        assert_eq!(s.tls_handshake_timeouts, 2, "{s:?}");
        assert_eq!(s.tls_handshakes, 1, "{s:?}");
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn pem_files_are_read_and_a_key_that_does_not_fit_is_refused() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let (ca_cert, ca_key) = ca("Shoal file CA");
        let p = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = p.signed_by(&key, &ca_cert, &ca_key).unwrap();
        let (ca_pem, cert_pem, key_pem) = (
            dir.path().join("ca.pem"),
            dir.path().join("server.pem"),
            dir.path().join("server.key"),
        );
        std::fs::write(&ca_pem, ca_cert.pem()).unwrap();
        std::fs::write(&cert_pem, leaf.pem()).unwrap();
        std::fs::write(&key_pem, key.serialize_pem()).unwrap();

        let tls = ServerTls::from_pem_files(TlsMode::Enforcing, &cert_pem, &key_pem).unwrap();
        let server = echo_server(tls).await;
        let addr = server.local_addr().to_string();
        let c = ClientTls::new(TrustRoots::PemFile(ca_pem.clone()), None).unwrap();
        echo(&client(Some(c)), &addr, b"from files").await.unwrap();
        server.shutdown().await;

        // The CA's key with the leaf's certificate: refused when the settings are made.
        let wrong_key = dir.path().join("wrong.key");
        std::fs::write(&wrong_key, ca_key.serialize_pem()).unwrap();
        let e = ServerTls::from_pem_files(TlsMode::Enforcing, &cert_pem, &wrong_key).unwrap_err();
        assert!(e.to_string().contains("wrong.key"), "{e}");
        // A key file given as the certificate file: no certificate in it.
        let e = ServerTls::from_pem_files(TlsMode::Enforcing, &key_pem, &key_pem).unwrap_err();
        assert!(e.to_string().contains("no certificate"), "{e}");
    })
    .await;
}
