//! The listener's test fixture: a small in-test `BrokerHandle` (topics in a map, arrivals from
//! the store's listener, a group coordinator of its own as the broker's `GroupState` owns one,
//! whose notices to consumer-protocol members go to the listener as the broker's do), a
//! listener on a free port, and a client speaking the `kafka-protocol` crate's codecs.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    unreachable_pub,
    reason = "test code: a failed unwrap is a failed test"
)]
// Each includer uses a part of it.
#![allow(dead_code)]

use bytes::{BufMut, Bytes, BytesMut};
use futures::future::BoxFuture;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use parking_lot::Mutex;
use shoal_group::coordinator::{Coordinator, CoordinatorConfig, Effect};
use shoal_kafka::{BrokerHandle, KafkaConfig, KafkaError, KafkaServer, TopicInfo, WaitPosition};
use shoal_store::{MessageStore, StoreConfig};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Where the coordinator's notices to members without a connection go (the listener).
pub type MemberNotifier = Box<dyn Fn(&str, &str) + Send + Sync>;

pub struct TestBroker {
    pub store: Arc<MessageStore>,
    pub topics: Mutex<BTreeMap<String, i32>>,
    pub arrived: Arc<Notify>,
    pub groups: Mutex<Vec<String>>,
    pub coordinator: Mutex<Coordinator>,
    /// The listener's [`KafkaServer::consumer_group_notifier`], once it runs.
    pub notifier: OnceLock<MemberNotifier>,
    pub started: std::time::Instant,
}

impl BrokerHandle for TestBroker {
    fn store(&self) -> Arc<MessageStore> {
        self.store.clone()
    }
    fn topics(&self) -> Vec<TopicInfo> {
        self.topics
            .lock()
            .iter()
            .map(|(n, p)| info(n, *p))
            .collect()
    }
    fn topic(&self, name: &str) -> Option<TopicInfo> {
        self.topics.lock().get(name).map(|p| info(name, *p))
    }
    fn auto_create_topics(&self) -> bool {
        true
    }
    fn default_partitions(&self) -> i32 {
        2
    }
    fn create_topic(&self, name: &str, partitions: i32) -> Result<TopicInfo, KafkaError> {
        let mut t = self.topics.lock();
        if t.contains_key(name) {
            return Err(KafkaError::TopicExists(name.into()));
        }
        t.insert(name.into(), partitions);
        Ok(info(name, partitions))
    }
    fn delete_topic(&self, name: &str) -> Result<(), KafkaError> {
        self.topics.lock().remove(name);
        Ok(self.store.delete_topic(name)?)
    }
    fn set_partitions(&self, name: &str, count: i32) -> Result<(), KafkaError> {
        self.topics.lock().insert(name.into(), count);
        Ok(())
    }
    fn ensure_group(&self, group: &str) -> Result<(), KafkaError> {
        let mut g = self.groups.lock();
        if !g.iter().any(|x| x == group) {
            g.push(group.into());
        }
        Ok(())
    }
    fn delete_group(&self, group: &str) -> Result<(), KafkaError> {
        self.groups.lock().retain(|g| g != group);
        self.store.remove_group_offsets(group);
        Ok(())
    }
    fn broker_name(&self) -> String {
        "broker-test".into()
    }
    fn cluster_name(&self) -> String {
        "TestCluster".into()
    }
    fn max_message_bytes(&self) -> usize {
        1 << 20
    }
    fn retention_hours(&self) -> u64 {
        72
    }
    fn with_coordinator(
        &self,
        _group: Option<&str>,
        topics: &[String],
        f: &mut dyn FnMut(&mut Coordinator, u64),
    ) -> Result<(), KafkaError> {
        let queues: Vec<(String, i32)> = {
            let t = self.topics.lock();
            topics
                .iter()
                .filter_map(|n| t.get(n).map(|p| (n.clone(), *p)))
                .collect()
        };
        let now = self.started.elapsed().as_millis() as u64;
        let mut c = self.coordinator.lock();
        for (t, p) in queues {
            let q = (0..p)
                .map(|i| shoal_proto::MessageQueue::new(&t, "broker-test", i))
                .collect();
            c.handle_topic_queues(now, &t, q);
        }
        f(&mut c, now);
        // The broker executes the effects after the lock: notices to Kafka members go to
        // the listener.
        let notices: Vec<(String, String)> = std::iter::from_fn(|| c.poll_effect())
            .filter_map(|e| match e {
                Effect::Notify {
                    group, member_id, ..
                } => Some((group, member_id)),
                _ => None,
            })
            .collect();
        drop(c);
        if let Some(n) = self.notifier.get() {
            for (g, m) in notices {
                n(&g, &m);
            }
        }
        Ok(())
    }
    fn wait_for_messages(
        &self,
        positions: Vec<WaitPosition>,
        timeout: Duration,
    ) -> BoxFuture<'static, ()> {
        let store = self.store.clone();
        let arrived = self.arrived.clone();
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                let notified = arrived.notified();
                if positions
                    .iter()
                    .any(|p| store.max_offset(&p.topic, p.partition) > p.offset)
                {
                    return;
                }
                if tokio::time::timeout_at(deadline, notified).await.is_err() {
                    return;
                }
            }
        })
    }
}

