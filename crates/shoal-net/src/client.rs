//! [`RemotingClient`]: a pool of connections keyed by `"ip:port"`, with request helpers.

use crate::connection::{Connection, NetConfig};
use crate::processor::{NotSupportedProcessor, Processor};
use crate::stats::NetStats;
use crate::tls::ClientTls;
use crate::{NetError, Result};
use futures::future::Either;
use futures::FutureExt;
use parking_lot::Mutex;
use shoal_proto::RemotingCommand;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::OnceCell;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// One address's connection, established at most once (concurrent callers share the attempt;
/// a failed attempt leaves it empty for the next caller).
type Slot = Arc<OnceCell<Connection>>;

struct ClientInner {
    config: NetConfig,
    tls: Option<ClientTls>,
    processor: Arc<dyn Processor>,
    slots: Mutex<foldhash::HashMap<String, Slot>>,
    shutdown: CancellationToken,
    stats: Arc<NetStats>,
}

impl Drop for ClientInner {
    /// The last handle of a client is gone: close its connections.
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The client side of the transport: one connection per `"ip:port"` address, established on
/// first use (with the connect timeout) and re-established on the next use after it died.
/// Requests the server sends on these connections (NOTIFY_CONSUMER_IDS_CHANGED,
/// GET_CONSUMER_RUNNING_INFO, ...) go to the client's [`Processor`].
///
/// Cheap to clone; clones share the pool. Connections live until [`RemotingClient::shutdown`],
/// [`RemotingClient::close_connection`], the last clone being dropped, the server closing
/// them, or an error.
#[derive(Clone)]
pub struct RemotingClient {
    inner: Arc<ClientInner>,
}

impl fmt::Debug for RemotingClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemotingClient")
            .field("config", &self.inner.config)
            .field("tls", &self.inner.tls)
            .field("addresses", &self.inner.slots.lock().len())
            .field("shut_down", &self.inner.shutdown.is_cancelled())
            .finish()
    }
}

impl Default for RemotingClient {
    fn default() -> Self {
        Self::new(NetConfig::default(), Arc::new(NotSupportedProcessor))
    }
}

impl RemotingClient {
    /// A client with the given settings; `processor` handles server-initiated requests (use
    /// [`NotSupportedProcessor`] to answer them all REQUEST_CODE_NOT_SUPPORTED, and
    /// [`request_code_not_supported`](crate::request_code_not_supported) for unknown codes in
    /// your own).
    pub fn new(config: NetConfig, processor: Arc<dyn Processor>) -> Self {
        Self::with_tls(config, processor, None)
    }

    /// A client like [`RemotingClient::new`] that, when `tls` is given, speaks TLS to every
    /// address (the handshake runs within the connect timeout).
    pub fn with_tls(
        config: NetConfig,
        processor: Arc<dyn Processor>,
        tls: Option<ClientTls>,
    ) -> Self {
        Self {
            inner: Arc::new(ClientInner {
                config,
                tls,
                processor,
                slots: Mutex::new(foldhash::HashMap::default()),
                shutdown: CancellationToken::new(),
                stats: Arc::default(),
            }),
        }
    }

    /// The counters of this client's connections.
    pub fn stats(&self) -> Arc<NetStats> {
        Arc::clone(&self.inner.stats)
    }

    /// The TLS settings of this client's connections (`None`: plaintext).
    pub fn tls(&self) -> Option<&ClientTls> {
        self.inner.tls.as_ref()
    }

    /// The settings this client was made with.
    pub fn config(&self) -> &NetConfig {
        &self.inner.config
    }

    /// The open connection to `addr` (`"ip:port"`), connecting first (within the configured
    /// connect timeout) when there is none or the previous one has closed.
    ///
    /// # Errors
    /// [`NetError::ConnectTimeout`], [`NetError::ConnectFailed`], [`NetError::Shutdown`].
    pub async fn connection(&self, addr: &str) -> Result<Connection> {
        self.connection_within(addr, self.inner.config.connect_timeout)
            .await
    }

    /// The open connection to `addr`, if there is one (nothing is created).
    fn established(&self, addr: &str) -> Option<Connection> {
        if self.inner.shutdown.is_cancelled() {
            return None;
        }
        let slots = self.inner.slots.lock();
        slots
            .get(addr)
            .and_then(|s| s.get())
            .filter(|c| !c.is_closed())
            .cloned()
    }

