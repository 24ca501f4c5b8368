//! Malformed input over TCP against a real broker, as a permanent suite: every category of
//! issue 13's black-box run (bad frame lengths, header lengths, serialize types, headers that
//! are not JSON or not UTF-8, binary headers with lying lengths, garbage, partial frames,
//! requests with missing or mistyped fields, bad bodies) plus a few thousand damaged frames
//! from the fuzz seeds. Each frame-level error closes that connection only; each bad request
//! is answered with an error on a connection that stays usable; afterwards the broker serves
//! new connections and every message acknowledged before is still there.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use bytes::{BufMut, Bytes, BytesMut};
use common::*;
use shoal_fuzz::mutate::{mutated, Mutation};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::command::split_frame;
use shoal_proto::{RemotingCommand, SerializeType};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOPIC: &str = "MalformedT";

/// What became of a connection after bytes were written to it.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// The broker closed it (a frame-level error).
    Closed,
    /// Answers arrived (decoded), and the connection was still open when we stopped reading.
    Answered(Vec<RemotingCommand>),
}

/// How [`exchange`] ends.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// Write a probe request (opaque 999_999) after the bytes; read until its answer arrives
    /// or the broker closes (neither within 5 s fails the test).
    Probe,
    /// Read until the broker closes or this much time passes.
    Wait(Duration),
    /// Close our writing side after the bytes; read until the broker closes (which it must
    /// do within 5 s).
    HalfClose,
}

/// Writes `bytes` to a new connection and reads answers as `mode` says.
async fn exchange(addr: &str, bytes: &[u8], mode: Mode) -> Outcome {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut out = bytes.to_vec();
    if let Mode::Probe = mode {
        out.extend_from_slice(
            &RemotingCommand::request(rc::GET_BROKER_RUNTIME_INFO)
                .with_opaque(999_999)
                .to_frame()
                .unwrap(),
        );
    }
    // The broker may close before we finish writing: that is an outcome, not a test error.
    if s.write_all(&out).await.is_err() {
        return Outcome::Closed;
    }
    if let Mode::HalfClose = mode {
        if s.shutdown().await.is_err() {
            return Outcome::Closed;
        }
    }
    let wait = match mode {
        Mode::Wait(d) => d,
        _ => Duration::from_secs(5),
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut buf = BytesMut::new();
    let mut answers = Vec::new();
    loop {
        while let Ok(Some(frame)) = split_frame(&mut buf, 64 << 20) {
            let cmd = RemotingCommand::decode(frame).expect("the broker's answers decode");
            let probe_answer = cmd.opaque == 999_999;
            answers.push(cmd);
            if probe_answer {
                return Outcome::Answered(answers);
            }
        }
        let mut chunk = [0u8; 8192];
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                return match mode {
                    Mode::HalfClose => Outcome::Answered(answers),
                    _ => Outcome::Closed,
                }
            }
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => match mode {
                Mode::Wait(_) => return Outcome::Answered(answers),
                _ => panic!("the broker neither answered nor closed within 5 s ({mode:?})"),
            },
        }
    }
}

fn raw_frame(serialize_type: u8, header: &[u8], body: &[u8]) -> Vec<u8> {
    let mut f = BytesMut::new();
    f.put_i32((4 + header.len() + body.len()) as i32);
    f.put_u32((u32::from(serialize_type) << 24) | header.len() as u32);
    f.put_slice(header);
    f.put_slice(body);
    f.to_vec()
}

fn json_frame(header: &str, body: &[u8]) -> Vec<u8> {
    raw_frame(0, header.as_bytes(), body)
}

async fn assert_closed(addr: &str, what: &str, bytes: &[u8]) {
    let outcome = exchange(addr, bytes, Mode::Probe).await;
    assert_eq!(
        outcome,
        Outcome::Closed,
        "{what}: the connection stayed open"
    );
}

