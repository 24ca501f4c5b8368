//! An instance's calls to the name servers: routes, their cache, and broker addresses; and the
//! route changes Shoal name servers push (`shoal_proto::route_watch`).

use crate::error::{ClientError, Result};
use parking_lot::Mutex;
use shoal_proto::body::TopicRouteData;
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::*;
use shoal_proto::{MessageQueue, RemotingCommand};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{ClientInstance, Inner};

/// Topics a name server's NOTIFY_ROUTE_CHANGED named, waiting for the instance's refresh task
/// (several notices before it runs make one refresh per topic).
#[derive(Default)]
pub(super) struct PendingRoutes {
    topics: Mutex<BTreeSet<String>>,
    wake: Notify,
}

/// Topics waiting at most: the refresh task keeps only the topics the instance uses, so more
/// than this means a name server names topics nobody asked about; the rest wait for the poll.
const MAX_PENDING_ROUTES: usize = 4096;

impl PendingRoutes {
    /// A notice named `topics`.
    pub(super) fn add(&self, topics: Vec<String>) {
        {
            let mut pending = self.topics.lock();
            for t in topics {
                if pending.len() >= MAX_PENDING_ROUTES {
                    break;
                }
                pending.insert(t);
            }
        }
        self.wake.notify_one();
    }

    async fn take(&self) -> BTreeSet<String> {
        loop {
            let taken = std::mem::take(&mut *self.topics.lock());
            if !taken.is_empty() {
                return taken;
            }
            self.wake.notified().await;
        }
    }
}

/// Route lookups under way, by topic: sends that need a topic's route while a lookup of it is
/// under way wait for that one instead of asking the name servers again (during a failover
/// every send finds the cached route without a master, and all of them would ask).
#[derive(Default)]
pub(super) struct RouteLookups {
    /// A receiver of the lookup's channel, whose sender is dropped when the lookup ends.
    under_way: Mutex<HashMap<String, tokio::sync::watch::Receiver<()>>>,
}

impl RouteLookups {
    /// How many lookups are under way.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.under_way.lock().len()
    }
}

/// The lookup of one topic's route this task leads: its end (finished or cancelled) takes the
/// lookup out of the table and then wakes the sends waiting for it.
struct LeadLookup<'a> {
    lookups: &'a RouteLookups,
    topic: &'a str,
    _done: tokio::sync::watch::Sender<()>,
}

impl Drop for LeadLookup<'_> {
    fn drop(&mut self) {
        self.lookups.under_way.lock().remove(self.topic);
    }
}

/// The instance's task that refreshes the routes name servers say changed, until shutdown.
pub(super) fn spawn_route_notice_task(
    pending: Arc<PendingRoutes>,
    inner: Weak<Inner>,
    token: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            let topics = tokio::select! {
                _ = token.cancelled() => return,
                t = pending.take() => t,
            };
            let Some(inner) = inner.upgrade() else { return };
            ClientInstance { inner }.refresh_notified(topics).await;
        }
    });
}

