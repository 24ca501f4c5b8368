//! Who is connected: consumer groups with their members and subscriptions, and producer groups.
//!
//! Sans-IO: members are identified by the transport's connection id, the caller passes the time,
//! and every change is returned to the caller, which sends NOTIFY_CONSUMER_IDS_CHANGED.
//!
//! Beyond RocketMQ's `ConsumerManager` this registry keeps each member's own subscriptions, so
//! that it can (a) detect members of one group that subscribe differently and (b) detect two live
//! connections that heartbeat the same client id in one group — both silently break client-side
//! allocation in RocketMQ — and (c) answer a pull with the subscription of the connection that
//! sent it rather than whichever member heartbeated last.

use shoal_proto::mq::java_str_cmp;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A subscription as the registry compares it: two subscriptions are "the same" when they
/// filter the same messages, whatever their version stamps say (each client stamps its
/// subscriptions with its own start time, so versions always differ between members).
pub trait Subscription: Clone {
    /// True when both select the same messages.
    fn same_filter(&self, other: &Self) -> bool;
}

impl Subscription for shoal_proto::body::SubscriptionData {
    fn same_filter(&self, other: &Self) -> bool {
        self.topic == other.topic
            && self.expression_type == other.expression_type
            && self.class_filter_mode == other.class_filter_mode
            && (self.is_sub_all() && other.is_sub_all()
                || self.sub_string == other.sub_string
                    && self.tags_set == other.tags_set
                    && self.code_set == other.code_set)
    }
}

impl Subscription for &'static str {
    fn same_filter(&self, other: &Self) -> bool {
        self == other
    }
}

fn same_table<S: Subscription>(a: &BTreeMap<String, S>, b: &BTreeMap<String, S>) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b.iter())
            .all(|((ta, sa), (tb, sb))| ta == tb && sa.same_filter(sb))
}

/// Default client expiry without heartbeat (RocketMQ `channelExpiredTimeout`).
pub const DEFAULT_CLIENT_EXPIRY_MS: u64 = 120_000;

/// One client connection in a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientChannel {
    /// Transport connection id.
    pub conn_id: u64,
    /// The client id it announced (`ip@instance`).
    pub client_id: String,
    /// Remote address `ip:port`.
    pub client_addr: String,
    /// Language name as sent (`JAVA`, `RUST`, ...).
    pub language: String,
    /// Version ordinal as sent.
    pub version: i32,
}

#[derive(Debug, Clone)]
struct Member<S> {
    channel: ClientChannel,
    last_heartbeat_ms: u64,
    subscriptions: BTreeMap<String, S>,
    /// Broker-wide unique id of this membership (a new one each time the member joins).
    session_id: u64,
    /// Shoal members: expiry without heartbeat (their session locks last as long); `None`
    /// for official clients, which expire after the registry's default.
    session_timeout_ms: Option<u64>,
}

/// A member's broker session, as [`ClientRegistry::session`] answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberSession {
    /// The session id (changes when the member leaves and joins again).
    pub id: u64,
    /// The member's client id.
    pub client_id: String,
    /// The session timeout of a Shoal member (`None`: an official client).
    pub timeout_ms: Option<u64>,
}

/// A consumer group as the broker sees it.
#[derive(Debug, Clone)]
pub struct ConsumerGroup<M, S> {
    /// Group-level data of the latest heartbeat (consume type, message model, from-where).
    pub meta: M,
    members: BTreeMap<u64, Member<S>>,
    /// Group-level subscriptions: the latest heartbeat's, as RocketMQ keeps them.
    subscriptions: BTreeMap<String, S>,
    /// Time of the last membership or subscription change.
    pub last_change_ms: u64,
}

/// What a heartbeat, unregister, expiry or connection loss changed in one group.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupChange {
    /// The group.
    pub group: String,
    /// A member joined or left.
    pub membership_changed: bool,
    /// A member's subscriptions changed.
    pub subscription_changed: bool,
    /// Client ids that left the group (their queue locks must be released).
    pub left_client_ids: Vec<String>,
    /// Connections to notify (every remaining member).
    pub notify_conn_ids: Vec<u64>,
}

impl GroupChange {
    /// True when members must be told to rebalance.
    pub fn needs_notify(&self) -> bool {
        self.membership_changed || self.subscription_changed
    }
}

