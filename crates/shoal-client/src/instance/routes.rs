//! An instance's calls to the name servers: routes, their cache, and broker addresses.

use crate::error::{ClientError, Result};
use shoal_proto::body::TopicRouteData;
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::*;
use shoal_proto::{MessageQueue, RemotingCommand};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tracing::{debug, warn};

use super::ClientInstance;

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
        let req = RemotingCommand::request_with_header(
            rc::GET_ROUTEINFO_BY_TOPIC,
            &GetRouteInfoRequestHeader {
                topic: topic.to_owned(),
                ..Default::default()
            },
        );
        let r = self.invoke_namesrv(req).await?;
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
        let changed = {
            let mut routes = self.inner.routes.lock();
            let old = routes.insert(topic.to_owned(), route.clone());
            old.as_ref().is_none_or(|o| {
                o.queue_datas != route.queue_datas || o.broker_datas != route.broker_datas
            })
        };
        if changed {
            debug!(topic, "route changed");
            for c in self.inner.registry.all() {
                if c.subscribed_topics().iter().any(|t| t == topic) {
                    c.rebalance_now();
                }
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