impl ClientInstance {
    /// Sends a request to a name server: the current one first, then the others round-robin.
    ///
    /// # Errors
    /// The last transport error when no name server answered.
    pub async fn invoke_namesrv(&self, request: RemotingCommand) -> Result<RemotingCommand> {
        let addrs = &self.inner.config.namesrv_addrs;
        let n = addrs.len();
        let start = self.inner.namesrv_index.load(Ordering::Relaxed);
        let mut last = None;
        for i in 0..n {
            let idx = (start + i) % n;
            let Some(addr) = addrs.get(idx) else { continue };
            match self
                .inner
                .net
                .invoke(
                    addr,
                    self.signed(request.clone()),
                    self.inner.config.rpc_timeout,
                )
                .await
            {
                Ok(r) => {
                    self.inner.namesrv_index.store(idx, Ordering::Relaxed);
                    return Ok(r);
                }
                Err(e) => {
                    if self.inner.shutdown.is_cancelled() {
                        debug!(namesrv = %addr, error = %e, "name server request failed during shutdown");
                    } else {
                        warn!(namesrv = %addr, error = %e, "name server request failed");
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.map_or(
            ClientError::InvalidArgument("no name server".into()),
            Into::into,
        ))
    }

    /// Asks the name servers for a topic's route (no caching).
    ///
    /// # Errors
    /// [`ClientError::NoRoute`] if the topic does not exist, transport errors otherwise.
    pub async fn fetch_route(&self, topic: &str) -> Result<TopicRouteData> {
        let mut req = RemotingCommand::request_with_header(
            rc::GET_ROUTEINFO_BY_TOPIC,
            &GetRouteInfoRequestHeader {
                topic: topic.to_owned(),
                ..Default::default()
            },
        );
        // A Shoal name server pushes this topic's route changes over this connection from now
        // on; Apache RocketMQ's ignores the field (the 30 s poll is all there is then).
        shoal_proto::route_watch::watch(&mut req);
        let r = self.invoke_namesrv(req).await?;
        if r.ext(shoal_proto::route_watch::field::WATCHED) == Some("false") {
            debug!(
                topic,
                "the name server did not take the route watch (limit): polling only"
            );
        }
        match r.code {
            resp::SUCCESS => Ok(r.decode_json_body()?),
            resp::TOPIC_NOT_EXIST => Err(ClientError::NoRoute(topic.to_owned())),
            _ => Err(ClientError::server("GET_ROUTEINFO_BY_TOPIC", &r)),
        }
    }

    /// Fetches a topic's route and stores it (and its broker addresses); consumers of the topic
    /// rebalance when it changed. Returns the route.
    ///
    /// # Errors
    /// Those of [`ClientInstance::fetch_route`].
    pub async fn update_route(&self, topic: &str) -> Result<TopicRouteData> {
        let route = self.fetch_route(topic).await?;
        self.store_route(topic, &route);
        Ok(route)
    }

    /// As [`ClientInstance::update_route`], but a call made while a lookup of `topic` is under
    /// way waits for that lookup and returns the route it stored (the cached route if it
    /// failed): one name-server round trip for any number of concurrent sends.
    ///
    /// # Errors
    /// Those of [`ClientInstance::fetch_route`]; [`ClientError::NoRoute`] for a waiting call
    /// when no route is cached after the lookup it waited for.
    pub async fn update_route_shared(&self, topic: &str) -> Result<TopicRouteData> {
        let lookups = &self.inner.route_lookups;
        let waiting = {
            let mut under_way = lookups.under_way.lock();
            match under_way.get(topic) {
                Some(rx) => Err(rx.clone()),
                None => {
                    let (tx, rx) = tokio::sync::watch::channel(());
                    under_way.insert(topic.to_owned(), rx);
                    Ok(tx)
                }
            }
        };
        match waiting {
            Ok(tx) => {
                let _lead = LeadLookup {
                    lookups,
                    topic,
                    _done: tx,
                };
                self.update_route(topic).await
            }
            Err(mut rx) => {
                // Nothing is ever sent: this returns when the leading lookup ends.
                let _ = rx.changed().await;
                self.cached_route(topic)
                    .ok_or_else(|| ClientError::NoRoute(topic.to_owned()))
            }
        }
    }

    fn store_route(&self, topic: &str, route: &TopicRouteData) {
        {
            let mut brokers = self.inner.brokers.lock();
            for b in &route.broker_datas {
                let addrs = b
                    .broker_addrs
                    .iter()
                    .map(|(&id, addr)| (id, Arc::from(addr.as_str())))
                    .collect();
                brokers.insert(b.broker_name.clone(), addrs);
            }
        }
        let queues: Arc<[MessageQueue]> = route.publish_queues(topic).into();
        self.inner
            .publish_queues
            .lock()
            .insert(topic.to_owned(), queues);
        let (changed, appeared) = {
            let mut routes = self.inner.routes.lock();
            let old = routes.insert(topic.to_owned(), route.clone());
            let changed = old.as_ref().is_none_or(|o| {
                o.queue_datas != route.queue_datas || o.broker_datas != route.broker_datas
            });
            (changed, appeared_masters(old.as_ref(), route))
        };
        if !appeared.is_empty() {
            // A broker (re)registered: evidence that it is up, whatever a producer's fault
            // tolerance remembers of it.
            for b in &appeared {
                self.inner.registry.broker_appeared(b);
            }
        }
        if changed {
            debug!(topic, ?appeared, "route changed");
            let consumers: Vec<_> = self
                .inner
                .registry
                .all()
                .into_iter()
                .filter(|c| c.subscribed_topics().iter().any(|t| t == topic))
                .collect();
            if !appeared.is_empty() && !consumers.is_empty() {
                // A broker new to this route: heartbeat it first, so that it knows this member
                // (its member list, its session for locks) when the rebalance asks.
                let this = self.clone();
                tokio::spawn(async move {
                    this.heartbeat_all().await;
                    for c in consumers {
                        c.route_changed();
                    }
                });
            } else {
                for c in consumers {
                    c.route_changed();
                }
            }
        }
    }

    /// Refreshes the routes a name server said changed (NOTIFY_ROUTE_CHANGED), those this
    /// instance uses; consumers of a changed route rebalance (`store_route`).
    async fn refresh_notified(&self, topics: BTreeSet<String>) {
        let used: Vec<String> = {
            let routes = self.inner.routes.lock();
            let subscribed: BTreeSet<String> = self
                .inner
                .registry
                .all()
                .iter()
                .flat_map(|c| c.subscribed_topics())
                .collect();
            topics
                .into_iter()
                .filter(|t| routes.contains_key(t) || subscribed.contains(t))
                .collect()
        };
        debug!(topics = ?used, "route change pushed by a name server");
        let refreshes = used.iter().map(|t| self.update_route(t));
        for (t, r) in used.iter().zip(futures::future::join_all(refreshes).await) {
            if let Err(e) = r {
                debug!(topic = %t, error = %e, "route refresh after a notice failed");
            }
        }
    }

    /// The cached route of a topic, fetching it on first use.
    ///
    /// # Errors
    /// Those of [`ClientInstance::fetch_route`].
    pub async fn route(&self, topic: &str) -> Result<TopicRouteData> {
        if let Some(r) = self.inner.routes.lock().get(topic) {
            return Ok(r.clone());
        }
        self.update_route(topic).await
    }

    /// The cached route of a topic, if any.
    pub fn cached_route(&self, topic: &str) -> Option<TopicRouteData> {
        self.inner.routes.lock().get(topic).cloned()
    }

    /// The write queues of a topic's cached route (as [`TopicRouteData::publish_queues`]), if
    /// its route is cached; shared, so a send costs no copy.
    pub fn cached_publish_queues(&self, topic: &str) -> Option<Arc<[MessageQueue]>> {
        self.inner.publish_queues.lock().get(topic).cloned()
    }

    /// Refreshes the routes of every topic in use (the 30 s timer).
    pub async fn refresh_routes(&self) {
        let mut topics: BTreeSet<String> = self.inner.routes.lock().keys().cloned().collect();
        for c in self.inner.registry.all() {
            topics.extend(c.subscribed_topics());
        }
        for t in topics {
            if let Err(e) = self.update_route(&t).await {
                debug!(topic = %t, error = %e, "route refresh failed");
            }
        }
    }

    /// The master address of a broker, if known.
    pub fn master_addr(&self, broker_name: &str) -> Option<String> {
        self.master_addr_shared(broker_name).map(|a| a.to_string())
    }

    /// [`ClientInstance::master_addr`] without a copy of the text (a send looks it up each
    /// time).
    pub(crate) fn master_addr_shared(&self, broker_name: &str) -> Option<Arc<str>> {
        self.inner
            .brokers
            .lock()
            .get(broker_name)
            .and_then(|ids| ids.get(&shoal_proto::constants::MASTER_ID).cloned())
    }

    /// The master address of a broker, refreshing `topic`'s route if it is unknown.
    ///
    /// # Errors
    /// [`ClientError::NoBrokerAddr`] when no route names it.
    pub async fn find_master_addr(&self, broker_name: &str, topic: &str) -> Result<String> {
        if let Some(a) = self.master_addr(broker_name) {
            return Ok(a);
        }
        // Boxed: a route update is rare, and its future would otherwise grow every request's.
        let _ = Box::pin(self.update_route(topic)).await;
        self.master_addr(broker_name)
            .ok_or_else(|| ClientError::NoBrokerAddr(broker_name.to_owned()))
    }

    /// Every known master address.
    pub fn master_addrs(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .inner
            .brokers
            .lock()
            .values()
            .filter_map(|ids| {
                ids.get(&shoal_proto::constants::MASTER_ID)
                    .map(|a| a.to_string())
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// Broker names whose master is in `new` but was not in `old` at that address (a broker added
/// to the topic, or back after it left the route, or moved).
fn appeared_masters(old: Option<&TopicRouteData>, new: &TopicRouteData) -> Vec<String> {
    new.broker_datas
        .iter()
        .filter_map(|b| {
            let master = b.master_addr()?;
            let before = old.and_then(|o| {
                o.broker_datas
                    .iter()
                    .find(|x| x.broker_name == b.broker_name)
                    .and_then(|x| x.master_addr())
            });
            (before != Some(master)).then(|| b.broker_name.clone())
        })
        .collect()
}
