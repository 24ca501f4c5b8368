//! A TCP proxy the test controls, between two processes: every byte goes through it, and the
//! test can cut a direction or both, and heal it again. A direction cut one way is held: the
//! proxy stops reading that way, so the sender's bytes wait (its socket's buffers fill, its
//! writes stop) and arrive once healed, in order, as TCP delivers them after a one-way
//! partition shorter than its retransmission timeout; the other direction flows on. Cutting
//! both ways closes the connections open through it and refuses new ones, as a partition
//! that outlasts TCP's timeouts does. One sender's bytes can be held alone, when the
//! connection it opened says who it is ([`Proxy::hold_up_from`]).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    unreachable_pub,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
struct Cuts {
    /// Client to target bytes dropped.
    up: AtomicBool,
    /// Target to client bytes dropped.
    down: AtomicBool,
    /// Connections through the proxy: bumped on a full cut so that pumps of older ones stop.
    generation: AtomicU64,
    /// Client to target bytes held on connections whose first bytes contain one of these.
    held_senders: Mutex<Vec<Vec<u8>>>,
}

/// How much of a connection's first client bytes is kept to recognise its sender.
const SENDER_BYTES: usize = 64 * 1024;

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// A running proxy.
pub struct Proxy {
    /// Where to connect to go through it.
    pub addr: String,
    cuts: Arc<Cuts>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// A proxy on a free 127.0.0.1 port forwarding to `target`.
    pub fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cuts = Arc::new(Cuts::default());
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let target = target.to_string();
        let (c, o) = (cuts.clone(), open.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(client) = conn else { continue };
                if c.up.load(Ordering::SeqCst) && c.down.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                {
                    let mut open = o.lock().unwrap();
                    open.push(client.try_clone().unwrap());
                    open.push(server.try_clone().unwrap());
                }
                let generation = c.generation.load(Ordering::SeqCst);
                pump(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    c.clone(),
                    true,
                    generation,
                );
                pump(server, client, c.clone(), false, generation);
            }
        });
        Proxy { addr, cuts, open }
    }

    /// Holds the bytes going one way: `up` from the clients to the target, else back.
    pub fn cut_one_way(&self, up: bool) {
        if up {
            self.cuts.up.store(true, Ordering::SeqCst);
        } else {
            self.cuts.down.store(true, Ordering::SeqCst);
        }
    }

    /// Holds the bytes from the clients to the target on connections whose first bytes contain
    /// `marker` (for the replication messages of one broker, its sender field:
    /// `"haFrom":"ID"`); other connections flow on.
    pub fn hold_up_from(&self, marker: &str) {
        self.cuts
            .held_senders
            .lock()
            .unwrap()
            .push(marker.as_bytes().to_vec());
    }

    /// Cuts both ways: open connections are closed and new ones refused.
    pub fn cut(&self) {
        self.cuts.up.store(true, Ordering::SeqCst);
        self.cuts.down.store(true, Ordering::SeqCst);
        self.cuts.generation.fetch_add(1, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Lets everything through again.
    pub fn heal(&self) {
        self.cuts.held_senders.lock().unwrap().clear();
        self.cuts.up.store(false, Ordering::SeqCst);
        self.cuts.down.store(false, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either closes; reads nothing while its direction is cut one
/// way, and drops what it read when both are (the connection is closing then).
fn pump(mut from: TcpStream, mut to: TcpStream, cuts: Arc<Cuts>, up: bool, generation: u64) {
    std::thread::spawn(move || {
        let _ = from.set_read_timeout(Some(Duration::from_millis(200)));
        let mut buf = vec![0u8; 64 * 1024];
        // The connection's first client bytes, which say who the sender is.
        let mut first: Vec<u8> = Vec::new();
        let sender_held = |first: &[u8]| {
            up && cuts
                .held_senders
                .lock()
                .unwrap()
                .iter()
                .any(|m| contains(first, m))
        };
        loop {
            if cuts.generation.load(Ordering::SeqCst) != generation {
                break;
            }
            if sender_held(&first) {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            let (this_way, other_way) = if up {
                (&cuts.up, &cuts.down)
            } else {
                (&cuts.down, &cuts.up)
            };
            if this_way.load(Ordering::SeqCst) && !other_way.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            let n = match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(_) => break,
            };
            if up && first.len() < SENDER_BYTES {
                let take = n.min(SENDER_BYTES - first.len());
                first.extend_from_slice(&buf[..take]);
            }
            // Read as the cut came: held until healed, unless both ways are cut.
            while sender_held(&first) && cuts.generation.load(Ordering::SeqCst) == generation {
                std::thread::sleep(Duration::from_millis(10));
            }
            while this_way.load(Ordering::SeqCst)
                && !other_way.load(Ordering::SeqCst)
                && cuts.generation.load(Ordering::SeqCst) == generation
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            if this_way.load(Ordering::SeqCst) {
                continue;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    });
}
