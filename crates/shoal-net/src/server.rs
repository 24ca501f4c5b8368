//! [`Server`]: accepts connections and dispatches their requests to a [`Processor`].

use crate::connection::{Connection, NetConfig, Processor};
use crate::Result;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

/// A listening remoting server: one task per connection, each incoming request dispatched to
/// the [`Processor`], connection open/close events reported to it.
///
/// Dropping the `Server` stops it as [`Server::shutdown`] does, without waiting.
#[derive(Debug)]
pub struct Server {
    local_addr: SocketAddr,
    shutdown: CancellationToken,
    accept_task: Option<JoinHandle<()>>,
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

    /// Binds `addr` with the given settings (frame limit, write queue) and starts accepting.
    ///
    /// # Errors
    /// [`NetError::Io`](crate::NetError::Io) when the address cannot be bound.
    pub async fn bind_with_config(
        addr: impl ToSocketAddrs,
        processor: Arc<dyn Processor>,
        config: NetConfig,
    ) -> Result<Server> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let span = tracing::info_span!("server", addr = %local_addr);
        let accept_task = tokio::spawn(
            accept_loop(listener, processor, config, shutdown.clone()).instrument(span),
        );
        info!(addr = %local_addr, "remoting server listening");
        Ok(Server {
            local_addr,
            shutdown,
            accept_task: Some(accept_task),
        })
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
    shutdown: CancellationToken,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    match Connection::start(stream, Arc::clone(&processor), &config, Some(&shutdown)) {
                        Ok((conn, driver)) => {
                            debug!(%peer, id = conn.id(), "accepted connection");
                            connections.spawn(driver);
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