/// Problems in a group that break allocation silently in RocketMQ.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupHealth {
    /// Client ids heartbeated by more than one live connection.
    pub duplicate_client_ids: Vec<String>,
    /// Topics that members subscribe to differently (or that only some members subscribe to).
    pub inconsistent_topics: Vec<String>,
}

impl GroupHealth {
    /// True when nothing is wrong.
    pub fn is_healthy(&self) -> bool {
        self.duplicate_client_ids.is_empty() && self.inconsistent_topics.is_empty()
    }
}

/// All consumer and producer groups of a broker.
#[derive(Debug)]
pub struct ClientRegistry<M, S> {
    consumers: BTreeMap<String, ConsumerGroup<M, S>>,
    /// producer group -> connection id -> (channel, last heartbeat).
    producers: BTreeMap<String, HashMap<u64, (ClientChannel, u64)>>,
    /// Last health reported per group, so problems are logged once per change.
    reported_health: HashMap<String, GroupHealth>,
    /// Next session id.
    next_session: u64,
}

impl<M: Clone + PartialEq, S: Subscription> Default for ClientRegistry<M, S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M: Clone + PartialEq, S: Subscription> ClientRegistry<M, S> {
    /// An empty registry.
    pub fn new() -> Self {
        Self::with_session_base(1)
    }

    /// An empty registry whose session ids start at `base` (a broker seeds it from the wall
    /// clock so that ids never repeat across restarts).
    pub fn with_session_base(base: u64) -> Self {
        Self {
            consumers: BTreeMap::new(),
            producers: BTreeMap::new(),
            reported_health: HashMap::new(),
            next_session: base.max(1),
        }
    }

    /// Registers or refreshes a consumer from a heartbeat.
    pub fn consumer_heartbeat(
        &mut self,
        group: &str,
        channel: ClientChannel,
        meta: M,
        subscriptions: BTreeMap<String, S>,
        now_ms: u64,
    ) -> GroupChange {
        let g = self
            .consumers
            .entry(group.to_string())
            .or_insert_with(|| ConsumerGroup {
                meta: meta.clone(),
                members: BTreeMap::new(),
                subscriptions: BTreeMap::new(),
                last_change_ms: now_ms,
            });
        g.meta = meta;
        let mut change = GroupChange {
            group: group.to_string(),
            ..GroupChange::default()
        };
        match g.members.get_mut(&channel.conn_id) {
            Some(m) => {
                if m.channel.client_id != channel.client_id {
                    // Same connection, new identity: treat as leave + join.
                    change.left_client_ids.push(m.channel.client_id.clone());
                    change.membership_changed = true;
                }
                if !same_table(&m.subscriptions, &subscriptions) {
                    change.subscription_changed = true;
                }
                m.channel = channel;
                m.last_heartbeat_ms = now_ms;
                m.subscriptions = subscriptions.clone();
            }
            None => {
                change.membership_changed = true;
                let session_id = self.next_session;
                self.next_session += 1;
                g.members.insert(
                    channel.conn_id,
                    Member {
                        channel,
                        last_heartbeat_ms: now_ms,
                        subscriptions: subscriptions.clone(),
                        session_id,
                        session_timeout_ms: None,
                    },
                );
            }
        }
        if !same_table(&g.subscriptions, &subscriptions) {
            change.subscription_changed |= !g.subscriptions.is_empty() || !subscriptions.is_empty();
        }
        // The group table follows the latest heartbeat (as RocketMQ), versions included.
        g.subscriptions = subscriptions;
        if change.needs_notify() {
            g.last_change_ms = now_ms;
        }
        change.notify_conn_ids = g.members.keys().copied().collect();
        change
    }

    /// Registers or refreshes a producer.
    pub fn producer_heartbeat(&mut self, group: &str, channel: ClientChannel, now_ms: u64) {
        self.producers
            .entry(group.to_string())
            .or_default()
            .insert(channel.conn_id, (channel, now_ms));
    }

    /// The connections of a producer group, in connection order (the broker asks one of them
    /// to check a transaction's state).
    pub fn producer_channels(&self, group: &str) -> Vec<ClientChannel> {
        self.producers
            .get(group)
            .map(|p| {
                let mut v: Vec<ClientChannel> = p.values().map(|(c, _)| c.clone()).collect();
                v.sort_by_key(|c| c.conn_id);
                v
            })
            .unwrap_or_default()
    }

