//! TLS for the remoting transport (rustls with the ring provider), as RocketMQ offers it:
//!
//! - servers run in one of three [`TlsMode`]s (RocketMQ `tls.server.mode`): `disabled`
//!   (plaintext only), `permissive` (each connection chooses: one whose first byte is a TLS
//!   handshake record, 0x16, is served over TLS, any other over plaintext), `enforcing` (TLS
//!   only; a plaintext connection is closed and counted);
//! - clients speak either plaintext or TLS to every address (RocketMQ `tls.enable`), verifying
//!   the server's certificate against given CA certificates
//!   (`tls.client.trustCertPath`) or, when asked (`tls.test.mode.enable`), not at all.
//!
//! Certificates and keys are PEM files. The server's handshake (and, in permissive and
//! enforcing mode, the wait for the first byte) runs in the connection's own task, bounded by
//! [`ServerTls::handshake_timeout`], so a slow or silent peer never holds up accepting; a
//! client's handshake is bounded by its connect timeout. A plaintext remoting frame cannot
//! start with 0x16: its first byte is the high byte of a frame length, and a frame of
//! 0x16000000 bytes or more is far over any frame limit.

use crate::stats::{bump, NetStats};
use crate::{NetError, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{ring, verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// Default bound of a server-side TLS handshake, including the wait for the first byte.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The first byte of a TLS connection: the content type of a handshake record.
pub(crate) const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// How a server treats TLS (RocketMQ `tls.server.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// Plaintext only (the default).
    #[default]
    Disabled,
    /// TLS and plaintext, chosen by each connection's first byte.
    Permissive,
    /// TLS only: plaintext connections are closed.
    Enforcing,
}

impl FromStr for TlsMode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "disabled" => Ok(TlsMode::Disabled),
            "permissive" => Ok(TlsMode::Permissive),
            "enforcing" => Ok(TlsMode::Enforcing),
            other => Err(format!(
                "unknown TLS mode {other:?} (disabled, permissive or enforcing)"
            )),
        }
    }
}

impl fmt::Display for TlsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsMode::Disabled => "disabled",
            TlsMode::Permissive => "permissive",
            TlsMode::Enforcing => "enforcing",
        })
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

fn tls_error(what: impl fmt::Display) -> NetError {
    NetError::Tls(what.to_string())
}

/// Reads every certificate of a PEM file (at least one).
///
/// # Errors
/// [`NetError::Tls`] naming the file.
pub fn read_pem_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| {
            tls_error(format!(
                "cannot read certificates from {}: {e}",
                path.display()
            ))
        })?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| tls_error(format!("bad certificate in {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(tls_error(format!(
            "no certificate in {} (PEM \"BEGIN CERTIFICATE\" blocks expected)",
            path.display()
        )));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| {
        tls_error(format!(
            "cannot read a private key (PEM: PKCS#8, PKCS#1 or SEC1) from {}: {e}",
            path.display()
        ))
    })
}

/// A server's TLS settings: the mode and, unless disabled, its certificate chain and key.
/// Clones share the rustls configuration.
#[derive(Clone)]
pub struct ServerTls {
    mode: TlsMode,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    chain: Vec<CertificateDer<'static>>,
    handshake_timeout: Duration,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("mode", &self.mode)
            .field("certificates", &self.chain.len())
            .field("handshake_timeout", &self.handshake_timeout)
            .finish()
    }
}

/// Equal when the mode, the certificate chain and the handshake timeout are (the key is not
/// compared).
impl PartialEq for ServerTls {
    fn eq(&self, other: &Self) -> bool {
        self.mode == other.mode
            && self.chain == other.chain
            && self.handshake_timeout == other.handshake_timeout
    }
}

impl Eq for ServerTls {}

impl Default for ServerTls {
    fn default() -> Self {
        Self::disabled()
    }
}

