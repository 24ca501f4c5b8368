//! The task that runs one connection: reads, decodes, runs request futures, writes.
//!
//! One loop, all on the connection's task: read what the socket has (unless a limit says stop),
//! decode every complete frame (responses complete their waiters; requests become futures run
//! here), poll the request futures, tell the processor the batch is done (so it can do work
//! collected from several requests at once), poll again, and write every frame queued by then
//! with one vectored write. Answers are therefore written by the task that produced them,
//! coalesced, without a hop through a writer task.
//!
//! Limits (see [`NetConfig`](crate::NetConfig)): reading stops while `max_inflight_requests`
//! requests are unanswered or `max_pending_write_bytes` wait to be written; incomplete frames
//! hold only the bytes received, counted against `max_partial_frame_bytes` over all
//! connections; a connection idle for `idle_timeout` is closed.

use crate::codec::check_frame_length;
use crate::config::NetConfig;
use crate::connection::Connection;
use crate::outbuf::Writing;
use crate::processor::{ProcessResult, Processor, RequestContext};
use crate::state::{ConnectionState, Ticket};
use crate::stats::{bump, NetStats};
use crate::Result;
use bytes::{Buf, BytesMut};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use shoal_proto::code::response_code::SYSTEM_ERROR;
use shoal_proto::RemotingCommand;
use std::future::{poll_fn, Future};
use std::io::IoSlice;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tracing::{debug, error, info, warn, Instrument};

impl Connection {
    /// Starts a connection over an established TCP stream and returns its handle with its
    /// driver, the future that runs it. Spawn the driver with `tokio::spawn`; it ends when the
    /// connection has closed, after [`Processor::on_connection_close`].
    ///
    /// `shutdown`, when given, closes the connection when cancelled (a server's or client's
    /// shutdown token).
    ///
    /// # Errors
    /// [`NetError::Io`](crate::NetError::Io) when the socket's addresses cannot be read (it is
    /// already dead).
    pub fn start(
        stream: TcpStream,
        processor: Arc<dyn Processor>,
        config: &NetConfig,
        shutdown: Option<&CancellationToken>,
    ) -> Result<(Connection, impl Future<Output = ()> + Send + 'static)> {
        Self::start_tcp(stream, processor, config, shutdown, Arc::default())
    }

    pub(crate) fn start_tcp(
        stream: TcpStream,
        processor: Arc<dyn Processor>,
        config: &NetConfig,
        shutdown: Option<&CancellationToken>,
        stats: Arc<NetStats>,
    ) -> Result<(Connection, impl Future<Output = ()> + Send + 'static)> {
        let peer = stream.peer_addr()?;
        let local = stream.local_addr()?;
        if let Err(e) = stream.set_nodelay(true) {
            debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        Ok(Self::start_io(
            stream, peer, local, processor, config, shutdown, stats,
        ))
    }

    /// Starts a connection over any byte stream (a TCP stream, or a TLS stream wrapping one)
    /// whose peer and local addresses are given. See [`Connection::start`].
    pub fn start_io<S>(
        io: S,
        peer: SocketAddr,
        local: SocketAddr,
        processor: Arc<dyn Processor>,
        config: &NetConfig,
        shutdown: Option<&CancellationToken>,
        stats: Arc<NetStats>,
    ) -> (Connection, impl Future<Output = ()> + Send + 'static)
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let closed = shutdown.map_or_else(CancellationToken::new, CancellationToken::child_token);
        let mut config = config.clone();
        config.max_inflight_requests = config.max_inflight_requests.max(1);
        let conn = Connection {
            inner: Arc::new(ConnectionState::new(peer, local, config, closed, stats)),
        };
        let id = conn.inner.id;
        // At debug level: entering a span on every poll of the connection costs about 700
        // instructions per request when it is enabled (its fields are for debug logs).
        let span = tracing::debug_span!("conn", id, %peer);
        let driver = Driver::new(conn.clone(), io, processor);
        (conn, run(driver).instrument(span))
    }
}

/// How long a closing connection may spend flushing frames already queued for writing.
const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// Read buffer size; also the least free space before a read.
const READ_CHUNK: usize = 64 * 1024;
const MIN_READ_SPACE: usize = 4 * 1024;

/// Most frames decoded before the requests they carry are run (the rest wait a turn).
const MAX_FRAMES_PER_TURN: usize = 256;

/// One request being run: its handler's future with what its answer needs. Polled by the
/// connection's task inside `catch_unwind` (a panicking handler is answered SYSTEM_ERROR).
/// Kept unboxed in the set of running requests: only the handler's own future is allocated.
struct InFlight {
    opaque: i32,
    oneway: bool,
    /// The request's header encoding: the answer is written in it.
    serialize_type: shoal_proto::SerializeType,
    future: BoxFuture<'static, ProcessResult>,
    _ticket: Ticket,
}

impl Future for InFlight {
    type Output = Done;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Done> {
        let this = self.get_mut();
        let outcome =
            match std::panic::catch_unwind(AssertUnwindSafe(|| this.future.poll_unpin(cx))) {
                Ok(Poll::Pending) => return Poll::Pending,
                Ok(Poll::Ready(result)) => Ok(result),
                Err(panic) => Err(panic),
            };
        Poll::Ready(Done {
            opaque: this.opaque,
            oneway: this.oneway,
            serialize_type: this.serialize_type,
            outcome,
        })
    }
}

/// One request run to its end: what its handler returned (or how it panicked).
struct Done {
    opaque: i32,
    oneway: bool,
    serialize_type: shoal_proto::SerializeType,
    outcome: std::thread::Result<ProcessResult>,
}

/// Why a connection ends.
enum Close {
    Requested,
    PeerClosed,
    Io(std::io::Error),
    BadFrame(String),
    Idle,
    PartialBudget(usize),
}

/// Why reading is paused.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pause {
    Inflight,
    WriteQueue,
}