    /// UNREGISTER_CLIENT for a consumer group.
    pub fn unregister_consumer(
        &mut self,
        group: &str,
        client_id: &str,
        conn_id: u64,
        now_ms: u64,
    ) -> Option<GroupChange> {
        let g = self.consumers.get_mut(group)?;
        let key = g
            .members
            .iter()
            .find(|(c, m)| **c == conn_id && m.channel.client_id == client_id)
            .or_else(|| {
                g.members
                    .iter()
                    .find(|(_, m)| m.channel.client_id == client_id)
            })
            .map(|(c, _)| *c)?;
        let m = g.members.remove(&key)?;
        g.last_change_ms = now_ms;
        let change = GroupChange {
            group: group.to_string(),
            membership_changed: true,
            subscription_changed: false,
            left_client_ids: vec![m.channel.client_id],
            notify_conn_ids: g.members.keys().copied().collect(),
        };
        if g.members.is_empty() {
            self.consumers.remove(group);
            self.reported_health.remove(group);
        }
        Some(change)
    }

    /// UNREGISTER_CLIENT for a producer group.
    pub fn unregister_producer(&mut self, group: &str, conn_id: u64) {
        if let Some(p) = self.producers.get_mut(group) {
            p.remove(&conn_id);
            if p.is_empty() {
                self.producers.remove(group);
            }
        }
    }

    /// A connection closed: it leaves every group it was in.
    pub fn connection_closed(&mut self, conn_id: u64, now_ms: u64) -> Vec<GroupChange> {
        self.producers.retain(|_, p| {
            p.remove(&conn_id);
            !p.is_empty()
        });
        self.remove_members(|c, _| c == conn_id, now_ms)
    }

    /// Drops members whose last heartbeat is older than their session timeout (Shoal
    /// members) or `expiry_ms` (everyone else).
    pub fn expire(&mut self, now_ms: u64, expiry_ms: u64) -> Vec<GroupChange> {
        self.producers.retain(|_, p| {
            p.retain(|_, (_, last)| now_ms.saturating_sub(*last) <= expiry_ms);
            !p.is_empty()
        });
        self.remove_members(
            |_, m| {
                now_ms.saturating_sub(m.last_heartbeat_ms)
                    > m.session_timeout_ms.unwrap_or(expiry_ms)
            },
            now_ms,
        )
    }

    /// Makes a member a Shoal session member with this timeout (or an ordinary one with
    /// `None`); returns its session, or `None` if the connection is not a member of `group`.
    pub fn set_session_timeout(
        &mut self,
        group: &str,
        conn_id: u64,
        timeout_ms: Option<u64>,
    ) -> Option<MemberSession> {
        let m = self.consumers.get_mut(group)?.members.get_mut(&conn_id)?;
        m.session_timeout_ms = timeout_ms;
        Some(MemberSession {
            id: m.session_id,
            client_id: m.channel.client_id.clone(),
            timeout_ms,
        })
    }

    /// The session of the member on `conn_id` in `group`.
    pub fn session(&self, group: &str, conn_id: u64) -> Option<MemberSession> {
        let m = self.consumers.get(group)?.members.get(&conn_id)?;
        Some(MemberSession {
            id: m.session_id,
            client_id: m.channel.client_id.clone(),
            timeout_ms: m.session_timeout_ms,
        })
    }

    /// The session timeout of `group`'s member whose session is `session_id` (a Shoal member).
    pub fn session_timeout(&self, group: &str, session_id: u64) -> Option<u64> {
        self.consumers
            .get(group)?
            .members
            .values()
            .find(|m| m.session_id == session_id)?
            .session_timeout_ms
    }

    /// Counts as a heartbeat of the member on `conn_id` (a Shoal member's lock request keeps
    /// its session alive: the lease it is granted is measured from it); returns its session.
    pub fn touch(&mut self, group: &str, conn_id: u64, now_ms: u64) -> Option<MemberSession> {
        let m = self.consumers.get_mut(group)?.members.get_mut(&conn_id)?;
        m.last_heartbeat_ms = m.last_heartbeat_ms.max(now_ms);
        Some(MemberSession {
            id: m.session_id,
            client_id: m.channel.client_id.clone(),
            timeout_ms: m.session_timeout_ms,
        })
    }

