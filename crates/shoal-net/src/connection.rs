//! [`Connection`]: one TCP connection carrying remoting commands in both directions.
//!
//! Each connection has two tasks: a **writer** that owns the socket's write half and is fed
//! encoded frames through a bounded channel, and a **reader** (the connection's driver) that
//! owns the read half, completes pending requests by `opaque`, and hands each incoming request
//! to the [`Processor`] in a task of its own. The only shared mutable state is the table of
//! pending requests, behind one short-lived lock never held across `.await`.

use crate::codec::RemotingCodec;
use crate::{NetError, Result};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use parking_lot::Mutex;
use shoal_proto::code::response_code::{REQUEST_CODE_NOT_SUPPORTED, SYSTEM_BUSY, SYSTEM_ERROR};
use shoal_proto::command::{FLAG_ONEWAY, FLAG_RESPONSE, MAX_FRAME_LEN};
use shoal_proto::RemotingCommand;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn, Instrument};

/// Connection ids are unique within the process; this is the allocator (an id counter, not
/// shared state anyone reads).
static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(1);

/// How long a closing connection may spend flushing frames already queued for writing.
const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// Settings shared by servers, clients and their connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// Largest frame accepted or sent, in bytes including the length field
    /// (default [`MAX_FRAME_LEN`], 16 MiB, as Java).
    pub max_frame_len: usize,
    /// Frames that may wait in a connection's write queue before senders wait (default 4096).
    pub write_queue_capacity: usize,
    /// Time allowed to establish a TCP connection (default 3 s, Java's `connectTimeoutMillis`).
    pub connect_timeout: Duration,
    /// Incoming requests of one connection being processed at once (default 16384). A request
    /// beyond that is answered SYSTEM_BUSY (2) with a remark starting `[OVERLOAD]`, on which
    /// RocketMQ clients back off and retry (a oneway one is dropped with a warning). Requests
    /// answered later through a [`Responder`] stop counting when `process` returns.
    pub max_concurrent_requests: usize,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            max_frame_len: MAX_FRAME_LEN,
            write_queue_capacity: 4096,
            connect_timeout: Duration::from_secs(3),
            max_concurrent_requests: 16384,
        }
    }
}

/// The error a [`Processor`] may return; it is answered with SYSTEM_ERROR (1) and the error's
/// text as remark.
pub type ProcessError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a [`Processor`] returns for one request: `Ok(Some(response))` to answer now,
/// `Ok(None)` to send nothing now (oneway requests, or an answer given later through a
/// [`Responder`]), `Err(e)` to answer SYSTEM_ERROR with `e`'s text as remark.
pub type ProcessResult = std::result::Result<Option<RemotingCommand>, ProcessError>;

/// Handles requests that arrive on connections, and hears about connections opening and
/// closing. Used by both sides: a [`Server`](crate::Server) for client requests, a
/// [`RemotingClient`](crate::RemotingClient) for server-initiated requests.
///
/// Each request is processed in a task of its own, so a slow request does not hold up the
/// connection. The response's `opaque` and response flag are set by the connection; a response
/// to a oneway request is never sent. A processor that returns an error or panics gets
/// SYSTEM_ERROR (1) sent back with the error text; the connection and server carry on.
///
/// Implement `process` with `Box::pin(async move { ... })`.
pub trait Processor: Send + Sync + 'static {
    /// Processes one request (never a response). `ctx` holds the connection (to remember the
    /// peer's channel and send it requests later) and a [`Responder`] (to answer later).
    fn process<'a>(
        &'a self,
        ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'a, ProcessResult>;

    /// Called once when a connection opens, before its first request is processed.
    /// Must not block; it runs on the connection's task.
    fn on_connection_open(&self, _conn: &Connection) {}

    /// Called once when a connection has closed (peer gone, error, `close()`, shutdown), after
    /// its pending requests have been failed. Must not block.
    fn on_connection_close(&self, _conn: &Connection) {}
}

/// A [`Processor`] made of an async closure (see [`processor_fn`]); connection events are
/// ignored.
pub struct FnProcessor<F> {
    f: F,
}

impl<F> fmt::Debug for FnProcessor<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnProcessor")
    }
}

/// Wraps an async closure `|ctx, request| async move { ... }` as a [`Processor`]: handy for
/// small handlers and tests.
pub fn processor_fn<F, Fut>(f: F) -> FnProcessor<F>
where
    F: Fn(RequestContext, RemotingCommand) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ProcessResult> + Send + 'static,
{
    FnProcessor { f }
}

