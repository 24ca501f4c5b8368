//! Requests that arrive on several connections at the same moment end in one batch: a
//! connection that started requests while the processor reports work waiting for the end of
//! the batch ([`Processor::batch_waiting`]) yields to the runtime once, so the other
//! connections woken with it add their requests before the batch ends.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use shoal_net::{Connection, ProcessResult, Processor, RequestContext, Server};
use shoal_proto::code::response_code::SUCCESS;
use shoal_proto::RemotingCommand;
use std::future::Future;
use std::io::{Read, Write};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

const WORK: i32 = 100;
const CONNECTIONS: usize = 4;

/// One request's share of the batch: completed by `end_of_batch`.
#[derive(Default)]
struct Slot {
    done: bool,
    waker: Option<Waker>,
}

/// A processor in the shape of the broker's appends: `process` queues its work and waits;
/// `end_of_batch` does everything queued at once and records how much that was.
#[derive(Default)]
struct Batcher {
    queued: Mutex<Vec<Arc<Mutex<Slot>>>>,
    batches: Mutex<Vec<usize>>,
    opened: AtomicUsize,
}

struct Wait(Arc<Mutex<Slot>>);

impl Future for Wait {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.0.lock();
        if s.done {
            Poll::Ready(())
        } else {
            s.waker = Some(cx.waker().clone());
            Poll::Pending
        }
    }
}

impl Processor for Batcher {
    fn process(
        &self,
        _ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'static, ProcessResult> {
        let slot = Arc::new(Mutex::new(Slot::default()));
        self.queued.lock().push(Arc::clone(&slot));
        Box::pin(async move {
            Wait(slot).await;
            let mut resp = RemotingCommand::response(SUCCESS, None);
            resp.body = request.body.clone();
            Ok(Some(resp))
        })
    }

    fn end_of_batch(&self) {
        let work = std::mem::take(&mut *self.queued.lock());
        if work.is_empty() {
            return;
        }
        self.batches.lock().push(work.len());
        for slot in work {
            let waker = {
                let mut s = slot.lock();
                s.done = true;
                s.waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
        }
    }

    fn batch_waiting(&self) -> bool {
        !self.queued.lock().is_empty()
    }

    fn on_connection_open(&self, _conn: &Connection) {
        self.opened.fetch_add(1, Ordering::SeqCst);
    }
}

fn frame(cmd: &RemotingCommand) -> Vec<u8> {
    let mut b = BytesMut::new();
    cmd.encode(&mut b).unwrap();
    b.to_vec()
}

fn read_answer(s: &mut std::net::TcpStream) -> RemotingCommand {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut rest = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut rest).unwrap();
    RemotingCommand::decode(Bytes::from(rest)).unwrap()
}

#[test]
fn requests_arriving_together_on_several_connections_end_in_one_batch() {
    // The server runs on a single-threaded runtime of its own, which the test can hold still
    // while the clients write: their requests are then all readable when it looks next.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let processor = Arc::new(Batcher::default());
    let server = rt
        .block_on(Server::bind("127.0.0.1:0", processor.clone()))
        .unwrap();
    let addr = server.local_addr();
    let handle = rt.handle().clone();
    // The runtime serves on a thread of its own for the rest of the test process.
    std::thread::spawn(move || rt.block_on(futures::future::pending::<()>()));

    let mut clients: Vec<std::net::TcpStream> = (0..CONNECTIONS)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    for c in &clients {
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    }
    // Every connection's task has started (and is waiting to read) before the hold.
    for _ in 0..2000 {
        if processor.opened.load(Ordering::SeqCst) == CONNECTIONS {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(processor.opened.load(Ordering::SeqCst), CONNECTIONS);

    // A task that blocks the runtime's only thread until released: no connection task runs
    // while the clients write.
    let (held_tx, held_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    handle.spawn(async move {
        held_tx.send(()).unwrap();
        release_rx.recv().unwrap();
    });
    held_rx.recv().unwrap();
    for (i, c) in clients.iter_mut().enumerate() {
        let req = RemotingCommand::request(WORK).with_body(Bytes::from(format!("r{i}")));
        c.write_all(&frame(&req)).unwrap();
    }
    release_tx.send(()).unwrap();

    for (i, c) in clients.iter_mut().enumerate() {
        let answer = read_answer(c);
        assert_eq!(answer.code, SUCCESS);
        assert_eq!(answer.body.as_deref(), Some(format!("r{i}").as_bytes()));
    }
    assert_eq!(
        *processor.batches.lock(),
        vec![CONNECTIONS],
        "the requests of the {CONNECTIONS} connections should end in one batch"
    );

    // A request alone is answered too (the yield does not wait for company).
    let req = RemotingCommand::request(WORK).with_body(Bytes::from_static(b"alone"));
    clients[0].write_all(&frame(&req)).unwrap();
    assert_eq!(
        read_answer(&mut clients[0]).body.as_deref(),
        Some(&b"alone"[..])
    );
    assert_eq!(*processor.batches.lock(), vec![CONNECTIONS, 1]);
    drop(clients);
    drop(server);
}