pub(crate) struct Driver<S> {
    conn: Connection,
    io: S,
    processor: Arc<dyn Processor>,
    rbuf: BytesMut,
    eof: bool,
    requests: FuturesUnordered<InFlight>,
    writing: Writing,
    /// Bytes of this connection counted in the shared partial-frame total.
    partial_held: usize,
    /// When the connection was last found idle after some activity (see `unstamped`).
    last_activity: Instant,
    /// Something happened (a read, a write, a request or answer in flight) since
    /// `last_activity` was read from the clock: it is read once the connection is found idle,
    /// at the end of the turn that ended the activity, not on every read and write.
    unstamped: bool,
    idle: Option<Pin<Box<Sleep>>>,
    /// Fires at the pending table's `sweep_at`: requests sent on this connection that are
    /// past their deadline are answered with a timeout.
    sweep: Option<Pin<Box<Sleep>>>,
    paused: Option<Pause>,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
    /// The waker of the last wake-up: while the task is woken with the same one, the close
    /// future (polled at once with every new waker) holds it already and is only looked at.
    registered: Option<Waker>,
    /// The idle timer was not polled since the waker changed (it may hold an older one).
    idle_stale: bool,
}

impl<S> Driver<S>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    pub(crate) fn new(conn: Connection, io: S, processor: Arc<dyn Processor>) -> Self {
        let cancelled = Box::pin(conn.inner.closed.clone().cancelled_owned());
        Driver {
            conn,
            io,
            processor,
            rbuf: BytesMut::new(),
            eof: false,
            requests: FuturesUnordered::new(),
            writing: Writing::default(),
            partial_held: 0,
            last_activity: Instant::now(),
            unstamped: false,
            idle: None,
            sweep: None,
            paused: None,
            cancelled,
            registered: None,
            idle_stale: true,
        }
    }

    /// Runs the connection until it must close; returns why.
    fn poll_run(&mut self, cx: &mut Context<'_>) -> Poll<Close> {
        self.conn.inner.driver_waker.register(cx.waker());
        // The close future and the idle timer keep the waker they were polled with (until
        // they fire): with the same waker they are only looked at (the token, the timer's
        // state). A new waker is registered with the close future now, with the timer when
        // it is next looked at.
        let same_waker = self
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()));
        if !same_waker {
            self.registered = Some(cx.waker().clone());
            self.idle_stale = true;
        }
        // Later turns of the loop look at the token too, so that nothing more is read or
        // started once a handler has closed the connection.
        let closed = if same_waker {
            self.conn.inner.closed.is_cancelled()
        } else {
            self.cancelled.as_mut().poll(cx).is_ready()
        };
        if closed {
            return Poll::Ready(Close::Requested);
        }
        let mut first = true;
        loop {
            if !std::mem::take(&mut first) && self.conn.inner.closed.is_cancelled() {
                return Poll::Ready(Close::Requested);
            }
            let mut progress = match self.poll_read(cx) {
                Ok(p) => p,
                Err(c) => return Poll::Ready(c),
            };
            let started = match self.decode_and_dispatch() {
                Ok(n) => n,
                Err(c) => return Poll::Ready(c),
            };
            progress |= started > 0;
            if started > 0 && self.yield_for_batch(cx) {
                // Answers already complete go out now; the rest after the other connections'
                // requests of this moment joined the batch.
                if let Err(e) = self.poll_write(cx) {
                    return Poll::Ready(Close::Io(e));
                }
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            progress |= self.poll_requests(cx);
            match self.poll_write(cx) {
                Ok(p) => progress |= p,
                Err(e) => return Poll::Ready(Close::Io(e)),
            }
            if self.eof && self.requests.is_empty() {
                return Poll::Ready(Close::PeerClosed);
            }
            if !progress {
                break;
            }
        }
        match self.poll_idle(cx) {
            Some(c) => Poll::Ready(c),
            None => Poll::Pending,
        }
    }

    /// Whether a limit says not to read now (and counts / logs when one starts to).
    fn read_paused(&mut self) -> bool {
        let inner = &self.conn.inner;
        let cfg = &inner.config;
        let pause = if inner.inflight.load(Ordering::Acquire) >= cfg.max_inflight_requests {
            Some(Pause::Inflight)
        } else if self.writing.len() + inner.out.lock().len() >= cfg.max_pending_write_bytes {
            Some(Pause::WriteQueue)
        } else {
            None
        };
        if pause != self.paused {
            inner.read_paused.store(pause.is_some(), Ordering::Release);
            match pause {
                Some(Pause::Inflight) => {
                    bump(&inner.stats.paused_inflight);
                    debug!(
                        limit = cfg.max_inflight_requests,
                        "requests in flight at the limit; not reading until one completes"
                    );
                }
                Some(Pause::WriteQueue) => {
                    bump(&inner.stats.paused_write_queue);
                    debug!(
                        limit = cfg.max_pending_write_bytes,
                        "answers waiting to be written at the limit (the peer does not read); not reading"
                    );
                }
                None => debug!("reading again"),
            }
            self.paused = pause;
        }
        pause.is_some()
    }

    /// Reads what the socket has into the read buffer. `Ok(true)` when bytes (or the end of
    /// the stream) arrived.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Result<bool, Close> {
        if self.eof || self.read_paused() || self.holds_complete_frame() {
            // Frames already read are decoded first: the buffer only ever holds what is being
            // worked on plus one incomplete frame.
            return Ok(false);
        }
        if self.rbuf.capacity() - self.rbuf.len() < MIN_READ_SPACE {
            // Grows with the bytes that arrive, never to a length a frame only declares.
            self.rbuf.reserve(READ_CHUNK);
        }
        match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.rbuf) {
            Poll::Ready(Ok(0)) => {
                self.eof = true;
                Ok(true)
            }
            Poll::Ready(Ok(_)) => {
                bump(&self.conn.inner.stats.read_calls);
                self.unstamped = true;
                Ok(true)
            }
            Poll::Ready(Err(e)) => Err(Close::Io(e)),
            Poll::Pending => Ok(false),
        }
    }

    /// Whether the read buffer starts with a whole frame (still to be decoded).
    fn holds_complete_frame(&self) -> bool {
        match self.rbuf.get(..4) {
            Some(len) => {
                let declared = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
                // A bad length is a whole "frame" too: decoding reports it.
                usize::try_from(declared).map_or(true, |d| self.rbuf.len() >= 4 + d)
            }
            None => false,
        }
    }

    /// Decodes the complete frames in the read buffer: responses complete their waiters,
    /// requests start. Returns how many frames were taken.
    fn decode_and_dispatch(&mut self) -> Result<usize, Close> {
        let max_frame_len = self.conn.inner.config.max_frame_len;
        let max_inflight = self.conn.inner.config.max_inflight_requests;
        let mut n = 0;
        while n < MAX_FRAMES_PER_TURN {
            if self.conn.inner.inflight.load(Ordering::Acquire) >= max_inflight {
                break;
            }
            let Some(len) = self.rbuf.get(..4) else {
                break;
            };
            let declared = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
            let body_len = check_frame_length(declared, max_frame_len)
                .map_err(|e| Close::BadFrame(e.to_string()))?;
            if self.rbuf.len() < 4 + body_len {
                break;
            }
            self.rbuf.advance(4);
            let frame = self.rbuf.split_to(body_len).freeze();
            let (processor, conn) = (&self.processor, &self.conn);
            // An answer's waiter, when the decoder asked about its area (it is taken from the
            // table then, once, to learn whether its caller keeps areas).
            let mut waiter = None;
            let cmd = RemotingCommand::decode_with(frame, |c| {
                if c.is_response() {
                    let w = conn.take_waiter(c.opaque);
                    let keep = w.as_ref().is_some_and(|w| w.keep_area);
                    waiter = Some(w);
                    keep
                } else {
                    processor.keeps_binary_area(c.code)
                }
            })
            .map_err(|e| Close::BadFrame(e.to_string()))?;
            n += 1;
            if cmd.is_response() {
                match waiter {
                    Some(w) => self.conn.complete_to(w, cmd),
                    None => self.conn.complete(cmd),
                }
            } else {
                self.dispatch(cmd);
            }
        }
        if self.rbuf.is_empty() && self.rbuf.capacity() > 4 * READ_CHUNK {
            // A large frame has passed: give its memory back.
            self.rbuf = BytesMut::new();
        }
        self.account_partial()?;
        Ok(n)
    }

    /// Counts the bytes waiting in the read buffer (an incomplete frame) against the shared
    /// budget; a connection that would exceed it is closed.
    fn account_partial(&mut self) -> Result<(), Close> {
        let now = self.rbuf.len();
        let total = &self.conn.inner.stats.partial_frame_bytes;
        if now > self.partial_held {
            let add = now - self.partial_held;
            let after = total.fetch_add(add, Ordering::AcqRel) + add;
            self.partial_held = now;
            if after > self.conn.inner.config.max_partial_frame_bytes {
                return Err(Close::PartialBudget(after));
            }
        } else if now < self.partial_held {
            total.fetch_sub(self.partial_held - now, Ordering::AcqRel);
            self.partial_held = now;
        }
        Ok(())
    }

    fn release_partial(&mut self) {
        if self.partial_held > 0 {
            self.conn
                .inner
                .stats
                .partial_frame_bytes
                .fetch_sub(self.partial_held, Ordering::AcqRel);
            self.partial_held = 0;
        }
        self.rbuf = BytesMut::new();
    }

    /// Starts one incoming request: its future runs on this task.
    fn dispatch(&mut self, request: RemotingCommand) {
        bump(&self.conn.inner.stats.requests_received);
        if request.serialize_type == shoal_proto::SerializeType::RocketMq {
            bump(&self.conn.inner.stats.requests_binary_header);
        }
        // Counted from now until its future ends (then its responders count it, if any).
        let ticket = Ticket::new(Arc::clone(&self.conn.inner));
        let opaque = request.opaque;
        let oneway = request.is_oneway();
        let serialize_type = request.serialize_type;
        let ctx = RequestContext {
            connection: self.conn.clone(),
            opaque,
            oneway,
            serialize_type,
        };
        let processor = &self.processor;
        // Starting the handler runs its synchronous part: a panic there is answered at once.
        let future =
            match std::panic::catch_unwind(AssertUnwindSafe(|| processor.process(ctx, request))) {
                Ok(future) => future,
                Err(panic) => {
                    let text = panic_text(panic.as_ref());
                    self.answer(
                        opaque,
                        oneway,
                        serialize_type,
                        Some(panicked(self.conn.peer_addr(), &text)),
                    );
                    return;
                }
            };
        self.requests.push(InFlight {
            opaque,
            oneway,
            serialize_type,
            future,
            _ticket: ticket,
        });
    }

    /// Polls the requests just started once; true when some wait for the end of the batch
    /// ([`Processor::batch_waiting`]): the caller then yields to the runtime before ending it,
    /// letting the connections woken at the same moment add their requests. Progress does not
    /// depend on it: a queued put appends on its own next poll, and this task is polled again.
    fn yield_for_batch(&mut self, cx: &mut Context<'_>) -> bool {
        self.drain_requests(cx);
        !self.requests.is_empty() && self.processor.batch_waiting()
    }

    /// Polls the request futures, lets the processor finish the batch, polls again; queues
    /// every answer produced. `true` when a request completed.
    fn poll_requests(&mut self, cx: &mut Context<'_>) -> bool {
        if self.requests.is_empty() {
            return false;
        }
        let mut progress = self.drain_requests(cx);
        self.processor.end_of_batch();
        progress |= self.drain_requests(cx);
        progress
    }

    fn drain_requests(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        while let Poll::Ready(Some(done)) = self.requests.poll_next_unpin(cx) {
            progress = true;
            let response = match done.outcome {
                Ok(Ok(response)) => response,
                Ok(Err(e)) => {
                    warn!(peer = %self.conn.peer_addr(), error = %e, "processor failed");
                    Some(RemotingCommand::response(SYSTEM_ERROR, Some(e.to_string())))
                }
                Err(panic) => Some(panicked(self.conn.peer_addr(), &panic_text(panic.as_ref()))),
            };
            self.answer(done.opaque, done.oneway, done.serialize_type, response);
        }
        progress
    }

    /// Queues the answer to a request (none to a oneway request).
    fn answer(
        &self,
        opaque: i32,
        oneway: bool,
        serialize_type: shoal_proto::SerializeType,
        response: Option<RemotingCommand>,
    ) {
        if oneway {
            return;
        }
        if let Some(mut response) = response {
            response.opaque = opaque;
            response.serialize_type = serialize_type;
            response.flag |= shoal_proto::command::FLAG_RESPONSE;
            if let Err(e) = self.conn.push_response(&response) {
                debug!(error = %e, "could not queue an answer");
            }
        }
    }

    /// Writes what is queued: everything ready goes out in vectored writes. `Ok(true)` when
    /// bytes were written.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> std::io::Result<bool> {
        let inner = &self.conn.inner;
        let mut wrote = false;
        loop {
            if self.writing.is_empty() {
                let mut out = inner.out.lock();
                if out.is_empty() {
                    break;
                }
                let was_full = out.len() >= inner.config.max_pending_write_bytes;
                out.take_into(&mut self.writing);
                drop(out);
                if was_full {
                    inner.out_space.notify_waiters();
                }
            }
            let mut slices = [IoSlice::new(&[]); crate::outbuf::MAX_IOV];
            let n = self.writing.fill(&mut slices);
            match Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..n]) {
                Poll::Ready(Ok(0)) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::WriteZero,
                        "the connection accepts no more bytes",
                    ))
                }
                Poll::Ready(Ok(k)) => {
                    bump(&inner.stats.write_calls);
                    self.writing.advance(k);
                    wrote = true;
                }
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => break,
            }
        }
        if wrote {
            self.unstamped = true;
            if let Poll::Ready(Err(e)) = Pin::new(&mut self.io).poll_flush(cx) {
                return Err(e);
            }
        }
        Ok(wrote)
    }

    /// Closes a connection that stayed idle past the idle timeout (nothing read or written,
    /// nothing in flight either way).
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Option<Close> {
        let (waiting, sweep_at) = {
            let table = self.conn.inner.pending.lock();
            (!table.waiting.is_empty(), table.sweep_at)
        };
        self.poll_sweep(cx, sweep_at);
        let inner = &self.conn.inner;
        let idle = inner.config.idle_timeout?;
        let busy = waiting
            || !self.requests.is_empty()
            || inner.inflight.load(Ordering::Acquire) > 0
            || !self.writing.is_empty();
        if busy {
            // Not idle while busy: the clock is read when that ends.
            self.unstamped = true;
            return None;
        }
        if std::mem::take(&mut self.unstamped) {
            self.last_activity = Instant::now();
        }
        let deadline = self.last_activity + idle;
        // The timer is not moved on every activity: it stays at an earlier deadline, and when
        // it fires before the current one, it is set to that one then.
        let sleep = match &mut self.idle {
            Some(sleep) => {
                let fired = if std::mem::take(&mut self.idle_stale) {
                    sleep.as_mut().poll(cx).is_ready()
                } else {
                    sleep.is_elapsed()
                };
                if !fired {
                    return None;
                }
                if sleep.deadline() >= deadline {
                    return Some(Close::Idle);
                }
                sleep.as_mut().reset(deadline);
                sleep
            }
            None => self
                .idle
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        self.idle_stale = false;
        if sleep.as_mut().poll(cx).is_pending() {
            return None;
        }
        Some(Close::Idle)
    }

    /// Answers requests past their deadline with a timeout when the sweep timer fires.
    fn poll_sweep(&mut self, cx: &mut Context<'_>, mut sweep_at: Option<Instant>) {
        while let Some(at) = sweep_at {
            let sleep = self
                .sweep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
            if sleep.deadline() != at {
                sleep.as_mut().reset(at);
            }
            if sleep.as_mut().poll(cx).is_pending() {
                return;
            }
            let inner = &self.conn.inner;
            let expired = {
                let mut table = inner.pending.lock();
                let expired = table.expire(Instant::now(), inner.peer);
                sweep_at = table.sweep_at;
                expired
            };
            if !expired.is_empty() {
                debug!(count = expired.len(), "requests timed out");
            }
            for (tx, e) in expired {
                // The caller may have given up already.
                let _ = tx.send(Err(e));
            }
        }
    }

    /// Writes what is still queued (used while closing).
    fn poll_flush_all(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match self.poll_write(cx) {
                Err(_) => return Poll::Ready(()),
                Ok(_) if self.writing.is_empty() && self.conn.inner.out.lock().is_empty() => {
                    return Poll::Ready(())
                }
                Ok(true) => continue,
                Ok(false) => return Poll::Pending,
            }
        }
    }
}