impl<F, Fut> Processor for FnProcessor<F>
where
    F: Fn(RequestContext, RemotingCommand) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ProcessResult> + Send + 'static,
{
    fn process<'a>(
        &'a self,
        ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'a, ProcessResult> {
        Box::pin((self.f)(ctx, request))
    }
}

/// A [`Processor`] that answers every request REQUEST_CODE_NOT_SUPPORTED (3), as RocketMQ does
/// for codes it has no processor for. The default handler of a [`RemotingClient`](crate::RemotingClient).
#[derive(Debug, Clone, Copy, Default)]
pub struct NotSupportedProcessor;

impl Processor for NotSupportedProcessor {
    fn process<'a>(
        &'a self,
        _ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'a, ProcessResult> {
        Box::pin(async move { Ok(Some(request_code_not_supported(&request))) })
    }
}

/// RocketMQ's answer to a request code nobody handles: REQUEST_CODE_NOT_SUPPORTED (3) with
/// remark `" request type <code> not supported"` (leading space included, as Java).
pub fn request_code_not_supported(request: &RemotingCommand) -> RemotingCommand {
    RemotingCommand::response_to(
        request,
        REQUEST_CODE_NOT_SUPPORTED,
        Some(format!(" request type {} not supported", request.code)),
    )
}

/// What a [`Processor`] gets with each request.
#[derive(Debug)]
pub struct RequestContext {
    connection: Connection,
    opaque: i32,
    oneway: bool,
}

impl RequestContext {
    /// The connection the request arrived on. Clone it to keep the peer's channel (e.g. a
    /// client's, to send it NOTIFY_CONSUMER_IDS_CHANGED later).
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.connection.peer_addr()
    }

    /// The request's opaque.
    pub fn opaque(&self) -> i32 {
        self.opaque
    }

    /// True when the request is oneway (nothing will ever be sent back for it).
    pub fn is_oneway(&self) -> bool {
        self.oneway
    }

    /// A handle to answer this request later (long polling): keep it, return `Ok(None)` from
    /// [`Processor::process`], and call [`Responder::send`] when the answer is ready.
    pub fn responder(&self) -> Responder {
        Responder {
            connection: self.connection.clone(),
            opaque: self.opaque,
            oneway: self.oneway,
        }
    }
}

/// Sends the (possibly late) response to one request with the request's opaque.
#[derive(Debug)]
pub struct Responder {
    connection: Connection,
    opaque: i32,
    oneway: bool,
}

impl Responder {
    /// The connection the request arrived on.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// The opaque of the request being answered.
    pub fn opaque(&self) -> i32 {
        self.opaque
    }

    /// Sends `response` with the request's opaque and the response flag set. For a oneway
    /// request nothing is sent (and `Ok` is returned).
    ///
    /// # Errors
    /// [`NetError::ConnectionClosed`] when the connection has gone, [`NetError::Protocol`] when
    /// the response cannot be encoded or is over the frame limit.
    pub async fn send(self, mut response: RemotingCommand) -> Result<()> {
        if self.oneway {
            debug!(
                opaque = self.opaque,
                "not sending a response to a oneway request"
            );
            return Ok(());
        }
        response.opaque = self.opaque;
        response.flag |= FLAG_RESPONSE;
        self.connection.send_command(&response).await
    }
}

/// Requests sent on a connection and waiting for their response, by opaque.
#[derive(Default)]
struct PendingTable {
    waiting: HashMap<i32, oneshot::Sender<RemotingCommand>>,
    /// Set once the connection has closed; nothing is registered after that.
    closed: bool,
}

struct Inner {
    id: u64,
    peer: SocketAddr,
    local: SocketAddr,
    codec: RemotingCodec,
    outbound: mpsc::Sender<Bytes>,
    pending: Mutex<PendingTable>,
    next_opaque: AtomicI32,
    closed: CancellationToken,
    /// Permits for incoming requests being processed.
    in_flight: Arc<Semaphore>,
}

