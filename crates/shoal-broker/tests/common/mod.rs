//! A name server and a broker on 127.0.0.1 (ports chosen at run time) in a temp directory, and
//! raw-protocol helpers built from shoal-proto.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    unreachable_pub,
    reason = "test code: a failed unwrap is a failed test"
)]
#![allow(dead_code)]

use bytes::Bytes;
use shoal_broker::{Broker, BrokerConfig};
use shoal_namesrv::{NameServer, NamesrvConfig};
use shoal_net::{processor_fn, NetConfig, RemotingClient};
use shoal_proto::body::{
    ConsumeFromWhere, ConsumeType, ConsumerData, HeartbeatData, MessageModel, ProducerData,
    SubscriptionData,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::{
    CreateTopicRequestHeader, PullMessageRequestHeader, SendMessageRequestHeader,
    SendMessageRequestHeaderV2,
};
use shoal_proto::message::{
    decode_records, encode_properties, DecodeOptions, MessageExt, Properties,
};
use shoal_proto::RemotingCommand;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const T: Duration = Duration::from_secs(5);

pub struct Cluster {
    pub namesrv: Option<NameServer>,
    pub broker: Option<Broker>,
    pub dir: tempfile::TempDir,
    pub namesrv_addr: String,
    pub broker_addr: String,
}

pub fn test_config(dir: &std::path::Path, namesrv: &str) -> BrokerConfig {
    BrokerConfig {
        listen_addr: "127.0.0.1:0".into(),
        namesrv_addrs: vec![namesrv.to_string()],
        data_dir: dir.to_path_buf(),
        commit_log_segment_bytes: 8 * 1024 * 1024,
        max_message_bytes: 1024 * 1024,
        delay_levels: "20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms".into(),
        register_interval_ms: 1_000,
        ..BrokerConfig::default()
    }
}

impl Cluster {
    /// A counter of the broker's metrics (summed over its labels), as `/metrics` shows it.
    #[allow(dead_code)]
    pub fn counter(&self, name: &str) -> u64 {
        let text = self.broker.as_ref().unwrap().api().metrics().encode_text();
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    pub async fn start() -> Cluster {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut BrokerConfig)) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let namesrv = NameServer::start(NamesrvConfig {
            listen_addr: "127.0.0.1:0".into(),
            ..NamesrvConfig::default()
        })
        .await
        .unwrap();
        let namesrv_addr = namesrv.local_addr().to_string();
        let mut cfg = test_config(dir.path(), &namesrv_addr);
        tweak(&mut cfg);
        let broker = Broker::start(cfg).await.unwrap();
        let broker_addr = broker.local_addr().to_string();
        Cluster {
            namesrv: Some(namesrv),
            broker: Some(broker),
            dir,
            namesrv_addr,
            broker_addr,
        }
    }

    pub async fn restart_broker(&mut self, tweak: impl FnOnce(&mut BrokerConfig)) {
        if let Some(b) = self.broker.take() {
            b.shutdown().await;
        }
        let mut cfg = test_config(self.dir.path(), &self.namesrv_addr);
        cfg.listen_addr = self.broker_addr.clone();
        tweak(&mut cfg);
        let broker = Broker::start(cfg).await.unwrap();
        self.broker_addr = broker.local_addr().to_string();
        self.broker = Some(broker);
    }

    pub async fn stop(mut self) {
        if let Some(b) = self.broker.take() {
            b.shutdown().await;
        }
        if let Some(n) = self.namesrv.take() {
            n.shutdown().await;
        }
    }
}

/// A raw client that records the requests the broker sends it (NOTIFY_CONSUMER_IDS_CHANGED...).
pub struct RawClient {
    pub client: RemotingClient,
    pub received: Arc<Mutex<Vec<RemotingCommand>>>,
    pub addr: String,
}

impl RawClient {
    pub fn new(addr: &str) -> RawClient {
        let received = Arc::new(Mutex::new(Vec::new()));
        let r = received.clone();
        let processor = processor_fn(move |_ctx, req: RemotingCommand| {
            let r = r.clone();
            async move {
                r.lock().unwrap().push(req);
                Ok(None)
            }
        });
        RawClient {
            client: RemotingClient::new(NetConfig::default(), Arc::new(processor)),
            received,
            addr: addr.to_string(),
        }
    }

    pub async fn call(&self, req: RemotingCommand) -> RemotingCommand {
        self.client.invoke(&self.addr, req, T).await.unwrap()
    }