/// Runs a connection: calls `on_connection_open`, serves it until it ends, then fails pending
/// requests, flushes what is queued (bounded in time), and calls `on_connection_close`.
pub(crate) async fn run<S>(mut d: Driver<S>)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let conn = d.conn.clone();
    let stats = Arc::clone(&conn.inner.stats);
    bump(&stats.connections_opened);
    let processor = Arc::clone(&d.processor);
    notify(&conn, "on_connection_open", || {
        processor.on_connection_open(&conn)
    });
    let why = poll_fn(|cx| d.poll_run(cx)).await;
    match &why {
        Close::Requested => debug!("connection closed by this side"),
        Close::PeerClosed => debug!("peer closed the connection"),
        Close::Io(e) => debug!(error = %e, "connection failed"),
        Close::BadFrame(reason) => {
            bump(&stats.closed_bad_frame);
            warn!(peer = %conn.peer_addr(), %reason, "closing connection");
        }
        Close::Idle => {
            bump(&stats.closed_idle);
            info!(
                peer = %conn.peer_addr(),
                idle_timeout = ?conn.inner.config.idle_timeout,
                "closing idle connection"
            );
        }
        Close::PartialBudget(total) => {
            bump(&stats.closed_partial_budget);
            warn!(
                peer = %conn.peer_addr(),
                held = d.partial_held,
                total,
                limit = conn.inner.config.max_partial_frame_bytes,
                "incomplete frames over the memory budget; closing connection"
            );
        }
    }
    conn.inner.closed.cancel();
    conn.fail_pending();
    // Requests still running are dropped with the connection; their answers could not be sent.
    d.requests.clear();
    d.release_partial();
    let flushed = tokio::time::timeout(CLOSE_FLUSH_TIMEOUT, async {
        poll_fn(|cx| d.poll_flush_all(cx)).await;
        poll_fn(|cx| Pin::new(&mut d.io).poll_shutdown(cx)).await
    })
    .await;
    if flushed.is_err() {
        debug!("gave up flushing a closing connection");
    }
    inner_wake_senders(&conn);
    bump(&stats.connections_closed);
    notify(&conn, "on_connection_close", || {
        processor.on_connection_close(&conn)
    });
    debug!("connection closed");
}

/// Senders waiting for room in the write queue learn the connection is gone.
fn inner_wake_senders(conn: &Connection) {
    conn.inner.out_space.notify_waiters();
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

/// The answer to a request whose handler panicked (logged).
fn panicked(peer: std::net::SocketAddr, text: &str) -> RemotingCommand {
    error!(%peer, panic = %text, "processor panicked");
    RemotingCommand::response(SYSTEM_ERROR, Some(format!("processor panicked: {text}")))
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