pub fn info(name: &str, partitions: i32) -> TopicInfo {
    TopicInfo {
        name: name.into(),
        partitions,
        readable: true,
        writable: true,
        internal: false,
    }
}

pub struct Fixture {
    _dir: tempfile::TempDir,
    pub server: Option<KafkaServer>,
    pub broker: Arc<TestBroker>,
}

impl Fixture {
    /// A listener with `config`, its answers never held (heartbeats, fetches): the tests of
    /// held answers use [`Fixture::start_holding`].
    pub async fn start(config: KafkaConfig) -> Fixture {
        Fixture::start_holding(KafkaConfig {
            group_heartbeat_hold_ms: 0,
            consumer_heartbeat_hold_ms: 0,
            rebalance_fetch_hold_ms: 0,
            consumer_fetch_hold_ms: 0,
            ..config
        })
        .await
    }

    /// A listener with `config` as it is.
    pub async fn start_holding(config: KafkaConfig) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = MessageStore::open(StoreConfig::new(dir.path().join("store"))).unwrap();
        let store = Arc::new(store);
        let arrived = Arc::new(Notify::new());
        let a = arrived.clone();
        store.add_arrival_listener(Arc::new(move |_| a.notify_waiters()));
        let broker = Arc::new(TestBroker {
            store,
            topics: Mutex::new(BTreeMap::new()),
            arrived,
            groups: Mutex::new(Vec::new()),
            coordinator: Mutex::new(Coordinator::new(CoordinatorConfig::default())),
            notifier: OnceLock::new(),
            started: std::time::Instant::now(),
        });
        let server = KafkaServer::start(
            KafkaConfig {
                listen_addr: "127.0.0.1:0".into(),
                group_initial_rebalance_delay_ms: 0,
                ..config
            },
            broker.clone(),
        )
        .await
        .unwrap();
        let _ = broker
            .notifier
            .set(Box::new(server.consumer_group_notifier()));
        Fixture {
            _dir: dir,
            server: Some(server),
            broker,
        }
    }

    /// A new listener over the same broker and store in place of the running one (as after a
    /// restart or a failover: it knows no producer, group or connection of the old one).
    pub async fn restart_listener(&mut self, config: KafkaConfig) {
        drop(self.server.take());
        let server = KafkaServer::start(
            KafkaConfig {
                listen_addr: "127.0.0.1:0".into(),
                group_initial_rebalance_delay_ms: 0,
                ..config
            },
            self.broker.clone(),
        )
        .await
        .unwrap();
        self.server = Some(server);
    }

    pub async fn client(&self) -> Client {
        let addr = self.server.as_ref().unwrap().local_addr();
        Client {
            stream: TcpStream::connect(addr).await.unwrap(),
            next: 1,
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        drop(self.server.take());
    }
}

pub struct Client {
    pub stream: TcpStream,
    pub next: i32,
}

impl Client {
    pub async fn send<R: Encodable + HeaderVersion>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &R,
    ) -> i32 {
        let id = self.next;
        self.next += 1;
        let mut buf = BytesMut::new();
        buf.put_i32(0);
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(id)
            .with_client_id(Some(StrBytes::from_static_str("test")));
        header
            .encode(&mut buf, key.request_header_version(version))
            .unwrap();
        req.encode(&mut buf, version).unwrap();
        let len = (buf.len() - 4) as i32;
        buf[0..4].copy_from_slice(&len.to_be_bytes());
        self.stream.write_all(&buf).await.unwrap();
        id
    }

    pub async fn recv<R: Decodable>(&mut self, key: ApiKey, version: i16, id: i32) -> R {
        let len = self.stream.read_i32().await.unwrap();
        let mut buf = vec![0u8; len as usize];
        self.stream.read_exact(&mut buf).await.unwrap();
        let mut b = Bytes::from(buf);
        let h = ResponseHeader::decode(&mut b, key.response_header_version(version)).unwrap();
        assert_eq!(h.correlation_id, id, "responses come in request order");
        R::decode(&mut b, version).unwrap()
    }

    pub async fn call<Q: Encodable + HeaderVersion, R: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &Q,
    ) -> R {
        let id = self.send(key, version, req).await;
        self.recv(key, version, id).await
    }
}
