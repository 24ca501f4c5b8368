//! The clients connected by Telemetry streams: who they are (client id, type, group or
//! topics, FIFO), how to push a command to them (transaction checks), and whether a client is
//! still online (its receipts are renewed only then). Bounded: at most [`MAX_STREAMS`] open
//! streams.

use crate::pb;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Most Telemetry streams open at once (further ones are refused with TOO_MANY_REQUESTS).
pub(crate) const MAX_STREAMS: usize = 10_000;

/// A client counts as online this long after its last call, without a Telemetry stream.
pub(crate) const ONLINE_WITHOUT_STREAM: Duration = Duration::from_secs(15);

/// What the server pushes on a Telemetry stream.
pub(crate) type Push = mpsc::Sender<Result<pb::TelemetryCommand, tonic::Status>>;

#[derive(Debug)]
struct Stream {
    id: u64,
    push: Push,
    client_type: i32,
    /// Producer: the topics it publishes to.
    topics: Vec<String>,
    /// Consumer: its group.
    group: Option<String>,
    /// The client's request timeout, from its settings.
    request_timeout: Option<Duration>,
}

#[derive(Debug, Default)]
struct Client {
    streams: Vec<Stream>,
    last_seen: Option<Instant>,
    /// It said it terminates (NotifyClientTermination): its held receives end at once.
    terminated: bool,
}

/// The connected clients. See the [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    clients: Mutex<HashMap<String, Client>>,
    next_id: std::sync::atomic::AtomicU64,
    open: std::sync::atomic::AtomicUsize,
}

impl Sessions {
    /// A Telemetry stream opened; `None` when too many are open.
    pub(crate) fn open(&self, client_id: &str, push: Push) -> Option<u64> {
        use std::sync::atomic::Ordering;
        if self.open.fetch_add(1, Ordering::AcqRel) >= MAX_STREAMS {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut clients = self.clients.lock();
        let c = clients.entry(client_id.to_string()).or_default();
        c.last_seen = Some(Instant::now());
        c.terminated = false;
        c.streams.push(Stream {
            id,
            push,
            client_type: 0,
            topics: Vec::new(),
            group: None,
            request_timeout: None,
        });
        Some(id)
    }

    /// A stream told its settings.
    pub(crate) fn settings(&self, client_id: &str, stream: u64, s: &pb::Settings) {
        let mut clients = self.clients.lock();
        let Some(st) = clients
            .get_mut(client_id)
            .and_then(|c| c.streams.iter_mut().find(|x| x.id == stream))
        else {
            return;
        };
        st.client_type = s.client_type.unwrap_or(0);
        if let Some(t) = &s.request_timeout {
            st.request_timeout = Some(Duration::from_millis(crate::convert::millis_of(t)));
        }
        match &s.pub_sub {
            Some(pb::settings::PubSub::Publishing(p)) => {
                st.topics = p.topics.iter().map(|t| t.name.clone()).collect();
            }
            Some(pb::settings::PubSub::Subscription(sub)) => {
                st.group = sub.group.as_ref().map(|g| g.name.clone());
            }
            None => {}
        }
    }

    /// The request timeout the client's settings told, if any.
    pub(crate) fn request_timeout(&self, client_id: &str) -> Option<Duration> {
        self.clients
            .lock()
            .get(client_id)
            .and_then(|c| c.streams.iter().find_map(|s| s.request_timeout))
    }

    /// A stream ended.
    pub(crate) fn close(&self, client_id: &str, stream: u64) {
        use std::sync::atomic::Ordering;
        let mut clients = self.clients.lock();
        if let Some(c) = clients.get_mut(client_id) {
            let before = c.streams.len();
            c.streams.retain(|s| s.id != stream);
            if c.streams.len() < before {
                self.open.fetch_sub(1, Ordering::AcqRel);
            }
            c.last_seen = Some(Instant::now());
        }
    }

    /// The client called (heartbeat or any request).
    pub(crate) fn seen(&self, client_id: &str) {
        if client_id.is_empty() {
            return;
        }
        let mut clients = self.clients.lock();
        // Calls without a stream are remembered only for clients that have one, or had one
        // (bounded by the streams).
        if let Some(c) = clients.get_mut(client_id) {
            c.last_seen = Some(Instant::now());
        }
    }

    /// The client said it terminates: offline at once (its receipts are not renewed, its held
    /// receives end).
    pub(crate) fn terminated(&self, client_id: &str) {
        let mut clients = self.clients.lock();
        let c = clients.entry(client_id.to_string()).or_default();
        let closed = c.streams.len();
        c.streams.clear();
        // Remembered a while (held receives see it), then swept.
        c.last_seen = Some(Instant::now());
        c.terminated = true;
        self.open
            .fetch_sub(closed, std::sync::atomic::Ordering::AcqRel);
    }

    /// Whether the client said it terminates.
    pub(crate) fn is_terminated(&self, client_id: &str) -> bool {
        self.clients
            .lock()
            .get(client_id)
            .is_some_and(|c| c.terminated)
    }

    /// Online: a Telemetry stream is open, or the client called within
    /// [`ONLINE_WITHOUT_STREAM`].
    pub(crate) fn online(&self, client_id: &str) -> bool {
        self.clients.lock().get(client_id).is_some_and(|c| {
            !c.terminated
                && (!c.streams.is_empty()
                    || c.last_seen
                        .is_some_and(|t| t.elapsed() < ONLINE_WITHOUT_STREAM))
        })
    }

    /// Forgets clients offline for a while (bounded memory).
    pub(crate) fn sweep(&self) {
        self.clients.lock().retain(|_, c| {
            !c.streams.is_empty()
                || c.last_seen
                    .is_some_and(|t| t.elapsed() < ONLINE_WITHOUT_STREAM * 2)
        });
    }

    /// Where to push a transaction check of `topic`: a producer stream publishing to it, else
    /// any producer stream.
    pub(crate) fn producer_for(&self, topic: &str) -> Option<Push> {
        let clients = self.clients.lock();
        let producers = || {
            clients
                .values()
                .flat_map(|c| c.streams.iter())
                .filter(|s| s.client_type == pb::ClientType::Producer as i32)
                .filter(|s| !s.push.is_closed())
        };
        producers()
            .find(|s| s.topics.iter().any(|t| t == topic))
            .or_else(|| producers().next())
            .map(|s| s.push.clone())
    }

    /// Telemetry streams open now.
    pub(crate) fn streams(&self) -> usize {
        self.open.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_settings_and_liveness() {
        let s = Sessions::default();
        let (tx, _rx) = mpsc::channel(1);
        let id = s.open("c1", tx).unwrap();
        assert!(s.online("c1"));
        assert!(!s.online("c2"));
        s.settings(
            "c1",
            id,
            &pb::Settings {
                client_type: Some(pb::ClientType::Producer as i32),
                pub_sub: Some(pb::settings::PubSub::Publishing(pb::Publishing {
                    topics: vec![crate::convert::named("T")],
                    ..Default::default()
                })),
                ..Default::default()
            },
        );
        assert!(s.producer_for("T").is_some());
        assert!(
            s.producer_for("Other").is_some(),
            "any producer as a fallback"
        );
        assert_eq!(s.streams(), 1);
        s.close("c1", id);
        assert_eq!(s.streams(), 0);
        assert!(s.producer_for("T").is_none());
        // Still online for a while after its stream closed; not after terminating.
        assert!(s.online("c1"));
        s.terminated("c1");
        assert!(!s.online("c1"));
    }
}
