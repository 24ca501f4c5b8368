//! What the consumer-group handlers ([`crate::client`], [`crate::lease`],
//! [`crate::coordinated`]) get instead of the whole broker: a [`GroupCtx`] of borrowed owners
//! (the group state, the subscription-group table, the topic routes, the connections), the
//! config, the store for offsets and lag, and the counters. What they may touch is written in
//! their signature, and none of it is a mutex.

use crate::config::BrokerConfig;
use crate::connections::Connections;
use crate::groups::Groups;
use crate::listener::ListenerGroups;
use crate::metrics::Counters;
use crate::namesrv::NameServers;
use crate::sub_groups::SubscriptionGroups;
use crate::topics::Topics;
use shoal_proto::MessageQueue;
use shoal_store::MessageStore;
use std::sync::OnceLock;

/// Topic queues as the coordinator allocates them: this broker's topic table plus the other
/// brokers' queues from the name servers (cached).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Routes<'a> {
    pub(crate) topics: &'a Topics,
    pub(crate) namesrv: &'a NameServers,
    pub(crate) broker_name: &'a str,
}

/// This broker's queues of a topic together with other brokers' (none when neither has any).
fn merge_queues(
    own: Option<Vec<MessageQueue>>,
    others: Vec<MessageQueue>,
) -> Option<Vec<MessageQueue>> {
    if own.is_none() && others.is_empty() {
        return None;
    }
    let mut all = own.unwrap_or_default();
    all.extend(others);
    Some(all)
}

impl Routes<'_> {
    /// The queues of `topic` this broker serves.
    pub(crate) fn topic_queues(&self, topic: &str) -> Option<Vec<MessageQueue>> {
        self.topics.queues(topic, self.broker_name)
    }

    /// Every queue of `topic` in the cluster: this broker's own, plus the other brokers' from
    /// the name servers' route (cached briefly; the last known when the name servers do not
    /// answer).
    pub(crate) async fn cluster_topic_queues(&self, topic: &str) -> Option<Vec<MessageQueue>> {
        let others = self.namesrv.other_queues(topic).await;
        merge_queues(self.topic_queues(topic), others)
    }

    /// A topic's queues without asking the name servers: this broker's own plus the other
    /// brokers' last known route.
    pub(crate) fn known_topic_queues(&self, topic: &str) -> Option<Vec<MessageQueue>> {
        merge_queues(
            self.topic_queues(topic),
            self.namesrv.known_other_queues(topic),
        )
    }
}

/// What the consumer-group handlers may touch. See the [module documentation](self).
#[derive(Clone, Copy)]
pub(crate) struct GroupCtx<'a> {
    /// The group state (registry, locks, coordinator) and its effects.
    pub(crate) groups: &'a Groups,
    /// The broker's config (coordinator section, session bounds, limits, broker name).
    pub(crate) config: &'a BrokerConfig,
    /// The store (consumer offsets, max offsets for lag).
    pub(crate) store: &'a MessageStore,
    /// Counters.
    pub(crate) counters: &'a Counters,
    /// Topic queues (own and other brokers').
    pub(crate) routes: Routes<'a>,
    /// The subscription-group table.
    pub(crate) sub_groups: &'a SubscriptionGroups,
    /// Client connections (remembered on heartbeats, for notices).
    pub(crate) connections: &'a Connections,
    /// Classic groups of a protocol listener (GROUP_DESCRIBE shows them).
    pub(crate) listener_groups: &'a OnceLock<ListenerGroups>,
}

impl std::fmt::Debug for GroupCtx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCtx")
            .field("broker", &self.config.broker_name)
            .finish_non_exhaustive()
    }
}