/// One remoting connection, usable by both sides: send requests and correlate their responses,
/// send oneway requests and responses, learn the peer, close, and be told of closing.
///
/// Cheap to clone (a handle); all clones are the same connection. Dropping handles does not
/// close the connection: it lives until either side closes it, an error occurs, or its server
/// or client shuts down.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("id", &self.inner.id)
            .field("peer", &self.inner.peer)
            .field("local", &self.inner.local)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl PartialEq for Connection {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for Connection {}

impl Connection {
    /// Starts a connection over an established stream and returns its handle with its driver,
    /// the future that runs it (read loop; the writer is spawned as its own task). Spawn the
    /// driver with `tokio::spawn`; it ends when the connection has closed, after
    /// [`Processor::on_connection_close`].
    ///
    /// `shutdown`, when given, closes the connection when cancelled (a server's or client's
    /// shutdown token).
    ///
    /// # Errors
    /// [`NetError::Io`] when the socket's addresses cannot be read (it is already dead).
    pub fn start(
        stream: TcpStream,
        processor: Arc<dyn Processor>,
        config: &NetConfig,
        shutdown: Option<&CancellationToken>,
    ) -> Result<(Connection, impl Future<Output = ()> + Send + 'static)> {
        let peer = stream.peer_addr()?;
        let local = stream.local_addr()?;
        if let Err(e) = stream.set_nodelay(true) {
            debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        let (read_half, write_half) = stream.into_split();
        let (outbound, queue) = mpsc::channel(config.write_queue_capacity.max(1));
        let closed = shutdown.map_or_else(CancellationToken::new, CancellationToken::child_token);
        let id = NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed);
        let conn = Connection {
            inner: Arc::new(Inner {
                id,
                peer,
                local,
                codec: RemotingCodec::new(config.max_frame_len),
                outbound,
                pending: Mutex::new(PendingTable::default()),
                next_opaque: AtomicI32::new(0),
                closed,
                in_flight: Arc::new(Semaphore::new(
                    config
                        .max_concurrent_requests
                        .clamp(1, Semaphore::MAX_PERMITS),
                )),
            }),
        };
        let span = tracing::info_span!("conn", id, %peer);
        let writer =
            write_loop(write_half, queue, conn.inner.closed.clone()).instrument(span.clone());
        let frames = FramedRead::new(read_half, conn.inner.codec);
        let driver = drive(conn.clone(), frames, processor, writer).instrument(span);
        Ok((conn, driver))
    }

    /// The connection's id: unique in this process, stable for the connection's life.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.inner.peer
    }

    /// This side's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local
    }

    /// True once the connection is closed or closing; nothing more can be sent.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.is_cancelled()
    }

    /// Completes when the connection is closed or closing.
    pub async fn closed(&self) {
        self.inner.closed.cancelled().await;
    }

    /// Closes the connection: frames already queued are flushed (for at most a second), pending
    /// requests fail with [`NetError::ConnectionClosed`], the processor hears of it. Idempotent.
    pub fn close(&self) {
        self.inner.closed.cancel();
    }

    /// Requests sent on this connection still waiting for their response (for tests and
    /// metrics).
    pub fn pending_requests(&self) -> usize {
        self.inner.pending.lock().waiting.len()
    }

    fn closed_error(&self) -> NetError {
        NetError::ConnectionClosed {
            peer: self.inner.peer,
        }
    }

    /// Sends `request` and waits for its response. The opaque is assigned here (from a
    /// per-connection counter; the one in `request` is overwritten) and the response and
    /// oneway flags are cleared. The timeout covers queueing, sending and waiting. When the
    /// call times out or its future is dropped, the pending entry is removed; a late response
    /// is then dropped.
    ///
    /// # Errors
    /// [`NetError::Timeout`], [`NetError::ConnectionClosed`] (also when the connection closes
    /// while waiting), [`NetError::Protocol`] when the request cannot be encoded.
    pub async fn request(
        &self,
        mut request: RemotingCommand,
        timeout: Duration,
    ) -> Result<RemotingCommand> {
        let (tx, rx) = oneshot::channel();
        let opaque = self.register(tx)?;
        let _guard = PendingGuard { conn: self, opaque };
        request.opaque = opaque;
        request.flag &= !(FLAG_RESPONSE | FLAG_ONEWAY);
        let frame = self.inner.codec.encode_frame(&request)?;
        let exchange = async {
            self.inner
                .outbound
                .send(frame)
                .await
                .map_err(|_| self.closed_error())?;
            rx.await.map_err(|_| self.closed_error())
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(NetError::Timeout {
                peer: self.inner.peer,
                opaque,
                timeout,
            }),
        }
    }

    /// Sends `request` as a oneway request (flag bit 1 set, opaque from the connection's
    /// counter): the peer never answers it. Returns once the frame is queued for writing.
    ///
    /// # Errors
    /// [`NetError::ConnectionClosed`], [`NetError::Protocol`] when it cannot be encoded.
    pub async fn oneway(&self, mut request: RemotingCommand) -> Result<()> {
        request.opaque = self.inner.next_opaque.fetch_add(1, Ordering::Relaxed);
        request.flag = (request.flag & !FLAG_RESPONSE) | FLAG_ONEWAY;
        self.send_command(&request).await
    }

    /// Sends a response as given (its opaque must be the request's; the response flag is set
    /// here). Prefer [`Responder::send`], which fills the opaque in and honours oneway.
    ///
    /// # Errors
    /// [`NetError::ConnectionClosed`], [`NetError::Protocol`] when it cannot be encoded.
    pub async fn send_response(&self, mut response: RemotingCommand) -> Result<()> {
        response.flag |= FLAG_RESPONSE;
        self.send_command(&response).await
    }

    /// Encodes and queues one command exactly as given.
    async fn send_command(&self, cmd: &RemotingCommand) -> Result<()> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        let frame = self.inner.codec.encode_frame(cmd)?;
        self.inner
            .outbound
            .send(frame)
            .await
            .map_err(|_| self.closed_error())
    }

    /// Allocates an opaque and registers the waiter under it.
    fn register(&self, tx: oneshot::Sender<RemotingCommand>) -> Result<i32> {
        let mut table = self.inner.pending.lock();
        if table.closed {
            return Err(self.closed_error());
        }
        // Opaques wrap around; skip one still in use (only after 2^32 requests).
        loop {
            let opaque = self.inner.next_opaque.fetch_add(1, Ordering::Relaxed);
            if let Entry::Vacant(v) = table.waiting.entry(opaque) {
                v.insert(tx);
                return Ok(opaque);
            }
        }
    }

    /// Hands a response to whoever waits for its opaque.
    fn complete(&self, response: RemotingCommand) {
        let waiter = self.inner.pending.lock().waiting.remove(&response.opaque);
        match waiter {
            Some(tx) => {
                // The caller may have just given up; then the response is dropped.
                let _ = tx.send(response);
            }
            None => debug!(
                opaque = response.opaque,
                code = response.code,
                "response for no pending request (timed out?), dropped"
            ),
        }
    }

    /// Marks the table closed and drops every waiter (their callers see ConnectionClosed).
    fn fail_pending(&self) {
        let waiting = {
            let mut table = self.inner.pending.lock();
            table.closed = true;
            std::mem::take(&mut table.waiting)
        };
        if !waiting.is_empty() {
            debug!(
                count = waiting.len(),
                "failing pending requests of a closed connection"
            );
        }
        drop(waiting);
    }
}

