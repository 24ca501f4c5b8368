//! The voter's bounds: a full inbox, a request not answered in time and too many requests
//! waiting are each answered SYSTEM_BUSY and counted.

use super::*;
use shoal_ha::controller::RaftMessageType;

fn apply(token: &str) -> Request {
    Request::ApplyBrokerId {
        group: "g".into(),
        addr: "127.0.0.1:1".into(),
        token: token.into(),
    }
}

#[test]
fn peers_parse_and_leave_this_voter_out() {
    let p = parse_peers(
        2,
        &[
            "1=127.0.0.1:1".into(),
            "2=127.0.0.1:2".into(),
            " 3 = 127.0.0.1:3".into(),
        ],
    )
    .unwrap();
    assert_eq!(
        p,
        BTreeMap::from([(1, "127.0.0.1:1".into()), (3, "127.0.0.1:3".into())])
    );
    assert!(parse_peers(1, &["x=1".into()]).is_err());
    assert!(parse_peers(1, &["2".into()]).is_err());
    assert!(parse_peers(1, &["0=a".into()]).is_err());
    assert!(parse_peers(1, &["2=a".into(), "2=b".into()]).is_err());
}

#[test]
fn each_request_has_its_code_and_refusals_their_rocketmq_codes() {
    let req = Request::Heartbeat {
        group: "g".into(),
        broker_id: 1,
        last_epoch: 0,
        end_offset: 0,
    };
    assert_eq!(request_code_of(&req), 904);
    assert_eq!(request_code_of(&apply("t")), 1013);
    assert_eq!(
        response_code_of(&Response::Refused(Refusal::StaleInSyncEpoch { current: 2 })),
        2001
    );
    assert_eq!(
        response_code_of(&Response::NotLeader { leader: None }),
        2007
    );
}

/// A listener whose inbox holds one input and nobody reads it: the first request waits and
/// is answered SYSTEM_BUSY after the answer timeout, the second finds the inbox full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_inbox_and_an_unanswered_request_are_system_busy() {
    let (tx, rx) = mpsc::channel(1);
    let metrics = Arc::new(ControllerMetrics::new());
    let processor = ControllerProcessor {
        inbox: tx,
        answer_timeout: Duration::from_millis(200),
        elect_timeout: Duration::from_millis(200),
        metrics: metrics.clone(),
    };
    let server = shoal_net::Server::bind("127.0.0.1:0", Arc::new(processor))
        .await
        .unwrap();
    let addr = server.local_addr().to_string();
    let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
    let send = |token: &str| {
        let (client, addr) = (client.clone(), addr.clone());
        let cmd = RemotingCommand::request(rc::CONTROLLER_APPLY_BROKER_ID)
            .with_body(serde_json::to_vec(&apply(token)).unwrap());
        async move {
            client
                .invoke(&addr, cmd, Duration::from_secs(30))
                .await
                .unwrap()
        }
    };
    let first = tokio::spawn(send("1"));
    while rx.is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = send("2").await;
    assert_eq!(second.code, resp::SYSTEM_BUSY, "{:?}", second.remark);
    let first = first.await.unwrap();
    assert_eq!(first.code, resp::SYSTEM_BUSY, "{:?}", first.remark);
    let text = metrics.registry.encode_text();
    for reason in ["inbox", "timeout"] {
        let line = format!("shoal_controller_requests_refused_busy_total{{reason=\"{reason}\"}} 1");
        assert!(text.contains(&line), "{line} in\n{text}");
    }
    client.shutdown();
    server.shutdown().await;
    drop(rx);
}