impl ServerTls {
    /// Plaintext only.
    pub fn disabled() -> Self {
        ServerTls {
            mode: TlsMode::Disabled,
            acceptor: None,
            chain: Vec::new(),
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }

    /// `mode` with the PEM certificate chain (leaf first) and PEM private key (PKCS#8, PKCS#1
    /// or SEC1) read from files; for [`TlsMode::Disabled`] nothing is read.
    ///
    /// # Errors
    /// [`NetError::Tls`] when a file cannot be read or the key does not fit the certificate.
    pub fn from_pem_files(mode: TlsMode, cert: &Path, key: &Path) -> Result<Self> {
        if mode == TlsMode::Disabled {
            return Ok(Self::disabled());
        }
        Self::new(mode, read_pem_certificates(cert)?, read_key(key)?).map_err(|e| match e {
            NetError::Tls(m) => tls_error(format!(
                "{m} (certificate {}, key {})",
                cert.display(),
                key.display()
            )),
            other => other,
        })
    }

    /// `mode` with an in-memory certificate chain (leaf first) and key.
    ///
    /// # Errors
    /// [`NetError::Tls`] when the key does not fit the certificate or is unsupported.
    pub fn new(
        mode: TlsMode,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Self> {
        if mode == TlsMode::Disabled {
            return Ok(Self::disabled());
        }
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls_error)?
            .with_no_client_auth()
            .with_single_cert(chain.clone(), key)
            .map_err(tls_error)?;
        Ok(ServerTls {
            mode,
            acceptor: Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
            chain,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        })
    }

    /// The same settings with another bound on the handshake (and the wait for the first
    /// byte); default [`DEFAULT_HANDSHAKE_TIMEOUT`].
    #[must_use]
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// The same settings whose handshakes offer `protocols` by ALPN (a gRPC listener needs
    /// `h2`).
    #[must_use]
    pub fn with_alpn(mut self, protocols: &[&[u8]]) -> Self {
        if let Some(a) = &self.acceptor {
            let mut config = (**a.config()).clone();
            config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
            self.acceptor = Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)));
        }
        self
    }

    /// The rustls acceptor of the certificate and key (`None` when disabled), for another
    /// listener of the process that serves the same certificate (the HTTP port).
    pub fn acceptor(&self) -> Option<tokio_rustls::TlsAcceptor> {
        self.acceptor.clone()
    }

    /// A copy with another mode and the same certificate and key (`Disabled` when there are
    /// none).
    pub fn with_mode(&self, mode: TlsMode) -> Self {
        let mut t = self.clone();
        t.mode = if t.acceptor.is_some() {
            mode
        } else {
            TlsMode::Disabled
        };
        t
    }

    /// The mode.
    pub fn mode(&self) -> TlsMode {
        self.mode
    }

    /// The bound on a handshake, including the wait for the connection's first byte.
    pub fn handshake_timeout(&self) -> Duration {
        self.handshake_timeout
    }
}

/// A connection accepted by a TLS-aware server, ready for [`Connection::start_io`](crate::Connection::start_io)
/// (or for another protocol's server: it reads and writes as the stream it wraps).
#[derive(Debug)]
pub enum Accepted {
    /// Plaintext.
    Plain(TcpStream),
    /// TLS, handshake done.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl tokio::io::AsyncRead for Accepted {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Accepted::Plain(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Accepted::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Accepted {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Accepted::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Accepted::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Accepted::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            Accepted::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Accepted::Plain(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Accepted::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// What a server in permissive or enforcing mode does with a new connection: waits (bounded)
/// for its first byte, then serves it over TLS (after the handshake), over plaintext
/// (permissive), or closes it (enforcing, plaintext). `None`: closed, and counted.
pub async fn accept(
    stream: TcpStream,
    peer: SocketAddr,
    tls: &ServerTls,
    shutdown: &CancellationToken,
    stats: &NetStats,
) -> Option<Accepted> {
    let acceptor = match (&tls.acceptor, tls.mode) {
        (Some(a), TlsMode::Permissive | TlsMode::Enforcing) => a.clone(),
        _ => return Some(Accepted::Plain(stream)),
    };
    let deadline = tokio::time::Instant::now() + tls.handshake_timeout;
    let timed_out = || {
        bump(&stats.tls_handshake_timeouts);
        debug!(%peer, timeout = ?tls.handshake_timeout, "TLS handshake timed out; closing");
        None
    };
    // The first byte decides; `peek` leaves it in the socket.
    let mut first = [0u8; 1];
    let peeked = tokio::select! {
        _ = shutdown.cancelled() => return None,
        r = tokio::time::timeout_at(deadline, stream.peek(&mut first)) => r,
    };
    match peeked {
        Err(_) => return timed_out(),
        Ok(Ok(0)) => return None,
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "connection failed before its first byte");
            return None;
        }
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        if tls.mode == TlsMode::Permissive {
            bump(&stats.plaintext_accepted);
            return Some(Accepted::Plain(stream));
        }
        bump(&stats.plaintext_refused);
        debug!(%peer, "plaintext connection to a TLS-only (enforcing) server; closing");
        return None;
    }
    let handshake = tokio::select! {
        _ = shutdown.cancelled() => return None,
        r = tokio::time::timeout_at(deadline, acceptor.accept(stream)) => r,
    };
    match handshake {
        Err(_) => timed_out(),
        Ok(Err(e)) => {
            bump(&stats.tls_handshake_failures);
            debug!(%peer, error = %e, "TLS handshake failed; closing");
            None
        }
        Ok(Ok(s)) => {
            bump(&stats.tls_handshakes);
            Some(Accepted::Tls(Box::new(s)))
        }
    }
}