/// Removes a pending entry when its request completes, times out or is cancelled.
struct PendingGuard<'a> {
    conn: &'a Connection,
    opaque: i32,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.conn.inner.pending.lock().waiting.remove(&self.opaque);
    }
}

/// Runs a connection: calls `on_connection_open`, reads frames until the connection ends, then
/// fails pending requests, waits for the writer, and calls `on_connection_close`.
async fn drive(
    conn: Connection,
    mut frames: FramedRead<tokio::net::tcp::OwnedReadHalf, RemotingCodec>,
    processor: Arc<dyn Processor>,
    writer: impl Future<Output = ()> + Send + 'static,
) {
    let mut writer = tokio::spawn(writer);
    notify(&conn, "on_connection_open", || {
        processor.on_connection_open(&conn)
    });
    let token = conn.inner.closed.clone();
    loop {
        let next = tokio::select! {
            biased;
            _ = token.cancelled() => break,
            next = frames.next() => next,
        };
        match next {
            None => {
                debug!("peer closed the connection");
                break;
            }
            Some(Err(e)) => {
                warn!(peer = %conn.peer_addr(), reason = %e, "closing connection");
                break;
            }
            Some(Ok(cmd)) if cmd.is_response() => conn.complete(cmd),
            Some(Ok(cmd)) => dispatch(&conn, &processor, cmd),
        }
    }
    token.cancel();
    conn.fail_pending();
    match tokio::time::timeout(CLOSE_FLUSH_TIMEOUT, &mut writer).await {
        Ok(Ok(())) => {}
        // Cancelled: the runtime is shutting down; nothing was lost that the caller waited on.
        Ok(Err(e)) if e.is_cancelled() => debug!("connection writer task cancelled"),
        Ok(Err(e)) => error!(error = %e, "connection writer task failed"),
        Err(_) => {
            debug!("gave up flushing a closing connection");
            writer.abort();
        }
    }
    notify(&conn, "on_connection_close", || {
        processor.on_connection_close(&conn)
    });
    debug!("connection closed");
}