/// A leader whose entries cannot commit (its only follower hears heartbeats but no appends):
/// with `max_waiting_requests = 1` the first request waits and the second is SYSTEM_BUSY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_max_waiting_are_system_busy() {
    let metrics = Arc::new(ControllerMetrics::new());
    let (to_peer, mut from_leader) = mpsc::channel::<RaftMessage>(1_024);
    let (inbox, rx) = mpsc::channel(64);
    let start = Instant::now();
    let node = ControllerNode::new(
        ControllerConfig::new(1, vec![1, 2]),
        ControllerStorage::new(vec![1, 2]),
        0,
    )
    .unwrap();
    let driver = Driver {
        start,
        peers: BTreeMap::from([(2, to_peer)]),
        addrs: BTreeMap::from([(1, "a".to_string()), (2, "b".to_string())]),
        disk: None,
        max_waiting: 1,
        metrics: metrics.clone(),
    };
    let task = tokio::spawn(driver.run(node, rx));
    // Voter 2, driven here: appends from the leader are dropped, everything else delivered.
    let follower = {
        let inbox = inbox.clone();
        tokio::spawn(async move {
            let mut peer = ControllerNode::new(
                ControllerConfig::new(2, vec![1, 2]),
                ControllerStorage::new(vec![1, 2]),
                0,
            )
            .unwrap();
            loop {
                let now = u64::try_from(start.elapsed().as_millis()).unwrap();
                peer.handle_timeout(now);
                while let Ok(m) = from_leader.try_recv() {
                    if m.get_msg_type() != RaftMessageType::MsgAppend {
                        peer.handle_message(now, m);
                    }
                }
                while let Some(m) = peer.poll_transmit() {
                    let _ = inbox.send(Input::Raft(m)).await;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    loop {
        let (reply, status) = oneshot::channel();
        inbox.send(Input::Status { reply }).await.unwrap();
        if status.await.unwrap()["isLeader"] == true {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (reply, _first) = oneshot::channel();
    inbox
        .send(Input::Request {
            conn: 0,
            handle: None,
            req: apply("1"),
            reply,
        })
        .await
        .unwrap();
    let (reply, second) = oneshot::channel();
    inbox
        .send(Input::Request {
            conn: 0,
            handle: None,
            req: apply("2"),
            reply,
        })
        .await
        .unwrap();
    assert_eq!(second.await.unwrap(), Response::Busy);
    let text = metrics.registry.encode_text();
    assert!(
        text.contains("shoal_controller_requests_refused_busy_total{reason=\"waiting\"} 1"),
        "{text}"
    );
    assert!(text.contains("shoal_controller_is_leader 1"), "{text}");
    follower.abort();
    task.abort();
}

/// A broker's connection closing makes the leader see it dead at once (not a session later);
/// heard again on a new connection, it is alive again. The status shows what the leader heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_broker_connection_is_death_at_once() {
    // A session far longer than the test: only the closed connection can end it.
    let limits = ControllerLimits {
        session_timeout_ms: 600_000,
        ..Default::default()
    };
    let voter = Voter::start(VoterOptions {
        listen: "127.0.0.1:0".into(),
        id: 1,
        peers: Vec::new(),
        data_dir: None,
        limits,
    })
    .await
    .unwrap();
    let addr = voter.local_addr().to_string();
    let call = |client: RemotingClient, req: Request| {
        let addr = addr.clone();
        async move {
            let cmd = RemotingCommand::request(request_code_of(&req))
                .with_body(serde_json::to_vec(&req).unwrap());
            let reply = client
                .invoke(&addr, cmd, Duration::from_secs(10))
                .await
                .unwrap();
            serde_json::from_slice::<Response>(reply.body.as_deref().unwrap_or_default()).unwrap()
        }
    };
    let heartbeat = Request::Heartbeat {
        group: "g".into(),
        broker_id: 1,
        last_epoch: 0,
        end_offset: 42,
    };
    let status = |client: RemotingClient| {
        let addr = addr.clone();
        async move { metadata(&client, &addr).await.unwrap() }
    };
    let new_client = || RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
    let broker = new_client();
    // The single voter leads once its election timeout passes.
    loop {
        match call(broker.clone(), apply("t1")).await {
            Response::BrokerId(1) => break,
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert!(matches!(
        call(broker.clone(), heartbeat.clone()).await,
        Response::Group(_)
    ));
    let operator = new_client();
    let v = status(operator.clone()).await;
    assert_eq!(v["groups"]["g"]["alive"], json!([1]), "{v}");
    assert_eq!(v["groups"]["g"]["heard"]["1"]["endOffset"], 42, "{v}");
    broker.shutdown();
    loop {
        let v = status(operator.clone()).await;
        if v["groups"]["g"]["alive"] == json!([]) {
            assert_eq!(v["groups"]["g"]["heard"]["1"]["disconnected"], true, "{v}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = voter.registry().encode_text();
    assert!(
        text.contains("shoal_controller_broker_disconnects_total 1"),
        "{text}"
    );
    let again = new_client();
    assert!(matches!(
        call(again.clone(), heartbeat).await,
        Response::Group(_)
    ));
    let v = status(operator.clone()).await;
    assert_eq!(v["groups"]["g"]["alive"], json!([1]), "{v}");
    again.shutdown();
    operator.shutdown();
    voter.shutdown().await;
}