/// Sends `req` and the probe on one connection: `req` must get an error answer and the probe
/// must be answered after it (the connection stays usable).
async fn assert_refused(addr: &str, what: &str, req: RemotingCommand) -> i32 {
    let opaque = 4242;
    let bytes = req.with_opaque(opaque).to_frame().unwrap();
    match exchange(addr, &bytes, Mode::Probe).await {
        Outcome::Answered(answers) => {
            let answer = answers
                .iter()
                .find(|a| a.opaque == opaque)
                .unwrap_or_else(|| panic!("{what}: no answer, only {answers:?}"));
            assert_ne!(answer.code, resp::SUCCESS, "{what}: accepted");
            assert!(answer.is_response(), "{what}: the answer is not a response");
            answer.code
        }
        Outcome::Closed => panic!("{what}: the connection was closed instead of an error answer"),
    }
}

/// The broker still serves a new connection and still holds every message sent before.
async fn assert_healthy(c: &Cluster, expected: usize) {
    let client = RawClient::new(&c.broker_addr);
    client
        .join("malformed-c2", "malformed-cg", &[(TOPIC, "*")])
        .await;
    ok(&client.call(send_req(TOPIC, 1, b"after", "")).await);
    let r = client
        .call(pull_req("malformed-cg", TOPIC, 0, 0, 0, 0))
        .await;
    ok(&r);
    assert_eq!(decode(&r).len(), expected, "messages lost");
    client.shutdown();
}