/// Runs a connection event callback, containing a panic.
fn notify(conn: &Connection, what: &'static str, f: impl FnOnce()) {
    if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(f)) {
        error!(
            peer = %conn.peer_addr(),
            panic = panic_text(panic.as_ref()),
            "processor {what} panicked"
        );
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_owned()
    }
}

/// Processes one incoming request in a task of its own and sends back what the processor
/// answered (never for a oneway request).
fn dispatch(conn: &Connection, processor: &Arc<dyn Processor>, request: RemotingCommand) {
    let Ok(permit) = Arc::clone(&conn.inner.in_flight).try_acquire_owned() else {
        overloaded(conn, request);
        return;
    };
    let conn = conn.clone();
    let processor = Arc::clone(processor);
    let span = tracing::debug_span!("request", code = request.code, opaque = request.opaque);
    tokio::spawn(
        async move {
            let ctx = RequestContext {
                connection: conn.clone(),
                opaque: request.opaque,
                oneway: request.is_oneway(),
            };
            let responder = ctx.responder();
            let outcome = AssertUnwindSafe(async { processor.process(ctx, request).await })
                .catch_unwind()
                .await;
            drop(permit);
            let response = match outcome {
                Ok(Ok(response)) => response,
                Ok(Err(e)) => {
                    warn!(peer = %conn.peer_addr(), error = %e, "processor failed");
                    Some(RemotingCommand::response(SYSTEM_ERROR, Some(e.to_string())))
                }
                Err(panic) => {
                    let text = panic_text(panic.as_ref());
                    error!(peer = %conn.peer_addr(), panic = %text, "processor panicked");
                    Some(RemotingCommand::response(
                        SYSTEM_ERROR,
                        Some(format!("processor panicked: {text}")),
                    ))
                }
            };
            if let Some(response) = response {
                if let Err(e) = responder.send(response).await {
                    debug!(error = %e, "could not send response");
                }
            }
        }
        .instrument(span),
    );
}

/// Answers a request that arrived while the connection was at its concurrency limit.
fn overloaded(conn: &Connection, request: RemotingCommand) {
    warn!(
        peer = %conn.peer_addr(),
        code = request.code,
        oneway = request.is_oneway(),
        "too many requests in flight on this connection; rejecting"
    );
    if request.is_oneway() {
        return;
    }
    let response = RemotingCommand::response_to(
        &request,
        SYSTEM_BUSY,
        Some("[OVERLOAD]too many requests in flight on this connection, try later".into()),
    );
    let conn = conn.clone();
    tokio::spawn(async move {
        if let Err(e) = conn.send_response(response).await {
            debug!(error = %e, "could not send SYSTEM_BUSY");
        }
    });
}

/// Writes queued frames, batching whatever is queued into one flush, until the connection is
/// closed; then flushes what is still queued (bounded in time) and shuts the write half down.
async fn write_loop(
    write_half: OwnedWriteHalf,
    mut queue: mpsc::Receiver<Bytes>,
    closed: CancellationToken,
) {
    let mut out = BufWriter::with_capacity(64 * 1024, write_half);
    // Frames are never abandoned half-written here (that would corrupt the stream); a writer
    // stuck on a peer that does not read is aborted by the driver after closing.
    let result: std::io::Result<()> = async {
        loop {
            let first = tokio::select! {
                biased;
                _ = closed.cancelled() => break,
                next = queue.recv() => match next {
                    Some(frame) => frame,
                    None => break,
                },
            };
            out.write_all(&first).await?;
            while let Ok(more) = queue.try_recv() {
                out.write_all(&more).await?;
            }
            out.flush().await?;
        }
        while let Ok(more) = queue.try_recv() {
            out.write_all(&more).await?;
        }
        out.flush().await?;
        out.shutdown().await
    }
    .await;
    if let Err(e) = result {
        debug!(error = %e, "write failed; closing connection");
    }
    closed.cancel();
}
