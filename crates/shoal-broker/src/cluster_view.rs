//! The cluster as a protocol listener of this broker serves it: every broker group's route
//! and Kafka listener (from the name servers, cached and watched by `namesrv.rs`), and the
//! committed offsets of queues on other brokers, read and written over the remoting protocol
//! (a Kafka group's coordinator commits every partition it is asked to, wherever its queue
//! lives; the offset stays with the queue's broker, as RocketMQ's do).

use crate::api::BrokerApi;
use shoal_proto::body::{ClusterInfo, KafkaListener, TopicRouteData};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::{
    QueryConsumerOffsetRequestHeader, QueryConsumerOffsetResponseHeader,
    UpdateConsumerOffsetRequestHeader,
};
use shoal_proto::RemotingCommand;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// A route or the cluster list younger than this is not fetched again for a listener's
/// request (changes of watched routes are pushed before that).
const CLUSTER_VIEW_MAX_AGE: Duration = Duration::from_secs(1);

impl BrokerApi {
    /// In a replicated group: the master epochs this broker's log holds data of
    /// (`(epoch, first commit-log offset)`, oldest first) and the newest master epoch it
    /// knows; none for a broker that does not replicate.
    pub fn master_epochs(&self) -> Option<(Vec<(u32, u64)>, u32)> {
        self.b.replication.get().map(|r| r.epochs())
    }

    /// The node id of the Kafka listener this broker runs, once named.
    pub fn kafka_node_id(&self) -> Option<i32> {
        self.b.kafka_listener.get().map(|k| k.node_id)
    }

    /// In a replicated group, while master: how many brokers keep a copy of its log (itself
    /// and every replica the controller counts in the group, in sync or not).
    pub fn group_size(&self) -> Option<usize> {
        self.b.replication.get().and_then(|r| r.group_size())
    }

    /// In a replicated group, while master holding its lease: its master epoch and in-sync
    /// set as registered broker ids (itself as 0).
    pub fn leadership(&self) -> Option<(u32, Vec<i64>)> {
        self.b.replication.get().and_then(|r| r.leadership())
    }

    /// Names the Kafka listener this broker runs (its node id and the address clients are
    /// told), registers it with the name servers at once. Set once; a second call is ignored.
    pub fn set_kafka_listener(&self, node_id: i32, addr: String) {
        if self
            .b
            .kafka_listener
            .set(KafkaListener {
                node_id,
                addr,
                ..Default::default()
            })
            .is_ok()
        {
            let b = self.b.clone();
            tokio::spawn(async move {
                b.register_all().await;
            });
        }
    }

    /// True when this broker is its group's master as routes show it (`brokerId` 0); a lone
    /// broker registered with another id (a RocketMQ-style slave) is not.
    pub fn is_route_master(&self) -> bool {
        self.b.route_broker_id() == Some(shoal_proto::constants::MASTER_ID)
    }

    /// Whether the broker knows name servers (without them, it is the whole cluster).
    pub fn has_name_servers(&self) -> bool {
        self.b.namesrv.count() > 0
    }

    /// A topic's route as last fetched from the name servers, with every broker group's Kafka
    /// listeners (no request).
    pub fn known_route(&self, topic: &str) -> Option<Arc<TopicRouteData>> {
        self.b.namesrv.known_route(topic)
    }