#[tokio::test]
async fn malformed_frames_close_only_their_connection() {
    let c = Cluster::start().await;
    let client = RawClient::new(&c.broker_addr);
    ok(&client.call(create_topic_req(TOPIC, 2)).await);
    for i in 0..10 {
        ok(&client
            .call(send_req(TOPIC, 0, format!("m{i}").as_bytes(), ""))
            .await);
    }
    let addr = c.broker_addr.clone();

    assert_closed(&addr, "negative frame length", &(-5i32).to_be_bytes()).await;
    assert_closed(&addr, "frame length below 4", &[0, 0, 0, 2, 0, 0]).await;
    assert_closed(
        &addr,
        "frame length beyond 16 MiB",
        &[&(17i32 << 20).to_be_bytes()[..], &[0u8; 64]].concat(),
    )
    .await;
    let mut beyond = BytesMut::new();
    beyond.put_i32(12);
    beyond.put_u32(500);
    beyond.put_slice(b"{\"code\"");
    beyond.put_u8(b'}');
    assert_closed(&addr, "header length beyond the frame", &beyond).await;
    assert_closed(&addr, "unknown serialize type", &raw_frame(7, b"{}", b"")).await;
    assert_closed(&addr, "header is not JSON", &json_frame("{\"code\":", b"")).await;
    assert_closed(
        &addr,
        "header JSON of the wrong shape",
        &json_frame("[1,2,3]", b""),
    )
    .await;
    assert_closed(
        &addr,
        "code of the wrong type",
        &json_frame(r#"{"code":{"a":1},"opaque":1}"#, b""),
    )
    .await;
    assert_closed(
        &addr,
        "header not UTF-8",
        &raw_frame(0, b"{\"code\":11,\"remark\":\"\xff\xfe\"}", b""),
    )
    .await;
    // ROCKETMQ binary header whose remark length runs past the header.
    let mut bin = BytesMut::new();
    bin.put_i16(34);
    bin.put_u8(0);
    bin.put_i16(401);
    bin.put_i32(1);
    bin.put_i32(0);
    bin.put_i32(1_000_000);
    assert_closed(
        &addr,
        "binary header with a lying remark length",
        &raw_frame(1, &bin, b""),
    )
    .await;
    let mut bin = BytesMut::new();
    bin.put_i16(34);
    bin.put_u8(0);
    bin.put_i16(401);
    bin.put_i32(1);
    bin.put_i32(0);
    bin.put_i32(0);
    bin.put_i32(-7);
    assert_closed(
        &addr,
        "binary header with a negative extFields length",
        &raw_frame(1, &bin, b""),
    )
    .await;
    // A frame of the right length full of garbage.
    let mut garbage: Vec<u8> = (0..65_536u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    garbage[..4].copy_from_slice(&65_532i32.to_be_bytes());
    assert_closed(&addr, "64 KiB of garbage", &garbage).await;

    // Half a frame, then the client goes away: nothing to answer, nothing kept.
    let send = send_req(TOPIC, 0, b"never completed", "")
        .to_frame()
        .unwrap();
    assert_eq!(
        exchange(
            &addr,
            &send[..send.len() / 2],
            Mode::Wait(Duration::from_secs(1))
        )
        .await,
        Outcome::Answered(Vec::new()),
        "half a frame was answered"
    );

    assert_healthy(&c, 10).await;
    client.shutdown();
    c.stop().await;
}

#[tokio::test]
async fn malformed_requests_are_answered_with_errors() {
    let c = Cluster::start().await;
    let client = RawClient::new(&c.broker_addr);
    ok(&client.call(create_topic_req(TOPIC, 2)).await);
    for i in 0..5 {
        ok(&client
            .call(send_req(TOPIC, 0, format!("m{i}").as_bytes(), ""))
            .await);
    }
    let addr = c.broker_addr.clone();

    let code = assert_refused(
        &addr,
        "unknown request code",
        RemotingCommand::request(31_337),
    )
    .await;
    assert_eq!(code, resp::REQUEST_CODE_NOT_SUPPORTED);
    assert_refused(
        &addr,
        "send without a header",
        RemotingCommand::request(rc::SEND_MESSAGE_V2).with_body(Bytes::from_static(b"x")),
    )
    .await;
    let mut bad_queue = send_req(TOPIC, 0, b"x", "");
    if let Some(e) = bad_queue.ext_fields.as_mut() {
        e.insert("e", "not-a-number");
    }
    assert_refused(&addr, "send with a non-numeric queue id", bad_queue).await;
    assert_refused(
        &addr,
        "send to queue 1000 of a 2-queue topic",
        send_req(TOPIC, 1000, b"x", ""),
    )
    .await;
    assert_refused(
        &addr,
        "send to an illegal topic name",
        send_req("bad/topic name", 0, b"x", ""),
    )
    .await;
    assert_refused(
        &addr,
        "send to a 300-character topic",
        send_req(&"t".repeat(300), 0, b"x", ""),
    )
    .await;
    let mut batch = send_req(TOPIC, 0, b"", "");
    batch.code = rc::SEND_BATCH_MESSAGE;
    batch.body = Some(Bytes::from_static(b"\x00\x00\x00\x40garbage batch body"));
    assert_refused(&addr, "batch with a garbage body", batch).await;
    assert_refused(
        &addr,
        "heartbeat whose body is not JSON",
        RemotingCommand::request(rc::HEART_BEAT).with_body(Bytes::from_static(b"{\"clientID\":")),
    )
    .await;
    assert_refused(
        &addr,
        "heartbeat without a body",
        RemotingCommand::request(rc::HEART_BEAT),
    )
    .await;
    let mut bad_offset = pull_req("malformed-cg", TOPIC, 0, 0, 0, 0);
    if let Some(e) = bad_offset.ext_fields.as_mut() {
        e.insert("queueOffset", "12abc");
    }
    assert_refused(&addr, "pull with a non-numeric offset", bad_offset).await;
    assert_refused(
        &addr,
        "pull of queue -2",
        pull_req("malformed-cg", TOPIC, -2, 0, 0, 0),
    )
    .await;
    let mut binary = pull_req("malformed-cg", TOPIC, 0, 0, 0, 0);
    binary.serialize_type = SerializeType::RocketMq;
    if let Some(e) = binary.ext_fields.as_mut() {
        e.shift_remove("topic");
    }
    assert_refused(&addr, "binary-header pull without a topic", binary).await;

    // A oneway request with bad contents gets no answer and does not close the connection.
    let mut oneway = RemotingCommand::request(rc::SEND_MESSAGE_V2).with_opaque(77);
    oneway.set_oneway();
    match exchange(&addr, &oneway.to_frame().unwrap(), Mode::Probe).await {
        Outcome::Answered(a) => assert!(
            a.iter().all(|x| x.opaque != 77),
            "a oneway request was answered: {a:?}"
        ),
        Outcome::Closed => panic!("a bad oneway request closed the connection"),
    }

    assert_healthy(&c, 5).await;
    client.shutdown();
    c.stop().await;
}

/// A small deterministic generator (xorshift64*), so that a failure names its round.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn mutation(&mut self) -> Mutation {
        let at = self.next() as usize;
        match self.below(8) {
            0 => Mutation::FlipBit {
                at,
                bit: self.next() as u8,
            },
            1 => Mutation::SetByte {
                at,
                byte: self.next() as u8,
            },
            2 => Mutation::Insert {
                at,
                bytes: (0..1 + self.below(8)).map(|_| self.next() as u8).collect(),
            },
            3 => Mutation::Remove {
                at,
                len: 1 + self.below(32),
            },
            4 => Mutation::Truncate { at },
            5 => Mutation::Duplicate {
                at,
                len: 1 + self.below(128),
            },
            6 => Mutation::Int32 {
                at,
                which: self.next() as usize,
            },
            _ => Mutation::Int16 {
                at,
                which: self.next() as usize,
            },
        }
    }
}

