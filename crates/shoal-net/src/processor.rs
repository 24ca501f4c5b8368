//! [`Processor`]: what handles the requests arriving on connections, with what it gets for
//! each request ([`RequestContext`]) and how it answers late ([`Responder`]).

use crate::connection::Connection;
use crate::state::Ticket;
use crate::Result;
use futures::future::BoxFuture;
use shoal_proto::code::response_code::REQUEST_CODE_NOT_SUPPORTED;
use shoal_proto::{RemotingCommand, SerializeType};
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

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
/// The futures `process` returns run on the connection's own task, many at once (a slow
/// request does not hold up the others, but a future must not block its thread for long:
/// blocking work belongs on a thread of its own). Requests that arrive together are handed
/// over together: the connection decodes every complete frame it has read, calls `process` for
/// each, polls the futures, then calls [`Processor::end_of_batch`] once, polls again, and writes
/// every answer ready by then with one write. When the processor reports work waiting for the
/// end of the batch ([`Processor::batch_waiting`]), the connection first yields to the runtime
/// once, so that other connections' requests of the same moment join the batch.
///
/// The response's `opaque` and response flag are set by the connection; a response to a oneway
/// request is never sent. A processor that returns an error or panics gets SYSTEM_ERROR (1)
/// sent back with the error text; the connection and server carry on.
///
/// Implement `process` with `Box::pin(async move { ... })`; the future owns what it uses (clone
/// the processor's shared state into it), so the connection keeps it without the processor.
pub trait Processor: Send + Sync + 'static {
    /// Processes one request (never a response). `ctx` holds the connection (to remember the
    /// peer's channel and send it requests later) and a [`Responder`] (to answer later).
    fn process(
        &self,
        ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'static, ProcessResult>;

    /// Called on a connection's task after it has polled the requests that arrived together
    /// (and again whenever it polled requests that made progress). A processor that collects
    /// work from several requests (appends to a log) does it here, once for all of them. Must
    /// not block for long.
    fn end_of_batch(&self) {}

    /// Whether work collected for [`Processor::end_of_batch`] is waiting (appends queued). A
    /// connection that has just started requests and sees this yields to the runtime once
    /// before it ends its batch, so that the requests other connections received at the same
    /// moment join the batch (one append for all of them instead of one per connection).
    fn batch_waiting(&self) -> bool {
        false
    }

    /// Whether requests of `code` that come with a ROCKETMQ binary header keep their
    /// extFields area as it came instead of a map (see
    /// [`RemotingCommand::decode_with`](shoal_proto::command::RemotingCommand::decode_with)):
    /// for codes whose handler reads the header from either form. Asked on the connection's
    /// task once per such request, so it must be cheap.
    fn keeps_binary_area(&self, _code: i32) -> bool {
        false
    }

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
    fn process(
        &self,
        ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'static, ProcessResult> {
        Box::pin((self.f)(ctx, request))
    }
}

/// A [`Processor`] that answers every request REQUEST_CODE_NOT_SUPPORTED (3), as RocketMQ does
/// for codes it has no processor for. The default handler of a [`RemotingClient`](crate::RemotingClient).
#[derive(Debug, Clone, Copy, Default)]
pub struct NotSupportedProcessor;

impl Processor for NotSupportedProcessor {
    fn process(
        &self,
        _ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'static, ProcessResult> {
        Box::pin(std::future::ready(Ok(Some(request_code_not_supported(
            &request,
        )))))
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
pub struct RequestContext {
    pub(crate) connection: Connection,
    pub(crate) opaque: i32,
    pub(crate) oneway: bool,
    /// The request's header encoding; its answer is written in the same one.
    pub(crate) serialize_type: SerializeType,
}

impl fmt::Debug for RequestContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestContext")
            .field("connection", &self.connection)
            .field("opaque", &self.opaque)
            .field("oneway", &self.oneway)
            .finish()
    }
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

    /// The request's header encoding (JSON or ROCKETMQ binary). Its answer is written in the
    /// same encoding: a peer that sent it decodes it, and an answer in the peer's own encoding
    /// costs neither side a JSON round.
    pub fn serialize_type(&self) -> SerializeType {
        self.serialize_type
    }

    /// A handle to answer this request later (long polling): keep it, return `Ok(None)` from
    /// [`Processor::process`], and call [`Responder::send`] when the answer is ready. The
    /// request counts against the connection's in-flight limit until the responder is dropped.
    pub fn responder(&self) -> Responder {
        Responder {
            connection: self.connection.clone(),
            opaque: self.opaque,
            oneway: self.oneway,
            serialize_type: self.serialize_type,
            _ticket: Ticket::new(Arc::clone(&self.connection.inner)),
        }
    }
}

/// Sends the (possibly late) response to one request with the request's opaque.
pub struct Responder {
    connection: Connection,
    opaque: i32,
    oneway: bool,
    serialize_type: SerializeType,
    _ticket: Ticket,
}

impl fmt::Debug for Responder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Responder")
            .field("connection", &self.connection)
            .field("opaque", &self.opaque)
            .field("oneway", &self.oneway)
            .finish()
    }
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

    /// Sends `response` with the request's opaque, its header encoding and the response flag set. For a oneway
    /// request nothing is sent (and `Ok` is returned). The answer is queued at once (answers
    /// are bounded by the in-flight limit, not by the write queue).
    ///
    /// # Errors
    /// [`NetError::ConnectionClosed`](crate::NetError::ConnectionClosed) when the connection
    /// has gone, [`NetError::Protocol`](crate::NetError::Protocol) when the response cannot be
    /// encoded or is over the frame limit.
    pub async fn send(&self, mut response: RemotingCommand) -> Result<()> {
        if self.oneway {
            return Ok(());
        }
        response.serialize_type = self.serialize_type;
        self.connection.queue_response(self.opaque, response)
    }
}
