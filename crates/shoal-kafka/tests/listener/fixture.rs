//! The listener under test: a real `MessageStore` in a temporary directory, a small
//! in-test `BrokerHandle`, a raw Kafka client, and the requests the tests build.

use bytes::{BufMut, Bytes, BytesMut};
use futures::future::BoxFuture;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use kafka_protocol::records::{Compression, Record};
use parking_lot::Mutex;
use shoal_group::coordinator::{Coordinator, CoordinatorConfig};
use shoal_kafka::{BrokerHandle, KafkaConfig, KafkaError, KafkaServer, TopicInfo, WaitPosition};
use shoal_store::{MessageStore, StoreConfig};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

pub(crate) struct TestBroker {
    pub(crate) store: Arc<MessageStore>,
    pub(crate) topics: Mutex<BTreeMap<String, i32>>,
    pub(crate) arrived: Arc<Notify>,
    pub(crate) groups: Mutex<Vec<String>>,
    pub(crate) coordinator: Mutex<Coordinator>,
    pub(crate) started: std::time::Instant,
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
            c.set_topic_queues(&t, q, now);
        }
        f(&mut c, now);
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

pub(crate) fn info(name: &str, partitions: i32) -> TopicInfo {
    TopicInfo {
        name: name.into(),
        partitions,
        readable: true,
        writable: true,
        internal: false,
    }
}

pub(crate) struct Fixture {
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) server: Option<KafkaServer>,
    pub(crate) broker: Arc<TestBroker>,
}

impl Fixture {
    pub(crate) async fn start(config: KafkaConfig) -> Fixture {
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
        Fixture {
            _dir: dir,
            server: Some(server),
            broker,
        }
    }

    pub(crate) async fn client(&self) -> Client {
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

pub(crate) struct Client {
    pub(crate) stream: TcpStream,
    pub(crate) next: i32,
}

impl Client {
    pub(crate) async fn send<R: Encodable + HeaderVersion>(
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

    pub(crate) async fn recv<R: Decodable>(&mut self, key: ApiKey, version: i16, id: i32) -> R {
        let len = self.stream.read_i32().await.unwrap();
        let mut buf = vec![0u8; len as usize];
        self.stream.read_exact(&mut buf).await.unwrap();
        let mut b = Bytes::from(buf);
        let h = ResponseHeader::decode(&mut b, key.response_header_version(version)).unwrap();
        assert_eq!(h.correlation_id, id, "responses come in request order");
        R::decode(&mut b, version).unwrap()
    }

    pub(crate) async fn call<Q: Encodable + HeaderVersion, R: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &Q,
    ) -> R {
        let id = self.send(key, version, req).await;
        self.recv(key, version, id).await
    }
}

/// Record `i` with `key`, `value` and header `h` = `hv{i}`.
pub(crate) fn record(i: i64, key: &str, value: &str) -> Record {
    let header = format!("hv{i}");
    crate::support::records::record(
        i,
        Some(key.as_bytes()),
        Some(value.as_bytes()),
        &[("h", Some(header.as_bytes()))],
    )
}

pub(crate) fn batch(records: &[Record], compression: Compression) -> Bytes {
    crate::support::records::batch(records, compression).freeze()
}

pub(crate) fn produce_req(
    topic: &str,
    partition: i32,
    acks: i16,
    records: Bytes,
) -> ProduceRequest {
    let mut p = produce_request::PartitionProduceData::default();
    p.index = partition;
    p.records = Some(records);
    let mut t = produce_request::TopicProduceData::default();
    t.name = TopicName(StrBytes::from_string(topic.into()));
    t.partition_data = vec![p];
    let mut r = ProduceRequest::default();
    r.acks = acks;
    r.timeout_ms = 5000;
    r.topic_data = vec![t];
    r
}

pub(crate) fn fetch_req(
    topic: &str,
    partition: i32,
    offset: i64,
    wait_ms: i32,
    min_bytes: i32,
) -> FetchRequest {
    let mut p = fetch_request::FetchPartition::default();
    p.partition = partition;
    p.fetch_offset = offset;
    p.partition_max_bytes = 1 << 20;
    let mut t = fetch_request::FetchTopic::default();
    t.topic = TopicName(StrBytes::from_string(topic.into()));
    t.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = BrokerId(-1);
    r.max_wait_ms = wait_ms;
    r.min_bytes = min_bytes;
    r.max_bytes = 50 << 20;
    r.session_epoch = -1;
    r.topics = vec![t];
    r
}

pub(crate) fn create_req(topic: &str, partitions: i32) -> CreateTopicsRequest {
    let mut t = create_topics_request::CreatableTopic::default();
    t.name = TopicName(StrBytes::from_string(topic.into()));
    t.num_partitions = partitions;
    t.replication_factor = 1;
    let mut r = CreateTopicsRequest::default();
    r.topics = vec![t];
    r.timeout_ms = 5000;
    r
}
