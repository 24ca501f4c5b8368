//! [`Connection`]: one connection carrying remoting commands in both directions, and the
//! settings of connections ([`NetConfig`]).
//!
//! A connection is run by **one task** (its driver, see `driver.rs`, where
//! [`Connection::start`] starts it) that owns the stream:
//! it reads every byte available, decodes every complete frame, completes pending requests by
//! `opaque`, runs the futures of incoming requests itself, and writes every frame ready at that
//! moment with one vectored write. Other tasks (callers of [`Connection::request`], late
//! answers through a [`Responder`](crate::Responder)) append encoded frames to the
//! connection's write queue and wake the driver. Shared state: the write queue and the table of
//! pending requests, each behind one short lock never held across `.await`.

pub use crate::config::NetConfig;
use crate::state::{ConnectionState, Waiter};
use crate::{NetError, Result};
use shoal_proto::code::response_code::SYSTEM_ERROR;
use shoal_proto::command::{FLAG_ONEWAY, FLAG_RESPONSE};
use shoal_proto::RemotingCommand;
use std::collections::hash_map::Entry;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, warn};

/// One remoting connection, usable by both sides: send requests and correlate their responses,
/// send oneway requests and responses, learn the peer, close, and be told of closing.
///
/// Cheap to clone (a handle); all clones are the same connection. Dropping handles does not
/// close the connection: it lives until either side closes it, an error occurs, it stays idle
/// past the idle timeout, or its server or client shuts down.
#[derive(Clone)]
pub struct Connection {
    pub(crate) inner: Arc<ConnectionState>,
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

    /// Incoming requests on this connection not answered yet (for tests and metrics).
    pub fn inflight_requests(&self) -> usize {
        self.inner.inflight.load(Ordering::Acquire)
    }

    /// Bytes queued for writing and not yet taken by the writer (for tests and metrics).
    pub fn queued_write_bytes(&self) -> usize {
        self.inner.out.lock().len()
    }

    pub(crate) fn closed_error(&self) -> NetError {
        NetError::ConnectionClosed {
            peer: self.inner.peer,
        }
    }

    /// Sends `request` and waits for its response. The opaque is assigned here (from a
    /// per-connection counter; the one in `request` is overwritten) and the response and
    /// oneway flags are cleared. The timeout covers queueing, sending and waiting. When the
    /// call times out or its future is dropped, the pending entry is removed; a late response
    /// is then dropped. Nothing is sent until the future is polled; see
    /// [`Connection::start_request`] for a request sent at once.
    ///
    /// # Errors
    /// [`NetError::Timeout`], [`NetError::ConnectionClosed`] (also when the connection closes
    /// while waiting), [`NetError::Protocol`] when the request cannot be encoded.
    pub async fn request(
        &self,
        request: RemotingCommand,
        timeout: Duration,
    ) -> Result<RemotingCommand> {
        self.start_request(request, timeout).await
    }

    /// Sends `request` now (as [`Connection::request`] does when first polled) and returns
    /// the wait for its response: the request is encoded into the write queue before this
    /// returns, unless the queue is over its limit (then the returned future waits for room,
    /// within the timeout). The future is small and owns what it needs, so callers that keep
    /// it across their own awaits stay small too.
    pub fn start_request(&self, request: RemotingCommand, timeout: Duration) -> PendingResponse {
        self.start_waiting(request, timeout, false)
    }

    /// [`Connection::start_request`] for a caller that reads its answer's header with a
    /// reader of its own that takes both forms (e.g.
    /// [`SendResponseRef::of_response`](shoal_proto::header::SendResponseRef::of_response)):
    /// a binary extFields area in the answer may be kept as it came
    /// ([`RawExtFields::BinaryArea`](shoal_proto::RawExtFields::BinaryArea), see
    /// [`RemotingCommand::decode_with`]) instead of decoded into a map.
    pub fn start_request_keeping_answer_area(
        &self,
        request: RemotingCommand,
        timeout: Duration,
    ) -> PendingResponse {
        self.start_waiting(request, timeout, true)
    }

