//! Transport limits of a real `shoal namesrv` process, set by its configuration file's `[net]`
//! table (the broker's keys): connections per IP address and the idle timeout are enforced and
//! counted at `/metrics`; a bad file stops the start with an error naming it. Waits are
//! generous liveness bounds only; every check is on evidence (the process saying it listens,
//! an answer, a closed socket, a counter).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use shoal_proto::code::request_code as rc;
use shoal_proto::RemotingCommand;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{closed_within, free_port, http_request, sample, shoal, Proc};

const LIMIT: Duration = Duration::from_secs(20);

struct Namesrv {
    process: Proc,
    addr: String,
    http: String,
    _dir: tempfile::TempDir,
}

/// Starts a name server with `config` on ports chosen now. Ready when the process itself says
/// both listeners are bound ("listening on" for requests, "metrics at" for HTTP, printed in
/// that order). A process that exits before (a port taken by another process between
/// `free_port` and the bind) is started again on other ports.
fn start(config: &str) -> Namesrv {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("namesrv.toml");
    std::fs::write(&file, config).unwrap();
    for _ in 0..3 {
        let addr = format!("127.0.0.1:{}", free_port());
        let http = format!("127.0.0.1:{}", free_port());
        let mut child = Command::new(shoal())
            .args(["namesrv", "--listen", &addr, "--http-listen", &http])
            .arg("--config")
            .arg(&file)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let proc = Proc { child };
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads every line (the pipe must not fill), telling the test when HTTP is up.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("metrics at ") {
                    let _ = tx.send(());
                }
            }
        });
        match rx.recv_timeout(LIMIT) {
            Ok(()) => {
                return Namesrv {
                    process: proc,
                    addr,
                    http,
                    _dir: dir,
                }
            }
            // The process ended (its stdout closed) before both listeners were up.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => continue,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("name server did not start"),
        }
    }
    panic!("name server exited before listening, three times")
}

/// Connects to the name server's request port; the message says whether the process is
/// still running.
fn connect(ns: &mut Namesrv) -> TcpStream {
    match TcpStream::connect(&ns.addr) {
        Ok(sock) => sock,
        Err(e) => {
            let status = ns.process.child.try_wait();
            panic!(
                "connecting to {}: {e} (name server process: {status:?})",
                ns.addr
            )
        }
    }
}

impl Namesrv {
    fn metric(&self, series: &str) -> f64 {
        let (status, text) = http_request(&self.http, "GET", "/metrics", "");
        assert_eq!(status, 200);
        sample(&text, series).unwrap_or_else(|| panic!("no {series} in /metrics:\n{text}"))
    }

    fn wait_metric(&self, series: &str, pred: impl Fn(f64) -> bool) -> f64 {
        let deadline = Instant::now() + LIMIT;
        loop {
            let v = self.metric(series);
            if pred(v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{series} stayed at {v}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Sends GET_ALL_TOPIC_LIST_FROM_NAMESERVER and reads the answer's length word: the
/// connection is served.
fn served(sock: &mut TcpStream) -> bool {
    let frame = RemotingCommand::request(rc::GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        .with_opaque(7)
        .to_frame()
        .unwrap();
    if sock.write_all(&frame).is_err() {
        return false;
    }
    sock.set_read_timeout(Some(LIMIT)).unwrap();
    let mut len = [0u8; 4];
    sock.read_exact(&mut len).is_ok() && i32::from_be_bytes(len) > 0
}

#[test]
fn connections_per_address_are_limited_by_the_config_file() {
    let mut ns = start("[net]\nmax_connections_per_ip = 2\n");
    let mut first = connect(&mut ns);
    let mut second = connect(&mut ns);
    assert!(served(&mut first) && served(&mut second));
    let mut third = connect(&mut ns);
    assert!(
        closed_within(&mut third, LIMIT),
        "a third connection from 127.0.0.1 was served with max_connections_per_ip = 2"
    );
    let refused = ns.wait_metric(
        "shoal_namesrv_net_limit_hits_total{limit=\"net.max_connections_per_ip\",action=\"refused\"}",
        |v| v >= 1.0,
    );
    assert!(refused >= 1.0);
    // A freed slot is served again.
    drop(first);
    let deadline = Instant::now() + LIMIT;
    loop {
        let mut again = connect(&mut ns);
        if served(&mut again) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no connection served after one closed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        served(&mut second),
        "the second connection stopped being served"
    );
}

#[test]
fn idle_connections_are_closed_after_the_configured_timeout() {
    let mut ns = start("[net]\nidle_timeout_secs = 1\n");
    let mut sock = connect(&mut ns);
    assert!(served(&mut sock));
    assert!(
        closed_within(&mut sock, LIMIT),
        "an idle connection stayed open with idle_timeout_secs = 1"
    );
    ns.wait_metric(
        "shoal_namesrv_net_limit_hits_total{limit=\"net.idle_timeout_secs\",action=\"closed\"}",
        |v| v >= 1.0,
    );
}

#[test]
fn a_bad_config_file_stops_the_start_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    for (text, expect) in [
        (
            "[net]\nmax_conections_per_ip = 2\n",
            "max_conections_per_ip",
        ),
        (
            "[net]\nmax_inflight_requests = 0\n",
            "net.max_inflight_requests",
        ),
    ] {
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, text).unwrap();
        let out = Command::new(shoal())
            .args(["namesrv", "--listen", &format!("127.0.0.1:{}", free_port())])
            .arg("--config")
            .arg(&file)
            .output()
            .unwrap();
        assert!(!out.status.success(), "started with {text:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("bad.toml") && err.contains(expect),
            "error for {text:?} does not name the file and {expect}: {err}"
        );
    }
}
