//! `shoal-grpc`: RocketMQ 5's gRPC protocol (`apache.rocketmq.v2.MessagingService`, the
//! protocol of `rocketmq-client-java` 5.x and the Go, Python, C#, C++, Node.js and Rust clients
//! of `apache/rocketmq-clients`) served by Shoal's broker itself, with no proxy process.
//!
//! [`GrpcServer::start`] listens (plaintext, TLS or both as the broker's `[tls]` says, ALPN
//! `h2`) and serves the calls on the broker's own services through
//! [`shoal_broker::BrokerApi`]:
//! - QueryRoute, QueryAssignment: the topic's queues on this broker, with the message types
//!   the topic takes; assignments are the whole topic (queue −1: the broker chooses, POP).
//! - SendMessage: normal, FIFO (message group → queue), delayed (delivery timestamp) and
//!   transactional messages, through the broker's send path.
//! - ReceiveMessage (server-streamed, long polling), AckMessage, ChangeInvisibleDuration,
//!   ForwardMessageToDeadLetterQueue: the broker's POP engine; `auto_renew` receipts are
//!   renewed here until acked ([`renew`]), and acks name the latest receipt.
//! - EndTransaction; transaction checks go to producers over their Telemetry stream.
//! - Heartbeat, NotifyClientTermination, Telemetry (the settings exchange clients wait for
//!   at start), UpdateOffset, GetOffset, QueryOffset.
//! - PullMessage, RecallMessage, SyncLiteSubscription: UNSUPPORTED with a message.
//!
//! ACL: when the broker has one, every call's `authorization` header (RocketMQ 5's
//! `MQv2-HMAC-SHA1` signature over `x-mq-date-time`) is checked against its accounts, and the
//! call's resources against their permissions ([`auth`]).

pub mod auth;
mod convert;
mod metrics;
mod polling;
pub mod renew;
mod service;
mod session;

/// The `apache.rocketmq.v2` messages and service, generated from `proto/` by `build.rs`.
#[allow(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    clippy::all,
    clippy::pedantic
)]
pub mod pb {
    tonic::include_proto!("apache.rocketmq.v2");
}

use shoal_broker::BrokerApi;
use shoal_net::{ServerTls, TlsMode};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Default port of the gRPC endpoint (RocketMQ proxy's gRPC port).
pub const DEFAULT_PORT: u16 = 8081;

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}

/// Settings of the endpoint.
#[derive(Debug, Clone)]
pub struct GrpcConfig {
    /// Listen address (`host:port`; port 0 picks one).
    pub listen: String,
    /// `host:port` routes name when the client's request names no endpoint (default: the
    /// broker's announced host with the bound port).
    pub advertised: Option<String>,
    /// TLS of the listener (the broker's `[tls]`); ALPN `h2` is added.
    pub tls: ServerTls,
    /// The long polling consumers are told to use for their receives (the settings'
    /// `long_polling_timeout`; the broker's `grpc_long_polling_ms`).
    pub long_polling: std::time::Duration,
}

/// A running gRPC endpoint.
#[derive(Debug)]
pub struct GrpcServer {
    local_addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: JoinHandle<()>,
    renewals: JoinHandle<()>,
}

/// The peer's address, put in each request's extensions by the listener.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerAddr(pub SocketAddr);

/// An accepted connection as tonic serves it.
struct Conn {
    io: shoal_net::Accepted,
    peer: SocketAddr,
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = PeerAddr;

    fn connect_info(&self) -> PeerAddr {
        PeerAddr(self.peer)
    }
}

impl tokio::io::AsyncRead for Conn {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Conn {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl GrpcServer {
    /// Binds and starts serving `MessagingService` on the broker behind `api`.
    ///
    /// # Errors
    /// [`GrpcError::Bind`] when the address cannot be bound.
    pub async fn start(api: BrokerApi, config: GrpcConfig) -> Result<GrpcServer, GrpcError> {
        let listener =
            TcpListener::bind(&config.listen)
                .await
                .map_err(|source| GrpcError::Bind {
                    addr: config.listen.clone(),
                    source,
                })?;
        let local_addr = listener.local_addr().map_err(|source| GrpcError::Bind {
            addr: config.listen.clone(),
            source,
        })?;
        let advertised = config.advertised.clone().unwrap_or_else(|| {
            let host = api
                .config()
                .announce_addr()
                .rsplit_once(':')
                .map_or("127.0.0.1", |(h, _)| h)
                .to_string();
            let host = if host == "0.0.0.0" {
                "127.0.0.1".to_string()
            } else {
                host
            };
            format!("{host}:{}", local_addr.port())
        });
        let sessions = Arc::new(session::Sessions::default());
        let renewals = Arc::new(renew::Renewals::default());
        let svc =
            service::Service::new(api.clone(), sessions.clone(), renewals.clone(), advertised)
                .with_long_polling(config.long_polling);
        svc.install_transaction_checker();
        let tls = config.tls.clone().with_alpn(&[b"h2"]);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let stats = Arc::new(shoal_net::NetStats::default());
        let stats_for_metrics = stats.clone();
        let cancel = tokio_util::sync::CancellationToken::new();
        let incoming = accept_stream(listener, tls, stats, cancel.clone());
        let task = tokio::spawn(async move {
            let server = tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
                .add_service(pb::messaging_service_server::MessagingServiceServer::new(
                    svc,
                ));
            let stop = async move {
                let _ = rx.await;
                cancel.cancel();
            };
            if let Err(e) = server.serve_with_incoming_shutdown(incoming, stop).await {
                tracing::warn!(error = %e, "gRPC endpoint stopped");
            }
        });
        api.metrics().collector(metrics::GrpcCollector {
            sessions: Arc::downgrade(&sessions),
            renewals: Arc::downgrade(&renewals),
            stats: Arc::downgrade(&stats_for_metrics),
        });
        let renewals = renew::start(api, renewals, sessions);
        tracing::info!(addr = %local_addr, tls = %config.tls.mode(), "gRPC endpoint (RocketMQ 5 clients) listening");
        Ok(GrpcServer {
            local_addr,
            shutdown: Some(tx),
            task,
            renewals,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting and ends the open calls.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.renewals.abort();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), &mut self.task).await;
        self.task.abort();
    }
}

/// Accepted connections (TLS handshakes done as the mode says) as tonic's incoming stream.
fn accept_stream(
    listener: TcpListener,
    tls: ServerTls,
    stats: Arc<shoal_net::NetStats>,
    cancel: tokio_util::sync::CancellationToken,
) -> impl futures::Stream<Item = Result<Conn, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Conn, std::io::Error>>(64);
    tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                _ = cancel.cancelled() => return,
                r = listener.accept() => match r {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::debug!(error = %e, "gRPC accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = stream.set_nodelay(true);
            let tx = tx.clone();
            let tls = tls.clone();
            let stats = stats.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move {
                let io = if tls.mode() == TlsMode::Disabled {
                    Some(shoal_net::Accepted::Plain(stream))
                } else {
                    shoal_net::tls::accept(stream, peer, &tls, &cancel, &stats).await
                };
                if let Some(io) = io {
                    let _ = tx.send(Ok(Conn { io, peer })).await;
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
