//! A name server and broker(s) on 127.0.0.1 (ports chosen at run time) in temp directories,
//! plus client settings with short timers.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    unreachable_pub,
    reason = "test code: a failed unwrap is a failed test"
)]
#![allow(dead_code)]

use shoal_broker::{Broker, BrokerConfig};
use shoal_client::admin::{AdminClient, TopicSpec};
use shoal_client::consumer::ConsumerConfig;
use shoal_client::ClientConfig;
use shoal_namesrv::{NameServer, NamesrvConfig};
use std::time::{Duration, Instant};

pub struct Cluster {
    pub namesrv: Option<NameServer>,
    pub brokers: Vec<Broker>,
    pub dir: tempfile::TempDir,
    pub namesrv_addr: String,
}

pub fn broker_config(dir: &std::path::Path, namesrv: &str, name: &str) -> BrokerConfig {
    BrokerConfig {
        broker_name: name.into(),
        listen_addr: "127.0.0.1:0".into(),
        namesrv_addrs: vec![namesrv.to_string()],
        data_dir: dir.join(name),
        commit_log_segment_bytes: 8 * 1024 * 1024,
        max_message_bytes: 1024 * 1024,
        delay_levels: "20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms 20ms".into(),
        register_interval_ms: 1_000,
        ..BrokerConfig::default()
    }
}

impl Cluster {
    pub async fn start() -> Cluster {
        Self::start_with(1, |_| {}).await
    }

    pub async fn start_with(brokers: usize, tweak: impl Fn(&mut BrokerConfig)) -> Cluster {
        Self::start_configured(brokers, NamesrvConfig::default(), tweak).await
    }

    /// `brokers` brokers and a name server with `namesrv`'s settings (its address aside).
    pub async fn start_configured(
        brokers: usize,
        namesrv: NamesrvConfig,
        tweak: impl Fn(&mut BrokerConfig),
    ) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let namesrv = NameServer::start(NamesrvConfig {
            listen_addr: "127.0.0.1:0".into(),
            ..namesrv
        })
        .await
        .unwrap();
        let namesrv_addr = namesrv.local_addr().to_string();
        let mut list = Vec::new();
        for i in 0..brokers {
            let name = format!("broker-{}", (b'a' + i as u8) as char);
            let mut cfg = broker_config(dir.path(), &namesrv_addr, &name);
            tweak(&mut cfg);
            list.push(Broker::start(cfg).await.unwrap());
        }
        Cluster {
            namesrv: Some(namesrv),
            brokers: list,
            dir,
            namesrv_addr,
        }
    }

    pub fn client_config(&self) -> ClientConfig {
        ClientConfig {
            poll_namesrv_interval: Duration::from_millis(500),
            heartbeat_interval: Duration::from_secs(1),
            persist_offset_interval: Duration::from_millis(200),
            ..ClientConfig::new(&self.namesrv_addr)
        }
    }

    pub fn consumer_config(&self, group: &str) -> ConsumerConfig {
        let mut c = ConsumerConfig::new(group);
        c.client = self.client_config();
        c.pull_delay_on_error = Duration::from_millis(100);
        c.consume_from_where = shoal_client::ConsumeFromWhere::ConsumeFromFirstOffset;
        c.offset_store_dir = self.dir.path().join("offsets");
        c
    }

    pub fn admin(&self) -> AdminClient {
        AdminClient::new(vec![self.namesrv_addr.clone()])
    }

    /// Creates a topic on every broker and waits until the name server routes it.
    pub async fn create_topic(&self, topic: &str, queues: i32) {
        let admin = self.admin();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match admin
                .create_topic(&TopicSpec::new(topic, queues), None)
                .await
            {
                Ok(created) if created.len() == self.brokers.len() => break,
                other => {
                    assert!(
                        Instant::now() < deadline,
                        "cannot create {topic}: {other:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        loop {
            if let Ok(r) = admin.topic_route(topic).await {
                if r.queue_datas.len() == self.brokers.len() {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "topic {topic} never routed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        admin.shutdown();
    }

    pub async fn stop(mut self) {
        for b in self.brokers.drain(..) {
            b.shutdown().await;
        }
        if let Some(n) = self.namesrv.take() {
            n.shutdown().await;
        }
    }
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes; returns whether it held.
pub async fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