    async fn connection_within(&self, addr: &str, connect_timeout: Duration) -> Result<Connection> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            if self.inner.shutdown.is_cancelled() {
                return Err(NetError::Shutdown);
            }
            let slot = {
                let mut slots = self.inner.slots.lock();
                match slots.get(addr) {
                    Some(s) => Arc::clone(s),
                    None => Arc::clone(
                        slots
                            .entry(addr.to_owned())
                            .or_insert_with(|| Arc::new(OnceCell::new())),
                    ),
                }
            };
            // Fast path: an established connection is used as it is.
            if attempts == 1 {
                if let Some(conn) = slot.get().filter(|c| !c.is_closed()) {
                    return Ok(conn.clone());
                }
            }
            // Callers arriving during someone else's attempt share it, within their own timeout.
            // Boxed: connecting is rare, and its future would otherwise grow every request's.
            let conn = Box::pin(tokio::time::timeout(
                connect_timeout,
                slot.get_or_try_init(|| self.connect(addr, connect_timeout)),
            ))
            .await
            .map_err(|_| NetError::ConnectTimeout {
                addr: addr.to_owned(),
                timeout: connect_timeout,
            })??;
            if !conn.is_closed() || attempts >= 2 {
                return Ok(conn.clone());
            }
            // The connection died since it was made: forget it (unless someone already
            // replaced it) and connect again.
            debug!(addr, id = conn.id(), "connection closed; reconnecting");
            let mut slots = self.inner.slots.lock();
            if slots.get(addr).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                slots.remove(addr);
            }
        }
    }

    async fn connect(&self, addr: &str, timeout: Duration) -> Result<Connection> {
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Err(_) => {
                return Err(NetError::ConnectTimeout {
                    addr: addr.to_owned(),
                    timeout,
                })
            }
            Ok(Err(source)) => {
                return Err(NetError::ConnectFailed {
                    addr: addr.to_owned(),
                    source,
                })
            }
            Ok(Ok(stream)) => stream,
        };
        let (conn, driver) = match &self.inner.tls {
            None => {
                let (conn, driver) = Connection::start_tcp(
                    stream,
                    Arc::clone(&self.inner.processor),
                    &self.inner.config,
                    Some(&self.inner.shutdown),
                    Arc::clone(&self.inner.stats),
                )?;
                (conn, driver.boxed())
            }
            Some(tls) => {
                let peer = stream.peer_addr()?;
                let local = stream.local_addr()?;
                if let Err(e) = stream.set_nodelay(true) {
                    debug!(%peer, error = %e, "cannot set TCP_NODELAY");
                }
                // The caller bounds the whole attempt (TCP and handshake) by the timeout.
                let stream = tls.connect(addr, stream).await?;
                let (conn, driver) = Connection::start_io(
                    stream,
                    peer,
                    local,
                    Arc::clone(&self.inner.processor),
                    &self.inner.config,
                    Some(&self.inner.shutdown),
                    Arc::clone(&self.inner.stats),
                );
                (conn, driver.boxed())
            }
        };
        tokio::spawn(driver);
        debug!(addr, id = conn.id(), "connected");
        Ok(conn)
    }

    /// Sends `request` to `addr` and waits for the response; `timeout` covers connecting (at
    /// most the connect timeout) and the exchange. See [`Connection::request`].
    ///
    /// # Errors
    /// Those of [`RemotingClient::connection`] and [`Connection::request`].
    ///
    /// On an established connection the request is sent when this is called (see
    /// [`Connection::start_request`]), and the future returned only waits for the answer; it
    /// is small and owns what it needs.
    pub fn invoke(
        &self,
        addr: &str,
        request: RemotingCommand,
        timeout: Duration,
    ) -> impl Future<Output = Result<RemotingCommand>> + Send + 'static {
        self.invoke_with(addr, request, timeout, false)
    }

    /// [`RemotingClient::invoke`] for a caller that reads the answer's header with a reader
    /// that takes a kept binary area too (see
    /// [`Connection::start_request_keeping_answer_area`]).
    pub fn invoke_keeping_answer_area(
        &self,
        addr: &str,
        request: RemotingCommand,
        timeout: Duration,
    ) -> impl Future<Output = Result<RemotingCommand>> + Send + 'static {
        self.invoke_with(addr, request, timeout, true)
    }

    fn invoke_with(
        &self,
        addr: &str,
        request: RemotingCommand,
        timeout: Duration,
        keep_area: bool,
    ) -> impl Future<Output = Result<RemotingCommand>> + Send + 'static {
        let start = move |conn: &Connection, request, timeout| match keep_area {
            true => conn.start_request_keeping_answer_area(request, timeout),
            false => conn.start_request(request, timeout),
        };
        // An established connection is used at once, with the whole timeout (and no clock
        // read); a connection being made takes its time out of the timeout.
        if let Some(conn) = self.established(addr) {
            return Either::Left(start(&conn, request, timeout));
        }
        let (this, addr) = (self.clone(), addr.to_owned());
        Either::Right(Box::pin(async move {
            let deadline = Instant::now() + timeout;
            let conn = this
                .connection_within(&addr, timeout.min(this.inner.config.connect_timeout))
                .await?;
            let remaining = deadline.saturating_duration_since(Instant::now());
            start(&conn, request, remaining).await
        }))
    }

    /// Sends `request` to `addr` as a oneway request (connecting first if needed).
    ///
    /// # Errors
    /// Those of [`RemotingClient::connection`] and [`Connection::oneway`].
    pub async fn invoke_oneway(&self, addr: &str, request: RemotingCommand) -> Result<()> {
        self.connection(addr).await?.oneway(request).await
    }

    /// Closes and forgets the connection to `addr`, if any (the next use reconnects).
    pub fn close_connection(&self, addr: &str) {
        let slot = self.inner.slots.lock().remove(addr);
        if let Some(conn) = slot.as_ref().and_then(|s| s.get()) {
            conn.close();
        }
    }

    /// Closes every connection and refuses further use ([`NetError::Shutdown`]).
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.slots.lock().clear();
    }
}
