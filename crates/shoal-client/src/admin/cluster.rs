//! Cluster operations of the admin client: a broker's write permission on the name servers
//! (RocketMQ's `wipeWritePerm` / `addWritePerm`), what is left to consume on a broker being
//! drained, and topics placed on chosen brokers (RocketMQ's `updateTopic -b`).

use super::{AdminClient, AdminError, AdminResult, TopicSpec};
use shoal_proto::body::{ConsumeStats, ConsumerConnection, SubscriptionGroupWrapper};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::*;
use shoal_proto::RemotingCommand;
use std::collections::BTreeSet;

/// One name server's answer to a write-permission change.
#[derive(Debug)]
pub struct PermChange {
    /// The name server.
    pub namesrv: String,
    /// Topics whose permission changed there, or why it failed.
    pub result: AdminResult<i32>,
}

/// One consumer group's work left on a broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDrain {
    /// Consumer group.
    pub group: String,
    /// Members connected to the broker now.
    pub members: usize,
    /// Messages on the broker's queues not yet consumed (its max offsets minus the group's
    /// committed offsets, over every topic the group subscribes or has offsets of).
    pub lag: i64,
    /// Queues of the broker the group reads.
    pub queues: usize,
}

/// What is left to consume on a broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainStatus {
    /// Broker name.
    pub broker: String,
    /// Its master's address.
    pub addr: String,
    /// Every group the broker knows, with its lag there.
    pub groups: Vec<GroupDrain>,
    /// Sum of the broker's max offsets over the queues above (grows while messages arrive).
    pub written: i64,
}

impl DrainStatus {
    /// Lag of the groups with members online (groups without members are not waited for:
    /// nobody consumes them).
    pub fn online_lag(&self) -> i64 {
        self.groups
            .iter()
            .filter(|g| g.members > 0)
            .map(|g| g.lag)
            .sum()
    }
}

