//! The HTTP port's connections, in the TLS modes of the other listeners: `disabled` (HTTP),
//! `permissive` (HTTPS or HTTP, chosen by each connection's first byte: 0x16 starts a TLS
//! handshake, a request line never does) and `enforcing` (HTTPS only; a plain connection is
//! closed). Handshakes run in their own tasks, bounded by the handshake timeout, so a slow
//! client never holds up the others.

use crate::http_access::Peer;
use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use shoal_net::{ServerTls, TlsMode};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// A connection of the HTTP port.
pub(crate) enum HttpIo {
    /// HTTP.
    Plain(TcpStream),
    /// HTTPS.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl AsyncRead for HttpIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            HttpIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            HttpIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for HttpIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            HttpIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            HttpIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            HttpIo::Plain(s) => Pin::new(s).poll_flush(cx),
            HttpIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            HttpIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            HttpIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Connections ready for HTTP (handshakes done), handed to axum.
pub(crate) struct HttpListener {
    ready: mpsc::Receiver<(HttpIo, Peer)>,
    local: SocketAddr,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Drop for HttpListener {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl HttpListener {
    /// Accepts on `tcp` in `tls`'s mode.
    pub(crate) fn new(tcp: TcpListener, tls: ServerTls) -> io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let accept_task = tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::debug!(error = %e, "HTTP accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (tx, tls) = (tx.clone(), tls.clone());
                tokio::spawn(async move {
                    if let Some(io) = handshake(stream, &tls, peer).await {
                        let tls = matches!(io, HttpIo::Tls(_));
                        let _ = tx.send((io, Peer { addr: peer, tls })).await;
                    }
                });
            }
        });
        Ok(Self {
            ready,
            local,
            accept_task,
        })
    }
}

/// The connection as HTTP or HTTPS, by the mode and its first byte; `None` when it is closed.
async fn handshake(stream: TcpStream, tls: &ServerTls, peer: SocketAddr) -> Option<HttpIo> {
    let acceptor = match (tls.mode(), tls.acceptor()) {
        (TlsMode::Disabled, _) | (_, None) => return Some(HttpIo::Plain(stream)),
        (_, Some(a)) => a,
    };
    let limit = tls.handshake_timeout();
    let work = async {
        let mut first = [0u8; 1];
        let n = stream.peek(&mut first).await.ok()?;
        if n == 0 {
            return None;
        }
        if first[0] != 0x16 {
            if tls.mode() == TlsMode::Enforcing {
                tracing::debug!(peer = %peer, "plain HTTP connection to an HTTPS-only port closed");
                return None;
            }
            return Some(HttpIo::Plain(stream));
        }
        match acceptor.accept(stream).await {
            Ok(s) => Some(HttpIo::Tls(Box::new(s))),
            Err(e) => {
                tracing::debug!(peer = %peer, error = %e, "HTTPS handshake failed");
                None
            }
        }
    };
    tokio::time::timeout(limit, work).await.ok().flatten()
}

impl Listener for HttpListener {
    type Io = HttpIo;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(x) => x,
            // The accept task never ends while the listener lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(Peer {
            addr: self.local,
            tls: false,
        })
    }
}

impl Connected<IncomingStream<'_, HttpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, HttpListener>) -> Self {
        *stream.remote_addr()
    }
}
