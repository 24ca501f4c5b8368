//! End-to-end tests of the transport on 127.0.0.1 with ports chosen at run time.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::{SinkExt, StreamExt};
use parking_lot::Mutex;
use shoal_net::{
    request_code_not_supported, Connection, NetConfig, NetError, ProcessResult, Processor,
    RemotingClient, RemotingCodec, RequestContext, Responder, Server,
};
use shoal_proto::code::response_code::{REQUEST_CODE_NOT_SUPPORTED, SUCCESS, SYSTEM_ERROR};
use shoal_proto::command::ExtFields;
use shoal_proto::{ProtoError, RemotingCommand, SerializeType};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::codec::Framed;

/// Request codes the test server understands.
const ECHO: i32 = 100; // answers after `delay` ms with the request body
const NEVER: i32 = 101; // never answers
const HOLD: i32 = 102; // hands its responder to the test (long polling)
const FAIL: i32 = 103; // returns an error
const PANIC: i32 = 104; // panics
const PANIC_EARLY: i32 = 108; // panics in `process` itself, before returning its future
const ONEWAY_SEEN: i32 = 105; // counts oneway requests and returns a response anyway
const NOTIFY: i32 = 40; // NOTIFY_CONSUMER_IDS_CHANGED, server -> client, oneway
const RUNNING_INFO: i32 = 307; // GET_CONSUMER_RUNNING_INFO, server -> client
const ECHO_EXT: i32 = 109; // answers with the request's extFields

const LIMIT: Duration = Duration::from_secs(20);

/// Runs a test body with a hard time bound.
async fn bounded<F: Future<Output = ()>>(f: F) {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("shoal_net=debug")
        .try_init();
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("test exceeded its time bound");
}

#[derive(Default)]
struct TestServer {
    held: Mutex<Option<mpsc::UnboundedSender<(Responder, RemotingCommand)>>>,
    oneways: AtomicUsize,
    opened: Mutex<Vec<Connection>>,
    closed: Mutex<Vec<u64>>,
}

impl Processor for TestServer {
    fn process(
        &self,
        ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'static, ProcessResult> {
        // What the future needs of the server's state, taken now (it must own what it uses).
        let held = (request.code == HOLD)
            .then(|| self.held.lock().clone())
            .flatten();
        if request.code == ONEWAY_SEEN {
            self.oneways.fetch_add(1, Ordering::SeqCst);
        }
        if request.code == PANIC_EARLY {
            panic!("processor bug before its future");
        }
        Box::pin(async move {
            match request.code {
                ECHO => {
                    let delay: u64 = request.ext("delay").unwrap_or("0").parse()?;
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    let mut resp = RemotingCommand::response(SUCCESS, None);
                    resp.body = request.body.clone();
                    Ok(Some(resp))
                }
                NEVER => Ok(None),
                ECHO_EXT => {
                    let mut resp = RemotingCommand::response(SUCCESS, None);
                    resp.ext_fields = request.ext_fields.clone();
                    Ok(Some(resp))
                }
                HOLD => {
                    if let Some(tx) = held {
                        let _ = tx.send((ctx.responder(), request));
                    }
                    Ok(None)
                }
                FAIL => Err("disk on fire".into()),
                PANIC => panic!("processor bug"),
                ONEWAY_SEEN => {
                    assert!(ctx.is_oneway());
                    Ok(Some(RemotingCommand::response(
                        SUCCESS,
                        Some("must not be sent".into()),
                    )))
                }
                _ => Ok(Some(request_code_not_supported(&request))),
            }
        })
    }

    fn on_connection_open(&self, conn: &Connection) {
        self.opened.lock().push(conn.clone());
    }

    fn on_connection_close(&self, conn: &Connection) {
        self.closed.lock().push(conn.id());
    }
}

async fn start_server(config: NetConfig) -> (Server, Arc<TestServer>, String) {
    let processor = Arc::new(TestServer::default());
    let server = Server::bind_with_config("127.0.0.1:0", processor.clone(), config)
        .await
        .unwrap();
    let addr = server.local_addr().to_string();
    (server, processor, addr)
}