impl AdminClient {
    /// The master address of a broker group by name.
    ///
    /// # Errors
    /// [`AdminError::Invalid`] naming the registered brokers when it is unknown.
    pub async fn broker_master_addr(&self, broker: &str) -> AdminResult<String> {
        let info = self.cluster_info().await?;
        match info
            .broker_addr_table
            .get(broker)
            .and_then(|b| b.master_addr())
        {
            Some(a) => Ok(a.to_string()),
            None => Err(AdminError::Invalid(format!(
                "broker {broker} is not registered with the name server (registered: {})",
                info.broker_addr_table
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// Master addresses of brokers given by name or as `host:port`, in the order given.
    ///
    /// # Errors
    /// [`AdminError::Invalid`] for a name no broker registered.
    pub async fn resolve_brokers(&self, brokers: &[String]) -> AdminResult<Vec<String>> {
        let info = self.cluster_info().await?;
        let mut out: Vec<String> = Vec::new();
        for b in brokers {
            let addr = match info.broker_addr_table.get(b).and_then(|d| d.master_addr()) {
                Some(a) => a.to_string(),
                None if b.contains(':') => b.clone(),
                None => {
                    return Err(AdminError::Invalid(format!(
                        "broker {b} is not registered with the name server (registered: {})",
                        info.broker_addr_table
                            .keys()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    )))
                }
            };
            if !out.contains(&addr) {
                out.push(addr);
            }
        }
        Ok(out)
    }

    /// Creates or updates a topic on the brokers given by name or address (RocketMQ's
    /// `updateTopic -b`); returns their addresses.
    ///
    /// # Errors
    /// An unknown broker, or the first broker that refused.
    pub async fn create_topic_on(
        &self,
        spec: &TopicSpec,
        brokers: &[String],
    ) -> AdminResult<Vec<String>> {
        if brokers.is_empty() {
            return Err(AdminError::Invalid("no broker given".into()));
        }
        let addrs = self.resolve_brokers(brokers).await?;
        self.create_topic_at(spec, &addrs).await?;
        Ok(addrs)
    }

    /// WIPE_WRITE_PERM_OF_BROKER (`writable = false`) or ADD_WRITE_PERM_OF_BROKER on every
    /// name server: producers stop (or start again) sending to the broker group; consumers keep
    /// reading it. Each name server's answer is returned; the change holds on those that
    /// answered SUCCESS.
    pub async fn set_broker_writable(&self, broker: &str, writable: bool) -> Vec<PermChange> {
        let mut out = Vec::new();
        for ns in &self.namesrv {
            let req = if writable {
                RemotingCommand::request_with_header(
                    rc::ADD_WRITE_PERM_OF_BROKER,
                    &AddWritePermOfBrokerRequestHeader {
                        broker_name: broker.into(),
                        ..Default::default()
                    },
                )
            } else {
                RemotingCommand::request_with_header(
                    rc::WIPE_WRITE_PERM_OF_BROKER,
                    &WipeWritePermOfBrokerRequestHeader {
                        broker_name: broker.into(),
                        ..Default::default()
                    },
                )
            };
            let what = if writable {
                "ADD_WRITE_PERM_OF_BROKER"
            } else {
                "WIPE_WRITE_PERM_OF_BROKER"
            };
            let result = match self.call_ok(what, ns, req).await {
                Ok(r) if writable => r
                    .decode_command_header::<AddWritePermOfBrokerResponseHeader>()
                    .map(|h| h.add_topic_count)
                    .map_err(|source| AdminError::Proto {
                        addr: ns.clone(),
                        source,
                    }),
                Ok(r) => r
                    .decode_command_header::<WipeWritePermOfBrokerResponseHeader>()
                    .map(|h| h.wipe_topic_count)
                    .map_err(|source| AdminError::Proto {
                        addr: ns.clone(),
                        source,
                    }),
                Err(e) => Err(e),
            };
            out.push(PermChange {
                namesrv: ns.clone(),
                result,
            });
        }
        out
    }

    /// What every consumer group has left to consume on a broker (its committed offsets
    /// against the broker's max offsets), and whether it has members connected.
    ///
    /// # Errors
    /// An unknown broker, or a broker that does not answer.
    pub async fn drain_status(&self, broker: &str) -> AdminResult<DrainStatus> {
        let addr = self.broker_master_addr(broker).await?;
        let r = self
            .call_ok(
                "group list",
                &addr,
                RemotingCommand::request(rc::GET_ALL_SUBSCRIPTIONGROUP_CONFIG),
            )
            .await?;
        let groups: BTreeSet<String> = Self::json::<SubscriptionGroupWrapper>(&addr, &r)?
            .subscription_group_table
            .into_keys()
            .filter(|g| g != shoal_proto::constants::TOOLS_CONSUMER_GROUP)
            .collect();
        let mut status = DrainStatus {
            broker: broker.to_string(),
            addr: addr.clone(),
            groups: Vec::new(),
            written: 0,
        };
        for group in groups {
            let req = RemotingCommand::request_with_header(
                rc::GET_CONSUMER_CONNECTION_LIST,
                &GetConsumerConnectionListRequestHeader {
                    consumer_group: group.clone(),
                    ..Default::default()
                },
            );
            let r = self.call(&addr, req).await?;
            let members = if r.code == resp::SUCCESS {
                Self::json::<ConsumerConnection>(&addr, &r)?
                    .connection_set
                    .len()
            } else {
                0
            };
            let req = RemotingCommand::request_with_header(
                rc::GET_CONSUME_STATS,
                &GetConsumeStatsRequestHeader {
                    consumer_group: group.clone(),
                    ..Default::default()
                },
            );
            let r = self.call(&addr, req).await?;
            let (lag, queues) = if r.code == resp::SUCCESS {
                let s: ConsumeStats = Self::json(&addr, &r)?;
                status.written += s
                    .offset_table
                    .values()
                    .map(|w| w.broker_offset)
                    .sum::<i64>();
                (
                    s.offset_table
                        .values()
                        .map(|w| (w.broker_offset - w.consumer_offset).max(0))
                        .sum(),
                    s.offset_table.len(),
                )
            } else {
                (0, 0)
            };
            status.groups.push(GroupDrain {
                group,
                members,
                lag,
                queues,
            });
        }
        Ok(status)
    }
}
