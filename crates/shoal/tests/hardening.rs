//! No silent data loss and bounded resources, with the `shoal` binary as separate processes:
//! auto-created topics survive a SIGKILL, a second process on a data directory refuses to
//! start, damaged consume queues are rebuilt after a clean shutdown, one corrupt record does not
//! take the following ones with it, oversized pulls are answered with bounded memory, and a
//! corrupt config file is named at start-up.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;
use shoal_net::{NetConfig, NotSupportedProcessor, RemotingClient};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::{
    CreateTopicRequestHeader, PullMessageRequestHeader, PullMessageResponseHeader,
    SendMessageRequestHeader, SendMessageRequestHeaderV2, SendMessageResponseHeader,
};
use shoal_proto::message::{decode_records, DecodeOptions};
use shoal_proto::RemotingCommand;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::free_port;

const T: Duration = Duration::from_secs(10);

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    fn sigkill(&mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }

    /// SIGTERM and wait for the clean exit.
    fn stop_cleanly(&mut self) {
        Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.0.try_wait() {
                assert!(status.success(), "clean stop failed: {status}");
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("process did not stop on SIGTERM");
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}

fn spawn(args: &[&str], stderr: Option<&Path>) -> Proc {
    let err = match stderr {
        Some(p) => Stdio::from(std::fs::File::create(p).unwrap()),
        None => Stdio::null(),
    };
    Proc(
        Command::new(env!("CARGO_BIN_EXE_shoal"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("spawn shoal"),
    )
}

/// A name server and a broker (`shoal namesrv` + `shoal broker`) on a data directory.
struct Servers {
    _ns: Proc,
    broker: Option<Proc>,
    broker_args: Vec<String>,
    addr: String,
    data: PathBuf,
    client: RemotingClient,
    _dir: tempfile::TempDir,
}

impl Servers {
    async fn start(extra: &[&str]) -> Servers {
        let dir = tempfile::tempdir().unwrap();
        let ns_addr = format!("127.0.0.1:{}", free_port());
        let addr = format!("127.0.0.1:{}", free_port());
        let data = dir.path().join("broker");
        let mut broker_args: Vec<String> = [
            "broker",
            "--listen",
            &addr,
            "--namesrv",
            &ns_addr,
            "--data-dir",
            data.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        broker_args.extend(extra.iter().map(|s| s.to_string()));
        let ns = spawn(&["namesrv", "--listen", &ns_addr], None);
        let mut s = Servers {
            _ns: ns,
            broker: None,
            broker_args,
            addr,
            data,
            client: RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor)),
            _dir: dir,
        };
        s.start_broker().await;
        s
    }

    async fn start_broker(&mut self) {
        let args: Vec<&str> = self.broker_args.iter().map(String::as_str).collect();
        self.broker = Some(spawn(&args, None));
        for _ in 0..400 {
            if let Ok(r) = self
                .client
                .invoke(
                    &self.addr,
                    RemotingCommand::request(rc::GET_BROKER_RUNTIME_INFO),
                    T,
                )
                .await
            {
                if r.code == resp::SUCCESS {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("broker at {} never became ready", self.addr);
    }

    fn broker(&mut self) -> &mut Proc {
        self.broker.as_mut().unwrap()
    }

    async fn call(&self, req: RemotingCommand) -> RemotingCommand {
        self.client.invoke(&self.addr, req, T).await.unwrap()
    }

    async fn create_topic(&self, topic: &str, queues: i32) {
        let create = RemotingCommand::request_with_header(
            rc::UPDATE_AND_CREATE_TOPIC,
            &CreateTopicRequestHeader {
                topic: topic.into(),
                default_topic: "TBW102".into(),
                read_queue_nums: queues,
                write_queue_nums: queues,
                perm: 6,
                topic_filter_type: "SINGLE_TAG".into(),
                ..Default::default()
            },
        );
        assert_eq!(self.call(create).await.code, resp::SUCCESS);
    }

    /// Sends and returns (queue id, queue offset).
    async fn send(&self, topic: &str, queue_id: i32, body: Vec<u8>) -> (i32, i64) {
        let r = self.call(send_req(topic, queue_id, body)).await;
        assert_eq!(r.code, resp::SUCCESS, "send: {:?}", r.remark);
        let h: SendMessageResponseHeader = r.decode_command_header().unwrap();
        (h.queue_id, h.queue_offset)
    }

    /// Every message of a queue, by pulls (the group is auto-created by the pull).
    async fn pull_all(&self, topic: &str, q: i32) -> Vec<(i64, Vec<u8>)> {
        let mut out = Vec::new();
        let mut offset = 0;
        loop {
            let r = self.call(pull_req(topic, q, offset, 32, None)).await;
            if r.code == resp::PULL_NOT_FOUND {
                return out;
            }
            let h: PullMessageResponseHeader = r.decode_command_header().unwrap();
            if r.code == resp::SUCCESS {
                let run = decode_records(r.body.as_ref().unwrap(), &DecodeOptions::client());
                assert!(
                    run.error.is_none(),
                    "corrupt record served: {:?}",
                    run.error
                );
                out.extend(
                    run.messages
                        .into_iter()
                        .map(|m| (m.queue_offset, m.body.to_vec())),
                );
            } else {
                assert_eq!(r.code, resp::PULL_RETRY_IMMEDIATELY, "{:?}", r.remark);
            }
            offset = h.next_begin_offset;
        }
    }
}

fn send_req(topic: &str, queue_id: i32, body: Vec<u8>) -> RemotingCommand {
    let h = SendMessageRequestHeader {
        producer_group: "PG".into(),
        topic: topic.into(),
        default_topic: "TBW102".into(),
        default_topic_queue_nums: 4,
        queue_id,
        born_timestamp: 1,
        ..Default::default()
    };
    RemotingCommand::request_with_header(rc::SEND_MESSAGE_V2, &SendMessageRequestHeaderV2::from(h))
        .with_body(body)
}

fn pull_req(topic: &str, q: i32, offset: i64, max: i32, max_bytes: Option<i32>) -> RemotingCommand {
    RemotingCommand::request_with_header(
        rc::PULL_MESSAGE,
        &PullMessageRequestHeader {
            consumer_group: "Checker".into(),
            topic: topic.into(),
            queue_id: q,
            queue_offset: offset,
            max_msg_nums: max,
            max_msg_bytes: max_bytes,
            sys_flag: shoal_proto::constants::pull_sys_flag::SUBSCRIPTION,
            subscription: Some("*".into()),
            ..Default::default()
        },
    )
}

#[tokio::test]
async fn crash_right_after_auto_create_keeps_the_topic_and_every_acknowledged_message() {
    let mut s = Servers::start(&["--flush", "sync", "--auto-create-topic"]).await;
    let mut acked = Vec::new();
    for i in 0..20 {
        let body = format!("auto-{i}").into_bytes();
        let (q, off) = s.send("BornInFlight", -1, body.clone()).await;
        acked.push((q, off, body));
    }
    // SIGKILL well inside the 10 s table flush interval.
    s.broker().sigkill();
    s.start_broker().await;
    for q in 0..4 {
        let got = s.pull_all("BornInFlight", q).await;
        for (aq, off, body) in acked.iter().filter(|(aq, ..)| *aq == q) {
            assert!(
                got.iter().any(|(o, b)| o == off && b == body),
                "acknowledged message {aq}/{off} lost after SIGKILL"
            );
        }
    }
    // The group the pull auto-created is on disk as well.
    let groups = std::fs::read_to_string(s.data.join("config/subscriptionGroup.json")).unwrap();
    assert!(groups.contains("Checker"));
}

#[tokio::test]
async fn a_second_process_on_the_same_data_dir_refuses_to_start() {
    let mut s = Servers::start(&["--flush", "sync"]).await;
    s.create_topic("Shared", 1).await;
    for i in 0..10 {
        s.send("Shared", 0, format!("first-{i}").into_bytes()).await;
    }
    let pid = s.broker().0.id();
    let log = s.data.parent().unwrap().join("second.log");
    let second_addr = format!("127.0.0.1:{}", free_port());
    let mut args: Vec<String> = s.broker_args.clone();
    args[2] = second_addr.clone();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut second = spawn(&args, Some(&log));
    let status = second.0.wait().unwrap();
    assert!(!status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("in use by another process") && text.contains(&format!("pid {pid}")),
        "second broker said: {text}"
    );
    // `shoal dev` on a directory whose broker data is in use refuses too.
    let dev_log = s.data.parent().unwrap().join("dev.log");
    let mut dev = spawn(
        &[
            "dev",
            "--namesrv-port",
            &free_port().to_string(),
            "--broker-port",
            &free_port().to_string(),
            "--data-dir",
            s.data.parent().unwrap().to_str().unwrap(),
        ],
        Some(&dev_log),
    );
    assert!(!dev.0.wait().unwrap().success());
    let text = std::fs::read_to_string(&dev_log).unwrap();
    assert!(
        text.contains("in use by another process"),
        "shoal dev said: {text}"
    );
    assert!(!text.contains("--broker-port"), "misleading hint: {text}");
    // The first broker is unharmed.
    assert_eq!(s.pull_all("Shared", 0).await.len(), 10);
}

fn cq_file(data: &Path, topic: &str, q: i32) -> PathBuf {
    data.join("store/consumequeue")
        .join(topic)
        .join(q.to_string())
        .join("00000000000000000000")
}

#[tokio::test]
async fn damaged_consume_queue_is_rebuilt_after_a_clean_shutdown() {
    let mut s = Servers::start(&[]).await;
    s.create_topic("Cq", 1).await;
    for i in 0..100 {
        s.send("Cq", 0, format!("cq-{i}").into_bytes()).await;
    }
    s.broker().stop_cleanly();
    // 200 garbage bytes at the start of the consume-queue file.
    let path = cq_file(&s.data, "Cq", 0);
    let mut bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 100 * 20);
    bytes[..200].fill(0xA5);
    std::fs::write(&path, &bytes).unwrap();
    s.start_broker().await;
    let got = s.pull_all("Cq", 0).await;
    let bodies: Vec<String> = got
        .iter()
        .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
        .collect();
    let expected: Vec<String> = (0..100).map(|i| format!("cq-{i}")).collect();
    assert_eq!(bodies, expected);
    let (_, off) = s.send("Cq", 0, b"after".to_vec()).await;
    assert_eq!(off, 100, "an offset was reused");
}

#[tokio::test]
async fn one_corrupt_record_does_not_take_the_following_ones_with_it() {
    let mut s = Servers::start(&["--flush", "sync"]).await;
    s.create_topic("Rot", 1).await;
    for i in 0..100 {
        s.send("Rot", 0, format!("rot-{i:03}-payload").into_bytes())
            .await;
    }
    // After a crash (the full check runs) and after a clean restart (reads check the CRC).
    for crash in [true, false] {
        if crash {
            s.broker().sigkill();
        } else {
            s.broker().stop_cleanly();
        }
        let seg = s.data.join("store/commitlog/00000000000000000000");
        let mut log = std::fs::read(&seg).unwrap();
        let needle = b"rot-050-";
        let at = log
            .windows(needle.len())
            .position(|w| w == needle)
            .expect("record 50 in the log");
        log[at + 10] ^= if crash { 0x01 } else { 0x02 };
        std::fs::write(&seg, &log).unwrap();
        s.start_broker().await;
        let got = s.pull_all("Rot", 0).await;
        let offsets: Vec<i64> = got.iter().map(|(o, _)| *o).collect();
        let expected: Vec<i64> = (0..100).filter(|o| *o != 50).collect();
        assert_eq!(offsets, expected, "crash = {crash}");
    }
}

#[tokio::test]
async fn oversized_pulls_are_answered_and_memory_stays_bounded() {
    let s = Servers::start(&[]).await;
    s.create_topic("Huge", 1).await;
    // 6 x 4 MiB: more than a 16 MiB frame together.
    for _ in 0..6 {
        s.send("Huge", 0, vec![b'h'; 4 * 1024 * 1024 - 4096]).await;
    }
    let r = s.call(pull_req("Huge", 0, 0, 32, Some(64 << 20))).await;
    assert_eq!(r.code, resp::SUCCESS, "{:?}", r.remark);
    assert_eq!(
        decode_records(r.body.as_ref().unwrap(), &DecodeOptions::client())
            .messages
            .len(),
        1
    );
    // 40 MiB more of 1 MiB messages, then 10 concurrent pulls asking for 2 GiB each.
    for _ in 0..40 {
        s.send("Huge", 0, vec![b'm'; 1024 * 1024]).await;
    }
    let before = s.broker.as_ref().unwrap().rss_kib();
    let mut tasks = Vec::new();
    for w in 0..10 {
        let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
        let addr = s.addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut offset = 6 + w;
            let mut answers = 0;
            while offset < 46 {
                let r = client
                    .invoke(&addr, pull_req("Huge", 0, offset, 1024, Some(i32::MAX)), T)
                    .await
                    .unwrap();
                assert_eq!(r.code, resp::SUCCESS);
                let h: PullMessageResponseHeader = r.decode_command_header().unwrap();
                offset = h.next_begin_offset;
                answers += 1;
            }
            answers
        }));
    }
    let mut peak = before;
    for t in tasks {
        assert!(t.await.unwrap() > 1);
        peak = peak.max(s.broker.as_ref().unwrap().rss_kib());
    }
    let grown_mib = peak.saturating_sub(before) / 1024;
    println!(
        "broker RSS before {} MiB, peak {} MiB (+{grown_mib} MiB)",
        before / 1024,
        peak / 1024
    );
    // Without the cap each pull read the whole 40 MiB queue (10 at once: 400 MiB).
    assert!(grown_mib < 100, "RSS grew by {grown_mib} MiB");
}

#[test]
fn corrupt_config_file_is_named_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("broker/config");
    std::fs::create_dir_all(&cfg).unwrap();
    std::fs::write(cfg.join("topics.json"), b"{\"topicConfigTable\": [1,").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args([
            "dev",
            "--namesrv-port",
            &free_port().to_string(),
            "--broker-port",
            &free_port().to_string(),
            "--data-dir",
            dir.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("topics.json is corrupt"), "{text}");
    assert!(!text.contains("--broker-port"), "{text}");
}