fn echo(delay_ms: u64, body: &str) -> RemotingCommand {
    let mut ext = ExtFields::new();
    ext.insert("delay", delay_ms.to_string());
    RemotingCommand::request(ECHO)
        .with_ext_fields(ext)
        .with_body(Bytes::copy_from_slice(body.as_bytes()))
}

async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_answered_out_of_order_reach_their_callers() {
    bounded(async {
        let (server, _p, addr) = start_server(NetConfig::default()).await;
        let client = RemotingClient::default();
        let conn = client.connection(&addr).await.unwrap();
        let n = 200u64;
        let mut tasks = Vec::new();
        for i in 0..n {
            let conn = conn.clone();
            // Earlier requests wait longer, so answers come back in reverse order.
            let delay = (n - i) % 50 * 3;
            tasks.push(tokio::spawn(async move {
                let body = format!("request-{i}");
                let resp = conn
                    .request(echo(delay, &body), Duration::from_secs(10))
                    .await
                    .unwrap();
                assert_eq!(resp.code, SUCCESS);
                assert!(resp.is_response());
                assert_eq!(resp.body.as_deref(), Some(body.as_bytes()));
                resp.opaque
            }));
        }
        let mut opaques = Vec::new();
        for t in tasks {
            opaques.push(t.await.unwrap());
        }
        opaques.sort_unstable();
        opaques.dedup();
        assert_eq!(
            opaques.len(),
            n as usize,
            "every request had its own opaque"
        );
        assert_eq!(conn.pending_requests(), 0);
        // The pool handed out one connection for all of them.
        assert_eq!(client.connection(&addr).await.unwrap(), conn);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_and_cancelled_requests_leave_no_pending_entry() {
    bounded(async {
        let (server, _p, addr) = start_server(NetConfig::default()).await;
        let client = RemotingClient::default();
        let conn = client.connection(&addr).await.unwrap();

        let err = conn
            .request(RemotingCommand::request(NEVER), Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(matches!(err, NetError::Timeout { .. }), "{err}");
        assert_eq!(conn.pending_requests(), 0);

        // Through the pool too.
        let err = client
            .invoke(
                &addr,
                RemotingCommand::request(NEVER),
                Duration::from_millis(30),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, NetError::Timeout { .. }), "{err}");
        assert_eq!(conn.pending_requests(), 0);

        // A caller that gives up (its future dropped) removes its entry as well.
        let pending = tokio::spawn({
            let conn = conn.clone();
            async move {
                conn.request(RemotingCommand::request(NEVER), Duration::from_secs(60))
                    .await
            }
        });
        wait_until("the request is pending", || conn.pending_requests() == 1).await;
        pending.abort();
        let _ = pending.await;
        assert_eq!(conn.pending_requests(), 0);

        // A response arriving after its timeout is dropped; the connection carries on.
        let err = conn
            .request(echo(300, "late"), Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(matches!(err, NetError::Timeout { .. }), "{err}");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let ok = conn
            .request(echo(0, "on time"), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(ok.body.as_deref(), Some(&b"on time"[..]));
        assert_eq!(conn.pending_requests(), 0);
        assert!(!conn.is_closed());
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_deadline_sent_after_a_long_one_expires_first() {
    bounded(async {
        let (server, _p, addr) = start_server(NetConfig::default()).await;
        let client = RemotingClient::default();
        let conn = client.connection(&addr).await.unwrap();
        // The connection's one sweep timer is armed for the long request first.
        let long = tokio::spawn({
            let conn = conn.clone();
            async move {
                conn.request(RemotingCommand::request(NEVER), Duration::from_secs(600))
                    .await
            }
        });
        wait_until("the long request is pending", || conn.pending_requests() == 1).await;
        // The short one re-arms it earlier: it times out (within `bounded`), the long one
        // stays pending.
        let err = conn
            .request(RemotingCommand::request(NEVER), Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(
            matches!(err, NetError::Timeout { timeout, .. } if timeout == Duration::from_millis(50)),
            "{err}"
        );
        assert_eq!(conn.pending_requests(), 1);
        assert!(!long.is_finished());
        // Then several short ones at once: each gets its own timeout answer.
        let shorts: Vec<_> = (0..5)
            .map(|i| {
                let conn = conn.clone();
                tokio::spawn(async move {
                    conn.request(
                        RemotingCommand::request(NEVER),
                        Duration::from_millis(20 + 10 * i),
                    )
                    .await
                })
            })
            .collect();
        for s in shorts {
            let err = s.await.unwrap().unwrap_err();
            assert!(matches!(err, NetError::Timeout { .. }), "{err}");
        }
        assert_eq!(conn.pending_requests(), 1);
        long.abort();
        let _ = long.await;
        assert_eq!(conn.pending_requests(), 0);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_is_closed_idle_only_after_its_last_request_is_answered() {
    bounded(async {
        let config = NetConfig {
            idle_timeout: Some(Duration::from_millis(300)),
            ..NetConfig::default()
        };
        let (server, _p, addr) = start_server(config).await;
        let client = RemotingClient::default();
        let conn = client.connection(&addr).await.unwrap();
        // Answered after twice the idle timeout: the server's side is busy meanwhile, so it
        // keeps the connection.
        let ok = conn
            .request(echo(600, "slow"), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(ok.body.as_deref(), Some(&b"slow"[..]));
        assert!(!conn.is_closed());
        // Then idle: the server closes it (the client sees the end of the stream).
        wait_until("the idle connection is closed", || conn.is_closed()).await;
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_used_more_often_than_its_idle_timeout_stays_open() {
    bounded(async {
        let config = NetConfig {
            idle_timeout: Some(Duration::from_millis(1000)),
            ..NetConfig::default()
        };
        let (server, _p, addr) = start_server(config).await;
        let client = RemotingClient::default();
        let conn = client.connection(&addr).await.unwrap();
        // A request every 100 ms for three and a half idle timeouts: the server's idle timer
        // fires at deadlines that activity has moved since, and is set again each time.
        let started = tokio::time::Instant::now();
        while started.elapsed() < Duration::from_millis(3500) {
            let ok = conn
                .request(echo(0, "ping"), Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(ok.body.as_deref(), Some(&b"ping"[..]));
            assert!(!conn.is_closed(), "closed while in use");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Then idle: the server closes it.
        wait_until("the idle connection is closed", || conn.is_closed()).await;
        server.shutdown().await;
    })
    .await;
}

/// The client side's handler for server-initiated requests.
#[derive(Default)]
struct ClientHandler {
    notified: Mutex<Vec<String>>,
}

impl Processor for ClientHandler {
    fn process(
        &self,
        _ctx: RequestContext,
        request: RemotingCommand,
    ) -> BoxFuture<'static, ProcessResult> {
        if request.code == NOTIFY {
            let group = request.ext("consumerGroup").unwrap_or_default().to_owned();
            self.notified.lock().push(group);
        }
        Box::pin(async move {
            match request.code {
                NOTIFY => Ok(None),
                RUNNING_INFO => Ok(Some(
                    RemotingCommand::response(SUCCESS, None).with_body(&b"{\"running\":true}"[..]),
                )),
                _ => Ok(Some(request_code_not_supported(&request))),
            }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_initiated_requests_reach_the_client_handler() {
    bounded(async {
        let (server, p, addr) = start_server(NetConfig::default()).await;
        let handler = Arc::new(ClientHandler::default());
        let client = RemotingClient::new(NetConfig::default(), handler.clone());
        let client_conn = client.connection(&addr).await.unwrap();
        wait_until("the server saw the connection", || {
            !p.opened.lock().is_empty()
        })
        .await;
        let server_side = p.opened.lock()[0].clone();
        assert_eq!(server_side.peer_addr(), client_conn.local_addr());
        assert_eq!(server_side.local_addr(), client_conn.peer_addr());

        // Oneway, as NOTIFY_CONSUMER_IDS_CHANGED.
        let mut ext = ExtFields::new();
        ext.insert("consumerGroup", "G1");
        server_side
            .oneway(RemotingCommand::request(NOTIFY).with_ext_fields(ext))
            .await
            .unwrap();
        wait_until("the client was notified", || {
            handler.notified.lock().len() == 1
        })
        .await;
        assert_eq!(handler.notified.lock()[0], "G1");

        // Request/response, as GET_CONSUMER_RUNNING_INFO.
        let resp = server_side
            .request(
                RemotingCommand::request(RUNNING_INFO),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert_eq!(resp.code, SUCCESS);
        assert_eq!(resp.body.as_deref(), Some(&b"{\"running\":true}"[..]));

        // Unknown codes are answered as RocketMQ does.
        let resp = server_side
            .request(RemotingCommand::request(9999), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(resp.code, REQUEST_CODE_NOT_SUPPORTED);
        assert_eq!(
            resp.remark.as_deref(),
            Some(" request type 9999 not supported")
        );

        // Requests keep flowing the other way on the same connection meanwhile.
        let r = client
            .invoke(&addr, echo(0, "x"), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(r.body.as_deref(), Some(&b"x"[..]));

        // A client without a handler answers everything REQUEST_CODE_NOT_SUPPORTED.
        let plain = RemotingClient::default();
        let c2 = plain.connection(&addr).await.unwrap();
        wait_until("the server saw the second connection", || {
            p.opened.lock().len() == 2
        })
        .await;
        let server_side2 = p
            .opened
            .lock()
            .iter()
            .find(|c| c.peer_addr() == c2.local_addr())
            .cloned()
            .unwrap();
        let resp = server_side2
            .request(
                RemotingCommand::request(RUNNING_INFO),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert_eq!(resp.code, REQUEST_CODE_NOT_SUPPORTED);
        assert_eq!(
            resp.remark.as_deref(),
            Some(" request type 307 not supported")
        );
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_killed_mid_frame_fails_pending_callers_and_pool_reconnects() {
    bounded(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let fake_server = tokio::spawn(async move {
            // First connection: read one request, send half a response, die.
            let (sock, _) = listener.accept().await.unwrap();
            let mut framed = Framed::new(sock, RemotingCodec::default());
            let req = framed.next().await.unwrap().unwrap();
            let resp = RemotingCommand::response_to(&req, SUCCESS, Some("x".repeat(100)));
            let frame = RemotingCodec::default().encode_frame(&resp).unwrap();
            let mut sock = framed.into_inner();
            sock.write_all(&frame[..frame.len() / 2]).await.unwrap();
            sock.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(sock);
            // Second connection: answer properly.
            let (sock, _) = listener.accept().await.unwrap();
            let mut framed = Framed::new(sock, RemotingCodec::default());
            let req = framed.next().await.unwrap().unwrap();
            framed
                .send(RemotingCommand::response_to(
                    &req,
                    SUCCESS,
                    Some("second".into()),
                ))
                .await
                .unwrap();
            // Keep it open until the client is done.
            let _ = framed.next().await;
        });

        let client = RemotingClient::default();
        let first = client.connection(&addr).await.unwrap();
        let started = tokio::time::Instant::now();
        let err = client
            .invoke(
                &addr,
                RemotingCommand::request(ECHO),
                Duration::from_secs(10),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, NetError::ConnectionClosed { .. }), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "failed fast, not by timeout"
        );
        assert_eq!(first.pending_requests(), 0);
        first.closed().await;
        assert!(first.is_closed());
        // Requests on the dead connection fail at once.
        let err = first
            .request(RemotingCommand::request(ECHO), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(err, NetError::ConnectionClosed { .. }), "{err}");

        let resp = client
            .invoke(
                &addr,
                RemotingCommand::request(ECHO),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        assert_eq!(resp.remark.as_deref(), Some("second"));
        let second = client.connection(&addr).await.unwrap();
        assert_ne!(second.id(), first.id());
        client.shutdown();
        second.closed().await;
        fake_server.await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_or_garbage_frames_close_only_that_connection() {
    bounded(async {
        let config = NetConfig {
            max_frame_len: 1024,
            ..NetConfig::default()
        };
        let (server, p, addr) = start_server(config.clone()).await;
        let good = RemotingClient::default();
        let bad = RemotingClient::default();
        let good_conn = good.connection(&addr).await.unwrap();
        let bad_conn = bad.connection(&addr).await.unwrap();
        wait_until("both connections open", || p.opened.lock().len() == 2).await;

        let err = bad
            .invoke(&addr, echo(0, &"x".repeat(4096)), Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(matches!(err, NetError::ConnectionClosed { .. }), "{err}");
        bad_conn.closed().await;
        wait_until("the server closed the bad connection", || {
            p.closed.lock().len() == 1
        })
        .await;

        // The other connection is untouched.
        let resp = good_conn
            .request(echo(0, "still here"), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(resp.body.as_deref(), Some(&b"still here"[..]));
        assert!(!good_conn.is_closed());

        // The sending side refuses to send what it knows the peer would reject.
        let same = good.connection(&addr).await.unwrap();
        let small = RemotingClient::new(config, Arc::new(shoal_net::NotSupportedProcessor));
        let err2 = small
            .invoke(&addr, echo(0, &"x".repeat(4096)), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(err2, NetError::Protocol(ProtoError::FrameTooLarge { .. })),
            "{err2}"
        );
        assert!(!small.connection(&addr).await.unwrap().is_closed());
        assert_eq!(same, good_conn);

        // Garbage that is not a frame (an unknown serialize type) closes that socket too.
        let mut raw = TcpStream::connect(&addr).await.unwrap();
        raw.write_all(&[0, 0, 0, 6, 7, 0, 0, 2, b'{', b'}'])
            .await
            .unwrap();
        let mut buf = [0u8; 16];
        let n = raw.read(&mut buf).await.unwrap();
        assert_eq!(n, 0, "the server closed the connection");
        let resp = good_conn
            .request(echo(0, "ok"), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(resp.code, SUCCESS);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oneway_requests_get_no_answer() {
    bounded(async {
        let (server, p, addr) = start_server(NetConfig::default()).await;
        let sock = TcpStream::connect(&addr).await.unwrap();
        let mut framed = Framed::new(sock, RemotingCodec::default());
        let mut oneway = RemotingCommand::request(ONEWAY_SEEN).with_opaque(1);
        oneway.set_oneway();
        framed.send(&oneway).await.unwrap();
        // An error in a oneway request is not answered either.
        let mut failing = RemotingCommand::request(FAIL).with_opaque(2);
        failing.set_oneway();
        framed.send(&failing).await.unwrap();
        wait_until("the oneway request was processed", || {
            p.oneways.load(Ordering::SeqCst) == 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        framed.send(&echo(0, "after").with_opaque(3)).await.unwrap();
        let first = framed.next().await.unwrap().unwrap();
        assert_eq!(
            first.opaque, 3,
            "the first frame back answers the normal request"
        );
        assert_eq!(first.body.as_deref(), Some(&b"after"[..]));

        // Through the client API as well.
        let client = RemotingClient::default();
        client
            .invoke_oneway(&addr, RemotingCommand::request(ONEWAY_SEEN))
            .await
            .unwrap();
        wait_until("the second oneway request was processed", || {
            p.oneways.load(Ordering::SeqCst) == 2
        })
        .await;
        let conn = client.connection(&addr).await.unwrap();
        assert_eq!(conn.pending_requests(), 0);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_answers_arrive_with_the_original_opaque() {
    bounded(async {
        let (server, p, addr) = start_server(NetConfig::default()).await;
        let (tx, mut held) = mpsc::unbounded_channel();
        *p.held.lock() = Some(tx);
        let client = RemotingClient::default();
        let conn = client.connection(&addr).await.unwrap();
        let a = tokio::spawn({
            let conn = conn.clone();
            async move {
                conn.request(
                    RemotingCommand::request(HOLD).with_body(&b"a"[..]),
                    Duration::from_secs(10),
                )
                .await
            }
        });
        let (ra, qa) = held.recv().await.unwrap();
        let b = tokio::spawn({
            let conn = conn.clone();
            async move {
                conn.request(
                    RemotingCommand::request(HOLD).with_body(&b"b"[..]),
                    Duration::from_secs(10),
                )
                .await
            }
        });
        let (rb, qb) = held.recv().await.unwrap();
        assert_eq!(ra.opaque(), qa.opaque);
        assert_eq!(rb.opaque(), qb.opaque);
        assert_ne!(qa.opaque, qb.opaque);
        // Held like a long poll, then answered in reverse order.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(conn.pending_requests(), 2);
        let (oa, ob) = (qa.opaque, qb.opaque);
        rb.send(RemotingCommand::response(SUCCESS, None).with_body(qb.body.unwrap()))
            .await
            .unwrap();
        let got_b = b.await.unwrap().unwrap();
        assert_eq!(got_b.opaque, ob);
        assert_eq!(got_b.body.as_deref(), Some(&b"b"[..]));
        ra.send(RemotingCommand::response(SUCCESS, None).with_body(qa.body.unwrap()))
            .await
            .unwrap();
        let got_a = a.await.unwrap().unwrap();
        assert_eq!(got_a.opaque, oa);
        assert_eq!(got_a.body.as_deref(), Some(&b"a"[..]));
        assert_eq!(conn.pending_requests(), 0);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_and_panicking_processors_answer_system_error() {
    bounded(async {
        let (server, _p, addr) = start_server(NetConfig::default()).await;
        let client = RemotingClient::default();
        let t = Duration::from_secs(5);
        let resp = client
            .invoke(&addr, RemotingCommand::request(FAIL), t)
            .await
            .unwrap();
        assert_eq!(resp.code, SYSTEM_ERROR);
        assert_eq!(resp.remark.as_deref(), Some("disk on fire"));
        let resp = client
            .invoke(&addr, RemotingCommand::request(PANIC), t)
            .await
            .unwrap();
        assert_eq!(resp.code, SYSTEM_ERROR);
        assert!(resp.remark.unwrap().contains("processor bug"));
        let resp = client.invoke(&addr, echo(0, "alive"), t).await.unwrap();
        assert_eq!(resp.body.as_deref(), Some(&b"alive"[..]));
        let resp = client
            .invoke(&addr, RemotingCommand::request(PANIC_EARLY), t)
            .await
            .unwrap();
        assert_eq!(resp.code, SYSTEM_ERROR);
        assert!(resp.remark.unwrap().contains("before its future"));
        let resp = client.invoke(&addr, echo(0, "alive"), t).await.unwrap();
        assert_eq!(resp.body.as_deref(), Some(&b"alive"[..]));
        let mut bad_header = echo(0, "x");
        bad_header
            .ext_fields
            .as_mut()
            .unwrap()
            .insert("delay", "soon");
        let resp = client.invoke(&addr, bad_header, t).await.unwrap();
        assert_eq!(resp.code, SYSTEM_ERROR);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_connections_and_reports_them() {
    bounded(async {
        let (server, p, addr) = start_server(NetConfig::default()).await;
        let client = RemotingClient::default();
        let conn = client.connection(&addr).await.unwrap();
        let waiting = tokio::spawn({
            let conn = conn.clone();
            async move {
                conn.request(RemotingCommand::request(NEVER), Duration::from_secs(30))
                    .await
            }
        });
        wait_until("the request is pending", || conn.pending_requests() == 1).await;
        server.shutdown().await;
        assert_eq!(
            p.closed.lock().len(),
            1,
            "close reported before shutdown returned"
        );
        let err = waiting.await.unwrap().unwrap_err();
        assert!(matches!(err, NetError::ConnectionClosed { .. }), "{err}");
        conn.closed().await;
        // Nothing listens any more.
        let err = client
            .invoke(&addr, echo(0, "x"), Duration::from_secs(2))
            .await
            .unwrap_err();
        assert!(matches!(err, NetError::ConnectFailed { .. }), "{err}");

        client.shutdown();
        let err = client.connection(&addr).await.unwrap_err();
        assert!(matches!(err, NetError::Shutdown), "{err}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_connection_from_either_side() {
    bounded(async {
        let (server, p, addr) = start_server(NetConfig::default()).await;
        let client = RemotingClient::default();
        let conn = client.connection(&addr).await.unwrap();
        wait_until("open", || p.opened.lock().len() == 1).await;
        // The server drops the client (as a broker expiring it would).
        let server_side = p.opened.lock()[0].clone();
        server_side.close();
        conn.closed().await;
        wait_until("close reported", || {
            p.closed.lock().as_slice() == [server_side.id()]
        })
        .await;
        // The client reconnects on next use; then closes from its side.
        let again = client.connection(&addr).await.unwrap();
        assert_ne!(again, conn);
        wait_until("reopened", || p.opened.lock().len() == 2).await;
        client.close_connection(&addr);
        again.closed().await;
        wait_until("second close reported", || p.closed.lock().len() == 2).await;
        let mut buf = BytesMut::new();
        assert!(RemotingCodec::default()
            .encode_into(&RemotingCommand::request(1), &mut buf)
            .is_ok());
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_inflight_limit_wait_unread_until_one_completes() {
    bounded(async {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let seen = Arc::new(AtomicUsize::new(0));
        let processor = shoal_net::processor_fn({
            let (gate, seen) = (gate.clone(), seen.clone());
            move |_ctx, request: RemotingCommand| {
                let (gate, seen) = (gate.clone(), seen.clone());
                async move {
                    seen.fetch_add(1, Ordering::SeqCst);
                    if request.code == NEVER {
                        // Held until the test opens the gate.
                        gate.acquire().await?.forget();
                    }
                    Ok(Some(RemotingCommand::response(SUCCESS, None)))
                }
            }
        });
        let config = NetConfig {
            max_inflight_requests: 2,
            ..NetConfig::default()
        };
        let server = Server::bind_with_config("127.0.0.1:0", Arc::new(processor), config)
            .await
            .unwrap();
        let addr = server.local_addr().to_string();
        let client = RemotingClient::default();
        let conn = client.connection(&addr).await.unwrap();
        let held: Vec<_> = (0..2)
            .map(|_| {
                let conn = conn.clone();
                tokio::spawn(async move {
                    conn.request(RemotingCommand::request(NEVER), Duration::from_secs(10))
                        .await
                })
            })
            .collect();
        wait_until("both requests are being processed", || {
            seen.load(Ordering::SeqCst) == 2
        })
        .await;
        // The third request is sent but not read: the server stopped reading (backpressure)
        // instead of queueing or refusing it.
        let third = tokio::spawn({
            let conn = conn.clone();
            async move {
                conn.request(RemotingCommand::request(ECHO), Duration::from_secs(10))
                    .await
            }
        });
        wait_until("the server paused reading", || {
            server.stats().snapshot().paused_inflight >= 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            seen.load(Ordering::SeqCst),
            2,
            "nothing read past the limit"
        );
        gate.add_permits(2);
        for h in held {
            assert_eq!(h.await.unwrap().unwrap().code, SUCCESS);
        }
        assert_eq!(third.await.unwrap().unwrap().code, SUCCESS);
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_client_handle_closes_its_connections() {
    bounded(async {
        let (server, p, addr) = start_server(NetConfig::default()).await;
        let client = RemotingClient::default();
        let clone = client.clone();
        let conn = client.connection(&addr).await.unwrap();
        drop(client);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!conn.is_closed(), "a clone still holds the pool");
        drop(clone);
        conn.closed().await;
        wait_until("the server saw the close", || p.closed.lock().len() == 1).await;
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_hang_on_a_peer_that_stops_reading() {
    bounded(async {
        let (server, p, addr) = start_server(NetConfig::default()).await;
        let sock = TcpStream::connect(&addr).await.unwrap();
        let mut framed = Framed::new(sock, RemotingCodec::default());
        let body = "y".repeat(256 * 1024);
        // Never read the answers: the server's writes fill the socket buffers, then the server
        // stops reading too (backpressure), so this sender blocks as well.
        let sender = tokio::spawn(async move {
            for i in 0..64 {
                if framed.send(&echo(0, &body).with_opaque(i)).await.is_err() {
                    break;
                }
            }
            framed
        });
        wait_until("the server stopped reading", || {
            server.stats().snapshot().paused_write_queue >= 1
        })
        .await;
        let started = tokio::time::Instant::now();
        server.shutdown().await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "shutdown took {:?}",
            started.elapsed()
        );
        assert_eq!(p.closed.lock().len(), 1);
        sender.abort();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_come_in_the_request_s_header_encoding() {
    bounded(async {
        let (server, p, addr) = start_server(NetConfig::default()).await;
        let (tx, mut held) = mpsc::unbounded_channel();
        *p.held.lock() = Some(tx);
        let client = RemotingClient::default();
        let conn = client.connection(&addr).await.unwrap();
        for st in [SerializeType::Json, SerializeType::RocketMq] {
            // Answered at once: the header carried ext fields in the request's encoding.
            let mut req = echo(0, "x");
            req.serialize_type = st;
            let r = conn.request(req, Duration::from_secs(10)).await.unwrap();
            assert_eq!(r.serialize_type, st);
            assert_eq!(r.code, SUCCESS);
            assert_eq!(r.body.as_deref(), Some(&b"x"[..]));
            // Answered later through a Responder.
            let mut hold = RemotingCommand::request(HOLD);
            hold.serialize_type = st;
            let pending = tokio::spawn({
                let conn = conn.clone();
                async move { conn.request(hold, Duration::from_secs(10)).await }
            });
            let (responder, q) = held.recv().await.unwrap();
            assert_eq!(q.serialize_type, st);
            responder
                .send(RemotingCommand::response(SUCCESS, Some("later".into())))
                .await
                .unwrap();
            let late = pending.await.unwrap().unwrap();
            assert_eq!(late.serialize_type, st);
            assert_eq!(late.remark.as_deref(), Some("later"));
        }
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_keeps_answer_areas_gets_the_binary_area_as_it_came() {
    use shoal_proto::RawExtFields;
    bounded(async {
        let (server, _p, addr) = start_server(NetConfig::default()).await;
        let client = RemotingClient::default();
        let conn = client.connection(&addr).await.unwrap();
        let request = |st| {
            let mut ext = ExtFields::new();
            ext.insert("msgId", "7F00000100002A9F0000000000000000");
            ext.insert("queueId", "3");
            ext.insert("queueOffset", "41");
            let mut req = RemotingCommand::request(ECHO_EXT).with_ext_fields(ext);
            req.serialize_type = st;
            req
        };
        let entries = |r: &RemotingCommand| -> Vec<(String, String)> {
            match (&r.ext_fields, &r.ext_fields_raw) {
                (Some(m), None) => m
                    .iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
                (None, Some(raw @ RawExtFields::BinaryArea(_))) => raw
                    .binary_entries()
                    .map(|(k, v)| {
                        (
                            String::from_utf8(k.to_vec()).unwrap(),
                            String::from_utf8(v.to_vec()).unwrap(),
                        )
                    })
                    .collect(),
                other => panic!("unexpected header form {other:?}"),
            }
        };
        let timeout = Duration::from_secs(10);
        // Binary answer, kept: a slice of the frame, no map; the same entries as the map.
        let kept = conn
            .start_request_keeping_answer_area(request(SerializeType::RocketMq), timeout)
            .await
            .unwrap();
        assert!(kept.ext_fields.is_none());
        assert!(matches!(
            kept.ext_fields_raw,
            Some(RawExtFields::BinaryArea(_))
        ));
        let map = conn
            .start_request(request(SerializeType::RocketMq), timeout)
            .await
            .unwrap();
        assert!(map.ext_fields.is_some() && map.ext_fields_raw.is_none());
        assert_eq!(entries(&kept), entries(&map));
        assert_eq!(entries(&kept).len(), 3);
        // Through the pool too.
        let pooled = client
            .invoke_keeping_answer_area(&addr, request(SerializeType::RocketMq), timeout)
            .await
            .unwrap();
        assert!(matches!(
            pooled.ext_fields_raw,
            Some(RawExtFields::BinaryArea(_))
        ));
        // A JSON answer is always a map.
        let json = conn
            .start_request_keeping_answer_area(request(SerializeType::Json), timeout)
            .await
            .unwrap();
        assert_eq!(entries(&json), entries(&map));
        assert!(json.ext_fields.is_some());
        // Nothing is left waiting.
        assert_eq!(conn.pending_requests(), 0);
        server.shutdown().await;
    })
    .await;
}