#[tokio::test]
async fn damaged_frames_from_the_fuzz_seeds_never_hurt_the_broker() {
    let c = Cluster::start().await;
    let client = RawClient::new(&c.broker_addr);
    ok(&client.call(create_topic_req(TOPIC, 2)).await);
    for i in 0..20 {
        ok(&client
            .call(send_req(TOPIC, 0, format!("m{i}").as_bytes(), ""))
            .await);
    }
    // Frames of the stream seeds, without their chunk-size byte.
    let seeds: Vec<Vec<u8>> = shoal_fuzz::seeds::frame_stream()
        .into_iter()
        .map(|s| s[1..].to_vec())
        .collect();
    let rounds: usize = std::env::var("SHOAL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(2000, |n: usize| n / 2);
    let mut rng = Rng(0x5eed_f022_0000_0001);
    let mut answers = 0;
    // Several damaged frames per connection, 16 connections at a time; each connection is
    // half-closed after its bytes, so the broker must answer what it could parse and close.
    let per_connection = 8;
    let mut running = tokio::task::JoinSet::new();
    let mut count = |o: Outcome| {
        if let Outcome::Answered(a) = o {
            answers += a.len();
        }
    };
    for _ in 0..rounds / per_connection {
        let mut bytes = Vec::new();
        for _ in 0..per_connection {
            let seed = &seeds[rng.below(seeds.len())];
            let muts: Vec<Mutation> = (0..1 + rng.below(4)).map(|_| rng.mutation()).collect();
            bytes.extend(mutated(seed, &muts));
        }
        let addr = c.broker_addr.clone();
        running.spawn(async move { exchange(&addr, &bytes, Mode::HalfClose).await });
        if running.len() >= 16 {
            if let Some(r) = running.join_next().await {
                count(r.expect("exchange task"));
            }
        }
    }
    while let Some(r) = running.join_next().await {
        count(r.expect("exchange task"));
    }
    eprintln!("damaged frames: {answers} answers");
    assert!(
        answers > 0,
        "no damaged frame was answered: the mutations destroy everything"
    );
    client
        .join("malformed-c1", "malformed-cg", &[(TOPIC, "*")])
        .await;
    // Damaged sends may have stored messages in TOPIC's queue 0 or 1: count at least the 20.
    let r = client
        .call(pull_req("malformed-cg", TOPIC, 0, 0, 0, 0))
        .await;
    ok(&r);
    let bodies: Vec<Bytes> = decode(&r).into_iter().map(|m| m.body).collect();
    for i in 0..20 {
        assert!(
            bodies.contains(&Bytes::from(format!("m{i}"))),
            "acknowledged message m{i} lost"
        );
    }
    ok(&client.call(send_req(TOPIC, 1, b"after", "")).await);
    client.shutdown();
    c.stop().await;
}