/// Where a client's trust in server certificates comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrustRoots {
    /// CA certificates in a PEM file that server certificates must chain to (RocketMQ
    /// `tls.client.trustCertPath`).
    PemFile(PathBuf),
    /// In-memory CA certificates.
    Certificates(Vec<CertificateDer<'static>>),
    /// No verification of the server's certificate (RocketMQ `tls.test.mode.enable`): the
    /// connection is encrypted, but the server is not authenticated. For tests and trusted
    /// networks only.
    Insecure,
}

/// A client's TLS settings: every connection of the client speaks TLS. Clones share the
/// rustls configuration.
#[derive(Clone)]
pub struct ClientTls {
    roots: TrustRoots,
    server_name: Option<ServerName<'static>>,
    connector: tokio_rustls::TlsConnector,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let roots = match &self.roots {
            TrustRoots::PemFile(p) => format!("file {}", p.display()),
            TrustRoots::Certificates(c) => format!("{} certificates", c.len()),
            TrustRoots::Insecure => "none (insecure)".to_owned(),
        };
        f.debug_struct("ClientTls")
            .field("roots", &roots)
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// Equal when the trust roots and the server name are.
impl PartialEq for ClientTls {
    fn eq(&self, other: &Self) -> bool {
        self.roots == other.roots && self.server_name == other.server_name
    }
}

impl Eq for ClientTls {}

impl ClientTls {
    /// TLS trusting `roots`. `server_name`, when given, is the name every server certificate
    /// must carry (a DNS name or an IP address); otherwise the host part of each address is.
    ///
    /// # Errors
    /// [`NetError::Tls`] when the roots cannot be read or the name is not a valid DNS name or
    /// IP address.
    pub fn new(roots: TrustRoots, server_name: Option<&str>) -> Result<Self> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls_error)?;
        let store = |certs: Vec<CertificateDer<'static>>, from: &str| {
            let mut store = rustls::RootCertStore::empty();
            for c in certs {
                store
                    .add(c)
                    .map_err(|e| tls_error(format!("bad CA certificate in {from}: {e}")))?;
            }
            Ok::<_, NetError>(store)
        };
        let config = match &roots {
            TrustRoots::Insecure => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(provider())))
                .with_no_client_auth(),
            TrustRoots::PemFile(path) => builder
                .with_root_certificates(store(
                    read_pem_certificates(path)?,
                    &path.display().to_string(),
                )?)
                .with_no_client_auth(),
            TrustRoots::Certificates(certs) => builder
                .with_root_certificates(store(certs.clone(), "memory")?)
                .with_no_client_auth(),
        };
        let server_name = match server_name {
            None => None,
            Some(n) => Some(
                ServerName::try_from(n.to_owned())
                    .map_err(|e| tls_error(format!("bad TLS server name {n:?}: {e}")))?,
            ),
        };
        Ok(ClientTls {
            roots,
            server_name,
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        })
    }

    /// Where trust comes from.
    pub fn roots(&self) -> &TrustRoots {
        &self.roots
    }

    /// The name to verify for `addr` (`host:port`).
    fn server_name_for(&self, addr: &str) -> Result<ServerName<'static>> {
        if let Some(n) = &self.server_name {
            return Ok(n.clone());
        }
        let host = match addr.rsplit_once(':') {
            Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
            None => addr,
        };
        ServerName::try_from(host.to_owned()).map_err(|e| {
            tls_error(format!(
                "address {addr:?} has no usable TLS server name ({e}); give one"
            ))
        })
    }

    /// Runs the client side of the handshake on a connected stream.
    pub(crate) async fn connect(
        &self,
        addr: &str,
        stream: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let name = self.server_name_for(addr)?;
        self.connector
            .connect(name.clone(), stream)
            .await
            .map_err(|e| NetError::TlsHandshake {
                addr: addr.to_owned(),
                reason: describe_handshake_error(&e, &name),
            })
    }
}