    /// Fetches the routes of `topics` that are older than a second, and watches them.
    pub fn refresh_routes(&self, topics: Vec<String>) -> impl Future<Output = ()> + Send + 'static {
        let b = self.b.clone();
        async move {
            if b.namesrv.count() == 0 {
                return;
            }
            let b = &b;
            futures::future::join_all(
                topics
                    .iter()
                    .map(|t| b.namesrv.refresh_route(t, CLUSTER_VIEW_MAX_AGE)),
            )
            .await;
        }
    }

    /// The cluster's broker groups as last fetched, with their Kafka listeners (no request).
    pub fn known_cluster(&self) -> Option<Arc<ClusterInfo>> {
        self.b.namesrv.known_cluster()
    }

    /// Fetches the cluster's broker groups when the cached list is older than a second.
    pub fn refresh_cluster(&self) -> impl Future<Output = ()> + Send + 'static {
        let b = self.b.clone();
        async move {
            if b.namesrv.count() > 0 {
                b.namesrv.refresh_cluster(CLUSTER_VIEW_MAX_AGE).await;
            }
        }
    }

    /// The master's remoting address of broker group `broker_name`, from the topic's route or
    /// the cluster list.
    fn master_of(&self, topic: &str, broker_name: &str) -> Option<String> {
        let from_route = self.known_route(topic).and_then(|r| {
            r.broker_datas
                .iter()
                .find(|b| b.broker_name == broker_name)
                .and_then(|b| b.master_addr().map(str::to_string))
        });
        from_route.or_else(|| {
            self.known_cluster().and_then(|c| {
                c.broker_addr_table
                    .get(broker_name)
                    .and_then(|b| b.master_addr().map(str::to_string))
            })
        })
    }

    /// Commits `offset` (next to read) for `group` on queue `queue` of `topic` at the master
    /// of broker group `broker_name` (UPDATE_CONSUMER_OFFSET, marked as a possible rewind:
    /// Kafka commits may move an offset back), answered once a replicated group's in-sync set
    /// has it (as a commit to this broker's own partitions is).
    pub fn commit_offset_at(
        &self,
        broker_name: &str,
        group: &str,
        topic: &str,
        queue: i32,
        offset: i64,
    ) -> impl Future<Output = Result<(), String>> + Send + 'static {
        let addr = self.master_of(topic, broker_name);
        let b = self.b.clone();
        let broker_name = broker_name.to_string();
        let mut req = RemotingCommand::request_with_header(
            rc::UPDATE_CONSUMER_OFFSET,
            &UpdateConsumerOffsetRequestHeader {
                consumer_group: group.to_string(),
                topic: topic.to_string(),
                queue_id: queue,
                commit_offset: offset,
                ..Default::default()
            },
        );
        req.ext_fields.get_or_insert_with(Default::default).extend([
            (shoal_proto::ext::field::REWIND, "true"),
            (shoal_proto::ext::field::WAIT_REPLICATED, "true"),
        ]);
        async move {
            let addr = addr.ok_or_else(|| format!("broker {broker_name} has no master"))?;
            let r = b.namesrv.call_broker(&addr, req).await?;
            if r.code == resp::SUCCESS {
                Ok(())
            } else {
                Err(format!(
                    "broker {broker_name} refused the commit: {}",
                    r.remark.as_deref().unwrap_or("no remark")
                ))
            }
        }
    }

    /// The committed offset of `group` on queue `queue` of `topic` at the master of broker
    /// group `broker_name` (QUERY_CONSUMER_OFFSET); `None` when it has none.
    pub fn query_offset_at(
        &self,
        broker_name: &str,
        group: &str,
        topic: &str,
        queue: i32,
    ) -> impl Future<Output = Result<Option<i64>, String>> + Send + 'static {
        let addr = self.master_of(topic, broker_name);
        let b = self.b.clone();
        let broker_name = broker_name.to_string();
        let req = RemotingCommand::request_with_header(
            rc::QUERY_CONSUMER_OFFSET,
            &QueryConsumerOffsetRequestHeader {
                consumer_group: group.to_string(),
                topic: topic.to_string(),
                queue_id: queue,
                set_zero_if_not_found: Some(false),
                ..Default::default()
            },
        );
        async move {
            let addr = addr.ok_or_else(|| format!("broker {broker_name} has no master"))?;
            let r = b.namesrv.call_broker(&addr, req).await?;
            match r.code {
                resp::SUCCESS => {
                    let h: QueryConsumerOffsetResponseHeader = r
                        .decode_command_header()
                        .map_err(|e| format!("broker {broker_name}: {e}"))?;
                    Ok((h.offset >= 0).then_some(h.offset))
                }
                resp::QUERY_NOT_FOUND => Ok(None),
                code => Err(format!(
                    "broker {broker_name} answered {code} to the offset query: {}",
                    r.remark.as_deref().unwrap_or("no remark")
                )),
            }
        }
    }
}
