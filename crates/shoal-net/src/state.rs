//! The state of one connection, shared by its handles ([`Connection`]), its driver (the task
//! that runs it) and the tickets of its incoming requests: the write queue, the table of
//! requests waiting for their response, the in-flight count and the close signal.

use crate::config::NetConfig;
use crate::outbuf::OutBuf;
use crate::stats::NetStats;
use crate::{NetError, Result};
use foldhash::{HashMap, HashMapExt};
use futures::task::AtomicWaker;
use parking_lot::Mutex;
use shoal_proto::RemotingCommand;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[cfg(doc)]
use crate::Connection;

/// Connection ids are unique within the process; this is the allocator (an id counter, not
/// shared state anyone reads).
static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(1);

/// The requests sent on a connection that wait for their response, by opaque.
pub(crate) struct PendingTable {
    pub(crate) waiting: HashMap<i32, Waiter>,
    /// Set once the connection has closed; nothing is registered after that.
    pub(crate) closed: bool,
    /// When the driver next looks for requests past their deadline: never later than the
    /// earliest deadline in `waiting` (it may be earlier, when that request has completed).
    /// One timer per connection instead of one per request.
    pub(crate) sweep_at: Option<Instant>,
}

/// A request waiting for its response.
pub(crate) struct Waiter {
    pub(crate) tx: oneshot::Sender<Result<RemotingCommand>>,
    pub(crate) deadline: Instant,
    pub(crate) timeout: Duration,
    /// The caller reads the answer's binary extFields area as it came (see
    /// [`Connection::start_request_keeping_answer_area`]).
    pub(crate) keep_area: bool,
}

impl PendingTable {
    /// Removes the requests whose deadline is at or before `now`, re-arms `sweep_at` for the
    /// rest, and returns the removed ones with the error to give them.
    pub(crate) fn expire(
        &mut self,
        now: Instant,
        peer: SocketAddr,
    ) -> Vec<(oneshot::Sender<Result<RemotingCommand>>, NetError)> {
        let due: Vec<i32> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.deadline <= now)
            .map(|(&opaque, _)| opaque)
            .collect();
        let expired = due
            .into_iter()
            .filter_map(|opaque| {
                let w = self.waiting.remove(&opaque)?;
                let e = NetError::Timeout {
                    peer,
                    opaque,
                    timeout: w.timeout,
                };
                Some((w.tx, e))
            })
            .collect();
        let next = self.waiting.values().map(|w| w.deadline).min();
        self.sweep_at = next;
        expired
    }
}

/// What a connection's handles ([`Connection`]s), its driver and its request tickets share.
/// Each lock is short and never held across `.await`.
pub(crate) struct ConnectionState {
    pub(crate) id: u64,
    pub(crate) peer: SocketAddr,
    pub(crate) local: SocketAddr,
    pub(crate) config: NetConfig,
    /// Frames encoded by anyone, waiting for the driver to write them.
    pub(crate) out: Mutex<OutBuf>,
    /// Senders waiting for room in `out`.
    pub(crate) out_space: Notify,
    /// The driver's waker: woken when frames are queued or a request completes elsewhere.
    pub(crate) driver_waker: AtomicWaker,
    pub(crate) pending: Mutex<PendingTable>,
    pub(crate) next_opaque: AtomicI32,
    pub(crate) closed: CancellationToken,
    /// Incoming requests not yet answered (see `Ticket`).
    pub(crate) inflight: AtomicUsize,
    /// Set while the driver does not read because of a limit (wakes are then needed).
    pub(crate) read_paused: AtomicBool,
    pub(crate) stats: Arc<NetStats>,
}

impl ConnectionState {
    /// The state of a new connection (given a process-unique id) between `local` and `peer`.
    pub(crate) fn new(
        peer: SocketAddr,
        local: SocketAddr,
        config: NetConfig,
        closed: CancellationToken,
        stats: Arc<NetStats>,
    ) -> Self {
        ConnectionState {
            id: NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed),
            peer,
            local,
            config,
            out: Mutex::new(OutBuf::default()),
            out_space: Notify::new(),
            driver_waker: AtomicWaker::new(),
            pending: Mutex::new(PendingTable {
                waiting: HashMap::new(),
                closed: false,
                sweep_at: None,
            }),
            next_opaque: AtomicI32::new(0),
            closed,
            inflight: AtomicUsize::new(0),
            read_paused: AtomicBool::new(false),
            stats,
        }
    }
}

/// One incoming request counted against the connection's `max_inflight_requests` while its
/// future runs or one of its [`Responder`]s lives (each holds a ticket of its own, so a
/// request is counted once or more while it is unanswered, never zero times).
pub(crate) struct Ticket {
    inner: Arc<ConnectionState>,
}

impl Ticket {
    pub(crate) fn new(inner: Arc<ConnectionState>) -> Ticket {
        inner.inflight.fetch_add(1, Ordering::AcqRel);
        Ticket { inner }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.inner.inflight.fetch_sub(1, Ordering::AcqRel);
        if self.inner.read_paused.load(Ordering::Acquire) {
            self.inner.driver_waker.wake();
        }
    }
}
