//! Transport limits of a real `shoal broker` process, over TCP (issue 13, F1 and F7): a client
//! that sends but never reads is slowed down (the broker stops reading) instead of growing the
//! broker's memory; idle and half-sent-frame connections are closed and their buffers freed;
//! incomplete frames have a memory budget; connections per IP address are limited. Every check
//! is on evidence (bytes accepted, RSS, the broker's counters, a closed socket); waits are
//! generous liveness bounds only.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use shoal_net::{NetConfig, NotSupportedProcessor, RemotingClient};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::GetMaxOffsetRequestHeader;
use shoal_proto::RemotingCommand;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;

use support::{closed_within, free_port};

const T: Duration = Duration::from_secs(5);

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A broker with the given `[net]` settings (no name server: registration failures are only
/// logged).
struct Broker {
    proc: Proc,
    addr: String,
    /// Where the broker serves `/metrics`.
    http: String,
    client: RemotingClient,
    _dir: tempfile::TempDir,
}

async fn start_broker(net: &str) -> Broker {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let cfg = dir.path().join("broker.toml");
    // No name server listens there: registration failures are only logged.
    let namesrv = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    std::fs::write(
        &cfg,
        format!(
            "listen_addr = \"{addr}\"\nhttp_listen_addr = \"{http}\"\ndata_dir = \"{}\"\nregister_interval_ms = 600000\n[net]\n{net}\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let proc = Proc(
        Command::new(env!("CARGO_BIN_EXE_shoal"))
            .args([
                "broker",
                "--config",
                cfg.to_str().unwrap(),
                "--namesrv",
                &namesrv,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn shoal broker"),
    );
    let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
    let b = Broker {
        proc,
        addr,
        http,
        client,
        _dir: dir,
    };
    for _ in 0..200 {
        if let Ok(info) = b.runtime_info().await {
            if !info.is_empty() {
                return b;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("broker at {} never became ready", b.addr);
}

impl Broker {
    /// GET_BROKER_RUNTIME_INFO's table (the `net*` counters among it).
    async fn runtime_info(&self) -> Result<HashMap<String, String>, String> {
        let r = self
            .client
            .invoke(
                &self.addr,
                RemotingCommand::request(rc::GET_BROKER_RUNTIME_INFO),
                T,
            )
            .await
            .map_err(|e| e.to_string())?;
        if r.code != resp::SUCCESS {
            return Err(format!("code {}", r.code));
        }
        #[derive(serde::Deserialize)]
        struct Table {
            table: HashMap<String, String>,
        }
        let t: Table = serde_json::from_slice(r.body.as_deref().unwrap_or_default())
            .map_err(|e| e.to_string())?;
        Ok(t.table)
    }

    async fn counter(&self, key: &str) -> u64 {
        // The test's own connection may just have been closed as idle: ask again.
        let mut info = self.runtime_info().await;
        for _ in 0..3 {
            if info.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            info = self.runtime_info().await;
        }
        let info = info.expect("runtime info");
        info.get(key)
            .unwrap_or_else(|| panic!("no {key} in the runtime info"))
            .parse()
            .unwrap()
    }

    async fn wait_counter(&self, key: &str, pred: impl Fn(u64) -> bool) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.counter(key).await;
            if pred(v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{key} stayed at {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The value of one series of the broker's `/metrics` (Prometheus text), e.g.
    /// `shoal_broker_net_limit_hits_total{limit="net.max_connections_per_ip",action="refused"}`.
    fn metric(&self, series: &str) -> u64 {
        let mut s = TcpStream::connect(&self.http).expect("metrics listener");
        s.set_read_timeout(Some(T)).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.http
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).expect("metrics answer");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in /metrics:\n{text}"))
            .trim()
            .parse()
            .expect("a number")
    }

    /// Resident memory of the broker process, bytes.
    fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.proc.0.id())).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("VmRSS");
        kb * 1024
    }
}

fn get_max_offset_frame(opaque: i32) -> Vec<u8> {
    let h = GetMaxOffsetRequestHeader {
        topic: "TBW102".into(),
        queue_id: 0,
        ..Default::default()
    };
    RemotingCommand::request_with_header(rc::GET_MAX_OFFSET, &h)
        .with_opaque(opaque)
        .to_frame()
        .unwrap()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_slowed_down_not_buffered() {
    let b = start_broker("max_pending_write_bytes = 1048576\nmax_inflight_requests = 1024").await;
    let rss_before = b.rss();
    let addr = b.addr.clone();
    // Flood: one million GET_MAX_OFFSET requests (F1 sent them in 8 s and took 1.8 GB), no
    // reads. Writes stop making progress once the broker stops reading.
    let flood = std::thread::spawn(move || {
        let mut sock = TcpStream::connect(&addr).unwrap();
        sock.set_write_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut batch = Vec::new();
        for i in 0..256 {
            batch.extend_from_slice(&get_max_offset_frame(i));
        }
        let mut written = 0usize;
        let mut stalled = false;
        for _ in 0..(1_000_000 / 256) {
            match sock.write_all(&batch) {
                Ok(()) => written += batch.len(),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    stalled = true;
                    break;
                }
                Err(e) => panic!("the broker dropped the flooding connection: {e}"),
            }
        }
        (written, stalled, sock)
    });
    let (written, stalled, sock) = tokio::task::spawn_blocking(move || flood.join().unwrap())
        .await
        .unwrap();
    assert!(
        stalled,
        "a million unread requests were all accepted ({written} bytes)"
    );
    // What got in is bounded by the write queue, the in-flight limit and the socket buffers.
    assert!(
        written < 96 << 20,
        "{written} bytes accepted from a client that reads nothing"
    );
    assert!(b.counter("netPausedWriteQueue").await >= 1);
    assert!(
        b.metric(
            "shoal_broker_net_limit_hits_total{limit=\"net.max_pending_write_bytes\",action=\"paused\"}"
        ) >= 1
    );
    // The broker still serves others, and its memory stayed within a fixed budget.
    let grown = b.rss().saturating_sub(rss_before);
    assert!(grown < 128 << 20, "RSS grew by {grown} bytes");
    drop(sock);
    b.wait_counter("netConnectionsOpen", |n| n <= 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_frame_connections_are_closed_and_freed() {
    let b = start_broker("idle_timeout_secs = 2").await;
    let mut idle = TcpStream::connect(&b.addr).unwrap();
    // A frame that declares 15 MiB and sends 1 MiB of it, then stalls.
    let mut half = TcpStream::connect(&b.addr).unwrap();
    half.write_all(&((15u32 << 20) - 4).to_be_bytes()).unwrap();
    half.write_all(&vec![0u8; 1 << 20]).unwrap();
    b.wait_counter("netPartialFrameBytes", |n| n >= 1 << 20)
        .await;
    // The broker holds what arrived, not what was declared.
    assert!(b.counter("netPartialFrameBytes").await < 2 << 20);
    let idle_closed = tokio::task::spawn_blocking(move || {
        (
            closed_within(&mut idle, Duration::from_secs(30)),
            closed_within(&mut half, Duration::from_secs(30)),
        )
    })
    .await
    .unwrap();
    assert_eq!(idle_closed, (true, true), "(idle, half frame) closed");
    assert!(b.counter("netClosedIdle").await >= 2);
    assert!(
        b.metric(
            "shoal_broker_net_limit_hits_total{limit=\"net.idle_timeout_secs\",action=\"closed\"}"
        ) >= 2
    );
    // The half frame's buffer was given back.
    assert_eq!(b.counter("netPartialFrameBytes").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incomplete_frames_share_a_memory_budget() {
    let b = start_broker("max_partial_frame_bytes = 8388608").await;
    let rss_before = b.rss();
    let addr = b.addr.clone();
    // Sixty connections each start a 15 MiB frame and send 2 MiB of it (F7: +920 MB).
    let outcome = tokio::task::spawn_blocking(move || {
        let mut socks = Vec::new();
        let mut refused = 0;
        for _ in 0..60 {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
            let ok = s.write_all(&((15u32 << 20) - 4).to_be_bytes()).is_ok()
                && s.write_all(&vec![1u8; 2 << 20]).is_ok();
            if !ok {
                refused += 1;
            }
            socks.push(s);
        }
        (socks, refused)
    })
    .await
    .unwrap();
    let closed = b
        .wait_counter("netClosedPartialFrameBudget", |n| n >= 50)
        .await;
    assert!(closed <= 60);
    assert!(
        b.metric(
            "shoal_broker_net_limit_hits_total{limit=\"net.max_partial_frame_bytes\",action=\"closed\"}"
        ) >= 50
    );
    // A connection adds what it read to the shared count before it finds the budget
    // exceeded, and gives it back as it closes: the count settles within the budget.
    b.wait_counter("netPartialFrameBytes", |n| n <= 8 << 20)
        .await;
    let grown = b.rss().saturating_sub(rss_before);
    assert!(grown < 96 << 20, "RSS grew by {grown} bytes");
    drop(outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_address_are_limited() {
    let b = start_broker("max_connections_per_ip = 4").await;
    // The test's own client holds one connection already.
    let mut socks: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(&b.addr).unwrap())
        .collect();
    for (i, s) in socks.iter_mut().enumerate() {
        s.write_all(&get_max_offset_frame(i as i32)).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
    }
    let mut fifth = TcpStream::connect(&b.addr).unwrap();
    let refused =
        tokio::task::spawn_blocking(move || closed_within(&mut fifth, Duration::from_secs(10)))
            .await
            .unwrap();
    assert!(refused, "a fifth connection from 127.0.0.1 was served");
    assert!(b.counter("netConnectionsRefusedPerIp").await >= 1);
    assert!(
        b.metric(
            "shoal_broker_net_limit_hits_total{limit=\"net.max_connections_per_ip\",action=\"refused\"}"
        ) >= 1
    );
    drop(socks.pop());
    b.wait_counter("netConnectionsOpen", |n| n <= 3).await;
    let mut again = TcpStream::connect(&b.addr).unwrap();
    again.write_all(&get_max_offset_frame(9)).unwrap();
    again.set_read_timeout(Some(T)).unwrap();
    let mut len = [0u8; 4];
    again.read_exact(&mut len).unwrap();
}