    fn start_waiting(
        &self,
        mut request: RemotingCommand,
        timeout: Duration,
        keep_area: bool,
    ) -> PendingResponse {
        let deadline = Instant::now() + timeout;
        let (tx, rx) = oneshot::channel();
        let opaque = match self.register(Waiter {
            tx,
            deadline,
            timeout,
            keep_area,
        }) {
            Ok(opaque) => opaque,
            Err(e) => return PendingResponse(Pending::Failed(Some(e))),
        };
        request.opaque = opaque;
        request.flag &= !(FLAG_RESPONSE | FLAG_ONEWAY);
        // The deadline is kept by the driver's sweep (it answers the waiter with the
        // timeout), not by a timer per request; only a wait for room in the write queue has
        // a timer of its own.
        let queueing = match self.try_queue(&request) {
            Ok(true) => None,
            Ok(false) => {
                let conn = self.clone();
                Some(Box::pin(async move {
                    conn.queue_command(&request, Some((deadline, opaque, timeout)))
                        .await
                })
                    as futures::future::BoxFuture<'static, Result<()>>)
            }
            Err(e) => {
                self.inner.pending.lock().waiting.remove(&opaque);
                return PendingResponse(Pending::Failed(Some(e)));
            }
        };
        PendingResponse(Pending::Waiting {
            conn: self.clone(),
            opaque,
            rx,
            queueing,
        })
    }

    /// Sends `request` as a oneway request (flag bit 1 set, opaque from the connection's
    /// counter): the peer never answers it. Returns once the frame is queued for writing.
    ///
    /// # Errors
    /// [`NetError::ConnectionClosed`], [`NetError::Protocol`] when it cannot be encoded.
    pub async fn oneway(&self, mut request: RemotingCommand) -> Result<()> {
        request.opaque = self.inner.next_opaque.fetch_add(1, Ordering::Relaxed);
        request.flag = (request.flag & !FLAG_RESPONSE) | FLAG_ONEWAY;
        self.queue_command(&request, None).await
    }

    /// Sends a response as given (its opaque must be the request's; the response flag is set
    /// here). Prefer [`Responder::send`](crate::Responder::send), which fills the opaque in and
    /// honours oneway.
    ///
    /// # Errors
    /// [`NetError::ConnectionClosed`], [`NetError::Protocol`] when it cannot be encoded.
    pub async fn send_response(&self, mut response: RemotingCommand) -> Result<()> {
        response.flag |= FLAG_RESPONSE;
        self.queue_command(&response, None).await
    }

    /// Queues one command when the write queue has room (and wakes the driver): `Ok(false)`
    /// when it is over its limit.
    fn try_queue(&self, cmd: &RemotingCommand) -> Result<bool> {
        let inner = &*self.inner;
        if self.is_closed() {
            return Err(self.closed_error());
        }
        {
            let mut out = inner.out.lock();
            if !(out.is_empty() || out.len() < inner.config.max_pending_write_bytes) {
                return Ok(false);
            }
            out.push_command(cmd, inner.config.max_frame_len)?;
        }
        inner.driver_waker.wake();
        Ok(true)
    }

    /// Queues one command exactly as given, waiting while the write queue is over its limit
    /// (until the request's `deadline`, when there is one).
    async fn queue_command(
        &self,
        cmd: &RemotingCommand,
        deadline: Option<(Instant, i32, Duration)>,
    ) -> Result<()> {
        let inner = &*self.inner;
        loop {
            if self.is_closed() {
                return Err(self.closed_error());
            }
            let room = inner.out_space.notified();
            {
                let mut out = inner.out.lock();
                if out.is_empty() || out.len() < inner.config.max_pending_write_bytes {
                    out.push_command(cmd, inner.config.max_frame_len)?;
                    break;
                }
            }
            let expired = async {
                match deadline {
                    Some((at, _, _)) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = room => {}
                _ = inner.closed.cancelled() => return Err(self.closed_error()),
                () = expired => {
                    let (_, opaque, timeout) = deadline.unwrap_or((Instant::now(), 0, Duration::ZERO));
                    return Err(NetError::Timeout { peer: inner.peer, opaque, timeout });
                }
            }
        }
        inner.driver_waker.wake();
        Ok(())
    }

    /// Queues the answer to request `opaque` at once (answers are bounded by the in-flight
    /// limit). An answer over the frame limit is replaced by SYSTEM_ERROR saying so.
    pub(crate) fn queue_response(&self, opaque: i32, mut response: RemotingCommand) -> Result<()> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        response.opaque = opaque;
        response.flag |= FLAG_RESPONSE;
        self.push_response(&response)?;
        self.inner.driver_waker.wake();
        Ok(())
    }

    /// Appends a response to the write queue (no wake: the driver calls this itself).
    pub(crate) fn push_response(&self, response: &RemotingCommand) -> Result<()> {
        let inner = &*self.inner;
        let mut out = inner.out.lock();
        match out.push_command(response, inner.config.max_frame_len) {
            Ok(()) => Ok(()),
            Err(NetError::Protocol(e)) => {
                crate::stats::bump(&inner.stats.responses_too_large);
                warn!(
                    peer = %inner.peer,
                    opaque = response.opaque,
                    code = response.code,
                    error = %e,
                    "answer cannot be sent; answering SYSTEM_ERROR instead"
                );
                let mut refusal = RemotingCommand::response(
                    SYSTEM_ERROR,
                    Some(format!("the answer cannot be sent: {e}")),
                );
                refusal.opaque = response.opaque;
                refusal.serialize_type = response.serialize_type;
                out.push_command(&refusal, inner.config.max_frame_len)
            }
            Err(e) => Err(e),
        }
    }

    /// Allocates an opaque and registers the waiter under it.
    fn register(&self, waiter: Waiter) -> Result<i32> {
        let mut table = self.inner.pending.lock();
        if table.closed {
            return Err(self.closed_error());
        }
        let deadline = waiter.deadline;
        // Opaques wrap around; skip one still in use (only after 2^32 requests).
        let opaque = loop {
            let opaque = self.inner.next_opaque.fetch_add(1, Ordering::Relaxed);
            if let Entry::Vacant(v) = table.waiting.entry(opaque) {
                v.insert(waiter);
                break opaque;
            }
        };
        // The driver looks at `sweep_at` whenever it runs, and the request wakes it.
        if table.sweep_at.is_none_or(|at| deadline < at) {
            table.sweep_at = Some(deadline);
        }
        Ok(opaque)
    }

    /// Hands a response to whoever waits for its opaque.
    pub(crate) fn complete(&self, response: RemotingCommand) {
        let waiter = self.take_waiter(response.opaque);
        self.complete_to(waiter, response);
    }

    /// Removes the waiter of `opaque` (its answer has come), if any.
    pub(crate) fn take_waiter(&self, opaque: i32) -> Option<Waiter> {
        self.inner.pending.lock().waiting.remove(&opaque)
    }

    /// Hands a response to its waiter, taken from the table before (none: it gave up).
    pub(crate) fn complete_to(&self, waiter: Option<Waiter>, response: RemotingCommand) {
        match waiter {
            Some(w) => {
                // The caller may have just given up; then the response is dropped.
                let _ = w.tx.send(Ok(response));
            }
            None => debug!(
                opaque = response.opaque,
                code = response.code,
                "response for no pending request (timed out?), dropped"
            ),
        }
    }

    /// Marks the table closed and drops every waiter (their callers see ConnectionClosed).
    pub(crate) fn fail_pending(&self) {
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
/// The wait for the response to a request sent with [`Connection::start_request`]. Dropping
/// it before the response arrives forgets the request (a late response is dropped).
#[must_use = "the response is lost unless the future is awaited"]
pub struct PendingResponse(Pending);

enum Pending {
    /// Refused before it was sent (connection closed, request not encodable).
    Failed(Option<NetError>),
    Waiting {
        conn: Connection,
        opaque: i32,
        rx: oneshot::Receiver<Result<RemotingCommand>>,
        /// Waiting for room in the write queue (rare: the queue was over its limit).
        queueing: Option<futures::future::BoxFuture<'static, Result<()>>>,
    },
    Done,
}

impl fmt::Debug for PendingResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.0 {
            Pending::Failed(_) => "failed",
            Pending::Waiting {
                queueing: Some(_), ..
            } => "queueing",
            Pending::Waiting { .. } => "waiting",
            Pending::Done => "done",
        };
        f.debug_tuple("PendingResponse").field(&state).finish()
    }
}

impl Future for PendingResponse {
    type Output = Result<RemotingCommand>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        let this = self.get_mut();
        let outcome = match &mut this.0 {
            Pending::Failed(e) => {
                let e = e.take();
                this.0 = Pending::Done;
                return Poll::Ready(Err(e.unwrap_or(NetError::Shutdown)));
            }
            Pending::Done => panic!("PendingResponse polled after completion"),
            Pending::Waiting {
                conn,
                opaque,
                rx,
                queueing,
            } => 'wait: {
                if let Some(q) = queueing {
                    match q.as_mut().poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(())) => *queueing = None,
                        Poll::Ready(Err(e)) => {
                            conn.inner.pending.lock().waiting.remove(opaque);
                            break 'wait Err(e);
                        }
                    }
                }
                match std::pin::Pin::new(rx).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    // Whoever completed the waiter (the driver: an answer, its deadline, the
                    // connection closing) removed its entry.
                    Poll::Ready(Ok(result)) => result,
                    Poll::Ready(Err(_)) => Err(conn.closed_error()),
                }
            }
        };
        this.0 = Pending::Done;
        Poll::Ready(outcome)
    }
}

impl Drop for PendingResponse {
    fn drop(&mut self) {
        if let Pending::Waiting { conn, opaque, .. } = &self.0 {
            conn.inner.pending.lock().waiting.remove(opaque);
        }
    }
}