    fn remove_members(
        &mut self,
        dead: impl Fn(u64, &Member<S>) -> bool,
        now_ms: u64,
    ) -> Vec<GroupChange> {
        let mut changes = Vec::new();
        let mut emptied = Vec::new();
        for (name, g) in self.consumers.iter_mut() {
            let gone: Vec<u64> = g
                .members
                .iter()
                .filter(|(c, m)| dead(**c, m))
                .map(|(c, _)| *c)
                .collect();
            if gone.is_empty() {
                continue;
            }
            let left_client_ids = gone
                .iter()
                .filter_map(|c| g.members.remove(c))
                .map(|m| m.channel.client_id)
                .collect();
            g.last_change_ms = now_ms;
            changes.push(GroupChange {
                group: name.clone(),
                membership_changed: true,
                subscription_changed: false,
                left_client_ids,
                notify_conn_ids: g.members.keys().copied().collect(),
            });
            if g.members.is_empty() {
                emptied.push(name.clone());
            }
        }
        for name in emptied {
            self.consumers.remove(&name);
            self.reported_health.remove(&name);
        }
        changes
    }

    /// The group's client ids, unique, in Java string order (GET_CONSUMER_LIST_BY_GROUP).
    pub fn client_ids(&self, group: &str) -> Vec<String> {
        let Some(g) = self.consumers.get(group) else {
            return Vec::new();
        };
        let mut ids: Vec<String> = g
            .members
            .values()
            .map(|m| m.channel.client_id.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        ids.sort_by(|a, b| java_str_cmp(a, b));
        ids
    }

    /// A consumer group, if it has members.
    pub fn group(&self, group: &str) -> Option<&ConsumerGroup<M, S>> {
        self.consumers.get(group)
    }

    /// Names of the consumer groups with members.
    pub fn group_names(&self) -> Vec<String> {
        self.consumers.keys().cloned().collect()
    }

    /// Names of the producer groups with members.
    pub fn producer_group_names(&self) -> Vec<String> {
        self.producers.keys().cloned().collect()
    }

    /// The subscription to use for a pull of `topic` by `group` arriving on `conn_id`: that
    /// member's own when it has one, else the group's.
    pub fn subscription(&self, group: &str, topic: &str, conn_id: Option<u64>) -> Option<&S> {
        let g = self.consumers.get(group)?;
        conn_id
            .and_then(|c| g.members.get(&c))
            .and_then(|m| m.subscriptions.get(topic))
            .or_else(|| g.subscriptions.get(topic))
    }

    /// Members of a group with their connections and own subscriptions.
    pub fn members(&self, group: &str) -> Vec<(&ClientChannel, &BTreeMap<String, S>)> {
        self.consumers
            .get(group)
            .map(|g| {
                g.members
                    .values()
                    .map(|m| (&m.channel, &m.subscriptions))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// One member's own subscriptions (for heartbeats that omit them).
    pub fn member_subscriptions(&self, group: &str, conn_id: u64) -> Option<BTreeMap<String, S>> {
        self.consumers
            .get(group)?
            .members
            .get(&conn_id)
            .map(|m| m.subscriptions.clone())
    }

    /// The group-level subscription table.
    pub fn group_subscriptions(&self, group: &str) -> Option<&BTreeMap<String, S>> {
        self.consumers.get(group).map(|g| &g.subscriptions)
    }

    /// The connection of a client id in a group (to forward GET_CONSUMER_RUNNING_INFO).
    pub fn conn_of(&self, group: &str, client_id: &str) -> Option<u64> {
        self.consumers
            .get(group)?
            .members
            .iter()
            .find(|(_, m)| m.channel.client_id == client_id)
            .map(|(c, _)| *c)
    }

    /// Groups a connection's client is a consumer of.
    pub fn groups_of_conn(&self, conn_id: u64) -> Vec<String> {
        self.consumers
            .iter()
            .filter(|(_, g)| g.members.contains_key(&conn_id))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Consumer groups subscribed to a topic.
    pub fn groups_of_topic(&self, topic: &str) -> Vec<String> {
        self.consumers
            .iter()
            .filter(|(_, g)| {
                g.subscriptions.contains_key(topic)
                    || g.members
                        .values()
                        .any(|m| m.subscriptions.contains_key(topic))
            })
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// What is wrong with a group right now.
    pub fn health(&self, group: &str) -> GroupHealth {
        let Some(g) = self.consumers.get(group) else {
            return GroupHealth::default();
        };
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for m in g.members.values() {
            *seen.entry(m.channel.client_id.as_str()).or_default() += 1;
        }
        let duplicate_client_ids = seen
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(id, _)| id.to_string())
            .collect();
        let topics: BTreeSet<&String> = g
            .members
            .values()
            .flat_map(|m| m.subscriptions.keys())
            .collect();
        let inconsistent_topics = topics
            .into_iter()
            .filter(|t| {
                let mut subs = g.members.values().map(|m| m.subscriptions.get(*t));
                let first = subs.next().flatten();
                first.is_none()
                    || subs.any(|s| match (s, first) {
                        (Some(a), Some(b)) => !a.same_filter(b),
                        _ => true,
                    })
            })
            .map(|t| t.to_string())
            .collect();
        GroupHealth {
            duplicate_client_ids,
            inconsistent_topics,
        }
    }

    /// The group's health if it differs from what was last reported (so it is logged once per
    /// change), recording it as reported.
    pub fn health_if_changed(&mut self, group: &str) -> Option<GroupHealth> {
        let h = self.health(group);
        let prev = self.reported_health.get(group).cloned().unwrap_or_default();
        if prev == h {
            return None;
        }
        self.reported_health.insert(group.to_string(), h.clone());
        Some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Reg = ClientRegistry<&'static str, &'static str>;

    fn ch(conn: u64, id: &str) -> ClientChannel {
        ClientChannel {
            conn_id: conn,
            client_id: id.to_string(),
            client_addr: format!("127.0.0.1:{conn}"),
            language: "RUST".into(),
            version: 479,
        }
    }

    fn subs(items: &[(&str, &'static str)]) -> BTreeMap<String, &'static str> {
        items.iter().map(|(t, s)| (t.to_string(), *s)).collect()
    }

    #[test]
    fn join_and_refresh() {
        let mut r = Reg::new();
        let c = r.consumer_heartbeat("G", ch(1, "b"), "m", subs(&[("T", "*")]), 0);
        assert!(c.membership_changed);
        assert_eq!(c.notify_conn_ids, vec![1]);
        let c = r.consumer_heartbeat("G", ch(2, "a"), "m", subs(&[("T", "*")]), 0);
        assert!(c.membership_changed && !c.subscription_changed);
        assert_eq!(c.notify_conn_ids, vec![1, 2]);
        let c = r.consumer_heartbeat("G", ch(1, "b"), "m", subs(&[("T", "*")]), 10);
        assert!(!c.needs_notify());
        assert_eq!(r.client_ids("G"), vec!["a", "b"]);
        assert!(r.health("G").is_healthy());
    }

    #[test]
    fn subscription_change_notifies_and_inconsistency_is_flagged() {
        let mut r = Reg::new();
        r.consumer_heartbeat("G", ch(1, "a"), "m", subs(&[("T", "*")]), 0);
        r.consumer_heartbeat("G", ch(2, "b"), "m", subs(&[("T", "*")]), 0);
        let c = r.consumer_heartbeat("G", ch(2, "b"), "m", subs(&[("T", "tagA")]), 1);
        assert!(c.subscription_changed);
        assert_eq!(r.health("G").inconsistent_topics, vec!["T"]);
        // Each connection pulls with its own subscription.
        assert_eq!(r.subscription("G", "T", Some(1)), Some(&"*"));
        assert_eq!(r.subscription("G", "T", Some(2)), Some(&"tagA"));
        assert_eq!(r.subscription("G", "T", None), Some(&"tagA"));
        assert!(r.health_if_changed("G").is_some());
        assert!(r.health_if_changed("G").is_none());
    }

    #[test]
    fn subscription_versions_alone_are_not_a_change() {
        use shoal_proto::body::SubscriptionData;
        let mut r: ClientRegistry<&'static str, SubscriptionData> = ClientRegistry::new();
        let sub = |v| -> BTreeMap<String, SubscriptionData> {
            [(
                "T".to_string(),
                SubscriptionData::from_tag_expression("T", "a || b", v),
            )]
            .into()
        };
        r.consumer_heartbeat("G", ch(1, "a"), "m", sub(1), 0);
        r.consumer_heartbeat("G", ch(2, "b"), "m", sub(2), 0);
        // Members alternate heartbeats with their own versions: no change, no inconsistency.
        for i in 0..4 {
            let c = r.consumer_heartbeat(
                "G",
                ch(1 + i % 2, ["a", "b"][(i % 2) as usize]),
                "m",
                sub(1 + (i % 2) as i64),
                1,
            );
            assert!(!c.needs_notify());
        }
        assert!(r.health("G").is_healthy());
        let c = r.consumer_heartbeat(
            "G",
            ch(2, "b"),
            "m",
            [(
                "T".to_string(),
                SubscriptionData::from_tag_expression("T", "a", 3),
            )]
            .into(),
            2,
        );
        assert!(c.subscription_changed);
        assert_eq!(r.health("G").inconsistent_topics, vec!["T"]);
    }

    #[test]
    fn duplicate_client_id_is_flagged_and_listed_once() {
        let mut r = Reg::new();
        r.consumer_heartbeat("G", ch(1, "a"), "m", subs(&[("T", "*")]), 0);
        r.consumer_heartbeat("G", ch(2, "a"), "m", subs(&[("T", "*")]), 0);
        assert_eq!(r.client_ids("G"), vec!["a"]);
        assert_eq!(r.health("G").duplicate_client_ids, vec!["a"]);
    }

    #[test]
    fn leave_by_unregister_close_and_expiry() {
        let mut r = Reg::new();
        r.consumer_heartbeat("G", ch(1, "a"), "m", subs(&[("T", "*")]), 0);
        r.consumer_heartbeat("G", ch(2, "b"), "m", subs(&[("T", "*")]), 0);
        r.consumer_heartbeat("G", ch(3, "c"), "m", subs(&[("T", "*")]), 100_000);
        let c = r.unregister_consumer("G", "a", 1, 1).unwrap();
        assert_eq!(c.left_client_ids, vec!["a"]);
        assert_eq!(c.notify_conn_ids, vec![2, 3]);
        let cs = r.connection_closed(2, 2);
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].notify_conn_ids, vec![3]);
        assert!(r.expire(200_000, 120_000).is_empty());
        let cs = r.expire(220_001, 120_000);
        assert_eq!(cs[0].left_client_ids, vec!["c"]);
        assert!(r.group("G").is_none());
        assert!(r.group_names().is_empty());
    }

    #[test]
    fn sessions_have_their_own_timeout_and_a_new_id_after_a_rejoin() {
        let mut r = Reg::with_session_base(100);
        r.consumer_heartbeat("G", ch(1, "a"), "m", subs(&[("T", "*")]), 0);
        r.consumer_heartbeat("G", ch(2, "b"), "m", subs(&[("T", "*")]), 0);
        let s = r.set_session_timeout("G", 1, Some(10_000)).unwrap();
        assert_eq!((s.id, s.client_id.as_str()), (100, "a"));
        assert_eq!(r.session("G", 2).unwrap().timeout_ms, None);
        assert!(r.set_session_timeout("G", 9, Some(1)).is_none());
        // A lock request keeps the session alive like a heartbeat.
        assert_eq!(r.touch("G", 1, 5_000).unwrap().id, 100);
        assert!(r.expire(15_000, 120_000).is_empty());
        let cs = r.expire(15_001, 120_000);
        assert_eq!(cs[0].left_client_ids, vec!["a"]);
        // b (an official client) lasts 120 s.
        assert!(r.session("G", 2).is_some());
        r.consumer_heartbeat("G", ch(1, "a"), "m", subs(&[("T", "*")]), 16_000);
        assert_eq!(r.session("G", 1).unwrap().id, 102);
    }

    #[test]
    fn producers_are_tracked_and_expire() {
        let mut r = Reg::new();
        r.producer_heartbeat("P", ch(1, "a"), 0);
        assert_eq!(r.producer_group_names(), vec!["P"]);
        assert_eq!(r.producer_channels("P").len(), 1);
        assert!(r.producer_channels("Q").is_empty());
        r.expire(120_001, 120_000);
        assert!(r.producer_group_names().is_empty());
    }
}