/// A handshake failure in words a user can act on.
fn describe_handshake_error(e: &std::io::Error, name: &ServerName<'_>) -> String {
    let name = name.to_str();
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)) => {
            "the server's certificate is not signed by a trusted CA (UnknownIssuer; check the \
             CA file given to the client)"
                .to_owned()
        }
        Some(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        )) => format!(
            "the server's certificate is not valid for {name:?} (NotValidForName; give the name \
             it carries as the TLS server name)"
        ),
        Some(rustls::Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        )) => "the server's certificate has expired".to_owned(),
        Some(rustls::Error::InvalidCertificate(CertificateError::Other(other)))
            if format!("{other:?}").contains("CaUsedAsEndEntity") =>
        {
            "the server presents a CA certificate as its own (CaUsedAsEndEntity): give the \
             server a certificate that says basicConstraints CA:FALSE, signed by the CA the \
             client trusts; for a self-signed trial certificate add -addext \
             \"basicConstraints=critical,CA:FALSE\" to `openssl req -x509` (docs/security.md)"
                .to_owned()
        }
        Some(other) => other.to_string(),
        None if matches!(
            e.kind(),
            std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
        ) =>
        {
            format!(
                "the server closed the connection during the handshake ({e}); does it serve TLS?"
            )
        }
        None => e.to_string(),
    }
}

/// Accepts any server certificate (but still checks the handshake signatures, so the
/// connection is encrypted to whoever holds the presented certificate's key).
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for m in [TlsMode::Disabled, TlsMode::Permissive, TlsMode::Enforcing] {
            assert_eq!(m.to_string().parse::<TlsMode>(), Ok(m));
        }
        assert_eq!("ENFORCING".parse::<TlsMode>(), Ok(TlsMode::Enforcing));
        let e = "strict".parse::<TlsMode>().unwrap_err();
        assert!(e.contains("disabled, permissive or enforcing"), "{e}");
    }

    #[test]
    fn server_names_come_from_the_address_unless_given() {
        let tls = ClientTls::new(TrustRoots::Insecure, None).unwrap();
        assert_eq!(
            tls.server_name_for("127.0.0.1:10911").unwrap().to_str(),
            "127.0.0.1"
        );
        assert_eq!(
            tls.server_name_for("broker-a.example:10911")
                .unwrap()
                .to_str(),
            "broker-a.example"
        );
        assert_eq!(tls.server_name_for("[::1]:9876").unwrap().to_str(), "::1");
        let named = ClientTls::new(TrustRoots::Insecure, Some("shoal.local")).unwrap();
        assert_eq!(
            named.server_name_for("127.0.0.1:1").unwrap().to_str(),
            "shoal.local"
        );
        assert!(ClientTls::new(TrustRoots::Insecure, Some("not a name!")).is_err());
    }

    #[test]
    fn unreadable_files_are_named_in_the_error() {
        let missing = Path::new("/nonexistent/shoal-cert.pem");
        let e = ServerTls::from_pem_files(TlsMode::Enforcing, missing, missing).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/shoal-cert.pem"), "{e}");
        let e = ClientTls::new(TrustRoots::PemFile(missing.into()), None).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/shoal-cert.pem"), "{e}");
        // Disabled reads nothing.
        assert_eq!(
            ServerTls::from_pem_files(TlsMode::Disabled, missing, missing)
                .unwrap()
                .mode(),
            TlsMode::Disabled
        );
    }
}
