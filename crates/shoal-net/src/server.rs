//! [`Server`]: accepts connections and dispatches their requests to a [`Processor`].

use crate::connection::{Connection, NetConfig};
use crate::processor::Processor;
use crate::stats::{bump, NetStats};
use crate::tls::{self, Accepted, ServerTls, TlsMode};
use crate::Result;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

/// A listening remoting server: one task per connection, each incoming request dispatched to
/// the [`Processor`], connection open/close events reported to it. At most
/// [`NetConfig::max_connections_per_ip`] connections per IP address are served at once.
///
/// Dropping the `Server` stops it as [`Server::shutdown`] does, without waiting.
#[derive(Debug)]
pub struct Server {
    local_addr: SocketAddr,
    shutdown: CancellationToken,
    accept_task: Option<JoinHandle<()>>,
    stats: Arc<NetStats>,
}

impl Server {
    /// Binds `addr` (port 0 picks a free port; see [`Server::local_addr`]) with the default
    /// [`NetConfig`] and starts accepting.
    ///
    /// # Errors
    /// [`NetError::Io`](crate::NetError::Io) when the address cannot be bound.
    pub async fn bind(addr: impl ToSocketAddrs, processor: Arc<dyn Processor>) -> Result<Server> {
        Self::bind_with_config(addr, processor, NetConfig::default()).await
    }

    /// Binds `addr` with the given settings (frame limit, write queue) and starts accepting
    /// plaintext connections.
    ///
    /// # Errors
    /// [`NetError::Io`](crate::NetError::Io) when the address cannot be bound.
    pub async fn bind_with_config(
        addr: impl ToSocketAddrs,
        processor: Arc<dyn Processor>,
        config: NetConfig,
    ) -> Result<Server> {
        Self::bind_with_tls(addr, processor, config, ServerTls::disabled()).await
    }

    /// Binds `addr` with the given settings and TLS mode and starts accepting. In permissive
    /// and enforcing mode each connection's task first waits for the first byte and runs the
    /// handshake (bounded by [`ServerTls::handshake_timeout`]), so slow handshakes never hold
    /// up accepting; they count against the per-address connection limit meanwhile.
    ///
    /// # Errors
    /// [`NetError::Io`](crate::NetError::Io) when the address cannot be bound.
    pub async fn bind_with_tls(
        addr: impl ToSocketAddrs,
        processor: Arc<dyn Processor>,
        config: NetConfig,
        tls: ServerTls,
    ) -> Result<Server> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let stats = Arc::new(NetStats::default());
        let span = tracing::info_span!("server", addr = %local_addr);
        let accept_task = tokio::spawn(
            accept_loop(
                listener,
                processor,
                config,
                tls.clone(),
                shutdown.clone(),
                Arc::clone(&stats),
            )
            .instrument(span),
        );
        info!(addr = %local_addr, tls = %tls.mode(), "remoting server listening");
        Ok(Server {
            local_addr,
            shutdown,
            accept_task: Some(accept_task),
            stats,
        })
    }

    /// The counters of this server's connections (limits hit, reads, writes).
    pub fn stats(&self) -> Arc<NetStats> {
        Arc::clone(&self.stats)
    }

    /// The address actually bound (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, closes every connection (queued frames are flushed, pending requests
    /// fail, the processor hears every close), and waits until all connection tasks have
    /// ended. Request tasks still running may finish, but their answers are not sent.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.accept_task.take() {
            if let Err(e) = task.await {
                warn!(error = %e, "accept task failed");
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    processor: Arc<dyn Processor>,
    config: NetConfig,
    tls: ServerTls,
    shutdown: CancellationToken,
    stats: Arc<NetStats>,
) {
    let mut connections = JoinSet::new();
    let mut per_ip: HashMap<IpAddr, usize> = HashMap::new();
    let mut last_refusal_log: Option<Instant> = None;
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some(ended) = connections.join_next(), if !connections.is_empty() => {
                if let Ok(ip) = ended {
                    release_ip(&mut per_ip, ip);
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let ip = peer.ip();
                    let count = per_ip.entry(ip).or_insert(0);
                    if *count >= config.max_connections_per_ip {
                        bump(&stats.refused_per_ip);
                        // One line a second at most: a connection flood must not flood the log.
                        if last_refusal_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                            last_refusal_log = Some(Instant::now());
                            warn!(
                                %peer,
                                limit = config.max_connections_per_ip,
                                refused = stats.snapshot().refused_per_ip,
                                "too many connections from this address; refusing"
                            );
                        }
                        drop(stream);
                        continue;
                    }
                    if tls.mode() != TlsMode::Disabled {
                        *count += 1;
                        let (processor, config, tls, shutdown, stats) = (
                            Arc::clone(&processor),
                            config.clone(),
                            tls.clone(),
                            shutdown.clone(),
                            Arc::clone(&stats),
                        );
                        connections.spawn(async move {
                            serve_tls_aware(stream, peer, processor, &config, &tls, &shutdown, stats)
                                .await;
                            ip
                        });
                        continue;
                    }
                    match Connection::start_tcp(
                        stream,
                        Arc::clone(&processor),
                        &config,
                        Some(&shutdown),
                        Arc::clone(&stats),
                    ) {
                        Ok((conn, driver)) => {
                            *count += 1;
                            debug!(%peer, id = conn.id(), "accepted connection");
                            connections.spawn(async move {
                                driver.await;
                                ip
                            });
                        }
                        Err(e) => debug!(%peer, error = %e, "connection died at accept"),
                    }
                }
                Err(e) => {
                    // Typically out of file descriptors: back off instead of spinning.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    info!("remoting server stopped");
}

/// One connection of a server in permissive or enforcing mode, on its own task: the first
/// byte and the handshake (see [`tls::accept`]), then the connection itself.
async fn serve_tls_aware(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    processor: Arc<dyn Processor>,
    config: &NetConfig,
    tls: &ServerTls,
    shutdown: &CancellationToken,
    stats: Arc<NetStats>,
) {
    let local = match stream.local_addr() {
        Ok(a) => a,
        Err(e) => {
            debug!(%peer, error = %e, "connection died at accept");
            return;
        }
    };
    if let Err(e) = stream.set_nodelay(true) {
        debug!(%peer, error = %e, "cannot set TCP_NODELAY");
    }
    match tls::accept(stream, peer, tls, shutdown, &stats).await {
        None => {}
        Some(Accepted::Plain(s)) => {
            let (conn, driver) =
                Connection::start_io(s, peer, local, processor, config, Some(shutdown), stats);
            debug!(%peer, id = conn.id(), "accepted plaintext connection");
            driver.await;
        }
        Some(Accepted::Tls(s)) => {
            let (conn, driver) =
                Connection::start_io(s, peer, local, processor, config, Some(shutdown), stats);
            debug!(%peer, id = conn.id(), "accepted TLS connection");
            driver.await;
        }
    }
}

fn release_ip(per_ip: &mut HashMap<IpAddr, usize>, ip: IpAddr) {
    if let Some(n) = per_ip.get_mut(&ip) {
        *n -= 1;
        if *n == 0 {
            per_ip.remove(&ip);
        }
    }
}