    pub fn notifications(&self, code: i32) -> usize {
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.code == code)
            .count()
    }

    pub async fn wait_notifications(&self, code: i32, n: usize) -> bool {
        for _ in 0..200 {
            if self.notifications(code) >= n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    pub fn shutdown(&self) {
        self.client.shutdown();
    }

    /// Heartbeats as a clustering member of `group` with the given subscriptions.
    pub async fn join(&self, client_id: &str, group: &str, subs: &[(&str, &str)]) {
        ok(&self
            .call(heartbeat_req(
                client_id,
                group,
                subs,
                MessageModel::Clustering,
            ))
            .await);
    }

    /// Asks this (name server) address for a topic's route until it has one (2 s at most).
    pub async fn wait_route(&self, topic: &str) -> Option<shoal_proto::body::TopicRouteData> {
        for _ in 0..100 {
            let r = self
                .call(RemotingCommand::request_with_header(
                    rc::GET_ROUTEINFO_BY_TOPIC,
                    &shoal_proto::header::GetRouteInfoRequestHeader {
                        topic: topic.into(),
                        ..Default::default()
                    },
                ))
                .await;
            if r.code == resp::SUCCESS {
                return r.decode_json_body().ok();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

pub fn create_topic_req(topic: &str, queues: i32) -> RemotingCommand {
    RemotingCommand::request_with_header(
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
    )
}

pub fn props(pairs: &[(&str, &str)]) -> String {
    let mut p = Properties::default();
    for (k, v) in pairs {
        p.insert(k.to_string(), v.to_string());
    }
    encode_properties(&p).unwrap()
}

pub fn send_req(topic: &str, queue_id: i32, body: &[u8], properties: &str) -> RemotingCommand {
    let h = SendMessageRequestHeader {
        producer_group: "PG".into(),
        topic: topic.into(),
        default_topic: "TBW102".into(),
        default_topic_queue_nums: 4,
        queue_id,
        sys_flag: 0,
        born_timestamp: 1_700_000_000_000,
        flag: 0,
        properties: Some(properties.to_string()),
        ..Default::default()
    };
    RemotingCommand::request_with_header(rc::SEND_MESSAGE_V2, &SendMessageRequestHeaderV2::from(h))
        .with_body(Bytes::copy_from_slice(body))
}

pub fn pull_req(
    group: &str,
    topic: &str,
    queue_id: i32,
    offset: i64,
    sys_flag: i32,
    suspend_ms: i64,
) -> RemotingCommand {
    RemotingCommand::request_with_header(
        rc::PULL_MESSAGE,
        &PullMessageRequestHeader {
            consumer_group: group.into(),
            topic: topic.into(),
            queue_id,
            queue_offset: offset,
            max_msg_nums: 32,
            sys_flag,
            commit_offset: 0,
            suspend_timeout_millis: suspend_ms,
            sub_version: 0,
            expression_type: Some("TAG".into()),
            ..Default::default()
        },
    )
}

pub fn heartbeat_req(
    client_id: &str,
    group: &str,
    subs: &[(&str, &str)],
    model: MessageModel,
) -> RemotingCommand {
    let data = HeartbeatData {
        client_id: client_id.into(),
        consumer_data_set: vec![ConsumerData {
            consume_from_where: ConsumeFromWhere::ConsumeFromLastOffset,
            consume_type: ConsumeType::ConsumePassively,
            group_name: group.into(),
            message_model: model,
            subscription_data_set: subs
                .iter()
                .map(|(t, e)| SubscriptionData::from_tag_expression(*t, e, 1))
                .collect(),
            unit_mode: false,
        }],
        producer_data_set: vec![ProducerData {
            group_name: "CLIENT_INNER_PRODUCER".into(),
        }],
        ..Default::default()
    };
    RemotingCommand::request(rc::HEART_BEAT)
        .with_ext_fields(Default::default())
        .with_json_body(&data)
        .unwrap()
}

pub fn decode(resp_cmd: &RemotingCommand) -> Vec<MessageExt> {
    let body = resp_cmd.body.clone().unwrap_or_default();
    let run = decode_records(&body, &DecodeOptions::default());
    assert!(
        run.error.is_none(),
        "pull body did not decode: {:?}",
        run.error
    );
    run.messages
}

pub fn ok(r: &RemotingCommand) {
    assert_eq!(
        r.code,
        resp::SUCCESS,
        "expected SUCCESS, got {} {:?}",
        r.code,
        r.remark
    );
}
